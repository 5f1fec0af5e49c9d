"""Loops without end: ``yield ContinueAsNew(input)`` (docs/DECISIONS.md, "Continue-as-new"),
on both backends.

- A run that continues ends CONTINUED, its result naming the next run, which starts in the same
  transaction with a fresh log naming the run it continues; each log holds only its own steps,
  and nothing after the yield runs. ``rt.run`` returns the state of the chain's last run, and
  starting again with the first id returns that same state instead of a new chain. A dry
  replay of an old run is CONTINUED and calls nothing.
- A death right after the continuing commit is finished by the next runtime's ``resume_all``:
  the chain has the runs it should, and each turn's tool ran once.
- Signals sent to a run and not yet taken go on to the next run; ``rt.signal`` to an old id of
  the chain reaches the run it has got to; every signal is delivered, none twice.
- In a child run, the parent gets the result of the chain's last run, and cancelling the parent
  cancels the run the child's chain has got to.
- Bad input (not JSON, an input the workflow cannot take) is refused where the step is built
  or holds the run with one error naming the run and the step, and writes nothing for it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import pytest

from durabl import ChildRun, ContinueAsNew, Runtime, ToolCall, WaitSignal, events, workflow
from durabl.crashpoints import AFTER_STEP_COMMITTED, CrashAt, ProcessDeath, install
from durabl.errors import BadStepError

T0_S = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


class Tools:
    """Tools that count their calls."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def count(self, n: int) -> int:
        self.calls.append(n)
        return n

    def reply(self, text: str) -> str:
        self.calls.append(text)
        return f"re: {text}"

    def registry(self) -> dict[str, Any]:
        return {"count": self.count, "reply": self.reply}


@workflow(name="can_counter")
def counter(ctx: Any, n: int) -> Any:
    yield ToolCall("count", {"n": n})
    if n >= 3:
        return {"final": n}
    yield ContinueAsNew({"n": n + 1})
    raise AssertionError("nothing after a ContinueAsNew runs")


@workflow(name="can_chat")
def chat(ctx: Any, turn: int, transcript: list[str]) -> Any:
    message = yield WaitSignal("msg")
    transcript = [*transcript, (yield ToolCall("reply", {"text": message}))]
    if turn >= 3:
        return transcript
    yield ContinueAsNew({"turn": turn + 1, "transcript": transcript})


@workflow(name="can_parent")
def parent(ctx: Any, child: str, input: Any) -> Any:
    return {"child": (yield ChildRun(child, input))}


@pytest.fixture
def db(either_db: str) -> str:
    return either_db


def runtime(db: str, tools: Tools, clock: Clock | None = None) -> Runtime:
    return Runtime(db, tools=tools.registry(), clock=clock)


def chain_of(rt: Runtime, first: str) -> list[str]:
    """The run ids of the chain from ``first``, followed through the public state."""
    chain = [first]
    while (state := rt.state(chain[-1])).status == events.CONTINUED:
        chain.append(state.result["continued_as"])
    return chain


def started_data(rt: Runtime, run_id: str) -> dict[str, Any]:
    first = rt.store.load_log(run_id)[0]
    assert first.kind == events.RUN_STARTED
    return json.loads(first.data or "{}")


CONTINUED_LOG = [
    (events.RUN_STARTED, 0),
    (events.STEP_STARTED, 1),
    (events.TOOL_DISPATCHED, 1),
    (events.STEP_COMPLETED, 1),
    (events.STEP_STARTED, 2),
    (events.STEP_COMPLETED, 2),
    (events.RUN_CONTINUED, 0),
]
"""A counter run's whole log: its own tool, its ContinueAsNew, and its end."""


