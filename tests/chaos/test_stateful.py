"""A stateful chaos test (SPEC §2-§5, §11): random operations against one database file.

A hypothesis ``RuleBasedStateMachine`` drives a random sequence of operations through a series
of ``Runtime`` instances ("processes") sharing one SQLite file, the injected clock and the world
(the model and the tools, which outlive every process):

- start a run of a small workflow with a fresh run id, or again with a known one (the same
  workflow and input is idempotent; anything else is a ``RunConflictError`` that changes nothing);
- arm a death (``CrashAt``) at any named crash point and occurrence; it stays armed until a
  drive reaches it (the occurrence counts across drives) or another death replaces it; when it
  strikes, the runtime is discarded, the file is checked for a torn write before anything
  resumes, and a fresh runtime is built on the same file (the path a restarted process takes);
- replay a run dry (nothing written, nothing called);
- resume one run, ``resume_all``, or move the clock on (by less than, exactly, or more than the
  time left on the earliest timer) and ``tick``;
- act as the operator on a dead letter: look in the world's ledger, resolve with the ledger's
  result if the effect happened, redrive if it did not;
- make the model endpoint fail its next call (the model call backs off on a durable timer);
- compact one run or all of them, keeping a random number of finished steps out of the
  snapshot: a dry replay, the run's state and its metrics must read the same before and after,
  and a death armed at the compaction's lease may strike it;
- restart cleanly (a new process with nothing interrupted).

Compaction deletes the prefix of a log it folds. The machine keeps every event it has seen, so
the invariants read each run's whole log: the events compaction folded (as the machine saw them
before) followed by the ones still in the file, which must number watermark+1..N with nothing
seen before changed. The oracle model replays each run's workflow against pure copies of the
world's doubles, fed the ctx values its log recorded: that gives the steps the run must yield
(position by position, the log must hold exactly those), the effects the world may see, and the
result a completed run must have. The invariants below are checked after every operation; at the end every run is driven to
completion and the world must have seen each of its effects exactly once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from durabl import (
    InvalidStateError,
    ModelCall,
    RetryPolicy,
    RunConflictError,
    RunState,
    Runtime,
    Sleep,
    Tool,
    ToolCall,
    ToolFailed,
    codec,
    crashpoints,
)
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.events import Event
from durabl.metrics import MetricsFold
from durabl.steps import CtxValue, Step
from oracles.support import (
    START_S,
    Clock,
    Snapshot,
    World,
    assert_effects_match_log,
    assert_gapless,
    assert_gapless_after_watermark,
    assert_log_and_effects_agree,
    assert_snapshot_gapless,
    assert_snapshot_timers,
    assert_timers_once,
    claim_rows,
    connect,
    event_rows,
    side_effect_rows,
)

TOPICS = ("otters", "kelp")
MAX_RUNS = 8
FLAKY_DELAY_S = 5.0
EFFECTFUL = ("send", "charge")
"""The tools whose calls the world's ledger (the outbox) records."""
AT_MOST_ONCE = ("charge",)
DONE = ("STEP_COMPLETED", "STEP_FAILED")
MODEL_RETRY = RetryPolicy(max_attempts=1000, base_delay=2.0)
"""The runtime's policy: a model call outlives every outage the machine can stage. (The tools
that fail have their own policies; AT_MOST_ONCE tools without one are attempted once.)"""
TOOL_WINDOW = (
    crashpoints.AFTER_STEP_STARTED,
    crashpoints.AFTER_TOOL_DISPATCHED,
    crashpoints.AFTER_TOOL_RETURNED,
    crashpoints.AFTER_STEP_COMMITTED,
)
SETTINGS = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# -- the workflows ----------------------------------------------------------------------------


def agent(ctx: Any, topic: str) -> Any:
    """Model calls, an IDEMPOTENT lookup, a Sleep, and an IDEMPOTENT send whose explicit key
    every agent run on the same topic shares."""
    plan = yield ModelCall(f"plan {topic}")
    hits = yield ToolCall("search", {"q": plan["text"][:16]})
    sent = yield ToolCall("send", {"to": "boss", "body": topic}, idempotency_key=f"report-{topic}")
    yield Sleep(seconds=30)
    summary = yield ModelCall({"summarise": hits})
    return {"hits": hits, "sent": sent, "tokens": summary["tokens"]}


def payment(ctx: Any, topic: str) -> Any:
    """AT_MOST_ONCE charges: one with a derived key, one whose explicit key every payment run on
    the same topic shares (the second run to reach it must get the first one's outcome)."""
    first = yield ToolCall("charge", {"amount": 10})
    receipt = yield ToolCall("send", {"to": "payer", "body": f"invoice {topic}"})
    fee = yield ToolCall("charge", {"amount": 3}, idempotency_key=f"fee-{topic}")
    return [receipt, first["charged"] + fee["charged"]]


