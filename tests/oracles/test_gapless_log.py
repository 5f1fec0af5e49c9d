"""Oracle: the log is gapless, append-only and checksummed, enforced by the database itself.

Per-run seq numbers are exactly 1..N after normal runs, crashes and resumes, retries, timers and
many interleaved runs. The invariants are checked in the database, and a writer that is not
durabl (plain ``sqlite3``, plain psycopg) is refused a gap, a duplicate, an UPDATE and a DELETE.
A row damaged behind the triggers' back is refused loudly when the log is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durabl import ModelCall, Sleep, StorageError, ToolCall, ToolFailed, codec, crashpoints
from durabl.store import open_store

from .support import (
    Clock,
    Database,
    Databases,
    World,
    assert_gapless,
    connect,
    crash,
    drive_to_rest,
    event_rows,
    kinds,
    refusal,
    unguarded,
)

NAME = "oracle_gapless.mixed"


def mixed(ctx: Any, label: str, wait_s: float) -> Any:
    plan = yield ModelCall(f"plan {label}")
    n = yield ToolCall("flaky", {"n": len(label)})
    try:
        outcome = yield ToolCall("broken", {"why": label})
    except ToolFailed as failed:
        outcome = failed.error_type
    ctx.now()
    yield Sleep(seconds=wait_s)
    sent = yield ToolCall("send", {"to": label, "body": plan["text"]})
    return {"n": n, "sent": sent, "outcome": outcome}


WORKFLOWS = {NAME: mixed}


def test_normal_runs_with_retries_and_timers_are_gapless(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAME, {"label": "a", "wait_s": 60})
    state = drive_to_rest(rt, clock, run_id)
    assert state.status == "COMPLETED"
    found = kinds(db, run_id)
    assert "STEP_RETRY" in found and "TIMER_FIRED" in found and "STEP_FAILED" in found
    assert_gapless(db)


@pytest.mark.parametrize("point", crashpoints.ALL)
def test_crashes_and_resumes_leave_the_log_gapless(
    tmp_path: Path, databases: Databases, point: str, clock: Clock, runtime: Any
) -> None:
    occurrence = 0
    while True:
        occurrence += 1
        db = databases.new(f"{point}-{occurrence}")
        (tmp_path / str(occurrence)).mkdir()
        world = World(tmp_path / str(occurrence))
        rt = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools())

        def first_process(rt: Any = rt) -> None:
            drive_to_rest(rt, clock, rt.start(NAME, {"label": "b", "wait_s": 5}, run_id="g"))

        if not crash(point, occurrence, first_process):
            break
        assert_gapless(db)
        fresh = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools())
        state = drive_to_rest(fresh, clock, "g")
        assert state.status == "COMPLETED", (point, occurrence, state)
        assert "RUN_RESUMED" in kinds(db, "g")
        assert_gapless(db)
        for process in (rt, fresh):  # gone before the next case: a server counts connections
            process.close()
    reachable = point not in (crashpoints.AFTER_DEAD_LETTERED,)
    assert (occurrence > 1) == reachable, f"{point} reached {occurrence - 1} times"


def test_many_interleaved_runs_each_keep_their_own_gapless_seq(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    first = runtime(WORKFLOWS)
    second = runtime(WORKFLOWS)
    ids = []
    for i in range(8):
        rt = first if i % 2 else second
        ids.append(rt.start(NAME, {"label": f"r{i}", "wait_s": 10 * (8 - i)}, run_id=f"run-{i}"))
    for _ in range(16):
        clock.advance(7)
        first.tick()
        second.tick()
        second.resume_all()
    for run_id in ids:
        assert first.state(run_id).status == "COMPLETED"
    assert_gapless(db)
    rows = event_rows(db)
    first_s = min(r[6] for r in rows if r[0] == "run-0")
    last_s = max(r[6] for r in rows if r[0] == "run-0")
    meanwhile = {r[0] for r in rows if first_s < r[6] < last_s}
    assert len(meanwhile) >= 6, "the runs did not actually interleave"


def _completed_run(db: Database, runtime: Any, clock: Clock) -> tuple[str, int]:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAME, {"label": "c", "wait_s": 0})
    assert drive_to_rest(rt, clock, run_id).status == "COMPLETED"
    rt.close()
    return run_id, len(event_rows(db, run_id))


def _insert(conn: Any, run_id: str, seq: int) -> None:
    data = codec.encode({"forged": True})
    crc = codec.checksum(seq, "STEP_COMPLETED", 99, None, data, 1.0)
    conn.execute(
        "INSERT INTO events (run_id, seq, kind, step, fp, data, at_s, crc) "
        "VALUES (?, ?, 'STEP_COMPLETED', 99, NULL, ?, 1.0, ?)",
        (run_id, seq, data, crc),
    )


def test_the_database_refuses_a_gap_and_a_duplicate(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    run_id, n = _completed_run(db, runtime, clock)
    before = event_rows(db)
    with connect(db) as conn:
        for seq in (n + 2, n + 100, n, 1, 0):
            with pytest.raises(refusal(db), match="exactly one"):
                _insert(conn, run_id, seq)
    assert event_rows(db) == before
    with connect(db) as conn:
        _insert(conn, run_id, n + 1)
    assert len(event_rows(db, run_id)) == n + 1, "the control insert (seq N+1) must be accepted"


@pytest.mark.parametrize("seq", [0, 1, 2])
def test_the_database_refuses_an_event_for_a_run_that_does_not_exist(
    db: Database, seq: int
) -> None:
    open_store(db).close()
    with connect(db) as conn, pytest.raises(refusal(db), match="exactly one"):
        _insert(conn, "a-run-that-does-not-exist", seq)
    assert event_rows(db) == []


def test_the_database_refuses_update_and_delete_of_an_event(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    run_id, n = _completed_run(db, runtime, clock)
    before = event_rows(db)
    with connect(db) as conn:
        for sql in (
            "UPDATE events SET data = '{}' WHERE run_id = ? AND seq = 3",
            "UPDATE events SET seq = seq + 1000 WHERE run_id = ?",
            "UPDATE events SET crc = 0 WHERE run_id = ?",
        ):
            with pytest.raises(refusal(db), match="append-only"):
                conn.execute(sql, (run_id,))
        for sql in (
            "DELETE FROM events WHERE run_id = ? AND seq = 2",
            f"DELETE FROM events WHERE run_id = ? AND seq = {n}",
            "DELETE FROM events WHERE run_id = ?",
        ):
            with pytest.raises(refusal(db), match="only a compacted prefix"):
                conn.execute(sql, (run_id,))
    assert event_rows(db) == before


def _flip_one_byte(text: str) -> str:
    index = next(i for i, ch in enumerate(text) if ch.isalnum())
    return text[:index] + chr(ord(text[index]) ^ 1) + text[index + 1 :]


@pytest.mark.parametrize("column", ["data", "at_s", "step"])
def test_a_damaged_event_is_refused_loudly_naming_its_seq(
    databases: Databases, db: Database, clock: Clock, world: World, runtime: Any, column: str
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAME, {"label": "d", "wait_s": 60})
    assert rt.state(run_id).status == "SLEEPING"
    rows = event_rows(db, run_id)
    target = next(r for r in rows if r[2] == "STEP_COMPLETED")
    seq = target[1]
    rt.close()
    damaged = databases.copy(db, "damaged")
    new_value = {"data": _flip_one_byte(target[5]), "at_s": target[6] + 1e-6, "step": target[3] + 1}
    with unguarded(damaged, "events") as conn:
        conn.execute(
            f"UPDATE events SET {column} = ? WHERE run_id = ? AND seq = ?",
            (new_value[column], run_id, seq),
        )
    if column == "data":
        codec.decode(new_value["data"])
    after_damage = event_rows(damaged)

    fresh = runtime(WORKFLOWS, db=damaged)
    expected = rf"seq {seq} of run {run_id} fails its checksum"
    with pytest.raises(StorageError, match=expected):
        fresh.state(run_id)
    with pytest.raises(StorageError, match=expected):
        fresh.replay(run_id)
    with pytest.raises(StorageError, match=expected):
        fresh.resume(run_id)
    clock.advance(3600)
    reported = fresh.tick()
    assert [s.run_id for s in reported] == [run_id]
    assert reported[0].error is not None and f"seq {seq} of run {run_id}" in reported[0].error
    assert event_rows(damaged) == after_damage, "damaged history was extended"
    assert world.calls["send"] == 0