def test_a_chain_ends_each_run_continued_and_returns_the_last(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(counter, {"n": 0}, run_id="c")
        assert (state.status, state.result) == (events.COMPLETED, {"final": 3})
        assert state.run_id != "c"
        chain = chain_of(rt, "c")
        assert len(chain) == 4 and chain[-1] == state.run_id
        assert {row.run_id for row in rt.store.list_runs()} == set(chain)
        for turn, (old, new) in enumerate(itertools.pairwise(chain)):
            row = rt.store.get_run(old)
            assert row is not None and row.status == events.CONTINUED
            assert json.loads(row.result_text or "{}") == {"continued_as": new}
            assert [(e.kind, e.step) for e in rt.store.load_log(old)] == CONTINUED_LOG
            assert json.loads(rt.store.load_log(old)[-1].data or "{}") == {"run_id": new}
            data = started_data(rt, new)
            assert (data["continued_from"], data["input"]) == (old, {"n": turn + 1})
            assert "parent" not in data
        assert "continued_from" not in started_data(rt, "c")
        assert {e.step for e in rt.store.load_log(state.run_id)} == {0, 1}
        assert tools.calls == [0, 1, 2, 3]  # one call a turn
        replayed = rt.replay("c")
        assert (replayed.status, replayed.steps_executed) == (events.CONTINUED, 0)
        assert replayed.steps_replayed == 2
        last = rt.replay(state.run_id)
        assert (last.status, last.result) == (events.COMPLETED, {"final": 3})
    assert tools.calls == [0, 1, 2, 3]


def test_starting_again_with_the_first_id_returns_the_chains_latest_run(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        first = rt.run(counter, {"n": 1}, run_id="again")
        again = rt.run(counter, {"n": 1}, run_id="again")
        assert again.run_id == first.run_id != "again"
        assert (again.status, again.result) == (events.COMPLETED, {"final": 3})
        assert len(rt.store.list_runs()) == 3  # not a second chain
    assert tools.calls == [1, 2, 3]


def test_a_death_after_the_continuing_commit_is_finished_by_resume_all(db: str) -> None:
    tools = Tools()
    # AFTER_STEP_COMMITTED: c's tool (1), c's ContinueAsNew (2), the next run's tool (3), and
    # that run's ContinueAsNew (4): die with the third run created and not yet driven.
    remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=4))
    try:
        with runtime(db, tools) as rt, pytest.raises(ProcessDeath):
            rt.run(counter, {"n": 0}, run_id="c")
    finally:
        remove()
    assert tools.calls == [0, 1]
    with runtime(db, tools) as rt:
        chain = chain_of(rt, "c")
        assert len(chain) == 3 and rt.state(chain[-1]).status == events.RUNNING
        assert [e.kind for e in rt.store.load_log(chain[-1])] == [events.RUN_STARTED]
        [state] = rt.resume_all()
        chain = chain_of(rt, "c")
        assert len(chain) == 4 and state.run_id == chain[-1]
        assert (state.status, state.result) == (events.COMPLETED, {"final": 3})
        assert {row.run_id for row in rt.store.list_runs()} == set(chain)
    assert tools.calls == [0, 1, 2, 3]


def test_signals_not_yet_taken_go_on_to_the_next_run_and_to_the_latest(db: str) -> None:
    tools, clock = Tools(), Clock()
    with runtime(db, tools, clock) as rt:
        rt.submit(chat, {"turn": 1, "transcript": []}, run_id="chat")
        # Both sent before the first run reaches its wait: it takes one, and carries the other.
        assert [rt.signal("chat", "msg", text) for text in ("a", "b")] == [1, 2]
        state = rt.resume("chat")
        first, second, third = chain_of(rt, "chat")
        assert (state.run_id, state.status) == (third, events.WAITING)
        assert tools.calls == ["a", "b"]
        old = rt.store.signals(first)
        assert [(s.id, s.payload_text) for s in old] == [(1, '"a"'), (2, '"b"')]
        assert old[0].delivered_step == 1  # taken by the wait
        assert old[1].delivered_step is not None  # handed on, not left pending
        carried = rt.store.signals(second)
        assert [(s.id, s.payload_text, s.delivered_step) for s in carried] == [(1, '"b"', 1)]
        assert rt.store.signals(third) == []
        # Sent to the first id, after the chain moved on: it goes to the run waiting now.
        assert rt.signal("chat", "msg", "c") == 1
        assert [s.payload_text for s in rt.store.signals(third)] == ['"c"']
        assert rt.store.signals(first) == old
        [done] = rt.tick()
        assert (done.run_id, done.status) == (third, events.COMPLETED)
        assert done.result == ["re: a", "re: b", "re: c"]
        for run_id in (first, second, third):
            delivered = [s.delivered_step for s in rt.store.signals(run_id)]
            assert None not in delivered
            assert delivered.count(1) == 1  # the run's one wait took one signal
    assert tools.calls == ["a", "b", "c"]  # each message answered once