def sleeper(ctx: Any, topic: str) -> Any:
    """ctx.now/random/uuid around a Sleep; the world sees the recorded uuid."""
    began_s = ctx.now()
    draw = ctx.random()
    tag = ctx.uuid()
    yield Sleep(seconds=60)
    woke_s = ctx.now()
    sent = yield ToolCall("send", {"to": "sleeper", "body": f"{topic}:{tag}"})
    return {
        "began": began_s,
        "draw": draw,
        "tag": tag,
        "slept": woke_s - began_s >= 60,
        "sent": sent,
    }


def retrying(ctx: Any, topic: str) -> Any:
    """A tool that fails its first attempt (durable backoff), and a caught ToolFailed."""
    plan = yield ModelCall(f"retry {topic}")
    value = yield ToolCall("flaky", {"n": plan["tokens"]})
    try:
        yield ToolCall("broken", {"why": topic})
        fallback = "none"
    except ToolFailed as failed:
        fallback = failed.error_type
    sent = yield ToolCall(
        "send",
        {"to": "retry", "body": f"{value}/{fallback}"},
        idempotency_key=f"retry-{ctx.run_id}",
    )
    return [value, fallback, sent]


def mixed(ctx: Any, topic: str) -> Any:
    """A Sleep before an AT_MOST_ONCE charge with an explicit per-run key, then a ctx value."""
    idea = yield ModelCall(f"idea {topic}")
    yield Sleep(seconds=10)
    paid = yield ToolCall("charge", {"amount": idea["tokens"]}, idempotency_key=f"pay-{ctx.run_id}")
    tag = ctx.uuid()
    sent = yield ToolCall("send", {"to": "mixed", "body": tag})
    return {"paid": paid, "tag": tag, "sent": sent}


WORKFLOWS: dict[str, Callable[..., Any]] = {
    "stateful.agent": agent,
    "stateful.payment": payment,
    "stateful.sleeper": sleeper,
    "stateful.retrying": retrying,
    "stateful.mixed": mixed,
}


# -- the oracle model -------------------------------------------------------------------------


def _answer(prompt: Any, **params: Any) -> dict[str, Any]:
    """What ``World.llm`` answers."""
    text = prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)
    return {"text": f"answer({text})", "tokens": len(text), "params": params}


def _broken(*, why: str) -> None:
    raise ValueError(f"broken: {why}")


PURE_TOOLS: dict[str, Callable[..., Any]] = {
    "send": lambda *, to, body: {"sent": f"{to}:{body}"},
    "charge": lambda *, amount: {"charged": amount},
    "search": lambda *, q: [f"{q}-1", f"{q}-2"],
    "flaky": lambda *, n: n * 10,
    "broken": _broken,
}
"""What each of ``World``'s tools returns (or raises) once it succeeds (or fails for good)."""
BROKEN_ATTEMPTS = 2
"""``World.tools()`` gives ``broken`` two attempts."""


class _ModelCtx:
    """The ctx the model hands a workflow: ctx values come from the run's log where it has them."""

    def __init__(self, run_id: str, recorded: dict[int, Any], steps: list[Step]) -> None:
        self.run_id = run_id
        self._recorded = recorded
        self._steps = steps

    def _value(self, what: str, placeholder: Any) -> Any:
        self._steps.append(CtxValue(what))
        return self._recorded.get(len(self._steps), placeholder)

    def now(self) -> float:
        return float(self._value("now", START_S))

    def random(self) -> float:
        return float(self._value("random", 0.5))

    def uuid(self) -> str:
        return str(self._value("uuid", "00000000-0000-4000-8000-000000000000"))


@dataclass(frozen=True)
class Expected:
    """What the model says about one run: its steps by position, and its result."""

    run_id: str
    steps: list[Step]
    result_text: str

    def key(self, position: int) -> str:
        step = self.steps[position - 1]
        assert isinstance(step, ToolCall)
        return step.idempotency_key or f"durabl:{self.run_id}:{position}"

    def effects(self) -> dict[str, tuple[str, dict[str, Any]]]:
        """Idempotency key -> (tool, args) for every step whose effect the world records."""
        return {
            self.key(position): (step.name, step.args)
            for position, step in enumerate(self.steps, start=1)
            if isinstance(step, ToolCall) and step.name in EFFECTFUL
        }


