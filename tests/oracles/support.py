"""Test doubles for the outside world, and read-only views of a durabl database.

The only doubles are the things durabl talks to: the model and the tools. Everything durabl
itself does is observed through its public API or by reading the database with no durabl code in
between, the way an operator (or a restarted process) would see it: a SQLite file with
``sqlite3``, a PostgreSQL database with psycopg. Every oracle runs on both backends; ``db`` is a
file's path for SQLite and a URL for PostgreSQL, and ``connect`` takes the same statements for
both (SQLite's ``?`` and ``:name`` parameters, table names without their schema).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

import pg_support
from durabl import RetryPolicy, RunState, Runtime, tool
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.store import is_postgres_url
from logical_rows import logical

BACKENDS = ("sqlite", "postgres")
Database = Path | str
"""A SQLite file's path, or a PostgreSQL database's URL."""

START_S = 1_700_000_000.0
"""Where every injected clock starts: a fixed instant, so deadlines are exact numbers."""

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
STOPPED = (*TERMINAL, "DEAD_LETTERED")


class Clock:
    """An injected clock: time moves only when the test says so."""

    def __init__(self, now_s: float = START_S) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> float:
        self.now_s += seconds
        return self.now_s


class Outbox:
    """A real file that tools append their effects to: what the world has seen."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        with open(self.path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def find(self, key: str) -> dict[str, Any] | None:
        for record in self.records():
            if record["key"] == key:
                return record
        return None

    def count(self, **match: Any) -> int:
        return sum(1 for r in self.records() if all(r.get(k) == v for k, v in match.items()))


class World:
    """The LLM and the tools, counting every call. It outlives any one Runtime, like the world.

    - ``send`` (IDEMPOTENT): appends to the outbox, deduplicating on the idempotency key it is
      handed, so a second call with the same key has no second effect.
    - ``charge`` (AT_MOST_ONCE): appends to the outbox on every call; it cannot deduplicate.
    - ``search`` (IDEMPOTENT, no effect): a pure lookup.
    - ``flaky`` (IDEMPOTENT, retried with backoff): fails the first attempt for each key.
    - ``broken`` (IDEMPOTENT, two quick attempts): always raises.
    """

    def __init__(self, root: Path) -> None:
        self.outbox = Outbox(root / "outbox.jsonl")
        self.calls: Counter[str] = Counter()
        self.keys_seen: list[tuple[str, str]] = []
        self.flaky_failed: set[str] = set()
        self.llm_failures_left = 0

    # -- the model -------------------------------------------------------------------------

    def llm(self, prompt: Any, **params: Any) -> dict[str, Any]:
        self.calls["llm"] += 1
        if self.llm_failures_left > 0:
            self.llm_failures_left -= 1
            raise ConnectionError("model endpoint unavailable")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
        return {"text": f"answer({text})", "tokens": len(text), "params": params}

    # -- the tools -------------------------------------------------------------------------

    def send(self, *, to: str, body: str, idempotency_key: str) -> dict[str, Any]:
        self.calls["send"] += 1
        self.keys_seen.append(("send", idempotency_key))
        found = self.outbox.find(idempotency_key)
        if found is None:
            self.outbox.append({"tool": "send", "key": idempotency_key, "to": to, "body": body})
        return {"sent": f"{to}:{body}"}

    def charge(self, *, amount: int, idempotency_key: str) -> dict[str, Any]:
        self.calls["charge"] += 1
        self.keys_seen.append(("charge", idempotency_key))
        self.outbox.append({"tool": "charge", "key": idempotency_key, "amount": amount})
        return {"charged": amount}

    def search(self, *, q: str) -> list[str]:
        self.calls["search"] += 1
        return [f"{q}-1", f"{q}-2"]

    def flaky(self, *, n: int, idempotency_key: str) -> int:
        self.calls["flaky"] += 1
        if idempotency_key not in self.flaky_failed:
            self.flaky_failed.add(idempotency_key)
            raise TimeoutError(f"flaky timed out for {idempotency_key}")
        return n * 10

    def broken(self, *, why: str) -> None:
        self.calls["broken"] += 1
        raise ValueError(f"broken: {why}")

    def tools(self, *, flaky_delay_s: float = 5.0) -> dict[str, Any]:
        return {
            "send": tool(self.send, mode="IDEMPOTENT"),
            "charge": tool(self.charge, mode="AT_MOST_ONCE"),
            "search": tool(self.search, mode="IDEMPOTENT"),
            "flaky": tool(
                self.flaky,
                mode="IDEMPOTENT",
                retry=RetryPolicy(max_attempts=3, base_delay=flaky_delay_s),
            ),
            "broken": tool(
                self.broken, mode="IDEMPOTENT", retry=RetryPolicy(max_attempts=2, base_delay=0.0)
            ),
        }

    @property
    def total_calls(self) -> int:
        return sum(self.calls.values())


# -- reading the database ---------------------------------------------------------------------


_QUOTED = re.compile(r"('(?:[^']|'')*')")


def _psycopg_style(sql: str) -> str:
    """``sql`` with SQLite's parameters (``?``, ``:name``) in psycopg's style, literal
    percent signs doubled; quoted literals keep their question marks and colons."""
    parts = _QUOTED.split(sql.replace("%", "%%"))
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"(?<![:\w]):(\w+)", r"%(\1)s", parts[i]).replace("?", "%s")
    return "".join(parts)


