"""The SQLite store: one file, WAL mode, the log's invariants enforced by triggers.

Durability: every commit runs with ``synchronous=NORMAL`` (survives the death of the process:
the commit is in the WAL, which the OS holds) except commits marked ``durable`` under
``durability="full"``, which run with ``synchronous=FULL`` and so fsync the WAL before returning.
Because the WAL is one append-only file, that fsync also makes every earlier commit durable, so
the runtime pays one fsync per completed step and nothing for the bookkeeping before it.

Group commit: threads that commit at the same time share one transaction, and so one fsync.
Commits get in line; the first in line leads: it takes the connection and commits everything
in line behind it, each commit inside its own savepoint, so one commit's refusal does not undo
the others. The others wait on a gate of their own, each woken once: a committed one by the
one before it (one after another, so that they do not all contend for the GIL at once), the
new first in line by the leader, at once, to lead the next batch while the previous one's
threads go back to their steps. Under ``durability="full"`` the number of fsyncs then grows
with the number of batches, not with the number of runs.

The SQL is in ``schema`` (named statements, migrations), how a file is judged and opened in
``connection`` and ``files``, and what SQLite's errors mean in ``sqlite_errors``.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import itertools
import json
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from durabl import codec
from durabl.errors import (
    DurablError,
    EventChecksumError,
    LeaseLost,
    NoRunToCompactError,
    RunEndedError,
    RunExistsError,
    RunNotFoundError,
    SideEffectExistsError,
    SnapshotChecksumError,
    StoreClosedError,
)
from durabl.events import TERMINAL_STATUSES, Event
from durabl.store.base import (
    UNCHANGED,
    Commit,
    KeyClaim,
    Lease,
    RunRow,
    SideEffect,
    Signal,
    ToolResult,
)
from durabl.store.connection import open_database
from durabl.store.files import file_bytes
from durabl.store.records import (
    NO_LEASE,
    Statement,
    event_with_effect_insert,
    events_insert,
    parameters_of,
    run_row,
)
from durabl.store.schema import (
    APPLICATION_ID,
    MIGRATIONS,
    NUMBERED,
    PARAMETERS,
    SCHEMA_VERSION,
    Q,
)
from durabl.store.sqlite_errors import duplicate_key, storage_error

if TYPE_CHECKING:
    from durabl.store.turns import Turns

__all__ = ["APPLICATION_ID", "MIGRATIONS", "SCHEMA_VERSION", "Q", "SQLiteStore"]

DURABILITY_MODES = ("full", "process")

INSERT_BATCH = 500
"""Events per insert statement when a whole history is written at once (a fork): SQLite and
PostgreSQL both cap the parameters one statement binds."""

_Written = Statement | tuple[str, tuple[Any, ...]]
"""A statement with its named parameters, or with the sequence it binds, in order."""

_UNCOUNTED = frozenset(
    {"wake_on_signal", "insert_run", "note_parent", "carry_signals", "close_signals"}
)
"""Statements that may change no row in a commit whose fence held: they come after the run
row's update, whose count tells whether it did."""

_EFFECT_OWNER = {
    "insert_side_effect": ("run_id", "step"),
    "insert_event_with_effect": ("effect_run_id", "effect_step"),
    "insert_event_with_result": ("effect_run_id", "effect_step"),
}
"""Statements that record a side effect, and the parameters naming the effect's run and step:
a duplicate key in one is the effect's key taken. (The other insert of the two
``insert_event_with_*``, its event's, is refused by the log's gapless trigger before its own
key could be.)"""


def check_durability(durability: str) -> None:
    """ValueError unless ``durability`` is one every store knows."""
    if durability not in DURABILITY_MODES:
        raise ValueError(
            f"durability must be one of {', '.join(map(repr, DURABILITY_MODES))}, "
            f"got {durability!r}"
        )


