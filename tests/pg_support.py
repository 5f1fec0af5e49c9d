"""PostgreSQL databases for the tests: an empty database for each use, nobody else's.

The suites that run on both backends need, for PostgreSQL, what ``tmp_path`` gives SQLite: a
database nobody else has touched. Each one lives on the machine's server (``SERVER``, trust
authentication) as ``durabl_t_<pid>_<n>``, so that test processes running side by side, forked
workers included, never share one.

A database a test is done with is emptied rather than dropped: its sessions are ended, every
schema in it is dropped and ``public`` made again, which leaves it as ``CREATE DATABASE`` made
it, and the next test of the same process takes it. That costs a hundredth of a second, where
``CREATE DATABASE`` and ``DROP DATABASE`` cost a tenth between them, and the suites take
hundreds. Whatever a process leaves is dropped (``WITH (FORCE)``) when it exits.

The server is part of the test environment, like the SQLite library: when it is not running, the
PostgreSQL tests fail, naming the command that starts it. They are never skipped, since a
skipped backend reads as a green one.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

HOST, PORT = "127.0.0.1", 5432
SERVER = f"postgresql://{HOST}:{PORT}"
ADMIN_URL = f"{SERVER}/postgres"
PREFIX = "durabl_t"
DURABL_TABLES = ("runs", "events", "side_effects", "key_claims", "snapshots", "signals")

_admins: dict[int, psycopg.Connection[Any]] = {}
"""One administrative connection per process: a forked child must never talk on its parent's
socket, so it opens its own (and leaves the parent's alone)."""
_counter = itertools.count(1)
_made: dict[int, set[str]] = {}
"""Every database each process created and has not dropped."""
_spare: dict[int, list[str]] = {}
"""Databases each process has emptied, ready to be handed out again."""
_in_use: dict[int, list[str]] = {}
"""Databases each process has handed out and not taken back."""


def server_down_message(error: BaseException) -> str:
    reason = " ".join(str(error).split())
    return (
        f"the PostgreSQL server at {ADMIN_URL} is not reachable ({reason}); the PostgreSQL "
        f"backend's tests need it: start it with `make postgres-up`"
    )


def admin() -> psycopg.Connection[Any]:
    """This process's connection to the server's ``postgres`` database, in autocommit mode."""
    conn = _admins.get(os.getpid())
    if conn is None or conn.closed:
        try:
            conn = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            down = server_down_message(exc)
        else:
            _admins[os.getpid()] = conn
            return conn
        pytest.fail(down, pytrace=False)
    return conn


def url_of(name: str) -> str:
    return f"{SERVER}/{name}"


def name_of(url: str) -> str:
    return url.rsplit("/", 1)[-1]


# -- connections to a test's database --------------------------------------------------------


def open_connection(url: str) -> psycopg.Connection[Any]:
    """A plain autocommit connection to the database at ``url``, with the ``durabl`` schema
    first on the search path: the way an operator at ``psql`` (or another program) sees it,
    with no durabl code between it and the tables."""
    return psycopg.connect(url, autocommit=True, options="-c search_path=durabl,public")


_KEPT = 3
_kept: dict[tuple[int, str], psycopg.Connection[Any]] = {}
"""The connections ``connect`` keeps open for reuse, the most recently used last. The oracles
read a database dozens of times per step, and a new PostgreSQL session costs a process on the
server; keeping a few (one per database a test alternates between) is most of a test's time."""


@contextlib.contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """``open_connection``, reused from one block to the next (see ``_kept``); the block always
    hands it back outside any transaction."""
    key = (os.getpid(), url)
    conn = _kept.pop(key, None)
    if conn is None or conn.closed or conn.broken:
        if conn is not None:
            conn.close()
        conn = open_connection(url)
    try:
        yield conn
    finally:
        if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.rollback()
        displaced = _kept.pop(key, None)  # kept by a block nested in this one
        if displaced is not None:
            displaced.close()
        _kept[key] = conn
        mine = [kept_url for pid, kept_url in _kept if pid == key[0]]
        for least_recent in mine[:-_KEPT]:
            forget(least_recent)


def forget(url: str) -> None:
    """Close the connection ``connect`` kept to ``url``, if it kept one."""
    conn = _kept.pop((os.getpid(), url), None)
    if conn is not None:
        conn.close()


def terminate_sessions(url: str) -> int:
    """End every session on the database at ``url`` but this process's admin one: what a
    server restart, a failover or an administrator's ``pg_terminate_backend`` does to them.
    Returns how many there were."""
    forget(url)
    rows = admin().execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (name_of(url),),
    )
    return len(rows.fetchall())