class ServerConnection:
    """A plain psycopg connection (autocommit, the ``durabl`` schema on the search path) that
    takes the statements the oracles write for ``sqlite3``."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor[Any]:
        return self.conn.execute(_psycopg_style(sql), params)

    def close(self) -> None:
        self.conn.close()


@contextlib.contextmanager
def connect(db: Database) -> Iterator[Any]:
    """A connection to the database with no durabl code in between, in autocommit mode."""
    if is_postgres_url(db):
        with pg_support.connect(str(db)) as server:
            yield ServerConnection(server)
        return
    conn = sqlite3.connect(os.fspath(db), isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


def open_connection(db: Database) -> Any:
    """``connect``, to be closed by the caller."""
    if is_postgres_url(db):
        return ServerConnection(pg_support.open_connection(str(db)))
    return sqlite3.connect(os.fspath(db), isolation_level=None)


@contextlib.contextmanager
def unguarded(db: Database, table: str) -> Iterator[Any]:
    """A connection on which an UPDATE of ``table`` gets past durabl's triggers: damage that no
    durabl code could do, as a failing disk or a bad restore would. On SQLite the triggers that
    refuse it are dropped (from the copy a test damages); on PostgreSQL the table's triggers are
    disabled for the block only."""
    with connect(db) as conn:
        if isinstance(conn, ServerConnection):
            with pg_support.guards_off(conn.conn, table):
                yield conn
            return
        found = conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ? "
            "AND sql LIKE '%BEFORE UPDATE%'",
            (table,),
        )
        for (name,) in found.fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        yield conn


def refusal(db: Database) -> type[Exception]:
    """What the database's own driver raises when a trigger or a constraint refuses a write."""
    return psycopg.Error if is_postgres_url(db) else sqlite3.IntegrityError


def _as_dicts(cursor: Any) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def event_rows(db: Path | str, run_id: str | None = None) -> list[tuple[Any, ...]]:
    """Every column of every event row (of one run, or of all runs), in log order."""
    with connect(db) as conn:
        if run_id is None:
            sql = "SELECT run_id, seq, kind, step, fp, data, at_s, crc FROM events"
            return conn.execute(sql + " ORDER BY run_id, seq").fetchall()
        sql = "SELECT run_id, seq, kind, step, fp, data, at_s, crc FROM events WHERE run_id = ?"
        return conn.execute(sql + " ORDER BY seq", (run_id,)).fetchall()


def kinds(db: Path | str, run_id: str) -> list[str]:
    return [row[2] for row in event_rows(db, run_id)]


def side_effect_rows(db: Path | str) -> list[tuple[Any, ...]]:
    with connect(db) as conn:
        return conn.execute(
            "SELECT idempotency_key, run_id, step, tool, args_fp, result, error, at_s "
            "FROM side_effects ORDER BY idempotency_key"
        ).fetchall()


def claim_rows(db: Path | str) -> list[tuple[Any, ...]]:
    with connect(db) as conn:
        return conn.execute(
            "SELECT idempotency_key, run_id, step FROM key_claims ORDER BY idempotency_key"
        ).fetchall()


def run_row(db: Path | str, run_id: str) -> dict[str, Any]:
    with connect(db) as conn:
        rows = _as_dicts(conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)))
    assert rows, f"no runs row for {run_id}"
    return rows[0]


def snapshot_row(db: Path | str, run_id: str) -> dict[str, Any] | None:
    """The run's compaction snapshot row (watermark, body, crc), or None."""
    with connect(db) as conn:
        rows = _as_dicts(conn.execute("SELECT * FROM snapshots WHERE run_id = ?", (run_id,)))
    return rows[0] if rows else None


def run_ids(db: Path | str) -> list[str]:
    with connect(db) as conn:
        return [r[0] for r in conn.execute("SELECT run_id FROM runs ORDER BY created_s, run_id")]


# -- the oracles, as reusable checks ---------------------------------------------------------


def assert_gapless(db: Path | str) -> None:
    """Every run's seq numbers are exactly 1..N."""
    by_run: dict[str, list[int]] = {}
    for row in event_rows(db):
        by_run.setdefault(row[0], []).append(row[1])
    for rid in run_ids(db):
        seqs = by_run.get(rid, [])
        assert seqs == list(range(1, len(seqs) + 1)), f"run {rid} has seqs {seqs}"
        assert seqs, f"run {rid} has no events at all"


def tool_steps(db: Path | str, run_id: str) -> dict[int, str]:
    """Position -> idempotency key, for every tool step the run's log started."""
    found = {}
    for _, _, kind, step, _, data, _, _ in logical(event_rows(db, run_id)):
        if kind == "STEP_STARTED" and data is not None:
            canonical = json.loads(data)
            if canonical[0] == "tool" and step not in found:
                found[step] = canonical[3] or f"durabl:{run_id}:{step}"
    return found


