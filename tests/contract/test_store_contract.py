"""The Store contract: one suite that every backend must pass unchanged.

``TestStoreContract`` exercises each method of ``durabl.store.base.Store`` as its docstring
states it, against every entry of ``BACKENDS``. To add a backend (PostgreSQL), write a
``Backend`` for it (how to open a fresh store, open the same database again, attach a second
handle, damage one stored event behind the store's back, and build a value that kills the process
while the backend writes it) and append it to ``BACKENDS``; nothing else changes. SQLite runs in
a file under the test's ``tmp_path``; PostgreSQL in a database of its own on the machine's server
(``pg_support``), dropped when the test ends.

``TestSQLiteFile`` holds what only a file can get wrong: versions, foreign, truncated and
non-SQLite files, and the triggers that keep the log's invariants inside the database.
``TestPostgresDatabase`` holds the same for a database on a server: its triggers against any
writer, versioned migrations that run once however many processes open a new database at once,
a newer schema, another application's tables in the ``durabl`` schema, and the application's
own tables beside it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.adapt import Dumper

import pg_support
from durabl import ProcessDeath, SchemaVersionError, StorageError, codec, events
from durabl.errors import (
    DurablError,
    ForeignSchemaError,
    HistoryRewriteError,
    LeaseLost,
    LogGapError,
    RunEndedError,
    RunExistsError,
    RunNotFoundError,
    SideEffectExistsError,
    StoreClosedError,
)
from durabl.events import Event
from durabl.store import Commit, KeyClaim, RunRow, SideEffect, SQLiteStore, Store
from durabl.store import postgres as pg
from durabl.store.base import UNCHANGED, Lease, ParentNote, Signal, ToolResult
from durabl.store.postgres import PostgresStore
from durabl.store.sqlite import APPLICATION_ID, SCHEMA_VERSION, Q
from durabl.store.sqlite_errors import storage_error
from durabl.store.turns import Turns

T0_S = 1_700_000_000.0

# -- backends --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Backend:
    """How the contract suite reaches one kind of database."""

    name: str
    open: Callable[[Path], Store]
    """A store on a fresh, empty database that lives under the given directory."""
    reopen: Callable[[Store], Store]
    """Close the store and open the same database again."""
    attach: Callable[[Store], Store]
    """A second, independent handle on the same database (another process, in effect)."""
    damage_event: Callable[[Store, str, int, str, Any], Store]
    """Close the store, overwrite one column of one stored event on a copy of the database
    (bypassing every guard), and return a store open on the damaged copy."""
    dying_text: Callable[[str], str]
    """A text value that raises ``ProcessDeath`` at the moment the backend writes it."""
    damage_run: Callable[[Store, str, str, Any], Store]
    """Close the store, overwrite one column (``table.column``) of one run's rows on a copy of
    the database (bypassing every guard), and return a store open on the damaged copy."""


class _DiesWhenBound(str):
    """sqlite3 asks a str subclass to adapt itself when it binds it as a parameter: that is the
    instant a statement is written, so raising there is a death in the middle of a transaction."""

    def __conform__(self, protocol: object) -> object:
        raise ProcessDeath("mid-transaction")


def _sqlite(durability: str) -> Backend:
    def open_(directory: Path) -> Store:
        return SQLiteStore(directory / "durabl.db", durability=durability)

    def reopen(store: Store) -> Store:
        store.close()
        return SQLiteStore(store.path, durability=durability)

    def attach(store: Store) -> Store:
        return SQLiteStore(store.path, durability=durability)

    def damage_event(store: Store, run_id: str, seq: int, column: str, value: Any) -> Store:
        store.close()
        copy = Path(store.path).with_name("damaged.db")
        shutil.copyfile(store.path, copy)
        with contextlib.closing(sqlite3.connect(copy)) as conn:
            conn.execute("DROP TRIGGER events_append_only")
            changed = conn.execute(
                f"UPDATE events SET {column} = ? WHERE run_id = ? AND seq = ?",
                (value, run_id, seq),
            ).rowcount
            conn.commit()
        assert changed == 1, "the event to damage must be in the closed database file"
        return SQLiteStore(copy, durability=durability)

    def damage_run(store: Store, run_id: str, column: str, value: Any) -> Store:
        store.close()
        copy = Path(store.path).with_name("damaged.db")
        shutil.copyfile(store.path, copy)
        with contextlib.closing(sqlite3.connect(copy)) as conn:
            conn.execute("DROP TRIGGER runs_watermark_only_grows")
            table, _, name = column.partition(".")
            changed = conn.execute(
                f"UPDATE {table} SET {name} = ? WHERE run_id = ?", (value, run_id)
            ).rowcount
            conn.commit()
        assert changed == 1, "the run to damage must be in the closed database file"
        return SQLiteStore(copy, durability=durability)

    return Backend(
        f"sqlite-{durability}", open_, reopen, attach, damage_event, _DiesWhenBound, damage_run
    )


class _DiesWhenDumped(str):
    """The PostgreSQL twin of ``_DiesWhenBound``: psycopg asks the dumper registered for a
    value's class to turn it into bytes while it builds the statement that carries it, so
    raising there is a death in the middle of a transaction, between two statements."""


class _DyingDumper(Dumper):
    # No oid: a dumper with one is also registered by it, and would then dump every text of a
    # binary COPY (``durabl migrate``) in this process.
    oid = 0

    def dump(self, obj: object) -> bytes:
        raise ProcessDeath("mid-transaction")


class _DyingBinaryDumper(_DyingDumper):
    format = psycopg.pq.Format.BINARY


# Registered before any store opens: a connection takes the global adapters as they are when
# it is made.
psycopg.adapters.register_dumper(_DiesWhenDumped, _DyingDumper)
psycopg.adapters.register_dumper(_DiesWhenDumped, _DyingBinaryDumper)


def _postgres(durability: str) -> Backend:
    def open_(directory: Path) -> Store:
        return PostgresStore(pg_support.new_database(), durability=durability)

    def reopen(store: Store) -> Store:
        store.close()
        return PostgresStore(_url(store), durability=durability)

    def attach(store: Store) -> Store:
        return PostgresStore(_url(store), durability=durability)

    def damage(store: Store, table: str, sql: str, params: tuple[Any, ...]) -> Store:
        store.close()
        copy = pg_support.copy_database(_url(store))
        with pg_support.connect(copy) as conn, pg_support.guards_off(conn, table):
            changed = conn.execute(sql, params).rowcount
        assert changed == 1, "the row to damage must be in the database"
        return PostgresStore(copy, durability=durability)

    def damage_event(store: Store, run_id: str, seq: int, column: str, value: Any) -> Store:
        sql = f"UPDATE durabl.events SET {column} = %s WHERE run_id = %s AND seq = %s"
        return damage(store, "events", sql, (value, run_id, seq))

    def damage_run(store: Store, run_id: str, column: str, value: Any) -> Store:
        table, _, name = column.partition(".")
        sql = f"UPDATE durabl.{table} SET {name} = %s WHERE run_id = %s"
        return damage(store, table, sql, (value, run_id))

    return Backend(
        f"postgres-{durability}", open_, reopen, attach, damage_event, _DiesWhenDumped, damage_run
    )


def _url(store: Store) -> str:
    assert isinstance(store, PostgresStore)
    return store.url


BACKENDS = [_sqlite("full"), _sqlite("process"), _postgres("full"), _postgres("process")]


# -- building blocks -------------------------------------------------------------------------


def run_row(
    run_id: str,
    *,
    workflow: str = "research_agent",
    created_s: float = T0_S,
    status: str = events.RUNNING,
) -> RunRow:
    return RunRow(
        run_id=run_id,
        workflow=workflow,
        input_text='{"topic":"otters"}',
        status=status,
        result_text=None,
        error=None,
        created_s=created_s,
        updated_s=created_s,
        wake_at_s=None,
        watermark=0,
    )


def run_started(run_id: str, at_s: float = T0_S, data: str | None = None) -> Event:
    text = data if data is not None else codec.encode({"workflow": "research_agent", "run": run_id})
    return Event(1, events.RUN_STARTED, 0, None, text, at_s)


def event(
    seq: int, kind: str = events.STEP_STARTED, step: int = 1, data: str | None = None
) -> Event:
    fp = "0f" * 10 if kind == events.STEP_STARTED else None
    text = data if data is not None else codec.encode({"seq": seq})
    return Event(seq, kind, step, fp, text, T0_S + seq)


def effect(
    key: str, run_id: str = "run-1", step: int = 1, result: str | None = '"ok"'
) -> SideEffect:
    return SideEffect(
        key=key,
        run_id=run_id,
        step=step,
        tool="send_email",
        args_fp="ab" * 10,
        result_text=result,
        error=None,
        at_s=T0_S + 50,
    )


def claim(key: str, run_id: str = "run-1", step: int = 1) -> KeyClaim:
    return KeyClaim(key=key, run_id=run_id, step=step, tool="send_email", args_fp="ab" * 10)


SNAPSHOT = '{"format":1,"steps":[[1,"0f0f",2,3]]}'
"""What a compaction stores for the runtime; opaque to the store."""


def lease(owner: str) -> Lease:
    return Lease(
        owner=owner, pid=os.getpid(), host="this-host", started=None, expires_s=T0_S + 3600
    )


def row_of(store: Store, run_id: str) -> RunRow:
    found = store.get_run(run_id)
    assert found is not None, f"run {run_id} should exist"
    return found


def state_of(store: Store, run_id: str, keys: tuple[str, ...] = ()) -> tuple[Any, ...]:
    """Everything a commit for ``run_id`` could have touched."""
    return (
        store.get_run(run_id),
        store.load_log(run_id),
        [store.side_effect(key) for key in keys],
        [store.key_claim(key) for key in keys],
        store.due_runs(float("inf")),
        store.signals(run_id),
    )


def signal(signal_id: int, name: str = "approve", delivered_step: int | None = None) -> Signal:
    """The signal ``send(store, run_id, name, signal_id)`` keeps, as ``signals`` reads it."""
    return Signal(
        id=signal_id,
        name=name,
        payload_text=codec.encode({"n": signal_id}),
        sent_s=T0_S + 100 + signal_id,
        delivered_step=delivered_step,
    )


def send(store: Store, run_id: str, name: str, signal_id: int) -> int:
    """Send the signal ``signal(signal_id, name)`` describes: its payload and time come from
    the id it is expected to get, so that a read-back compares whole records."""
    kept = signal(signal_id, name)
    return store.send_signal(run_id, name, kept.payload_text, kept.sent_s)


# -- the contract ----------------------------------------------------------------------------


@pytest.fixture(params=BACKENDS, ids=lambda backend: backend.name)
def backend(request: pytest.FixtureRequest) -> Backend:
    return request.param


@pytest.fixture(autouse=True)
def _postgres_databases() -> Iterator[None]:
    """Take back the PostgreSQL databases a test used, once its stores are closed (an autouse
    fixture is torn down after the fixtures the test asked for)."""
    yield
    pg_support.release_all()


@pytest.fixture
def opened() -> Iterator[list[Store]]:
    """Every store a test opens; all closed at teardown."""
    stores: list[Store] = []
    yield stores
    for store in stores:
        store.close()


@pytest.fixture
def store(backend: Backend, tmp_path: Path, opened: list[Store]) -> Store:
    fresh = backend.open(tmp_path)
    opened.append(fresh)
    return fresh


def _incompressible(chars: int) -> str:
    """Text no database can store in less than its length: PostgreSQL compresses a repeated
    phrase in place, which would leave compaction next to nothing to free."""
    digests = (hashlib.sha256(b"%d" % n).hexdigest() for n in itertools.count())
    return "".join(itertools.islice(digests, chars // 64 + 1))[:chars]


def new_run(store: Store, run_id: str = "run-1", **row: Any) -> RunRow:
    created = run_row(run_id, **row)
    assert store.create_run(created, run_started(run_id, created.created_s)) is None
    return created


class TestStoreContract:
    # -- create_run ------------------------------------------------------------------------

    def test_create_run_writes_the_row_and_its_first_event(self, store: Store) -> None:
        row = new_run(store)
        assert store.get_run("run-1") == row
        assert store.load_log("run-1") == [run_started("run-1")]

    def test_create_run_again_changes_nothing_and_returns_the_existing_row(
        self, store: Store
    ) -> None:
        row = new_run(store)
        other = replace(row, workflow="other", input_text="[]", created_s=T0_S + 99)
        assert store.create_run(other, run_started("run-1", T0_S + 99, '"other"')) == row
        assert store.get_run("run-1") == row
        assert store.load_log("run-1") == [run_started("run-1")]

    def test_create_run_returns_the_row_as_it_is_now(self, store: Store) -> None:
        row = new_run(store)
        store.commit(Commit("run-1", [event(2)], status=events.SLEEPING, at_s=T0_S + 5))
        found = store.create_run(row, run_started("run-1"))
        assert found is not None
        assert found.status == events.SLEEPING
        assert found == store.get_run("run-1")

    def test_create_run_whose_first_event_is_not_seq_1_leaves_nothing(self, store: Store) -> None:
        with pytest.raises(StorageError):
            store.create_run(run_row("run-1"), run_started("run-1")._replace(seq=2))
        assert store.get_run("run-1") is None
        assert store.load_log("run-1") == []
        new_run(store)

    def test_a_death_inside_create_run_leaves_nothing(self, store: Store, backend: Backend) -> None:
        dying = run_started("run-1", data=backend.dying_text('{"workflow":"research_agent"}'))
        with pytest.raises(ProcessDeath):
            store.create_run(run_row("run-1"), dying)
        assert store.get_run("run-1") is None
        assert store.load_log("run-1") == []
        new_run(store)
        assert len(store.load_log("run-1")) == 1

    def test_runs_are_independent_logs(self, store: Store) -> None:
        new_run(store, "run-1")
        new_run(store, "run-2")
        store.commit(Commit("run-1", [event(2), event(3)]))
        store.commit(Commit("run-2", [event(2)]))
        assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]
        assert [e.seq for e in store.load_log("run-2")] == [1, 2]

    def test_an_unknown_run_has_no_row_and_no_log(self, store: Store) -> None:
        assert store.get_run("nope") is None
        assert store.load_log("nope") == []

    # -- commit: events and the run row ----------------------------------------------------

    def test_commit_appends_its_events_and_updates_the_run(self, store: Store) -> None:
        row = new_run(store)
        appended = [event(2), event(3, events.TOOL_DISPATCHED, data=None)]
        store.commit(
            Commit(
                "run-1",
                appended,
                status=events.SLEEPING,
                result_text='{"answer":42}',
                error="TimeoutError: slow",
                wake_at_s=T0_S + 60,
                at_s=T0_S + 7,
            )
        )
        assert store.load_log("run-1") == [run_started("run-1"), *appended]
        assert store.get_run("run-1") == replace(
            row,
            status=events.SLEEPING,
            result_text='{"answer":42}',
            error="TimeoutError: slow",
            wake_at_s=T0_S + 60,
            updated_s=T0_S + 7,
        )

    def test_a_commit_without_events_only_updates_the_run(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [], status=events.HELD, error="held", at_s=T0_S + 3))
        found = row_of(store, "run-1")
        assert (found.status, found.error, found.updated_s) == (events.HELD, "held", T0_S + 3)
        assert len(store.load_log("run-1")) == 1

    def test_fields_left_as_none_keep_their_value(self, store: Store) -> None:
        new_run(store)
        store.commit(
            Commit("run-1", [event(2)], status=events.FAILED, result_text='"r"', error="e")
        )
        store.commit(Commit("run-1", [event(3)]))
        found = row_of(store, "run-1")
        assert (found.status, found.result_text, found.error) == (events.FAILED, '"r"', "e")

    def test_clear_error_clears_it_and_a_new_error_replaces_it(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [], status=events.HELD, error="first"))
        store.commit(Commit("run-1", [], error="second"))
        assert row_of(store, "run-1").error == "second"
        store.commit(Commit("run-1", [], status=events.RUNNING, clear_error=True))
        assert row_of(store, "run-1").error is None
        store.commit(Commit("run-1", [], error="third", clear_error=True))
        assert row_of(store, "run-1").error == "third"

    @pytest.mark.parametrize("durable", [False, True], ids=["plain", "durable"])
    def test_a_commit_is_visible_to_the_next_reader(self, store: Store, durable: bool) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2)], status=events.COMPLETED, durable=durable))
        assert [e.seq for e in store.load_log("run-1")] == [1, 2]
        assert row_of(store, "run-1").status == events.COMPLETED

    def test_events_read_back_exactly_as_written(self, store: Store) -> None:
        new_run(store)
        written = [
            Event(
                2,
                events.STEP_STARTED,
                3,
                "9a" * 10,
                '["tool","search",{"q":"naïve ☃"},null]',
                T0_S + 0.1 + 0.2,
            ),
            Event(3, events.TOOL_DISPATCHED, 3, None, None, 1e-3),
            Event(4, events.STEP_COMPLETED, 3, None, '"\\u0000 and \\u001f"', 2.0**53),
        ]
        store.commit(Commit("run-1", written))
        assert store.load_log("run-1")[1:] == written

    def test_an_event_timed_in_whole_seconds_reads_back(self, store: Store) -> None:
        """A clock may return an int; the event must verify when it is read back."""
        new_run(store)
        store.commit(Commit("run-1", [Event(2, events.STEP_STARTED, 1, None, "{}", 1_700_000_123)]))
        (read,) = store.load_log("run-1", after_seq=1)
        assert read.at_s == 1_700_000_123

    # -- commit: the gapless rule ----------------------------------------------------------

    @pytest.mark.parametrize(
        "seqs",
        [[3], [2, 4], [1], [2, 2], [0]],
        ids=["gap", "gap-inside", "duplicate-first", "duplicate-inside", "zero"],
    )
    def test_events_that_do_not_extend_the_log_by_one_are_refused(
        self, store: Store, seqs: list[int]
    ) -> None:
        new_run(store)
        before = state_of(store, "run-1")
        with pytest.raises(StorageError, match="seq"):
            store.commit(Commit("run-1", [event(s) for s in seqs], status=events.FAILED))
        assert state_of(store, "run-1") == before

    @pytest.mark.parametrize("second_seq", [5, 3], ids=["gap", "duplicate"])
    def test_a_commit_refused_at_its_second_event_leaves_nothing_behind(
        self, store: Store, second_seq: int
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2)], claim=claim("old-key")))
        keys = ("new-key", "old-key")
        before = state_of(store, "run-1", keys)
        with pytest.raises(StorageError):
            store.commit(
                Commit(
                    "run-1",
                    [event(3, events.STEP_COMPLETED), event(second_seq)],
                    status=events.COMPLETED,
                    result_text='"done"',
                    error="should not land",
                    wake_at_s=T0_S + 1,
                    side_effect=effect("new-key"),
                    claim=claim("new-key"),
                    release_claim="old-key",
                    durable=True,
                    at_s=T0_S + 9,
                )
            )
        assert state_of(store, "run-1", keys) == before
        store.commit(Commit("run-1", [event(3)]))
        assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]

    def test_a_death_in_the_middle_of_a_commit_leaves_nothing_behind(
        self, store: Store, backend: Backend
    ) -> None:
        new_run(store)
        keys = ("k-1",)
        before = state_of(store, "run-1", keys)
        dying = event(3, events.STEP_COMPLETED, data=backend.dying_text('"result"'))
        with pytest.raises(ProcessDeath):
            store.commit(
                Commit(
                    "run-1",
                    [event(2), dying],
                    status=events.COMPLETED,
                    wake_at_s=T0_S,
                    side_effect=effect("k-1"),
                    claim=claim("k-1"),
                    durable=True,
                )
            )
        assert state_of(store, "run-1", keys) == before
        store.commit(Commit("run-1", [event(2), event(3)], status=events.SLEEPING))
        assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]

    def test_a_death_while_the_side_effect_is_written_leaves_nothing_behind(
        self, store: Store, backend: Backend
    ) -> None:
        """The side effect is written after the events: a death there has them written in
        the transaction already, and must take them with it."""
        new_run(store)
        keys = ("k-1",)
        before = state_of(store, "run-1", keys)
        dying = replace(effect("k-1"), result_text=backend.dying_text('"sent"'))
        with pytest.raises(ProcessDeath):
            store.commit(
                Commit(
                    "run-1",
                    [event(2), event(3, events.STEP_COMPLETED)],
                    status=events.COMPLETED,
                    wake_at_s=T0_S,
                    side_effect=dying,
                    claim=claim("k-1"),
                    durable=True,
                )
            )
        assert state_of(store, "run-1", keys) == before
        store.commit(Commit("run-1", [event(2)], side_effect=effect("k-1")))
        assert store.side_effect("k-1") == effect("k-1")

    def test_a_second_handle_with_a_stale_view_cannot_fork_the_log(
        self, store: Store, backend: Backend, opened: list[Store]
    ) -> None:
        new_run(store)
        other = backend.attach(store)
        opened.append(other)
        store.commit(Commit("run-1", [event(2)]))
        with pytest.raises(StorageError):
            other.commit(Commit("run-1", [event(2, events.STEP_FAILED)]))
        assert other.load_log("run-1") == store.load_log("run-1")
        assert [e.kind for e in other.load_log("run-1")] == [
            events.RUN_STARTED,
            events.STEP_STARTED,
        ]
        assert other.create_run(
            run_row("run-1", workflow="x"), run_started("run-1")
        ) == store.get_run("run-1")

    # -- commit: side effects --------------------------------------------------------------

    def test_a_side_effect_is_recorded_with_its_commit(self, store: Store) -> None:
        new_run(store)
        failed = replace(effect("k-2", step=2, result=None), error="ToolFailed: no")
        store.commit(Commit("run-1", [event(2)], side_effect=effect("k-1")))
        store.commit(Commit("run-1", [event(3)], side_effect=failed))
        assert store.side_effect("k-1") == effect("k-1")
        assert store.side_effect("k-2") == failed
        assert store.side_effect("never-used") is None

    def test_a_second_side_effect_for_a_key_is_refused_and_its_commit_leaves_nothing(
        self, store: Store
    ) -> None:
        new_run(store)
        new_run(store, "run-2", created_s=T0_S + 1)
        store.commit(Commit("run-1", [event(2)], side_effect=effect("k-1")))
        keys = ("k-1", "k-2")
        before = [state_of(store, run, keys) for run in ("run-1", "run-2")]
        for run_id in ("run-1", "run-2"):
            with pytest.raises(StorageError) as caught:
                store.commit(
                    Commit(
                        run_id,
                        [event(3 if run_id == "run-1" else 2)],
                        status=events.COMPLETED,
                        wake_at_s=T0_S,
                        side_effect=effect("k-1", run_id=run_id, result='"again"'),
                        claim=claim("k-2", run_id=run_id),
                        durable=True,
                    )
                )
            assert "'k-1'" in str(caught.value)
        assert [state_of(store, run, keys) for run in ("run-1", "run-2")] == before
        assert store.side_effect("k-1") == effect("k-1")

    # -- commit: key claims ----------------------------------------------------------------

    def test_a_claim_is_set_replaced_and_released(self, store: Store) -> None:
        new_run(store)
        new_run(store, "run-2", created_s=T0_S + 1)
        assert store.key_claim("k-1") is None
        store.commit(Commit("run-1", [event(2)], claim=claim("k-1")))
        assert store.key_claim("k-1") == claim("k-1")
        store.commit(Commit("run-2", [event(2)], claim=claim("k-1", run_id="run-2", step=4)))
        assert store.key_claim("k-1") == claim("k-1", run_id="run-2", step=4)
        store.commit(Commit("run-2", [event(3)], release_claim="k-1"))
        assert store.key_claim("k-1") is None

    def test_releasing_a_key_that_has_no_claim_is_harmless(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2)], release_claim="never-claimed"))
        assert len(store.load_log("run-1")) == 2

    def test_an_effect_and_the_release_of_its_claim_land_together(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2)], claim=claim("k-1")))
        store.commit(
            Commit(
                "run-1",
                [event(3, events.STEP_COMPLETED)],
                side_effect=effect("k-1"),
                release_claim="k-1",
            )
        )
        assert store.key_claim("k-1") is None
        assert store.side_effect("k-1") == effect("k-1")

    # -- commit: timers --------------------------------------------------------------------

    def test_wake_at_is_set_kept_when_unchanged_and_cleared_with_none(self, store: Store) -> None:
        new_run(store)

        def wake() -> float | None:
            return row_of(store, "run-1").wake_at_s

        assert wake() is None
        store.commit(Commit("run-1", [event(2)], wake_at_s=T0_S + 60))
        assert wake() == T0_S + 60
        store.commit(Commit("run-1", [event(3)]))
        assert wake() == T0_S + 60
        store.commit(Commit("run-1", [event(4)], status=events.SLEEPING, wake_at_s=UNCHANGED))
        assert wake() == T0_S + 60
        store.commit(Commit("run-1", [], wake_at_s=T0_S + 5))
        assert wake() == T0_S + 5
        store.commit(Commit("run-1", [event(5)], wake_at_s=None))
        assert wake() is None

    def test_due_runs_are_exactly_the_due_ones_earliest_first(self, store: Store) -> None:
        wakes = {"a": T0_S + 30, "b": T0_S + 10, "c": T0_S + 20, "d": None, "e": T0_S + 40}
        for n, (run_id, wake_at_s) in enumerate(wakes.items()):
            new_run(store, run_id, created_s=T0_S + n)
            if wake_at_s is not None:
                store.commit(Commit(run_id, [], wake_at_s=wake_at_s))
        assert store.due_runs(T0_S) == []
        assert store.due_runs(T0_S + 10) == ["b"]
        assert store.due_runs(T0_S + 25) == ["b", "c"]
        assert store.due_runs(T0_S + 30) == ["b", "c", "a"]
        assert store.due_runs(T0_S + 10_000) == ["b", "c", "a", "e"]
        assert store.next_wake_s() == T0_S + 10
        store.commit(Commit("b", [], wake_at_s=None))
        assert store.due_runs(T0_S + 25) == ["c"]
        assert store.next_wake_s() == T0_S + 20

    def test_no_armed_timer_means_no_next_wake(self, store: Store) -> None:
        assert store.next_wake_s() is None
        new_run(store)
        assert store.next_wake_s() is None
        store.commit(Commit("run-1", [], wake_at_s=T0_S + 1))
        store.commit(Commit("run-1", [], wake_at_s=None))
        assert store.next_wake_s() is None
        assert store.due_runs(float("inf")) == []

    # -- leases ----------------------------------------------------------------------------

    def test_take_lease_swaps_only_the_token_it_was_shown(self, store: Store) -> None:
        new_run(store)
        assert store.take_lease("run-1", 0, lease("me")) == 1
        taken = row_of(store, "run-1")
        assert (taken.lease_token, taken.lease) == (1, replace(lease("me"), token=1))
        assert store.take_lease("run-1", 0, lease("other")) is None
        assert store.take_lease("run-9", 0, lease("other")) is None
        assert row_of(store, "run-1") == taken
        assert store.take_lease("run-1", 1, lease("other")) == 2
        assert row_of(store, "run-1").lease == replace(lease("other"), token=2)

    # -- list_runs -------------------------------------------------------------------------

    def test_list_runs_is_newest_first_and_filters(self, store: Store) -> None:
        layout = [
            ("r1", "agent", events.COMPLETED),
            ("r2", "agent", events.RUNNING),
            ("r3", "digest", events.RUNNING),
            ("r4", "agent", events.FAILED),
            ("r5", "digest", events.SLEEPING),
        ]
        for n, (run_id, workflow, status) in enumerate(layout):
            new_run(store, run_id, workflow=workflow, created_s=T0_S + n)
            if status != events.RUNNING:
                store.commit(Commit(run_id, [], status=status))

        def ids(**filters: Any) -> list[str]:
            return [row.run_id for row in store.list_runs(**filters)]

        assert ids() == ["r5", "r4", "r3", "r2", "r1"]
        assert ids(statuses=(events.RUNNING,)) == ["r3", "r2"]
        assert ids(statuses=(events.RUNNING, events.SLEEPING)) == ["r5", "r3", "r2"]
        assert ids(statuses=()) == []
        assert ids(workflow="agent") == ["r4", "r2", "r1"]
        assert ids(workflow="nope") == []
        assert ids(statuses=(events.RUNNING,), workflow="digest") == ["r3"]
        assert ids(limit=2) == ["r5", "r4"]
        assert ids(limit=0) == []
        assert ids(workflow="agent", limit=1) == ["r4"]
        assert store.list_runs(limit=1) == [store.get_run("r5")]

    def test_list_runs_of_an_empty_store_is_empty(self, store: Store) -> None:
        assert store.list_runs() == []

    # -- load_log --------------------------------------------------------------------------

    def test_load_log_after_a_seq_returns_the_tail(self, store: Store) -> None:
        new_run(store)
        tail = [event(2), event(3), event(4)]
        store.commit(Commit("run-1", tail))
        assert store.load_log("run-1", after_seq=0) == [run_started("run-1"), *tail]
        assert store.load_log("run-1", after_seq=2) == tail[1:]
        assert store.load_log("run-1", after_seq=4) == []
        assert store.load_log("run-1", after_seq=99) == []

    @pytest.mark.parametrize(
        ("column", "value"),
        [
            ("data", '{"forged":true}'),
            ("kind", events.STEP_FAILED),
            ("step", 9),
            ("fp", "ff" * 10),
            ("at_s", T0_S - 1),
            ("seq", 7),
        ],
    )
    def test_a_damaged_event_is_refused_on_read(
        self, store: Store, backend: Backend, opened: list[Store], column: str, value: Any
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2), event(3), event(4)]))
        damaged = backend.damage_event(store, "run-1", 3, column, value)
        opened.append(damaged)
        with pytest.raises(StorageError) as caught:
            damaged.load_log("run-1")
        assert "run-1" in str(caught.value)
        assert "checksum" in str(caught.value)
        assert damaged.get_run("run-1") is not None

    def test_an_event_an_older_durabl_checksummed_is_read_as_it_was_written(
        self, store: Store, backend: Backend, opened: list[Store]
    ) -> None:
        """Rows stored before checksum format 1 keep their format 0 crcs, and still hold."""
        new_run(store)
        store.commit(Commit("run-1", [event(2), event(3), event(4)]))
        log = store.load_log("run-1")
        older = backend.damage_event(store, "run-1", 3, "crc", codec.checksum_format_0(*log[2]))
        opened.append(older)
        assert older.load_log("run-1") == log

    @pytest.mark.parametrize("named", ["format 0", "format 2"])
    def test_an_event_whose_crc_names_another_format_is_refused_on_read(
        self, store: Store, backend: Backend, opened: list[Store], named: str
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2), event(3), event(4)]))
        crc = codec.checksum(*store.load_log("run-1")[2])
        other = crc & 0xFFFFFFFF if named == "format 0" else crc + codec.CHECKSUM_FORMAT_1
        damaged = backend.damage_event(store, "run-1", 3, "crc", other)
        opened.append(damaged)
        with pytest.raises(StorageError, match="seq 3 of run run-1 fails its checksum"):
            damaged.load_log("run-1")

    # -- compact, load_history, reclaim ----------------------------------------------------

    def test_compact_folds_the_prefix_and_deletes_exactly_its_events(self, store: Store) -> None:
        new_run(store)
        new_run(store, "run-2", created_s=T0_S + 1)
        log = [event(seq) for seq in range(2, 8)]
        store.commit(Commit("run-1", log[:3], side_effect=effect("k-1"), claim=claim("k-2")))
        store.commit(Commit("run-1", log[3:], status=events.SLEEPING, wake_at_s=T0_S + 60))
        store.commit(Commit("run-2", [event(2)]))
        other = state_of(store, "run-2")
        row = row_of(store, "run-1")

        assert store.compact("run-1", 4, SNAPSHOT, 0) == 4
        assert store.load_log("run-1") == log[3:]
        assert store.load_log("run-1", after_seq=5) == log[4:]
        assert store.load_history("run-1") == (4, SNAPSHOT, log[3:])
        assert row_of(store, "run-1") == replace(row, watermark=4)
        assert state_of(store, "run-2") == other
        assert store.side_effect("k-1") == effect("k-1")
        assert store.key_claim("k-2") == claim("k-2")
        assert store.due_runs(T0_S + 60) == ["run-1"]

    def test_compacting_again_moves_the_snapshot_on(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 7)]))
        assert store.compact("run-1", 2, '"first"', 0) == 2
        assert store.compact("run-1", 5, '"second"', 0) == 3
        assert store.load_history("run-1") == (5, '"second"', [event(6)])
        assert store.compact("run-1", 6, '"all"', 0) == 1
        assert store.load_history("run-1") == (6, '"all"', [])
        assert store.load_log("run-1") == []

    def test_the_log_goes_on_after_the_watermark_with_no_gap(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2), event(3)]))
        store.compact("run-1", 3, SNAPSHOT, 0)
        before = state_of(store, "run-1")
        for seqs in ([3], [5], [1], [2], [4, 6]):
            with pytest.raises(StorageError, match="seq"):
                store.commit(Commit("run-1", [event(s) for s in seqs], status=events.FAILED))
            assert state_of(store, "run-1") == before
        store.commit(Commit("run-1", [event(4), event(5)]))
        assert store.load_history("run-1") == (3, SNAPSHOT, [event(4), event(5)])

    @pytest.mark.parametrize("watermark", [0, 1, 2, 4, 7], ids=lambda w: f"to-{w}")
    def test_a_watermark_must_grow_and_stay_within_the_log(
        self, store: Store, watermark: int
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 7)]))
        store.compact("run-1", 4, SNAPSHOT, 0)
        before = (state_of(store, "run-1"), store.load_history("run-1"))
        with pytest.raises(ValueError, match="run-1"):
            store.compact("run-1", watermark, '"other"', 0)
        assert (state_of(store, "run-1"), store.load_history("run-1")) == before

    def test_compact_is_fenced_by_the_lease(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2), event(3)]))
        token = store.take_lease("run-1", 0, lease("me"))
        assert token == 1
        before = (state_of(store, "run-1"), store.load_history("run-1"))
        for stale in (0, 2):
            with pytest.raises(LeaseLost, match="run-1"):
                store.compact("run-1", 2, SNAPSHOT, stale)
            assert (state_of(store, "run-1"), store.load_history("run-1")) == before
        assert store.compact("run-1", 2, SNAPSHOT, token) == 2

    def test_compacting_an_unknown_run_is_a_storage_error(self, store: Store) -> None:
        with pytest.raises(StorageError, match="nope"):
            store.compact("nope", 1, SNAPSHOT, 0)
        assert store.get_run("nope") is None

    def test_a_death_in_the_middle_of_a_compaction_leaves_nothing_behind(
        self, store: Store, backend: Backend
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 6)]))
        before = (state_of(store, "run-1"), store.load_history("run-1"))
        with pytest.raises(ProcessDeath):
            store.compact("run-1", 4, backend.dying_text(SNAPSHOT), 0)
        assert (state_of(store, "run-1"), store.load_history("run-1")) == before
        assert store.load_history("run-1")[:2] == (0, None)
        assert store.compact("run-1", 4, SNAPSHOT, 0) == 4

    def test_load_history_of_a_run_never_compacted_is_its_whole_log(self, store: Store) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(2)]))
        assert store.load_history("run-1") == (0, None, store.load_log("run-1"))
        assert len(store.load_history("run-1")[2]) == 2
        assert store.load_history("nope") == (0, None, [])

    def test_a_second_handle_and_a_reopened_store_see_the_compaction(
        self, store: Store, backend: Backend, opened: list[Store]
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 6)]))
        other = backend.attach(store)
        opened.append(other)
        assert other.load_history("run-1")[0] == 0
        store.compact("run-1", 3, SNAPSHOT, 0)
        expected = (3, SNAPSHOT, [event(4), event(5)])
        assert other.load_history("run-1") == expected
        with pytest.raises(ValueError):
            other.compact("run-1", 3, SNAPSHOT, 0)
        again = backend.reopen(store)
        opened.append(again)
        assert again.load_history("run-1") == expected
        again.commit(Commit("run-1", [event(6)]))
        assert other.load_history("run-1") == (3, SNAPSHOT, [event(4), event(5), event(6)])

    @pytest.mark.parametrize(
        ("column", "value"),
        [
            ("snapshots.body", '{"folded":5}'),
            ("snapshots.crc", 12345),
            ("runs.watermark", 4),
        ],
    )
    def test_a_damaged_snapshot_is_refused_on_read(
        self, store: Store, backend: Backend, opened: list[Store], column: str, value: Any
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 7)]))
        store.compact("run-1", 3, SNAPSHOT, 0)
        damaged = backend.damage_run(store, "run-1", column, value)
        opened.append(damaged)
        with pytest.raises(StorageError) as caught:
            damaged.load_history("run-1")
        assert "run-1" in str(caught.value)
        assert "snapshot" in str(caught.value) and "checksum" in str(caught.value)

    def test_a_damaged_event_after_the_watermark_is_refused_by_load_history(
        self, store: Store, backend: Backend, opened: list[Store]
    ) -> None:
        new_run(store)
        store.commit(Commit("run-1", [event(seq) for seq in range(2, 6)]))
        store.compact("run-1", 2, SNAPSHOT, 0)
        damaged = backend.damage_event(store, "run-1", 4, "data", '{"forged":true}')
        opened.append(damaged)
        with pytest.raises(StorageError, match="checksum"):
            damaged.load_history("run-1")

    @pytest.mark.alone  # a snapshot taken by another process keeps deleted rows for VACUUM FULL
    def test_reclaim_gives_back_what_compaction_freed(self, store: Store) -> None:
        new_run(store)
        body = codec.encode(_incompressible(2100))
        for start in range(2, 402, 50):
            seqs = range(start, start + 50)
            store.commit(Commit("run-1", [event(seq, data=body) for seq in seqs]))
        before, after = store.reclaim()
        assert isinstance(before, int) and isinstance(after, int)
        assert 0 < after <= before
        store.compact("run-1", 400, SNAPSHOT, 0)
        freed_before, freed_after = store.reclaim()
        assert freed_before >= after // 2
        assert freed_after < freed_before // 4, (freed_before, freed_after)
        assert store.reclaim() == (freed_after, freed_after)
        assert store.load_history("run-1") == (400, SNAPSHOT, [event(401, data=body)])
        store.commit(Commit("run-1", [event(402)]))
        assert [e.seq for e in store.load_log("run-1")] == [401, 402]

    @pytest.mark.parametrize(
        "use",
        [
            lambda s: s.compact("run-1", 1, SNAPSHOT, 0),
            lambda s: s.load_history("run-1"),
            lambda s: s.reclaim(),
        ],
        ids=["compact", "load_history", "reclaim"],
    )
    def test_compaction_after_close_is_a_storage_error(
        self, store: Store, use: Callable[[Store], Any]
    ) -> None:
        new_run(store)
        store.close()
        with pytest.raises(StorageError, match="closed"):
            use(store)

    # -- signals ---------------------------------------------------------------------------

    def test_signals_are_numbered_per_run_and_read_back_in_the_order_sent(
        self, store: Store
    ) -> None:
        new_run(store, "run-1")
        new_run(store, "run-2", created_s=T0_S + 1)
        assert [send(store, "run-1", name, n) for n, name in enumerate("aba", 1)] == [1, 2, 3]
        assert send(store, "run-2", "a", 1) == 1  # ids count per run, not per database
        assert store.signals("run-1") == [signal(1, "a"), signal(2, "b"), signal(3, "a")]
        assert store.signals("run-2") == [signal(1, "a")]
        assert store.signals("nope") == []

    def test_pending_signal_is_the_oldest_of_its_name_not_yet_delivered(self, store: Store) -> None:
        new_run(store)
        for n, name in enumerate("aba", 1):
            send(store, "run-1", name, n)
        assert store.pending_signal("run-1", "a") == signal(1, "a")
        assert store.pending_signal("run-1", "b") == signal(2, "b")
        assert store.pending_signal("run-1", "c") is None
        assert store.pending_signal("nope", "a") is None
        store.commit(Commit("run-1", [event(2), event(3, events.STEP_COMPLETED)], deliver_signal=1))
        assert store.pending_signal("run-1", "a") == signal(3, "a")
        store.commit(Commit("run-1", [event(4, events.STEP_COMPLETED, 2)], deliver_signal=3))
        assert store.pending_signal("run-1", "a") is None
        assert store.pending_signal("run-1", "b") == signal(2, "b")

    def test_a_delivery_marks_the_signal_with_the_step_of_the_commits_last_event(
        self, store: Store
    ) -> None:
        """The step the signal answers is the wait's, which the commit's last event (its
        completion) names, whatever the events before it in the same commit are."""
        new_run(store)
        send(store, "run-1", "approve", 1)
        opening = [Event(2, events.RUN_RESUMED, 0, None, "{}", T0_S + 2), event(3, step=4)]
        completion = event(4, events.STEP_COMPLETED, step=4)
        store.commit(Commit("run-1", [*opening, completion], deliver_signal=1, durable=True))
        assert store.signals("run-1") == [signal(1, delivered_step=4)]
        assert store.load_log("run-1")[1:] == [*opening, completion]

    def test_a_signal_delivered_again_is_refused_and_its_commit_leaves_nothing(
        self, store: Store
    ) -> None:
        new_run(store)
        send(store, "run-1", "approve", 1)
        store.commit(Commit("run-1", [event(2), event(3, events.STEP_COMPLETED)], deliver_signal=1))
        keys = ("k-1",)
        before = state_of(store, "run-1", keys)
        with pytest.raises(HistoryRewriteError):
            store.commit(
                Commit(
                    "run-1",
                    [event(4, events.STEP_COMPLETED, step=2)],
                    status=events.COMPLETED,
                    result_text='"approved twice"',
                    side_effect=effect("k-1", step=2),
                    claim=claim("k-1", step=2),
                    deliver_signal=1,
                    durable=True,
                    at_s=T0_S + 9,
                )
            )
        assert state_of(store, "run-1", keys) == before
        assert store.signals("run-1") == [signal(1, delivered_step=1)]

    @pytest.mark.parametrize("status", sorted(events.TERMINAL_STATUSES))
    def test_a_signal_to_a_missing_or_ended_run_is_refused_and_writes_nothing(
        self, store: Store, status: str
    ) -> None:
        with pytest.raises(RunNotFoundError, match="'nope'"):
            send(store, "nope", "approve", 1)
        assert store.signals("nope") == []
        assert store.get_run("nope") is None
        new_run(store)
        store.commit(Commit("run-1", [event(2)], status=status, wake_at_s=None))
        before = state_of(store, "run-1")
        with pytest.raises(RunEndedError, match=f"run run-1 is already {status}"):
            send(store, "run-1", "approve", 1)
        assert state_of(store, "run-1") == before
        assert store.pending_signal("run-1", "approve") is None

    def test_a_signal_makes_a_waiting_run_due_when_sent_and_leaves_other_timers_alone(
        self, store: Store
    ) -> None:
        timers = {
            events.WAITING: T0_S + 3600,
            events.SLEEPING: T0_S + 3000,
            events.RUNNING: None,
            events.HELD: None,
            events.DEAD_LETTERED: None,
        }
        for n, (status, wake_at_s) in enumerate(timers.items()):
            new_run(store, status, created_s=T0_S + n, status=status)
            if wake_at_s is not None:
                store.commit(Commit(status, [], wake_at_s=wake_at_s))
        for status in timers:
            assert send(store, status, "approve", 1) == 1
        sent_s = signal(1).sent_s
        assert {s: row_of(store, s).wake_at_s for s in timers} == {
            **timers,
            events.WAITING: sent_s,
        }
        assert store.due_runs(sent_s) == [events.WAITING]
        assert {row_of(store, s).status for s in timers} == set(timers)

    def test_parking_a_wait_makes_the_run_due_only_for_a_pending_signal_of_its_name(
        self, store: Store
    ) -> None:
        """The race the parking commit closes: a signal sent while the run was RUNNING (so
        that sending it woke nothing) is found pending when the wait parks."""
        new_run(store)
        deadline_s = T0_S + 3600

        def park(at_s: float, appended: list[Event] | None = None) -> float | None:
            store.commit(
                Commit(
                    "run-1",
                    appended or [],
                    status=events.WAITING,
                    wake_at_s=deadline_s,
                    wake_on_signal="approve",
                    at_s=at_s,
                )
            )
            found = row_of(store, "run-1")
            store.commit(Commit("run-1", [], status=events.RUNNING, wake_at_s=None))
            return found.wake_at_s

        assert park(T0_S + 1, [event(2)]) == deadline_s  # no signal at all
        send(store, "run-1", "other", 1)
        assert park(T0_S + 2) == deadline_s  # a signal of another name
        send(store, "run-1", "approve", 2)
        assert park(T0_S + 3) == T0_S + 3  # its own: due at once, without events...
        assert park(T0_S + 4, [event(3)]) == T0_S + 4  # ...and with them
        store.commit(Commit("run-1", [event(4, events.STEP_COMPLETED)], deliver_signal=2))
        assert park(T0_S + 5) == deadline_s  # once delivered it is no longer pending
        assert [s.delivered_step for s in store.signals("run-1")] == [None, 1]

    @pytest.mark.parametrize("pending", [False, True], ids=["no-signal", "signal-pending"])
    @pytest.mark.parametrize("stale", [-1, 1], ids=["older-token", "newer-token"])
    def test_a_parking_commit_with_a_stale_token_is_refused_whole(
        self, store: Store, pending: bool, stale: int
    ) -> None:
        """Only a status and ``wake_on_signal``: no event to carry the fence, so the run row's
        update alone tells whether it held, and the wake-up must not count as that update."""
        new_run(store)
        token = store.take_lease("run-1", 0, lease("me"))
        assert token == 1
        if pending:
            send(store, "run-1", "approve", 1)
        before = state_of(store, "run-1")
        parked = Commit(
            "run-1",
            status=events.WAITING,
            wake_on_signal="approve",
            at_s=T0_S + 7,
            fence=token + stale,
        )
        with pytest.raises(LeaseLost, match="run-1"):
            store.commit(parked)
        assert state_of(store, "run-1") == before

    def test_a_finished_tool_calls_commit_is_refused_whole(self, store: Store) -> None:
        """One event and its side effect, a tool call's whole commit: a stale fence, a gap in
        the log and a key already taken each refuse both, and the effect's own run and step
        are the ones recorded."""
        new_run(store)
        token = store.take_lease("run-1", 0, lease("me"))
        store.commit(Commit("run-1", [event(2)], side_effect=effect("taken"), fence=token))
        before = state_of(store, "run-1", ("taken", "k-2"))
        done = event(3, events.TOOL_COMPLETED, step=2, data='[["tool"],"ok"]')
        for commit, refused_as in (
            (
                Commit("run-1", [done], side_effect=effect("k-2", step=2), fence=token - 1),
                LeaseLost,
            ),
            (
                Commit("run-1", [event(4)], side_effect=effect("k-2", step=2), fence=token),
                LogGapError,
            ),
            (
                Commit("run-1", [done], side_effect=effect("taken", step=2), fence=token),
                SideEffectExistsError,
            ),
        ):
            with pytest.raises(refused_as):
                store.commit(commit)
            assert state_of(store, "run-1", ("taken", "k-2")) == before
        store.commit(
            Commit("run-1", [done], side_effect=effect("k-2", "run-2", step=5), fence=token)
        )
        assert store.load_log("run-1")[-1] == done
        assert store.side_effect("k-2") == effect("k-2", "run-2", step=5)
        # An effect that failed (its error recorded, no result) goes in whole too, and is
        # refused whole on a key already taken.
        failed = replace(effect("k-3", step=3, result=None), error="TypeError: not JSON")
        gone = event(4, events.STEP_FAILED, step=3, data='"TypeError: not JSON"')
        with pytest.raises(SideEffectExistsError):
            store.commit(
                Commit("run-1", [gone], side_effect=replace(failed, key="taken"), fence=token)
            )
        assert store.load_log("run-1")[-1] == done
        store.commit(Commit("run-1", [gone], side_effect=failed, fence=token))
        assert store.load_log("run-1")[-1] == gone
        assert store.side_effect("k-3") == failed

    def test_a_tool_result_from_its_parts_is_the_commit_it_stands_for(self, store: Store) -> None:
        """``commit_tool_result`` writes what ``commit`` writes for the ``Commit`` its parts
        stand for (``ToolResult.commit``), and is refused where that commit is, whole: a stale
        fence, a gap in the log, a key already taken."""
        runs = ("by-parts", "by-commit")
        for run_id in runs:
            new_run(store, run_id)
            assert store.take_lease(run_id, 0, lease("me")) == 1

        def parts(run_id: str, seq: int, key: str, fence: int = 1) -> ToolResult:
            done = Event(seq, events.TOOL_COMPLETED, seq, "ab" * 10, '[["t"],"ok"]', T0_S + seq)
            return ToolResult(run_id, fence, done, key, "send_email", '"ok"', T0_S + 50 + seq)

        for seq in (2, 3):
            store.commit_tool_result(parts("by-parts", seq, f"by-parts-{seq}"))
            store.commit(parts("by-commit", seq, f"by-commit-{seq}").commit())
        for seq in (2, 3):
            found = [store.side_effect(f"{run_id}-{seq}") for run_id in runs]
            assert found[0] == SideEffect(
                key=f"by-parts-{seq}",
                run_id="by-parts",
                step=seq,
                tool="send_email",
                args_fp="ab" * 10,
                result_text='"ok"',
                error=None,
                at_s=T0_S + 50 + seq,
            )
            assert found[1] == replace(found[0], key=f"by-commit-{seq}", run_id="by-commit")
        logs = [store.load_log(run_id)[1:] for run_id in runs]  # after each one's RUN_STARTED
        assert logs[0] == logs[1]
        assert [e.seq for e in logs[0]] == [2, 3]
        rows = [row_of(store, run_id) for run_id in runs]
        assert rows[0] == replace(rows[1], run_id="by-parts")
        keys = ("by-parts-2", "fresh")
        before = state_of(store, "by-parts", keys)
        for wrong, refused_as in (
            (parts("by-parts", 4, "fresh", fence=2), LeaseLost),
            (parts("by-parts", 5, "fresh"), LogGapError),
            (parts("by-parts", 4, "by-parts-2"), SideEffectExistsError),
        ):
            with pytest.raises(refused_as):
                store.commit_tool_result(wrong)
            assert state_of(store, "by-parts", keys) == before
            with pytest.raises(refused_as):
                store.commit(wrong.commit())
            assert state_of(store, "by-parts", keys) == before

    def test_an_eventless_commit_with_a_stale_token_writes_nothing_else_either(
        self, store: Store
    ) -> None:
        """The same fence as a parking commit's, for the other writes that may ride on a run
        row's update: they are the commit's, and it is refused whole."""
        new_run(store)
        store.commit(Commit("run-1", [event(2)], claim=claim("k-1")))
        token = store.take_lease("run-1", 0, lease("me"))
        assert token == 1
        keys = ("k-1", "k-2")
        before = state_of(store, "run-1", keys)
        with pytest.raises(LeaseLost, match="run-1"):
            store.commit(
                Commit(
                    "run-1",
                    status=events.HELD,
                    claim=claim("k-2"),
                    release_claim="k-1",
                    at_s=T0_S + 7,
                    fence=token + 1,
                )
            )
        assert state_of(store, "run-1", keys) == before

    @pytest.mark.parametrize("pending", [False, True], ids=["no-signal", "signal-pending"])
    def test_a_parking_commit_whose_fence_holds_lands(self, store: Store, pending: bool) -> None:
        """The wake-up changes no row when no signal is pending: that must not read as a fence
        that failed."""
        new_run(store)
        token = store.take_lease("run-1", 0, lease("me"))
        if pending:
            send(store, "run-1", "approve", 1)
        parked = Commit(
            "run-1", status=events.WAITING, wake_on_signal="approve", at_s=T0_S + 7, fence=token
        )
        store.commit(parked)
        found = row_of(store, "run-1")
        assert (found.status, found.wake_at_s) == (events.WAITING, T0_S + 7 if pending else None)
        assert found.updated_s == T0_S + 7

    @pytest.mark.parametrize("dies_in", ["event", "run-row"])
    def test_a_death_while_a_delivery_is_written_leaves_the_signal_pending(
        self, store: Store, backend: Backend, dies_in: str
    ) -> None:
        """Dying in the completion event is a death before the delivery is written; dying in
        the run row's status, after it, inside the same transaction."""
        new_run(store, status=events.WAITING)
        send(store, "run-1", "approve", 1)
        before = state_of(store, "run-1")
        completion = event(3, events.STEP_COMPLETED, data=codec.encode({"signal": 1}))
        status = events.RUNNING
        if dies_in == "event":
            completion = completion._replace(data=backend.dying_text(completion.data or ""))
        else:
            status = backend.dying_text(status)
        with pytest.raises(ProcessDeath):
            store.commit(
                Commit(
                    "run-1",
                    [event(2), completion],
                    status=status,
                    wake_at_s=None,
                    deliver_signal=1,
                    durable=True,
                )
            )
        assert state_of(store, "run-1") == before
        assert store.pending_signal("run-1", "approve") == signal(1)
        store.commit(Commit("run-1", [event(2), event(3, events.STEP_COMPLETED)], deliver_signal=1))
        assert store.signals("run-1") == [signal(1, delivered_step=1)]

    # -- commit: runs made by a commit, notes to a parent, signals carried ----------------

    def test_a_commit_creates_a_run_with_its_own_events(self, store: Store) -> None:
        new_run(store, "parent")
        child = replace(run_row("parent-1"), lease=lease("me"))
        first = run_started("parent-1")
        store.commit(Commit("parent", [event(2)], new_run=(child, first)))
        found = row_of(store, "parent-1")
        assert found.lease is not None and found.lease.owner == "me" and found.lease_token == 1
        assert store.load_log("parent-1") == [first]
        assert [e.seq for e in store.load_log("parent")] == [1, 2]

    def test_a_commit_whose_new_run_exists_is_refused_whole(self, store: Store) -> None:
        new_run(store, "parent")
        new_run(store, "taken")
        before = state_of(store, "parent"), state_of(store, "taken")
        with pytest.raises(RunExistsError, match="'taken'"):
            store.commit(
                Commit("parent", [event(2)], new_run=(run_row("taken"), run_started("taken")))
            )
        assert (state_of(store, "parent"), state_of(store, "taken")) == before

    def test_a_parent_note_goes_at_the_end_of_the_parents_log_and_makes_it_due(
        self, store: Store
    ) -> None:
        new_run(store, "parent", status=events.WAITING)
        store.commit(Commit("parent", [event(2)], status=events.WAITING))
        new_run(store, "child")
        note = ParentNote(run_id="parent", step=1, kind=events.STEP_COMPLETED, data='"done"')
        ending = event(2, events.RUN_COMPLETED, step=0)
        store.commit(
            Commit("child", [ending], status=events.COMPLETED, parent_note=note, at_s=T0_S + 9)
        )
        assert store.load_log("parent")[-1] == Event(
            3, events.STEP_COMPLETED, 1, None, '"done"', T0_S + 9
        )
        assert row_of(store, "parent").wake_at_s == T0_S + 9
        assert store.due_runs(T0_S + 9) == ["parent"]
        assert row_of(store, "child").status == events.COMPLETED

    def test_a_parent_note_to_an_ended_parent_writes_nothing_there(self, store: Store) -> None:
        new_run(store, "parent")
        store.commit(
            Commit("parent", [event(2, events.RUN_CANCELLED, step=0)], status=events.CANCELLED)
        )
        new_run(store, "child")
        before = state_of(store, "parent")
        note = ParentNote(run_id="parent", step=1, kind=events.STEP_COMPLETED, data='"late"')
        store.commit(
            Commit(
                "child",
                [event(2, events.RUN_COMPLETED, step=0)],
                status=events.COMPLETED,
                parent_note=note,
            )
        )
        assert state_of(store, "parent") == before
        assert row_of(store, "child").status == events.COMPLETED

    def test_a_held_parent_is_noted_but_not_made_due(self, store: Store) -> None:
        new_run(store, "parent", status=events.HELD)
        new_run(store, "child")
        note = ParentNote(run_id="parent", step=1, kind=events.STEP_COMPLETED, data='"done"')
        store.commit(Commit("child", [event(2, events.RUN_COMPLETED, step=0)], parent_note=note))
        assert store.load_log("parent")[-1].data == '"done"'
        assert row_of(store, "parent").wake_at_s is None

    def test_undelivered_signals_are_carried_to_the_run_a_commit_creates(
        self, store: Store
    ) -> None:
        new_run(store, "run-1")
        send(store, "run-1", "approve", 1)
        send(store, "run-1", "approve", 2)
        send(store, "run-1", "approve", 3)
        store.commit(Commit("run-1", [event(2), event(3, events.STEP_COMPLETED)], deliver_signal=1))
        ending = [event(4, step=2), event(5, events.RUN_CONTINUED, step=2)]
        store.commit(
            Commit(
                "run-1",
                ending,
                status=events.CONTINUED,
                new_run=(run_row("run-2"), run_started("run-2")),
                carry_signals="run-2",
            )
        )
        assert store.signals("run-1") == [
            signal(1, delivered_step=1),
            signal(2, delivered_step=2),
            signal(3, delivered_step=2),
        ]
        carried = store.signals("run-2")
        assert [(s.id, s.payload_text, s.sent_s) for s in carried] == [
            (1, signal(2).payload_text, signal(2).sent_s),
            (2, signal(3).payload_text, signal(3).sent_s),
        ]
        assert store.pending_signal("run-2", "approve") == replace(carried[0])

    # -- lifetime --------------------------------------------------------------------------

    def test_close_is_idempotent(self, store: Store) -> None:
        store.close()
        store.close()

    @pytest.mark.parametrize(
        "use",
        [
            lambda s: s.get_run("run-1"),
            lambda s: s.list_runs(),
            lambda s: s.load_log("run-1"),
            lambda s: s.commit(Commit("run-1", [event(2)])),
            lambda s: s.create_run(run_row("run-2"), run_started("run-2")),
            lambda s: s.side_effect("k"),
            lambda s: s.key_claim("k"),
            lambda s: s.due_runs(T0_S),
            lambda s: s.next_wake_s(),
        ],
        ids=[
            "get_run",
            "list_runs",
            "load_log",
            "commit",
            "create_run",
            "side_effect",
            "key_claim",
            "due_runs",
            "next_wake_s",
        ],
    )
    def test_use_after_close_is_a_storage_error(
        self, store: Store, use: Callable[[Store], Any]
    ) -> None:
        new_run(store)
        store.close()
        with pytest.raises(StorageError, match="closed"):
            use(store)

    def test_reopening_keeps_everything(
        self, store: Store, backend: Backend, opened: list[Store]
    ) -> None:
        new_run(store)
        store.commit(
            Commit(
                "run-1",
                [event(2)],
                status=events.SLEEPING,
                wake_at_s=T0_S + 60,
                side_effect=effect("k-1"),
                claim=claim("k-2"),
                durable=True,
            )
        )
        before = state_of(store, "run-1", ("k-1", "k-2"))
        again = backend.reopen(store)
        opened.append(again)
        assert state_of(again, "run-1", ("k-1", "k-2")) == before
        again.commit(Commit("run-1", [event(3)]))
        assert [e.seq for e in again.load_log("run-1")] == [1, 2, 3]

    def test_the_store_names_its_database_and_durability(
        self, store: Store, backend: Backend
    ) -> None:
        assert isinstance(store.path, str) and store.path
        assert store.durability in ("full", "process")
        assert backend.name.endswith(store.durability)


