"""Oracle: no duplicate side effects.

Tools append to a real outbox file. The process dies at every crash point, at every occurrence,
of multi-tool workflows; a brand-new Runtime on the same database then finishes the run. The
world must see each IDEMPOTENT effect exactly once (the tool deduplicates on the key durabl hands
it) and each AT_MOST_ONCE effect at most once: after a death inside its ambiguous window the step
is dead-lettered, never guessed, and the operator's redrive / resolve / cancel is recorded in the
log. The side_effects table holds one row per key and never overwrites one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durabl import (
    DeadLetteredError,
    InvalidStateError,
    ModelCall,
    Sleep,
    StorageError,
    ToolCall,
    codec,
    crashpoints,
)
from durabl.events import Event
from durabl.store import Commit, SideEffect, open_store

from .support import (
    Clock,
    Database,
    Databases,
    World,
    assert_effects_match_log,
    assert_gapless,
    connect,
    crash,
    drive_to_rest,
    event_rows,
    kinds,
    refusal,
    side_effect_rows,
)

IDEM = "oracle_no_dup.idempotent"
MIXED = "oracle_no_dup.mixed"
WINDOW = (crashpoints.AFTER_TOOL_DISPATCHED, crashpoints.AFTER_TOOL_RETURNED)


def idempotent(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"draft for {to}")
    a = yield ToolCall("send", {"to": to, "body": "one"})
    b = yield ToolCall("send", {"to": to, "body": "two"}, idempotency_key=f"two-{ctx.run_id}")
    yield Sleep(seconds=30)
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def mixed(ctx: Any, to: str) -> Any:
    a = yield ToolCall("send", {"to": to, "body": "receipt"})
    c1 = yield ToolCall("charge", {"amount": 5})
    c2 = yield ToolCall("charge", {"amount": 7}, idempotency_key=f"charge-{ctx.run_id}")
    b = yield ToolCall("send", {"to": to, "body": "done"})
    return [a, c1, c2, b]


WORKFLOWS = {IDEM: idempotent, MIXED: mixed}
INPUT = {"to": "ops@example.com"}
RUN = "run-1"


def reference(
    tmp_path: Path, databases: Databases, runtime: Any, name: str
) -> tuple[str, list[dict[str, Any]]]:
    folder = tmp_path / "reference"
    folder.mkdir(exist_ok=True)
    world = World(folder)
    clock = Clock()
    db = databases.new(f"reference/{name}")
    rt = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools(), clock=clock)
    run_id = rt.start(name, INPUT, run_id=RUN)
    state = drive_to_rest(rt, clock, run_id)
    assert state.status == "COMPLETED"
    return codec.encode(state.result), world.outbox.records()


def effect_counts(world: World) -> dict[tuple[str, str], int]:
    counts: dict[tuple[str, str], int] = {}
    for record in world.outbox.records():
        what = (record["tool"], str(record.get("body", record.get("amount"))))
        counts[what] = counts.get(what, 0) + 1
    return counts


def last_started_tool(db: Database, run_id: str) -> str | None:
    """The tool whose call the log shows in flight (started, no outcome), if any. An
    IDEMPOTENT tool with a derived key shows none: its opening commits with its outcome."""
    for row in reversed(event_rows(db, run_id)):
        if row[2] in ("STEP_COMPLETED", "STEP_FAILED"):
            return None
        if row[2] == "STEP_STARTED":
            canonical = codec.decode(row[5])
            return canonical[1] if canonical[0] == "tool" else None
    return None


def operate(rt: Any, world: World, run_id: str) -> str:
    """What a careful operator does: look at the world, then resolve or redrive."""
    [letter] = rt.dead_letters()
    assert letter.run_id == run_id
    assert "charge" in letter.step_description
    assert "AT_MOST_ONCE" in letter.reason
    key = letter.idempotency_key or f"durabl:{run_id}:{letter.step}"
    seen = world.outbox.find(key)
    if seen is not None:
        rt.resolve(run_id, {"charged": seen["amount"]})
        return "DLQ_RESOLVED"
    rt.redrive(run_id)
    return "DLQ_REDRIVEN"


def check_case(
    runtime: Any,
    name: str,
    point: str,
    occurrence: int,
    folder: Path,
    db: Database,
    expected: tuple[Any, Any],
) -> bool:
    """One (point, occurrence) case: die there, recover in a new Runtime, check the world."""
    expected_result, expected_effects = expected
    world, clock = World(folder), Clock()
    rt = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools(), clock=clock)

    def first_process() -> None:
        drive_to_rest(rt, clock, rt.start(name, INPUT, run_id=RUN))

    if not crash(point, occurrence, first_process):
        return False
    assert_effects_match_log(db)
    effects_at_death = side_effect_rows(db)
    in_window_of = last_started_tool(db, RUN) if point in WINDOW else None

    fresh = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools(), clock=clock)
    state = drive_to_rest(fresh, clock, RUN)
    if in_window_of == "charge":
        assert state.status == "DEAD_LETTERED"
        assert all(n <= 1 for n in effect_counts(world).values()), effect_counts(world)
        recorded = operate(fresh, world, RUN)
        assert recorded in kinds(db, RUN)
        state = drive_to_rest(fresh, clock, RUN)
    assert state.status == "COMPLETED", state
    assert fresh.dead_letters() == []
    assert codec.encode(state.result) == expected_result
    assert effect_counts(world) == expected_effects
    after = side_effect_rows(db)
    assert set(effects_at_death) <= set(after), "a side effect was rewritten"
    assert_effects_match_log(db)
    assert_gapless(db)
    for process in (rt, fresh):  # gone before the next case: a server counts connections
        process.close()
    return True


def sweep(tmp_path: Path, databases: Databases, runtime: Any, name: str) -> int:
    """Every crash point x every occurrence; returns the number of cases that died."""
    expected_result, expected_outbox = reference(tmp_path, databases, runtime, name)
    expected_effects = {
        (r["tool"], str(r.get("body", r.get("amount")))): 1 for r in expected_outbox
    }
    cases, failures = 0, []
    for point in crashpoints.ALL:
        occurrence = 0
        while True:
            occurrence += 1
            folder = tmp_path / f"{point}-{occurrence}"
            folder.mkdir()
            db = databases.new(f"{point}-{occurrence}/durabl")
            try:
                died = check_case(
                    runtime,
                    name,
                    point,
                    occurrence,
                    folder,
                    db,
                    (expected_result, expected_effects),
                )
            except AssertionError as exc:
                died = True
                failures.append(f"{name} died at {point} #{occurrence}: {exc}")
            if not died:
                break
            cases += 1
    assert not failures, "\n".join(failures)
    return cases


def test_idempotent_effects_happen_exactly_once_whatever_the_crash(
    tmp_path: Path, databases: Databases, runtime: Any
) -> None:
    assert sweep(tmp_path, databases, runtime, IDEM) >= 25


def test_at_most_once_effects_never_repeat_and_dead_letter_when_ambiguous(
    tmp_path: Path, databases: Databases, runtime: Any
) -> None:
    assert sweep(tmp_path, databases, runtime, MIXED) >= 20


def die_in_window(
    db: Database, clock: Clock, world: World, runtime: Any, point: str, occurrence: int
) -> Any:
    """Start the mixed workflow, die at ``point``; a new Runtime then dead-letters the run."""
    rt = runtime(WORKFLOWS)
    assert crash(point, occurrence, lambda: rt.start(MIXED, INPUT, run_id=RUN))
    fresh = runtime(WORKFLOWS)
    state = fresh.resume(RUN)
    assert state.status == "DEAD_LETTERED"
    return fresh


def test_redrive_calls_the_step_again_and_is_recorded(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = die_in_window(db, clock, world, runtime, crashpoints.AFTER_TOOL_DISPATCHED, 2)
    assert world.calls["charge"] == 0
    [letter] = rt.dead_letters()
    assert (letter.run_id, letter.workflow, letter.step) == (RUN, MIXED, 2)
    assert letter.idempotency_key is None
    assert kinds(db, RUN)[-1] == "DEAD_LETTERED"
    assert letter.seq == len(event_rows(db, RUN))
    with pytest.raises(DeadLetteredError):
        rt.result(RUN)
    assert rt.resume(RUN).status == "DEAD_LETTERED"
    assert rt.resume_all() == []
    assert world.calls["charge"] == 0

    state = rt.redrive(RUN)

    assert state.status == "COMPLETED"
    assert world.calls["charge"] == 2
    assert world.outbox.count(tool="charge", amount=5) == 1
    log = kinds(db, RUN)
    assert log.index("DLQ_REDRIVEN") == log.index("DEAD_LETTERED") + 1
    assert rt.dead_letters() == []
    assert_effects_match_log(db)


def test_resolve_supplies_the_result_without_a_call_and_is_recorded(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = die_in_window(db, clock, world, runtime, crashpoints.AFTER_TOOL_RETURNED, 3)
    key = f"charge-{RUN}"
    [letter] = rt.dead_letters()
    assert (letter.step, letter.idempotency_key) == (3, key)
    assert world.outbox.count(tool="charge", key=key) == 1
    calls = world.calls["charge"]

    state = rt.resolve(RUN, {"charged": 7})

    assert state.status == "COMPLETED"
    assert world.calls["charge"] == calls
    assert world.outbox.count(tool="charge", key=key) == 1
    assert state.result[2] == {"charged": 7}
    rows = event_rows(db, RUN)
    at = [r[2] for r in rows].index("DLQ_RESOLVED")
    assert rows[at + 1][2:4] == ("STEP_COMPLETED", 3)
    assert codec.decode(rows[at + 1][5]) == {"charged": 7}
    [effect] = [r for r in side_effect_rows(db) if r[0] == key]
    assert codec.decode(effect[5]) == {"charged": 7}
    with pytest.raises(InvalidStateError):
        rt.resolve(RUN, {"charged": 8})
    assert_effects_match_log(db)


def test_resolving_a_derived_key_step_records_its_effect(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = die_in_window(db, clock, world, runtime, crashpoints.AFTER_TOOL_RETURNED, 2)
    assert rt.resolve(RUN, {"charged": 5}).status == "COMPLETED"
    assert world.outbox.count(tool="charge", amount=5) == 1
    [effect] = [r for r in side_effect_rows(db) if r[0] == f"durabl:{RUN}:2"]
    assert codec.decode(effect[5]) == {"charged": 5}
    assert_effects_match_log(db)


def test_cancel_ends_a_dead_lettered_run_and_is_recorded(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = die_in_window(db, clock, world, runtime, crashpoints.AFTER_TOOL_DISPATCHED, 3)
    calls = dict(world.calls)

    state = rt.cancel(RUN, "refunded by hand")

    assert state.status == "CANCELLED"
    assert kinds(db, RUN)[-1] == "RUN_CANCELLED"
    assert "refunded by hand" in event_rows(db, RUN)[-1][5]
    assert rt.dead_letters() == []
    fresh = runtime(WORKFLOWS)
    assert fresh.resume(RUN).status == "CANCELLED"
    fresh.resume_all()
    clock.advance(86_400)
    fresh.tick()
    assert dict(world.calls) == calls
    assert world.outbox.count(tool="charge", amount=7) == 0
    with pytest.raises(InvalidStateError):
        fresh.redrive(RUN)
    assert_gapless(db)


def test_a_death_right_after_dead_lettering_keeps_one_dead_letter(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    assert crash(crashpoints.AFTER_TOOL_RETURNED, 2, lambda: rt.start(MIXED, INPUT, run_id=RUN))
    second = runtime(WORKFLOWS)
    assert crash(crashpoints.AFTER_DEAD_LETTERED, 1, lambda: second.resume(RUN))
    third = runtime(WORKFLOWS)
    third.resume_all()
    assert third.state(RUN).status == "DEAD_LETTERED"
    assert kinds(db, RUN).count("DEAD_LETTERED") == 1
    assert [d.run_id for d in third.dead_letters()] == [RUN]
    assert world.calls["charge"] == 1


def test_the_side_effects_table_refuses_a_second_record_for_a_key(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    assert rt.run(MIXED, INPUT, run_id=RUN).status == "COMPLETED"
    rt.close()
    before_effects, before_log = side_effect_rows(db), event_rows(db)
    key = f"charge-{RUN}"

    store = open_store(db)
    try:
        forged = Event(len(before_log) + 1, "STEP_COMPLETED", 3, None, '{"charged":0}', 1.0)
        second = SideEffect(
            key=key,
            run_id=RUN,
            step=3,
            tool="charge",
            args_fp="x",
            result_text='{"charged":0}',
            error=None,
            at_s=1.0,
        )
        with pytest.raises(StorageError, match="refusing to record a second side effect"):
            store.commit(Commit(RUN, [forged], side_effect=second, durable=True))
    finally:
        store.close()
    with connect(db) as conn:
        with pytest.raises(refusal(db), match="never overwritten"):
            conn.execute("UPDATE side_effects SET result = '{}' WHERE idempotency_key = ?", (key,))
        with pytest.raises(refusal(db), match="never deleted"):
            conn.execute("DELETE FROM side_effects WHERE idempotency_key = ?", (key,))
        with pytest.raises(refusal(db)):
            conn.execute(
                "INSERT INTO side_effects VALUES (?, ?, 3, 'charge', 'x', '{}', NULL, 1.0)",
                (key, RUN),
            )
    assert side_effect_rows(db) == before_effects
    assert event_rows(db) == before_log, "the refused commit half-landed"