def assert_effects_match_log(db: Path | str) -> None:
    """The side_effects table and the log agree, at any instant a process may have died.

    - every side_effects row has, in its run's log, the completion (STEP_COMPLETED or
      STEP_FAILED) of the step that recorded it, and a STEP_COMPLETED carries the same result;
    - every tool step that the log says completed is backed by the side_effects row of its key.
    """
    effects = {row[0]: row for row in side_effect_rows(db)}
    for key, rid, step, _tool, _fp, result, error, _at in effects.values():
        rows = [r for r in logical(event_rows(db, rid)) if r[3] == step]
        done = [r for r in rows if r[2] in ("STEP_COMPLETED", "STEP_FAILED")]
        assert done, f"side effect {key!r} of run {rid} step {step} has no completion in the log"
        if error is None:
            assert done[-1][2] == "STEP_COMPLETED", f"{key!r}: {done}"
            assert done[-1][5] == result, f"{key!r}: log says {done[-1][5]}, row says {result}"
    for rid in run_ids(db):
        rows = logical(event_rows(db, rid))
        for step, key in tool_steps(db, rid).items():
            completed = [r for r in rows if r[3] == step and r[2] == "STEP_COMPLETED"]
            if completed:
                assert key in effects, (
                    f"run {rid} step {step} completed but side_effects has no row for {key!r}"
                )
                assert effects[key][5] == completed[-1][5], f"{key!r} result differs from log"


def assert_timers_once(db: Path | str) -> None:
    """Each armed timer fired at most once, and never before its deadline."""
    for rid in run_ids(db):
        armed: dict[int, float] = {}
        fired: Counter[int] = Counter()
        for _, _, kind, step, _, data, _, _ in event_rows(db, rid):
            if kind == "TIMER_ARMED":
                assert step not in armed, f"run {rid} step {step} armed twice"
                armed[step] = json.loads(data)["fire_at_s"]
            elif kind == "TIMER_FIRED":
                fired[step] += 1
                fired_at_s = json.loads(data)["fired_at_s"]
                assert fired_at_s >= armed[step], f"run {rid} step {step} fired early"
        assert all(n == 1 for n in fired.values()), f"run {rid} timers fired {dict(fired)}"


# -- driving runs ------------------------------------------------------------------------------


def crash(point: str, occurrence: int, action: Callable[[], Any]) -> bool:
    """Run ``action`` with a death armed at ``point``; True when the process died there."""
    with CrashAt(point, occurrence) as hook:
        try:
            action()
        except ProcessDeath as death:
            assert death.point == point
    return hook.fired


def chain_of(store: Any, run_id: str) -> list[str]:
    """``run_id`` and the runs its ContinueAsNew chain went on as, in order, as ``store`` (a
    durabl store) has them now ([] if there is no such run)."""
    chain = []
    row = store.get_run(run_id)
    while row is not None:
        chain.append(row.run_id)
        if row.status != "CONTINUED" or row.result_text is None:
            break
        row = store.get_run(json.loads(row.result_text)["continued_as"])
    return chain


def drive_to_rest(
    rt: Runtime,
    clock: Clock,
    run_id: str,
    *,
    limit: int = 20,
    answer: Callable[[], Any] | None = None,
) -> RunState:
    """resume_all + tick, moving the clock on, until the run stops (or is dead-lettered).
    ``answer``: called each time before the clock moves (whoever sends the run's signals).
    A run that continued as another (ContinueAsNew) is followed: the state returned is that
    of the run its chain has got to."""
    for _ in range(limit):
        state = rt.state(chain_of(rt.store, run_id)[-1])
        if state.status in STOPPED:
            return state
        rt.resume_all()
        state = rt.state(chain_of(rt.store, run_id)[-1])
        if state.status in STOPPED:
            return state
        if answer is not None:
            answer()
        clock.advance(3600.0)
        rt.tick()
    raise AssertionError(f"run {run_id} did not come to rest: {rt.state(run_id)}")


__all__ = [
    "START_S",
    "STOPPED",
    "TERMINAL",
    "Clock",
    "Outbox",
    "World",
    "assert_effects_match_log",
    "assert_gapless",
    "assert_timers_once",
    "chain_of",
    "claim_rows",
    "connect",
    "crash",
    "drive_to_rest",
    "event_rows",
    "kinds",
    "open_connection",
    "run_ids",
    "run_row",
    "side_effect_rows",
    "tool_steps",
]


# -- read-only snapshots of a database, for the chaos grid -------------------------------------


@contextlib.contextmanager
def _read_only(db: Database) -> Iterator[Any]:
    """A connection that cannot change what a death left behind. For SQLite the file is opened
    with ``mode=ro``, so reading a crashed database neither checkpoints nor removes its
    ``-wal``; for PostgreSQL the reads share one read-only snapshot."""
    if is_postgres_url(db):
        with connect(db) as conn:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield conn
            conn.execute("COMMIT")
        return
    uri = f"file:{os.path.abspath(os.fspath(db))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    try:
        yield conn
    finally:
        conn.close()


