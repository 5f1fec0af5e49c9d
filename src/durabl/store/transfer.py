"""Copy a durabl SQLite database to PostgreSQL whole (``durabl migrate``): every run with its
log, its compaction snapshot, its side effects, its key claims and its signals.

A copy lands whole or not at all. The source is read through a read-only store inside one read
transaction, so a process still writing to the file cannot tear what is copied. Every event's
and snapshot's checksum is verified, every log checked to start right after its watermark and
run without gaps, and every run's signals checked to be numbered 1, 2, ... with none missing,
before the target is touched. The target's schema is then created or migrated by
``open_store``, and one transaction on the server does the rest: it locks durabl's tables (so
nothing else writes while it looks), refuses a target that holds any durabl row, copies the rows
with COPY, reads every one of them back and compares it with the source, and only then commits. The schema's triggers stay on throughout, so each event is also checked by
the target's own rules as it arrives.

Leases and fences. A run's lease is not copied: it names a process on the SQLite side, which
cannot write to the target, and a copied lease that looked live would keep every worker off the
run until it expired. The copy has no owner, so the first worker on PostgreSQL takes it at once;
its ``lease_token`` is kept, so the run's tokens go on growing from where they were and no token
is ever issued twice for one run. Each event's ``fence`` is left NULL: it checked the writer's
token at the moment the event was written, and the trigger would refuse every token older than
the run's current one. Neither is part of an event's checksum.

Older files. A source whose schema is older than this durabl's (a v3 file has no signals table)
is refused, naming both versions: the read-only store opens a file as it is and never migrates
it, and a copy that filled in what the file lacks would be a migration nobody ran. Opening the
file once with a runtime migrates it, and it is copied then.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from durabl import codec
from durabl.errors import (
    CopyMismatchError,
    EventChecksumError,
    MigrationRefusedError,
    PostgresError,
    ServerUnreachableError,
    SnapshotChecksumError,
    TargetBusyError,
    TargetNotEmptyError,
)
from durabl.store import is_postgres_url, open_store
from durabl.store.schema import SCHEMA_VERSION
from durabl.store.sqlite import SQLiteStore

if TYPE_CHECKING:
    import psycopg

__all__ = ["CHECKING", "COPYING", "VERIFYING", "CopyReport", "Progress", "copy_database"]

CHECKING, COPYING, VERIFYING = "checking the source", "copying", "verifying the copy"
"""The three passes over the events, as ``Progress`` names them."""

Progress = Callable[[str, int, int], None]
"""Called with (pass, events done, events in all) during each pass over the events."""

_PROGRESS_EVERY = 5000
_LOCK_TIMEOUT_S = 30
_TABLES = ("runs", "events", "side_effects", "key_claims", "snapshots", "signals")


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What a migration copied, and how long it took (the source checked, the copy verified)."""

    source: str
    target: str
    runs: int
    events: int
    side_effects: int
    claims: int
    snapshots: int
    signals: int
    leases_cleared: int
    """Runs that had a lease on the SQLite side: their copies have none (see the module)."""
    seconds: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "events_per_s": round(self.events_per_s, 1)}


@dataclass(frozen=True, slots=True)
class _Table:
    """One table as the copy sees it: the columns, in the order the rows are read on both
    sides and compared; their PostgreSQL types (for binary COPY); the key they are ordered by."""

    name: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: int  # how many leading columns identify a row
    source_select: str

    def target_select(self) -> str:
        """The copy, read back in the source's order: SQLite orders text by its UTF-8 bytes,
        and so does ``convert_to``, whatever the target database's collation."""
        order = ", ".join(
            f"convert_to({c}, 'UTF8')" if t == "text" else c
            for c, t in zip(self.columns[: self.key], self.types, strict=False)
        )
        return f"SELECT {', '.join(self.columns)} FROM durabl.{self.name} ORDER BY {order}"

    def copy_in(self) -> str:
        return f"COPY durabl.{self.name} ({', '.join(self.columns)}) FROM STDIN (FORMAT BINARY)"

    def row_name(self, row: tuple[Any, ...]) -> str:
        """How a message names one row: by its run (and seq, or signal id), or by its
        idempotency key."""
        if self.name == "events":
            return f"run {row[0]!r} seq {row[1]}"
        if self.name == "signals":
            return f"run {row[0]!r} signal {row[1]}"
        return f"run {row[0]!r}" if self.columns[0] == "run_id" else f"key {row[0]!r}"


