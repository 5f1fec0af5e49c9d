"""What can go wrong with a database file and the history in it: every ``StorageError``."""

from __future__ import annotations

from typing import Any, ClassVar

from durabl.errors.base import DurablError


def _restore(it: str) -> str:
    """The one remedy for damaged history: durabl never repairs it by guessing."""
    return f"restore {it} from a backup"


def _unknown_here(it: str) -> str:
    return f"which this durabl does not know; was {it} written by a newer version?"


# -- storage: the database file --------------------------------------------------------------


class StorageError(DurablError):
    """The database could not be opened, read or written."""


class SchemaVersionError(StorageError):
    """The database was written by a newer durabl than this one."""

    def __init__(self, *, path: str, found: int, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        super().__init__(
            f"{path} has durabl schema v{found}, written by a newer durabl; this version "
            f"understands up to v{supported}. Upgrade durabl to open it."
        )


class OlderSchemaError(StorageError, refines=True):
    """The database was written by an older durabl, and a read-only look cannot migrate it."""

    def __init__(self, *, path: str, found: int, supported: int) -> None:
        self.path, self.found, self.supported = path, found, supported
        super().__init__(
            f"{path} has durabl schema v{found}, older than this durabl's v{supported}; a "
            f"read-only command does not migrate it: open it once with a runtime (a worker, "
            f"resume, tick), which does"
        )


class NotADatabaseError(StorageError, refines=True):
    """The file is not a durabl database, and durabl will not touch it."""

    says: ClassVar[str] = "{path} is not a durabl database"

    def __init__(self, *, path: str) -> None:
        self.path = path
        super().__init__(self.says.format(path=path))


class DirectoryNotFileError(NotADatabaseError, refines=True):
    """The path names a directory."""

    says = "{path} is a directory, not a durabl database file"


class EmptyFileError(NotADatabaseError, refines=True):
    """The file is empty, and a read-only look must not initialise it."""

    says = "{path} is empty, not a durabl database"


class NotSQLiteError(NotADatabaseError, refines=True):
    """The file does not start with a SQLite header."""

    says = "{path} is not a durabl database (not a SQLite file)"


class ForeignDatabaseError(NotADatabaseError, refines=True):
    """The file is another program's SQLite database."""

    says = "{path} is a SQLite database but not a durabl database; refusing to touch it"


class UninitialisedError(NotADatabaseError, refines=True):
    """The file is an empty SQLite database that no durabl runtime has initialised."""

    says = "{path} is not an initialised durabl database"


class MissingFileError(StorageError, refines=True):
    """The database file, or the directory it would be created in, does not exist."""

    def __init__(self, *, path: str, directory: str | None = None) -> None:
        self.path, self.directory = path, directory
        super().__init__(
            f"{path} does not exist"
            if directory is None
            else f"cannot create {path}: directory {directory} does not exist"
        )


_ONLY_LOOK = "(open it with read_only=True to only look)"


class ReadOnlyPathError(StorageError, refines=True):
    """A runtime must write to the database, but the file or its directory is read-only."""

    def __init__(self, *, path: str, directory: str | None = None) -> None:
        self.path, self.directory = path, directory
        super().__init__(
            f"{path} is read-only; a runtime must write to it {_ONLY_LOOK}"
            if directory is None
            else f"{path}: directory {directory} is read-only; durabl writes the database and "
            f"its -wal and -shm files there {_ONLY_LOOK}"
        )


class TruncatedFileError(StorageError, refines=True):
    """The file is shorter than its header says: history is missing."""

    def __init__(self, *, path: str, promised_bytes: int, found_bytes: int) -> None:
        self.path, self.promised_bytes, self.found_bytes = path, promised_bytes, found_bytes
        super().__init__(
            f"{path} is truncated: its header promises {promised_bytes} bytes, the file has "
            f"{found_bytes}. {_restore('it').capitalize()}; durabl will not guess at missing "
            f"history."
        )


class StoreClosedError(StorageError, refines=True):
    """The store was closed; open a new one."""

    def __init__(self, *, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: the store is closed")


class WalModeError(StorageError, refines=True):
    """SQLite would not switch the database to WAL mode."""

    def __init__(self, *, path: str) -> None:
        self.path = path
        super().__init__(f"{path}: cannot switch the database to WAL mode")


# -- storage: what SQLite refused --------------------------------------------------------------


class SQLiteError(StorageError, refines=True):
    """SQLite refused the operation; its own message is kept in the text."""

    why: ClassVar[str | None] = None
    """What the refusal means for durabl, where that needs saying."""

    def __init__(self, *, path: str, sqlite_message: str, sqlite_errorname: str | None) -> None:
        self.path, self.sqlite_message = path, sqlite_message
        self.sqlite_errorname = sqlite_errorname
        why = f"{self.why} ({sqlite_message})" if self.why else sqlite_message
        super().__init__(f"{path}: {why}")


class SQLiteReadOnlyError(SQLiteError, refines=True):
    """SQLite could not write: the file or its directory is read-only."""

    why = "the database or its directory is read-only"


class SQLiteFullError(SQLiteError, refines=True):
    """The disk filled up; the write was rolled back whole."""

    why = "the disk is full; nothing of this write was kept"


class SQLiteCorruptError(SQLiteError, refines=True):
    """SQLite found the file corrupt."""

    why = f"the file is corrupt; {_restore('it')}"


class SQLiteCantOpenError(SQLiteError, refines=True):
    """SQLite could not open the file."""

    why = "the file cannot be opened (check the path and permissions)"


# -- storage: a PostgreSQL server ---------------------------------------------------------------


class PostgresDriverMissingError(StorageError, refines=True):
    """A PostgreSQL URL was given, but psycopg 3 is not installed."""

    def __init__(self, *, path: str, missing: str) -> None:
        self.path, self.missing = path, missing
        super().__init__(
            f"{path}: durabl needs {missing} to use PostgreSQL; install it with "
            f"pip install 'durabl[postgres]'"
        )


class ServerUnreachableError(StorageError, refines=True):
    """durabl could not connect to the PostgreSQL server, or lost it for good."""

    def __init__(self, *, path: str, why: str, server_message: str) -> None:
        self.path, self.why, self.server_message = path, why, server_message
        super().__init__(f"{path}: {why} ({server_message})")


class ForeignSchemaError(NotADatabaseError, refines=True):
    """The database's ``durabl`` schema holds tables that are not durabl's."""

    def __init__(self, *, path: str, tables: list[str]) -> None:
        self.path, self.tables = path, tables
        StorageError.__init__(
            self,
            f"{path}: schema durabl holds tables that are not durabl's ({', '.join(tables)}); "
            f"refusing to touch them. Point durabl at another database, or drop that schema",
        )


class PostgresError(StorageError, refines=True):
    """PostgreSQL refused the operation; its own message and SQLSTATE are kept in the text."""

    def __init__(self, *, path: str, server_message: str, sqlstate: str | None) -> None:
        self.path, self.server_message, self.sqlstate = path, server_message, sqlstate
        self.constraint: str | None = None
        """The constraint that refused the statement, if one did."""
        code = f" [SQLSTATE {sqlstate}]" if sqlstate else ""
        super().__init__(f"{path}: {server_message}{code}")


class InvariantError(StorageError, refines=True):
    """The database refused a write that would break an invariant its triggers enforce."""

    def __init__(self, *, path: str, rule: str, sqlite_message: str) -> None:
        self.path, self.rule, self.sqlite_message = path, rule, sqlite_message
        super().__init__(f"{path}: {rule} ({sqlite_message})")


class LogGapError(InvariantError, refines=True):
    """An event's seq must extend its run's log by exactly one."""


class HistoryRewriteError(InvariantError, refines=True):
    """Recorded history is never changed: no event, side effect or watermark goes back."""


class SideEffectExistsError(StorageError, refines=True):
    """An idempotency key already has its side effect: one key, one effect, ever."""

    def __init__(self, *, path: str, key: str, run_id: str, step: int) -> None:
        self.path, self.key, self.run_id, self.step = path, key, run_id, step
        super().__init__(
            f"{path}: refusing to record a second side effect for idempotency key {key!r} "
            f"(run {run_id}, step {step}): one key, one effect, ever"
        )


class RunExistsError(StorageError, refines=True):
    """A run of this id exists already: a commit that would create it is refused whole."""

    def __init__(self, *, path: str, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        super().__init__(f"{path}: refusing to create run {run_id!r}: a run of that id exists")


# -- storage: copying a database to another backend (durabl migrate) ---------------------------


class MigrationRefusedError(StorageError, refines=True):
    """durabl will not copy this source to this target, and has written nothing."""

    def __init__(self, *, source: str, target: str, why: str) -> None:
        self.source, self.target, self.why = source, target, why
        super().__init__(f"cannot migrate {source} to {target}: {why}; nothing was written")


class TargetNotEmptyError(StorageError, refines=True):
    """The target database already holds durabl data: a migration copies into an empty one."""

    def __init__(
        self, *, path: str, runs: int, side_effects: int, claims: int, signals: int = 0
    ) -> None:
        self.path, self.runs = path, runs
        self.side_effects, self.claims, self.signals = side_effects, claims, signals
        held = ", ".join(
            f"{n} {thing if n == 1 else things}"
            for n, thing, things in (
                (runs, "run", "runs"),
                (side_effects, "side effect", "side effects"),
                (claims, "key claim", "key claims"),
                (signals, "signal", "signals"),
            )
            if n or thing == "run"
        )
        super().__init__(
            f"{path} already holds durabl data ({held}); a migration copies only into an "
            f"empty database, so nothing was written. Create a new one (createdb) and migrate "
            f"into it"
        )


class TargetBusyError(StorageError, refines=True):
    """Another session holds the target's durabl tables, and a migration must have them alone."""

    def __init__(self, *, path: str, waited_s: float) -> None:
        self.path, self.waited_s = path, waited_s
        super().__init__(
            f"{path}: another session held durabl's tables for {waited_s:g} s (a worker, or a "
            f"transaction left open?); nothing was written. Stop it and migrate again"
        )


class CopyMismatchError(StorageError, refines=True):
    """Read back on arrival, the copy differs from its source; it was rolled back whole."""

    def __init__(self, *, path: str, table: str, what: str) -> None:
        self.path, self.table, self.what = path, table, what
        super().__init__(
            f"{path}: the copy does not match its source: {what}; it was rolled back, and the "
            f"target holds none of it"
        )


# -- storage: what the log holds -----------------------------------------------------------------


class ChecksumError(StorageError, refines=True):
    """A row fails its checksum: history is damaged and will not be replayed."""

    def __init__(self, *, path: str, run_id: str, what: str, consequence: str) -> None:
        self.path, self.run_id = path, run_id
        super().__init__(
            f"{path}: {what} fails its checksum; {consequence}. "
            f"{_restore('the database').capitalize()}."
        )


class EventChecksumError(ChecksumError, refines=True):
    """An event fails its checksum."""

    def __init__(self, *, path: str, run_id: str, seq: int) -> None:
        self.seq = seq
        what = f"event seq {seq} of run {run_id}"
        consequence = "the log is damaged and will not be replayed"
        super().__init__(path=path, run_id=run_id, what=what, consequence=consequence)


class SnapshotChecksumError(ChecksumError, refines=True):
    """A compaction snapshot fails its checksum."""

    def __init__(self, *, path: str, run_id: str, watermark: int) -> None:
        self.watermark = watermark
        what = f"the snapshot of run {run_id} (its log up to seq {watermark})"
        super().__init__(path=path, run_id=run_id, what=what, consequence="it will not be replayed")


class MissingSnapshotError(StorageError, refines=True):
    """The run's log was compacted, but the snapshot holding its folded prefix is gone."""

    def __init__(self, *, run_id: str, watermark: int, consequence: str | None = None) -> None:
        self.run_id, self.watermark = run_id, watermark
        after = "" if consequence is None else f"; {consequence}"
        super().__init__(
            f"run {run_id} is compacted up to seq {watermark} but has no snapshot{after}"
        )


class CompactedLogGapError(StorageError, refines=True):
    """The log does not resume right after the compacted prefix: the database is inconsistent."""

    def __init__(self, *, run_id: str, seq: int, watermark: int) -> None:
        self.run_id, self.seq, self.watermark = run_id, seq, watermark
        super().__init__(
            f"run {run_id}: its log resumes at seq {seq} after the compacted prefix ending at "
            f"seq {watermark}; the database is inconsistent"
        )


class UnknownEventKindError(StorageError, refines=True):
    """The log holds an event kind this durabl does not know."""

    def __init__(self, *, run_id: str, seq: int, kind: str) -> None:
        self.run_id, self.seq, self.kind = run_id, seq, kind
        super().__init__(
            f"run {run_id} seq {seq} has event kind {kind!r}, {_unknown_here('the log')}"
        )


class UnknownSnapshotFormatError(StorageError, refines=True):
    """A compaction snapshot is in a format this durabl does not know."""

    def __init__(self, *, run_id: str, snapshot_format: Any) -> None:
        self.run_id, self.snapshot_format = run_id, snapshot_format
        super().__init__(
            f"run {run_id} has a snapshot in format {snapshot_format!r}, {_unknown_here('it')}"
        )


class NoRunToCompactError(StorageError, refines=True):
    """There is no run with this id to compact."""

    def __init__(self, *, path: str, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        super().__init__(f"{path}: no run {run_id!r} to compact")
