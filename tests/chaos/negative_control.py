"""The negative control (SPEC §12): targeted schedules, and the runner that plays them.

A schedule is a scenario (workflows, inputs, and what happens between processes) and at most one
death aimed at the window a bug opens. ``Bench.run`` plays one schedule against one runtime class
exactly the way the chaos grid does: the first process dies at the point, the database file is
checked BEFORE anything resumes, then fresh runtimes on the same file take over (an operator
settles dead letters from what the world's ledger shows), and the oracles judge the end state.

Each broken runtime of ``broken_runtime.py`` must be flagged by at least one oracle on every one
of its schedules; the real ``durabl.Runtime``, through the union of the same schedules, must be
flagged by none. A schedule that names a broken runtime's own probe is played on the real runtime
at the nearest real points around that instant. ``tests/chaos/test_negative_control.py`` asserts
both; ``scripts/negative_control_report.py`` prints the table. Both call this module, so they
cannot disagree.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from durabl import (
    TIMED_OUT,
    ChildRun,
    ChildRunFailed,
    ContinueAsNew,
    ModelCall,
    NonDeterminismError,
    Parallel,
    RunState,
    Runtime,
    Sleep,
    ToolCall,
    WaitSignal,
    codec,
    crashpoints,
)
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.steps import derived_key
from oracles.support import (
    Clock,
    Snapshot,
    World,
    assert_effects_match_log,
    assert_gapless,
    assert_parallels_in_order,
    assert_runs_linked,
    assert_signals_delivered_once,
    drive_to_rest,
    event_rows,
    run_names,
    side_effect_rows,
)

from . import broken_runtime as broken
from .corpus import Answer
from .lives import answer as send_answers

RUN_A, RUN_B = "A", "B"
"""The crashed run, and the second run that holds the same explicit key."""
AT_MOST_ONCE_TOOLS = frozenset({"charge"})
WINDOW = (crashpoints.AFTER_TOOL_DISPATCHED, crashpoints.AFTER_TOOL_RETURNED)
NEAREST_REAL = (crashpoints.AFTER_TOOL_RETURNED, crashpoints.AFTER_STEP_COMMITTED)
"""Where the real runtime dies in place of a split probe: the instants just before and after
its one transaction. The split scenarios' workflows hold only tool steps that succeed, so the
n-th probe, the n-th tool return and the n-th committed step all belong to the n-th tool call."""

TORN = "torn write"
AT_REST = "effects match log at rest"
GAPLESS = "gapless log"
DUPLICATE = "no duplicate effect"
NEVER_GUESSED = "ambiguity dead-lettered"
NONDETERMINISM = "non-determinism detected"
FINAL = "final state"
SIGNALS = "signals delivered once"
LINKED = "runs linked"
IN_ORDER = "parallel in order"
ORACLES = {
    TORN: "on the file a dead process left, before anything resumes: the side_effects table "
    "and the log agree",
    AT_REST: "once every run has come to rest, the side_effects table and the log agree",
    GAPLESS: "every run's seqs are 1..N",
    DUPLICATE: "no (tool, key) appears twice in the outside world's ledger",
    NEVER_GUESSED: "an AT_MOST_ONCE tool that died after dispatch is dead-lettered on resume, "
    "and not called",
    NONDETERMINISM: "resuming under changed code or drifted data raises NonDeterminismError "
    "and leaves the log untouched",
    FINAL: "every run completes with the uncrashed reference's result, and the ledger equals "
    "the reference's",
    SIGNALS: "after a death and at rest, every signal a wait took is marked delivered to that "
    "wait, none is taken twice, and a ContinueAsNew hands the signals no wait took to the next run",
    LINKED: "after a death and at rest, every child run belongs to the ChildRun that started it, "
    "whose log holds the child's end once the child has ended, and every ContinueAsNew names the "
    "one run it went on as, which names it",
    IN_ORDER: "after a death and at rest, a Parallel's recorded result lists its branches' "
    "results in the order given, and is recorded after all of them",
}


# -- the workflows -------------------------------------------------------------------------------


def tools_only(ctx: Any) -> Any:
    """Four tool steps, every (mode x key) pair, nothing else: the n-th tool call is the n-th
    effect commit, the n-th tool return and the n-th committed step."""
    a = yield ToolCall("send", {"to": "ops", "body": "derived"})
    b = yield ToolCall("charge", {"amount": 11})
    c = yield ToolCall(
        "send", {"to": "ops", "body": "explicit"}, idempotency_key=f"send-{ctx.run_id}"
    )
    d = yield ToolCall("charge", {"amount": 13}, idempotency_key=f"charge-{ctx.run_id}")
    return [a, b, c, d]


def one_tool(ctx: Any, tool: str, key: str | None) -> Any:
    args = {"amount": 7} if tool == "charge" else {"to": "ops", "body": "once"}
    return (yield ToolCall(tool, args, idempotency_key=key))


def agent(ctx: Any, topic: str) -> Any:
    """A model call, ctx values, both tool modes, both kinds of key, and a timer."""
    plan = yield ModelCall(f"plan {topic}")
    started_s = ctx.now()
    hits = yield ToolCall("search", {"q": topic})
    paid = yield ToolCall("charge", {"amount": len(hits)})
    yield Sleep(seconds=30)
    sent = yield ToolCall(
        "send", {"to": "boss", "body": plan["text"]}, idempotency_key=f"report-{ctx.run_id}"
    )
    fee = yield ToolCall("charge", {"amount": 2}, idempotency_key=f"fee-{ctx.run_id}")
    return {"paid": paid, "sent": sent, "fee": fee, "waited": ctx.now() - started_s >= 30}


def original(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("search", {"q": "one"})
    b = yield ToolCall("send", {"to": to, "body": "two"})
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def other_args(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("search", {"q": "ONE"})
    b = yield ToolCall("send", {"to": to, "body": "two"})
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def swapped(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    b = yield ToolCall("send", {"to": to, "body": "two"})
    a = yield ToolCall("search", {"q": "one"})
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def other_tool(ctx: Any, to: str) -> Any:
    plan = yield ModelCall(f"plan for {to}")
    a = yield ToolCall("send", {"to": to, "body": "one"})
    b = yield ToolCall("send", {"to": to, "body": "two"})
    c = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [a, b, c]


def reads_inbox(ctx: Any, inbox: str) -> Any:
    """Reads a file directly instead of through a step: a restart sees whatever it holds then."""
    first = yield ToolCall("search", {"q": "inbox"})
    with open(inbox, encoding="utf-8") as handle:
        latest = handle.read().splitlines()[-1]
    found = yield ToolCall("search", {"q": latest})
    sent = yield ToolCall("send", {"to": "ops", "body": latest})
    return [first, found, sent]


def reads_entropy(ctx: Any) -> Any:
    """Draws a uuid directly instead of ``ctx.uuid()``: a restart draws another one."""
    found = yield ToolCall("search", {"q": uuid.uuid4().hex})
    sent = yield ToolCall("send", {"to": "ops", "body": "entropy"})
    return [found, sent]


def patched(ctx: Any, to: str) -> Any:
    """A prompt changed behind ``ctx.patched``; every run here takes the new branch."""
    found = yield ToolCall("search", {"q": "one"})
    if ctx.patched("negative-plan-v2"):
        plan = yield ModelCall(f"plan v2 for {to}")
    else:
        plan = yield ModelCall(f"plan for {to}")
    sent = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [found, plan["text"], sent]


def guard_taken_out(ctx: Any, to: str) -> Any:
    """``patched`` once no run that took the old branch is left: the guard and the old branch
    are gone. A run that took the new branch must finish under it exactly as it would have."""
    found = yield ToolCall("search", {"q": "one"})
    plan = yield ModelCall(f"plan v2 for {to}")
    sent = yield ToolCall("send", {"to": to, "body": plan["text"]})
    return [found, plan["text"], sent]


def answered(ctx: Any, to: str) -> Any:
    """Two waits for the same name, one answer: the first wait takes it, the second times out."""
    found = yield ToolCall("search", {"q": to})
    first = yield WaitSignal("answer", timeout=3600)
    sent = yield ToolCall("send", {"to": to, "body": f"first answer: {first}"})
    second = yield WaitSignal("answer", timeout=3600)
    return [found, first, sent, "no second answer" if second is TIMED_OUT else second]


def fan_out(ctx: Any) -> Any:
    """A Parallel, one branch at a time: a flaky tool that backs off (so it finishes last, after
    the run parked for its backoff), an AT_MOST_ONCE charge and a model call; then a send of
    what the model said."""
    value, paid, plan = yield Parallel(
        [
            ToolCall("flaky", {"n": 2}),
            ToolCall("charge", {"amount": 5}),
            ModelCall("plan the fan-out"),
        ],
        max_concurrency=1,
    )
    sent = yield ToolCall("send", {"to": "ops", "body": plan["text"]})
    return [value, paid, plan["text"], sent]


SHIPPING = "negative.shipping"


def shipping(ctx: Any, kind: str) -> Any:
    """A child run: a lookup, then by ``kind`` nothing more (``now``), a timer (``later``: it
    ends in a later pass than its parent's), a tool that always fails (``fails``: the child
    fails), a ContinueAsNew as a ``now`` (``continues``: its chain's last run ends it), or a
    child of its own (``nested``)."""
    found = yield ToolCall("search", {"q": kind})
    if kind == "later":
        yield Sleep(seconds=60)
    elif kind == "fails":
        yield ToolCall("broken", {"why": kind})
    elif kind == "continues":
        yield ContinueAsNew({"kind": "now"})
    elif kind == "nested":
        found = [(yield ChildRun(SHIPPING, {"kind": "later"}))["found"]]
    return {"kind": kind, "found": found[0]}


def parent(ctx: Any, kinds: list[str]) -> Any:
    """A ChildRun of ``negative.shipping`` for each kind, in turn; a failed child's error is
    caught. Then a send."""
    got = []
    for kind in kinds:
        try:
            got.append((yield ChildRun(SHIPPING, {"kind": kind})))
        except ChildRunFailed as failed:
            got.append(f"failed: {failed.error_type}")
    sent = yield ToolCall("send", {"to": "ops", "body": f"{len(got)} shipped"})
    return [got, sent]


def turns(
    ctx: Any, turn: int = 1, last: int = 3, listen: bool = True, heard: tuple[Any, ...] = ()
) -> Any:
    """``last`` turns by ContinueAsNew, each a run with a charge of its own (a derived key: the
    turn's run id in it). Listening, the first turn waits for ``go``, which comes with
    ``later``; the first turn's ContinueAsNew hands ``later`` on, and the second's wait takes it
    at once (without it, the wait times out)."""
    if listen and turn == 1:
        heard = ((yield WaitSignal("go")),)
    elif listen and turn == 2:
        later = yield WaitSignal("later", timeout=3600)
        heard = (*heard, "nothing later" if later is TIMED_OUT else later)
    paid = yield ToolCall("charge", {"amount": turn})
    if turn < last:
        yield ContinueAsNew({"turn": turn + 1, "last": last, "listen": listen, "heard": heard})
    return {"heard": list(heard), "paid": paid, "turns": turn}


WORKFLOWS: dict[str, Callable[..., Any]] = {
    "negative.fan_out": fan_out,
    "negative.parent": parent,
    SHIPPING: shipping,
    "negative.turns": turns,
    "negative.tools_only": tools_only,
    "negative.one_tool": one_tool,
    "negative.agent": agent,
    "negative.original": original,
    "negative.reads_inbox": reads_inbox,
    "negative.reads_entropy": reads_entropy,
    "negative.patched": patched,
    "negative.answered": answered,
}
CHANGED: dict[str, Callable[..., Any]] = {
    "other args": other_args,
    "swapped steps": swapped,
    "other tool": other_tool,
}
"""Code deployed under the name ``negative.original`` while its run is interrupted."""
LATER: dict[str, Callable[..., Any]] = {"guard taken out": guard_taken_out}
"""A later version of a workflow, deployed while its run is interrupted, that must finish the run
as the original code would (``Scenario.deployed``)."""


# -- scenarios and schedules ---------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """What is run, and what happens between the death and the recovery.

    ``second_run``: run B, holding the same input (so the same explicit key), starts after the
    death and before run A resumes. ``changed_to``: the code resumed first is this version of
    the workflow, then the original is deployed again. ``drifts``: the workflow reads the world
    directly and the world changes meanwhile, so there is no right code to go back to.
    ``deployed``: the recovery runs this later version of the workflow (``LATER``), which must
    finish the run with the reference's result and effects. ``answers``: the signals sent to
    the runs, each once its moment has come, by whichever process looks first.
    """

    name: str
    workflow: str
    input: dict[str, Any] | None = field(default=None, hash=False)
    second_run: bool = False
    changed_to: str | None = None
    drifts: bool = False
    deployed: str | None = None
    answers: tuple[Answer, ...] = field(default=(), hash=False)

    @property
    def expects_nondeterminism(self) -> bool:
        return self.changed_to is not None or self.drifts

    @property
    def runs(self) -> tuple[str, ...]:
        return (RUN_A, RUN_B) if self.second_run else (RUN_A,)


@dataclass(frozen=True)
class Schedule:
    scenario: Scenario
    point: str | None
    occurrence: int = 1

    @property
    def crash(self) -> str:
        return "no crash" if self.point is None else f"{self.point} #{self.occurrence}"

    @property
    def label(self) -> str:
        return f"{self.scenario.name} x {self.crash}"


TOOLS = Scenario("four tool calls", "negative.tools_only")
AGENT = Scenario("agent with timer", "negative.agent", {"topic": "otters"})
SHARED = {
    tool: Scenario(
        f"{tool} key shared by run B",
        "negative.one_tool",
        {"tool": tool, "key": f"shared-{tool}"},
        second_run=True,
    )
    for tool in ("charge", "send")
}
CHARGE = {
    "derived": Scenario(
        "charge, derived key", "negative.one_tool", {"tool": "charge", "key": None}
    ),
    "explicit": Scenario(
        "charge, explicit key", "negative.one_tool", {"tool": "charge", "key": "pay-once"}
    ),
    "shared": SHARED["charge"],
}
CHANGED_CODE = [
    Scenario(f"resumed with {change}", "negative.original", {"to": "nd"}, changed_to=change)
    for change in CHANGED
]
DRIFTING = [
    Scenario("reads a file directly", "negative.reads_inbox", drifts=True),
    Scenario("reads entropy directly", "negative.reads_entropy", drifts=True),
]
GUARD_OUT = Scenario(
    "guard taken out", "negative.patched", {"to": "ops"}, deployed="guard taken out"
)
ANSWERED = Scenario(
    "one answer, two waits",
    "negative.answered",
    {"to": "ops"},
    answers=(Answer(RUN_A, "answer", "yes", once_waiting_for="answer"),),
)
FAN = Scenario("parallel with a backoff", "negative.fan_out")
CHILDREN = Scenario(
    "four children", "negative.parent", {"kinds": ["now", "later", "fails", "continues"]}
)
NESTED = Scenario("a child with a child", "negative.parent", {"kinds": ["nested"]})
TURNS = Scenario(
    "three turns, a signal handed on",
    "negative.turns",
    answers=(
        Answer(RUN_A, "later", "see you", once_waiting_for="go"),
        Answer(RUN_A, "go", "go", once_waiting_for="go"),
    ),
)
LOOP = Scenario("five quiet turns", "negative.turns", {"last": 5, "listen": False})
CHARGE_POSITIONS_IN_TOOLS = (2, 4)
"""Which tool calls of ``tools_only`` are AT_MOST_ONCE."""


def split_schedules(probe: str) -> list[Schedule]:
    """The probe at every tool completion, and at the completion a second run depends on."""
    return [
        *(Schedule(TOOLS, probe, n) for n in range(1, 5)),
        *(Schedule(scenario, probe, 1) for scenario in SHARED.values()),
    ]


def window_schedules() -> list[Schedule]:
    """Deaths after dispatch and after return, on every AT_MOST_ONCE call."""
    return [
        *(Schedule(s, point, 1) for s in CHARGE.values() for point in WINDOW),
        *(Schedule(TOOLS, point, n) for n in CHARGE_POSITIONS_IN_TOOLS for point in WINDOW),
    ]


def replay_schedules() -> list[Schedule]:
    """Code changed under an interrupted run; workflows that read the world directly."""
    mid_way = [(crashpoints.AFTER_STEP_COMMITTED, 3), (crashpoints.AFTER_TOOL_RETURNED, 3)]
    return [
        *(Schedule(s, point, n) for s in CHANGED_CODE for point, n in mid_way),
        Schedule(DRIFTING[0], crashpoints.AFTER_STEP_COMMITTED, 2),
        Schedule(DRIFTING[1], crashpoints.AFTER_STEP_COMMITTED, 1),
    ]


def forgotten_record_schedules() -> list[Schedule]:
    """Deaths just after each completion, a second run holding the key, and no death."""
    return [
        Schedule(TOOLS, None),
        *(Schedule(TOOLS, crashpoints.AFTER_STEP_COMMITTED, n) for n in range(1, 5)),
        *(Schedule(s, crashpoints.AFTER_STEP_COMMITTED, 1) for s in SHARED.values()),
    ]


def patch_schedules(scenario: Scenario = GUARD_OUT) -> list[Schedule]:
    """Deaths once the new branch's model call is recorded (the marker before it would be too),
    so that the recovery, under the code with the guard taken out, replays past the marker.
    Before that point the log ends before the marker, and the new code executes from there."""
    after_the_branch = [
        (crashpoints.AFTER_STEP_COMMITTED, 2),
        (crashpoints.BEFORE_STEP_STARTED, 3),
        (crashpoints.AFTER_STEP_STARTED, 3),
        (crashpoints.AFTER_TOOL_RETURNED, 2),
        (crashpoints.AFTER_STEP_COMMITTED, 3),
        (crashpoints.BEFORE_RUN_COMPLETED, 1),
    ]
    return [Schedule(scenario, point, n) for point, n in after_the_branch]


def signal_schedules() -> list[Schedule]:
    """No death, and deaths around the one delivery: the first wait parked, the run it made due
    taken by a tick, the delivery committed, the steps after it replayed, and on the way to the
    second wait and to the end. (Only points both runtimes reach: the broken one never parks
    its second wait.)"""
    around_the_delivery = [
        (crashpoints.AFTER_TIMER_ARMED, 1),
        (crashpoints.AFTER_LEASE_TAKEN, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 2),
        (crashpoints.DURING_REPLAY, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 3),
        (crashpoints.BEFORE_STEP_STARTED, 4),
        (crashpoints.BEFORE_RUN_COMPLETED, 1),
    ]
    return [
        Schedule(ANSWERED, None),
        *(Schedule(ANSWERED, point, n) for point, n in around_the_delivery),
    ]


def parallel_order_schedules() -> list[Schedule]:
    """No death, and deaths around the Parallel whose first branch finishes last: its backoff
    scheduled, its last sibling committed, the Parallel's own commit, and on to the end."""
    around_the_parallel = [
        (crashpoints.AFTER_RETRY_SCHEDULED, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 2),
        (crashpoints.AFTER_STEP_COMMITTED, 4),
        (crashpoints.BEFORE_STEP_STARTED, 6),
        (crashpoints.AFTER_TOOL_RETURNED, 4),
        (crashpoints.BEFORE_RUN_COMPLETED, 1),
    ]
    return [Schedule(FAN, None), *(Schedule(FAN, point, n) for point, n in around_the_parallel)]


def served_branch_schedules() -> list[Schedule]:
    """No death (the Parallel is reached again after its backoff), and deaths once a branch has
    committed, before the Parallel has: the charge, the model call, the backoff, the pass after
    it taking the run, the flaky branch's retry."""
    before_the_parallel_ends = [
        (crashpoints.AFTER_RETRY_SCHEDULED, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 2),
        (crashpoints.AFTER_LEASE_TAKEN, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 3),
    ]
    return [Schedule(FAN, None), *(Schedule(FAN, p, n) for p, n in before_the_parallel_ends)]


def split_note_schedules() -> list[Schedule]:
    """The probe at every child's end: one that ends in its parent's pass, one that sleeps and
    ends in a later one, one that fails, the last run of one that continued, and a child's and
    its own child's."""
    probe = broken.SPLIT_NOTE_GAP
    return [
        *(Schedule(CHILDREN, probe, n) for n in range(1, 5)),
        *(Schedule(NESTED, probe, n) for n in range(1, 3)),
    ]


def split_continue_schedules() -> list[Schedule]:
    """The probe at every ContinueAsNew: of a chain handing a signal on, of a longer one, and
    of a child run."""
    probe = broken.SPLIT_CONTINUE_GAP
    return [
        *(Schedule(TURNS, probe, n) for n in range(1, 3)),
        *(Schedule(LOOP, probe, n) for n in range(1, 5)),
        Schedule(CHILDREN, probe, 1),
    ]


def carried_signal_schedules() -> list[Schedule]:
    """No death, and deaths around the signal handed on: the first turn parked, taken by the
    tick its signals made due, its wait ended, its ContinueAsNew committed, the second turn at
    its wait, and the end."""
    around_the_hand_over = [
        (crashpoints.AFTER_STEP_STARTED, 1),
        (crashpoints.AFTER_LEASE_TAKEN, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 1),
        (crashpoints.AFTER_STEP_COMMITTED, 3),
        (crashpoints.BEFORE_STEP_STARTED, 4),
        (crashpoints.BEFORE_RUN_COMPLETED, 1),
    ]
    return [Schedule(TURNS, None), *(Schedule(TURNS, p, n) for p, n in around_the_hand_over)]


@dataclass(frozen=True)
class Variant:
    name: str
    runtime: type[Runtime]
    bug: str
    schedules: Callable[[Bench], list[Schedule]]


BROKEN = (
    Variant(
        "split, effect first",
        broken.SplitEffectFirst,
        "side_effects row and STEP_COMPLETED in two transactions, the effect first",
        lambda _: split_schedules(broken.SPLIT_EFFECT_FIRST_GAP),
    ),
    Variant(
        "split, completion first",
        broken.SplitCompletionFirst,
        "side_effects row and STEP_COMPLETED in two transactions, the completion first",
        lambda _: split_schedules(broken.SPLIT_COMPLETION_FIRST_GAP),
    ),
    Variant(
        "ignores TOOL_DISPATCHED",
        broken.IgnoresDispatched,
        "an ambiguous AT_MOST_ONCE step is started over instead of dead-lettered",
        lambda _: window_schedules(),
    ),
    Variant(
        "skips TOOL_DISPATCHED",
        broken.SkipsDispatchMarker,
        "the dispatch marker is never written, so a dispatched step looks unstarted",
        lambda _: window_schedules(),
    ),
    Variant(
        "no fingerprint check",
        broken.NoFingerprintCheck,
        "replay hands back the result recorded at a position, whatever step is yielded there",
        lambda _: replay_schedules(),
    ),
    Variant(
        "forgets effect record",
        broken.ForgetsEffectRecord,
        "completions are committed without their side_effects row",
        lambda _: forgotten_record_schedules(),
    ),
    Variant(
        "forgets patch markers",
        broken.ForgetsPatchMarkers,
        "ctx.patched takes the new branch without recording it",
        lambda _: patch_schedules(),
    ),
    Variant(
        "forgets signal delivery",
        broken.ForgetsSignalDelivery,
        "a wait takes a signal without marking it delivered",
        lambda _: signal_schedules(),
    ),
    Variant(
        "parallel in completion order",
        broken.ParallelInCompletionOrder,
        "a Parallel's results are recorded in the order its branches finished",
        lambda _: parallel_order_schedules(),
    ),
    Variant(
        "re-runs served branches",
        broken.RerunsServedBranches,
        "a Parallel reached again runs its finished branches again",
        lambda _: served_branch_schedules(),
    ),
    Variant(
        "split, parent note",
        broken.SplitParentNote,
        "a child run's end and its parent's record of it in two transactions",
        lambda _: split_note_schedules(),
    ),
    Variant(
        "split, continuation",
        broken.SplitContinuation,
        "a ContinueAsNew creates the next run and ends its own in two transactions",
        lambda _: split_continue_schedules(),
    ),
    Variant(
        "forgets carried signals",
        broken.ForgetsCarriedSignals,
        "a ContinueAsNew leaves the signals no wait took behind",
        lambda _: carried_signal_schedules(),
    ),
    Variant(
        "duplicates effects",
        broken.DuplicatesEffects,
        "every tool is called twice",
        lambda bench: bench.every_point(AGENT),
    ),
)
CONTROL_NAME = "durabl.Runtime (control)"


SPLIT_EFFECT_PROBES = (broken.SPLIT_EFFECT_FIRST_GAP, broken.SPLIT_COMPLETION_FIRST_GAP)


def control_schedules(bench: Bench) -> list[Schedule]:
    """The union of every broken runtime's schedules, probes replaced by the nearest real
    points: for the split effect runtimes, ``NEAREST_REAL``; for the others, the real points
    their runtime passes just before and just after the probe (``Bench.around``)."""
    found: dict[Schedule, None] = {}
    for variant in BROKEN:
        for schedule in variant.schedules(bench):
            if schedule.point in SPLIT_EFFECT_PROBES:
                found.update({replace(schedule, point=p): None for p in NEAREST_REAL})
            elif schedule.point in broken.PROBES:
                found.update(dict.fromkeys(bench.around(variant.runtime, schedule)))
            else:
                found[schedule] = None
    return list(found)


CONTROL = Variant(CONTROL_NAME, Runtime, "none (the real runtime)", control_schedules)


# -- outcomes ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one schedule did to one runtime: whether it died as planned, and who noticed."""

    schedule: Schedule
    died: bool = False
    ambiguous_tool: str | None = None
    """The AT_MOST_ONCE tool the death interrupted inside its ambiguous window, if any."""
    flags: dict[str, str] = field(default_factory=dict)

    @property
    def in_window(self) -> bool:
        return self.ambiguous_tool is not None

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    def flag(self, oracle: str, message: str) -> None:
        self.flags.setdefault(oracle, message)

    @contextlib.contextmanager
    def judged_by(self, oracle: str) -> Iterator[None]:
        try:
            yield
        except AssertionError as exc:
            self.flag(oracle, str(exc) or oracle)


@dataclass
class VariantReport:
    variant: Variant
    outcomes: list[Outcome]

    @property
    def flagged(self) -> int:
        return sum(o.flagged for o in self.outcomes)

    @property
    def caught_by(self) -> Counter[str]:
        return Counter(oracle for o in self.outcomes for oracle in o.flags)

    def as_json(self) -> dict[str, Any]:
        return {
            "variant": self.variant.name,
            "runtime": self.variant.runtime.__qualname__,
            "bug": self.variant.bug,
            "scenarios": len(self.outcomes),
            "flagged": self.flagged,
            "caught_by": {o: self.caught_by[o] for o in ORACLES if self.caught_by[o]},
            "schedules": [
                {"schedule": o.schedule.label, "died": o.died, "flagged_by": sorted(o.flags)}
                for o in self.outcomes
            ],
        }


@dataclass(frozen=True)
class Reference:
    """The uncrashed real runtime on a scenario: results, ledger, and the points it passed."""

    results: dict[str, str]
    ledger: Counter[tuple[str, str]]
    points: Counter[str]


Progress = Callable[[str, int, int, str], None]
"""Told (variant, schedule number, schedules, schedule label) before each schedule is played."""


# -- the runner --------------------------------------------------------------------------------


def ledger(world: World, db: Path) -> Counter[tuple[str, str]]:
    """The effects the outside world has seen, by (tool, idempotency key); a derived key names
    its run as ``run_names`` does (the runs a ContinueAsNew makes have new ids each time)."""
    names = sorted(run_names(Snapshot(db)).items(), key=lambda item: -len(item[0]))

    def named(key: str) -> str:
        for run_id, name in names:
            key = key.replace(run_id, name)
        return key

    return Counter((r["tool"], named(r["key"])) for r in world.outbox.records())


def last_started_tool(db: Path, run_id: str) -> str | None:
    """The tool of the run's last STEP_STARTED, or None when that step is not a tool call."""
    started = [row for row in event_rows(db, run_id) if row[2] == "STEP_STARTED"]
    if not started:
        return None
    canonical = codec.decode(started[-1][5])
    return canonical[1] if canonical[0] == "tool" else None


def drive(rt: Runtime, clock: Clock, scenario: Scenario, run_id: str) -> RunState:
    """``drive_to_rest``, sending the scenario's signals as their moments come. A run that
    continued as another ends as the last run of its chain: that run's state, named
    ``run_id``."""
    state = drive_to_rest(rt, clock, run_id, answer=lambda: send_answers(rt, scenario.answers))
    return replace(state, run_id=run_id)


def start_and_drive(
    rt: Runtime, clock: Clock, scenario: Scenario, inp: dict[str, Any] | None, run_id: str
) -> RunState:
    """Start the scenario's run ``run_id`` and ``drive`` it. (Not by the id ``start`` returns:
    that is the id of the run a ContinueAsNew chain has got to by the time it returns.)"""
    rt.start(scenario.workflow, inp, run_id=run_id)
    return drive(rt, clock, scenario, run_id)


def operate(rt: Runtime, world: World, db: Path) -> None:
    """The operator settles the oldest dead letter from what the world's ledger shows: the
    effect happened (resolve with what it returned) or did not (redrive). A key durabl already
    recorded an effect for is redriven, so the run picks the record up."""
    letter = rt.dead_letters()[0]
    key = letter.idempotency_key or derived_key(letter.run_id, letter.step)
    seen = world.outbox.find(key)
    if seen is None or key in {row[0] for row in side_effect_rows(db)}:
        rt.redrive(letter.run_id)
    elif seen["tool"] == "charge":
        rt.resolve(letter.run_id, {"charged": seen["amount"]})
    else:
        rt.resolve(letter.run_id, {"sent": f"{seen['to']}:{seen['body']}"})


class Bench:
    """Plays schedules in folders under ``scratch`` (use a tmpfs: every trial builds a database)."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self._serial = 0
        self._references: dict[Scenario, Reference] = {}
        self._around: dict[tuple[type[Runtime], Schedule], list[Schedule]] = {}

    # -- building blocks ---------------------------------------------------------------------

    def _folder(self) -> Path:
        self._serial += 1
        folder = self.scratch / f"trial-{self._serial}"
        folder.mkdir(parents=True)
        return folder

    @staticmethod
    def _runtime(
        cls: type[Runtime],
        db: Path,
        world: World,
        clock: Clock,
        workflows: dict[str, Callable[..., Any]] | None = None,
    ) -> Runtime:
        return cls(
            db,
            llm=world.llm,
            tools=world.tools(),
            clock=clock,
            workflows=workflows or WORKFLOWS,
            durability="process",
        )

    @staticmethod
    def _input(scenario: Scenario, folder: Path) -> dict[str, Any] | None:
        if scenario.workflow != "negative.reads_inbox":
            return scenario.input
        inbox = folder / "inbox.txt"
        inbox.write_text("first letter\n", encoding="utf-8")
        return {"inbox": str(inbox)}

    def reference(self, scenario: Scenario) -> Reference:
        """The real runtime, never killed, on the scenario's original code."""
        if scenario not in self._references:
            folder = self._folder()
            db, world, clock = folder / "durabl.db", World(folder), Clock()
            points: Counter[str] = Counter()
            remove = crashpoints.install(lambda point: points.update([point]))
            try:
                with self._runtime(Runtime, db, world, clock) as rt:
                    inp = self._input(scenario, folder)
                    states = [
                        start_and_drive(rt, clock, scenario, inp, run) for run in scenario.runs
                    ]
            finally:
                remove()
            assert all(s.status == "COMPLETED" for s in states), states
            results = {s.run_id: codec.encode(s.result) for s in states}
            self._references[scenario] = Reference(results, ledger(world, db), points)
        return self._references[scenario]

    def every_point(self, scenario: Scenario) -> list[Schedule]:
        """Every (point, occurrence) the uncrashed real runtime passes, and no death at all."""
        points = self.reference(scenario).points
        return [Schedule(scenario, None)] + [
            Schedule(scenario, point, n)
            for point in crashpoints.ALL
            for n in range(1, points[point] + 1)
        ]

    def around(self, cls: type[Runtime], schedule: Schedule) -> list[Schedule]:
        """The real points ``cls``, uncrashed, passes just before and just after the
        schedule's probe (at their occurrence then): where the real runtime, which passes the
        same real points in the same order, dies in its place."""
        if (cls, schedule) not in self._around:
            self._around[cls, schedule] = self._points_around(cls, schedule)
        return self._around[cls, schedule]

    def _points_around(self, cls: type[Runtime], schedule: Schedule) -> list[Schedule]:
        sequence: list[str] = []
        remove = crashpoints.install(sequence.append)
        try:
            folder = self._folder()
            db, world, clock = folder / "durabl.db", World(folder), Clock()
            with self._runtime(cls, db, world, clock) as rt:
                scenario = schedule.scenario
                inp = self._input(scenario, folder)
                for run in scenario.runs:
                    start_and_drive(rt, clock, scenario, inp, run)
        finally:
            remove()
        probes = [i for i, point in enumerate(sequence) if point == schedule.point]
        at = probes[schedule.occurrence - 1]
        real = [(i, p) for i, p in enumerate(sequence) if p in crashpoints.ALL]
        before = [(i, p) for i, p in real if i < at][-1:]
        after = [(i, p) for i, p in real if i > at][:1]
        return [
            replace(schedule, point=p, occurrence=sum(1 for j, q in real if q == p and j <= i))
            for i, p in (*before, *after)
        ]

    # -- one schedule --------------------------------------------------------------------------

    def run(self, cls: type[Runtime], schedule: Schedule) -> Outcome:
        """Play ``schedule`` against ``cls`` and judge it with every oracle that applies."""
        scenario = schedule.scenario
        outcome = Outcome(schedule)
        expected = None if scenario.drifts else self.reference(scenario)
        folder = self._folder()
        db, world, clock = folder / "durabl.db", World(folder), Clock()
        inp = self._input(scenario, folder)

        def runtime(workflows: dict[str, Callable[..., Any]] | None = None) -> Runtime:
            return self._runtime(cls, db, world, clock, workflows)

        try:
            self._first_process(runtime, clock, schedule, inp, outcome)
            if outcome.died:
                self._judge_crashed_file(db, schedule, outcome)
            if scenario.drifts:
                with open(folder / "inbox.txt", "a", encoding="utf-8") as handle:
                    handle.write("a newer letter\n")
            if scenario.second_run:
                with runtime() as rt:
                    start_and_drive(rt, clock, scenario, inp, RUN_B)
            if scenario.expects_nondeterminism:
                self._resume_expecting_nondeterminism(runtime, db, scenario, outcome)
            if expected is not None:
                with runtime(self._recovery_code(scenario)) as rt:
                    self._recover(rt, clock, world, db, scenario, outcome)
        except ProcessDeath:
            raise
        except Exception as exc:
            outcome.flag(FINAL, f"the run could not be driven: {type(exc).__name__}: {exc}")
        with outcome.judged_by(GAPLESS):
            assert_gapless(db)
        with outcome.judged_by(AT_REST):
            assert_effects_match_log(db)
        with outcome.judged_by(SIGNALS):
            assert_signals_delivered_once(Snapshot(db))
        with outcome.judged_by(LINKED):
            assert_runs_linked(Snapshot(db))
        with outcome.judged_by(IN_ORDER):
            assert_parallels_in_order(Snapshot(db))
        seen = ledger(world, db)
        with outcome.judged_by(DUPLICATE):
            twice = {effect: n for effect, n in seen.items() if n > 1}
            assert not twice, f"the world saw these effects more than once: {twice}"
        if expected is not None:
            with outcome.judged_by(FINAL):
                assert seen == expected.ledger, f"ledger {dict(seen)} != {dict(expected.ledger)}"
        return outcome

    @staticmethod
    def _recovery_code(scenario: Scenario) -> dict[str, Callable[..., Any]] | None:
        """The workflows the recovery runs: a later version of the scenario's, if it has one."""
        if scenario.deployed is None:
            return None
        return {**WORKFLOWS, scenario.workflow: LATER[scenario.deployed]}

    def _first_process(
        self,
        runtime: Callable[[], Runtime],
        clock: Clock,
        schedule: Schedule,
        inp: dict[str, Any] | None,
        outcome: Outcome,
    ) -> None:
        death = (
            CrashAt(schedule.point, schedule.occurrence)
            if schedule.point is not None
            else contextlib.nullcontext()
        )
        with death, runtime() as rt:
            try:
                start_and_drive(rt, clock, schedule.scenario, inp, RUN_A)
            except ProcessDeath as died:
                assert died.point == schedule.point
                outcome.died = True

    def _judge_crashed_file(self, db: Path, schedule: Schedule, outcome: Outcome) -> None:
        """The file a dead process left, read before any process opens it again."""
        with outcome.judged_by(TORN):
            assert_effects_match_log(db)
        with outcome.judged_by(SIGNALS):
            assert_signals_delivered_once(Snapshot(db))
        with outcome.judged_by(LINKED):
            assert_runs_linked(Snapshot(db))
        with outcome.judged_by(IN_ORDER):
            assert_parallels_in_order(Snapshot(db))
        with outcome.judged_by(GAPLESS):
            assert_gapless(db)
        tool = last_started_tool(db, RUN_A)
        if schedule.point in WINDOW and tool in AT_MOST_ONCE_TOOLS:
            outcome.ambiguous_tool = tool

    def _resume_expecting_nondeterminism(
        self, runtime: Callable[..., Runtime], db: Path, scenario: Scenario, outcome: Outcome
    ) -> None:
        deployed = dict(WORKFLOWS)
        if scenario.changed_to is not None:
            deployed[scenario.workflow] = CHANGED[scenario.changed_to]
        log = event_rows(db, RUN_A)
        with runtime(deployed) as rt, outcome.judged_by(NONDETERMINISM):
            try:
                state = rt.resume(RUN_A)
            except NonDeterminismError:
                assert event_rows(db, RUN_A) == log, "the log changed under a held run"
                return
            raise AssertionError(f"resuming raised nothing; the run went on to {state.status}")

    def _recover(
        self,
        rt: Runtime,
        clock: Clock,
        world: World,
        db: Path,
        scenario: Scenario,
        outcome: Outcome,
    ) -> None:
        """The next process: the crashed run first, then every run to completion."""
        expected = self.reference(scenario)
        tool = outcome.ambiguous_tool
        if tool is not None:
            calls = world.calls[tool]
            state = rt.resume(RUN_A)
            with outcome.judged_by(NEVER_GUESSED):
                assert state.status == "DEAD_LETTERED", f"{tool} was guessed: {state.status}"
                assert world.calls[tool] == calls, f"{tool} was called again"
        states = [drive(rt, clock, scenario, run) for run in scenario.runs]
        for _ in range(6):
            if not rt.dead_letters():
                break
            operate(rt, world, db)
            states = [drive(rt, clock, scenario, run) for run in scenario.runs]
        with outcome.judged_by(FINAL):
            for state in states:
                assert state.status == "COMPLETED", f"run {state.run_id} is {state.status}"
                got = codec.encode(state.result)
                assert got == expected.results[state.run_id], (
                    f"run {state.run_id} returned {got}, the reference "
                    f"{expected.results[state.run_id]}"
                )

    # -- a whole variant -----------------------------------------------------------------------

    def run_variant(self, variant: Variant, progress: Progress | None = None) -> VariantReport:
        schedules = variant.schedules(self)
        outcomes = []
        for index, schedule in enumerate(schedules, 1):
            if progress is not None:
                progress(variant.name, index, len(schedules), schedule.label)
            outcomes.append(self.run(variant.runtime, schedule))
        return VariantReport(variant, outcomes)

    # -- the instant between effect and completion ---------------------------------------------

    def inspect_every_point(
        self, cls: type[Runtime], scenario: Scenario
    ) -> tuple[Counter[str], list[str]]:
        """Drive the scenario uncrashed with a hook that reads the file at every point reached.

        Returns how often each point was reached, and every point at which the side_effects
        table and the log disagreed (an effect without its completion, or the reverse).
        """
        folder = self._folder()
        db, world, clock = folder / "durabl.db", World(folder), Clock()
        seen: Counter[str] = Counter()
        torn: list[str] = []

        def inspect(point: str) -> None:
            seen[point] += 1
            try:
                assert_effects_match_log(db)
            except AssertionError as exc:
                torn.append(f"{point} #{seen[point]}: {exc}")

        remove = crashpoints.install(inspect)
        try:
            with self._runtime(cls, db, world, clock) as rt:
                inp = self._input(scenario, folder)
                for run in scenario.runs:
                    start_and_drive(rt, clock, scenario, inp, run)
        finally:
            remove()
        return seen, torn


def measure(bench: Bench, progress: Progress | None = None) -> list[VariantReport]:
    """Every broken runtime on its schedules, then the real one on all of them."""
    return [bench.run_variant(v, progress) for v in (*BROKEN, CONTROL)]


def report_json(reports: list[VariantReport]) -> dict[str, Any]:
    broken_rows = [r for r in reports if r.variant is not CONTROL]
    control = [r for r in reports if r.variant is CONTROL]
    return {
        "generated_by": "scripts/negative_control_report.py",
        "oracles": ORACLES,
        "rows": [r.as_json() for r in reports],
        "totals": {
            "broken_runtimes": len(broken_rows),
            "broken_scenarios": sum(len(r.outcomes) for r in broken_rows),
            "broken_flagged": sum(r.flagged for r in broken_rows),
            "control_scenarios": sum(len(r.outcomes) for r in control),
            "control_flagged": sum(r.flagged for r in control),
        },
    }


def report_markdown(reports: list[VariantReport]) -> str:
    lines = [
        "| variant | bug | scenarios | flagged | caught by |",
        "|---|---|---:|---:|---|",
    ]
    for r in reports:
        caught = ", ".join(f"{o} {r.caught_by[o]}" for o in ORACLES if r.caught_by[o]) or "-"
        lines.append(
            f"| {r.variant.name} | {r.variant.bug} | {len(r.outcomes)} | {r.flagged} | {caught} |"
        )
    return "\n".join(lines)


def dumps(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=False) + "\n"
