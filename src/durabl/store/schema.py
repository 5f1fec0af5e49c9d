"""The SQL the SQLite store ships: its named statements, its numbered migrations, and the runner
that brings a database's schema up to date.

The statements live in ``sql/sqlite_queries.sql``, one per ``-- name:`` block, each taking named
parameters (``:run_id``). A migration is ``sql/sqlite_NNNN_what.sql``; once shipped it is never
edited, because the triggers it created are in databases users already have.
"""

from __future__ import annotations

import operator
import os
import re
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

APPLICATION_ID = 0x64726231  # "drb1": marks a file as a durabl database

TRIGGER_MARKER = "durabl:"
"""How every trigger's RAISE message starts: the mark of a refusal by durabl's own schema."""


_SQL_DIR = os.path.join(os.path.dirname(__file__), "sql")
"""The package's SQL files. durabl is installed as plain files, so they are read from its
directory: importlib.resources would cost more at import than everything else here."""


def _read_sql(name: str) -> str:
    with open(os.path.join(_SQL_DIR, name), encoding="utf-8") as handle:
        return handle.read()


def load_queries(name: str) -> dict[str, str]:
    """The named statements of the SQL file ``name``: one per ``-- name:`` block."""
    text = _read_sql(name)
    queries: dict[str, str] = {}
    for block in re.split(r"^-- name: ", text, flags=re.M)[1:]:
        name, _, body = block.partition("\n")
        queries[name.strip()] = body.strip()
    return queries


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """The numbered migrations of ``dialect`` ("sqlite", "postgres"), in order."""
    found = []
    for name in os.listdir(_SQL_DIR):
        match = re.fullmatch(rf"{dialect}_(\d{{4}})_\w+\.sql", name)
        if match:
            found.append((int(match.group(1)), _read_sql(name)))
    return sorted(found)


_PARAMETER = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def _numbered(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with its named parameters numbered (``:run_id`` becomes ``?1``), comments
    dropped, and the parameters' names in the order of their numbers."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"?{names.index(match.group(1)) + 1}"

    code = "\n".join(line for line in sql.splitlines() if not line.lstrip().startswith("--"))
    return _PARAMETER.sub(number, code), tuple(names)


def _binder(names: tuple[str, ...]) -> Callable[[Mapping[str, Any]], tuple[Any, ...]]:
    """Takes named parameters to the sequence a numbered statement binds."""
    if len(names) == 1:
        only = names[0]
        return lambda params: (params[only],)
    if not names:
        return lambda params: ()
    return operator.itemgetter(*names)


Q = load_queries("sqlite_queries.sql")
_NUMBERED_TEXT = {name: _numbered(sql) for name, sql in Q.items()}
NUMBERED = {name: (code, _binder(names)) for name, (code, names) in _NUMBERED_TEXT.items()}
"""Each statement of ``Q`` with numbered parameters, and what takes its named parameters to
their sequence. The writes bind through it: SQLite binds a sequence faster than it looks names
up in a mapping, and a write runs on every step. The named text in ``Q`` stays the one source."""
PARAMETERS = {name: names for name, (_, names) in _NUMBERED_TEXT.items()}
"""Each statement's parameter names, in the order its numbered parameters bind."""
MIGRATIONS = load_migrations("sqlite")
SCHEMA_VERSION = MIGRATIONS[-1][0]

_RAISING_TRIGGER = re.compile(r"CREATE TRIGGER (\w+)\b.*?RAISE\(ABORT, '((?:[^']|'')*)'\)", re.S)

TRIGGERS_BY_MESSAGE: dict[str, str] = {
    match.group(2).replace("''", "'"): match.group(1)
    for _, script in MIGRATIONS
    for match in _RAISING_TRIGGER.finditer(script)
}
"""Each trigger's RAISE message, as SQLite reports it, and the trigger's name. SQLite tells a
trigger's refusal only by its message, and the messages are in every database ever created, so
the message names the trigger and the trigger's name is the stable key."""


def schema_of(conn: sqlite3.Connection) -> tuple[int, int]:
    """The file's (application id, schema version)."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    return app_id, conn.execute("PRAGMA user_version").fetchone()[0]


def migrate(conn: sqlite3.Connection) -> None:
    """Bring the schema up to date, in one transaction. A current database is not written to."""
    if schema_of(conn) == (APPLICATION_ID, SCHEMA_VERSION):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        for number, script in MIGRATIONS:
            if number > version:
                for statement in _split_script(script):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {number}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _split_script(script: str) -> list[str]:
    """Split a migration into statements; trigger bodies keep their inner semicolons."""
    statements, current = [], []
    depth = 0
    for line in script.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("--"):
            continue
        current.append(line)
        upper = stripped.upper()
        if upper.startswith("BEGIN") or upper.endswith(" BEGIN"):
            depth += 1
        if upper.startswith("END;"):
            depth -= 1
        if stripped.endswith(";") and depth == 0:
            statements.append("\n".join(current))
            current = []
    if current:
        statements.append("\n".join(current))
    return statements
