"""Oracle: idempotency keys hold across runs and crashes.

An explicit key names one effect, whichever run asks for it: a second run holding the key gets
the recorded result without a call, or, if the first run died inside the ambiguous window, the
same answer the first run gets on resume. Reusing a key for another tool or other arguments is a
clear, catchable error. The key durabl hands the tool is the explicit one, or
``<run_id>:<step position>``.
"""

from __future__ import annotations

from typing import Any

import pytest

from durabl import ModelCall, ToolCall, ToolFailed, codec, crashpoints, tool

from .support import (
    Clock,
    Database,
    World,
    assert_effects_match_log,
    crash,
    event_rows,
    kinds,
    logical,
    side_effect_rows,
)

KEYED = "oracle_keys.keyed"
CATCHING = "oracle_keys.catching"
TWICE = "oracle_keys.twice"
DERIVED = "oracle_keys.derived"
KEY = "invoice-2024-0042"
WINDOW = (crashpoints.AFTER_TOOL_DISPATCHED, crashpoints.AFTER_TOOL_RETURNED)


def keyed(ctx: Any, name: str, args: dict[str, Any], key: str) -> Any:
    note = yield ModelCall(f"about to call {name}")
    result = yield ToolCall(name, args, idempotency_key=key)
    return {"result": result, "note": note["text"]}


def catching(ctx: Any, name: str, args: dict[str, Any], key: str) -> Any:
    try:
        result = yield ToolCall(name, args, idempotency_key=key)
    except ToolFailed as failed:
        return {"error_type": failed.error_type, "tool": failed.tool, "message": failed.message}
    return {"result": result}


def twice(ctx: Any, key: str) -> Any:
    first = yield ToolCall("send", {"to": "x", "body": "first"}, idempotency_key=key)
    second = yield ToolCall("send", {"to": "x", "body": "second"}, idempotency_key=key)
    return [first, second]


def derived(ctx: Any) -> Any:
    ctx.now()
    yield ModelCall("warm up")
    sent = yield ToolCall("send", {"to": "y", "body": "derived"})
    hits = yield ToolCall("search", {"q": "plain"})
    explicit = yield ToolCall("send", {"to": "y", "body": "explicit"}, idempotency_key=KEY)
    return [sent, hits, explicit]


WORKFLOWS = {KEYED: keyed, CATCHING: catching, TWICE: twice, DERIVED: derived}
SEND = {"name": "send", "args": {"to": "a@b.c", "body": "invoice"}, "key": KEY}
CHARGE = {"name": "charge", "args": {"amount": 42}, "key": KEY}


@pytest.mark.parametrize("call", [SEND, CHARGE], ids=["idempotent", "at_most_once"])
def test_a_second_run_with_the_key_gets_the_recorded_result_without_a_call(
    db: Database, world: World, runtime: Any, call: dict[str, Any]
) -> None:
    first = runtime(WORKFLOWS)
    a = first.run(KEYED, call, run_id="A")
    assert a.status == "COMPLETED"
    assert world.calls[call["name"]] == 1
    first.close()

    second = runtime(WORKFLOWS)
    b = second.run(KEYED, call, run_id="B")

    assert b.status == "COMPLETED"
    assert world.calls[call["name"]] == 1, (
        "the tool was called for a key that already has an effect"
    )
    assert b.result == a.result
    assert world.outbox.count(key=KEY) == 1
    assert "TOOL_DISPATCHED" not in kinds(db, "B")
    [effect] = side_effect_rows(db)
    assert (effect[0], effect[1]) == (KEY, "A")
    assert_effects_match_log(db)