_LEASE_COLUMNS = ("lease_owner", "lease_pid", "lease_host", "lease_started", "lease_expires_s")
_RUN_COLUMNS = (
    *("run_id", "workflow", "input", "status", "result", "error"),
    *("created_s", "updated_s", "wake_at_s", "watermark", *_LEASE_COLUMNS, "lease_token"),
)
RUNS = _Table(
    "runs",
    _RUN_COLUMNS,
    ("text",) * 6 + ("float8",) * 3 + ("int8", "text", "int8", "text", "text", "float8", "int8"),
    1,
    # the lease is not copied, its token is (see the module docstring)
    "SELECT run_id, workflow, input, status, result, error, created_s, updated_s, wake_at_s, "
    "watermark, NULL, NULL, NULL, NULL, NULL, lease_token FROM runs ORDER BY run_id",
)
SNAPSHOTS = _Table(
    "snapshots",
    ("run_id", "watermark", "body", "crc"),
    ("text", "int8", "text", "int8"),
    1,
    "SELECT run_id, watermark, body, crc FROM snapshots ORDER BY run_id",
)
EVENTS = _Table(
    "events",
    ("run_id", "seq", "kind", "step", "fp", "data", "at_s", "crc"),
    ("text", "int8", "text", "int8", "text", "text", "float8", "int8"),
    2,
    # the fence is not copied (see the module docstring)
    "SELECT run_id, seq, kind, step, fp, data, at_s, crc FROM events ORDER BY run_id, seq",
)
SIDE_EFFECTS = _Table(
    "side_effects",
    ("idempotency_key", "run_id", "step", "tool", "args_fp", "result", "error", "at_s"),
    ("text", "text", "int8", "text", "text", "text", "text", "float8"),
    1,
    "SELECT idempotency_key, run_id, step, tool, args_fp, result, error, at_s "
    "FROM side_effects ORDER BY idempotency_key",
)
KEY_CLAIMS = _Table(
    "key_claims",
    ("idempotency_key", "run_id", "step", "tool", "args_fp", "at_s"),
    ("text", "text", "int8", "text", "text", "float8"),
    1,
    "SELECT idempotency_key, run_id, step, tool, args_fp, at_s FROM key_claims "
    "ORDER BY idempotency_key",
)
SIGNALS = _Table(
    "signals",
    ("run_id", "id", "name", "payload", "sent_s", "delivered_step"),
    ("text", "int8", "text", "text", "float8", "int8"),
    2,
    "SELECT run_id, id, name, payload, sent_s, delivered_step FROM signals ORDER BY run_id, id",
)
COPY_ORDER = (RUNS, SNAPSHOTS, EVENTS, SIDE_EFFECTS, KEY_CLAIMS, SIGNALS)
"""Runs first: the events' trigger reads each run's watermark, which must be there already."""

# What the source is checked with before anything is copied (SQLite).
_SOURCE_COUNTS = (
    "SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM events), "
    "(SELECT COUNT(*) FROM side_effects), (SELECT COUNT(*) FROM key_claims), "
    "(SELECT COUNT(*) FROM snapshots), (SELECT COUNT(*) FROM signals), "
    "(SELECT COUNT(*) FROM runs WHERE lease_owner IS NOT NULL)"
)
_SOURCE_SNAPSHOTS = (
    "SELECT snapshots.run_id, runs.watermark, snapshots.body, snapshots.crc "
    "FROM snapshots LEFT JOIN runs USING (run_id) ORDER BY snapshots.run_id"
)
_SOURCE_SIGNALS = (
    "SELECT signals.run_id, id, runs.run_id FROM signals LEFT JOIN runs USING (run_id) "
    "ORDER BY signals.run_id, id"
)
_SOURCE_EVENTS = (
    "SELECT events.run_id, seq, kind, step, fp, data, at_s, crc, runs.watermark "
    "FROM events LEFT JOIN runs USING (run_id) ORDER BY events.run_id, seq"
)
# What the target is checked with, inside the copy's transaction (PostgreSQL).
_TARGET_LOCK = "LOCK TABLE " + ", ".join(f"durabl.{t}" for t in _TABLES) + " IN EXCLUSIVE MODE"
_TARGET_COUNTS = "SELECT " + ", ".join(f"(SELECT COUNT(*) FROM durabl.{t})" for t in _TABLES)


