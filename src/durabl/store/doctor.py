"""Check a durabl database for damage without changing it (``durabl doctor``).

The database is opened the way every read-only command opens it, ``open_store(path,
read_only=True)``: never created, migrated or written, and a database the store refuses
(foreign, newer, truncated, not SQLite, a server that cannot be reached) is reported with the
store's own reason. Every check then reads inside one read transaction (on PostgreSQL, one
REPEATABLE READ snapshot), so a worker appending meanwhile cannot make a healthy log look torn.
The log is scanned once; the checksum, numbering and status checks share it.

What differs between the backends is read through a ``_Reader``: the named queries, the
integrity check (SQLite's ``PRAGMA integrity_check``; PostgreSQL checks its own pages) and how
the schema's version and triggers are found.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from durabl import codec, events
from durabl.errors import MissingSnapshotError, StorageError
from durabl.store import is_postgres_url, open_store
from durabl.store.sqlite import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, Q
from durabl.text import counted

Progress = Callable[[int, int], None]
"""Called with (events checked, events in all) while the checksums are scanned."""

_PROGRESS_EVERY = 2000
_MOST_PROBLEMS = 20  # per check: past this, one line counts the rest
_TERMINAL_OF = {
    events.COMPLETED: events.RUN_COMPLETED,
    events.FAILED: events.RUN_FAILED,
    events.CANCELLED: events.RUN_CANCELLED,
    events.CONTINUED: events.RUN_CONTINUED,
}
_STATUSES = {
    *(events.RUNNING, events.SLEEPING, events.WAITING, events.HELD, events.DEAD_LETTERED),
    *_TERMINAL_OF,
}


@dataclass(frozen=True, slots=True)
class Finding:
    """One line of the report: a check that passed, or one problem a check found."""

    check: str
    ok: bool
    message: str


@dataclass(slots=True)
class _Run:
    run_id: str
    status: str
    watermark: int
    snapshot: str | None
    snapshot_crc: int | None


@dataclass(slots=True)
class _Log:
    """What the scan saw of one run's events."""

    count: int = 0
    first: tuple[int, str] | None = None  # (seq, kind)
    last: tuple[int, str] | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)  # missing seqs, first..last
    terminals: list[tuple[int, str]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Reader:
    """One backend's side of the checks, over one read transaction."""

    rows: Callable[[str], Iterable[Mapping[str, Any]]]
    """The rows of a named query, by column name."""
    tuples: Callable[[str], Iterable[tuple[Any, ...]]]
    integrity: Callable[[], tuple[str, list[str]]]
    schema: Callable[[], tuple[int, int, list[Finding]]]
    """(the database's schema version, this durabl's, what the schema check found)."""
    failure: type[Exception]
    """What the driver raises when the database cannot be read."""


def examine(path: str, progress: Progress | None = None) -> list[Finding]:
    """Every check's findings; the database is healthy when all of them are ``ok``."""
    try:
        store = open_store(path, read_only=True)
    except StorageError as exc:
        return [Finding("open", False, str(exc))]
    try:
        with store.reading() as conn:  # type: ignore[attr-defined]  # one read snapshot
            opened = Finding("open", True, f"{store.path} opened read-only")
            reader = _postgres(conn) if is_postgres_url(path) else _sqlite(conn)
            return [opened, *_checks(reader, progress)]
    finally:
        store.close()


def _sqlite(conn: sqlite3.Connection) -> _Reader:
    return _Reader(
        rows=lambda name: conn.execute(Q[name]),
        tuples=lambda name: conn.execute(Q[name]),
        integrity=lambda: _integrity(conn),
        schema=lambda: _schema(conn),
        failure=sqlite3.Error,
    )


def _postgres(conn: Any) -> _Reader:
    import psycopg
    from psycopg.rows import dict_row

    from durabl.store.postgres import MIGRATIONS as PG_MIGRATIONS
    from durabl.store.postgres import PQ
    from durabl.store.postgres import SCHEMA_VERSION as PG_VERSION

    def rows(name: str) -> Iterable[Mapping[str, Any]]:
        # A server-side cursor: the log is streamed, not loaded whole into this process.
        return conn.cursor(name=f"durabl_{name}", row_factory=dict_row).execute(PQ[name])

    def integrity() -> tuple[str, list[str]]:
        (checksums,) = conn.execute(PQ["doctor_page_checksums"]).fetchone()
        return f"the server checks its own pages (data_checksums: {checksums})", []

    def schema() -> tuple[int, int, list[Finding]]:
        (version,) = conn.execute(PQ["schema_version"]).fetchone()
        present = {row[0] for row in conn.execute(PQ["doctor_triggers"])}
        return version, PG_VERSION, _triggers(f"schema v{version}", PG_MIGRATIONS, present)

    return _Reader(
        rows=rows,
        tuples=lambda name: conn.execute(PQ[name]),
        integrity=integrity,
        schema=schema,
        failure=psycopg.Error,
    )


def _checks(reader: _Reader, progress: Progress | None) -> Iterator[Finding]:
    check = "integrity"
    try:
        yield from _report(check, *reader.integrity())
        check = "schema"
        version, current, found = reader.schema()
        yield from found
        if version < current:
            return
        check = "checksums"
        runs = {row["run_id"]: _Run(**row) for row in reader.rows("doctor_runs")}
        logs, damaged = _scan(reader, progress)
        damaged += [p for run in runs.values() if (p := _snapshot_damage(run))]
        scanned = counted(sum(log.count for log in logs.values()), "event")
        snapshots = counted(sum(1 for run in runs.values() if run.snapshot is not None), "snapshot")
        yield from _report(check, f"{scanned} and {snapshots} match their checksums", damaged)
        check = "logs"
        problems = [p for run in runs.values() for p in _log_problems(run, logs.get(run.run_id))]
        yield from _report(
            check, f"{counted(len(runs), 'run')}, each log whole and in order", problems
        )
        check = "status"
        problems = [p for run in runs.values() for p in _status_problems(run, logs.get(run.run_id))]
        yield from _report(check, "every run's status agrees with its log", problems)
        check = "orphans"
        yield from _report(check, "every row names an existing run", _orphans(reader, runs, logs))
    except reader.failure as exc:
        yield Finding(check, False, f"cannot read the database: {exc}")


def _report(check: str, ok_text: str, problems: list[str]) -> Iterator[Finding]:
    if not problems:
        yield Finding(check, True, ok_text)
        return
    for problem in problems[:_MOST_PROBLEMS]:
        yield Finding(check, False, problem)
    if len(problems) > _MOST_PROBLEMS:
        yield Finding(check, False, f"and {len(problems) - _MOST_PROBLEMS} more problems")


def _integrity(conn: sqlite3.Connection) -> tuple[str, list[str]]:
    lines = [row[0] for row in conn.execute(Q["doctor_integrity"])]
    return "PRAGMA integrity_check: ok", [] if lines == ["ok"] else lines


def _schema(conn: sqlite3.Connection) -> tuple[int, int, list[Finding]]:
    """The file's schema version, and what the check found. The store already refused a
    foreign or newer file; what is left to find is an older one and missing triggers."""
    app_id, version = conn.execute(Q["doctor_identity"]).fetchone()
    about = f"application id {app_id:#x}, schema v{version} (this durabl: v{SCHEMA_VERSION})"
    if app_id != APPLICATION_ID:
        return (
            version,
            SCHEMA_VERSION,
            [Finding("schema", False, f"{about}: not a durabl database")],
        )
    if version < SCHEMA_VERSION:
        later = (
            f"{about}: a runtime migrates it when it opens the file to write; the checks of "
            f"the log need v{SCHEMA_VERSION} and were not run"
        )
        return version, SCHEMA_VERSION, [Finding("schema", True, later)]
    present = {row[0] for row in conn.execute(Q["doctor_triggers"])}
    return version, SCHEMA_VERSION, _triggers(about, MIGRATIONS, present)


_WRITER = re.compile(r"CREATE TRIGGER (\w+) INSTEAD OF")
"""A trigger that writes rather than refuses: it turns an insert into a view into its rows."""


def _triggers(about: str, migrations: list[tuple[int, str]], present: set[str]) -> list[Finding]:
    """Whether every trigger the migrations create is in force: the guards of the invariants,
    and the writers behind the views a commit inserts into."""
    wanted = [n for _, script in migrations for n in re.findall(r"CREATE TRIGGER (\w+)", script)]
    writers = {n for _, script in migrations for n in _WRITER.findall(script)}
    problems = [
        f"trigger {name} is missing: "
        + (
            "a finished tool call can no longer be recorded (its commit inserts through the "
            "trigger's view)"
            if name in writers
            else "the database no longer enforces the invariant it guards"
        )
        for name in wanted
        if name not in present
    ]
    return list(_report("schema", f"{about}, {len(wanted)} triggers", problems))


def _scan(reader: _Reader, progress: Progress | None) -> tuple[dict[str, _Log], list[str]]:
    """One pass over every event, in log order: checksums, numbering, terminal events."""
    total = next(iter(reader.tuples("doctor_count_events")))[0]
    logs: dict[str, _Log] = {}
    damaged = []
    for done, row in enumerate(reader.rows("doctor_events"), 1):
        run_id, seq, kind = row["run_id"], row["seq"], row["kind"]
        step, fp, data, at_s, crc = row["step"], row["fp"], row["data"], row["at_s"], row["crc"]
        if not codec.holds(seq, kind, step, fp, data, at_s, crc):
            damaged.append(f"run {run_id} seq {seq}: the event ({kind}) fails its checksum")
        log = logs.setdefault(run_id, _Log())
        if log.last is not None and seq != log.last[0] + 1:
            log.gaps.append((log.last[0] + 1, seq - 1))
        log.count += 1
        log.first = log.first or (seq, kind)
        log.last = (seq, kind)
        if kind in events.TERMINAL:
            log.terminals.append((seq, kind))
        if progress is not None and (done % _PROGRESS_EVERY == 0 or done == total):
            progress(done, total)
    return logs, damaged


def _snapshot_damage(run: _Run) -> str | None:
    if (
        run.snapshot is None
        or codec.snapshot_checksum(run.watermark, run.snapshot) == run.snapshot_crc
    ):
        return None
    return f"run {run.run_id}: the snapshot (its log up to seq {run.watermark}) fails its checksum"


def _log_problems(run: _Run, log: _Log | None) -> Iterator[str]:
    name, mark = f"run {run.run_id}", run.watermark
    if mark > 0 and run.snapshot is None:
        yield str(MissingSnapshotError(run_id=run.run_id, watermark=mark))
    if mark == 0 and run.snapshot is not None:
        yield f"{name} has a snapshot but its watermark is 0"
    if log is None:
        if mark == 0:
            yield f"{name} has no events: its log must start with {events.RUN_STARTED}"
        return
    first_seq, first_kind = log.first or (0, "")
    if first_seq <= mark:
        yield f"{name} seq {first_seq}: still in the log though seqs 1..{mark} were compacted"
    elif first_seq > mark + 1:
        yield f"{name}: seqs {_seqs(mark + 1, first_seq - 1)} are missing (the log starts at seq {first_seq})"
    if mark == 0 and first_seq == 1 and first_kind != events.RUN_STARTED:
        yield f"{name} seq 1: {first_kind}, but a log starts with {events.RUN_STARTED}"
    for low, high in log.gaps:
        yield f"{name}: {_seqs(low, high)} missing from the log"


def _seqs(low: int, high: int) -> str:
    return f"seq {low} is" if low == high else f"seqs {low}..{high} are"


def _status_problems(run: _Run, log: _Log | None) -> Iterator[str]:
    name, status = f"run {run.run_id}", run.status
    if status not in _STATUSES:
        yield f"{name} has the unknown status {status!r}"
        return
    last = None if log is None else log.last
    for seq, kind in [] if log is None else log.terminals:
        if last is not None and seq != last[0]:
            yield f"{name} seq {seq}: {kind} is followed by more events (up to seq {last[0]})"
    wanted = _TERMINAL_OF.get(status)
    last_kind = "none" if last is None else f"{last[1]} (seq {last[0]})"
    if wanted is not None and (last is None or last[1] != wanted):
        yield f"{name} is {status} but its last event is {last_kind}, not {wanted}"
    if wanted is None and log is not None and log.terminals:
        seq, kind = log.terminals[-1]
        yield f"{name} is {status} but seq {seq} is {kind}"
    dead_last = last is not None and last[1] == events.DEAD_LETTERED
    if (status == events.DEAD_LETTERED) != dead_last:
        yield f"{name} is {status} but its last event is {last_kind}"


def _orphans(reader: _Reader, runs: dict[str, _Run], logs: dict[str, _Log]) -> list[str]:
    problems = [
        f"{table} row {key!r} names run {run_id!r}, which does not exist"
        for table, key, run_id in reader.tuples("doctor_orphans")
    ]
    problems += [
        f"{log.count} events name run {run_id!r}, which does not exist"
        for run_id, log in logs.items()
        if run_id not in runs
    ]
    return problems