@pytest.mark.parametrize("point", WINDOW)
def test_idempotent_key_when_the_first_run_died_in_the_window(
    db: Database, world: World, runtime: Any, point: str
) -> None:
    first = runtime(WORKFLOWS)
    assert crash(point, 1, lambda: first.start(KEYED, SEND, run_id="A"))
    calls_by_a = world.calls["send"]
    assert calls_by_a == (1 if point == crashpoints.AFTER_TOOL_RETURNED else 0)

    second = runtime(WORKFLOWS)
    b = second.run(KEYED, SEND, run_id="B")
    assert b.status == "COMPLETED"
    assert world.calls["send"] == calls_by_a + 1, "B must call the IDEMPOTENT tool once"
    assert world.keys_seen == [("send", KEY)] * (calls_by_a + 1)
    assert world.outbox.count(key=KEY) == 1

    a = runtime(WORKFLOWS).resume("A")
    assert a.status == "COMPLETED"
    assert world.calls["send"] == calls_by_a + 1, "A was not served B's recorded effect"
    assert a.result["result"] == b.result["result"]
    assert kinds(db, "A").count("TOOL_DISPATCHED") == 1
    assert [row[0] for row in side_effect_rows(db)] == [KEY]
    assert_effects_match_log(db)


def test_idempotent_key_resumed_first_run_then_second_run(
    db: Database, world: World, runtime: Any
) -> None:
    first = runtime(WORKFLOWS)
    assert crash(crashpoints.AFTER_TOOL_RETURNED, 1, lambda: first.start(KEYED, SEND, run_id="A"))
    a = runtime(WORKFLOWS).resume("A")
    assert world.calls["send"] == 2
    b = runtime(WORKFLOWS).run(KEYED, SEND, run_id="B")
    assert world.calls["send"] == 2
    assert a.result == b.result
    assert world.outbox.count(key=KEY) == 1


@pytest.mark.parametrize("point", WINDOW)
def test_at_most_once_key_when_the_first_run_died_in_the_window(
    db: Database, world: World, runtime: Any, point: str
) -> None:
    first = runtime(WORKFLOWS)
    assert crash(point, 1, lambda: first.start(KEYED, CHARGE, run_id="A"))
    happened = world.outbox.count(key=KEY)
    calls = world.calls["charge"]

    rt = runtime(WORKFLOWS)
    b = rt.run(KEYED, CHARGE, run_id="B")
    assert b.status == "DEAD_LETTERED", "B guessed about an effect A may have had"
    assert rt.resume("A").status == "DEAD_LETTERED"
    assert world.calls["charge"] == calls
    letters = {d.run_id: d for d in rt.dead_letters()}
    assert set(letters) == {"A", "B"}
    assert all(d.idempotency_key == KEY for d in letters.values())

    if happened:
        rt.resolve("A", {"charged": 42})
    else:
        rt.redrive("A")
    assert rt.state("A").status == "COMPLETED"
    b = rt.redrive("B")
    assert b.status == "COMPLETED"
    assert b.result["result"] == rt.state("A").result["result"] == {"charged": 42}
    assert world.outbox.count(key=KEY) == 1
    assert world.calls["charge"] == calls + (0 if happened else 1)
    assert_effects_match_log(db)


def _conflict(
    db: Database, world: World, runtime: Any, first: dict[str, Any], second: dict[str, Any]
) -> Any:
    rt = runtime(WORKFLOWS)
    assert rt.run(KEYED, first, run_id="A").status == "COMPLETED"
    calls = dict(world.calls)
    caught = rt.run(CATCHING, second, run_id="B")
    uncaught = rt.run(KEYED, second, run_id="C")
    assert dict(world.calls) == {**calls, "llm": calls["llm"] + 1}
    return caught, uncaught


