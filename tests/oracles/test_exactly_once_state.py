"""Oracle: exactly-once workflow state.

Replaying a run's log re-runs the workflow's own Python code and reproduces a byte-identical
final result while calling nothing: no model, no tool. The workflow below computes its result
from step results with local code (sorting, upper-casing, arithmetic) and appends what it
computed to a trace, so a runtime that merely handed back the stored result, or skipped the
generator, or called the world again, fails here.
"""

from __future__ import annotations

from typing import Any

from durabl import ModelCall, Sleep, ToolCall, ToolFailed, codec
from durabl.crashpoints import AFTER_STEP_COMMITTED, BEFORE_RUN_COMPLETED

from .support import (
    START_S,
    Clock,
    Databases,
    World,
    crash,
    event_rows,
    run_row,
)

NAME = "oracle_exactly_once.agent"
STEPS = 9
"""Positions the agent yields or reads: 2 model calls, 3 tools, now/random/uuid, 1 sleep."""
CTX_FIELDS = ("stamp", "r", "u")


def make_agent(trace: list[Any]) -> Any:
    def agent(ctx: Any, topic: str, to: str) -> Any:
        trace.append("start")
        plan = yield ModelCall(f"plan research on {topic}", temperature=0)
        hits: list[str] = []
        for q in (topic, topic.upper()):
            hits.extend((yield ToolCall("search", {"q": q})))
        stamp = ctx.now()
        r = ctx.random()
        u = ctx.uuid()
        yield Sleep(seconds=30)
        receipt = yield ToolCall(
            "send", {"to": to, "body": plan["text"]}, idempotency_key=f"mail-{ctx.run_id}"
        )
        summary = yield ModelCall({"summarise": sorted(hits)})
        result = {
            "plan_tokens": plan["tokens"] * 2,
            "hits": sorted(hits, reverse=True),
            "receipt": receipt["sent"].upper(),
            "summary": summary["text"][:40],
            "n": len(hits) + plan["tokens"],
            "stamp": stamp,
            "r": r,
            "u": u,
        }
        trace.append(result)
        return result

    return agent


INPUT = {"topic": "otters", "to": "a@b.c"}


def computed(trace: list[Any]) -> list[Any]:
    return [item for item in trace if item != "start"]


def complete(rt: Any, clock: Clock, run_id: str) -> None:
    """Move past the agent's 30 s sleep and let the run finish."""
    clock.advance(30)
    rt.tick()
    assert rt.state(run_id).status == "COMPLETED"


def snapshot(db: Any, run_id: str) -> tuple[Any, Any]:
    return event_rows(db), run_row(db, run_id)


def test_dry_replay_reruns_the_workflow_byte_identically_and_calls_nothing(
    db: Any, clock: Clock, world: World, runtime: Any
) -> None:
    trace: list[Any] = []
    rt = runtime({NAME: make_agent(trace)})
    run_id = rt.start(NAME, INPUT)
    complete(rt, clock, run_id)
    assert rt.state(run_id).status == "COMPLETED"
    recorded = run_row(db, run_id)["result"]
    assert recorded == codec.encode(computed(trace)[-1])
    assert event_rows(db, run_id)[-1][5] == recorded
    calls_before, before = dict(world.calls), snapshot(db, run_id)
    starts_before = trace.count("start")

    state = rt.replay(run_id)

    assert trace.count("start") == starts_before + 1, "the generator did not re-run"
    assert codec.encode(computed(trace)[-1]) == recorded
    assert codec.encode(state.result) == recorded
    assert state.status == "COMPLETED"
    assert (state.steps_replayed, state.steps_executed) == (STEPS, 0)
    assert dict(world.calls) == calls_before
    assert snapshot(db, run_id) == before, "a dry replay wrote to the database"


def test_replay_in_a_fresh_runtime_with_no_world_at_all(
    db: Any, clock: Clock, world: World, runtime: Any
) -> None:
    trace: list[Any] = []
    rt = runtime({NAME: make_agent(trace)})
    run_id = rt.start(NAME, INPUT)
    complete(rt, clock, run_id)
    rt.close()
    recorded = run_row(db, run_id)["result"]
    before = snapshot(db, run_id)

    later = Clock(START_S + 86_400 * 30)
    fresh = runtime({NAME: make_agent(trace)}, llm=None, tools={}, clock=later)
    state = fresh.replay(run_id)

    assert codec.encode(computed(trace)[-1]) == recorded
    assert codec.encode(state.result) == recorded
    assert computed(trace)[-1]["stamp"] == START_S, "ctx.now() was not served from the log"
    assert state.steps_executed == 0
    assert snapshot(db, run_id) == before


