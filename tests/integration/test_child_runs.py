"""Child runs: ``result = yield ChildRun(workflow, input)`` (docs/DECISIONS.md, "Child runs"),
on both backends.

- A child is a run of its own: listed, with its own log whose RUN_STARTED names its parent and
  the parent's step; its id is the step's ``run_id`` or ``<parent>-<position>``. The parent's
  log holds only STEP_STARTED and STEP_COMPLETED at the ChildRun's position, and a dry replay
  serves it and calls nothing.
- A child that sleeps leaves the parent WAITING; the commit that ends the child writes the
  parent's STEP_COMPLETED and makes the parent due, and the next tick finishes the parent.
- A child that fails, or is cancelled, throws ``ChildRunFailed`` into the parent at the yield
  (naming the child and the error's type), and a replay throws the same.
- A death after the ChildRun is recorded, or inside the child, leaves one child, not two; the
  next runtime finishes both and no committed tool runs again.
- Cancelling a parent cancels the child it waits on, naming the parent.
- Bad input (a workflow not registered, an input that does not fit, a child id that is taken, a
  plain function, an input that is not JSON) holds the parent with one error naming the run and
  the step, writes nothing for that step and creates no child; the step's own mistakes are
  raised where it is built.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from durabl import ChildRun, ChildRunFailed, Runtime, Sleep, ToolCall, events, workflow
from durabl.crashpoints import (
    AFTER_STEP_COMMITTED,
    AFTER_STEP_STARTED,
    CrashAt,
    ProcessDeath,
    install,
)
from durabl.errors import BadStepError

T0_S = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


class Tools:
    """A tool that counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def shout(self, text: str) -> str:
        self.calls.append(text)
        return text.upper()

    def registry(self) -> dict[str, Any]:
        return {"shout": self.shout}


@workflow(name="child_shout")
def shout_child(ctx: Any, text: str) -> Any:
    return (yield ToolCall("shout", {"text": text}))


@workflow(name="child_pair")
def pair(ctx: Any, a: str, b: str) -> Any:
    first = yield ChildRun(shout_child, {"text": a})
    second = yield ChildRun("child_shout", {"text": b})  # by its registered name
    return [first, second]


@workflow(name="child_named")
def named(ctx: Any, child_id: str, text: str) -> Any:
    return (yield ChildRun(shout_child, {"text": text}, run_id=child_id))


@workflow(name="child_nap")
def nap(ctx: Any, text: str) -> Any:
    yield Sleep(60)
    return (yield ToolCall("shout", {"text": text}))


@workflow(name="child_broken")
def broken(ctx: Any, text: str) -> Any:
    yield ToolCall("shout", {"text": text})
    raise ValueError(f"cannot finish {text}")


@workflow(name="child_catches")
def catches(ctx: Any, child: str, text: str) -> Any:
    try:
        return {"result": (yield ChildRun(child, {"text": text}))}
    except ChildRunFailed as failed:
        return {"child": failed.child, "type": failed.error_type, "message": failed.message}


def plain(ctx: Any, text: str) -> Any:
    yield ToolCall("shout", {"text": text})


@pytest.fixture
def db(either_db: str) -> str:
    return either_db


def runtime(db: str, tools: Tools, clock: Clock | None = None) -> Runtime:
    return Runtime(db, tools=tools.registry(), clock=clock)


def started_data(rt: Runtime, run_id: str) -> dict[str, Any]:
    first = rt.store.load_log(run_id)[0]
    assert first.kind == events.RUN_STARTED
    return json.loads(first.data or "{}")


def kinds_at(rt: Runtime, run_id: str, step: int) -> list[str]:
    return [e.kind for e in rt.store.load_log(run_id) if e.step == step]


def run_ids(rt: Runtime) -> set[str]:
    return {row.run_id for row in rt.store.list_runs()}


