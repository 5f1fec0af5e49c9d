"""Oracle: non-determinism is detected, named, and never destroys a run.

A run is started with one version of a workflow and resumed with another registered under the
same name. Any change to a recorded step (tool, arguments, order, prompt, a ctx read where a
step was, an earlier end, an exception where the log goes on) raises ``NonDeterminismError``
naming the run, the seq, the expected and actual step and the likely causes. The run is HELD,
its log is byte-for-byte untouched, and deploying the original code again lets it finish.
Replay matches steps by fingerprint, not by position: swapping two steps is caught, not served
each other's results.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from durabl import ModelCall, NonDeterminismError, Sleep, ToolCall, codec, crashpoints

from .support import START_S, Clock, Database, World, crash, event_rows, logical, run_row

NAME = "oracle_nd.agent"
TO = "nd@example.com"


def original(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("send", {"to": to, "body": "one"})
    b = yield ToolCall("send", {"to": to, "body": "two"})
    yield Sleep(seconds=60)
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def other_tool(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("search", {"q": "one"})
    return [plan, a]


def other_args(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("send", {"to": to, "body": "ONE"})
    return [plan, a]


def reordered(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    b = yield ToolCall("send", {"to": to, "body": "two"})
    a = yield ToolCall("send", {"to": to, "body": "one"})
    yield Sleep(seconds=60)
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def other_prompt(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"a better plan for {to}")
    return plan


def shorter(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("send", {"to": to, "body": "one"})
    b = yield ToolCall("send", {"to": to, "body": "two"})
    return [plan, a, b]


def ctx_where_a_tool_was(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    stamp = ctx.now()
    return [plan, stamp]


def raises_where_the_log_goes_on(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("send", {"to": to, "body": "one"})
    raise KeyError(f"no field in {plan} {a}")


def longer(ctx: Any, to: str) -> Any:
    result = yield from original(ctx, to)
    extra = yield ToolCall("send", {"to": to, "body": "postscript"})
    return [*result, extra]


# variant, position of the first mismatch, text in `expected`, text in `actual`
VARIANTS: dict[str, tuple[Callable[..., Any], int, str, str]] = {
    "other-tool": (other_tool, 2, "ToolCall('send'", "ToolCall('search'"),
    "other-args": (other_args, 2, '"one"', '"ONE"'),
    "reordered": (reordered, 2, '"one"', '"two"'),
    "other-prompt": (other_prompt, 1, "plan for", "a better plan"),
    "shorter": (shorter, 4, "Sleep(60", "the end of the workflow"),
    "ctx-now-for-a-tool": (ctx_where_a_tool_was, 2, "ToolCall('send'", "ctx.now()"),
    "raises-mid-log": (raises_where_the_log_goes_on, 3, '"two"', "KeyError"),
}


def started_sleeping(runtime: Any) -> None:
    rt = runtime({NAME: original})
    rt.start(NAME, {"to": TO}, run_id="nd")
    assert rt.state("nd").status == "SLEEPING"
    rt.close()


def first_seq_of(db: Database, position: int) -> int:
    return min(r[1] for r in event_rows(db, "nd") if r[3] == position)


def check_error(
    err: NonDeterminismError, db: Database, position: int, expected: str, actual: str
) -> None:
    assert err.run_id == "nd"
    assert err.position == position
    assert err.seq == first_seq_of(db, position)
    assert expected in err.expected, err.expected
    assert actual in err.actual, err.actual
    message = str(err)
    assert "run nd" in message and f"seq {err.seq}" in message
    assert err.expected in message and err.actual in message
    assert "not deterministic" in message and "code changed" in message


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_changed_workflow_is_held_with_its_log_untouched(
    db: Database, clock: Clock, world: World, runtime: Any, variant: str
) -> None:
    code, position, expected, actual = VARIANTS[variant]
    started_sleeping(runtime)
    log_before = event_rows(db)
    calls = dict(world.calls)

    changed = runtime({NAME: code})
    with pytest.raises(NonDeterminismError) as raised:
        changed.resume("nd")
    check_error(raised.value, db, position, expected, actual)

    state = changed.state("nd")
    assert state.status == "HELD"
    assert state.error is not None and "NonDeterminismError" in state.error
    assert run_row(db, "nd")["status"] == "HELD"
    with pytest.raises(NonDeterminismError):
        changed.resume("nd")
    with pytest.raises(NonDeterminismError):
        runtime({NAME: code}).resume("nd")
    with pytest.raises(NonDeterminismError):
        changed.replay("nd")
    [reported] = changed.resume_all()
    assert reported.error is not None and "nd" in reported.error
    clock.advance(3600)
    changed.tick()
    assert changed.state("nd").status == "HELD"
    assert event_rows(db) == log_before, "the log of a held run was touched"
    assert dict(world.calls) == calls

    fixed = runtime({NAME: original})
    assert fixed.resume("nd").status == "COMPLETED"
    state = fixed.state("nd")
    assert state.error is None
    assert event_rows(db)[: len(log_before)] == log_before
    assert [world.outbox.count(body=b) for b in ("one", "two")] == [1, 1]
    assert world.calls["send"] == 3


def test_a_held_run_resumes_from_where_it_was_once_the_code_is_back(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime({NAME: original})
    assert crash(
        crashpoints.AFTER_STEP_COMMITTED, 2, lambda: rt.start(NAME, {"to": TO}, run_id="nd")
    )
    log_before = event_rows(db)
    with pytest.raises(NonDeterminismError) as raised:
        runtime({NAME: reordered}).resume("nd")
    check_error(raised.value, db, 2, '"one"', '"two"')
    assert event_rows(db) == log_before
    assert world.calls == {"llm": 1, "send": 1}

    fixed = runtime({NAME: original})
    fixed.resume_all()
    assert fixed.state("nd").status == "SLEEPING"
    assert world.calls == {"llm": 1, "send": 2}
    clock.advance(60)
    [state] = fixed.tick()
    assert state.status == "COMPLETED"
    assert state.result == [
        {"sent": f"{TO}:one"},
        {"sent": f"{TO}:two"},
        {"sent": f"{TO}:answer(plan for {TO})"},
    ]


def test_swapped_steps_are_not_handed_each_others_results(
    db: Database, world: World, runtime: Any
) -> None:
    started_sleeping(runtime)
    results_before = [
        codec.decode(r[5])
        for r in logical(event_rows(db, "nd"))
        if r[2] == "STEP_COMPLETED" and r[3] in (2, 3)
    ]
    assert results_before == [{"sent": f"{TO}:one"}, {"sent": f"{TO}:two"}]
    with pytest.raises(NonDeterminismError) as raised:
        runtime({NAME: reordered}).replay("nd")
    assert raised.value.position == 2
    assert run_row(db, "nd")["status"] == "SLEEPING", "a dry replay must not hold the run"


def test_a_workflow_that_got_longer_simply_continues(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    started_sleeping(runtime)
    grown = runtime({NAME: longer})
    assert grown.resume("nd").status == "SLEEPING"
    [state] = grown.tick(now=START_S + 60)
    assert state.status == "COMPLETED"
    assert len(state.result) == 4
    assert world.outbox.count(body="postscript") == 1
    assert world.calls["send"] == 4


def test_a_step_interrupted_mid_flight_is_still_matched_by_fingerprint(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    # The third step holds an explicit key, so its opening (with the key's claim) commits
    # before the call, and a death during the call leaves it in the log.
    def keyed(body: str) -> Any:
        def flow(ctx: Any, to: str) -> Any:
            plan = yield ModelCall(f"plan for {to}")
            a = yield ToolCall("send", {"to": to, "body": "one"})
            b = yield ToolCall("send", {"to": to, "body": body}, idempotency_key="third")
            return [plan, a, b]

        return flow

    rt = runtime({NAME: keyed("two")})
    assert crash(
        crashpoints.AFTER_TOOL_DISPATCHED, 2, lambda: rt.start(NAME, {"to": TO}, run_id="nd")
    )
    log_before = event_rows(db)
    assert [r[2:4] for r in log_before[-2:]] == [("STEP_STARTED", 3), ("TOOL_DISPATCHED", 3)]
    with pytest.raises(NonDeterminismError) as raised:
        runtime({NAME: keyed("three")}).resume("nd")
    check_error(raised.value, db, 3, '"two"', '"three"')
    assert event_rows(db) == log_before
    assert world.outbox.count(body="three") == 0
    assert runtime({NAME: keyed("two")}).resume("nd").status == "COMPLETED"
    assert world.outbox.count(body="two") == 1
