"""The PostgreSQL store: the same ``Store`` on a server that workers on several hosts share.

Imported only when a ``postgresql://`` URL is opened (``store.open_store``): psycopg 3 and
psycopg-pool are an optional extra, ``durabl[postgres]``.

The tables live in the database's ``durabl`` schema, beside whatever else the database holds,
and the log's rules are the database's own, as on SQLite: a trigger locks the run's row, then
refuses an event that does not extend the log by exactly one or carries a stale lease token;
others refuse any update of the log or of a side effect. Each refusal has its own SQLSTATE
(``DB001``..``DB004``), which is how the store tells them apart.

Durability: under "full", a commit marked durable waits for the server's WAL flush
(``synchronous_commit = on``); bookkeeping commits do not (``SET LOCAL synchronous_commit TO
off``), and a later flush covers them, as on SQLite. Under "process", no commit waits: a crash
of the server can lose the last moments of commits, never tear one.

A lost connection, a COMMIT that went unanswered, a server restarted: ``durabl.store.pg_server``.
A write whose COMMIT was not answered is looked for before it is tried again: a commit of events
is found by its run and seqs and compared by checksum, a lease taken by its token and owner, a
run created by its owner and start time; the other writes set values outright, and doing them
twice is doing them once. For a while after the server starts, a lease's holder that has no
session on it is not taken for dead: the restart ended every session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.rows import dict_row

from durabl import codec
from durabl.errors import (
    EventChecksumError,
    ForeignSchemaError,
    LeaseLost,
    NoRunToCompactError,
    OlderSchemaError,
    PostgresError,
    RunExistsError,
    SchemaVersionError,
    SideEffectExistsError,
    SnapshotChecksumError,
    StoreClosedError,
    UninitialisedError,
)
from durabl.events import TERMINAL_STATUSES, Event
from durabl.store.base import (
    UNCHANGED,
    Commit,
    KeyClaim,
    Lease,
    ParentNote,
    RunRow,
    SideEffect,
    Signal,
    ToolResult,
)
from durabl.store.pg_server import (
    POOL_SIZE,
    PQ,
    RECONNECT_S,
    Server,
    server_name,
    session_name,
)
from durabl.store.records import NO_LEASE, parameters_of, run_row
from durabl.store.schema import load_migrations
from durabl.store.sqlite import INSERT_BATCH

__all__ = ["MIGRATIONS", "PQ", "SCHEMA_VERSION", "PostgresStore", "server_name", "session_name"]

logger = logging.getLogger("durabl.store")

MIGRATIONS = load_migrations("postgres")
SCHEMA_VERSION = MIGRATIONS[-1][0]
DURABL_TABLES = ("events", "key_claims", "meta", "runs", "side_effects", "signals", "snapshots")

MIGRATION_LOCK = 0x64726231
"""The advisory lock that keeps two processes opening a new database from migrating it twice."""

RESTART_GRACE_S = 15.0
"""For this long after the server starts, a lease's holder with no session on the server is not
taken for dead, and its runs wait for the lease to expire: a restart ends every session, and a
live holder opens one again at its next write, a lease renewal at the latest, which comes at
least every ``durabl.leases.RENEW_MAX_S``."""

TAKEOVER_WAIT_MS = 2000
"""How long taking a lease waits for the run's row before it counts as held elsewhere."""


