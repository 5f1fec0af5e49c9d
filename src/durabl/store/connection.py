"""How the SQLite store opens a database: nothing is written until the file is known to be one.

The file is checked by looking (``files``). An existing file whose header does not already say
"a current durabl database" is then judged through a read-only connection, whose closing never
checkpoints or removes a -wal, so that a refused file is left exactly as it was; only then does
a writer get its connection, in WAL mode and migrated. A file the header vouches for skips that
look, which is most of what opening costs on the way to resuming a run; its writer still reads
the identity and the version through SQLite (they may be newer in the WAL) before it writes.
"""

from __future__ import annotations

import os
import sqlite3

from durabl.errors import ForeignDatabaseError, SchemaVersionError, UninitialisedError, WalModeError
from durabl.store.files import check_file, is_current_durabl
from durabl.store.schema import APPLICATION_ID, SCHEMA_VERSION, Q, migrate
from durabl.store.sqlite_errors import storage_error

BUSY_TIMEOUT_S = 30.0
"""How long a statement waits for another connection's lock before SQLITE_BUSY. Given to
``sqlite3.connect`` (which sets SQLite's busy timeout through its C API at once), not as a
``PRAGMA busy_timeout``: that is a statement to prepare, a connection's first, on the way to
a resumed run's first step."""

_URI_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/")


def open_database(path: str, *, read_only: bool) -> sqlite3.Connection:
    """A connection to the durabl database at ``path`` (created if missing, unless
    ``read_only``), in autocommit mode, with rows as ``sqlite3.Row``."""
    header = check_file(path, read_only=read_only)
    current = header is not None and is_current_durabl(header, APPLICATION_ID, SCHEMA_VERSION)
    if not read_only and header is not None and not current:
        _open(path, read_only=True, writer=True).close()  # a writer's first, harmless look
    return _open(path, read_only=read_only, writer=not read_only, current=current)


def file_uri(path: str, query: str) -> str:
    """A ``file:`` URI for ``path``: every byte outside the unreserved set percent-escaped, as
    SQLite's URI parser expects (and without importing urllib at all)."""
    escaped = "".join(
        chr(b) if b in _URI_SAFE else f"%{b:02X}" for b in os.fsencode(os.path.abspath(path))
    )
    return f"file:{escaped}?{query}"


def _open(path: str, *, read_only: bool, writer: bool, current: bool = False) -> sqlite3.Connection:
    try:
        if read_only:
            uri = file_uri(path, "mode=ro")
            conn = sqlite3.connect(
                uri,
                timeout=BUSY_TIMEOUT_S,
                uri=True,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA query_only = ON")
        else:
            conn = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
    except sqlite3.Error as exc:
        raise storage_error(path, exc) from None
    conn.row_factory = sqlite3.Row
    try:
        identity = _check_identity(path, conn, writer=writer, current=current)
        if not read_only:
            _prepare_for_writing(path, conn, identity, wal=current)
        return conn
    except BaseException as exc:
        if read_only:
            conn.close()
        else:
            _close_untouched(path, conn)
        if isinstance(exc, sqlite3.Error):
            raise storage_error(path, exc) from None
        raise


def _close_untouched(path: str, conn: sqlite3.Connection) -> None:
    """Close a writer's connection to a file it refused without the checkpoint (and deleted
    -wal) of a last connection's close: a reader holds the file open meanwhile, and a
    read-only connection's own close never checkpoints."""
    try:
        guard = sqlite3.connect(file_uri(path, "mode=ro"), uri=True, isolation_level=None)
    except sqlite3.Error:
        conn.close()
        return
    try:
        guard.execute("BEGIN")
        guard.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        conn.close()
    except sqlite3.Error:
        conn.close()
    finally:
        guard.close()


def _check_identity(
    path: str, conn: sqlite3.Connection, *, writer: bool, current: bool = False
) -> tuple[int, int, int]:
    """Refuse another program's database and a newer durabl's; a reader also refuses a file
    no runtime has initialised (a writer initialises it). Returns the file's (application id,
    schema version, number of tables, or 1 for "some").

    A ``current`` file (its header vouches: see ``is_current_durabl``) has durabl's id and its
    tables for good, so only its version is read (a newer durabl's migration may have raised
    it in the WAL): one pragma, where the full look compiles a query over two pragma functions
    and the schema table (some 5% of a resume's time to its first new step)."""
    if current:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        app_id, tables = APPLICATION_ID, 1
    else:
        app_id, version, tables = conn.execute(Q["identity"]).fetchone()
    if app_id != APPLICATION_ID and (tables or version):
        raise ForeignDatabaseError(path=path)
    if version > SCHEMA_VERSION:
        raise SchemaVersionError(path=path, found=version, supported=SCHEMA_VERSION)
    if not writer and app_id != APPLICATION_ID:
        raise UninitialisedError(path=path)
    return app_id, version, tables


def _prepare_for_writing(
    path: str, conn: sqlite3.Connection, identity: tuple[int, int, int], *, wal: bool
) -> None:
    app_id, version, tables = identity
    if tables == 0:
        # A new file: let compaction hand freed pages back to the file system.
        # Only possible before the first table, and before the switch to WAL.
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    if not wal:  # a header that says WAL already is a WAL file: WAL mode persists
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise WalModeError(path=path)
    conn.execute("PRAGMA synchronous = NORMAL")
    if (app_id, version) != (APPLICATION_ID, SCHEMA_VERSION):
        migrate(conn)
        # Copy the new schema into the file itself, so that its header says what it is now
        # and the next opening can trust it (see the module docstring).
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