@dataclass(frozen=True, slots=True)
class _Counts:
    runs: int
    events: int
    side_effects: int
    claims: int
    snapshots: int
    signals: int
    leases: int = 0

    def of(self, table: _Table) -> int:
        return {
            "runs": self.runs,
            "events": self.events,
            "side_effects": self.side_effects,
            "key_claims": self.claims,
            "snapshots": self.snapshots,
            "signals": self.signals,
        }[table.name]


def copy_database(
    source_path: str | os.PathLike[str], target_url: str, *, progress: Progress | None = None
) -> CopyReport:
    """Copy the durabl SQLite database at ``source_path`` into the empty PostgreSQL database at
    ``target_url`` in one transaction, and verify it there before it commits (see the module
    docstring). Raises ``MigrationRefusedError`` for a source or target it will not copy,
    the source store's own errors for a file that is not a durabl database, ``EventChecksumError``
    or ``SnapshotChecksumError`` for damaged history, ``TargetNotEmptyError``, and
    ``CopyMismatchError`` when what arrived differs from what was sent; none of them leaves a
    row in the target."""
    started = time.monotonic()
    source = os.fspath(source_path)
    _refuse_endpoints(source, target_url)
    store = SQLiteStore(source, read_only=True)
    try:
        with store.reading() as src:  # one state of the file for every pass
            _check_version(src, source, target_url)
            counts = _check_source(src, source, target_url, progress)
            target = _target_name(target_url)  # creates or migrates the target's schema
            _copy_and_verify(src, target_url, target, counts, progress)
    finally:
        store.close()
    return CopyReport(
        source=source,
        target=target,
        runs=counts.runs,
        events=counts.events,
        side_effects=counts.side_effects,
        claims=counts.claims,
        snapshots=counts.snapshots,
        signals=counts.signals,
        leases_cleared=counts.leases,
        seconds=time.monotonic() - started,
    )


def _refuse_endpoints(source: str, target_url: str) -> None:
    """What can be refused from the two names alone, before either database is opened."""
    shown = target_url.split("@")[-1]  # never a password in a message
    why = None
    if source == target_url:
        why = "the source and the target are the same database"
    elif not is_postgres_url(target_url):
        why = "the target must be a PostgreSQL URL (postgresql://HOST/DATABASE)"
    elif is_postgres_url(source):
        why = "the source must be a durabl SQLite file"
    if why is not None:
        raise MigrationRefusedError(source=source, target=shown, why=why)


def _target_name(target_url: str) -> str:
    """Open the target once, through the store (which creates or migrates durabl's schema and
    refuses a foreign one), and name it as durabl names a server: without its password."""
    store = open_store(target_url)
    try:
        return store.path
    finally:
        store.close()


def _rows(src: sqlite3.Connection, sql: str) -> Iterator[tuple[Any, ...]]:
    """``sql``'s rows as plain tuples, streamed (the store's connection makes ``Row``s)."""
    cursor = src.cursor()
    cursor.row_factory = None
    return iter(cursor.execute(sql))


def _check_version(src: sqlite3.Connection, source: str, target_url: str) -> None:
    """Refuse a source older than this durabl's schema, before any of its tables is read (see
    "Older files" in the module docstring); a newer one the store has refused already."""
    found = src.execute("PRAGMA user_version").fetchone()[0]
    if found < SCHEMA_VERSION:
        raise MigrationRefusedError(
            source=source,
            target=target_url.split("@")[-1],
            why=f"its schema is v{found}, older than this durabl's v{SCHEMA_VERSION}; open it "
            f"once with a runtime, which migrates it, and migrate it then",
        )