class Snapshot:
    """One read-only look at a database: what a restarted process would find."""

    def __init__(self, db: Database) -> None:
        with _read_only(db) as conn:
            rows = conn.execute(
                "SELECT run_id, seq, kind, step, fp, data, at_s FROM events ORDER BY run_id, seq"
            ).fetchall()
            self.effects: dict[str, tuple[Any, ...]] = {
                row[0]: row
                for row in conn.execute(
                    "SELECT idempotency_key, run_id, step, tool, args_fp, result, error, at_s "
                    "FROM side_effects"
                )
            }
            self.claims: list[tuple[Any, ...]] = conn.execute(
                "SELECT idempotency_key, run_id, step FROM key_claims ORDER BY idempotency_key"
            ).fetchall()
            self.runs: dict[str, tuple[Any, ...]] = {
                row[0]: row
                for row in conn.execute(
                    "SELECT run_id, status, result, error, wake_at_s FROM runs ORDER BY run_id"
                )
            }
            sent = conn.execute(
                "SELECT run_id, id, name, payload, sent_s, delivered_step FROM signals "
                "ORDER BY run_id, id"
            ).fetchall()
        self.events: dict[str, list[tuple[Any, ...]]] = {run_id: [] for run_id in self.runs}
        for run_id, *event in logical(rows):
            self.events.setdefault(run_id, []).append(tuple(event))
        self.signals: dict[str, list[tuple[Any, ...]]] = {run_id: [] for run_id in self.runs}
        """Each run's signals, in the order sent: (id, name, payload, sent_s, delivered_step)."""
        for run_id, *signal in sent:
            self.signals.setdefault(run_id, []).append(tuple(signal))

    def status(self, run_id: str) -> str:
        return str(self.runs[run_id][1])

    def at_step(self, run_id: str, step: int) -> list[tuple[Any, ...]]:
        """The run's events at one step position: (seq, kind, step, fp, data, at_s)."""
        return [e for e in self.events.get(run_id, []) if e[2] == step]

    def tool_steps(self, run_id: str) -> dict[int, tuple[str, str]]:
        """Position -> (tool name, idempotency key), for every tool step the log started."""
        found: dict[int, tuple[str, str]] = {}
        for _seq, kind, step, _fp, data, _at in self.events.get(run_id, []):
            if kind == "STEP_STARTED" and data is not None and step not in found:
                canonical = json.loads(data)
                if canonical[0] == "tool":
                    found[step] = (canonical[1], canonical[3] or f"durabl:{run_id}:{step}")
        return found

    def waits(self, run_id: str) -> dict[int, str]:
        """Position -> signal name, for every ``WaitSignal`` the log started."""
        found: dict[int, str] = {}
        for _seq, kind, step, _fp, data, _at in self.events.get(run_id, []):
            if kind == "STEP_STARTED" and (data or "").startswith('["signal"'):
                found[step] = json.loads(data)[1]
        return found

    def open_dispatches(self, run_id: str) -> dict[int, tuple[str, str]]:
        """Tool steps whose latest attempt was dispatched and has no recorded outcome: the
        ambiguous window, as a restarted process finds it."""
        found = {}
        for step, (name, key) in self.tool_steps(run_id).items():
            kinds_here = [e[1] for e in self.at_step(run_id, step)]
            if kinds_here and kinds_here[-1] == "TOOL_DISPATCHED":
                found[step] = (name, key)
        return found


def assert_snapshot_gapless(snap: Snapshot) -> None:
    """Every run's seq numbers are exactly 1..N, and every run has its RUN_STARTED."""
    for run_id, rows in snap.events.items():
        seqs = list(dict.fromkeys(row[0] for row in rows))  # expanded events share a seq
        assert seqs == list(range(1, len(seqs) + 1)), f"run {run_id} has seqs {seqs}"
        assert rows and rows[0][1] == "RUN_STARTED", f"run {run_id} does not begin RUN_STARTED"


def assert_log_and_effects_agree(snap: Snapshot) -> None:
    """The torn-write check: at whatever instant a process died, the side_effects table, the
    key claims and the log describe the same history.

    - every side_effects row belongs to a step of its run that the log shows finished
      (STEP_COMPLETED with the same result, or STEP_FAILED for a recorded failure), and the
      step's fingerprint is the row's;
    - every tool step the log shows completed is backed by the row of its key, same result;
    - every open key claim names a step that was dispatched and has no outcome yet.
    """
    for key, run_id, step, _tool, args_fp, result, error, _at in snap.effects.values():
        rows = snap.at_step(run_id, step)
        done = [r for r in rows if r[1] in ("STEP_COMPLETED", "STEP_FAILED")]
        assert done, f"side effect {key!r} of run {run_id} step {step} has no completion in the log"
        started = [r for r in rows if r[1] == "STEP_STARTED"]
        assert started and started[0][3] == args_fp, f"{key!r} was recorded for another step"
        if error is None:
            assert done[-1][1] == "STEP_COMPLETED", f"{key!r}: the log ends the step {done[-1]}"
            assert done[-1][4] == result, f"{key!r}: log says {done[-1][4]}, row says {result}"
        else:
            assert any(r[1] == "STEP_FAILED" for r in done), f"{key!r} failed, log: {done}"
    for run_id in snap.runs:
        for step, (_name, key) in snap.tool_steps(run_id).items():
            completed = [r for r in snap.at_step(run_id, step) if r[1] == "STEP_COMPLETED"]
            if completed:
                assert key in snap.effects, (
                    f"run {run_id} step {step} completed but side_effects has no row for {key!r}"
                )
                assert snap.effects[key][5] == completed[-1][4], f"{key!r} result differs"
    for key, run_id, step in snap.claims:
        kinds_here = [r[1] for r in snap.at_step(run_id, step)]
        assert "TOOL_DISPATCHED" in kinds_here, f"claim {key!r} names an undispatched step"
        assert not {"STEP_COMPLETED", "STEP_FAILED"} & set(kinds_here), (
            f"claim {key!r} is still open although run {run_id} step {step} finished"
        )


