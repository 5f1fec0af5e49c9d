"""Async workflows, tools and model clients, and the async API (``durabl.aio``), on both backends.

- An ``async def`` workflow with async tools and an async model client writes the same log as
  the equivalent sync workflow (events, steps, fingerprints, results), through either API.
- From the async API, the workflow body and every async call run on the caller's loop; the
  model client sees its ``ModelCallContext``; no commit is made on the loop.
- A death in an async run is resumed by a fresh runtime's ``aresume_all`` with no committed
  step executed again.
- ``aserve`` drives many runs at once, their async calls overlapping on the caller's one loop.
- The sync API runs async calls on durabl's private loop, which ``close()`` stops.
- A dry replay of an async workflow calls nothing.

The test doubles are the model and the tools only.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

import durabl.llm
from durabl import (
    ModelCall,
    Parallel,
    RetryPolicy,
    Runtime,
    Sleep,
    ToolCall,
    ToolFailed,
    events,
    tool,
    workflow,
)
from durabl.aio import Return
from durabl.codec import decode
from durabl.crashpoints import AFTER_STEP_COMMITTED, CrashAt, ProcessDeath, install

T0_S = 1_800_000_000.0


def run_async(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(main())


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``db(name)``: a fresh database (a file, or a PostgreSQL database) for one runtime."""
    if request.param == "sqlite":
        return lambda name: str(tmp_path / f"{name}.db")
    postgres_db: Callable[[], str] = request.getfixturevalue("postgres_db")
    return lambda name: postgres_db()


# -- the same agent, sync and async ----------------------------------------------------------