def test_each_child_is_a_run_of_its_own_and_the_parent_gets_its_result(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(pair, {"a": "one", "b": "two"}, run_id="p")
        assert (state.status, state.result) == (events.COMPLETED, ["ONE", "TWO"])
        assert run_ids(rt) == {"p", "p-1", "p-2"}
        assert "parent" not in started_data(rt, "p")
        for position, text in [(1, "one"), (2, "two")]:
            child = f"p-{position}"
            data = started_data(rt, child)
            assert data["parent"] == {"run_id": "p", "step": position}
            assert (data["workflow"], data["input"]) == ("child_shout", {"text": text})
            assert (rt.state(child).status, rt.result(child)) == (events.COMPLETED, text.upper())
            assert kinds_at(rt, child, 1) == [
                events.STEP_STARTED,
                events.TOOL_DISPATCHED,
                events.STEP_COMPLETED,
            ]
            # The child's tool is in the child's log; the parent's holds the ChildRun alone.
            assert kinds_at(rt, "p", position) == [events.STEP_STARTED, events.STEP_COMPLETED]
        log = rt.store.load_log("p")
        started = [e for e in log if e.kind == events.STEP_STARTED]
        assert [json.loads(e.data or "[]")[:2] for e in started] == [["child", "child_shout"]] * 2
        completed = [e.data for e in log if e.kind == events.STEP_COMPLETED]
        assert completed == ['"ONE"', '"TWO"']
        replayed = rt.replay("p")
        assert (replayed.status, replayed.result) == (events.COMPLETED, ["ONE", "TWO"])
        assert (replayed.steps_replayed, replayed.steps_executed) == (2, 0)
    assert tools.calls == ["one", "two"]


def test_an_explicit_run_id_names_the_child(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(named, {"child_id": "my-child", "text": "hi"}, run_id="q")
        assert (state.status, state.result) == (events.COMPLETED, "HI")
        assert run_ids(rt) == {"q", "my-child"}
        assert rt.store.get_run("q-1") is None
        assert started_data(rt, "my-child")["parent"] == {"run_id": "q", "step": 1}


def test_a_sleeping_child_parks_the_parent_until_its_end_makes_the_parent_due(db: str) -> None:
    tools, clock = Tools(), Clock()
    with runtime(db, tools, clock) as rt:
        state = rt.run(catches, {"child": "child_nap", "text": "late"}, run_id="w")
        assert state.status == events.WAITING
        child = rt.state("w-1")
        assert (child.status, child.wake_at_s) == (events.SLEEPING, T0_S + 60)
        assert kinds_at(rt, "w", 1) == [events.STEP_STARTED]
        assert rt.tick(T0_S + 59) == []
        [woken] = rt.tick(T0_S + 60)  # the child is due; the parent is not, yet
        assert (woken.run_id, woken.status, woken.result) == ("w-1", events.COMPLETED, "LATE")
        # The child's completing commit wrote the parent's outcome and made it due.
        assert kinds_at(rt, "w", 1) == [events.STEP_STARTED, events.STEP_COMPLETED]
        parent = rt.store.get_run("w")
        assert parent is not None
        assert (parent.status, parent.wake_at_s) == (events.WAITING, T0_S)
        assert rt.store.due_runs(T0_S) == ["w"]
        [done] = rt.tick(T0_S + 60)
        assert (done.run_id, done.status, done.result) == (
            "w",
            events.COMPLETED,
            {"result": "LATE"},
        )
        assert rt.store.due_runs(T0_S + 3600) == []
    assert tools.calls == ["late"]


def test_a_failed_child_throws_child_run_failed_into_the_parent_and_on_replay(db: str) -> None:
    tools = Tools()
    expected = {"child": "f-1", "type": "ValueError", "message": "cannot finish x"}
    with runtime(db, tools) as rt:
        state = rt.run(catches, {"child": "child_broken", "text": "x"}, run_id="f")
        assert (state.status, state.result) == (events.COMPLETED, expected)
        child = rt.store.get_run("f-1")
        assert child is not None and child.status == events.FAILED
        assert kinds_at(rt, "f", 1) == [events.STEP_STARTED, events.STEP_FAILED]
        replayed = rt.replay("f")
        assert (replayed.status, replayed.result) == (events.COMPLETED, expected)
        assert replayed.steps_executed == 0
    assert tools.calls == ["x"]


def test_a_death_after_the_child_run_is_recorded_leaves_one_child(db: str) -> None:
    tools = Tools()
    # AFTER_STEP_STARTED: the first ChildRun (1), the first child's tool (2), the second (3).
    remove = install(CrashAt(AFTER_STEP_STARTED, occurrence=3))
    try:
        with runtime(db, tools) as rt, pytest.raises(ProcessDeath):
            rt.run(pair, {"a": "one", "b": "two"}, run_id="p")
    finally:
        remove()
    assert tools.calls == ["one"]
    with runtime(db, tools) as rt:
        assert run_ids(rt) == {"p", "p-1", "p-2"}  # the second child was created with its step
        assert [e.kind for e in rt.store.load_log("p-2")] == [events.RUN_STARTED]
        state = rt.resume("p")
        assert (state.status, state.result) == (events.COMPLETED, ["ONE", "TWO"])
        assert run_ids(rt) == {"p", "p-1", "p-2"}
        assert kinds_at(rt, "p", 2) == [events.STEP_STARTED, events.STEP_COMPLETED]
    assert tools.calls == ["one", "two"]


def test_a_death_inside_the_child_is_finished_by_the_next_runtime(db: str) -> None:
    tools = Tools()
    remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=1))  # the first child's tool
    try:
        with runtime(db, tools) as rt, pytest.raises(ProcessDeath):
            rt.run(pair, {"a": "one", "b": "two"}, run_id="p")
    finally:
        remove()
    assert tools.calls == ["one"]
    with runtime(db, tools) as rt:
        assert {row.run_id: row.status for row in rt.store.list_runs()} == {
            "p": events.RUNNING,
            "p-1": events.RUNNING,
        }
        rt.resume_all()
        assert {row.run_id: row.status for row in rt.store.list_runs()} == {
            "p": events.COMPLETED,
            "p-1": events.COMPLETED,
            "p-2": events.COMPLETED,
        }
        assert rt.result("p") == ["ONE", "TWO"]
        assert kinds_at(rt, "p", 1) == [events.STEP_STARTED, events.STEP_COMPLETED]
    assert tools.calls == ["one", "two"]  # the committed call was served, not made again