def assert_snapshot_timers(snap: Snapshot, *, finished: bool) -> None:
    """Timers fire at most once (exactly once in a ``finished`` database) and never early:
    a Sleep fires at or after its deadline, a retry attempt starts at or after its backoff.
    A ``WaitSignal``'s timeout is a timer that its completion ends instead: answered at any
    time, timed out never before its deadline, and never fired as well."""
    for run_id, rows in snap.events.items():
        waits = snap.waits(run_id)
        armed: dict[int, float] = {}
        fired: Counter[int] = Counter()
        retry_at: dict[int, float] = {}
        for _seq, kind, step, _fp, data, at_s in rows:
            if kind == "TIMER_ARMED":
                assert step not in armed, f"run {run_id} step {step} armed twice"
                armed[step] = json.loads(data)["fire_at_s"]
            elif kind == "TIMER_FIRED":
                fired[step] += 1
                assert step in armed, f"run {run_id} step {step} fired without being armed"
                assert step not in waits, f"run {run_id} step {step}: a wait's timeout fired"
                fired_at_s = json.loads(data)["fired_at_s"]
                assert min(fired_at_s, at_s) >= armed[step], (
                    f"run {run_id} step {step} fired at {fired_at_s}, due {armed[step]}"
                )
            elif kind == "STEP_COMPLETED" and step in waits and step in armed:
                fired[step] += 1
                if json.loads(data).get("timed_out") is True:
                    assert at_s >= armed[step], (
                        f"run {run_id} wait at step {step} timed out at {at_s}, due {armed[step]}"
                    )
            elif kind == "STEP_RETRY":
                retry_at[step] = json.loads(data)["retry_at_s"]
            elif kind == "STEP_STARTED" and step in retry_at:
                assert at_s >= retry_at[step], (
                    f"run {run_id} step {step} retried at {at_s}, backoff until {retry_at[step]}"
                )
                del retry_at[step]
        assert all(n == 1 for n in fired.values()), f"run {run_id} timers fired {dict(fired)}"
        if finished:
            assert set(fired) == set(armed), (
                f"run {run_id} armed timers {sorted(armed)} but fired {sorted(fired)}"
            )


def assert_signals_delivered_once(snap: Snapshot) -> None:
    """The signals table and the log agree on every delivery, at whatever instant a process
    died (the delivery and the wait's completion are one transaction):

    - a wait's completion that records a signal names one sent to its run, of the wait's name,
      with the payload the wait returned, and that signal is marked delivered to that wait;
    - a signal marked delivered is recorded by the completion of the wait it names;
    - no signal is taken by two waits, and the signals of one name are taken in the order sent
      (none is left pending while a later one of its name was taken);
    - a run's ContinueAsNew hands the signals no wait took to the run it goes on as (the
      commit that continues it): a CONTINUED run has none pending, those marked delivered to
      its ContinueAsNew are the first signals of the next run, in the order sent, with their
      names, payloads and times, and a run that has not continued has none marked so.
    """
    for run_id, sent in snap.signals.items():
        waits = snap.waits(run_id)
        carried = [row for row in sent if row[4] in started_steps(snap, run_id, "continue")]
        if snap.runs[run_id][1] == "CONTINUED":
            pending = [row for row in sent if row[4] is None]
            assert not pending, f"run {run_id} continued, leaving signals pending: {pending}"
            after = json.loads(snap.runs[run_id][2])["continued_as"]
            handed = snap.signals.get(after, [])[: len(carried)]
            assert [row[1:4] for row in handed] == [row[1:4] for row in carried], (
                f"run {run_id} continued as {after} with the signals {carried} no wait took; "
                f"{after} holds {snap.signals.get(after)}"
            )
        else:
            assert not carried, f"run {run_id} has not continued, but handed on {carried}"
        sent = [row for row in sent if row not in carried]
        rows = {signal_id: (name, payload, step) for signal_id, name, payload, _s, step in sent}
        taken: dict[int, int] = {}
        for _seq, kind, step, _fp, data, _at in snap.events.get(run_id, []):
            if kind != "STEP_COMPLETED" or step not in waits:
                continue
            answer = json.loads(data)
            if "signal" not in answer:
                continue
            signal_id = answer["signal"]
            where = f"run {run_id} wait at step {step} took signal {signal_id}"
            assert signal_id not in taken, f"{where}, already taken at step {taken[signal_id]}"
            taken[signal_id] = step
            assert signal_id in rows, f"{where}, which the signals table does not hold"
            name, payload, delivered = rows[signal_id]
            assert name == waits[step], f"{where}, named {name!r}, for {waits[step]!r}"
            assert json.loads(payload) == answer["payload"], f"{where}: payloads differ"
            assert delivered == step, f"{where}; the table says delivered to {delivered}"
        for signal_id, (name, _payload, delivered) in rows.items():
            assert delivered is None or taken.get(signal_id) == delivered, (
                f"run {run_id} signal {signal_id} ({name!r}) is marked delivered to step "
                f"{delivered}, but no completion there records it"
            )
        for name in {row[0] for row in rows.values()}:
            steps = [rows[i][2] for i in sorted(rows) if rows[i][0] == name]
            delivered = [step for step in steps if step is not None]
            assert steps[: len(delivered)] == delivered == sorted(delivered), (
                f"run {run_id}: signals {name!r} were taken out of the order sent: {steps}"
            )