# -- SQLite files ----------------------------------------------------------------------------


def _pragma(path: Path | str, name: str) -> Any:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


def _schema(path: Path | str) -> list[tuple[str, str]]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT type, name FROM sqlite_master ORDER BY type, name").fetchall()


def _durabl_file(path: Path, events_count: int = 2) -> None:
    """A closed durabl database holding one run with ``events_count`` events."""
    with contextlib.closing(SQLiteStore(path)) as store:
        new_run(store)
        body = codec.encode("x" * 2000)
        store.commit(Commit("run-1", [event(seq, data=body) for seq in range(2, events_count + 1)]))


def _foreign_file(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
        conn.execute("INSERT INTO invoices (total) VALUES (12.5)")
        conn.commit()


def _signalled(store: Store) -> None:
    """One run with a signal delivered (id 1, at step 1) and one still pending (id 2)."""
    send(store, "run-1", "approve", 1)
    send(store, "run-1", "approve", 2)
    store.commit(Commit("run-1", [event(3, events.STEP_COMPLETED)], deliver_signal=1))


SIGNAL_REWRITES = [
    ("UPDATE signals SET delivered_step = 7 WHERE id = 1", "deliver-again"),
    ("UPDATE signals SET delivered_step = NULL WHERE id = 1", "undeliver"),
    ("UPDATE signals SET payload = '\"forged\"' WHERE id = 2", "forge-payload"),
    ("UPDATE signals SET name = 'other' WHERE id = 2", "rename"),
    ("UPDATE signals SET sent_s = 0 WHERE id = 2", "backdate"),
    ("UPDATE signals SET id = 5 WHERE id = 2", "renumber"),
    ("UPDATE signals SET run_id = 'run-2' WHERE id = 2", "move"),
    ("DELETE FROM signals WHERE id = 2", "delete-pending"),
    ("DELETE FROM signals", "delete-all"),
]
"""What no writer may do to the signals of ``_signalled``: a signal is delivered once and
otherwise never changed, and never deleted (``signals_delivered_once``,
``signals_never_deleted``). The store's own first delivery of a pending signal is the one
update they let through."""


def _files_in(directory: Path) -> dict[str, bytes]:
    return {entry.name: entry.read_bytes() for entry in sorted(directory.iterdir())}


class TestGroupCommit:
    """Commits from many threads at once share transactions; each keeps its own answer."""

    def test_commits_from_many_threads_all_land_in_their_own_logs(
        self, backend: Backend, tmp_path: Path, opened: list[Store]
    ) -> None:
        store = backend.open(tmp_path)
        opened.append(store)
        threads, per_thread = 8, 25
        for n in range(threads):
            new_run(store, f"run-{n}")
        start = threading.Barrier(threads)
        errors: list[BaseException] = []

        def drive(n: int) -> None:
            try:
                start.wait()
                for seq in range(2, 2 + per_thread):
                    key = f"k-{n}-{seq}"
                    store.commit(
                        Commit(
                            f"run-{n}",
                            [event(seq, events.STEP_COMPLETED)],
                            side_effect=effect(key, f"run-{n}", seq),
                            durable=True,
                        )
                    )
            except BaseException as exc:  # reported below, with the thread's name
                errors.append(exc)

        workers = [threading.Thread(target=drive, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert errors == []
        for n in range(threads):
            assert [e.seq for e in store.load_log(f"run-{n}")] == list(range(1, 2 + per_thread))
            assert store.side_effect(f"k-{n}-{per_thread + 1}") is not None

    def test_a_refused_commit_in_a_batch_undoes_only_itself(self, tmp_path: Path) -> None:
        store = SQLiteStore(tmp_path / "agent.db")
        try:
            for n in range(4):
                new_run(store, f"run-{n}")
            store.commit(Commit("run-0", [event(2)], side_effect=effect("taken", "run-0", 2)))
            outcomes: dict[int, BaseException | None] = {}

            def commit(n: int) -> None:
                key = "taken" if n == 2 else f"k-{n}"
                try:
                    store.commit(
                        Commit(
                            f"run-{n}",
                            [event(2 if n else 3), event(3 if n else 4)],
                            side_effect=effect(key, f"run-{n}", 3),
                            durable=True,
                        )
                    )
                    outcomes[n] = None
                except BaseException as exc:
                    outcomes[n] = exc

            # Hold the connection while four commits queue up, so that they share one batch.
            with store._lock:
                waiting = [threading.Thread(target=commit, args=(n,)) for n in range(4)]
                for thread in waiting:
                    thread.start()
                while len(store._queue) < 4:
                    time.sleep(0.001)
                before = (store.commits, store.transactions)
            for thread in waiting:
                thread.join()
            assert (store.commits - before[0], store.transactions - before[1]) == (4, 1)
            assert isinstance(outcomes.pop(2), SideEffectExistsError)
            assert outcomes == {0: None, 1: None, 3: None}
            assert [e.seq for e in store.load_log("run-2")] == [1]
            assert [e.seq for e in store.load_log("run-0")] == [1, 2, 3, 4]
            for n in (1, 3):
                assert [e.seq for e in store.load_log(f"run-{n}")] == [1, 2, 3]
                assert store.side_effect(f"k-{n}") is not None
            effect_row = store.side_effect("taken")
            assert effect_row is not None and effect_row.run_id == "run-0"
        finally:
            store.close()


    def test_commits_in_line_when_the_leader_fails_are_each_answered(self, tmp_path: Path) -> None:
        # The first commit in line leads; when it fails, the lead passes to the next one, so
        # that none of them is left waiting for a batch that will not come.
        store = SQLiteStore(tmp_path / "agent.db")
        for n in range(4):
            new_run(store, f"run-{n}")
        outcomes: dict[int, BaseException | None] = {}

        def commit(n: int) -> None:
            try:
                store.commit(
                    Commit(
                        f"run-{n}",
                        [event(2)],
                        side_effect=effect(f"k-{n}", f"run-{n}", 2),
                        durable=True,
                    )
                )
                outcomes[n] = None
            except BaseException as exc:
                outcomes[n] = exc

        with store._lock:
            waiting = [threading.Thread(target=commit, args=(n,)) for n in range(4)]
            for thread in waiting:
                thread.start()
            while len(store._queue) < 4:
                time.sleep(0.001)
            store.close()
        for thread in waiting:
            thread.join(timeout=30)
        assert not any(thread.is_alive() for thread in waiting)
        assert sorted(outcomes) == [0, 1, 2, 3]
        assert all(isinstance(e, StoreClosedError) for e in outcomes.values()), outcomes


class TestWritersTurns:
    """Under ``durability="full"`` a store takes its turn at writing (``durabl.store.turns``):
    an exclusive flock on the database's -wal, held for each write transaction."""

    HOLDER = (
        "import sys, time\n"
        "from durabl.store.turns import Turns\n"
        "Turns(sys.argv[1]).take()\n"
        "print('held', flush=True)\n"
        "time.sleep(120)\n"
    )

    @contextlib.contextmanager
    def _holder(self, path: Path) -> Iterator[None]:
        """Another process holding the turn at writing ``path`` for the block, then killed
        with SIGKILL: the kernel gives its turn back."""
        with subprocess.Popen(
            [sys.executable, "-c", self.HOLDER, str(path)], stdout=subprocess.PIPE, text=True
        ) as holder:
            try:
                assert holder.stdout is not None and holder.stdout.readline() == "held\n"
                yield
            finally:
                holder.kill()

    def _commit_in_thread(self, store: SQLiteStore, run_id: str) -> threading.Thread:
        def commit() -> None:
            store.commit(
                Commit(run_id, [event(2)], side_effect=effect(f"k-{run_id}", run_id, 2), durable=True)
            )

        thread = threading.Thread(target=commit)
        thread.start()
        return thread

    def test_a_full_store_waits_for_a_turn_a_killed_process_held(self, tmp_path: Path) -> None:
        path = tmp_path / "agent.db"
        store = SQLiteStore(path, durability="full")
        watcher = SQLiteStore(path, durability="process")
        try:
            new_run(store, "run-1")
            with self._holder(path):
                thread = self._commit_in_thread(store, "run-1")
                thread.join(timeout=0.5)
                assert thread.is_alive(), "the commit went ahead while another process wrote"
                assert [e.seq for e in watcher.load_log("run-1")] == [1]
            thread.join(timeout=30)
            assert not thread.is_alive()
            assert [e.seq for e in watcher.load_log("run-1")] == [1, 2]
        finally:
            watcher.close()
            store.close()

    def test_a_process_store_takes_no_turn(self, tmp_path: Path) -> None:
        # Its writes take tens of microseconds, which two lock calls would add to; it meets
        # other writers at SQLite's own lock.
        path = tmp_path / "agent.db"
        store = SQLiteStore(path, durability="process")
        try:
            new_run(store, "run-1")
            with self._holder(path):
                thread = self._commit_in_thread(store, "run-1")
                thread.join(timeout=30)
                assert not thread.is_alive()
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
        finally:
            store.close()

    def test_the_turn_is_given_back_however_a_write_ends(self, tmp_path: Path) -> None:
        path = tmp_path / "agent.db"
        store = SQLiteStore(path, durability="full")

        def free() -> bool:
            fd = os.open(f"{path}-wal", os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
            finally:
                os.close(fd)

        try:
            new_run(store, "run-1")
            assert free()
            store.commit(Commit("run-1", [event(2)], side_effect=effect("taken", "run-1", 2)))
            assert free()
            with pytest.raises(SideEffectExistsError):  # refused inside the transaction
                store.commit(Commit("run-1", [event(3)], side_effect=effect("taken", "run-1", 3)))
            assert free()
            with pytest.raises(ProcessDeath):  # a death in the middle of the transaction
                store.commit(Commit("run-1", [event(3, data=_DiesWhenBound('"x"'))]))
            assert free()
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
        finally:
            store.close()

    def test_a_forked_child_takes_a_turn_of_its_own(self, tmp_path: Path) -> None:
        # A descriptor inherited across fork shares its lock with the parent's: the child
        # opens the -wal again, so that it waits for the parent's turn like any other process.
        path = tmp_path / "agent.db"
        SQLiteStore(path, durability="full").close()
        keep = sqlite3.connect(path)  # keeps the -wal in place
        keep.execute("PRAGMA journal_mode=WAL").fetchall()
        keep.execute("SELECT 1 FROM sqlite_master").fetchall()
        turns = Turns(str(path))
        turns.take()
        try:
            pid = os.fork()
            if pid == 0:  # the child: wait for a turn, then leave at once
                try:
                    turns.take()
                    turns.give()
                finally:
                    os._exit(0)
            time.sleep(0.5)
            assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the child took the parent's turn"
        finally:
            turns.give()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        turns.close()
        keep.close()


class TestSQLiteFile:
    def test_runs_by_status_are_found_through_the_status_index(self, tmp_path: Path) -> None:
        # A worker lists RUNNING and HELD runs on every poll: reading every run instead would
        # cost more with each finished one.
        path = tmp_path / "agent.db"
        SQLiteStore(path).close()
        wanted = {"statuses": '["RUNNING","HELD"]', "workflow": None, "limit": -1}
        with contextlib.closing(sqlite3.connect(path)) as conn:
            plan = conn.execute("EXPLAIN QUERY PLAN " + Q["list_runs_by_status"], wanted)
            details = [row[3] for row in plan.fetchall()]
        assert any("USING INDEX runs_by_status" in d for d in details), details
        assert not any(d.startswith("SCAN runs") for d in details), details

    def test_a_new_database_is_marked_versioned_and_in_wal_mode(self, tmp_path: Path) -> None:
        path = tmp_path / "new.db"
        SQLiteStore(path).close()
        assert _pragma(path, "application_id") == APPLICATION_ID
        assert _pragma(path, "user_version") == SCHEMA_VERSION
        assert _pragma(path, "journal_mode") == "wal"

    def test_reopening_keeps_the_data_and_does_not_migrate_again(self, tmp_path: Path) -> None:
        path = tmp_path / "agent.db"
        _durabl_file(path, events_count=3)
        schema = _schema(path)
        for _ in range(3):
            with contextlib.closing(SQLiteStore(path)) as store:
                assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]
        assert _schema(path) == schema
        assert _pragma(path, "user_version") == SCHEMA_VERSION

    def test_a_database_from_a_newer_durabl_is_refused_naming_both_versions(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "future.db"
        _durabl_file(path)
        newer = SCHEMA_VERSION + 1
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute(f"PRAGMA user_version = {newer}")
        with pytest.raises(SchemaVersionError) as caught:
            SQLiteStore(path)
        text = str(caught.value)
        assert f"v{newer} " in text or f"v{newer}," in text
        assert f"v{SCHEMA_VERSION}." in text or f"v{SCHEMA_VERSION} " in text
        assert "newer" in text
        assert isinstance(caught.value, StorageError)
        assert _pragma(path, "user_version") == newer

    def test_a_foreign_sqlite_database_is_refused_and_left_untouched(self, tmp_path: Path) -> None:
        path = tmp_path / "billing.db"
        _foreign_file(path)
        before = _files_in(tmp_path)
        with pytest.raises(StorageError, match="not a durabl database"):
            SQLiteStore(path)
        assert _files_in(tmp_path) == before

    def test_a_foreign_database_with_only_a_user_version_is_refused(self, tmp_path: Path) -> None:
        path = tmp_path / "versioned.db"
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute("PRAGMA user_version = 7")
        with pytest.raises(StorageError, match="not a durabl database"):
            SQLiteStore(path)

    @pytest.mark.parametrize(
        "content",
        [b"name,total\nalice,12.5\n" * 20, b"\x00" * 4096, b"SQLite"],
        ids=["csv", "zeros", "short"],
    )
    def test_a_file_that_is_not_sqlite_is_refused_and_left_untouched(
        self, tmp_path: Path, content: bytes
    ) -> None:
        path = tmp_path / "notes.db"
        path.write_bytes(content)
        with pytest.raises(StorageError, match="not a durabl database"):
            SQLiteStore(path)
        assert _files_in(tmp_path) == {"notes.db": content}

    def test_a_truncated_database_is_refused_as_truncated(self, tmp_path: Path) -> None:
        path = tmp_path / "cut.db"
        _durabl_file(path, events_count=40)
        size = path.stat().st_size
        page = int.from_bytes(path.read_bytes()[16:18], "big")
        with open(path, "r+b") as handle:
            handle.truncate(size // 2 // page * page)
        with pytest.raises(StorageError, match="truncated"):
            SQLiteStore(path)

    def test_a_directory_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(StorageError, match="directory"):
            SQLiteStore(tmp_path)

    def test_a_path_in_a_missing_directory_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(StorageError, match="does not exist"):
            SQLiteStore(tmp_path / "no" / "such" / "dir" / "agent.db")
        assert not (tmp_path / "no").exists()

    def test_an_unknown_durability_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match="'full', 'process'"):
            SQLiteStore(tmp_path / "a.db", durability="paranoid")
        assert not (tmp_path / "a.db").exists()

    def test_a_read_only_store_reads_and_refuses_to_write(self, tmp_path: Path) -> None:
        path = tmp_path / "agent.db"
        _durabl_file(path)
        with contextlib.closing(SQLiteStore(path, read_only=True)) as reader:
            assert [e.seq for e in reader.load_log("run-1")] == [1, 2]
            with pytest.raises(StorageError):
                reader.commit(Commit("run-1", [event(3)], status=events.FAILED))
            with pytest.raises(StorageError):
                reader.create_run(run_row("run-2"), run_started("run-2"))
        with contextlib.closing(SQLiteStore(path)) as store:
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
            assert store.get_run("run-2") is None

    @pytest.mark.parametrize("make", ["missing", "empty"])
    def test_a_read_only_store_needs_an_existing_database(self, tmp_path: Path, make: str) -> None:
        path = tmp_path / "agent.db"
        if make == "empty":
            path.write_bytes(b"")
        with pytest.raises(StorageError):
            SQLiteStore(path, read_only=True)
        assert path.exists() == (make == "empty")

    @pytest.mark.parametrize(
        "statement",
        [
            "UPDATE events SET data = '\"forged\"' WHERE seq = 2",
            "DELETE FROM events WHERE seq = 2",
            "INSERT INTO events VALUES ('run-1', 4, 'STEP_STARTED', 1, NULL, NULL, 0, 0)",
            "INSERT INTO events VALUES ('run-1', 2, 'STEP_STARTED', 1, NULL, NULL, 0, 0)",
            "UPDATE side_effects SET result = '\"forged\"'",
            "DELETE FROM side_effects",
        ],
        ids=["update-event", "delete-event", "gap", "duplicate", "update-effect", "delete-effect"],
    )
    def test_the_database_itself_guards_the_log_against_any_writer(
        self, tmp_path: Path, statement: str
    ) -> None:
        path = tmp_path / "agent.db"
        with contextlib.closing(SQLiteStore(path)) as store:
            new_run(store)
            store.commit(Commit("run-1", [event(2)], side_effect=effect("k-1")))
        with (
            contextlib.closing(sqlite3.connect(path)) as conn,
            pytest.raises(sqlite3.DatabaseError),
        ):
            conn.execute(statement)
        with contextlib.closing(SQLiteStore(path)) as store:
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
            assert store.side_effect("k-1") == effect("k-1")

    @pytest.mark.parametrize(
        "statement", [sql for sql, _ in SIGNAL_REWRITES], ids=[i for _, i in SIGNAL_REWRITES]
    )
    def test_the_database_itself_guards_the_signals_against_any_writer(
        self, tmp_path: Path, statement: str
    ) -> None:
        path = tmp_path / "agent.db"
        with contextlib.closing(SQLiteStore(path)) as store:
            new_run(store)
            store.commit(Commit("run-1", [event(2)]))
            _signalled(store)
            before = store.signals("run-1")
        with (
            contextlib.closing(sqlite3.connect(path)) as conn,
            pytest.raises(sqlite3.DatabaseError) as caught,
        ):
            conn.execute(statement)
        assert isinstance(storage_error(str(path), caught.value), HistoryRewriteError)
        with contextlib.closing(SQLiteStore(path)) as store:
            assert store.signals("run-1") == before
            assert before == [signal(1, delivered_step=1), signal(2)]

    def test_no_wal_file_is_deleted_to_open_a_database(self, tmp_path: Path) -> None:
        path = tmp_path / "agent.db"
        first = SQLiteStore(path)
        try:
            new_run(first)
            first.commit(Commit("run-1", [event(2)], durable=True))
            assert os.path.exists(f"{path}-wal")
            with contextlib.closing(SQLiteStore(path)) as second:
                assert [e.seq for e in second.load_log("run-1")] == [1, 2]
        finally:
            first.close()

    # -- compaction in the file ----------------------------------------------------------------

    @pytest.mark.parametrize(
        "statement",
        [
            "UPDATE runs SET watermark = 2 WHERE run_id = 'run-1'",
            "UPDATE runs SET watermark = 0 WHERE run_id = 'run-1'",
            "DELETE FROM events WHERE run_id = 'run-1' AND seq = 4",
            "INSERT INTO events VALUES ('run-1', 3, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)",
            "INSERT INTO events VALUES ('run-1', 6, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)",
        ],
        ids=["watermark-back", "watermark-to-zero", "delete-kept", "refill-folded", "gap"],
    )
    def test_the_database_itself_guards_a_compacted_log(
        self, tmp_path: Path, statement: str
    ) -> None:
        path = tmp_path / "agent.db"
        with contextlib.closing(SQLiteStore(path)) as store:
            new_run(store)
            store.commit(Commit("run-1", [event(2), event(3), event(4)]))
            store.compact("run-1", 3, SNAPSHOT, 0)
        with (
            contextlib.closing(sqlite3.connect(path)) as conn,
            pytest.raises(sqlite3.DatabaseError),
        ):
            conn.execute(statement)
        with contextlib.closing(SQLiteStore(path)) as store:
            assert store.load_history("run-1") == (3, SNAPSHOT, [event(4)])

    def test_reclaim_rewrites_a_file_made_without_auto_vacuum_once(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        _durabl_file(path, events_count=300)
        with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
            conn.execute("PRAGMA journal_mode = DELETE")
            conn.execute("PRAGMA auto_vacuum = NONE")
            conn.execute("VACUUM")
            conn.execute("PRAGMA journal_mode = WAL")
        assert _pragma(path, "auto_vacuum") == 0
        with contextlib.closing(SQLiteStore(path)) as store:
            store.compact("run-1", 299, SNAPSHOT, 0)
            before, after = store.reclaim()
            assert after < before // 4
            assert after == path.stat().st_size
        assert _pragma(path, "auto_vacuum") == 2, "the rewrite left the file without auto_vacuum"
        assert _pragma(path, "freelist_count") == 0
        with contextlib.closing(SQLiteStore(path)) as store:
            assert store.load_history("run-1") == (299, SNAPSHOT, store.load_log("run-1"))
            assert [e.seq for e in store.load_log("run-1")] == [300]


# -- PostgreSQL databases --------------------------------------------------------------------


def _pg_rows(url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with pg_support.connect(url) as conn:
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


def _pg_schema(url: str) -> list[tuple[str, str, str]]:
    """Every table, index, function and trigger of the ``durabl`` schema."""
    return _pg_rows(
        url,
        "WITH durabl AS (SELECT oid FROM pg_namespace WHERE nspname = 'durabl') "
        "SELECT 'relation', relname, relkind::text FROM pg_class "
        "WHERE relnamespace IN (SELECT oid FROM durabl) "
        "UNION ALL SELECT 'function', proname, '' FROM pg_proc "
        "WHERE pronamespace IN (SELECT oid FROM durabl) "
        "UNION ALL SELECT 'trigger', tgname, tgrelid::regclass::text FROM pg_trigger "
        "WHERE NOT tgisinternal AND tgrelid::regclass::text LIKE 'durabl.%%' ORDER BY 1, 2",
    )


def _pg_meta(url: str) -> list[tuple[Any, ...]]:
    return _pg_rows(url, "SELECT application, schema_version, migrated_at, xmin::text FROM meta")


def _pg_durabl_database(url: str, events_count: int = 2) -> None:
    """A durabl database holding one run with ``events_count`` events and a side effect."""
    with contextlib.closing(PostgresStore(url)) as store:
        new_run(store)
        appended = [event(seq) for seq in range(2, events_count + 1)]
        store.commit(Commit("run-1", appended, side_effect=effect("k-1")))


def _pg_contents(url: str) -> tuple[Any, ...]:
    """Every row of durabl's tables."""
    return tuple(
        _pg_rows(url, f"SELECT * FROM durabl.{table} ORDER BY 1, 2")
        for table in ("runs", "events", "side_effects", "key_claims", "snapshots", "signals")
    )


def _refusal(url: str, exc: psycopg.Error) -> DurablError:
    """What the store makes of the server's refusal: the error its callers would see."""
    with contextlib.closing(PostgresStore(url)) as store:
        return store._error(exc)


FORGED = "INSERT INTO events (run_id, seq, kind, step, fp, data, at_s, crc, fence) VALUES "


@pytest.fixture
def pg_url(postgres_db: Callable[[], str]) -> str:
    return postgres_db()


class TestPostgresDatabase:
    @pytest.mark.parametrize(
        ("statement", "sqlstate", "refused_as"),
        [
            (
                FORGED + "('run-1', 4, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)",
                "DB002",
                LogGapError,
            ),
            (
                FORGED + "('run-1', 2, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)",
                "DB002",
                LogGapError,
            ),
            (
                FORGED + "('nope', 1, 'RUN_STARTED', 0, NULL, NULL, 0, 0, NULL)",
                "DB002",
                LogGapError,
            ),
            (FORGED + "('run-1', 3, 'STEP_STARTED', 1, NULL, NULL, 0, 0, 7)", "DB001", LeaseLost),
            ("UPDATE events SET data = '\"forged\"' WHERE seq = 2", "DB003", HistoryRewriteError),
            ("UPDATE events SET seq = seq + 100", "DB003", HistoryRewriteError),
            ("DELETE FROM events WHERE seq = 2", "DB003", HistoryRewriteError),
            ("DELETE FROM events", "DB003", HistoryRewriteError),
            ("TRUNCATE events", "DB003", HistoryRewriteError),
            ("UPDATE side_effects SET result = '\"forged\"'", "DB003", HistoryRewriteError),
            ("DELETE FROM side_effects", "DB003", HistoryRewriteError),
            ("TRUNCATE side_effects", "DB003", HistoryRewriteError),
        ],
        ids=[
            "gap",
            "duplicate",
            "no-such-run",
            "stale-fence",
            "update-event",
            "renumber-events",
            "delete-event",
            "delete-log",
            "truncate-events",
            "update-effect",
            "delete-effect",
            "truncate-effects",
        ],
    )
    def test_the_database_itself_guards_the_log_against_any_writer(
        self, pg_url: str, statement: str, sqlstate: str, refused_as: type[DurablError]
    ) -> None:
        _pg_durabl_database(pg_url)
        before = _pg_contents(pg_url)
        with pg_support.connect(pg_url) as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        assert caught.value.sqlstate == sqlstate, caught.value
        assert isinstance(_refusal(pg_url, caught.value), refused_as)
        assert _pg_contents(pg_url) == before
        with contextlib.closing(PostgresStore(pg_url)) as store:
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
            assert store.side_effect("k-1") == effect("k-1")

    @pytest.mark.parametrize(
        "statement",
        [*(sql for sql, _ in SIGNAL_REWRITES), "TRUNCATE signals"],
        ids=[*(i for _, i in SIGNAL_REWRITES), "truncate"],
    )
    def test_the_database_itself_guards_the_signals_against_any_writer(
        self, pg_url: str, statement: str
    ) -> None:
        _pg_durabl_database(pg_url)
        with contextlib.closing(PostgresStore(pg_url)) as store:
            _signalled(store)
        before = _pg_contents(pg_url)
        with pg_support.connect(pg_url) as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        assert caught.value.sqlstate == "DB003", caught.value
        assert isinstance(_refusal(pg_url, caught.value), HistoryRewriteError)
        assert _pg_contents(pg_url) == before
        with contextlib.closing(PostgresStore(pg_url)) as store:
            assert store.signals("run-1") == [signal(1, delivered_step=1), signal(2)]

    def test_the_store_reports_each_refusal_as_its_own_error(self, pg_url: str) -> None:
        _pg_durabl_database(pg_url)
        with contextlib.closing(PostgresStore(pg_url)) as store:
            token = store.take_lease("run-1", 0, lease("me"))
            assert token == 1
            before = state_of(store, "run-1", ("k-1", "k-2"))
            refusals: list[tuple[Commit, type[DurablError]]] = [
                (Commit("run-1", [event(4)], fence=token), LogGapError),
                (Commit("run-1", [event(2)], fence=token), LogGapError),
                (Commit("run-1", [event(3)], fence=token - 1), LeaseLost),
                (Commit("run-1", [], status=events.FAILED, fence=token + 1), LeaseLost),
                (Commit("run-1", [event(3)], side_effect=effect("k-1")), SideEffectExistsError),
            ]
            for commit, refused_as in refusals:
                with pytest.raises(refused_as):
                    store.commit(replace(commit, claim=claim("k-2"), status=events.FAILED))
                assert state_of(store, "run-1", ("k-1", "k-2")) == before
            store.commit(Commit("run-1", [event(3)], fence=token))
            assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]

    @pytest.mark.parametrize(
        ("statement", "sqlstate"),
        [
            ("UPDATE runs SET watermark = 2 WHERE run_id = 'run-1'", "DB004"),
            ("UPDATE runs SET watermark = 0 WHERE run_id = 'run-1'", "DB004"),
            ("DELETE FROM events WHERE run_id = 'run-1' AND seq = 4", "DB003"),
            (FORGED + "('run-1', 3, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)", "DB002"),
            (FORGED + "('run-1', 6, 'STEP_STARTED', 1, NULL, NULL, 0, 0, NULL)", "DB002"),
        ],
        ids=["watermark-back", "watermark-to-zero", "delete-kept", "refill-folded", "gap"],
    )
    def test_the_database_itself_guards_a_compacted_log(
        self, pg_url: str, statement: str, sqlstate: str
    ) -> None:
        with contextlib.closing(PostgresStore(pg_url)) as store:
            new_run(store)
            store.commit(Commit("run-1", [event(2), event(3), event(4)]))
            store.compact("run-1", 3, SNAPSHOT, 0)
        with pg_support.connect(pg_url) as conn, pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
        assert caught.value.sqlstate == sqlstate, caught.value
        assert isinstance(_refusal(pg_url, caught.value), (HistoryRewriteError, LogGapError))
        with contextlib.closing(PostgresStore(pg_url)) as store:
            assert store.load_history("run-1") == (3, SNAPSHOT, [event(4)])

    # -- the schema and its versions ---------------------------------------------------------

    def test_a_new_database_gets_the_durabl_schema_and_its_version(self, pg_url: str) -> None:
        PostgresStore(pg_url).close()
        [(application, version, _at, _xmin)] = _pg_meta(pg_url)
        assert (application, version) == ("durabl", pg.SCHEMA_VERSION)
        tables = [name for kind, name, rel in _pg_schema(pg_url) if rel == "r"]
        assert sorted(tables) == sorted(pg.DURABL_TABLES)
        assert _pg_rows(pg_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'") == []

    def test_reopening_keeps_the_data_and_does_not_migrate_again(self, pg_url: str) -> None:
        _pg_durabl_database(pg_url, events_count=3)
        schema, meta = _pg_schema(pg_url), _pg_meta(pg_url)
        for _ in range(3):
            with contextlib.closing(PostgresStore(pg_url)) as store:
                assert [e.seq for e in store.load_log("run-1")] == [1, 2, 3]
        assert (_pg_schema(pg_url), _pg_meta(pg_url)) == (schema, meta)

    def test_stores_opening_a_new_database_at_once_migrate_it_once(self, pg_url: str) -> None:
        """Workers on several hosts often start together against a database nobody has used:
        one of them migrates it, the others wait for it and find it done."""
        count = 8
        start = threading.Barrier(count)
        stores: list[Store] = []
        errors: list[BaseException] = []

        def open_() -> None:
            try:
                start.wait()
                stores.append(PostgresStore(pg_url))
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=open_) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        try:
            assert errors == []
            assert len(stores) == count
            [(_, version, _at, meta_xmin)] = _pg_meta(pg_url)
            assert version == pg.SCHEMA_VERSION
            [(tables_xmin,)] = _pg_rows(
                pg_url, "SELECT xmin::text FROM pg_class WHERE oid = 'durabl.events'::regclass"
            )
            assert meta_xmin == tables_xmin, "the meta row was written again after the migration"
            new_run(stores[0])
            assert [e.seq for e in stores[-1].load_log("run-1")] == [1]
        finally:
            for store in stores:
                store.close()

    def test_a_database_from_a_newer_durabl_is_refused_naming_both_versions(
        self, pg_url: str
    ) -> None:
        _pg_durabl_database(pg_url)
        newer = pg.SCHEMA_VERSION + 1
        with pg_support.connect(pg_url) as conn:
            conn.execute("UPDATE meta SET schema_version = %s", (newer,))
        before = (_pg_schema(pg_url), _pg_meta(pg_url), _pg_contents(pg_url))
        for read_only in (False, True):
            with pytest.raises(SchemaVersionError) as caught:
                PostgresStore(pg_url, read_only=read_only)
            text = str(caught.value)
            assert f"v{newer}," in text and f"v{pg.SCHEMA_VERSION}." in text
            assert "newer" in text and pg_support.name_of(pg_url) in text
        assert (_pg_schema(pg_url), _pg_meta(pg_url), _pg_contents(pg_url)) == before

    @pytest.mark.parametrize(
        "setup",
        [
            ["CREATE TABLE durabl.invoices (id SERIAL PRIMARY KEY, total NUMERIC)"],
            ["CREATE TABLE durabl.runs (id SERIAL PRIMARY KEY, distance_km REAL)"],
            [
                "CREATE TABLE durabl.meta (application TEXT, schema_version INTEGER)",
                "INSERT INTO durabl.meta VALUES ('billing', 1)",
            ],
        ],
        ids=["other-tables", "a-table-named-like-durabls", "another-apps-meta"],
    )
    def test_another_applications_durabl_schema_is_refused_and_left_untouched(
        self, pg_url: str, setup: list[str]
    ) -> None:
        with pg_support.connect(pg_url) as conn:
            conn.execute("CREATE SCHEMA durabl")
            for statement in setup:
                conn.execute(statement)
        before = _pg_schema(pg_url)
        for read_only in (False, True):
            with pytest.raises(ForeignSchemaError) as caught:
                PostgresStore(pg_url, read_only=read_only)
            assert "not durabl's" in str(caught.value)
            assert "\n" not in str(caught.value)
        assert _pg_schema(pg_url) == before

    def test_a_foreign_table_beside_durabls_own_is_refused(self, pg_url: str) -> None:
        _pg_durabl_database(pg_url)
        with pg_support.connect(pg_url) as conn:
            conn.execute("CREATE TABLE durabl.invoices (id SERIAL PRIMARY KEY)")
        before = (_pg_schema(pg_url), _pg_contents(pg_url))
        with pytest.raises(ForeignSchemaError, match="invoices"):
            PostgresStore(pg_url)
        assert (_pg_schema(pg_url), _pg_contents(pg_url)) == before

    def test_the_applications_own_tables_in_other_schemas_are_left_alone(self, pg_url: str) -> None:
        """durabl shares a database with the application: tables of the same names as its own,
        in ``public`` or another schema, are the application's, and durabl never reads them."""
        app_tables = {
            "public.runs": "(run_id TEXT PRIMARY KEY, miles REAL)",
            "public.events": "(id SERIAL PRIMARY KEY, title TEXT)",
            "public.invoices": "(id SERIAL PRIMARY KEY, total NUMERIC)",
            "billing.meta": "(application TEXT, schema_version INTEGER)",
        }
        with pg_support.connect(pg_url) as conn:
            conn.execute("CREATE SCHEMA billing")
            for table, columns in app_tables.items():
                conn.execute(f"CREATE TABLE {table} {columns}")
            conn.execute("INSERT INTO public.runs VALUES ('run-1', 5.5)")
            conn.execute("INSERT INTO public.events (title) VALUES ('launch')")
            conn.execute("INSERT INTO billing.meta VALUES ('billing', 99)")

        def app_rows() -> list[list[tuple[Any, ...]]]:
            return [_pg_rows(pg_url, f"SELECT * FROM {table} ORDER BY 1") for table in app_tables]

        before = app_rows()
        with contextlib.closing(PostgresStore(pg_url)) as store:
            new_run(store)
            store.commit(Commit("run-1", [event(2)], side_effect=effect("k-1")))
            assert [e.seq for e in store.load_log("run-1")] == [1, 2]
        with contextlib.closing(PostgresStore(pg_url, read_only=True)) as store:
            assert row_of(store, "run-1").workflow == "research_agent"
        assert app_rows() == before
        assert [version for _, version, _, _ in _pg_meta(pg_url)] == [pg.SCHEMA_VERSION]

    def test_an_empty_durabl_schema_is_taken_as_a_new_database(self, pg_url: str) -> None:
        with pg_support.connect(pg_url) as conn:
            conn.execute("CREATE SCHEMA durabl")
        _pg_durabl_database(pg_url)
        assert [version for _, version, _, _ in _pg_meta(pg_url)] == [pg.SCHEMA_VERSION]

    # -- reading only ------------------------------------------------------------------------

    def test_a_read_only_store_reads_and_refuses_to_write(self, pg_url: str) -> None:
        _pg_durabl_database(pg_url)
        before = _pg_contents(pg_url)
        with contextlib.closing(PostgresStore(pg_url, read_only=True)) as reader:
            assert [e.seq for e in reader.load_log("run-1")] == [1, 2]
            with pytest.raises(StorageError, match="read-only"):
                reader.commit(Commit("run-1", [event(3)], status=events.FAILED))
            with pytest.raises(StorageError, match="read-only"):
                reader.create_run(run_row("run-2"), run_started("run-2"))
        assert _pg_contents(pg_url) == before

    def test_a_read_only_store_needs_an_initialised_database(self, pg_url: str) -> None:
        with pytest.raises(StorageError, match="not an initialised durabl database"):
            PostgresStore(pg_url, read_only=True)
        assert _pg_schema(pg_url) == []

    def test_an_unknown_durability_is_refused_before_connecting(self) -> None:
        with pytest.raises(ValueError, match="'full', 'process'"):
            PostgresStore(f"{pg_support.SERVER}/no_such_database", durability="paranoid")