@contextlib.contextmanager
def guards_off(conn: psycopg.Connection[Any], *tables: str) -> Iterator[None]:
    """Run the block with durabl's triggers on ``tables`` disabled, in one transaction: the
    only way to damage history behind the database's back, as a disk or a bad restore would."""
    with conn.transaction():
        for table in tables:
            conn.execute(f"ALTER TABLE durabl.{table} DISABLE TRIGGER USER")
        yield
        for table in tables:
            conn.execute(f"ALTER TABLE durabl.{table} ENABLE TRIGGER USER")


# -- handing databases out and taking them back -----------------------------------------------


def new_database() -> str:
    """An empty database nobody else uses; its URL. ``release`` takes it back."""
    pid = os.getpid()
    spare = _spare.setdefault(pid, [])
    if spare:
        name = spare.pop()
    else:
        name = f"{PREFIX}_{pid}_{next(_counter)}"
        admin().execute(f"CREATE DATABASE {name}")
        _made.setdefault(pid, set()).add(name)
    _in_use.setdefault(pid, []).append(name)
    return url_of(name)


def release(url: str) -> None:
    """Take back a database ``new_database`` handed out: end its sessions (a store left open
    is cut off, as by a server restart) and empty it for the next test."""
    name = name_of(url)
    terminate_sessions(url)
    with connect(url) as conn:
        schemas = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname <> 'information_schema'"
        ).fetchall()
        for (schema,) in schemas:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        conn.execute("CREATE SCHEMA public")
    pid = os.getpid()
    if name in _in_use.get(pid, []):
        _in_use[pid].remove(name)
    _spare.setdefault(pid, []).append(name)


def release_all() -> None:
    """Take back every database this process handed out."""
    for name in list(_in_use.get(os.getpid(), [])):
        release(url_of(name))


def drop_all() -> None:
    """Drop every database this process created."""
    pid = os.getpid()
    for name in sorted(_made.get(pid, set())):
        forget(url_of(name))
        admin().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _made[pid], _spare[pid], _in_use[pid] = set(), [], []


@atexit.register
def _drop_leftovers() -> None:
    with contextlib.suppress(Exception):
        if _made.get(os.getpid()):
            drop_all()


class Databases:
    """The databases one test (or one fixture) uses: ``new()`` or ``copy()`` for each, all of
    them taken back by ``drop()``."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def new(self) -> str:
        url = new_database()
        self.urls.append(url)
        return url

    def copy(self, src_url: str) -> str:
        url = copy_database(src_url)
        self.urls.append(url)
        return url

    def drop(self) -> None:
        while self.urls:
            release(self.urls.pop())


# -- copies and backups of durabl's tables -----------------------------------------------------

Rows = dict[str, list[tuple[Any, ...]]]
"""Every row of durabl's tables, by table: a logical backup, as ``pg_dump`` would take one."""


def backup_rows(url: str) -> Rows:
    with connect(url) as conn:
        return {t: conn.execute(f"SELECT * FROM durabl.{t}").fetchall() for t in DURABL_TABLES}


def restore_rows(url: str, rows: Rows) -> None:
    """Make durabl's tables hold exactly ``rows`` again, in one transaction, past the guards
    (restoring a backup rewrites history by definition)."""
    with connect(url) as conn, guards_off(conn, *DURABL_TABLES):
        for table in DURABL_TABLES:
            conn.execute(f"DELETE FROM durabl.{table}")
            if rows[table]:
                marks = ", ".join(["%s"] * len(rows[table][0]))
                with conn.cursor() as cursor:
                    cursor.executemany(f"INSERT INTO durabl.{table} VALUES ({marks})", rows[table])


def copy_database(src_url: str) -> str:
    """A new database holding what durabl's tables at ``src_url`` hold, as a backup restored
    elsewhere would; its URL. The copy's schema is made by durabl itself, as on any database
    it opens, so it is the source's."""
    from durabl.store.postgres import PostgresStore

    rows = backup_rows(src_url)
    url = new_database()
    PostgresStore(url).close()
    restore_rows(url, rows)
    return url


__all__ = [
    "ADMIN_URL",
    "DURABL_TABLES",
    "HOST",
    "PORT",
    "SERVER",
    "Databases",
    "Rows",
    "admin",
    "backup_rows",
    "connect",
    "copy_database",
    "drop_all",
    "forget",
    "guards_off",
    "name_of",
    "new_database",
    "open_connection",
    "release",
    "release_all",
    "restore_rows",
    "server_down_message",
    "terminate_sessions",
    "url_of",
]


def restart_server() -> None:
    """Restart the machine's server in immediate mode (a crash: no shutdown checkpoint, every
    session cut), then drop this process's connections, which died with it."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    subprocess.run(
        [
            "pg_ctlcluster",
            "--skip-systemctl-redirect",
            version,
            "main",
            "restart",
            "-m",
            "immediate",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    pid = os.getpid()
    for key in [key for key in _kept if key[0] == pid]:
        _kept.pop(key).close()
    dead = _admins.pop(pid, None)
    if dead is not None:
        dead.close()