def run_started(snap: Snapshot, run_id: str) -> dict[str, Any]:
    """What the run's RUN_STARTED says (its workflow, input, and the run it continued or the
    parent step that started it), or {} for a log that does not begin with one."""
    rows = snap.events.get(run_id) or []
    if not rows or rows[0][1] != "RUN_STARTED":
        return {}
    return dict(json.loads(rows[0][4] or "{}"))


def started_steps(snap: Snapshot, run_id: str, kind: str) -> dict[int, list[Any]]:
    """Position -> the decoded canonical text, for every step of ``kind`` ("child",
    "continue", "parallel", ...) the run's log started."""
    found: dict[int, list[Any]] = {}
    for _seq, event, step, _fp, data, _at in snap.events.get(run_id, []):
        if event == "STEP_STARTED" and (data or "").startswith(f'["{kind}"'):
            found.setdefault(step, json.loads(data))
    return found


def assert_parallels_in_order(snap: Snapshot) -> None:
    """Each ``Parallel`` of N branches at position P, as its log records it at whatever instant
    a process died: its STEP_STARTED comes before anything of its branches, which are the steps
    it names, in the order given, at P+1..P+N; and its outcome, once recorded, comes after
    every branch's and is theirs: a completion holds the branches' recorded results as a list
    in the order given (whatever order they finished in), a failure is the failure of the
    first branch, in the order given, that failed."""
    for run_id in snap.runs:
        for position, canonical in started_steps(snap, run_id, "parallel").items():
            branches = canonical[1]
            where = f"run {run_id} Parallel at step {position}"
            opened = snap.at_step(run_id, position)[0][0]
            ends: list[tuple[Any, ...] | None] = []
            for index, branch in enumerate(branches):
                rows = snap.at_step(run_id, position + 1 + index)
                assert all(row[0] > opened for row in rows), (
                    f"{where}: branch {index} wrote before the Parallel began"
                )
                starts = [row for row in rows if row[1] == "STEP_STARTED"]
                assert all(json.loads(row[4]) == branch for row in starts), (
                    f"{where}: step {position + 1 + index} is not its branch {index}"
                )
                done = [row for row in rows if row[1] in ("STEP_COMPLETED", "STEP_FAILED")]
                ends.append(done[-1] if done else None)
            outcomes = [
                row
                for row in snap.at_step(run_id, position)
                if row[1] in ("STEP_COMPLETED", "STEP_FAILED")
            ]
            if not outcomes:
                continue
            [(seq, kind, _step, _fp, data, _at)] = outcomes
            if kind == "STEP_COMPLETED":
                assert all(end is not None and end[1] == "STEP_COMPLETED" for end in ends), (
                    f"{where} completed, but its branches ended {ends}"
                )
                expected = "[" + ",".join(end[4] or "null" for end in ends if end) + "]"
                assert data == expected, (
                    f"{where} recorded {data}; its branches, in the order given, {expected}"
                )
            else:
                failed = [end for end in ends if end is not None and end[1] == "STEP_FAILED"]
                assert failed and data == failed[0][4], (
                    f"{where} failed with {data}; its first failed branch: {failed[:1]}"
                )
            late = [end for end in ends if end is not None and end[0] > seq]
            assert not late, f"{where} recorded its outcome before its branches ended: {late}"


def run_names(snap: Snapshot) -> dict[str, str]:
    """A name for every run that is the same in every scenario of a workflow: its own id for a
    run the test started, ``<first>~<n>`` for the n-th run of a ContinueAsNew chain (whose id
    is new each time), and a child's derived id with its parent's id replaced by the parent's
    name."""
    names: dict[str, str] = {}

    def name(run_id: str) -> str:
        if run_id not in names:
            data = run_started(snap, run_id)
            before, parent = data.get("continued_from"), data.get("parent")
            names[run_id] = run_id  # a placeholder, should the links loop
            if before is not None and before in snap.runs:
                first, _, n = name(before).partition("~")
                names[run_id] = f"{first}~{int(n or 1) + 1}"
            elif parent is not None and run_id.startswith(parent["run_id"]):
                names[run_id] = name(parent["run_id"]) + run_id[len(parent["run_id"]) :]
        return names[run_id]

    for run_id in snap.runs:
        name(run_id)
    return names


RUN_ENDS = ("RUN_COMPLETED", "RUN_FAILED", "RUN_CANCELLED")


def chain_end(snap: Snapshot, run_id: str) -> tuple[str, tuple[Any, ...] | None]:
    """The last run of the ContinueAsNew chain ``run_id`` begins, and its end event (kind,
    data), if it has ended other than by continuing."""
    seen = {run_id}
    while True:
        status, result = snap.runs[run_id][1], snap.runs[run_id][2]
        if status != "CONTINUED":
            break
        run_id = json.loads(result)["continued_as"]
        assert run_id not in seen, f"the chain through {run_id} loops"
        seen.add(run_id)
    ends = [(e[1], e[4]) for e in snap.events.get(run_id, []) if e[1] in RUN_ENDS]
    return run_id, (ends[-1] if ends else None)


