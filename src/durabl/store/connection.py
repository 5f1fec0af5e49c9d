"""How the SQLite store opens a database: nothing is written until the file is known to be one.

The file is checked by looking (``files``); an existing file is then judged through a read-only
connection, whose closing never checkpoints or removes a -wal, so that a refused file is left
exactly as it was; only then does a writer get its connection, in WAL mode and migrated.
"""

from __future__ import annotations

import os
import sqlite3

from durabl.errors import ForeignDatabaseError, SchemaVersionError, UninitialisedError, WalModeError
from durabl.store.files import check_file
from durabl.store.schema import APPLICATION_ID, SCHEMA_VERSION, Q, migrate
from durabl.store.sqlite_errors import storage_error

BUSY_TIMEOUT_MS = 30_000


def open_database(path: str, *, read_only: bool) -> sqlite3.Connection:
    """A connection to the durabl database at ``path`` (created if missing, unless
    ``read_only``), in autocommit mode, with rows as ``sqlite3.Row``."""
    check_file(path, read_only=read_only)
    if not read_only and os.path.exists(path) and os.path.getsize(path) > 0:
        _open(path, read_only=True, writer=True).close()  # a writer's first, harmless look
    return _open(path, read_only=read_only, writer=not read_only)


def _open(path: str, *, read_only: bool, writer: bool) -> sqlite3.Connection:
    try:
        if read_only:
            # a file: URI of the path, escaped as urllib.request.pathname2url does on POSIX,
            # without importing urllib.request (http.client, email, ssl: ~40 ms at import).
            # Imported here: a writer opening a new file needs no URI.
            from urllib.parse import quote

            uri = f"file:{quote(os.path.abspath(path))}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA query_only = ON")
        else:
            conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise storage_error(path, exc) from None
    conn.row_factory = sqlite3.Row
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_identity(path, conn, writer=writer)
        if not read_only:
            _prepare_for_writing(path, conn)
        return conn
    except BaseException as exc:
        conn.close()
        if isinstance(exc, sqlite3.Error):
            raise storage_error(path, exc) from None
        raise


def _check_identity(path: str, conn: sqlite3.Connection, *, writer: bool) -> None:
    """Refuse another program's database and a newer durabl's; a reader also refuses a file
    no runtime has initialised (a writer initialises it)."""
    app_id = conn.execute("PRAGMA application_id").fetchone()[0]
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    tables = conn.execute(Q["count_tables"]).fetchone()[0]
    if app_id != APPLICATION_ID and (tables or version):
        raise ForeignDatabaseError(path=path)
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(path=path, found=version, supported=SCHEMA_VERSION)
    if not writer and app_id != APPLICATION_ID:
        raise UninitialisedError(path=path)


def _prepare_for_writing(path: str, conn: sqlite3.Connection) -> None:
    if conn.execute(Q["count_tables"]).fetchone()[0] == 0:
        # A new file: let compaction hand freed pages back to the file system.
        # Only possible before the first table, and before the switch to WAL.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    if mode.lower() != "wal":
        raise WalModeError(path=path)
    conn.execute("PRAGMA synchronous = NORMAL")
    migrate(conn)
