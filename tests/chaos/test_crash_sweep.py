"""A compact in-process crash sweep (SPEC §11).

The grid is (workflow x crash point x occurrence) over a small corpus that covers model calls,
both tool modes, explicit keys, a Sleep, ctx.now/random/uuid, a retry that succeeds on its
second attempt and a caught ToolFailed. For each triple the first "process" dies at the point
(``CrashAt`` raises ``ProcessDeath``); before anything resumes, the database is checked for a
torn write; then a brand-new Runtime on the same file finishes the run (``resume_all`` + ``tick``
with the injected clock moving on). Oracles after every triple: no duplicate effect, gapless log,
timers fired once and never early, the final result equals the uncrashed reference run's.

A triple whose point is never reached is counted as skipped; every counted triple took a death.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from durabl import ModelCall, Runtime, Sleep, ToolCall, ToolFailed, codec, crashpoints
from durabl.crashpoints import CrashAt, ProcessDeath
from oracles.support import (
    Clock,
    World,
    assert_effects_match_log,
    assert_gapless,
    assert_timers_once,
    drive_to_rest,
    event_rows,
)

RUN = "sweep-run"
MIN_COUNTED = 110
"""The one-death sweep must not silently shrink (it counts 118 triples)."""
MIN_TWICE = 400
"""Nor the two-death sweep (it counts 432 cases)."""
WINDOW = (crashpoints.AFTER_TOOL_DISPATCHED, crashpoints.AFTER_TOOL_RETURNED)


def agent(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"plan {topic}")
    hits = []
    for q in (topic, plan["text"][:12]):
        hits.extend((yield ToolCall("search", {"q": q})))
    sent = yield ToolCall("send", {"to": "boss", "body": topic}, idempotency_key=f"report-{topic}")
    yield Sleep(seconds=5)
    summary = yield ModelCall({"summarise": hits})
    return {"hits": sorted(hits), "sent": sent, "summary": summary["tokens"]}


def payment(ctx: Any, topic: str) -> Any:
    receipt = yield ToolCall("send", {"to": "payer", "body": f"invoice {topic}"})
    first = yield ToolCall("charge", {"amount": 10})
    second = yield ToolCall("charge", {"amount": 20}, idempotency_key=f"second-{ctx.run_id}")
    return [receipt, first["charged"] + second["charged"]]


def sleeper(ctx: Any, topic: str) -> Any:
    now_s = ctx.now()
    r = ctx.random()
    u = ctx.uuid()
    yield Sleep(seconds=60)
    again_s = ctx.now()
    sent = yield ToolCall("send", {"to": "sleeper", "body": topic})
    return {"sane": again_s >= now_s + 60 and 0 <= r < 1 and len(u) == 36, "sent": sent}


def retrying(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"how to retry {topic}")
    value = yield ToolCall("flaky", {"n": len(plan["text"])})
    try:
        yield ToolCall("broken", {"why": topic})
        fallback = "no"
    except ToolFailed as failed:
        fallback = failed.error_type
    sent = yield ToolCall("send", {"to": "retry", "body": f"{value}/{fallback}"})
    return [value, fallback, sent]


def mixed(ctx: Any, topic: str) -> Any:
    idea = yield ModelCall(f"idea for {topic}")
    yield Sleep(seconds=10)
    paid = yield ToolCall("charge", {"amount": idea["tokens"]}, idempotency_key=f"pay-{topic}")
    tag = ctx.uuid()
    sent = yield ToolCall("send", {"to": "mixed", "body": idea["text"]})
    return {"paid": paid, "sent": sent, "tagged": len(tag) == 36}


CORPUS: dict[str, Callable[..., Any]] = {
    "chaos.agent": agent,
    "chaos.payment": payment,
    "chaos.sleeper": sleeper,
    "chaos.retrying": retrying,
    "chaos.mixed": mixed,
}
INPUT = {"topic": "otters"}


@dataclass
class Outcome:
    result: str
    effects: Counter[tuple[str, str]]


@pytest.fixture
def scratch() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="durabl-sweep-", dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def effects(world: World) -> Counter[tuple[str, str]]:
    return Counter((r["tool"], r["key"].replace(RUN, "<run>")) for r in world.outbox.records())


def open_runtime(db: Path, world: World, clock: Clock) -> Runtime:
    return Runtime(db, llm=world.llm, tools=world.tools(), clock=clock, workflows=CORPUS)


def reference(folder: Path, name: str) -> Outcome:
    folder.mkdir()
    world, clock = World(folder), Clock()
    with open_runtime(folder / "durabl.db", world, clock) as rt:
        state = drive_to_rest(rt, clock, rt.start(name, INPUT, run_id=RUN))
    assert state.status == "COMPLETED", state
    return Outcome(codec.encode(state.result), effects(world))


def in_window_of_at_most_once(db: Path, point: str) -> bool:
    if point not in WINDOW:
        return False
    started = [r for r in event_rows(db, RUN) if r[2] == "STEP_STARTED"]
    return codec.decode(started[-1][5])[:2] == ["tool", "charge"]


def operate(rt: Runtime, world: World) -> None:
    """The operator checks the world, then resolves (it happened) or redrives (it did not)."""
    [letter] = rt.dead_letters()
    key = letter.idempotency_key or f"durabl:{RUN}:{letter.step}"
    seen = world.outbox.find(key)
    if seen is None:
        rt.redrive(RUN)
    else:
        rt.resolve(RUN, {"charged": seen["amount"]})


@dataclass
class Case:
    """One run of the grid: the deaths planned, and what happened."""

    name: str
    deaths: list[tuple[str, int]]
    died: int = 0
    ambiguous: int = 0
    dead_lettered: int = 0


def first_process(rt: Runtime, clock: Clock, case: Case) -> None:
    drive_to_rest(rt, clock, rt.start(case.name, INPUT, run_id=RUN))


def recover(rt: Runtime, clock: Clock, case: Case, world: World) -> Any:
    state = drive_to_rest(rt, clock, RUN)
    for _ in range(4):
        if state.status != "DEAD_LETTERED":
            break
        case.dead_lettered += 1
        assert all(n == 1 for n in effects(world).values()), effects(world)
        operate(rt, world)
        state = drive_to_rest(rt, clock, RUN)
    return state


def run_case(folder: Path, case: Case, expected: Outcome) -> None:
    """Each process but the last dies at its planned point; the checks run between and after."""
    folder.mkdir()
    db = folder / "durabl.db"
    world, clock = World(folder), Clock()
    state = None
    for index, (point, occurrence) in enumerate(case.deaths):
        with CrashAt(point, occurrence) as hook, open_runtime(db, world, clock) as rt:
            try:
                if index == 0:
                    first_process(rt, clock, case)
                else:
                    state = recover(rt, clock, case, world)
            except ProcessDeath as death:
                assert death.point == point
        if not hook.fired:
            break
        case.died += 1
        assert_effects_match_log(db)
        assert_gapless(db)
        case.ambiguous += in_window_of_at_most_once(db, point)
    if case.died == 0:
        return
    if state is None or case.died == len(case.deaths):
        with open_runtime(db, world, clock) as rt:
            state = recover(rt, clock, case, world)
    if len(case.deaths) == 1:
        assert case.dead_lettered == case.ambiguous, (
            "dead-lettered iff it died in an AT_MOST_ONCE window"
        )
    else:
        assert case.dead_lettered <= case.ambiguous, "dead-lettered without an ambiguous death"
    assert state.status == "COMPLETED", state
    assert codec.encode(state.result) == expected.result
    assert effects(world) == expected.effects
    assert_gapless(db)
    assert_timers_once(db)
    assert_effects_match_log(db)
    with open_runtime(db, world, clock) as rt:
        assert rt.dead_letters() == []


@dataclass
class Tally:
    """What a sweep did: cases that took every planned death, cases skipped, failures."""

    counted: Counter[str]
    skipped: int
    failures: list[str]

    def report(self) -> str:
        """The failures, then how many counted cases died at each point."""
        per_point: Counter[str] = Counter()
        for deaths, n in self.counted.items():
            for point in deaths.split(" then "):
                per_point[point] += n
        table = "\n".join(f"  {point:24} {per_point[point]:4}" for point in crashpoints.ALL)
        return (
            f"{len(self.failures)} case(s) broke an oracle; {self.total} counted, "
            f"{self.skipped} skipped (a planned point was never reached):\n"
            + "".join(f"{failure}\n" for failure in self.failures)
            + table
        )

    @property
    def total(self) -> int:
        return sum(self.counted.values())


Planner = Callable[[], Generator[list[tuple[str, int]], int, None]]


def sweep(scratch: Path, plans: Planner) -> Tally:
    """Run every planned case for every workflow of the corpus.

    ``plans()`` yields the deaths of successive cases and is sent back how many of them happened,
    so that it can move on once a point is no longer reached.
    """
    tally = Tally(Counter(), 0, [])
    serial = itertools.count()
    for name in CORPUS:
        expected = reference(scratch / f"{name}-reference", name)
        planner = plans()
        deaths: list[tuple[str, int]] | None = next(planner)
        while deaths is not None:
            case = Case(name, deaths)
            label = f"{name} x " + " then ".join(f"{p} #{n}" for p, n in deaths)
            try:
                run_case(scratch / f"case-{next(serial)}", case, expected)
            except AssertionError as exc:
                tally.failures.append(f"{label}: {exc}")
            if case.died == len(deaths):
                tally.counted[" then ".join(p for p, _ in deaths)] += 1
            elif all(n == 1 for _, n in deaths):
                tally.skipped += 1
            try:
                deaths = planner.send(case.died)
            except StopIteration:
                deaths = None
    return tally


def one_death() -> Generator[list[tuple[str, int]], int, None]:
    """Every point x every occurrence, until the point is no longer reached."""
    for point in crashpoints.ALL:
        occurrence = 1
        while (yield [(point, occurrence)]) == 1:
            occurrence += 1


def two_deaths() -> Generator[list[tuple[str, int]], int, None]:
    """Die at each point's first occurrence, then again at each point while recovering."""
    for first in crashpoints.ALL:
        for second in crashpoints.ALL:
            if (yield [(first, 1), (second, 1)]) == 0:
                break


def test_crash_sweep_one_death(scratch: Path) -> None:
    tally = sweep(scratch, one_death)
    assert not tally.failures, tally.report()
    assert tally.total >= MIN_COUNTED, tally.report()
    reached = set(tally.counted)
    assert set(crashpoints.ALL) - reached == {crashpoints.AFTER_DEAD_LETTERED}, tally.report()


def test_crash_sweep_two_deaths(scratch: Path) -> None:
    tally = sweep(scratch, two_deaths)
    assert not tally.failures, tally.report()
    assert tally.total >= MIN_TWICE, tally.report()
    seconds = {deaths.split(" then ")[1] for deaths in tally.counted}
    assert crashpoints.AFTER_DEAD_LETTERED in seconds, tally.report()