def assert_runs_linked(snap: Snapshot) -> None:
    """Child runs and ContinueAsNew chains, as the database links them, at whatever instant a
    process died (each link is made by one transaction, so none is ever half made):

    - a run whose RUN_STARTED names a parent step belongs to it: the parent's log started a
      ChildRun there, of this workflow and input and naming this run's id, or this run is the
      continuation of one that does (a chain keeps its parent); every ChildRun a log started
      has its child, and no parent step has two;
    - a child chain that has ended has its end recorded at its parent's step (the result as
      the child returned it, or a failure naming the child), and a parent's step has an outcome
      only once its child chain has ended;
    - a CONTINUED run's log ends with RUN_CONTINUED and its ContinueAsNew's completion, both
      naming the run it went on as, which exists, runs the same workflow with the input the
      step gave, and names it in turn; no run is continued twice, and a run that names one it
      continued names a CONTINUED one.
    """
    started = {run_id: run_started(snap, run_id) for run_id in snap.runs}
    continued_by: dict[str, str] = {}
    for run_id, data in started.items():
        before = data.get("continued_from")
        if before is None:
            continue
        assert before not in continued_by, (
            f"run {before} is continued by two runs: {continued_by[before]} and {run_id}"
        )
        continued_by[before] = run_id
        assert before in snap.runs, f"run {run_id} continues run {before}, which does not exist"
        assert snap.runs[before][1] == "CONTINUED", (
            f"run {run_id} continues run {before}, which is {snap.runs[before][1]}"
        )
        assert data["workflow"] == started[before].get("workflow"), (
            f"run {run_id} continues run {before} of another workflow"
        )
    for run_id, (_, status, result, _error, _wake) in snap.runs.items():
        rows = snap.events.get(run_id, [])
        steps = started_steps(snap, run_id, "continue")
        ended = [e for e in rows if e[1] == "RUN_CONTINUED"]
        if status != "CONTINUED":
            assert not ended, f"run {run_id} is {status} but its log holds RUN_CONTINUED"
            continue
        assert ended and rows[-1] == ended[-1], f"run {run_id} is CONTINUED; its log: {rows[-1]}"
        after = json.loads(result)["continued_as"]
        assert json.loads(ended[-1][4]) == {"run_id": after}, f"run {run_id}: {ended[-1]}"
        assert continued_by.get(run_id) == after, f"run {run_id} continued as {after}, which " + (
            "does not exist" if after not in snap.runs else "does not name it"
        )
        assert len(steps) == 1, f"run {run_id} is CONTINUED by {len(steps)} ContinueAsNew steps"
        [(position, canonical)] = steps.items()
        done = [e for e in snap.at_step(run_id, position) if e[1] == "STEP_COMPLETED"]
        assert done and json.loads(done[-1][4]) == {"run_id": after}, (
            f"run {run_id}'s ContinueAsNew at step {position} does not name {after}: {done}"
        )
        assert started[after]["input"] == canonical[1], (
            f"run {after} started with {started[after]['input']}, its ContinueAsNew gave "
            f"{canonical[1]}"
        )
    roots: dict[tuple[str, int], list[str]] = {}
    for run_id, data in started.items():
        parent = data.get("parent")
        if parent is None:
            continue
        where = (parent["run_id"], parent["step"])
        if "continued_from" in data:
            before = started[data["continued_from"]].get("parent")
            assert before == parent, f"run {run_id} names parent {parent}, its chain {before}"
            continue
        roots.setdefault(where, []).append(run_id)
    for parent_id in snap.runs:
        for step, canonical in started_steps(snap, parent_id, "child").items():
            _kind, workflow, child_input, explicit = canonical
            child = explicit if explicit is not None else f"{parent_id}-{step}"
            found = roots.pop((parent_id, step), [])
            assert found == [child], (
                f"run {parent_id} step {step} started child {child}; runs naming that step as "
                f"their parent: {found}"
            )
            assert started[child]["workflow"] == workflow, f"child {child}: {started[child]}"
            assert started[child]["input"] == child_input, f"child {child}: {started[child]}"
            last, end = chain_end(snap, child)
            outcomes = [
                e
                for e in snap.at_step(parent_id, step)
                if e[1] in ("STEP_COMPLETED", "STEP_FAILED")
            ]
            where = f"run {parent_id} step {step} (child {child}, ended by run {last})"
            if end is None:
                assert not outcomes, f"{where}: an outcome for a child not ended: {outcomes}"
                continue
            if snap.runs[parent_id][1] == "CANCELLED" and not outcomes:
                continue
            assert outcomes, f"{where}: the child ended ({end[0]}), the parent's log has no word"
            kind, data = outcomes[-1][1], outcomes[-1][4]
            if end[0] == "RUN_COMPLETED":
                assert (kind, data) == ("STEP_COMPLETED", end[1]), f"{where}: {kind} {data}"
            else:
                assert kind == "STEP_FAILED" and json.loads(data).get("child") == last, (
                    f"{where}: the child ended {end[0]}, the parent's log says {kind} {data}"
                )
    assert not roots, f"runs name parent steps that started no ChildRun: {roots}"


OUTCOMES = ("STEP_COMPLETED", "STEP_FAILED", "TIMER_FIRED", "CTX_RECORDED")
"""The events that end a step in a Snapshot, whose TOOL_COMPLETED rows are already expanded."""