def test_fresh_runtime_resume_serves_every_finished_step_and_calls_nothing(
    db: Any, clock: Clock, world: World, runtime: Any
) -> None:
    trace: list[Any] = []
    rt = runtime({NAME: make_agent(trace)})
    run_id = rt.start(NAME, INPUT)
    clock.advance(30)
    assert crash(BEFORE_RUN_COMPLETED, 1, rt.tick)
    first = computed(trace)[-1]
    assert run_row(db, run_id)["status"] == "RUNNING"
    calls_before = dict(world.calls)
    starts_before = trace.count("start")

    clock.advance(86_400 * 2)
    fresh = runtime({NAME: make_agent(trace)})
    state = fresh.resume(run_id)

    assert state.status == "COMPLETED"
    assert trace.count("start") == starts_before + 1
    assert dict(world.calls) == calls_before, "resume called the world for recorded steps"
    assert (state.steps_replayed, state.steps_executed) == (STEPS, 0)
    assert codec.encode(computed(trace)[-1]) == codec.encode(first)
    assert run_row(db, run_id)["result"] == codec.encode(first)
    assert codec.encode(fresh.result(run_id)) == codec.encode(first)


def test_mid_run_crash_then_resume_equals_the_uncrashed_run(
    tmp_path: Any, databases: Databases, db: Any, clock: Clock, world: World, runtime: Any
) -> None:
    (tmp_path / "ref").mkdir()
    reference_world = World(tmp_path / "ref")
    ref_trace: list[Any] = []
    ref_clock = Clock()
    ref_rt = runtime(
        {NAME: make_agent(ref_trace)},
        db=databases.new("ref"),
        llm=reference_world.llm,
        tools=reference_world.tools(),
        clock=ref_clock,
    )
    ref_id = ref_rt.start(NAME, INPUT, run_id="r1")
    complete(ref_rt, ref_clock, ref_id)
    reference = computed(ref_trace)[-1]

    trace: list[Any] = []
    rt = runtime({NAME: make_agent(trace)})
    assert crash(AFTER_STEP_COMMITTED, 3, lambda: rt.start(NAME, INPUT, run_id="r1"))
    assert dict(world.calls) == {"llm": 1, "search": 2}

    fresh = runtime({NAME: make_agent(trace)})
    assert fresh.resume("r1").status == "SLEEPING"
    assert dict(world.calls) == {"llm": 1, "search": 2}, "recorded steps were called again"
    complete(fresh, clock, "r1")

    assert fresh.state("r1").status == "COMPLETED"
    assert world.calls == reference_world.calls
    final = computed(trace)[-1]

    def without_ctx(value: dict[str, Any]) -> str:
        return codec.encode({k: v for k, v in value.items() if k not in CTX_FIELDS})

    assert without_ctx(final) == without_ctx(reference)
    assert run_row(db, "r1")["result"] == codec.encode(final)

    replayed = fresh.replay("r1")
    assert codec.encode(computed(trace)[-1]) == codec.encode(final)
    assert codec.encode(replayed.result) == codec.encode(final)
    assert world.calls == reference_world.calls


def make_fallback(trace: list[Any]) -> Any:
    def fallback(ctx: Any) -> Any:
        trace.append("start")
        try:
            yield ToolCall("broken", {"why": "disk"})
            outcome = "unreachable"
        except ToolFailed as failed:
            outcome = f"{failed.tool}/{failed.error_type}/{failed.attempts}"
        hits = yield ToolCall("search", {"q": outcome})
        result = {"outcome": outcome, "hits": hits[::-1]}
        trace.append(result)
        return result

    return fallback


def test_replay_rethrows_a_recorded_failure_at_the_same_point(
    db: Any, world: World, runtime: Any
) -> None:
    trace: list[Any] = []
    name = "oracle_exactly_once.fallback"
    rt = runtime({name: make_fallback(trace)})
    run_id = rt.start(name, None)
    assert rt.state(run_id).status == "COMPLETED"
    assert world.calls["broken"] == 2
    recorded = run_row(db, run_id)["result"]
    assert computed(trace)[-1]["outcome"] == "broken/ValueError/2"
    calls_before = dict(world.calls)

    state = rt.replay(run_id)

    assert trace.count("start") == 2
    assert codec.encode(computed(trace)[-1]) == recorded
    assert codec.encode(state.result) == recorded
    assert dict(world.calls) == calls_before


def test_dry_replay_of_an_unfinished_run_writes_and_calls_nothing(
    db: Any, clock: Clock, world: World, runtime: Any
) -> None:
    trace: list[Any] = []
    rt = runtime({NAME: make_agent(trace)})
    run_id = rt.start(NAME, INPUT)
    assert rt.state(run_id).status == "SLEEPING"
    calls_before, before = dict(world.calls), snapshot(db, run_id)

    clock.advance(3600)
    state = rt.replay(run_id)

    assert trace.count("start") == 2
    assert state.status == "SLEEPING"
    assert state.steps_executed == 0
    assert state.steps_replayed == 6
    assert state.next_step is not None and "Sleep" in state.next_step
    assert dict(world.calls) == calls_before
    assert snapshot(db, run_id) == before