def test_a_child_that_continues_gives_its_parent_the_chains_result(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(parent, {"child": "can_counter", "input": {"n": 2}}, run_id="cp")
        assert (state.status, state.result) == (events.COMPLETED, {"child": {"final": 3}})
        first, last = chain_of(rt, "cp-1")
        assert {row.run_id for row in rt.store.list_runs()} == {"cp", first, last}
        data = started_data(rt, last)
        assert data["parent"] == {"run_id": "cp", "step": 1}  # the chain keeps its parent
        assert data["continued_from"] == "cp-1"
        kinds = [e.kind for e in rt.store.load_log("cp") if e.step == 1]
        assert kinds == [events.STEP_STARTED, events.STEP_COMPLETED]  # the end, once
        replayed = rt.replay("cp")
        assert (replayed.result, replayed.steps_executed) == ({"child": {"final": 3}}, 0)
    assert tools.calls == [2, 3]


def test_cancelling_a_parent_cancels_where_its_childs_chain_has_got(db: str) -> None:
    tools, clock = Tools(), Clock()
    with runtime(db, tools, clock) as rt:
        start = {"child": "can_chat", "input": {"turn": 1, "transcript": []}}
        assert rt.run(parent, start, run_id="cc").status == events.WAITING
        rt.signal("cc-1", "msg", "a")
        [moved] = rt.tick()
        first, second = chain_of(rt, "cc-1")
        assert (moved.run_id, moved.status) == (second, events.WAITING)
        assert rt.cancel("cc").status == events.CANCELLED
        row = rt.store.get_run(second)
        assert row is not None and row.status == events.CANCELLED
        assert row.error is not None and "parent run cc was cancelled" in row.error
        assert rt.state(first).status == events.CONTINUED
    assert tools.calls == ["a"]


def test_bad_step_error_is_raised_where_the_continue_as_new_is_built() -> None:
    with pytest.raises(BadStepError, match="the input of ContinueAsNew"):
        ContinueAsNew(object())
    with pytest.raises(BadStepError, match="the input of ContinueAsNew"):
        ContinueAsNew({"n": float("nan")})
    assert ContinueAsNew({"n": 1}) == ContinueAsNew({"n": 1})


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: ContinueAsNew({"n": object()}), "the input of ContinueAsNew"),
        (lambda: ContinueAsNew({"m": 1}), "needs input key 'n'"),
    ],
    ids=["not-json", "does-not-fit"],
)
def test_bad_input_holds_the_run_naming_it_and_writes_nothing(
    db: str, make: Callable[[], ContinueAsNew], problem: str
) -> None:
    @workflow(name="can_bad")
    def bad(ctx: Any, n: int) -> Any:
        yield ToolCall("count", {"n": n})
        yield make()

    tools = Tools()
    with runtime(db, tools) as rt:
        with pytest.raises(BadStepError) as raised:
            rt.run(bad, {"n": 0}, run_id="bad")
        assert str(raised.value).startswith("run bad step 2: ")
        assert problem in str(raised.value)
        row = rt.store.get_run("bad")
        assert row is not None and row.status == events.HELD
        assert row.error == f"BadStepError: {raised.value}"
        assert {e.step for e in rt.store.load_log("bad")} == {0, 1}  # nothing at step 2
        assert [row.run_id for row in rt.store.list_runs()] == ["bad"]  # no next run
    assert tools.calls == [0]