def _check_source(
    src: sqlite3.Connection, source: str, target_url: str, progress: Progress | None
) -> _Counts:
    """The source's row counts, once every snapshot and event has passed its checksum, every
    log has been found to start right after its watermark and run without a gap, and every
    signal to belong to a run that numbers its signals without a gap."""
    counts = _Counts(*src.execute(_SOURCE_COUNTS).fetchone())

    def refuse(why: str) -> MigrationRefusedError:
        return MigrationRefusedError(source=source, target=target_url.split("@")[-1], why=why)

    _check_signals(src, refuse)
    for run_id, watermark, body, crc in _rows(src, _SOURCE_SNAPSHOTS):
        if watermark is None:
            raise refuse(f"a snapshot names run {run_id!r}, which does not exist")
        if codec.snapshot_checksum(watermark, body) != crc:
            raise SnapshotChecksumError(path=source, run_id=run_id, watermark=watermark)
    last_run, last_seq = None, 0
    for done, row in enumerate(_rows(src, _SOURCE_EVENTS), 1):
        run_id, seq, kind, step, fp, data, at_s, crc, watermark = row
        if not codec.holds(seq, kind, step, fp, data, at_s, crc):
            raise EventChecksumError(path=source, run_id=run_id, seq=seq)
        if run_id != last_run:
            if watermark is None:
                raise refuse(f"events name run {run_id!r}, which does not exist")
            last_run, last_seq = run_id, watermark
        if seq != last_seq + 1:
            raise refuse(
                f"run {run_id}'s log goes from seq {last_seq} to seq {seq}; durabl doctor "
                f"describes the damage"
            )
        last_seq = seq
        if progress is not None and (done % _PROGRESS_EVERY == 0 or done == counts.events):
            progress(CHECKING, done, counts.events)
    return counts


def _check_signals(src: sqlite3.Connection, refuse: Callable[[str], MigrationRefusedError]) -> None:
    """Every signal names a run, and each run's are numbered 1, 2, ...: the store numbers them
    so and no signal is ever deleted, so a missing number is a signal lost behind its back,
    which a copy would make look as if it had never been sent."""
    last_run, last_id = None, 0
    for run_id, signal_id, found_run in _rows(src, _SOURCE_SIGNALS):
        if found_run is None:
            raise refuse(f"a signal names run {run_id!r}, which does not exist")
        if run_id != last_run:
            last_run, last_id = run_id, 0
        if signal_id != last_id + 1:
            raise refuse(
                f"run {run_id}'s signals go from #{last_id} to #{signal_id}: a signal was "
                f"deleted behind the store's back"
            )
        last_id = signal_id


