"""Parallel steps: ``results = yield Parallel([...])`` (SPEC §18), on both backends.

- The branches run at once, in a pool bounded per call (``max_concurrency``) and per runtime
  (``parallelism``); their results come back in the order given, whatever order they finished.
- Each branch is a step of its own at the positions after the Parallel's, so replay is the same
  whatever the completion order, and after a crash only the unfinished branches run again.
- A failure is thrown (the first in the order given) once the others settle; ``fail_fast``
  begins no branch after it. A branch's backoff parks the run; an AT_MOST_ONCE branch caught in
  its window dead-letters the run and no sibling changes that.
- Bad input (an empty list, a nested Parallel, a Sleep inside) holds the run with one error
  naming the run and the step, and writes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from durabl import (
    ModelCall,
    Parallel,
    RetryPolicy,
    Runtime,
    Sleep,
    ToolCall,
    ToolFailed,
    ToolMode,
    events,
    tool,
    workflow,
)
from durabl.crashpoints import (
    AFTER_STEP_COMMITTED,
    AFTER_TOOL_DISPATCHED,
    CrashAt,
    ProcessDeath,
    install,
)
from durabl.errors import BadStepError, NonDeterminismError

T0_S = 1_800_000_000.0


def logged(rt: Any, run_id: str) -> list[events.Event]:
    """The run's log, each TOOL_COMPLETED as the STEP_STARTED, TOOL_DISPATCHED and
    STEP_COMPLETED it stands for."""
    return [each for e in rt.store.load_log(run_id) for each in events.expanded(e)]


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


class Tools:
    """Tools that count their calls and how many of them are inside at once."""

    def __init__(self, meet: int = 0) -> None:
        self.lock = threading.Lock()
        self.calls: list[str] = []
        self.inside = 0
        self.most_inside = 0
        self.barrier = threading.Barrier(meet) if meet else None
        self.failing: dict[str, int] = {}  # name -> failures left

    def fetch(self, name: str, delay_s: float = 0.0) -> str:
        with self.lock:
            self.calls.append(name)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            if self.barrier is not None:
                self.barrier.wait(timeout=10)  # breaks unless every branch is in at once
            time.sleep(delay_s)
            with self.lock:
                if self.failing.get(name, 0) > 0:
                    self.failing[name] -= 1
                    raise ConnectionError(f"{name} is down")
            return f"page {name}"
        finally:
            with self.lock:
                self.inside -= 1

    def registry(self, mode: ToolMode = ToolMode.IDEMPOTENT) -> dict[str, Any]:
        return {"fetch": tool(self.fetch, mode=mode)}


@workflow(name="par_research")
def research(ctx: Any, names: list[str], delays: list[float]) -> Any:
    pages = yield Parallel(
        [ToolCall("fetch", {"name": n, "delay_s": d}) for n, d in zip(names, delays, strict=True)]
    )
    summary = yield ModelCall("summarise", pages=pages)
    return {"pages": pages, "summary": summary}


@workflow(name="par_bounded")
def bounded(ctx: Any, names: list[str], limit: int) -> Any:
    return (
        yield Parallel(
            [ToolCall("fetch", {"name": n, "delay_s": 0.05}) for n in names],
            max_concurrency=limit,
        )
    )


@workflow(name="par_catches")
def catches(ctx: Any, names: list[str], fail_fast: bool) -> Any:
    try:
        yield Parallel(
            [ToolCall("fetch", {"name": n}) for n in names], fail_fast=fail_fast, max_concurrency=1
        )
    except ToolFailed as failed:
        return f"caught: {failed.message}"
    return "no failure"


def summarise(prompt: str, pages: list[str]) -> str:
    return f"{len(pages)} pages: " + "; ".join(pages)


@pytest.fixture
def db(either_db: str) -> str:
    return either_db


def runtime(db: str, counted: Tools, **options: Any) -> Runtime:
    options.setdefault("tools", counted.registry())
    return Runtime(db, llm=summarise, retry=RetryPolicy(max_attempts=1), **options)


def test_branches_run_at_once_and_come_back_in_the_order_given(db: str) -> None:
    tools = Tools(meet=3)  # the barrier breaks unless all three calls are inside together
    with runtime(db, tools) as rt:
        # The first branch is the slowest, so the branches finish in reverse order.
        state = rt.run(research, {"names": ["a", "b", "c"], "delays": [0.3, 0.15, 0.0]})
        assert state.status == events.COMPLETED, state.error
        assert state.result["pages"] == ["page a", "page b", "page c"]
        assert state.result["summary"] == "3 pages: page a; page b; page c"
        log = logged(rt, state.run_id)
    # The Parallel at position 1, its branches at 2..4 in the order given, the model at 5.
    started = {e.step: e.data for e in log if e.kind == events.STEP_STARTED}
    assert [started[p][:7] for p in sorted(started)] == ['["paral', *['["tool"'] * 3, '["model']
    assert ['"a"' in started[2], '"b"' in started[3], '"c"' in started[4]] == [True] * 3
    completions = [e.step for e in log if e.kind == events.STEP_COMPLETED]
    assert completions[:3] == [4, 3, 2]  # finished in reverse; recorded where they belong
    assert completions[3:] == [1, 5]


def test_a_replay_is_the_same_whatever_order_the_branches_finished_in(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        run_id = rt.start(research, {"names": ["a", "b", "c"], "delays": [0.1, 0.0, 0.05]})
        calls_before = list(tools.calls)
        replayed = rt.replay(run_id)
        assert replayed.status == events.COMPLETED
        assert replayed.result == rt.result(run_id)
        assert replayed.steps_executed == 0
        assert tools.calls == calls_before


def test_max_concurrency_bounds_one_call_and_parallelism_the_runtime(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(bounded, {"names": list("abcdef"), "limit": 2})
        assert state.result == [f"page {n}" for n in "abcdef"]
        assert tools.most_inside == 2
    tools = Tools()
    with runtime(db, tools, parallelism=3) as rt:
        state = rt.run(bounded, {"names": list("abcdefgh"), "limit": 8}, run_id="wide")
        assert state.result == [f"page {n}" for n in "abcdefgh"]
        assert tools.most_inside == 3


def test_after_a_crash_only_the_unfinished_branches_run_again(db: str) -> None:
    tools = Tools()
    names = ["a", "b", "c", "d"]
    # Serial branches (one at a time), dying right after the second branch's commit.
    remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=2))
    try:
        with runtime(db, tools) as rt, pytest.raises(ProcessDeath):
            rt.run(bounded, {"names": names, "limit": 1}, run_id="crashy")
    finally:
        remove()
    assert tools.calls == ["a", "b"]
    with runtime(db, tools) as rt:
        state = rt.resume("crashy")
        assert state.status == events.COMPLETED
        assert state.result == [f"page {n}" for n in names]
    assert tools.calls == ["a", "b", "c", "d"]  # a and b were served from the log


def test_a_death_in_one_branch_stops_every_sibling_from_writing(db: str) -> None:
    tools = Tools(meet=3)
    remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=1))
    try:
        with runtime(db, tools) as rt, pytest.raises(ProcessDeath):
            rt.run(research, {"names": ["a", "b", "c"], "delays": [0.2, 0.2, 0.0]}, run_id="d")
        with runtime(db, tools) as rt:
            log = logged(rt, "d")
    finally:
        remove()
    # Only c's completion landed; a and b returned after the death and wrote nothing.
    assert [e.step for e in log if e.kind == events.STEP_COMPLETED] == [4]
    tools.barrier = None  # two branches are left to run
    with runtime(db, tools) as rt:
        assert rt.resume("d").status == events.COMPLETED
    assert sorted(tools.calls) == ["a", "a", "b", "b", "c"]


def test_a_failure_is_thrown_after_the_others_settle(db: str) -> None:
    tools = Tools()
    tools.failing = {"b": 1, "c": 1}
    with runtime(db, tools) as rt:
        state = rt.run(catches, {"names": ["a", "b", "c", "d"], "fail_fast": False})
        assert state.result == "caught: b is down"  # the first failed branch, in order given
        assert tools.calls == ["a", "b", "c", "d"]  # every branch was attempted
        log = logged(rt, state.run_id)
        failed = [e.step for e in log if e.kind == events.STEP_FAILED]
        assert failed == [3, 4, 1]  # b and c, then the Parallel itself
        # Replay throws the same failure at the same point and calls nothing.
        assert rt.replay(state.run_id).result == "caught: b is down"
    assert tools.calls == ["a", "b", "c", "d"]


def test_fail_fast_begins_no_branch_after_a_failure(db: str) -> None:
    tools = Tools()
    tools.failing = {"b": 1}
    with runtime(db, tools) as rt:
        state = rt.run(catches, {"names": ["a", "b", "c", "d"], "fail_fast": True})
        assert state.result == "caught: b is down"
    assert tools.calls == ["a", "b"]


def test_a_branch_backoff_parks_the_run_and_only_that_branch_is_retried(db: str) -> None:
    tools = Tools()
    tools.failing = {"b": 1}
    clock = Clock()
    retry = RetryPolicy(max_attempts=2, base_delay=30.0)
    with Runtime(db, llm=summarise, tools=tools.registry(), clock=clock, retry=retry) as rt:
        state = rt.run(research, {"names": ["a", "b"], "delays": [0.0, 0.0]})
        assert state.status == events.SLEEPING
        assert state.wake_at_s == T0_S + 30.0
        assert rt.tick(T0_S + 29.0) == []
        clock.now_s = T0_S + 30.0
        [woken] = rt.tick()
        assert woken.status == events.COMPLETED
        assert woken.result["pages"] == ["page a", "page b"]
    assert tools.calls == ["a", "b", "b"]


def test_an_at_most_once_branch_in_its_window_dead_letters_the_run(db: str) -> None:
    tools = Tools()
    remove = install(CrashAt(AFTER_TOOL_DISPATCHED, occurrence=2))
    try:
        rt = runtime(db, tools, tools=tools.registry(ToolMode.AT_MOST_ONCE))
        with rt, pytest.raises(ProcessDeath):
            rt.run(bounded, {"names": ["a", "b", "c"], "limit": 1}, run_id="amo")
    finally:
        remove()
    assert tools.calls == ["a"]  # b was dispatched; the process died before the call
    with runtime(db, tools, tools=tools.registry(ToolMode.AT_MOST_ONCE)) as rt:
        state = rt.resume("amo")
        assert state.status == events.DEAD_LETTERED
        [letter] = rt.dead_letters()
        assert letter.step == 3  # b's own position, not the Parallel's
        assert rt.store.get_run("amo").status == events.DEAD_LETTERED  # c's commit kept it
        done = rt.resolve("amo", "page b (checked by hand)")
        assert done.status == events.COMPLETED
        assert done.result == ["page a", "page b (checked by hand)", "page c"]
    assert tools.calls == ["a", "c"]


def test_a_changed_branch_list_holds_the_run(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        run_id = rt.start(research, {"names": ["a"], "delays": [0.0]})

    @workflow(name="par_research")
    def changed(ctx: Any, names: list[str], delays: list[float]) -> Any:
        pages = yield Parallel([ToolCall("fetch", {"name": n}) for n in [*names, "extra"]])
        return pages

    try:
        held = r"recorded as Parallel\(1 step: .* now yields Parallel\(2 steps"
        with (
            runtime(db, tools, workflows=[changed]) as rt,
            pytest.raises(NonDeterminismError, match=held),
        ):
            rt.replay(run_id)
    finally:
        workflow(name="par_research")(research.fn)


@pytest.mark.parametrize(
    ("steps", "options", "problem"),
    [
        ([], {}, "Parallel([]) has no steps to run"),
        ([Parallel([ToolCall("fetch", {"name": "a"})])], {}, "step 0 is itself a Parallel"),
        ([Sleep(1)], {}, "a Parallel runs ModelCall and ToolCall steps"),
        ([ToolCall("fetch", {"name": "a"})], {"max_concurrency": 0}, "max_concurrency"),
    ],
)
def test_bad_input_holds_the_run_naming_it_and_writes_nothing(
    db: str, steps: list[Any], options: dict[str, Any], problem: str
) -> None:
    @workflow(name="par_bad")
    def bad(ctx: Any) -> Any:
        yield ToolCall("fetch", {"name": "first"})
        return (yield Parallel(steps, **options))

    tools = Tools()
    with runtime(db, tools) as rt:
        with pytest.raises(BadStepError) as raised:
            rt.run(bad, run_id="bad")
        assert str(raised.value).startswith("run bad step 2: Parallel")
        assert problem in str(raised.value)
        row = rt.store.get_run("bad")
        assert row is not None and row.status == events.HELD
        assert row.error == f"BadStepError: {raised.value}"
        # The first step's events, and nothing after them.
        assert [e.step for e in logged(rt, "bad")] == [0, 1, 1, 1]


def test_bad_step_error_is_raised_where_the_step_is_built() -> None:
    with pytest.raises(BadStepError, match=r"Parallel\(\[\]\) has no steps"):
        Parallel([])
    with pytest.raises(BadStepError, match="fail_fast must be True or False"):
        Parallel([ToolCall("t")], fail_fast="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="parallelism must be a whole number"):
        Runtime(":memory:", parallelism=0)


def test_a_compacted_parallel_replays_the_same_and_folds_whole(db: str) -> None:
    tools = Tools()
    with runtime(db, tools) as rt:
        state = rt.run(research, {"names": ["a", "b", "c"], "delays": [0.05, 0.0, 0.02]})
        report = rt.compact(state.run_id, reclaim=False)
        assert report.errors == {}
        [folded] = report.runs
        # Everything up to the model call's end folds: the Parallel ends after its branches.
        assert folded.steps_folded == 5
    with Runtime(db) as bare:  # no tools and no model: everything is served from the snapshot
        assert bare.replay(state.run_id).result == state.result
        assert bare.resume(state.run_id).status == events.COMPLETED
    assert sorted(tools.calls) == ["a", "b", "c"]


def test_compaction_cuts_a_prefix_before_a_parallel_that_is_not_finished(db: str) -> None:
    tools = Tools()
    tools.failing = {"b": 1}
    clock = Clock()
    retry = RetryPolicy(max_attempts=2, base_delay=30.0)
    with Runtime(db, llm=summarise, tools=tools.registry(), clock=clock, retry=retry) as rt:

        @workflow(name="par_then_more")
        def then_more(ctx: Any) -> Any:
            first = yield ToolCall("fetch", {"name": "first"})
            pages = yield Parallel([ToolCall("fetch", {"name": n}) for n in "ab"])
            return [first, *pages]

        state = rt.run(then_more, run_id="half")
        assert state.status == events.SLEEPING  # b backs off; a is recorded
        report = rt.compact("half", reclaim=False)
        [folded] = report.runs
        assert folded.steps_folded == 1  # the first call only: the Parallel is still open
        clock.now_s = T0_S + 30.0
        [woken] = rt.tick()
        assert woken.result == ["page first", "page a", "page b"]
    assert tools.calls == ["first", "a", "b", "b"]
