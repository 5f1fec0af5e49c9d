"""Oracle: durable timers fire exactly once and never early.

A Sleep records its deadline when armed. ``tick(now=T)`` fires exactly the timers due at T. A
timer fires once across repeated ticks and across deaths around arming and firing; a run picked
up days later keeps its original deadline; the process may exit while a run sleeps. A retry's
backoff is a durable timer too: the run parks SLEEPING instead of blocking.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from durabl import ModelCall, RetryPolicy, Sleep, ToolCall, codec, crashpoints, tool

from .support import (
    START_S,
    Clock,
    Database,
    World,
    assert_gapless,
    assert_timers_once,
    crash,
    event_rows,
    kinds,
    run_row,
)

NAP = "oracle_timers.nap"
TRIO = "oracle_timers.trio"
RETRYING_TOOL = "oracle_timers.retrying_tool"
RETRYING_MODEL = "oracle_timers.retrying_model"
HOUR = 3600.0


def nap(ctx: Any, seconds: float) -> Any:
    before = yield ToolCall("send", {"to": "t", "body": "before"})
    yield Sleep(seconds=seconds)
    after = yield ToolCall("send", {"to": "t", "body": "after"})
    return [before, after]


def trio(ctx: Any) -> Any:
    yield Sleep(seconds=10)
    yield Sleep(minutes=1)
    yield Sleep(hours=1)
    return "rested"


def retrying_tool(ctx: Any) -> Any:
    return (yield ToolCall("flaky", {"n": 4}))


def retrying_model(ctx: Any) -> Any:
    return (yield ModelCall("retry me"))


WORKFLOWS = {NAP: nap, TRIO: trio, RETRYING_TOOL: retrying_tool, RETRYING_MODEL: retrying_model}


def deadline_of(db: Database, run_id: str) -> float:
    [armed] = [r for r in event_rows(db, run_id) if r[2] == "TIMER_ARMED"]
    return float(codec.decode(armed[5])["fire_at_s"])


def test_a_sleep_records_its_deadline_when_armed(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAP, {"seconds": HOUR})
    state = rt.state(run_id)
    assert state.status == "SLEEPING"
    assert deadline_of(db, run_id) == START_S + HOUR
    assert state.wake_at_s == START_S + HOUR
    assert run_row(db, run_id)["wake_at_s"] == START_S + HOUR
    assert world.calls["send"] == 1


def test_tick_fires_exactly_the_timers_due_and_never_early(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    short = rt.start(NAP, {"seconds": 60}, run_id="short")
    long = rt.start(NAP, {"seconds": HOUR}, run_id="long")

    for now in (START_S, START_S + 59.999, START_S + 60 - 0.001, math.nextafter(START_S + 60, 0)):
        assert rt.tick(now=now) == []
    assert kinds(db, "short").count("TIMER_FIRED") == 0

    fired = rt.tick(now=START_S + 60)
    assert [s.run_id for s in fired] == [short]
    assert rt.state(short).status == "COMPLETED"
    assert rt.state(long).status == "SLEEPING"
    assert "TIMER_FIRED" not in kinds(db, long)

    assert rt.tick(now=START_S + HOUR - 0.001) == []
    assert rt.state(long).status == "SLEEPING"
    assert [s.run_id for s in rt.tick(now=START_S + HOUR)] == [long]
    assert rt.state(long).status == "COMPLETED"
    assert world.calls["send"] == 4


def test_resume_and_resume_all_never_fire_a_timer_early(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAP, {"seconds": HOUR})
    deadline_s = START_S + HOUR
    for now_s in (deadline_s - 0.001, math.nextafter(deadline_s, 0)):
        clock.now_s = now_s
        assert rt.resume(run_id).status == "SLEEPING"
        rt.resume_all()
        fresh = runtime(WORKFLOWS)
        assert fresh.resume(run_id).status == "SLEEPING"
        fresh.resume_all()
        fresh.tick()
    assert "TIMER_FIRED" not in kinds(db, run_id)
    assert world.calls["send"] == 1
    clock.now_s = deadline_s
    assert fresh.resume(run_id).status == "COMPLETED"


def test_a_timer_fires_once_across_repeated_ticks(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(TRIO, None)
    for now in (10, 10, 69, 70, 70, 3669, 3670, 3670, 10_000, 99_999):
        rt.tick(now=START_S + now)
        runtime(WORKFLOWS).tick(now=START_S + now)
    assert rt.state(run_id).status == "COMPLETED"
    fired = [
        codec.decode(r[5])["fired_at_s"] for r in event_rows(db, run_id) if r[2] == "TIMER_FIRED"
    ]
    assert fired == [START_S + 10, START_S + 70, START_S + 3670]
    assert_timers_once(db)


@pytest.mark.parametrize(
    "point",
    [crashpoints.AFTER_TIMER_ARMED, crashpoints.BEFORE_TIMER_FIRED, crashpoints.AFTER_TIMER_FIRED],
)
@pytest.mark.parametrize("occurrence", [1, 2, 3])
def test_a_timer_fires_once_across_crashes(
    db: Database, clock: Clock, runtime: Any, point: str, occurrence: int
) -> None:
    rt = runtime(WORKFLOWS)

    def first_process() -> None:
        rt.start(TRIO, None, run_id="z")
        for now in (10, 70, 3670):
            rt.tick(now=START_S + now)

    assert crash(point, occurrence, first_process)
    armed_before = kinds(db, "z").count("TIMER_ARMED")
    fresh = runtime(WORKFLOWS)
    for now in (0, 10, 10, 70, 70, 3670, 3670):
        fresh.resume_all()
        fresh.tick(now=START_S + now)
        assert_timers_once(db)
    assert fresh.state("z").status == "COMPLETED"
    log = kinds(db, "z")
    assert log.count("TIMER_ARMED") == log.count("TIMER_FIRED") == 3
    assert armed_before == occurrence
    assert_timers_once(db)
    assert_gapless(db)


def test_a_run_resumed_two_days_later_does_not_restart_its_sleep(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAP, {"seconds": 3 * 86_400})
    rt.close()

    clock.advance(2 * 86_400)
    later = runtime(WORKFLOWS)
    assert later.resume(run_id).status == "SLEEPING"
    assert later.state(run_id).wake_at_s == START_S + 3 * 86_400
    assert later.tick() == []
    assert kinds(db, run_id).count("TIMER_ARMED") == 1
    assert deadline_of(db, run_id) == START_S + 3 * 86_400
    later.close()

    clock.advance(86_400 - 0.001)
    assert runtime(WORKFLOWS).tick() == []
    clock.advance(0.001)
    assert [s.status for s in runtime(WORKFLOWS).tick()] == ["COMPLETED"]
    assert world.calls["send"] == 2


def test_the_process_may_exit_while_a_run_sleeps(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    run_id = rt.start(NAP, {"seconds": HOUR})
    rt.close()
    clock.advance(2 * 86_400)
    later = runtime(WORKFLOWS)
    [state] = later.tick()
    assert (state.run_id, state.status) == (run_id, "COMPLETED")
    assert later.tick() == []
    [fired] = [r for r in event_rows(db, run_id) if r[2] == "TIMER_FIRED"]
    assert codec.decode(fired[5])["fired_at_s"] == START_S + 2 * 86_400
    assert deadline_of(db, run_id) == START_S + HOUR
    assert world.calls["send"] == 2


def test_a_tool_retry_backoff_parks_the_run_on_a_durable_timer(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS, tools=world.tools(flaky_delay_s=30))
    run_id = rt.start(RETRYING_TOOL, None)
    state = rt.state(run_id)
    assert state.status == "SLEEPING"
    assert state.wake_at_s == START_S + 30
    assert world.calls["flaky"] == 1
    [retry] = [r for r in event_rows(db, run_id) if r[2] == "STEP_RETRY"]
    assert codec.decode(retry[5])["retry_at_s"] == START_S + 30
    rt.close()

    later = runtime(WORKFLOWS, tools=world.tools(flaky_delay_s=30))
    assert later.resume(run_id).status == "SLEEPING"
    assert later.tick(now=START_S + 30 - 0.001) == []
    assert world.calls["flaky"] == 1
    [state] = later.tick(now=START_S + 30)
    assert state.status == "COMPLETED"
    assert state.result == 40
    assert world.calls["flaky"] == 2


def test_a_model_retry_backoff_parks_the_run_on_a_durable_timer(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    world.llm_failures_left = 1
    policy = RetryPolicy(max_attempts=3, base_delay=20)
    rt = runtime(WORKFLOWS, retry=policy)
    run_id = rt.start(RETRYING_MODEL, None)
    state = rt.state(run_id)
    assert state.status == "SLEEPING"
    assert state.wake_at_s == START_S + 20
    assert world.calls["llm"] == 1
    rt.close()

    later = runtime(WORKFLOWS, retry=policy)
    assert later.resume(run_id).status == "SLEEPING", "the model was retried before its backoff"
    assert later.tick(now=START_S + 20 - 0.001) == []
    assert world.calls["llm"] == 1
    [state] = later.tick(now=START_S + 20)
    assert state.status == "COMPLETED"
    assert world.calls["llm"] == 2


def test_backoff_grows_and_each_retry_fires_once(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    calls: list[float] = []

    def sticky() -> str:
        calls.append(clock())
        if len(calls) < 3:
            raise ConnectionError("still down")
        return "up"

    policy = RetryPolicy(max_attempts=4, base_delay=10, multiplier=3)
    rt = runtime(
        {"oracle_timers.sticky": lambda ctx: (yield ToolCall("sticky"))},
        tools={"sticky": tool(sticky, mode="IDEMPOTENT", retry=policy)},
    )
    run_id = rt.start("oracle_timers.sticky", None)
    for step_s in (5, 5, 5, 5, 20, 5, 5):
        clock.advance(step_s)
        rt.tick()
    assert rt.state(run_id).status == "COMPLETED"
    assert calls == [START_S, START_S + 10, START_S + 40]
    assert kinds(db, run_id).count("STEP_RETRY") == 2