def _copy_and_verify(
    src: sqlite3.Connection,
    target_url: str,
    target: str,
    counts: _Counts,
    progress: Progress | None,
) -> None:
    """The target's one transaction: lock, refuse a non-empty target, copy, read back, commit."""
    import psycopg

    try:
        conn = psycopg.connect(target_url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        message = " ".join(str(exc).split())
        raise ServerUnreachableError(
            path=target, why="cannot connect to PostgreSQL", server_message=message
        ) from None
    with conn:
        try:
            with conn.transaction():
                conn.execute("SET LOCAL synchronous_commit TO on")  # the commit is durable
                _lock(conn, target)
                _refuse_non_empty(conn, target)
                for table in COPY_ORDER:
                    _copy_table(src, conn, table, counts, progress)
                _compare_counts(conn, target, counts)
                for table in COPY_ORDER:
                    _verify_table(src, conn, table, target, counts, progress)
        except psycopg.Error as exc:
            raise _server_error(target, exc) from None


def _lock(conn: psycopg.Connection[Any], target: str) -> None:
    """Keep every other session from writing to durabl's tables until the copy commits, so
    that the target found empty is still empty when the copy lands. A session that holds them
    and does not let go (left idle in a transaction) is reported, not waited for forever."""
    import psycopg

    conn.execute(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT_S}s'")
    try:
        conn.execute(_TARGET_LOCK)
    except psycopg.errors.LockNotAvailable:
        raise TargetBusyError(path=target, waited_s=_LOCK_TIMEOUT_S) from None
    conn.execute("SET LOCAL lock_timeout = 0")


def _counts_on(conn: psycopg.Connection[Any]) -> dict[str, int]:
    found = conn.execute(_TARGET_COUNTS).fetchone()
    assert found is not None  # a SELECT without FROM always answers one row
    return dict(zip(_TABLES, found, strict=True))


def _refuse_non_empty(conn: psycopg.Connection[Any], target: str) -> None:
    found = _counts_on(conn)
    if any(found.values()):
        raise TargetNotEmptyError(
            path=target,
            runs=found["runs"],
            side_effects=found["side_effects"],
            claims=found["key_claims"],
            signals=found.get("signals", 0),
        )


def _copy_table(
    src: sqlite3.Connection,
    conn: psycopg.Connection[Any],
    table: _Table,
    counts: _Counts,
    progress: Progress | None,
) -> None:
    """COPY the source's rows of ``table`` in, in the source's order (a log in seq order, as
    the events' trigger requires)."""
    total = counts.of(table)
    report = progress if table is EVENTS else None  # the events are the bulk of the work
    with conn.cursor().copy(table.copy_in()) as copy:
        copy.set_types(list(table.types))
        for done, row in enumerate(_rows(src, table.source_select), 1):
            copy.write_row(row)
            if report is not None and (done % _PROGRESS_EVERY == 0 or done == total):
                report(COPYING, done, total)


def _compare_counts(conn: psycopg.Connection[Any], target: str, counts: _Counts) -> None:
    found = _counts_on(conn)
    for table in COPY_ORDER:
        if found[table.name] != counts.of(table):
            what = f"{table.name} holds {found[table.name]} rows, the source {counts.of(table)}"
            raise CopyMismatchError(path=target, table=table.name, what=what)


def _verify_table(
    src: sqlite3.Connection,
    conn: psycopg.Connection[Any],
    table: _Table,
    target: str,
    counts: _Counts,
    progress: Progress | None,
) -> None:
    """Every row of ``table`` as the target holds it, equal to the source's, in the same order
    and as many; each event's checksum recomputed from the values the server gave back."""
    total = counts.of(table)
    report = progress if table is EVENTS else None  # the events are the bulk of the work
    read_back = f"COPY ({table.target_select()}) TO STDOUT (FORMAT BINARY)"
    with conn.cursor().copy(read_back) as copy:
        copy.set_types(list(table.types))
        pairs = itertools.zip_longest(_rows(src, table.source_select), copy.rows())
        for done, (sent, got) in enumerate(pairs, 1):
            if sent != got:
                raise _mismatch(table, target, sent, got)
            if table is EVENTS:
                _, seq, kind, step, fp, data, at_s, crc = got
                if not codec.holds(seq, kind, step, fp, data, at_s, crc):
                    raise _mismatch(table, target, sent, got, "fails its checksum")
            if report is not None and (done % _PROGRESS_EVERY == 0 or done == total):
                report(VERIFYING, done, total)


def _mismatch(
    table: _Table,
    target: str,
    sent: tuple[Any, ...] | None,
    got: tuple[Any, ...] | None,
    difference: str | None = None,
) -> CopyMismatchError:
    """The first difference between the rows sent and the rows read back."""
    if got is None:
        assert sent is not None
        row, difference = table.row_name(sent), "is missing"
    elif sent is None:
        row, difference = table.row_name(got), "is not in the source"
    else:
        row = table.row_name(sent)
        if difference is None:
            pairs = zip(table.columns, sent, got, strict=True)
            difference = "differs in " + ", ".join(c for c, a, b in pairs if a != b)
    what = f"the {table.name} row of {row} {difference}"
    return CopyMismatchError(path=target, table=table.name, what=what)


def _server_error(target: str, exc: psycopg.Error) -> ServerUnreachableError | PostgresError:
    """What the server's refusal means, for a copy that did not commit."""
    import psycopg

    message = " ".join(str(exc).split())
    state = exc.sqlstate
    if isinstance(exc, psycopg.OperationalError) and (state is None or state.startswith("08")):
        return ServerUnreachableError(
            path=target,
            why="lost the connection to PostgreSQL before the copy was known to commit; "
            "migrate again: an empty target is copied, a committed copy refused as not empty",
            server_message=message,
        )
    primary = exc.diag.message_primary or message
    return PostgresError(path=target, server_message=primary, sqlstate=state)