@pytest.mark.parametrize(
    "second",
    [
        {**SEND, "args": {"to": "a@b.c", "body": "another invoice"}},
        {**SEND, "name": "charge", "args": {"amount": 1}},
        {**SEND, "name": "search", "args": {"q": "x"}},
    ],
    ids=["other-args", "other-tool", "other-tool-same-mode"],
)
def test_reusing_a_key_for_something_else_is_a_clear_error(
    db: Database, world: World, runtime: Any, second: dict[str, Any]
) -> None:
    caught, uncaught = _conflict(db, world, runtime, SEND, second)

    assert caught.status == "COMPLETED"
    assert caught.result["error_type"] == "IdempotencyKeyConflict"
    assert caught.result["tool"] == second["name"]
    assert KEY in caught.result["message"]
    assert uncaught.status == "FAILED"
    assert uncaught.error is not None
    assert KEY in uncaught.error and "IdempotencyKeyConflict" in uncaught.error
    assert [row[0] for row in side_effect_rows(db)] == [KEY]
    assert world.outbox.count(key=KEY) == 1


def test_reusing_a_key_held_by_a_run_that_died_in_the_window_is_a_conflict(
    db: Database, world: World, runtime: Any
) -> None:
    first = runtime(WORKFLOWS)
    assert crash(crashpoints.AFTER_TOOL_DISPATCHED, 1, lambda: first.start(KEYED, SEND, run_id="A"))
    other = {**SEND, "args": {"to": "a@b.c", "body": "not the same"}}
    caught = runtime(WORKFLOWS).run(CATCHING, other, run_id="B")
    assert caught.result["error_type"] == "IdempotencyKeyConflict"
    assert world.calls["send"] == 0
    assert runtime(WORKFLOWS).resume("A").status == "COMPLETED"
    assert world.outbox.count(key=KEY) == 1


def test_reusing_a_key_inside_one_run(db: Database, world: World, runtime: Any) -> None:
    state = runtime(WORKFLOWS).run(TWICE, {"key": KEY}, run_id="T")
    assert state.status == "FAILED"
    assert state.error is not None and KEY in state.error
    assert "IdempotencyKeyConflict" in state.error
    assert world.calls["send"] == 1


def test_the_key_handed_to_the_tool_is_explicit_or_run_id_and_position(
    db: Database, world: World, runtime: Any
) -> None:
    state = runtime(WORKFLOWS).run(DERIVED, None, run_id="D")
    assert state.status == "COMPLETED"
    rows = logical(event_rows(db, "D"))
    started = {r[3]: codec.decode(r[5]) for r in rows if r[2] == "STEP_STARTED"}
    [send_position] = [
        p for p, c in started.items() if c[0] == "tool" and c[3] is None and c[1] == "send"
    ]
    assert send_position == 3
    assert world.keys_seen == [("send", "durabl:D:3"), ("send", KEY)]
    assert sorted(row[0] for row in side_effect_rows(db)) == sorted(
        ["durabl:D:3", "durabl:D:4", KEY]
    )


def test_the_derived_key_is_the_same_after_a_crash(
    db: Database, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)
    assert crash(crashpoints.AFTER_TOOL_RETURNED, 1, lambda: rt.start(DERIVED, None, run_id="D"))
    assert runtime(WORKFLOWS).resume("D").status == "COMPLETED"
    assert world.keys_seen == [("send", "durabl:D:3"), ("send", "durabl:D:3"), ("send", KEY)]
    assert world.outbox.count(key="durabl:D:3") == 1


def test_the_key_is_handed_only_to_a_keyword_only_parameter(
    db: Database, clock: Clock, runtime: Any
) -> None:
    seen: list[Any] = []

    def positional(body: str, idempotency_key: str | None = None) -> str:
        seen.append(idempotency_key)
        return body

    def keyword_only(body: str, *, idempotency_key: str) -> str:
        seen.append(idempotency_key)
        return body

    def wf(ctx: Any) -> Any:
        yield ToolCall("positional", {"body": "p"})
        yield ToolCall("keyword_only", {"body": "k"}, idempotency_key="kw-key")

    rt = runtime(
        {"oracle_keys.kinds": wf},
        tools={"positional": tool(positional, mode="IDEMPOTENT"), "keyword_only": keyword_only},
    )
    assert rt.run("oracle_keys.kinds", None, run_id="K").status == "COMPLETED"
    assert seen == [None, "kw-key"]