class World:
    """The model and the tools, sync and async, counting their calls."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def answer(self, prompt: Any, **params: Any) -> dict[str, Any]:
        self.calls[f"llm:{prompt}"] += 1
        return {"text": f"answer({prompt})", "tokens": len(str(prompt)), "params": params}

    def search(self, q: str) -> list[str]:
        self.calls[f"search:{q}"] += 1
        return [f"{q}-1", f"{q}-2"]

    def send(self, *, to: str, body: str) -> dict[str, str]:
        self.calls[f"send:{to}"] += 1
        return {"sent": f"{to}:{body}"}

    def broken(self, why: str) -> None:
        self.calls[f"broken:{why}"] += 1
        raise ValueError(f"broken: {why}")

    async def async_answer(self, prompt: Any, **params: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return self.answer(prompt, **params)

    async def async_search(self, q: str) -> list[str]:
        await asyncio.sleep(0)
        return self.search(q)

    async def async_send(self, *, to: str, body: str) -> dict[str, str]:
        await asyncio.sleep(0)
        return self.send(to=to, body=body)

    async def async_broken(self, why: str) -> None:
        await asyncio.sleep(0)
        self.broken(why)

    def tools(self, *, use_async: bool) -> dict[str, Any]:
        pick = (lambda f, a: a) if use_async else (lambda f, a: f)
        return {
            "search": tool(pick(self.search, self.async_search)),
            "send": tool(pick(self.send, self.async_send), mode="AT_MOST_ONCE"),
            "broken": tool(
                pick(self.broken, self.async_broken),
                retry=RetryPolicy(max_attempts=2, base_delay=0.0),
            ),
        }

    def runtime(self, db: str, *, use_async: bool, **options: Any) -> Runtime:
        return Runtime(
            db,
            llm=self.async_answer if use_async else self.answer,
            tools=self.tools(use_async=use_async),
            clock=lambda: T0_S,
            **options,
        )


def sync_agent(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"plan {topic}", temperature=0)
    started_s = ctx.now()
    hits = yield ToolCall("search", {"q": topic})
    pair = yield Parallel([ToolCall("search", {"q": "a"}), ToolCall("search", {"q": "b"})])
    sent = yield ToolCall("send", {"to": "boss", "body": plan["text"]}, idempotency_key="report")
    try:
        yield ToolCall("broken", {"why": topic})
        fallback = "none"
    except ToolFailed as failed:
        fallback = failed.error_type
    v2 = ctx.patched("summary-v2")
    yield Sleep(seconds=0)
    summary = yield ModelCall({"summarise": hits + pair[0] + pair[1]})
    return {"at": started_s, "sent": sent, "fallback": fallback, "v2": v2, "summary": summary}


async def async_agent(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"plan {topic}", temperature=0)
    await asyncio.sleep(0)  # not recorded, like any I/O in a workflow body
    started_s = await ctx.now()
    hits = yield ToolCall("search", {"q": topic})
    pair = yield Parallel([ToolCall("search", {"q": "a"}), ToolCall("search", {"q": "b"})])
    sent = yield ToolCall("send", {"to": "boss", "body": plan["text"]}, idempotency_key="report")
    try:
        yield ToolCall("broken", {"why": topic})
        fallback = "none"
    except ToolFailed as failed:
        fallback = failed.error_type
    v2 = await ctx.patched("summary-v2")
    yield Sleep(seconds=0)
    summary = yield ModelCall({"summarise": hits + pair[0] + pair[1]})
    yield Return(
        {"at": started_s, "sent": sent, "fallback": fallback, "v2": v2, "summary": summary}
    )


def comparable(log: list[events.Event]) -> dict[int, list[tuple[Any, ...]]]:
    """Each step's events in order, without what differs between two runtimes: RUN_STARTED names
    the process, every event has its time, and the branches of a Parallel, running at once,
    interleave their events in the log as they happen to finish."""
    steps: dict[int, list[tuple[Any, ...]]] = {}
    for e in log:
        if e.kind == events.RUN_STARTED:
            started = decode(e.data or "{}")
            row: tuple[Any, ...] = (e.kind, started["workflow"], started["input"])
        else:
            row = (e.kind, e.fp, e.data)
        steps.setdefault(e.step, []).append(row)
    return steps


@pytest.mark.parametrize("api", ["sync", "async"])
def test_an_async_agent_writes_the_same_log_as_its_sync_twin(
    db: Callable[[str], str], api: str
) -> None:
    sync_world, async_world = World(), World()
    with sync_world.runtime(db("sync"), use_async=False, workflows={"agent": sync_agent}) as rt:
        expected = rt.run("agent", {"topic": "otters"}, run_id="twin")
        expected_log = rt.store.load_log("twin")
    assert expected.status == events.COMPLETED, expected.error
    assert expected.result["fallback"] == "ValueError"

    with async_world.runtime(db("async"), use_async=True, workflows={"agent": async_agent}) as rt:
        if api == "sync":
            state = rt.run("agent", {"topic": "otters"}, run_id="twin")
        else:
            state = run_async(lambda: rt.arun("agent", {"topic": "otters"}, run_id="twin"))
        log = rt.store.load_log("twin")
    assert state.status == events.COMPLETED, state.error
    assert state.result == expected.result
    assert (state.steps_executed, state.steps_replayed) == (
        expected.steps_executed,
        expected.steps_replayed,
    )
    assert comparable(log) == comparable(expected_log)
    assert [e.seq for e in log] == list(range(1, len(expected_log) + 1))
    kinds = {e.kind for e in log}
    assert {events.CTX_RECORDED, events.STEP_RETRY, events.STEP_FAILED} <= kinds
    assert async_world.calls == sync_world.calls
    assert async_world.calls["broken:otters"] == 2  # one retry, then the failure was caught


# -- the caller's loop -------------------------------------------------------------------------


class OnTheLoop:
    """Async tools and model client that note where they ran and what they saw."""

    def __init__(self) -> None:
        self.loops: list[asyncio.AbstractEventLoop] = []
        self.model_calls: list[tuple[str, int, int]] = []
        self.body_loops: list[asyncio.AbstractEventLoop] = []

    async def lookup(self, q: str) -> list[str]:
        self.loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)
        return [q.upper()]

    async def llm(self, prompt: Any, **params: Any) -> dict[str, Any]:
        self.loops.append(asyncio.get_running_loop())
        call = durabl.llm.current()
        assert call is not None  # a failure here fails the step: the test sees it below
        self.model_calls.append((call.run_id, call.step, call.attempt))
        call.chunk("hal")
        await asyncio.sleep(0)
        call.chunk("f done")
        return {"text": f"{prompt}: half done"}

    def runtime(self, db: str) -> Runtime:
        return Runtime(db, llm=self.llm, tools={"lookup": tool(self.lookup)})


BODY_LOOPS: list[asyncio.AbstractEventLoop] = []


@workflow(name="aio_looped")
async def looped(ctx: Any, topic: str) -> Any:
    BODY_LOOPS.append(asyncio.get_running_loop())
    found = yield ToolCall("lookup", {"q": topic})
    BODY_LOOPS.append(asyncio.get_running_loop())
    said = yield ModelCall(f"about {found[0]}")
    yield Return({"found": found, "said": said["text"]})


def test_the_async_api_runs_the_body_and_every_async_call_on_the_callers_loop(
    db: Callable[[str], str],
) -> None:
    doubles = OnTheLoop()
    BODY_LOOPS.clear()

    async def main() -> tuple[asyncio.AbstractEventLoop, Any]:
        with doubles.runtime(db("loop")) as rt:
            return asyncio.get_running_loop(), await rt.arun(looped, {"topic": "kelp"})

    callers_loop, state = run_async(main)
    assert state.status == events.COMPLETED, state.error
    assert state.result == {"found": ["KELP"], "said": "about KELP: half done"}
    assert len(doubles.loops) == 2
    assert all(loop is callers_loop for loop in doubles.loops)
    assert len(BODY_LOOPS) == 2
    assert all(loop is callers_loop for loop in BODY_LOOPS)


@workflow(name="aio_fanned")
async def fanned(ctx: Any, topics: list[str]) -> Any:
    found = yield Parallel([ToolCall("lookup", {"q": t}) for t in topics])
    yield Return(found)


def test_the_branches_of_a_parallel_call_on_the_callers_loop(tmp_path: Path) -> None:
    doubles = OnTheLoop()

    async def main() -> tuple[asyncio.AbstractEventLoop, Any]:
        with doubles.runtime(str(tmp_path / "fanned.db")) as rt:
            return asyncio.get_running_loop(), await rt.arun(fanned, {"topics": ["a", "b"]})

    callers_loop, state = run_async(main)
    assert state.result == [["A"], ["B"]]
    assert [loop is callers_loop for loop in doubles.loops] == [True, True]


def test_an_async_model_client_sees_its_model_call_and_streams_from_the_loop(
    db: Callable[[str], str],
) -> None:
    doubles = OnTheLoop()
    committed_in: list[threading.Thread] = []

    async def main() -> tuple[threading.Thread, Any, list[events.Event]]:
        with doubles.runtime(db("context")) as rt:
            rt.observe(lambda run_id, new, history: committed_in.append(threading.current_thread()))
            state = await rt.arun(looped, {"topic": "reef"}, run_id="seen")
            return threading.current_thread(), state, rt.store.load_log("seen")

    loop_thread, state, log = run_async(main)
    assert state.status == events.COMPLETED, state.error
    assert doubles.model_calls == [("seen", 2, 1)]
    partials = [e for e in log if e.kind == events.STEP_PARTIAL]
    assert partials and partials[0].step == 2
    assert decode(partials[0].data or "{}")["text"].startswith("hal")
    completed = next(e for e in log if e.kind == events.STEP_COMPLETED and e.step == 2)
    assert all(p.seq < completed.seq for p in partials)
    # Every commit, the streamed text's too, was made by a durabl thread, never on the loop.
    assert committed_in
    assert loop_thread not in committed_in


# -- deaths and replays ----------------------------------------------------------------------


class Counted:
    def __init__(self) -> None:
        self.calls: Counter[int] = Counter()

    async def count(self, i: int) -> int:
        self.calls[i] += 1
        await asyncio.sleep(0)
        return i * 10

    def runtime(self, db: str) -> Runtime:
        return Runtime(db, tools={"count": tool(self.count)})


@workflow(name="aio_steady")
async def steady(ctx: Any, n: int) -> Any:
    got = []
    tag = await ctx.uuid()
    for i in range(n):
        got.append((yield ToolCall("count", {"i": i})))
        await asyncio.sleep(0)
    yield Return({"got": got, "tag": tag})


def test_a_death_in_an_async_run_is_resumed_by_aresume_all_with_no_step_run_again(
    db: Callable[[str], str],
) -> None:
    world = Counted()
    path = db("death")

    async def main() -> list[Any]:
        remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=2))
        try:
            dying = world.runtime(path)
            try:
                with pytest.raises(ProcessDeath):
                    await dying.arun(steady, {"n": 4}, run_id="dies")
            finally:
                dying.close()
        finally:
            remove()
        assert world.calls == {0: 1, 1: 1}
        with world.runtime(path) as fresh:
            states = await fresh.aresume_all()
            log = fresh.store.load_log("dies")
        return [states, log]

    states, log = run_async(main)
    assert [s.run_id for s in states] == ["dies"]
    state = states[0]
    assert state.status == events.COMPLETED, state.error
    assert state.result["got"] == [0, 10, 20, 30]
    assert (state.steps_replayed, state.steps_executed) == (3, 2)  # the uuid and two tools
    assert world.calls == {0: 1, 1: 1, 2: 1, 3: 1}
    recorded = [e for e in log if e.kind == events.CTX_RECORDED]
    assert len(recorded) == 1 and decode(recorded[0].data or "null") == state.result["tag"]


@workflow(name="aio_slow")
async def slow(ctx: Any, n: int) -> Any:
    first = yield ToolCall("count", {"i": n})
    started_s = await ctx.now()
    yield Sleep(hours=1)
    second = yield ToolCall("count", {"i": n + 1})
    yield Return([first, second, started_s])


def test_a_dry_replay_of_an_async_workflow_calls_nothing(db: Callable[[str], str]) -> None:
    world = Counted()
    with world.runtime(db("replay")) as rt:
        done = run_async(lambda: rt.arun(steady, {"n": 3}, run_id="done"))
        parked = run_async(lambda: rt.arun(slow, {"n": 5}, run_id="parked"))
        assert done.status == events.COMPLETED, done.error
        assert parked.status == events.SLEEPING, parked.error
        calls, log_lengths = (
            dict(world.calls),
            [len(rt.store.load_log(r)) for r in ("done", "parked")],
        )

        replayed = rt.replay("done")
        assert replayed.status == events.COMPLETED
        assert replayed.result == done.result
        assert (replayed.steps_executed, replayed.steps_replayed) == (0, 4)

        halfway = rt.replay("parked")
        assert halfway.steps_executed == 0
        assert halfway.next_step is not None and "Sleep" in halfway.next_step
        assert world.calls == calls
        assert [len(rt.store.load_log(r)) for r in ("done", "parked")] == log_lengths


# -- a worker on the caller's loop ---------------------------------------------------------------


@workflow(name="aio_served")
async def served(ctx: Any, i: int) -> Any:
    doubled = yield ToolCall("fetch", {"i": i})
    yield Return(doubled)


def test_aserve_drives_many_runs_at_once_their_calls_overlapping_on_one_loop(
    db: Callable[[str], str],
) -> None:
    concurrency, runs = 8, 16

    async def main() -> None:
        loop = asyncio.get_running_loop()
        seen_loops: set[asyncio.AbstractEventLoop] = set()
        inside, most_inside = 0, 0
        all_in = asyncio.Event()

        async def fetch(i: int) -> int:
            nonlocal inside, most_inside
            seen_loops.add(asyncio.get_running_loop())
            inside += 1
            most_inside = max(most_inside, inside)
            if inside == concurrency:
                all_in.set()
            try:
                # The first eight wait until eight calls are inside at once (a bound, not a
                # measurement: if they never are, the calls fail and the runs with them).
                await asyncio.wait_for(all_in.wait(), timeout=60)
                return i * 2
            finally:
                inside -= 1

        with Runtime(db("served"), tools={"fetch": tool(fetch)}) as rt:
            ids = [rt.submit(served, {"i": i}, run_id=f"served-{i}") for i in range(runs)]
            serving = asyncio.create_task(rt.aserve(concurrency=concurrency, poll_s=0.05))
            for _ in range(2400):  # until every run has ended (a bound of two minutes)
                states = await asyncio.to_thread(lambda: [rt.state(r) for r in ids])
                if all(s.status in events.TERMINAL_STATUSES for s in states):
                    break
                await asyncio.sleep(0.05)
            rt.stop()
            stats = await serving
        assert [s.status for s in states] == [events.COMPLETED] * runs
        assert [s.result for s in states] == [i * 2 for i in range(runs)]
        assert stats.completed == runs
        assert most_inside == concurrency
        assert seen_loops == {loop}

    run_async(main)


def test_a_cancelled_aserve_stops_its_worker(tmp_path: Path) -> None:
    async def main() -> Any:
        with Runtime(tmp_path / "cancelled.db") as rt:
            serving = asyncio.create_task(rt.aserve(poll_s=0.05))
            await asyncio.sleep(0)  # let it begin
            serving.cancel()
            with pytest.raises(asyncio.CancelledError):
                await serving
            # Stopped: a runtime that was asked to stop serves no more, and returns at once (the
            # bound only turns a worker that kept going into a failure instead of a hang).
            return await asyncio.wait_for(rt.aserve(poll_s=0.05), timeout=30)

    stats = run_async(main)
    assert stats.drives == 0


# -- the sync API --------------------------------------------------------------------------------


@workflow(name="aio_plain")
def plain(ctx: Any, topic: str) -> Any:
    found = yield ToolCall("lookup", {"q": topic})
    said = yield ModelCall(f"about {found[0]}")
    return [found, said["text"]]


def test_the_sync_api_runs_async_calls_on_a_private_loop_that_close_stops(
    tmp_path: Path,
) -> None:
    doubles = OnTheLoop()
    threads: list[threading.Thread] = []

    async def where(q: str) -> list[str]:
        threads.append(threading.current_thread())
        return await doubles.lookup(q)

    rt = Runtime(tmp_path / "private.db", llm=doubles.llm, tools={"lookup": tool(where)})
    try:
        sync_state = rt.run(plain, {"topic": "tide"})
        async_state = rt.run(looped, {"topic": "tide"})
    finally:
        loop_thread = threads[0] if threads else None
        alive_before_close = loop_thread is not None and loop_thread.is_alive()
        rt.close()
    assert sync_state.status == events.COMPLETED, sync_state.error
    assert sync_state.result == [["TIDE"], "about TIDE: half done"]
    assert async_state.status == events.COMPLETED, async_state.error
    assert loop_thread is not None and loop_thread is not threading.current_thread()
    assert threads == [loop_thread, loop_thread]  # one private loop for both runs
    assert alive_before_close
    assert not loop_thread.is_alive()
    assert all(loop.is_closed() for loop in doubles.loops)


# -- the shape of an async workflow ------------------------------------------------------------


FINALLY_RAN: list[str] = []


@workflow(name="aio_returns")
async def returns(ctx: Any, fail: bool) -> Any:
    try:
        found = yield ToolCall("count", {"i": 1})
        if fail:
            raise ValueError("no luck")
        yield Return(found)
        FINALLY_RAN.append("after the return")  # never: nothing after a Return runs
    finally:
        FINALLY_RAN.append("finally")


def test_return_ends_an_async_workflow_and_an_exception_fails_it(tmp_path: Path) -> None:
    FINALLY_RAN.clear()
    world = Counted()
    with world.runtime(tmp_path / "returns.db") as rt:
        done = run_async(lambda: rt.arun(returns, {"fail": False}))
        failed = run_async(lambda: rt.arun(returns, {"fail": True}))
    assert (done.status, done.result) == (events.COMPLETED, 10)
    assert failed.status == events.FAILED
    assert failed.error == "ValueError: no luck"
    assert FINALLY_RAN == ["finally", "finally"]


def test_an_async_function_that_yields_nothing_is_refused() -> None:
    async def not_a_generator(ctx: Any) -> int:
        return 1

    with pytest.raises(TypeError, match="yields nothing"):
        workflow(name="aio_refused")(not_a_generator)
