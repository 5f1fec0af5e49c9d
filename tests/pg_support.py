"""PostgreSQL databases for the tests: a fresh, empty database for each use, dropped afterwards.

The suites that run on both backends need, for PostgreSQL, what ``tmp_path`` gives SQLite: a
database nobody else has touched. Each one is created on the machine's server
(``SERVER``, trust authentication) as ``durabl_t_<pid>_<n>``, so that test processes running side
by side, forked workers included, never share one; ``DROP DATABASE ... WITH (FORCE)`` takes it
away again, also when a test left a connection open.

The server is part of the test environment, like the SQLite library: when it is not running, the
PostgreSQL tests fail, naming the command that starts it. They are never skipped, since a
skipped backend reads as a green one.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

HOST, PORT = "127.0.0.1", 5432
SERVER = f"postgresql://{HOST}:{PORT}"
ADMIN_URL = f"{SERVER}/postgres"
PREFIX = "durabl_t"

_admins: dict[int, psycopg.Connection[Any]] = {}
"""One administrative connection per process: a forked child must never talk on its parent's
socket, so it opens its own (and leaves the parent's alone)."""
_counter = itertools.count(1)
_made: dict[int, list[str]] = {}
"""The databases each process created and has not dropped yet."""


def server_down_message(error: BaseException) -> str:
    reason = " ".join(str(error).split())
    return (
        f"the PostgreSQL server at {HOST}:{PORT} is not reachable ({reason}); the PostgreSQL "
        f"backend's tests need it: start it with `make postgres-up`"
    )


def admin() -> psycopg.Connection[Any]:
    """This process's connection to the server's ``postgres`` database, in autocommit mode."""
    conn = _admins.get(os.getpid())
    if conn is None or conn.closed:
        try:
            conn = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError as exc:
            pytest.fail(server_down_message(exc), pytrace=False)
        _admins[os.getpid()] = conn
    return conn


def url_of(name: str) -> str:
    return f"{SERVER}/{name}"


def name_of(url: str) -> str:
    return url.rsplit("/", 1)[-1]


def create_database(*, template: str | None = None) -> str:
    """A new, empty database (or a copy of ``template``, a database nobody is connected to);
    its URL. It is dropped by ``drop_database``, or at the latest when the process exits."""
    name = f"{PREFIX}_{os.getpid()}_{next(_counter)}"
    copy = "" if template is None else f" TEMPLATE {template}"
    admin().execute(f"CREATE DATABASE {name}{copy}")
    _made.setdefault(os.getpid(), []).append(name)
    return url_of(name)


def copy_database(src_url: str) -> str:
    """A new database holding exactly what ``src_url`` holds, as a backup would. Whatever is
    still connected to the source is disconnected first: PostgreSQL copies only a database
    nobody uses."""
    source = name_of(src_url)
    terminate_sessions(src_url)
    return create_database(template=source)


def terminate_sessions(url: str) -> int:
    """End every session on the database at ``url`` but this process's admin one: what a
    server restart, a failover or an administrator's ``pg_terminate_backend`` does to them."""
    rows = admin().execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = %s AND pid <> pg_backend_pid()",
        (name_of(url),),
    )
    return len(rows.fetchall())


def drop_database(url: str) -> None:
    name = name_of(url)
    admin().execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    mine = _made.get(os.getpid(), [])
    if name in mine:
        mine.remove(name)


def drop_all() -> None:
    """Drop every database this process created and still has."""
    for name in list(_made.get(os.getpid(), [])):
        drop_database(url_of(name))


@atexit.register
def _drop_leftovers() -> None:
    with contextlib.suppress(Exception):
        if _made.get(os.getpid()):
            drop_all()


@contextlib.contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    """A plain autocommit connection to the database at ``url``, with the ``durabl`` schema
    first on the search path: the way an operator at ``psql`` (or another program) sees it,
    with no durabl code between it and the tables."""
    conn = psycopg.connect(url, autocommit=True, options="-c search_path=durabl,public")
    try:
        yield conn
    finally:
        conn.close()


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


class Databases:
    """The PostgreSQL databases one test (or one fixture) made: ``new()`` for each, all of them
    dropped by ``drop()``."""

    def __init__(self) -> None:
        self.urls: list[str] = []

    def new(self) -> str:
        url = create_database()
        self.urls.append(url)
        return url

    def drop(self) -> None:
        while self.urls:
            drop_database(self.urls.pop())


__all__ = [
    "ADMIN_URL",
    "HOST",
    "PORT",
    "SERVER",
    "Databases",
    "admin",
    "connect",
    "copy_database",
    "create_database",
    "drop_all",
    "drop_database",
    "guards_off",
    "name_of",
    "server_down_message",
    "terminate_sessions",
    "url_of",
]
