"""The SQLite store: one file, WAL mode, the log's invariants enforced by triggers.

Durability: every commit runs with ``synchronous=NORMAL`` (survives the death of the process:
the commit is in the WAL, which the OS holds) except commits marked ``durable`` under
``durability="full"``, which run with ``synchronous=FULL`` and so fsync the WAL before returning.
Because the WAL is one append-only file, that fsync also makes every earlier commit durable, so
the runtime pays one fsync per completed step and nothing for the bookkeeping before it.

The SQL is in ``schema`` (named statements, migrations), how a file is judged and opened in
``connection`` and ``files``, and what SQLite's errors mean in ``sqlite_errors``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

from durabl import codec
from durabl.errors import (
    EventChecksumError,
    LeaseLost,
    NoRunToCompactError,
    SideEffectExistsError,
    SnapshotChecksumError,
    StorageError,
    StoreClosedError,
)
from durabl.events import Event
from durabl.store.base import UNCHANGED, Commit, KeyClaim, Lease, RunRow, SideEffect
from durabl.store.connection import open_database
from durabl.store.files import file_bytes
from durabl.store.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, Q
from durabl.store.sqlite_errors import storage_error

__all__ = ["APPLICATION_ID", "MIGRATIONS", "SCHEMA_VERSION", "Q", "SQLiteStore"]

DURABILITY_MODES = ("full", "process")


def _run_row(row: tuple[Any, ...]) -> RunRow:
    run_id, workflow, input_text, status, result, error, created_s, updated_s, wake, mark = row[:10]
    owner, pid, host, started, expires_s, token = row[10:16]
    lease = None if owner is None else Lease(owner, pid, host, started, expires_s, token)
    return RunRow(
        run_id,
        workflow,
        input_text,
        status,
        result,
        error,
        created_s,
        updated_s,
        wake,
        mark,
        lease=lease,
        lease_token=token,
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
        if durability not in DURABILITY_MODES:
            raise ValueError(
                f"durability must be one of {', '.join(map(repr, DURABILITY_MODES))}, "
                f"got {durability!r}"
            )
        self.path = os.fspath(path)
        self.durability = durability
        self.read_only = read_only
        self._lock = threading.RLock()
        self._sync_full = False
        self._closed = False
        self._conn = open_database(self.path, read_only=read_only)

    # -- transactions ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, durable: bool) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction; rolled back on any BaseException, a simulated death too."""
        with self._lock:
            conn = self._live()
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

    def _set_sync(self, conn: sqlite3.Connection, durable: bool) -> None:
        """fsync on commit only when this commit must survive power loss."""
        want_full = durable and self.durability == "full"
        if want_full != self._sync_full:
            conn.execute(
                "PRAGMA synchronous = FULL" if want_full else "PRAGMA synchronous = NORMAL"
            )
            self._sync_full = want_full

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._live()
            try:
                yield conn
            except sqlite3.Error as exc:
                raise storage_error(self.path, exc) from None

    def _live(self) -> sqlite3.Connection:
        if self._closed:
            raise StoreClosedError(path=self.path)
        return self._conn

    # -- the Store interface ---------------------------------------------------------------

    def create_run(self, row: RunRow, first: Event) -> RunRow | None:
        with self._write(durable=True) as conn:
            existing = conn.execute(Q["get_run"], (row.run_id,)).fetchone()
            if existing is not None:
                return _run_row(existing)
            lease = row.lease
            held = (
                (None,) * 5
                if lease is None
                else (lease.owner, lease.pid, lease.host, lease.started, lease.expires_s)
            )
            token = 0 if lease is None else 1
            run = (row.run_id, row.workflow, row.input_text, row.status, row.created_s)
            conn.execute(Q["insert_run"], (*run, row.updated_s, *held, token))
            conn.execute(*_event_insert(row.run_id, first, None if lease is None else token))
        return None

    def get_run(self, run_id: str) -> RunRow | None:
        with self._read() as conn:
            found = conn.execute(Q["get_run"], (run_id,)).fetchone()
        return None if found is None else _run_row(found)

    def list_runs(
        self,
        statuses: tuple[str, ...] | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> list[RunRow]:
        wanted = None if statuses is None else json.dumps(list(statuses))
        with self._read() as conn:
            rows = conn.execute(Q["list_runs"], (wanted, workflow, -1 if limit is None else limit))
            return [_run_row(r) for r in rows.fetchall()]

    def load_log(self, run_id: str, after_seq: int = 0) -> list[Event]:
        with self._read() as conn:
            rows = conn.execute(Q["load_log"], (run_id, after_seq)).fetchall()
        return self._verified(run_id, rows)

    def _verified(self, run_id: str, rows: list[tuple[Any, ...]]) -> list[Event]:
        log = []
        for seq, kind, step, fp, data, at_s, crc in rows:
            if codec.checksum(seq, kind, step, fp, data, at_s) != crc:
                raise EventChecksumError(path=self.path, run_id=run_id, seq=seq)
            log.append(Event(seq, kind, step, fp, data, at_s))
        return log

    def commit(self, commit: Commit) -> None:
        statements: list[tuple[str, tuple[Any, ...]]] = [
            _event_insert(commit.run_id, event, commit.fence) for event in commit.events
        ]
        if commit.side_effect is not None:
            e = commit.side_effect
            row = (e.key, e.run_id, e.step, e.tool, e.args_fp, e.result_text, e.error, e.at_s)
            statements.append((Q["insert_side_effect"], row))
        if commit.claim is not None:
            c = commit.claim
            claim = (c.key, c.run_id, c.step, c.tool, c.args_fp, commit.at_s)
            statements.append((Q["upsert_claim"], claim))
        if commit.release_claim is not None:
            statements.append((Q["delete_claim"], (commit.release_claim,)))
        set_wake = commit.wake_at_s != UNCHANGED
        if (
            commit.status is not None
            or commit.result_text is not None
            or commit.error is not None
            or commit.clear_error
            or set_wake
            or (commit.fence is not None and not commit.events)
        ):
            update = (
                commit.run_id,
                commit.status,
                commit.result_text,
                commit.error,
                commit.clear_error,
                set_wake,
                commit.wake_at_s if set_wake else None,
                commit.at_s,
                commit.fence,
            )
            statements.append((Q["update_run"], update))
        try:
            changed = self._apply(statements, commit.durable)
        except StorageError as exc:
            effect = commit.side_effect
            if effect is not None and "second side effect" in str(exc):
                raise SideEffectExistsError(
                    path=self.path, key=effect.key, run_id=effect.run_id, step=effect.step
                ) from None
            raise
        if commit.fence is not None and not commit.events and changed == 0:
            raise LeaseLost(run_id=commit.run_id, token=commit.fence)

    def _apply(self, statements: list[tuple[str, tuple[Any, ...]]], durable: bool) -> int:
        """Execute ``statements`` atomically; returns the rows the last one changed. A single
        statement is its own transaction in SQLite's autocommit mode, which saves the
        BEGIN/COMMIT round trips on the hot path."""
        if len(statements) == 1:
            with self._lock:
                conn = self._live()
                try:
                    self._set_sync(conn, durable)
                    return conn.execute(*statements[0]).rowcount
                except sqlite3.Error as exc:
                    raise storage_error(self.path, exc) from None
        with self._write(durable) as conn:
            changed = 0
            for sql, params in statements:
                changed = conn.execute(sql, params).rowcount
            return changed

    def take_lease(self, run_id: str, seen_token: int, lease: Lease) -> int | None:
        row = (lease.owner, lease.pid, lease.host, lease.started, lease.expires_s)
        with self._write(durable=False) as conn:
            changed = conn.execute(Q["take_lease"], (*row, run_id, seen_token)).rowcount
        return seen_token + 1 if changed == 1 else None

    def renew_lease(self, run_id: str, token: int, owner: str, expires_s: float) -> bool:
        with self._write(durable=False) as conn:
            changed = conn.execute(Q["renew_lease"], (expires_s, run_id, token, owner)).rowcount
        return changed == 1

    def release_lease(self, run_id: str, token: int) -> None:
        with self._write(durable=False) as conn:
            conn.execute(Q["release_lease"], (run_id, token))

    def side_effect(self, key: str) -> SideEffect | None:
        with self._read() as conn:
            found = conn.execute(Q["get_side_effect"], (key,)).fetchone()
        return None if found is None else SideEffect(*found)

    def key_claim(self, key: str) -> KeyClaim | None:
        with self._read() as conn:
            found = conn.execute(Q["get_claim"], (key,)).fetchone()
        return None if found is None else KeyClaim(*found)

    def due_runs(self, now_s: float) -> list[str]:
        with self._read() as conn:
            return [r[0] for r in conn.execute(Q["due_runs"], (now_s,)).fetchall()]

    def next_wake_s(self) -> float | None:
        with self._read() as conn:
            value = conn.execute(Q["next_wake"]).fetchone()[0]
        return None if value is None else float(value)

    def compact(self, run_id: str, watermark: int, snapshot: str, fence: int) -> int:
        crc = codec.snapshot_checksum(watermark, snapshot)
        with self._write(durable=True) as conn:
            found = conn.execute(Q["compact_check"], (run_id,)).fetchone()
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
            conn.execute(Q["set_watermark"], (run_id, watermark))
            conn.execute(Q["set_snapshot"], (run_id, watermark, snapshot, crc))
            return conn.execute(Q["delete_folded"], (run_id, watermark)).rowcount

    def load_history(self, run_id: str) -> tuple[int, str | None, list[Event]]:
        with self._read() as conn:
            conn.execute("BEGIN")  # one read snapshot: a compaction cannot tear the two reads
            try:
                found = conn.execute(Q["get_snapshot"], (run_id,)).fetchone()
                rows = conn.execute(Q["load_log"], (run_id, 0)).fetchall()
            finally:
                conn.execute("COMMIT")
        if found is None:
            return 0, None, []
        watermark, text, crc = found
        if text is not None and codec.snapshot_checksum(watermark, text) != crc:
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
                self._conn.close()

    # -- helpers ---------------------------------------------------------------------------


def _event_insert(run_id: str, e: Event, fence: int | None) -> tuple[str, tuple[Any, ...]]:
    crc = codec.checksum(e.seq, e.kind, e.step, e.fp, e.data, e.at_s)
    return Q["insert_event"], (run_id, e.seq, e.kind, e.step, e.fp, e.data, e.at_s, crc, fence)