def test_cancelling_a_waiting_parent_cancels_its_sleeping_child(db: str) -> None:
    tools, clock = Tools(), Clock()
    with runtime(db, tools, clock) as rt:
        assert rt.run(catches, {"child": "child_nap", "text": "z"}, run_id="w").status == (
            events.WAITING
        )
        assert rt.cancel("w").status == events.CANCELLED
        child = rt.store.get_run("w-1")
        assert child is not None and child.status == events.CANCELLED
        assert child.error is not None and "parent run w was cancelled" in child.error
        assert rt.store.load_log("w-1")[-1].kind == events.RUN_CANCELLED
        assert kinds_at(rt, "w", 1) == [events.STEP_STARTED]  # nothing noted in an ended log
        assert rt.tick(T0_S + 3600) == []
        assert rt.state("w").status == events.CANCELLED
    assert tools.calls == []


def test_a_cancelled_child_throws_child_run_failed_into_its_parent(db: str) -> None:
    tools, clock = Tools(), Clock()
    with runtime(db, tools, clock) as rt:
        rt.run(catches, {"child": "child_nap", "text": "z"}, run_id="w")
        assert rt.cancel("w-1", "not needed").status == events.CANCELLED
        assert kinds_at(rt, "w", 1) == [events.STEP_STARTED, events.STEP_FAILED]
        [state] = rt.tick(T0_S)
        assert (state.run_id, state.status) == ("w", events.COMPLETED)
        assert state.result == {"child": "w-1", "type": "RunCancelled", "message": "not needed"}
    assert tools.calls == []


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (
            lambda: ChildRun("child_not_registered", {"text": "x"}),
            "not registered: no workflow named 'child_not_registered'",
        ),
        (lambda: ChildRun(shout_child, {"words": "x"}), "needs input key 'text'"),
        (lambda: ChildRun(shout_child, {"text": "x"}, run_id="taken"), "'taken' is the id of"),
        (lambda: ChildRun(plain, {"text": "x"}), "ChildRun takes a @workflow"),
        (lambda: ChildRun(shout_child, {"text": object()}), "input of ChildRun('child_shout')"),
    ],
    ids=["not-registered", "does-not-fit", "id-taken", "plain-function", "not-json"],
)
def test_bad_input_holds_the_parent_naming_it_and_writes_nothing(
    db: str, make: Callable[[], ChildRun], problem: str
) -> None:
    @workflow(name="child_bad")
    def bad(ctx: Any) -> Any:
        yield ToolCall("shout", {"text": "first"})
        return (yield make())

    tools = Tools()
    with runtime(db, tools) as rt:
        rt.run(shout_child, {"text": "other"}, run_id="taken")
        taken_log = rt.store.load_log("taken")
        with pytest.raises(BadStepError) as raised:
            rt.run(bad, run_id="bad")
        assert str(raised.value).startswith("run bad step 2: ")
        assert problem in str(raised.value)
        row = rt.store.get_run("bad")
        assert row is not None and row.status == events.HELD
        assert row.error == f"BadStepError: {raised.value}"
        assert {e.step for e in rt.store.load_log("bad")} == {0, 1}  # nothing at step 2
        assert run_ids(rt) == {"bad", "taken"}  # no child
        assert rt.store.load_log("taken") == taken_log
        assert rt.state("taken").status == events.COMPLETED
    assert tools.calls == ["other", "first"]


def test_bad_step_error_is_raised_where_the_child_run_is_built() -> None:
    with pytest.raises(BadStepError, match="ChildRun takes a @workflow or its registered name"):
        ChildRun(plain, {"text": "x"})
    with pytest.raises(BadStepError, match="ChildRun takes a @workflow"):
        ChildRun(42)
    with pytest.raises(BadStepError, match=r"the input of ChildRun\('child_shout'\)"):
        ChildRun(shout_child, {"text": object()})
    with pytest.raises(BadStepError, match="run_id"):
        ChildRun(shout_child, {"text": "x"}, run_id="")
    step = ChildRun(shout_child, {"text": "x"})
    assert (step.workflow, step.run_id) == ("child_shout", None)
    assert step == ChildRun("child_shout", {"text": "x"})  # the name and the workflow are one