def expected_run(workflow: str, run_id: str, topic: str, recorded: dict[int, Any]) -> Expected:
    """Run the workflow against pure copies of the world, with the ctx values of ``recorded``."""
    steps: list[Step] = []
    gen = WORKFLOWS[workflow](_ModelCtx(run_id, recorded, steps), topic)
    send: Any = None
    throw: Exception | None = None
    while True:
        try:
            step = gen.send(send) if throw is None else gen.throw(throw)
        except StopIteration as stop:
            return Expected(run_id, steps, codec.encode(stop.value))
        steps.append(step)
        send, throw = None, None
        if isinstance(step, ModelCall):
            send = codec.round_trip(_answer(step.prompt, **step.params))[1]
        elif isinstance(step, ToolCall):
            try:
                send = codec.round_trip(PURE_TOOLS[step.name](**step.args))[1]
            except ValueError as exc:
                throw = ToolFailed(step.name, type(exc).__name__, str(exc), BROKEN_ATTEMPTS)


# -- reading the database file ----------------------------------------------------------------


@dataclass
class RunModel:
    run_id: str
    workflow: str
    topic: str


@dataclass(frozen=True)
class RunView:
    """One run as the file shows it: its row, and its log as (seq, kind, step, fp, data, at_s)."""

    status: str
    result: str | None
    error: str | None
    wake_at_s: float | None
    log: list[tuple[Any, ...]]


def read_runs(snap: Snapshot) -> dict[str, RunView]:
    return {
        rid: RunView(status, result, error, wake, snap.events.get(rid, []))
        for rid, status, result, error, wake in snap.runs.values()
    }


def next_wake_s(db: Path) -> float | None:
    with connect(db) as conn:
        return conn.execute("SELECT MIN(wake_at_s) FROM runs").fetchone()[0]


def all_state(db: Path, world: World) -> tuple[Any, ...]:
    """Everything an operation that must change nothing could have changed. (A run's lease is
    bookkeeping about who drives it, not its state: a refused operator action may take and
    release it.)"""
    with connect(db) as conn:
        runs = conn.execute(
            "SELECT run_id, workflow, input, status, result, error, created_s, updated_s, "
            "wake_at_s, watermark FROM runs ORDER BY run_id"
        ).fetchall()
    return (
        runs,
        event_rows(db),
        side_effect_rows(db),
        claim_rows(db),
        world.outbox.records(),
        sorted(world.calls.items()),
    )


def recorded_ctx(log: list[tuple[Any, ...]]) -> dict[int, Any]:
    return {r[2]: codec.decode(r[4]) for r in log if r[1] == "CTX_RECORDED"}


def timer_in_force(log: list[tuple[Any, ...]]) -> float | None:
    """The deadline the log says the run is waiting for (a Sleep or a retry backoff), if any.

    The clock is the only source of "now" in this test, so a backoff of zero seconds is a retry
    whose ``retry_at_s`` equals the event's own time; it arms nothing.
    """
    wake: float | None = None
    for _, kind, _, _, data, at_s in log:
        if kind == "TIMER_ARMED":
            wake = codec.decode(data)["fire_at_s"]
        elif kind == "STEP_RETRY":
            retry_at_s = codec.decode(data)["retry_at_s"]
            wake = retry_at_s if retry_at_s > at_s else wake
        elif kind in ("TIMER_FIRED", "STEP_STARTED", "RUN_COMPLETED", "RUN_FAILED"):
            wake = None
    return wake


@contextlib.contextmanager
def scratch_folder() -> Iterator[Path]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    folder = Path(tempfile.mkdtemp(prefix="durabl-stateful-", dir=base))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- the machine ------------------------------------------------------------------------------


