"""The exception tree: errors carry their fields, and what the database refuses arrives typed."""

from __future__ import annotations

import copy
import pickle
import re
import sqlite3
from pathlib import Path

import pytest

from durabl import StorageError, codec, events
from durabl.errors import (
    EventChecksumError,
    HistoryRewriteError,
    LeaseLost,
    LogGapError,
    SideEffectExistsError,
    SQLiteReadOnlyError,
    described,
)
from durabl.events import Event
from durabl.store import Commit, RunRow, SideEffect, SQLiteStore
from durabl.store.schema import MIGRATIONS, TRIGGERS_BY_MESSAGE
from durabl.store.sqlite_errors import TRIGGER_ERRORS, storage_error


def test_every_trigger_of_the_schema_raises_a_class_of_its_own() -> None:
    created = {n for _, script in MIGRATIONS for n in re.findall(r"CREATE TRIGGER (\w+)", script)}
    guards = {n for _, s in MIGRATIONS for n in re.findall(r"CREATE TRIGGER (\w+) BEFORE", s)}
    # The one trigger that refuses nothing writes a step's event and its side effect.
    assert created - guards == {"events_with_effects_insert"}
    assert set(TRIGGERS_BY_MESSAGE.values()) == guards
    assert set(TRIGGER_ERRORS) == guards


def test_a_refinement_is_reported_by_the_class_it_refines() -> None:
    error = EventChecksumError(path="x.db", run_id="r1", seq=4)
    assert isinstance(error, StorageError)
    assert described(error) == f"StorageError: {error}"
    assert described(ValueError("no")) == "ValueError: no"


def test_an_error_survives_a_copy_and_a_pickle_with_its_fields() -> None:
    error = SideEffectExistsError(path="x.db", key="k-1", run_id="r1", step=3)
    for again in (copy.copy(error), pickle.loads(pickle.dumps(error))):
        assert type(again) is SideEffectExistsError
        assert str(again) == str(error)
        assert (again.key, again.run_id, again.step) == ("k-1", "r1", 3)


@pytest.fixture
def store(tmp_path: Path) -> SQLiteStore:
    made = SQLiteStore(tmp_path / "errors.db")
    row = RunRow(
        run_id="r1",
        workflow="w",
        input_text="{}",
        status=events.RUNNING,
        result_text=None,
        error=None,
        created_s=1.0,
        updated_s=1.0,
        wake_at_s=None,
        watermark=0,
    )
    made.create_run(row, Event(1, events.RUN_STARTED, 0, None, codec.encode({}), 1.0))
    return made


def effect(key: str, step: int) -> SideEffect:
    return SideEffect(
        key=key,
        run_id="r1",
        step=step,
        tool="t",
        args_fp="fp",
        result_text="1",
        error=None,
        at_s=2.0,
    )


def test_a_second_side_effect_for_a_key_names_the_key_run_and_step(store: SQLiteStore) -> None:
    store.commit(Commit("r1", [], side_effect=effect("k-1", 1)))
    with pytest.raises(SideEffectExistsError) as caught:
        store.commit(Commit("r1", [], side_effect=effect("k-1", 2)))
    assert (caught.value.key, caught.value.run_id, caught.value.step) == ("k-1", "r1", 2)


def test_a_trigger_refusal_arrives_as_its_class(store: SQLiteStore) -> None:
    with pytest.raises(LogGapError) as gap:
        store.commit(Commit("r1", [Event(5, events.STEP_STARTED, 1, None, None, 2.0)]))
    assert gap.value.rule == "an event seq must extend an existing run's log by exactly one"
    with pytest.raises(LeaseLost):
        store.commit(Commit("r1", [Event(2, events.STEP_STARTED, 1, None, None, 2.0)], fence=9))
    store.close()
    conn = sqlite3.connect(store.path)
    try:
        with pytest.raises(sqlite3.IntegrityError) as refused:
            conn.execute("UPDATE events SET data = 'x'")
        assert isinstance(storage_error(store.path, refused.value), HistoryRewriteError)
        conn.execute("PRAGMA query_only = ON")
        with pytest.raises(sqlite3.OperationalError) as read_only:
            conn.execute("DELETE FROM key_claims")
        assert isinstance(storage_error(store.path, read_only.value), SQLiteReadOnlyError)
    finally:
        conn.close()