class SQLiteStore:
    """A durabl database in one SQLite file. Thread-safe; one connection per store."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = "full",
        read_only: bool = False,
    ) -> None:
        check_durability(durability)
        self.path = os.fspath(path)
        self.durability = durability
        self.read_only = read_only
        self._lock = threading.RLock()
        self._queue: collections.deque[_Pending] = collections.deque()
        self._queue_lock = threading.Lock()
        self.commits = 0
        """Commits made through ``commit``, since the store opened."""
        self.transactions = 0
        """The transactions they took: fewer than ``commits`` when commits shared one."""
        self._sync_full = False
        self._closed = False
        self._conn = open_database(self.path, read_only=read_only)
        self._reading = _Reading(self)
        self._turns: Turns | None = None
        """Writers' turns across processes, under ``durability="full"`` (see ``turns``)."""
        if durability == "full" and not read_only:
            from durabl.store.turns import Turns  # fcntl, loaded only by the stores that use it

            self._turns = Turns(self.path)

    # -- transactions ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, durable: bool) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; rolled back on any BaseException, a simulated death too."""
        with self._lock:
            conn = self._live()
            turns = self._turns
            if turns is not None:
                turns.take()
            try:
                try:
                    self._set_sync(conn, durable)
                    conn.execute("BEGIN IMMEDIATE")
                except sqlite3.Error as exc:
                    raise storage_error(self.path, exc) from None
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException as exc:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    if isinstance(exc, sqlite3.Error):
                        raise storage_error(self.path, exc) from None
                    raise
            finally:
                if turns is not None:
                    turns.give()

    def _set_sync(self, conn: sqlite3.Connection, durable: bool) -> None:
        """fsync on commit only when this commit must survive power loss."""
        want_full = durable and self.durability == "full"
        if want_full != self._sync_full:
            conn.execute(
                "PRAGMA synchronous = FULL" if want_full else "PRAGMA synchronous = NORMAL"
            )
            self._sync_full = want_full

    def _read(self) -> _Reading:
        """The connection, for reads, under the store's lock (see ``_Reading``)."""
        return self._reading

    @contextlib.contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: every read made through the connection sees one state of the
        file, whatever other processes commit meanwhile. For this store and its own tools
        (``doctor``); rows come back as ``sqlite3.Row``."""
        with self._read() as conn:
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                conn.execute("COMMIT")

    def _live(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreClosedError(path=self.path)
        return self._conn

    # -- the Store interface ---------------------------------------------------------------

    def create_run(self, row: RunRow, first: Event, history: Sequence[Event] = ()) -> RunRow | None:
        with self._write(durable=True) as conn:
            existing = conn.execute(Q["get_run"], {"run_id": row.run_id}).fetchone()
            if existing is not None:
                return run_row(existing)
            token = None if row.lease is None else 1
            lease = NO_LEASE if row.lease is None else parameters_of(row.lease)
            self._execute(conn, ("insert_run", parameters_of(row, **lease, lease_token=token or 0)))
            appended = [first, *history]
            for start in range(0, len(appended), INSERT_BATCH):  # a statement binds so many
                batch = appended[start : start + INSERT_BATCH]
                self._execute(conn, events_insert(row.run_id, batch, token))
        return None

    def get_run(self, run_id: str) -> RunRow | None:
        with self._read() as conn:
            found = conn.execute(Q["get_run"], {"run_id": run_id}).fetchone()
        return None if found is None else run_row(found)

    def list_runs(
        self,
        statuses: tuple[str, ...] | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> list[RunRow]:
        wanted = {"workflow": workflow, "limit": -1 if limit is None else limit}
        query = Q["list_runs"]
        if statuses is not None:
            wanted["statuses"] = json.dumps(list(statuses))
            query = Q["list_runs_by_status"]
        with self._read() as conn:
            return [run_row(r) for r in conn.execute(query, wanted).fetchall()]

    def load_log(self, run_id: str, after_seq: int = 0) -> list[Event]:
        with self._read() as conn:
            rows = _log_rows(conn, {"run_id": run_id, "after_seq": after_seq})
        return self._verified(run_id, rows)

    def last_step(self, run_id: str) -> int:
        """The position of the run's newest step event (0 if none is left in the log): how
        many steps it has reached, read from the end of the log, so its cost does not grow
        with the log."""
        with self._read() as conn:
            found = conn.execute(Q["last_step"], {"run_id": run_id}).fetchone()
        return int(found[0]) if found else 0

    def _verified(self, run_id: str, rows: list[tuple[Any, ...]]) -> list[Event]:
        # ``load_log`` selects an event's columns in the order of its fields, then the crc: an
        # Event is made from the row's first six columns without NamedTuple's keyword handling,
        # because this runs once for every event replayed.
        bad = codec.first_corrupt(rows)
        if bad is not None:
            raise EventChecksumError(path=self.path, run_id=run_id, seq=bad)
        make = tuple.__new__
        return [make(Event, row[:6]) for row in rows]

    def commit(self, commit: Commit) -> None:
        if _only_a_result(commit):
            changed = self._apply([_result_statement(commit)], commit.durable)
        else:
            changed = self._apply(self._statements(commit), commit.durable)
        if commit.fence is not None and not commit.events and changed == 0:
            raise LeaseLost(run_id=commit.run_id, token=commit.fence)

    def commit_tool_result(self, result: ToolResult) -> None:
        run_id, fence, event, key, tool, result_text, effect_at_s = result
        _, _, step, fp, _, _ = event
        statement = _event_with_result(
            run_id, fence, event, key, run_id, step, tool, fp, result_text, effect_at_s
        )
        self._apply([statement], True)

    def _statements(self, commit: Commit) -> list[_Written]:
        """What ``commit`` writes, in order; the run row's update comes last, so that its
        changed-row count tells whether the fence held."""
        run_id, fence = commit.run_id, commit.fence
        statements: list[_Written] = []
        if len(commit.events) == 1 and commit.side_effect is not None:
            # A finished tool call's commit that ``_only_a_result`` does not take (a failed
            # effect, or more to write with it): still one statement for the two rows.
            statements.append(
                event_with_effect_insert(run_id, commit.events[0], fence, commit.side_effect)
            )
        else:
            if commit.events:
                statements.append(events_insert(run_id, commit.events, fence))
            if commit.side_effect is not None:
                statements.append(("insert_side_effect", parameters_of(commit.side_effect)))
        if commit.claim is not None:
            statements.append(("upsert_claim", parameters_of(commit.claim, at_s=commit.at_s)))
        if commit.release_claim is not None:
            statements.append(("delete_claim", {"idempotency_key": commit.release_claim}))
        if commit.deliver_signal is not None:
            step = commit.events[-1].step if commit.events else 0
            delivering = {"run_id": run_id, "id": commit.deliver_signal, "step": step}
            statements.append(("deliver_signal", delivering))
        if commit.new_run is not None:
            row, first = commit.new_run
            token = None if row.lease is None else 1
            lease = NO_LEASE if row.lease is None else parameters_of(row.lease)
            statements.append(("insert_run", parameters_of(row, **lease, lease_token=token or 0)))
            statements.append(events_insert(row.run_id, [first], token))
        if commit.carry_signals is not None:
            step = max((e.step for e in commit.events), default=0)
            carrying = {"run_id": run_id, "to_run": commit.carry_signals, "step": step}
            statements.append(("carry_signals", carrying))
            statements.append(("close_signals", carrying))
        if commit.parent_note is not None:
            statements.append(("note_parent", parameters_of(commit.parent_note, at_s=commit.at_s)))
        set_wake = commit.wake_at_s != UNCHANGED
        if (
            commit.status is not None
            or commit.result_text is not None
            or commit.error is not None
            or commit.clear_error
            or set_wake
            or (commit.fence is not None and not commit.events)
        ):
            update = parameters_of(
                commit,
                set_wake=set_wake,
                wake_at_s=commit.wake_at_s if set_wake else None,
                updated_s=commit.at_s,
            )
            statements.append(("update_run", update))
        if commit.wake_on_signal is not None:
            # After the row's update, whose changed-row count the fence check reads: the
            # commit of a parked wait always writes events or a status, so it is not fenced by
            # that count.
            waking = {"run_id": run_id, "name": commit.wake_on_signal, "at_s": commit.at_s}
            statements.append(("wake_on_signal", waking))
        return statements

    def _apply(self, statements: list[_Written], durable: bool) -> int:
        """Execute ``statements`` atomically, in one batch with whatever other threads are
        committing (see the module docstring); returns the rows the last one changed."""
        if self._lock.acquire(blocking=False):
            try:
                if not self._queue:  # nobody else is committing: no line to join or lead
                    return self._commit_alone(statements, durable)
            finally:
                self._lock.release()
        mine = _Pending(statements, durable)
        with self._queue_lock:
            if self._queue:  # another commit is in line: wait to be committed, or to lead
                mine.gate = threading.Lock()
                mine.gate.acquire()
            self._queue.append(mine)
        interrupted = None if mine.gate is None else mine.wait()
        if mine.done:  # committed by the leader of its batch
            if mine.then is not None:
                mine.then.wake()
        else:  # first in line: it leads
            try:
                with self._lock:
                    with self._queue_lock:
                        batch = list(self._queue)  # ``mine`` first: the leader is first in line
                    if len(batch) == 1:
                        mine.changed = self._commit_alone(statements, durable)
                    else:
                        self._commit_batch(batch)
            finally:
                self._hand_over(mine)
        if interrupted is not None:
            raise interrupted
        if mine.error is not None:
            raise mine.error
        return mine.changed

    def _hand_over(self, leader: _Pending) -> None:
        """Take ``leader`` and the commits its batch settled out of the line, wake their
        threads, and wake the first one left, which leads the next batch. A commit its batch
        did not settle (the leader's thread died mid-batch) stays in line, to be committed
        again."""
        settled = []
        with self._queue_lock:
            queue = self._queue
            queue.popleft()
            while queue and queue[0].done:
                settled.append(queue.popleft())
            first = queue[0] if queue else None
        if first is not None:
            first.wake()
        if settled:
            for pending, after in itertools.pairwise(settled):
                pending.then = after
            settled[0].wake()

    def _commit_alone(self, statements: list[_Written], durable: bool) -> int:
        """``_commit_batch`` of one commit, without the batch's bookkeeping: the common case
        of one thread committing. Called with the connection lock held."""
        conn = self._live()
        changed = 0
        turns = self._turns
        if turns is not None:
            turns.take()
        try:
            self._set_sync(conn, durable)
            if len(statements) == 1:  # its own transaction in autocommit mode
                changed = self._execute(conn, statements[0])
            else:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for statement in statements:
                        changed = self._counted(conn, statement, changed)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
        except sqlite3.Error as exc:
            raise storage_error(self.path, exc) from None
        finally:
            if turns is not None:
                turns.give()
        self.commits += 1
        self.transactions += 1
        return changed

    def _commit_batch(self, batch: list[_Pending]) -> None:
        """Commit ``batch`` in one transaction, each commit's answer (or refusal) recorded on
        it. Called with the connection lock held."""
        conn = self._live()
        turns = self._turns
        if turns is not None:
            turns.take()
        try:
            self._set_sync(conn, any(p.durable for p in batch))
            self._commit_together(conn, batch)
        except sqlite3.Error as exc:  # the transaction did not commit: every commit's answer
            error = storage_error(self.path, exc)
            for pending in batch:
                pending.fail(error)
            raise error from None
        finally:
            if turns is not None:
                turns.give()
        self.commits += len(batch)
        self.transactions += 1

    def _commit_together(self, conn: sqlite3.Connection, batch: list[_Pending]) -> None:
        """Each commit of ``batch`` in a savepoint of its own, then one COMMIT for them all."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            for pending in batch:
                self._settle(conn, pending)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            for pending in batch:  # none of it happened: each is to be committed again
                pending.done, pending.error, pending.changed = False, None, 0
            raise
        for pending in batch:
            pending.done = True

    def _settle(self, conn: sqlite3.Connection, pending: _Pending) -> None:
        """Run one commit's statements; a refusal is its own answer and undoes only it."""
        conn.execute("SAVEPOINT one_commit")
        try:
            for statement in pending.statements:
                pending.changed = self._counted(conn, statement, pending.changed)
        except DurablError as refused:
            conn.execute("ROLLBACK TO one_commit")
            conn.execute("RELEASE one_commit")
            pending.fail(refused)
            return
        conn.execute("RELEASE one_commit")

    def _counted(self, conn: sqlite3.Connection, statement: _Written, changed: int) -> int:
        """Execute ``statement``; the rows it changed, which the fence check reads, unless it
        is one whose count means nothing to that check (``_UNCOUNTED``): then ``changed``."""
        found = self._execute(conn, statement)
        return changed if statement[0] in _UNCOUNTED else found

    def _execute(self, conn: sqlite3.Connection, statement: _Written) -> int:
        name, params = statement
        if isinstance(params, tuple):  # bound in order already (``_result_statement``)
            return self._run(conn, statement, NUMBERED[name][0], params)
        if name == "note_parent":
            return self._note_parent(conn, params)
        if name == "insert_events":
            sql, values = _insert_events_sql(params["rows"]), params["values"]
        else:
            sql, bind = NUMBERED[name]
            values = bind(params)
        changed = self._run(conn, statement, sql, values)
        if name == "update_run" and changed == 0 and params.get("fence") is not None:
            # Refused inside the transaction, so that nothing else of the commit lands: a
            # commit that appends events is refused by the append trigger instead.
            raise LeaseLost(run_id=params["run_id"], token=params["fence"])
        return changed

    def _run(
        self, conn: sqlite3.Connection, statement: _Written, sql: str, values: Sequence[Any]
    ) -> int:
        try:
            return conn.execute(sql, values).rowcount
        except sqlite3.IntegrityError as exc:
            raise self._refused(statement, exc) from None

    def _note_parent(self, conn: sqlite3.Connection, params: dict[str, Any]) -> int:
        """Append a child's outcome at the end of its parent's log and make the parent due;
        nothing if the parent has ended (its log is closed) or is gone."""
        sql, bind = NUMBERED["parent_end"]
        found = conn.execute(sql, bind(params)).fetchone()
        if found is None or found[0] in TERMINAL_STATUSES:
            return 0
        note = Event(
            found[1] + 1, params["kind"], params["step"], None, params["data"], params["at_s"]
        )
        self._execute(conn, events_insert(params["run_id"], [note], None))
        return self._execute(conn, ("wake_parent", params))

    def _refused(self, statement: _Written, exc: sqlite3.IntegrityError) -> DurablError:
        """What a constraint's refusal of ``statement`` means: a second side effect for one
        key is told by which statement failed and how, never by the error's words."""
        name, given = statement
        params = (
            dict(zip(PARAMETERS[name], given, strict=True)) if isinstance(given, tuple) else given
        )
        if name == "insert_run" and duplicate_key(exc):
            return RunExistsError(path=self.path, run_id=params["run_id"])
        if name in _EFFECT_OWNER and duplicate_key(exc):
            run_key, step_key = _EFFECT_OWNER[name]
            key, run_id, step = params["idempotency_key"], params[run_key], params[step_key]
            return SideEffectExistsError(path=self.path, key=key, run_id=run_id, step=step)
        return storage_error(self.path, exc)

    def take_lease(self, run_id: str, seen_token: int, lease: Lease) -> int | None:
        taking = parameters_of(lease, run_id=run_id, lease_token=seen_token)
        changed = self._apply([("take_lease", taking)], durable=False)
        return seen_token + 1 if changed == 1 else None

    def renew_lease(self, run_id: str, token: int, owner: str, expires_s: float) -> bool:
        renewal = {
            "run_id": run_id,
            "lease_token": token,
            "lease_owner": owner,
            "lease_expires_s": expires_s,
        }
        return self._apply([("renew_lease", renewal)], durable=False) == 1

    def release_lease(self, run_id: str, token: int) -> None:
        self._apply([("release_lease", {"run_id": run_id, "lease_token": token})], durable=False)

    def send_signal(self, run_id: str, name: str, payload_text: str, sent_s: float) -> int:
        sending = {"run_id": run_id, "name": name, "payload": payload_text, "sent_s": sent_s}
        with self._write(durable=True) as conn:
            found = conn.execute(Q["signal_target"], sending).fetchone()
            check_signal_target(self.path, run_id, found)
            signal_id = int(conn.execute(Q["insert_signal"], sending).fetchone()[0])
            conn.execute(Q["wake_waiting"], sending)
        return signal_id

    def pending_signal(self, run_id: str, name: str) -> Signal | None:
        with self._read() as conn:
            found = conn.execute(Q["pending_signal"], {"run_id": run_id, "name": name}).fetchone()
        if found is None:
            return None
        return Signal(id=found[0], name=name, payload_text=found[1], sent_s=found[2])

    def signals(self, run_id: str) -> list[Signal]:
        with self._read() as conn:
            rows = conn.execute(Q["list_signals"], {"run_id": run_id}).fetchall()
        return [_signal(row) for row in rows]

    def side_effect(self, key: str) -> SideEffect | None:
        with self._read() as conn:
            found = conn.execute(Q["get_side_effect"], {"idempotency_key": key}).fetchone()
        return None if found is None else SideEffect(**found)

    def key_claim(self, key: str) -> KeyClaim | None:
        with self._read() as conn:
            found = conn.execute(Q["get_claim"], {"idempotency_key": key}).fetchone()
        return None if found is None else KeyClaim(**found)

    def due_runs(self, now_s: float) -> list[str]:
        with self._read() as conn:
            return [r["run_id"] for r in conn.execute(Q["due_runs"], {"now_s": now_s})]

    def next_wake_s(self) -> float | None:
        with self._read() as conn:
            value = conn.execute(Q["next_wake"]).fetchone()[0]
        return None if value is None else float(value)

    def compact(self, run_id: str, watermark: int, snapshot: str, fence: int) -> int:
        folding = {
            "run_id": run_id,
            "watermark": watermark,
            "body": snapshot,
            "crc": codec.snapshot_checksum(watermark, snapshot),
        }
        with self._write(durable=True) as conn:
            found = conn.execute(Q["compact_check"], folding).fetchone()
            if found is None:
                raise NoRunToCompactError(path=self.path, run_id=run_id)
            if found["lease_token"] != fence:
                raise LeaseLost(run_id=run_id, token=fence)
            old_mark, last_seq = found["watermark"], found["last_seq"]
            if not old_mark < watermark <= (last_seq or 0):
                raise ValueError(
                    f"run {run_id}: cannot fold up to seq {watermark}: the log holds seqs "
                    f"{old_mark + 1}..{last_seq or old_mark}"
                )
            conn.execute(Q["set_watermark"], folding)
            conn.execute(Q["set_snapshot"], folding)
            return conn.execute(Q["delete_folded"], folding).rowcount

    def load_history(self, run_id: str) -> tuple[int, str | None, list[Event]]:
        whose = {"run_id": run_id, "after_seq": 0}
        with self._read() as conn:  # one statement sees one state of the file
            rows = _log_rows(conn, whose)
        if rows and rows[0][0] == 1:
            return 0, None, self._verified(run_id, rows)  # never compacted: see Store
        with self.reading() as conn:  # read again: a compaction cannot tear the two reads
            rows = _log_rows(conn, whose)
            found = conn.execute(Q["get_snapshot"], whose).fetchone()
        if found is None:
            return 0, None, []
        watermark, text = found["watermark"], found["body"]
        if text is not None and codec.snapshot_checksum(watermark, text) != found["crc"]:
            raise SnapshotChecksumError(path=self.path, run_id=run_id, watermark=watermark)
        return watermark, text, self._verified(run_id, rows)

    def reclaim(self) -> tuple[int, int]:
        with self._lock:
            conn = self._live()
            try:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # sizes like for like
                before = file_bytes(self.path)
                if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # incremental
                    # Frees one page per step of the statement: executescript steps it to the
                    # end, where execute() would stop after the first page.
                    conn.executescript("PRAGMA incremental_vacuum;")
                else:
                    # A file created without auto_vacuum: rewrite it, and switch incremental
                    # vacuum on in the rewrite so that the next reclaim is not another one.
                    conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
                    conn.execute("VACUUM")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            except sqlite3.Error as exc:
                raise storage_error(self.path, exc) from None
            return before, file_bytes(self.path)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._turns is not None:
                    self._turns.close()
                self._conn.close()


def _log_rows(conn: sqlite3.Connection, whose: dict[str, Any]) -> list[tuple[Any, ...]]:
    """``load_log``'s rows as plain tuples, not ``sqlite3.Row``: cheaper to build, and
    ``SQLiteStore._verified`` unpacks them by position."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return cursor.execute(Q["load_log"], whose).fetchall()


@functools.lru_cache(maxsize=16)
def _insert_events_sql(rows: int) -> str:
    """``insert_event`` for ``rows`` events in one statement: SQLite inserts the rows of a
    multi-row VALUES in order, and the log's triggers check each against the ones before it."""
    one = NUMBERED["insert_event"][0]
    head, _, _ = one.partition("VALUES")
    row = "(" + ", ".join("?" * one.count("?")) + ")"
    return f"{head}VALUES {', '.join([row] * rows)}"


def _signal(row: tuple[Any, ...]) -> Signal:
    signal_id, name, payload, sent_s, delivered = row
    return Signal(
        id=signal_id, name=name, payload_text=payload, sent_s=sent_s, delivered_step=delivered
    )


def check_signal_target(path: str, run_id: str, found: Any) -> None:
    """A signal goes to a run that exists and has not ended."""
    if found is None:
        raise RunNotFoundError(run_id=run_id, path=path)
    status = found[0]
    if status in TERMINAL_STATUSES:
        raise RunEndedError(run_id=run_id, status=status)


_RESULT_PARAMETERS = (
    "run_id", "seq", "kind", "step", "fp", "data", "at_s", "crc", "fence",
    "idempotency_key", "effect_run_id", "effect_step", "tool", "args_fp", "result",
    "effect_at_s",
)  # fmt: skip
if PARAMETERS["insert_event_with_result"] != _RESULT_PARAMETERS:
    raise AssertionError("insert_event_with_result binds other parameters than _result_statement")


def _only_a_result(c: Commit) -> bool:
    """A tool call's finished attempt and nothing else: one event and its side effect, which
    succeeded. The commit of nearly every step, and one statement."""
    effect = c.side_effect
    return (
        effect is not None
        and effect.error is None
        and len(c.events) == 1
        and c.wake_at_s == UNCHANGED
        and c.status is None
        and c.result_text is None
        and c.error is None
        and not c.clear_error
        and c.claim is None
        and c.release_claim is None
        and c.deliver_signal is None
        and c.new_run is None
        and c.carry_signals is None
        and c.parent_note is None
        and c.wake_on_signal is None
    )


def _result_statement(c: Commit) -> _Written:
    """``insert_event_with_result`` for a commit ``_only_a_result`` accepts, its parameters
    bound in order: the same statement ``_statements`` makes, without a mapping built on every
    step to be taken apart again."""
    e = c.side_effect
    assert e is not None
    return _event_with_result(
        c.run_id, c.fence, c.events[0], e.key, e.run_id, e.step, e.tool, e.args_fp,
        e.result_text, e.at_s,
    )  # fmt: skip


def _event_with_result(
    run_id: str,
    fence: int | None,
    event: Event,
    key: str,
    effect_run_id: str,
    effect_step: int,
    tool: str,
    args_fp: str | None,
    result_text: str | None,
    effect_at_s: float,
) -> _Written:
    """``insert_event_with_result``'s parameters, in order, with the event's checksum."""
    seq, kind, step, fp, data, at_s = event
    crc = codec.checksum(seq, kind, step, fp, data, at_s)
    return "insert_event_with_result", (
        run_id, seq, kind, step, fp, data, at_s, crc, fence,
        key, effect_run_id, effect_step, tool, args_fp, result_text, effect_at_s,
    )  # fmt: skip


class _Reading:
    """``with store._read() as conn``: the store's connection, its lock held for the block; a
    SQLite error in the block is raised as the store's ``StorageError``. A class, not a
    generator-based context manager, which costs a generator and its frame at every read: a
    resumed run's first read of its row paid 16 µs for it, a fifth of that read."""

    __slots__ = ("_store",)

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def __enter__(self) -> sqlite3.Connection:
        store = self._store
        store._lock.acquire()
        try:
            return store._live()
        except BaseException:
            store._lock.release()
            raise

    def __exit__(self, kind: object, exc: BaseException | None, traceback: object) -> None:
        self._store._lock.release()
        if isinstance(exc, sqlite3.Error):
            raise storage_error(self._store.path, exc) from None


class _Pending:
    """One commit in line for its batch: its statements, and once done, its answer. A commit
    that found others in line waits on its ``gate``, released once: when it is done, or when it
    is first in line and so leads the next batch."""

    __slots__ = ("changed", "done", "durable", "error", "gate", "statements", "then")

    def __init__(self, statements: list[_Written], durable: bool) -> None:
        self.statements = statements
        self.durable = durable
        self.done = False
        self.changed = 0
        self.error: BaseException | None = None
        self.gate: threading.Lock | None = None
        self.then: _Pending | None = None

    def fail(self, error: BaseException) -> None:
        self.error, self.done = error, True

    def wait(self) -> BaseException | None:
        """Wait for the gate. An exception raised in the thread meanwhile (a KeyboardInterrupt)
        is returned, to be raised once the commit is done or led: the commits behind this one
        wait for it to lead, or to wake them."""
        assert self.gate is not None
        interrupted = None
        while True:
            try:
                self.gate.acquire()
                return interrupted
            except BaseException as exc:
                interrupted = exc

    def wake(self) -> None:
        if self.gate is not None:
            self.gate.release()