class DurablMachine(RuleBasedStateMachine):
    """One database file, one world, one clock; a new Runtime for every process."""

    runtime_class: type[Runtime] = Runtime
    """What each process runs (a deliberately broken subclass must make the machine fail)."""
    runs = Bundle("runs")

    def __init__(self) -> None:
        super().__init__()
        self._folder = scratch_folder()
        self.folder = self._folder.__enter__()
        self.db = self.folder / "durabl.db"
        self.world = World(self.folder)
        self.clock = Clock()
        self.model: dict[str, RunModel] = {}
        self.armed: CrashAt | None = None
        self.serial = 0
        self.dead: list[str] = []
        self.failed_check = False
        self.late_calls: list[str] = []
        self.rt = self._boot()
        self.writer = self.rt.instance_id
        self.last_writer: dict[str, str] = {}
        self.seen_events: dict[str, int] = {}
        self.logs: dict[str, list[tuple[Any, ...]]] = {}
        """Every run's whole log as last read: what compaction folded, then the file's rows."""
        self.compacted = False
        """True once a compaction began: from then on a log's prefix may be gone from the file."""

    # -- processes ---------------------------------------------------------------------------

    def _boot(self) -> Runtime:
        return self.runtime_class(
            self.db,
            llm=self.world.llm,
            tools=self._watched(self.world.tools(flaky_delay_s=FLAKY_DELAY_S)),
            clock=self.clock,
            retry=MODEL_RETRY,
            workflows=WORKFLOWS,
            durability="process",
        )

    def _watched(self, tools: dict[str, Tool]) -> dict[str, Tool]:
        """The world's tools, noting every call made for a key whose effect is already recorded
        (a finished step run again, or a second run not given the first one's outcome)."""

        def watch(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def call(**args: Any) -> Any:
                key = args.get("idempotency_key")
                if key is not None and any(row[0] == key for row in side_effect_rows(self.db)):
                    self.late_calls.append(f"{name} called for {key!r}, already recorded")
                return fn(**args)

            return call

        return {name: dataclasses.replace(t, fn=watch(name, t.fn)) for name, t in tools.items()}

    def _drive(self, action: Callable[[Runtime], Any]) -> Any:
        """Run one operation; with a death armed, it may be the last thing this process does."""
        self.writer = self.rt.instance_id
        crash = self.armed
        if crash is None:
            return action(self.rt)
        try:
            with crash:
                return action(self.rt)
        except ProcessDeath as death:
            assert death.point == crash.point
            self.armed = None
            event(f"process died at {death.point}")
            self.rt.close()  # what the OS does for a dead process: its file handles go
            # Before anything resumes: the file must hold no torn write.
            snap = self.read()
            assert_log_and_effects_agree(snap)
            assert_snapshot_gapless(snap)
            assert_snapshot_timers(snap, finished=False)
            self.rt = self._boot()
            return None

    @contextlib.contextmanager
    def _checking(self) -> Iterator[None]:
        """Mark the machine broken until the block finishes, so teardown does not pile on."""
        self.failed_check = True
        yield
        self.failed_check = False

    def read(self) -> Snapshot:
        """One read of the file, each run's log made whole again: the events compaction folded
        into the run's snapshot (the machine saw them before they went) and the rows after the
        watermark, which must continue them with no gap. Nothing seen before may change."""
        snap = Snapshot(self.db)
        if not self.compacted:  # the file holds every whole log (and check() says gapless)
            self.logs = dict(snap.events)
            return snap
        with connect(self.db) as conn:
            marks = dict(
                conn.execute(
                    "SELECT run_id, CASE WHEN body IS NULL THEN -runs.watermark "
                    "ELSE runs.watermark END FROM runs LEFT JOIN snapshots USING (run_id)"
                ).fetchall()
            )
        for rid, live in snap.events.items():
            mark = marks[rid]
            assert mark >= 0, f"run {rid} is compacted up to seq {-mark} and has no snapshot"
            seqs = list(dict.fromkeys(row[0] for row in live))  # expanded events share a seq
            assert seqs == list(range(mark + 1, mark + 1 + len(seqs))), (
                f"run {rid} is compacted up to seq {mark} and holds seqs {seqs}"
            )
            known = self.logs.get(rid, [])
            seen = {row[0] for row in known}
            assert len(seen) >= mark, f"run {rid}: seqs up to {mark} were folded unseen"
            whole = [row for row in known if row[0] <= mark] + live
            assert whole[: len(known)] == known, f"run {rid}: an event seen before changed"
            snap.events[rid] = self.logs[rid] = whole
        return snap

    def observe(self, rid: str) -> tuple[Any, ...]:
        """What a user can learn about a run: a dry replay, its state, its metrics."""
        try:
            replayed: Any = self.rt.replay(rid)
        except Exception as exc:
            replayed = (type(exc).__name__, str(exc))
        return replayed, self.rt.state(rid), self.rt.metrics(rid)

    def check_metrics(self) -> None:
        """The metrics of every run are the fold of its whole log, compacted or not."""
        for rid, log in self.logs.items():
            whole = MetricsFold.of(Event(*row) for row in log).m
            assert self.rt.metrics(rid) == whole, f"run {rid}: metrics differ from its log"

    # -- rules -------------------------------------------------------------------------------

    @precondition(lambda self: len(self.model) < MAX_RUNS)
    @rule(target=runs, workflow=st.sampled_from(sorted(WORKFLOWS)), topic=st.sampled_from(TOPICS))
    def start(self, workflow: str, topic: str) -> str:
        with self._checking():
            self.serial += 1
            run_id = f"run-{self.serial}"
            self.model[run_id] = RunModel(run_id, workflow, topic)
            returned = self._drive(lambda rt: rt.start(workflow, {"topic": topic}, run_id=run_id))
            assert returned in (None, run_id)
        return run_id

    @rule(run=runs, variant=st.sampled_from(["same", "other input", "other workflow"]))
    def start_again(self, run: str, variant: str) -> None:
        with self._checking():
            known = self.model[run]
            workflow, topic = known.workflow, known.topic
            if variant == "other input":
                topic = next(t for t in TOPICS if t != topic)
            elif variant == "other workflow":
                workflow = next(w for w in sorted(WORKFLOWS) if w != workflow)
            if variant == "same":
                returned = self._drive(lambda rt: rt.start(workflow, {"topic": topic}, run_id=run))
                assert returned in (None, run)
                return
            before = all_state(self.db, self.world)
            with pytest.raises(RunConflictError):
                self.rt.start(workflow, {"topic": topic}, run_id=run)
            assert all_state(self.db, self.world) == before, "a refused start changed something"

    @rule(point=st.sampled_from(crashpoints.ALL), occurrence=st.integers(1, 3))
    def arm_crash(self, point: str, occurrence: int) -> None:
        """The n-th time a drive reaches the point, the process dies there. The death stays
        armed across drives until it strikes or another one replaces it."""
        self.armed = CrashAt(point, occurrence)

    @rule(point=st.sampled_from(TOOL_WINDOW), occurrence=st.integers(1, 2))
    def arm_crash_around_a_tool(self, point: str, occurrence: int) -> None:
        """The same, aimed at the instants around a tool call (where dead letters come from)."""
        self.armed = CrashAt(point, occurrence)

    @rule(run=runs)
    def resume(self, run: str) -> None:
        with self._checking():
            state = self._drive(lambda rt: rt.resume(run))
            if state is not None:
                self._check_states([state])

    @rule(run=runs)
    def dry_replay(self, run: str) -> None:
        """A dry replay rebuilds the run's state from its log: it writes nothing and calls
        nothing, wherever the log ends, and a finished run replays to its recorded result."""
        with self._checking():
            before = all_state(self.db, self.world)
            state = self._drive(lambda rt: rt.replay(run))
            assert all_state(self.db, self.world) == before, "a dry replay changed something"
            view = read_runs(self.read())[run]
            if state is not None and view.status == "COMPLETED":
                assert state.status == "COMPLETED", state
                assert codec.encode(state.result) == view.result, (state, view.result)

    @rule()
    def resume_all(self) -> None:
        with self._checking():
            self._check_states(self._drive(lambda rt: rt.resume_all()) or [])

    @rule(
        jump=st.sampled_from(["none", "less", "just short", "exact", "more", "any"]),
        fraction=st.floats(0.0, 1.0, exclude_max=True),
        extra_s=st.floats(0.001, 100.0),
    )
    def tick(self, jump: str, fraction: float, extra_s: float) -> None:
        """Move the clock on, measured against the earliest armed timer, and tick."""
        with self._checking():
            wake = next_wake_s(self.db)
            left_s = None if wake is None else max(0.0, wake - self.clock.now_s)
            if jump == "none":
                pass
            elif left_s is None or jump == "any":
                self.clock.advance(extra_s)
            elif jump == "less":
                self.clock.advance(left_s * fraction)
            elif jump == "just short":
                self.clock.advance(max(0.0, left_s - extra_s / 100.0))
            elif jump == "exact":
                self.clock.now_s = max(self.clock.now_s, wake)
            else:
                self.clock.advance(left_s + extra_s)
            crash = self.armed
            states = self._drive(lambda rt: rt.tick())
            if states is not None:
                self._check_states(states)
            if crash is None or not crash.fired:
                # tick fires exactly the timers due: none is left due behind it.
                for rid, view in read_runs(self.read()).items():
                    if view.status in ("RUNNING", "SLEEPING") and view.wake_at_s is not None:
                        assert view.wake_at_s > self.clock.now_s, (
                            f"run {rid} is due at {view.wake_at_s} but tick at "
                            f"{self.clock.now_s} left it {view.status}"
                        )

    @precondition(lambda self: bool(self.dead))
    @rule(data=st.data())
    def operate(self, data: st.DataObject) -> None:
        with self._checking():
            run = data.draw(st.sampled_from(self.dead), label="dead-lettered run")
            self._drive(lambda rt: self._operator(rt, run))

    @rule(run=runs, action=st.sampled_from(["redrive", "resolve"]))
    def operate_on_a_live_run(self, run: str, action: str) -> None:
        """An operator action on a run that is not dead-lettered is refused and changes nothing."""
        with self._checking():
            if run in self.dead:
                return
            before = all_state(self.db, self.world)
            with pytest.raises(InvalidStateError):
                if action == "redrive":
                    self.rt.redrive(run)
                else:
                    self.rt.resolve(run, {"charged": 0})
            assert all_state(self.db, self.world) == before, "a refused operator action wrote"

    @precondition(lambda self: bool(self.model))
    @rule(run=st.one_of(st.none(), runs), keep_last=st.integers(0, 4))
    def compact(self, run: str | None, keep_last: int) -> None:
        """Fold finished steps into snapshots: invisible to replay, state and metrics. A run
        whose lease another live process held would be skipped, but this machine runs one
        process at a time: every run is compacted (a death at the lease aside)."""
        with self._checking():
            targets = sorted(self.model) if run is None else [run]
            self.read()
            before = {rid: self.observe(rid) for rid in targets}
            marks = {rid: self._watermark(rid) for rid in targets}
            self.compacted = True
            report = self._drive(lambda rt: rt.compact(run, keep_last=keep_last))
            if report is not None:
                assert report.busy == [], report
                folded = {r.run_id: r for r in report.runs}
                assert set(folded) <= set(targets)
                for rid in targets:
                    mark = self._watermark(rid)
                    assert (rid in folded) == (mark > marks[rid]), (rid, marks[rid], mark)
                    if rid in folded:
                        assert folded[rid].watermark == mark
                        event(f"compacted {folded[rid].steps_folded} steps")
            self.read()
            assert {rid: self.observe(rid) for rid in targets} == before
            self.check_metrics()

    def _watermark(self, rid: str) -> int:
        with connect(self.db) as conn:
            return int(
                conn.execute("SELECT watermark FROM runs WHERE run_id = ?", (rid,)).fetchone()[0]
            )

    @precondition(lambda self: self.world.llm_failures_left == 0)
    @rule()
    def model_outage(self) -> None:
        """The model endpoint fails its next call: the model call backs off on a durable timer."""
        self.world.llm_failures_left = 1

    @rule()
    def restart(self) -> None:
        """A clean restart: the process exits between operations and a new one opens the file."""
        with self._checking():
            self.rt.close()
            self.rt = self._boot()

    def _check_states(self, states: list[RunState]) -> None:
        """What a drive reports is what the file says; no run was quietly skipped as broken
        (``resume_all`` and ``tick`` isolate a failing run and report it in its state)."""
        views = read_runs(self.read())
        for state in states:
            assert state.status == views[state.run_id].status, (state, views[state.run_id])
            assert state.error is None or state.status == "DEAD_LETTERED", state

    # -- the operator ------------------------------------------------------------------------

    def _operator(self, rt: Runtime, run_id: str) -> None:
        """Look in the world's ledger: resolve with what it shows, or redrive if it shows nothing.

        A key whose effect durabl already recorded (another run sharing it got there) is
        redriven: the step then takes the recorded outcome and calls nothing.
        """
        [letter] = [dl for dl in rt.dead_letters() if dl.run_id == run_id]
        key = letter.idempotency_key or f"durabl:{run_id}:{letter.step}"
        seen = self.world.outbox.find(key)
        recorded = any(row[0] == key for row in side_effect_rows(self.db))
        if seen is None or recorded:
            event("operator redrives")
            rt.redrive(run_id)
        else:
            event("operator resolves")
            rt.resolve(run_id, {"charged": seen["amount"]})

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def everything_agrees(self) -> None:
        with self._checking():
            self.check()

    def check(self) -> None:
        """Every invariant, over one read of the file."""
        snap = self.read()
        assert_snapshot_gapless(snap)
        assert_log_and_effects_agree(snap)
        assert_snapshot_timers(snap, finished=False)
        views = read_runs(snap)
        assert sorted(views) == sorted(self.model), "the runs table and the model disagree"
        assert not self.late_calls, self.late_calls
        effects = list(snap.effects.values())
        expected: dict[str, Expected] = {}
        for rid, known in self.model.items():
            view = views[rid]
            model = expected_run(known.workflow, rid, known.topic, recorded_ctx(view.log))
            expected[rid] = model
            self._check_log(known, view, model)
            self._check_status(rid, view, model)
        self._check_world(views, expected, effects)
        for rid, view in views.items():
            self._check_boundary(rid, view.log[self.seen_events.get(rid, 0) :])
            self.seen_events[rid] = len(view.log)
        self.dead = sorted(rid for rid, view in views.items() if view.status == "DEAD_LETTERED")

    def _check_log(self, known: RunModel, view: RunView, model: Expected) -> None:
        """The log holds, position by position, exactly the steps the model says the run yields."""
        rid = known.run_id
        started = [r for r in view.log if r[1] == "RUN_STARTED"]
        assert [r[0] for r in started] == [1], f"run {rid} has RUN_STARTED at {started}"
        data = codec.decode(started[0][4])
        assert (data["workflow"], data["input"]) == (known.workflow, {"topic": known.topic})
        finished: set[int] = set()
        for seq, kind, position, fp, data_text, _ in view.log:
            if position == 0:
                continue
            assert position <= len(model.steps), f"run {rid} seq {seq}: a step past the workflow"
            # A step that finished is served from the log from then on: nothing more of it.
            assert position not in finished, f"run {rid} seq {seq}: {kind} of a finished step"
            if kind in (*DONE, "TIMER_FIRED", "CTX_RECORDED"):
                finished.add(position)
            step = model.steps[position - 1]
            if kind == "STEP_STARTED":
                assert data_text == step.canonical, (
                    f"run {rid} step {position}: log has {data_text}, model {step.canonical}"
                )
            elif kind == "CTX_RECORDED":
                assert isinstance(step, CtxValue) and fp == step.fingerprint, (rid, position)
            elif kind in ("TIMER_ARMED", "TIMER_FIRED"):
                assert isinstance(step, Sleep), (rid, position, kind)
            elif kind in ("TOOL_DISPATCHED", "DEAD_LETTERED", "DLQ_REDRIVEN", "DLQ_RESOLVED"):
                assert isinstance(step, ToolCall), (rid, position, kind)
                if kind == "DEAD_LETTERED":
                    assert step.name in AT_MOST_ONCE, f"run {rid}: {step} was dead-lettered"
        self._check_at_most_once_protocol(rid, view, model)

    def _check_boundary(self, rid: str, new: list[tuple[Any, ...]]) -> None:
        """The events one operation appended were written by the process that ran it; if another
        process wrote the run's log before, they begin with RUN_RESUMED naming this one."""
        if not new:
            return
        marks = [r for r in new if r[1] in ("RUN_STARTED", "RUN_RESUMED")]
        if self.last_writer.get(rid) == self.writer:
            assert not marks, f"run {rid}: a process boundary where there was none: {marks}"
            return
        assert marks == new[:1], f"run {rid}: a new process wrote {[r[1] for r in new]}"
        owner = codec.decode(marks[0][4])["owner"]
        assert owner == self.writer, f"run {rid} seq {marks[0][0]} names process {owner}"
        self.last_writer[rid] = self.writer

    def _check_at_most_once_protocol(self, rid: str, view: RunView, model: Expected) -> None:
        """Once an AT_MOST_ONCE step is dispatched, its next word in the log is its outcome or a
        dead letter; it is attempted again only after an operator redrives it."""
        state: dict[int, str] = {}
        for seq, kind, position, _, _, _ in view.log:
            if position == 0:
                continue
            step = model.steps[position - 1]
            if not (isinstance(step, ToolCall) and step.name in AT_MOST_ONCE):
                continue
            now = state.get(position, "idle")
            if kind == "STEP_STARTED":
                assert now in ("idle", "redriven"), (
                    f"run {rid} seq {seq}: {step} is attempted again while {now} "
                    f"(events so far: {[r[1] for r in view.log if r[2] == position]})"
                )
                state[position] = "idle"
            elif kind == "TOOL_DISPATCHED":
                state[position] = "dispatched"
            elif kind == "DEAD_LETTERED":
                state[position] = "dead"
            elif kind in ("DLQ_REDRIVEN", "DLQ_RESOLVED"):
                assert now == "dead", f"run {rid} seq {seq}: {kind} of a step that is {now}"
                state[position] = "redriven" if kind == "DLQ_REDRIVEN" else "idle"
            elif kind in DONE:
                state[position] = "done"

    def _check_status(self, rid: str, view: RunView, model: Expected) -> None:
        """The run row says what the log says."""
        kinds = [r[1] for r in view.log]
        assert view.status not in ("FAILED", "CANCELLED", "HELD"), (rid, view.status, view.error)
        assert (view.status == "COMPLETED") == ("RUN_COMPLETED" in kinds), (rid, view.status)
        assert kinds.count("RUN_COMPLETED") <= 1 and "RUN_FAILED" not in kinds, (rid, kinds)
        if view.status == "COMPLETED":
            assert kinds[-1] == "RUN_COMPLETED", f"run {rid}: events after RUN_COMPLETED"
            assert view.result == view.log[-1][4], f"run {rid}: row and log results differ"
            assert view.result == model.result_text, (
                f"run {rid} completed with {view.result}; the model expects {model.result_text}"
            )
            assert view.wake_at_s is None, f"run {rid} is COMPLETED with a timer armed"
            assert view.error is None, f"run {rid} is COMPLETED with error {view.error!r}"
            return
        open_letters = (
            kinds.count("DEAD_LETTERED") - kinds.count("DLQ_REDRIVEN") - kinds.count("DLQ_RESOLVED")
        )
        assert open_letters in (0, 1), f"run {rid} has unbalanced dead letters: {kinds}"
        assert (view.status == "DEAD_LETTERED") == (open_letters == 1), (rid, view.status, kinds)
        assert (view.error is not None) == (view.status == "DEAD_LETTERED"), (rid, view)
        wake = timer_in_force(view.log)
        assert view.wake_at_s == wake, f"run {rid}: row wakes at {view.wake_at_s}, log at {wake}"
        if view.status != "DEAD_LETTERED":
            assert (view.status == "SLEEPING") == (wake is not None), (rid, view.status, wake)

    def _check_world(
        self,
        views: dict[str, RunView],
        expected: dict[str, Expected],
        effects: list[tuple[Any, ...]],
    ) -> None:
        """No effect twice, and every effect the world saw is one the model allows."""
        allowed: dict[str, set[str]] = {}
        for model in expected.values():
            for key, (tool_name, args) in model.effects().items():
                allowed.setdefault(key, set()).add(codec.encode([tool_name, args]))
        records = self.world.outbox.records()
        seen = Counter(r["key"] for r in records)
        twice = {key: n for key, n in seen.items() if n > 1}
        assert not twice, f"effects happened more than once: {twice}"
        for record in records:
            args = {k: v for k, v in record.items() if k not in ("tool", "key")}
            assert codec.encode([record["tool"], args]) in allowed.get(record["key"], set()), (
                f"the world saw {record}, which no run's model allows"
            )
        for tool_name, key in self.world.keys_seen:
            assert key in allowed, f"{tool_name} was handed key {key!r}, which no step has"
        charged = Counter(key for name, key in self.world.keys_seen if name in AT_MOST_ONCE)
        assert all(n == 1 for n in charged.values()), f"an AT_MOST_ONCE tool ran twice: {charged}"
        # An AT_MOST_ONCE tool, or one holding an explicit key, is called only after its
        # TOOL_DISPATCHED is committed: no call without one. (An IDEMPOTENT tool with a
        # derived key commits its opening with its outcome, so a death during it leaves none.)
        dispatched = Counter(
            expected[rid].key(r[2])
            for rid, view in views.items()
            for r in view.log
            if r[1] == "TOOL_DISPATCHED"
        )
        calls = Counter(
            key
            for name, key in self.world.keys_seen
            if name in AT_MOST_ONCE or not key.startswith("durabl:")
        )
        undispatched = {key: n for key, n in calls.items() if n > dispatched[key]}
        assert not undispatched, f"tools ran more often than dispatched: {undispatched}"
        for key, _, _, tool_name, _, result, _, _ in effects:
            if tool_name in EFFECTFUL and result is not None:
                assert key in seen, f"durabl recorded {tool_name} {key!r}; the world never saw it"
        for rid, view in views.items():
            if view.status == "COMPLETED":
                missing = set(expected[rid].effects()) - set(seen)
                assert not missing, f"run {rid} completed; the world never saw {missing}"

    # -- the end -----------------------------------------------------------------------------

    def teardown(self) -> None:
        try:
            if not self.failed_check:
                self.settle()
        finally:
            self.rt.close()
            self._folder.__exit__(None, None, None)

    def settle(self) -> None:
        """A last process with no deaths: every run completes, each effect seen exactly once."""
        self.rt.close()
        self.rt = self._boot()
        self.writer = self.rt.instance_id
        for _ in range(10 * MAX_RUNS):
            if all(v.status == "COMPLETED" for v in read_runs(self.read()).values()):
                break
            self.rt.resume_all()
            for letter in self.rt.dead_letters():
                self._operator(self.rt, letter.run_id)
            wake = next_wake_s(self.db)
            if wake is not None:
                self.clock.now_s = max(self.clock.now_s, wake)
            self.rt.tick()
            self.check()
        self.check()
        snap = self.read()
        assert_snapshot_timers(snap, finished=True)
        assert_gapless_after_watermark(self.db)
        if not any(self._watermark(rid) for rid in self.model):  # the file holds every log whole
            assert_effects_match_log(self.db)
            assert_gapless(self.db)
            assert_timers_once(self.db)
        views = read_runs(snap)
        unfinished = {rid: v.status for rid, v in views.items() if v.status != "COMPLETED"}
        assert not unfinished, f"runs did not complete: {unfinished}"
        seen = Counter(r["key"] for r in self.world.outbox.records())
        for known in self.model.values():
            model = expected_run(
                known.workflow, known.run_id, known.topic, recorded_ctx(views[known.run_id].log)
            )
            for key in model.effects():
                assert seen[key] == 1, f"run {known.run_id}: the world saw {key!r} {seen[key]}x"
            if known.workflow == "stateful.sleeper":
                assert codec.decode(views[known.run_id].result)["slept"] is True
        assert snap.claims == [], "key claims outlived every run"
        assert self.rt.dead_letters() == []
        # Folding every finished run whole changes nothing anyone can see.
        before = {rid: self.observe(rid) for rid in sorted(self.model)}
        self.compacted = True
        self.rt.compact()
        self.check()
        assert {rid: self.observe(rid) for rid in sorted(self.model)} == before
        self.check_metrics()
        for rid in self.model:
            left = [row[2] for row in event_rows(self.db, rid)]
            assert left[-1:] == ["RUN_COMPLETED"], f"run {rid} kept {left} after compaction"
            assert set(left) <= {"RUN_RESUMED", "RUN_COMPLETED"}, f"run {rid} kept {left}"


def test_random_operations_against_one_database() -> None:
    run_state_machine_as_test(DurablMachine, settings=SETTINGS)