class PostgresStore(Server):
    """A durabl database on a PostgreSQL server. Thread-safe: a pool of connections."""

    def __init__(
        self,
        url: str,
        *,
        durability: str = "full",
        read_only: bool = False,
        reconnect_s: float = RECONNECT_S,
        pool_size: int = POOL_SIZE,
    ) -> None:
        super().__init__(
            url,
            durability=durability,
            read_only=read_only,
            reconnect_s=reconnect_s,
            pool_size=pool_size,
            prepare=self._prepare,
        )

    def _prepare(self, conn: psycopg.Connection[Any]) -> None:
        """Check what the database holds; create or migrate durabl's schema (not read-only)."""
        try:
            version = self._version(conn)
            if version == SCHEMA_VERSION:
                return
            if version is not None and version > SCHEMA_VERSION:
                raise SchemaVersionError(path=self.path, found=version, supported=SCHEMA_VERSION)
            if self.read_only and version is not None:
                raise OlderSchemaError(path=self.path, found=version, supported=SCHEMA_VERSION)
            if self.read_only:
                raise UninitialisedError(path=self.path)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
                version = self._version(conn)  # another process may have migrated meanwhile
                if version is None:
                    conn.execute("CREATE SCHEMA IF NOT EXISTS durabl")
                for number, script in MIGRATIONS:
                    if number > (version or 0):
                        conn.execute(script.encode())
                        conn.execute(
                            "INSERT INTO durabl.meta (application, schema_version) "
                            "VALUES ('durabl', %s) ON CONFLICT (application) "
                            "DO UPDATE SET schema_version = EXCLUDED.schema_version, "
                            "migrated_at = now()",
                            (number,),
                        )
        except psycopg.Error as exc:
            raise self._error(exc) from None

    def _version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The durabl schema version the database holds, or None if it holds none; raises if
        its ``durabl`` schema holds another application's tables."""
        has_schema, tables = conn.execute(PQ["identity"]).fetchone() or (0, [])
        if not has_schema or not tables:
            return None
        foreign = [t for t in tables if t not in DURABL_TABLES]
        if foreign or "meta" not in tables:
            raise ForeignSchemaError(path=self.path, tables=foreign or list(tables))
        found = conn.execute(PQ["schema_version"]).fetchone()
        if found is None:
            raise ForeignSchemaError(path=self.path, tables=list(tables))
        return int(found[0])

    # -- the Store interface ---------------------------------------------------------------

    def create_run(self, row: RunRow, first: Event, history: Sequence[Event] = ()) -> RunRow | None:
        token = None if row.lease is None else 1
        lease = NO_LEASE if row.lease is None else parameters_of(row.lease)

        def work(conn: psycopg.Connection[Any]) -> RunRow | None:
            params = parameters_of(row, **lease, lease_token=token or 0)
            if conn.execute(PQ["insert_run"], params).rowcount == 0:
                return self._get_run(conn, row.run_id)
            appended = [first, *history]
            for start in range(0, len(appended), INSERT_BATCH):
                self._insert_events(conn, row.run_id, appended[start : start + INSERT_BATCH], token)
            return None

        def landed(conn: psycopg.Connection[Any]) -> tuple[bool, RunRow | None]:
            found = self._get_run(conn, row.run_id)
            if found is None:
                return False, None
            ours = (
                found.created_s == row.created_s
                and found.input_text == row.input_text
                and (found.lease.owner if found.lease else None)
                == (row.lease.owner if row.lease else None)
            )
            return True, None if ours else found

        return self._do(work, write=True, durable=True, landed=landed)

    def _get_run(self, conn: psycopg.Connection[Any], run_id: str) -> RunRow | None:
        one = conn.execute(PQ["get_run"], {"run_id": run_id}).fetchone()
        return None if one is None else run_row(one)

    def get_run(self, run_id: str) -> RunRow | None:
        return self._do(lambda conn: self._get_run(conn, run_id))

    def list_runs(
        self,
        statuses: tuple[str, ...] | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> list[RunRow]:
        wanted: dict[str, Any] = {"workflow": workflow, "limit": limit}
        query = PQ["list_runs"]
        if statuses is not None:
            wanted["statuses"] = list(statuses)
            query = PQ["list_runs_by_status"]

        def work(conn: psycopg.Connection[Any]) -> list[RunRow]:
            return [run_row(r) for r in conn.execute(query, wanted).fetchall()]

        return self._do(work)

    def load_log(self, run_id: str, after_seq: int = 0) -> list[Event]:
        whose = {"run_id": run_id, "after_seq": after_seq}
        rows = self._do(lambda conn: conn.execute(PQ["load_log"], whose).fetchall())
        return self._verified(run_id, rows)

    def last_step(self, run_id: str) -> int:
        found = self._do(lambda conn: conn.execute(PQ["last_step"], {"run_id": run_id}).fetchone())
        return int(found[0]) if found else 0

    def _verified(self, run_id: str, rows: list[tuple[Any, ...]]) -> list[Event]:
        bad = codec.first_corrupt(rows)
        if bad is not None:
            raise EventChecksumError(path=self.path, run_id=run_id, seq=bad)
        return [
            Event(seq, kind, step, fp, data, at_s) for seq, kind, step, fp, data, at_s, _ in rows
        ]

    def _insert_events(
        self, conn: psycopg.Connection[Any], run_id: str, appended: list[Event], fence: int | None
    ) -> None:
        values: list[Any] = []
        for seq, kind, step, fp, data, at_s in appended:
            crc = codec.checksum(seq, kind, step, fp, data, at_s)
            values += (run_id, seq, kind, step, fp, data, at_s, crc, fence)
        row = "(%s, %s, %s, %s, %s, %s, %s, %s, %s)"
        conn.execute(PQ["insert_events_head"] + ", ".join([row] * len(appended)), values)

    def _insert_new_run(self, conn: psycopg.Connection[Any], row: RunRow, first: Event) -> None:
        """A run created by a commit (a child, the next of a chain): refused if it exists."""
        token = None if row.lease is None else 1
        lease = NO_LEASE if row.lease is None else parameters_of(row.lease)
        params = parameters_of(row, **lease, lease_token=token or 0)
        if conn.execute(PQ["insert_run"], params).rowcount == 0:
            raise RunExistsError(path=self.path, run_id=row.run_id)
        self._insert_events(conn, row.run_id, [first], token)

    def _note_parent(self, conn: psycopg.Connection[Any], note: ParentNote, at_s: float) -> None:
        """A child's outcome at the end of its parent's log, and the parent due; nothing if
        the parent has ended or is gone."""
        found = conn.execute(PQ["parent_end"], {"run_id": note.run_id}).fetchone()
        if found is None or found[0] in TERMINAL_STATUSES:
            return
        event = Event(found[1] + 1, note.kind, note.step, None, note.data, at_s)
        self._insert_events(conn, note.run_id, [event], None)
        conn.execute(PQ["wake_parent"], {"run_id": note.run_id, "at_s": at_s})

    def commit(self, commit: Commit) -> None:
        run_id, fence = commit.run_id, commit.fence

        def work(conn: psycopg.Connection[Any]) -> None:
            if commit.events:
                self._insert_events(conn, run_id, commit.events, fence)
            if commit.side_effect is not None:
                conn.execute(PQ["insert_side_effect"], parameters_of(commit.side_effect))
            if commit.claim is not None:
                conn.execute(PQ["upsert_claim"], parameters_of(commit.claim, at_s=commit.at_s))
            if commit.release_claim is not None:
                conn.execute(PQ["delete_claim"], {"idempotency_key": commit.release_claim})
            if commit.deliver_signal is not None:
                step = commit.events[-1].step if commit.events else 0
                delivering = {"run_id": run_id, "id": commit.deliver_signal, "step": step}
                conn.execute(PQ["deliver_signal"], delivering)
            if commit.new_run is not None:
                self._insert_new_run(conn, *commit.new_run)
            if commit.carry_signals is not None:
                step = max((e.step for e in commit.events), default=0)
                carrying = {"run_id": run_id, "to_run": commit.carry_signals, "step": step}
                conn.execute(PQ["carry_signals"], carrying)
                conn.execute(PQ["close_signals"], carrying)
            if commit.parent_note is not None:
                self._note_parent(conn, commit.parent_note, commit.at_s)
            set_wake = commit.wake_at_s != UNCHANGED
            fenced_alone = fence is not None and not commit.events
            if (
                commit.status is not None
                or commit.result_text is not None
                or commit.error is not None
                or commit.clear_error
                or set_wake
                or fenced_alone
            ):
                update = parameters_of(
                    commit,
                    set_wake=set_wake,
                    wake_at_s=commit.wake_at_s if set_wake else None,
                    updated_s=commit.at_s,
                )
                changed = conn.execute(PQ["update_run"], update).rowcount
                if fenced_alone and changed == 0:
                    raise LeaseLost(run_id=run_id, token=fence)
            if commit.wake_on_signal is not None:
                # Its own statement, after the row is locked by the append or the update above:
                # it reads the signals as they are once a signal being sent (which locks the row
                # first) has committed.
                waking = {"run_id": run_id, "name": commit.wake_on_signal, "at_s": commit.at_s}
                conn.execute(PQ["wake_on_signal"], waking)

        landed = None
        if commit.events:
            expected = [
                (e.seq, codec.checksum(e.seq, e.kind, e.step, e.fp, e.data, e.at_s))
                for e in commit.events
            ]

            def landed(conn: psycopg.Connection[Any]) -> tuple[bool, None]:
                span = {"run_id": run_id, "first": expected[0][0], "last": expected[-1][0]}
                found = [tuple(r) for r in conn.execute(PQ["events_landed"], span).fetchall()]
                if not found:
                    return False, None
                if found == expected:
                    return True, None
                raise LeaseLost(run_id=run_id, token=fence)  # another owner wrote those seqs

        effect = commit.side_effect
        try:
            # A commit that appends events is fenced by the append trigger, so nothing in it
            # waits on an answer: it can go out in one round trip. One that only updates the
            # row learns from the update's count whether its fence held, before COMMIT.
            self._do(
                work,
                write=True,
                durable=commit.durable,
                landed=landed,
                pipelined=bool(commit.events)
                and commit.wake_on_signal is None
                and commit.new_run is None
                and commit.parent_note is None,
            )
        except PostgresError as exc:
            if effect is not None and exc.constraint == "side_effects_pkey":
                raise SideEffectExistsError(
                    path=self.path, key=effect.key, run_id=effect.run_id, step=effect.step
                ) from None
            raise

    def commit_tool_result(self, result: ToolResult) -> None:
        self.commit(result.commit())  # a round trip is the cost here, not building the Commit

    def send_signal(self, run_id: str, name: str, payload_text: str, sent_s: float) -> int:
        from durabl.store.sqlite import check_signal_target

        sending = {"run_id": run_id, "name": name, "payload": payload_text, "sent_s": sent_s}

        def work(conn: psycopg.Connection[Any]) -> int:
            check_signal_target(
                self.path, run_id, conn.execute(PQ["signal_target"], sending).fetchone()
            )
            found = conn.execute(PQ["insert_signal"], sending).fetchone()
            conn.execute(PQ["wake_waiting"], sending)
            return int(found[0]) if found else 0

        def landed(conn: psycopg.Connection[Any]) -> tuple[bool, int]:
            for signal in self._signals(conn, run_id):
                if (signal.name, signal.payload_text, signal.sent_s) == (
                    name,
                    payload_text,
                    sent_s,
                ):
                    return True, signal.id
            return False, 0

        return self._do(work, write=True, durable=True, landed=landed)

    def _signals(self, conn: psycopg.Connection[Any], run_id: str) -> list[Signal]:
        rows = conn.execute(PQ["list_signals"], {"run_id": run_id}).fetchall()
        return [
            Signal(id=i, name=n, payload_text=p, sent_s=s, delivered_step=d)
            for i, n, p, s, d in rows
        ]

    def pending_signal(self, run_id: str, name: str) -> Signal | None:
        whose = {"run_id": run_id, "name": name}
        found = self._do(lambda conn: conn.execute(PQ["pending_signal"], whose).fetchone())
        if found is None:
            return None
        return Signal(id=found[0], name=name, payload_text=found[1], sent_s=found[2])

    def signals(self, run_id: str) -> list[Signal]:
        return self._do(lambda conn: self._signals(conn, run_id))

    def side_effect(self, key: str) -> SideEffect | None:
        def work(conn: psycopg.Connection[Any]) -> SideEffect | None:
            cur = conn.cursor(row_factory=dict_row)
            found = cur.execute(PQ["get_side_effect"], {"idempotency_key": key}).fetchone()
            return None if found is None else SideEffect(**found)

        return self._do(work)

    def key_claim(self, key: str) -> KeyClaim | None:
        def work(conn: psycopg.Connection[Any]) -> KeyClaim | None:
            cur = conn.cursor(row_factory=dict_row)
            found = cur.execute(PQ["get_claim"], {"idempotency_key": key}).fetchone()
            return None if found is None else KeyClaim(**found)

        return self._do(work)

    def due_runs(self, now_s: float) -> list[str]:
        return self._do(lambda conn: [r[0] for r in conn.execute(PQ["due_runs"], {"now_s": now_s})])

    def next_wake_s(self) -> float | None:
        found = self._do(lambda conn: conn.execute(PQ["next_wake"]).fetchone())
        return None if found is None or found[0] is None else float(found[0])

    def take_lease(self, run_id: str, seen_token: int, lease: Lease) -> int | None:
        work, landed = self._taking(run_id, seen_token, lease)
        return self._do(work, write=True, landed=landed)

    def _taking(
        self, run_id: str, seen_token: int, lease: Lease
    ) -> tuple[
        Callable[[psycopg.Connection[Any]], int | None],
        Callable[[psycopg.Connection[Any]], tuple[bool, int | None]],
    ]:
        """Taking ``run_id``'s lease from token ``seen_token``: the write, and how to tell
        whether it landed."""
        taking = parameters_of(lease, run_id=run_id, lease_token=seen_token)

        def work(conn: psycopg.Connection[Any]) -> int | None:
            # The run's row may be locked by an owner frozen inside its commit (SIGSTOP, a VM
            # paused, a host cut off after BEGIN). Waiting for it would stall this thread for
            # as long as the freeze lasts; a takeover that cannot have the row now is one that
            # another process is in the way of, which the caller handles as such.
            conn.execute(f"SET LOCAL lock_timeout = '{TAKEOVER_WAIT_MS}ms'")
            try:
                changed = conn.execute(PQ["take_lease"], taking).rowcount
            except psycopg.errors.LockNotAvailable:
                return None
            return seen_token + 1 if changed == 1 else None

        def landed(conn: psycopg.Connection[Any]) -> tuple[bool, int | None]:
            row = self._get_run(conn, run_id)
            if row is None or row.lease_token == seen_token:
                return False, None
            mine = row.lease is not None and row.lease.owner == lease.owner
            return True, seen_token + 1 if mine and row.lease_token == seen_token + 1 else None

        return work, landed

    def claim_runs(self, lease: Lease, now_s: float, limit: int) -> list[tuple[str, int]]:
        """Take the leases of up to ``limit`` RUNNING runs that nobody holds (no lease, or an
        expired one), skipping rows another claim has locked: (run id, new token) each."""
        claiming = parameters_of(lease, now_s=now_s, limit=limit, grace_s=RESTART_GRACE_S)

        def work(conn: psycopg.Connection[Any]) -> list[tuple[str, int]]:
            return [(r[0], int(r[1])) for r in conn.execute(PQ["claim_runs"], claiming)]

        def landed(conn: psycopg.Connection[Any]) -> tuple[bool, list[tuple[str, int]]]:
            return True, []  # what landed is leased to this owner; the leases expire unused

        claimed = self._do(work, write=True, landed=landed, remember=False)
        if self.durability == "full":  # to redo, each run's lease taken as this claim took it
            for run_id, token in claimed:
                take, took = self._taking(run_id, token - 1, lease)
                self._unflushed.remember(take, took, server_up=not self._restarted)
        return claimed

    def owner_alive(self, host: str, pid: int) -> bool:
        """Whether process ``pid`` on ``host`` still has a session open on the server. A
        process that dies, killed or crashed, loses its sessions with it, so its leases need
        not run out before another host takes its runs; a host cut off from the network keeps
        them until the server notices, and then its leases run out as leases do."""
        name = {"name": session_name(host, pid), "grace_s": RESTART_GRACE_S}
        found = self._do(lambda conn: conn.execute(PQ["owner_alive"], name).fetchone())
        return bool(found and found[0])

    def renew_lease(self, run_id: str, token: int, owner: str, expires_s: float) -> bool:
        renewal = {
            "run_id": run_id,
            "lease_token": token,
            "lease_owner": owner,
            "lease_expires_s": expires_s,
        }
        return self._do(
            lambda conn: conn.execute(PQ["renew_lease"], renewal).rowcount == 1, write=True
        )

    def release_lease(self, run_id: str, token: int) -> None:
        whose = {"run_id": run_id, "lease_token": token}
        self._do(lambda conn: conn.execute(PQ["release_lease"], whose), write=True)

    def compact(self, run_id: str, watermark: int, snapshot: str, fence: int) -> int:
        folding = {
            "run_id": run_id,
            "watermark": watermark,
            "body": snapshot,
            "crc": codec.snapshot_checksum(watermark, snapshot),
        }
        seen: list[int] = []

        def work(conn: psycopg.Connection[Any]) -> int:
            found = conn.execute(PQ["compact_check"], folding).fetchone()
            if found is None:
                raise NoRunToCompactError(path=self.path, run_id=run_id)
            token, old_mark, last_seq = found
            if token != fence:
                raise LeaseLost(run_id=run_id, token=fence)
            if not old_mark < watermark <= (last_seq or 0):
                raise ValueError(
                    f"run {run_id}: cannot fold up to seq {watermark}: the log holds seqs "
                    f"{old_mark + 1}..{last_seq or old_mark}"
                )
            seen[:] = [old_mark]
            conn.execute(PQ["set_watermark"], folding)
            conn.execute(PQ["set_snapshot"], folding)
            return conn.execute(PQ["delete_folded"], folding).rowcount

        def landed(conn: psycopg.Connection[Any]) -> tuple[bool, int]:
            found = conn.execute(PQ["get_snapshot"], folding).fetchone()
            done = found is not None and found[0] == watermark and found[2] == folding["crc"]
            return done, watermark - seen[0] if done and seen else 0

        return self._do(work, write=True, durable=True, landed=landed)

    def load_history(self, run_id: str) -> tuple[int, str | None, list[Event]]:
        whose = {"run_id": run_id, "after_seq": 0}

        def work(conn: psycopg.Connection[Any]) -> tuple[Any, list[Any]]:
            rows = conn.execute(PQ["load_log"], whose).fetchall()
            if rows and rows[0][0] == 1:
                return (0, None, None), rows  # never compacted: see Store.load_history
            return conn.execute(PQ["get_snapshot"], whose).fetchone(), rows

        found, rows = self._do(work, snapshot=True)  # a compaction cannot tear the two reads
        if found is None:
            return 0, None, []
        watermark, text, crc = found
        if text is not None and codec.snapshot_checksum(watermark, text) != crc:
            raise SnapshotChecksumError(path=self.path, run_id=run_id, watermark=watermark)
        return watermark, text, self._verified(run_id, rows)

    def reclaim(self) -> tuple[int, int]:
        """Rewrite the tables compaction deletes from (``VACUUM FULL``), which hands their
        free space back to the file system; the sizes are the durabl schema's tables, indexes
        included. A plain VACUUM cannot: compaction frees the oldest rows and keeps the newest
        at the end of the table, so nothing is left to cut off. The rewrite locks each table
        while it runs, as SQLite's VACUUM does the file."""
        size = (
            "SELECT COALESCE(SUM(pg_total_relation_size(format('durabl.%I', tablename))), 0) "
            "FROM pg_tables WHERE schemaname = 'durabl'"
        )

        def measure(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(size).fetchone()
            return int(row[0]) if row else 0

        before = self._do(measure)
        try:
            with self._pool.connection() as conn:  # VACUUM cannot run inside a transaction
                conn.execute("VACUUM (FULL) durabl.events")
                conn.execute("VACUUM (FULL) durabl.snapshots")
        except psycopg.Error as exc:
            raise self._error(exc) from None
        return before, self._do(measure)

    @contextmanager
    def reading(self) -> Iterator[psycopg.Connection[Any]]:
        """One read-only snapshot of the database (REPEATABLE READ), for its own tools."""
        if self._closed:
            raise StoreClosedError(path=self.path)
        try:
            with self._pool.connection() as conn:
                conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                try:
                    yield conn
                finally:
                    if not conn.broken:
                        conn.execute("COMMIT")
        except psycopg.Error as exc:
            raise self._error(exc) from None

    def watch(self, on_work: Callable[[], None]) -> Callable[[], None]:
        """Call ``on_work`` whenever a run may have work for a worker (NOTIFY durabl_work, sent
        by the schema's triggers), from a thread of its own with a connection of its own, which
        reconnects by itself. Returns what stops it."""
        stop = threading.Event()

        def listen() -> None:
            while not stop.is_set():
                try:
                    with psycopg.connect(self.url, **self._connect_kwargs()) as conn:
                        conn.execute("LISTEN durabl_work")
                        on_work()  # whatever was sent while not listening
                        while not stop.is_set():
                            for _ in conn.notifies(timeout=0.5, stop_after=64):
                                on_work()
                except psycopg.Error as exc:
                    if stop.is_set():
                        return
                    logger.warning(
                        "durabl: lost the notification connection to %s (%s); reconnecting",
                        self.path,
                        " ".join(str(exc).split()) or type(exc).__name__,
                    )
                    stop.wait(0.5)

        thread = threading.Thread(target=listen, name="durabl-listen", daemon=True)
        thread.start()

        def close() -> None:
            stop.set()
            thread.join(timeout=5)

        return close