def assert_steps_finish_once(snap: Snapshot, *, finished: bool) -> None:
    """Each step position has at most one outcome and nothing after it: a finished step is served
    from the log, never started again. In a ``finished`` database every step has its outcome."""
    for run_id, rows in snap.events.items():
        done: dict[int, int] = {}
        for seq, kind, step, _fp, _data, _at in rows:
            if step == 0:
                continue
            assert step not in done, (
                f"run {run_id} step {step} has {kind} at seq {seq} after its outcome at seq "
                f"{done[step]}"
            )
            if kind in OUTCOMES:
                done[step] = seq
        if finished:
            started = {row[2] for row in rows if row[2]}
            assert started == set(done), (
                f"run {run_id} finished but steps {sorted(started - set(done))} have no outcome"
            )


__all__ += [
    "RUN_ENDS",
    "Snapshot",
    "assert_log_and_effects_agree",
    "assert_parallels_in_order",
    "assert_runs_linked",
    "assert_signals_delivered_once",
    "assert_snapshot_gapless",
    "assert_snapshot_timers",
    "assert_steps_finish_once",
    "chain_end",
    "run_names",
    "run_started",
    "started_steps",
]


# -- copies of a database, and compacted logs ---------------------------------------------------


class Databases:
    """The fresh databases one test makes, on the backend it runs on: files under its
    ``tmp_path`` for SQLite, databases of their own on the server for PostgreSQL (dropped when
    the test ends). ``name`` tells a test's SQLite files apart; PostgreSQL names its own."""

    def __init__(self, backend: str, root: Path, server: pg_support.Databases) -> None:
        assert backend in BACKENDS, backend
        self.backend, self.root, self.server = backend, root, server

    def new(self, name: str = "durabl") -> Database:
        if self.backend == "postgres":
            return self.server.new()
        path = self.root / f"{name}.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        assert not path.exists(), f"{path} already exists"
        return path

    def copy(self, src: Database, name: str) -> Database:
        """A copy of ``src``, a database nobody is using (a backup taken between processes)."""
        if self.backend == "postgres":
            return self.server.copy(str(src))
        dst = self.root / f"{name}.db"
        copy_database(src, dst)
        return dst

    def backup(self, db: Database, name: str) -> Any:
        """A backup of ``db``, a database nobody is using, for ``restore``: a copy of the file
        for SQLite, every row of durabl's tables for PostgreSQL."""
        if self.backend == "postgres":
            return pg_support.backup_rows(str(db))
        return self.copy(db, name)

    def restore(self, db: Database, backup: Any) -> None:
        """Make ``db`` hold what it held when ``backup`` was taken, under the same name."""
        if self.backend == "postgres":
            pg_support.restore_rows(str(db), backup)
            return
        for leftover in ("", "-wal", "-shm"):
            Path(f"{db}{leftover}").unlink(missing_ok=True)
        copy_database(backup, db)


def copy_database(src: Path | str, dst: Path | str) -> None:
    """Copy a SQLite database whose every connection is closed, its ``-wal`` too if one is
    left: the copy is the same database, byte for byte, as a backup taken between processes
    would be."""
    src, dst = os.fspath(src), os.fspath(dst)
    assert not os.path.exists(dst), f"{dst} already exists"
    with open(src, "rb") as source, open(dst, "wb") as target:
        target.write(source.read())
    if os.path.exists(f"{src}-wal"):
        with open(f"{src}-wal", "rb") as source, open(f"{dst}-wal", "wb") as target:
            target.write(source.read())


def fork_world(world: World, root: Path) -> World:
    """A second world that has seen exactly what ``world`` has (its outbox, the keys whose flaky
    first attempt already failed), living under ``root``; its call counts start at zero."""
    twin = World(root)
    for record in world.outbox.records():
        twin.outbox.append(record)
    twin.flaky_failed = set(world.flaky_failed)
    twin.llm_failures_left = world.llm_failures_left
    return twin


def watermark(db: Path | str, run_id: str) -> int:
    """The seq a run's log is compacted up to (0: never compacted)."""
    return int(run_row(db, run_id)["watermark"])


def assert_gapless_after_watermark(db: Path | str) -> None:
    """Every run's seqs are exactly watermark+1..N: compaction removed a prefix, nothing else;
    a run compacted up to its last event has no rows and a snapshot."""
    by_run: dict[str, list[int]] = {}
    for row in event_rows(db):
        by_run.setdefault(row[0], []).append(row[1])
    for rid in run_ids(db):
        row = run_row(db, rid)
        mark, seqs = row["watermark"], by_run.get(rid, [])
        assert seqs == list(range(mark + 1, mark + 1 + len(seqs))), (
            f"run {rid} is compacted up to seq {mark} and has seqs {seqs}"
        )
        has_snapshot = snapshot_row(db, rid) is not None
        assert has_snapshot == (mark > 0), f"run {rid}: watermark {mark}"
        assert seqs or mark, f"run {rid} has no events and no snapshot"


__all__ += [
    "BACKENDS",
    "Database",
    "Databases",
    "ServerConnection",
    "assert_gapless_after_watermark",
    "copy_database",
    "fork_world",
    "refusal",
    "unguarded",
    "watermark",
]
