"""The chaos grid (SPEC §11): every workflow of the corpus x every crash point x every occurrence,
and deaths repeated while recovering, each checked by the correctness oracles.

A scenario is a workflow and a plan: the deaths its successive processes take (``lives.Death``:
a crash point and the occurrence of it, counted within that process). After the planned deaths
a last process finishes the runs. Every death mode (``lives.MODES``) takes the same plans.

Before anything resumes after a death, the crashed database is read read-only and checked: the
log, the side effects and the key claims agree (no torn write), the log and the signals table
agree on every delivery (none taken twice, or out of order, and those a ContinueAsNew hands on
handed to the next run), the log has no hole, no timer fired twice or early (a wait's timeout
included), every child run and ContinueAsNew link is whole (a child belongs to the ChildRun that
started it, whose log holds the child's end once it has ended; a continued run names the one
run it went on as, which names it), and every Parallel's record is its branches' outcomes, in
the order given. After the last process, the same again, and: every
timer fired exactly once (or ended its wait); no idempotency key has two effects in the world's
ledger; nothing was guessed (every AT_MOST_ONCE step found inside its ambiguous window was
dead-lettered, and nothing else was); no dead letter or key claim is left; a dry replay gives
the recorded result and calls nothing; and the final state equals the uncrashed reference run of
the workflow (ctx values compared by where they were recorded, not by value; ctx.patched markers
by where they were recorded and the patch they name; signals by which wait took each, and
timeouts by which waits ended so; every run of the database, the children and the runs of a
ContinueAsNew chain included, by a name that says where it came from, since a chain's runs
have new ids each time). The runs are brought to rest, checked and replayed as a family: a
spec's runs and every run they made.

Which occurrences exist is counted, not guessed: the uncrashed reference run counts every reach
of every point in the first process, and the last process of each scenario counts the reaches of
its recovery, which plans the deaths taken while recovering. A (workflow, point) pair, or a (first
death, second point) pair, with no reach cannot occur, and is counted as skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.corpus import AT_MOST_ONCE_TOOLS, CORPUS, SPECS, WORKFLOWS, Spec, World
from chaos.fanout import fan_out, workers_available
from chaos.lives import LIVES, Death, Live, SharedClock, live_in_process
from durabl import Runtime, codec, crashpoints
from durabl.steps import PatchMarker
from oracles.support import (
    Database,
    Snapshot,
    assert_log_and_effects_agree,
    assert_parallels_in_order,
    assert_runs_linked,
    assert_signals_delivered_once,
    assert_snapshot_gapless,
    assert_snapshot_timers,
    assert_steps_finish_once,
    run_names,
    run_started,
)

Plan = tuple[Death, ...]
ENDED = ("COMPLETED", "CONTINUED")
"""How every run of an uncrashed reference ends (a CONTINUED one named the run it went on as)."""
Place = Callable[[Path], AbstractContextManager[Database]]
"""Where a scenario's database lives, given the scenario's folder: the database, for as long
as the scenario needs it."""


@contextlib.contextmanager
def file_in(folder: Path) -> Iterator[Database]:
    """A SQLite file in the scenario's folder, removed with the folder."""
    yield folder / "durabl.db"


def describe(workflow: str, plan: Plan) -> str:
    return f"{workflow} x " + " then ".join(map(str, plan))


# -- what a database and the world say -------------------------------------------------------------


def lineage(snap: Snapshot, run_id: str, names: dict[str, str]) -> dict[str, Any]:
    """Where the run came from, by name: the run it continued, the parent step that started it."""
    data = run_started(snap, run_id)
    before, parent = data.get("continued_from"), data.get("parent")
    return {
        "continued_from": None if before is None else names.get(before, before),
        "parent": None
        if parent is None
        else [names.get(parent["run_id"], parent["run_id"]), parent["step"]],
    }


def _ctx_values(snap: Snapshot, names: dict[str, str]) -> list[tuple[str, str]]:
    """(recorded text, placeholder) for every ctx value, named by run and step position; then
    (run id, name) for every run whose id is not its name."""
    found = []
    for run_id, rows in snap.events.items():
        for _seq, kind, step, _fp, data, _at in rows:
            if kind == "CTX_RECORDED" and data is not None:
                text = data[1:-1] if data.startswith('"') else data
                found.append((text, f"<ctx {names.get(run_id, run_id)}:{step}>"))
    found.extend((run_id, f"<run {name}>") for run_id, name in names.items() if run_id != name)
    return found


def _normalise(text: str, values: list[tuple[str, str]]) -> str:
    for value, placeholder in values:
        text = re.sub(rf"(?<![\w.\-]){re.escape(value)}(?![\w.\-])", placeholder, text)
    return text


def patch_markers(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """[step, patch id] for each ``ctx.patched`` marker in a run's log: a ctx value whose recorded
    value is the patch id and whose fingerprint is that id's (docs/DECISIONS.md)."""
    found = []
    for _seq, kind, step, fp, data, _at in rows:
        if kind == "CTX_RECORDED" and data is not None and data.startswith('"'):
            value = json.loads(data)
            if PatchMarker(value).fingerprint == fp:
                found.append([step, value])
    return found


def signals(snap: Snapshot, run_id: str) -> list[list[Any]]:
    """[id, name, the step of the wait that took it (None: no wait has)] for each signal sent
    to the run, in the order sent."""
    return [
        [signal_id, name, delivered]
        for signal_id, name, _payload, _sent_s, delivered in snap.signals.get(run_id, [])
    ]


def timeouts(snap: Snapshot, run_id: str) -> list[int]:
    """The steps of the run's waits that timed out, taking no signal."""
    waits = snap.waits(run_id)
    return [
        step
        for _seq, kind, step, _fp, data, _at in snap.events[run_id]
        if kind == "STEP_COMPLETED" and step in waits and '"timed_out":true' in (data or "")
    ]


def final_state(snap: Snapshot, world: World) -> dict[str, Any]:
    """The final state, comparable between a crashed and an uncrashed run: each run's status,
    result, fired timers, patch markers (where the run recorded that it took a new branch),
    signals (which wait took each), waits that timed out, and where it came from (the run it
    continued, the parent step that started it), and the world's effects, with every ctx
    value replaced by where it was recorded and every run named as ``run_names`` does (the
    runs a ContinueAsNew makes have new ids each time, in their results and derived keys)."""
    names = run_names(snap)
    values = _ctx_values(snap, names)
    runs = {}
    for run_id, (_, status, result, error, _wake) in snap.runs.items():
        runs[names[run_id]] = {
            "status": status,
            "result": _normalise(result or "null", values),
            "error": error,
            "timers": sum(1 for e in snap.events[run_id] if e[1] == "TIMER_FIRED"),
            "patches": patch_markers(snap.events[run_id]),
            "signals": signals(snap, run_id),
            "timeouts": timeouts(snap, run_id),
            **lineage(snap, run_id, names),
        }
    effects = sorted(
        _normalise(json.dumps(record, sort_keys=True), values) for record in world.effects.records()
    )
    return {"runs": dict(sorted(runs.items())), "effects": effects}


def duplicate_effects(world: World) -> list[str]:
    """Idempotency keys the world saw an effect for more than once."""
    counts = Counter(record["key"] for record in world.effects.records())
    return sorted(key for key, n in counts.items() if n > 1)


def dead_lettered(snap: Snapshot) -> set[tuple[str, int]]:
    return {
        (run_id, e[2])
        for run_id, rows in snap.events.items()
        for e in rows
        if e[1] == "DEAD_LETTERED"
    }


def ambiguous(snap: Snapshot) -> dict[tuple[str, int], str]:
    """AT_MOST_ONCE steps inside their ambiguous window in this snapshot -> their key."""
    return {
        (run_id, step): key
        for run_id in snap.runs
        for step, (name, key) in snap.open_dispatches(run_id).items()
        if name in AT_MOST_ONCE_TOOLS
    }


# -- one scenario ----------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What one scenario did and what the oracles said about it."""

    workflow: str
    plan: Plan
    mode: str
    died: int = 0
    failures: list[str] = field(default_factory=list)
    duplicates: int = 0
    diverged: bool = False
    dead_letters: int = 0
    final: dict[str, Any] = field(default_factory=dict)
    reaches: dict[str, int] = field(default_factory=dict)
    """How often the last process (the recovery) reached each point."""

    @property
    def counted(self) -> bool:
        """Every planned death happened."""
        return self.died == len(self.plan)

    @property
    def label(self) -> str:
        return describe(self.workflow, self.plan)

    def comparable(self) -> tuple[Any, ...]:
        """Everything two death modes must agree on for the same plan."""
        return (
            self.workflow,
            self.plan,
            self.died,
            sorted(self.failures),
            self.duplicates,
            self.diverged,
            self.dead_letters,
            json.dumps(self.final, sort_keys=True),
            sorted(self.reaches.items()),
        )

    def check(self, what: str, oracle: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        try:
            oracle(*args, **kwargs)
        except AssertionError as exc:
            self.failures.append(f"{what}: {exc}")


@dataclass(frozen=True)
class Reference:
    """The uncrashed run of a workflow: its final state, and the reaches of its one process."""

    final: dict[str, Any]
    reaches: dict[str, int]


def reference(scratch: Path, spec: Spec, place: Place = file_in) -> Reference:
    folder = Path(tempfile.mkdtemp(prefix="reference-", dir=scratch))
    clock = SharedClock()
    try:
        with place(folder) as db:
            life = live_in_process(db, folder, spec, clock, None)
            assert life.error is None, f"{spec.name} reference: {life.error}"
            snap = Snapshot(db)
        world = World(folder)
        final = final_state(snap, world)
        assert all(run["status"] in ENDED for run in final["runs"].values()), final
        assert not duplicate_effects(world), final
        assert_log_and_effects_agree(snap)
        assert_runs_linked(snap)
        assert_parallels_in_order(snap)
        assert_signals_delivered_once(snap)
        assert_snapshot_timers(snap, finished=True)
        assert_steps_finish_once(snap, finished=True)
        return Reference(final, life.reaches)
    finally:
        clock.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_scenario(
    scratch: Path, mode: str, spec: Spec, plan: Plan, ref: Reference, place: Place = file_in
) -> Verdict:
    """Take the planned deaths in ``mode``, checking the crashed database after each, then
    finish the runs in a last process and apply every oracle."""
    folder = Path(tempfile.mkdtemp(prefix="scenario-", dir=scratch))
    clock = SharedClock()
    try:
        with place(folder) as db:
            verdict = Verdict(spec.name, plan, mode)
            v = _scenario(folder, db, LIVES[mode], verdict, spec, clock, ref)
        v.failures = [failure.replace(str(folder), "<scenario>") for failure in v.failures]
        return v
    finally:
        clock.close()
        shutil.rmtree(folder, ignore_errors=True)


def _scenario(
    folder: Path,
    db: Database,
    live: Live,
    v: Verdict,
    spec: Spec,
    clock: SharedClock,
    ref: Reference,
) -> Verdict:
    in_window: dict[tuple[str, int], str] = {}
    for number, death in enumerate(v.plan, start=1):
        life = live(db, folder, spec, clock, death)
        if life.error is not None:
            v.failures.append(f"process {number} raised {life.error}")
            return v
        if not life.died:
            v.failures.append(f"process {number} never reached {death}")
            return v
        v.died += 1
        snap = Snapshot(db)
        after = f"after death {number} ({death})"
        v.check(f"torn write {after}", assert_log_and_effects_agree, snap)
        v.check(f"signals {after}", assert_signals_delivered_once, snap)
        v.check(f"runs linked {after}", assert_runs_linked, snap)
        v.check(f"parallels in order {after}", assert_parallels_in_order, snap)
        v.check(f"gapless {after}", assert_snapshot_gapless, snap)
        v.check(f"timers {after}", assert_snapshot_timers, snap, finished=False)
        v.check(f"steps once {after}", assert_steps_finish_once, snap, finished=False)
        in_window.update(ambiguous(snap))
    last = live(db, folder, spec, clock, None)
    if last.error is not None:
        v.failures.append(f"recovery raised {last.error}")
        return v
    v.reaches = last.reaches
    _final_checks(db, folder, v, spec, clock, ref, in_window)
    return v


def _final_checks(
    db: Database,
    folder: Path,
    v: Verdict,
    spec: Spec,
    clock: SharedClock,
    ref: Reference,
    in_window: dict[tuple[str, int], str],
) -> None:
    snap = Snapshot(db)
    world = World(folder)
    v.final = final_state(snap, world)
    dupes = duplicate_effects(world)
    v.duplicates = len(dupes)
    if dupes:
        v.failures.append(f"duplicate side effects for keys {dupes}")
    if v.final != ref.final:
        v.diverged = True
        v.failures.append(f"final state {v.final} differs from the reference {ref.final}")
    v.check("torn write at the end", assert_log_and_effects_agree, snap)
    v.check("signals at the end", assert_signals_delivered_once, snap)
    v.check("runs linked at the end", assert_runs_linked, snap)
    v.check("parallels in order at the end", assert_parallels_in_order, snap)
    v.check("gapless at the end", assert_snapshot_gapless, snap)
    v.check("timers at the end", assert_snapshot_timers, snap, finished=True)
    v.check("steps once at the end", assert_steps_finish_once, snap, finished=True)
    letters = dead_lettered(snap)
    v.dead_letters = len(letters)
    guessed = sorted(set(in_window) - letters)
    if guessed:
        v.failures.append(f"AT_MOST_ONCE steps {guessed} died in their window and were guessed")
    keys = set(in_window.values())
    unexplained = sorted(
        (run_id, step)
        for run_id, step in letters - set(in_window)
        if snap.tool_steps(run_id)[step][1] not in keys
    )
    if unexplained:
        v.failures.append(f"steps {unexplained} dead-lettered without an ambiguous death")
    if snap.claims:
        v.failures.append(f"key claims left open: {snap.claims}")
    v.check("dry replay", _replays_alike, db, folder, spec, clock, snap)


def _replays_alike(
    db: Database, folder: Path, spec: Spec, clock: SharedClock, snap: Snapshot
) -> None:
    """Replaying each finished run (those the driver started, their children, and the runs
    their ContinueAsNew chains went on as) gives its recorded result, or for a CONTINUED run
    its end again, and calls nothing."""
    world = World(folder)
    with Runtime(db, llm=world.llm, tools=world.tools(), clock=clock, workflows=WORKFLOWS) as rt:
        for run_id, (_, status, recorded, _error, _wake) in sorted(snap.runs.items()):
            state = rt.replay(run_id)
            assert state.status == status, f"{run_id} replays as {state.status}, not {status}"
            if status != "CONTINUED":  # a continued run returns nothing: it went on as another
                assert codec.encode(state.result) == recorded, f"{run_id}: {state.result}"
            assert state.steps_executed == 0, f"{run_id} executed {state.steps_executed} steps"
    assert world.calls == 0, f"a dry replay called the world {world.calls} times"


# -- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Again:
    """A death taken while recovering from the deaths before it.

    ``occurrences``: which occurrences of each point it takes (None: every one; n: the first n
    and the last). It follows only deaths at occurrence ``after_occurrence`` or lower (None:
    any), at one of ``after_points`` (None: any), and, with ``after_dead_letter``, only
    scenarios that went through a dead letter (the operator's redrive or resolve).
    """

    occurrences: int | None = None
    after_occurrence: int | None = None
    after_points: frozenset[str] | None = None
    after_dead_letter: bool = False

    def follows(self, v: Verdict) -> bool:
        death = v.plan[-1]
        return (
            (self.after_occurrence is None or death.occurrence <= self.after_occurrence)
            and (self.after_points is None or death.point in self.after_points)
            and (not self.after_dead_letter or v.dead_letters > 0)
        )


@dataclass(frozen=True)
class Shape:
    """How much of the grid one death mode runs: ``first`` is which occurrences of each point a
    first death takes (None: every one; n: the first n and the last); ``again[i]`` plans death
    i + 2, taken while recovering from the deaths before it."""

    first: int | None = None
    again: tuple[Again, ...] = ()


def occurrences(reached: int, cap: int | None) -> list[int]:
    if cap is None or reached <= cap:
        return list(range(1, reached + 1))
    return [*range(1, cap + 1), reached]


def first_deaths(ref: Reference, shape: Shape) -> tuple[list[Plan], list[str]]:
    """Plans of one death for a workflow, and the points its first process never reaches."""
    plans: list[Plan] = []
    never = []
    for point in crashpoints.ALL:
        reached = ref.reaches.get(point, 0)
        if not reached:
            never.append(point)
        plans.extend((Death(point, n),) for n in occurrences(reached, shape.first))
    return plans, never


def next_deaths(v: Verdict, shape: Shape) -> tuple[list[Plan], list[str]]:
    """Plans that die once more while recovering from ``v``'s deaths, and the points that
    recovery never reaches."""
    level = len(v.plan) - 1
    if level >= len(shape.again) or v.failures or not shape.again[level].follows(v):
        return [], []
    again = shape.again[level]
    plans: list[Plan] = []
    never = []
    for point in crashpoints.ALL:
        reached = v.reaches.get(point, 0)
        if not reached:
            never.append(point)
        plans.extend((*v.plan, Death(point, n)) for n in occurrences(reached, again.occurrences))
    return plans, never


@dataclass
class Unit:
    """One worker's piece: a first death, in each mode that takes it, and the later deaths
    planned from each mode's recoveries."""

    workflow: str
    plan: Plan
    modes: tuple[tuple[str, Shape], ...]
    cost: int = 1
    """Roughly how long it takes (the reaches of the workflow's uncrashed run)."""


@dataclass
class UnitResult:
    verdicts: list[Verdict]
    skipped: list[str]


def run_unit(scratch: Path, unit: Unit, refs: dict[str, Reference]) -> UnitResult:
    spec, ref = SPECS[unit.workflow], refs[unit.workflow]
    verdicts, skipped = [], []
    for mode, shape in unit.modes:
        todo = [unit.plan]
        while todo:
            v = run_scenario(scratch, mode, spec, todo.pop(), ref)
            verdicts.append(v)
            plans, never = next_deaths(v, shape)
            skipped.extend(f"{v.label} then {point} [{mode}]" for point in never)
            todo.extend(reversed(plans))
    return UnitResult(verdicts, skipped)


def plan_units(
    refs: dict[str, Reference], shapes: dict[str, Shape]
) -> tuple[list[Unit], list[str]]:
    """One unit per first death, and the (workflow, point) pairs that cannot occur."""
    taken: dict[tuple[str, Plan], list[tuple[str, Shape]]] = {}
    skipped = []
    for spec in CORPUS:
        for mode, shape in shapes.items():
            plans, never = first_deaths(refs[spec.name], shape)
            skipped.extend(f"{spec.name} x {point} [{mode}]" for point in never)
            for plan in plans:
                taken.setdefault((spec.name, plan), []).append((mode, shape))
    units = [
        Unit(workflow, plan, tuple(modes), sum(refs[workflow].reaches.values()) * len(modes))
        for (workflow, plan), modes in taken.items()
    ]
    return units, skipped


# -- the whole grid --------------------------------------------------------------------------------


@dataclass
class Tally:
    """What a grid run did."""

    verdicts: list[Verdict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def counted(self, mode: str | None = None) -> list[Verdict]:
        return [v for v in self.verdicts if v.counted and mode in (None, v.mode)]

    def skipped_in(self, mode: str) -> int:
        return sum(1 for label in self.skipped if label.endswith(f"[{mode}]"))

    def deaths(self, mode: str | None = None) -> int:
        return sum(v.died for v in self.verdicts if mode in (None, v.mode))

    @property
    def failures(self) -> list[str]:
        return [f"{v.label} [{v.mode}]: {f}" for v in self.verdicts for f in v.failures]

    def per_point(self, mode: str | None = None) -> Counter[str]:
        """How many counted scenarios died at each point (once per point per scenario)."""
        hits: Counter[str] = Counter()
        for v in self.counted(mode):
            hits.update({death.point for death in v.plan})
        return hits

    def report(self, limit: int = 20) -> str:
        per_point = self.per_point()
        lines = [
            f"{len(self.counted())} scenarios counted, {self.deaths()} deaths, "
            f"{len(self.skipped)} skipped, {len(self.failures)} oracle failures",
            *(f"  {point:24} {per_point[point]:6}" for point in crashpoints.ALL),
            *self.failures[:limit],
        ]
        return "\n".join(lines)


def run_grid(
    scratch: Path,
    shapes: dict[str, Shape],
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Tally:
    """Plan the grid from the reference runs, run it on every core, and tally it."""
    started_s = time.monotonic()
    refs = {spec.name: reference(scratch, spec) for spec in CORPUS}
    units, skipped = plan_units(refs, shapes)
    tally = Tally(skipped=skipped)
    done = itertools.count(1)

    def tick(_result: UnitResult) -> None:
        if progress:
            progress(next(done), len(units))

    def work(unit: Unit) -> UnitResult:
        return run_unit(scratch, unit, refs)

    for result in fan_out(units, work, workers or workers_available(), tick):
        tally.verdicts.extend(result.verdicts)
        tally.skipped.extend(result.skipped)
    tally.seconds = time.monotonic() - started_s
    return tally


def disagreements(tally: Tally, mode: str = "sigkill", twin: str = "in-process") -> list[str]:
    """Plans run in ``mode`` whose verdict differs from the ``twin`` mode's on the same plan."""
    by_plan: dict[tuple[str, Plan, str], Verdict] = {
        (v.workflow, v.plan, v.mode): v for v in tally.verdicts
    }
    problems = []
    for (workflow, plan, ran_in), v in sorted(by_plan.items()):
        if ran_in != mode:
            continue
        other = by_plan.get((workflow, plan, twin))
        if other is None:
            problems.append(f"{v.label} ran in {mode} but not in {twin}")
        elif other.comparable() != v.comparable():
            problems.append(f"{v.label}: {twin} {other.comparable()} but {mode} {v.comparable()}")
    return problems


def scratch_dir(prefix: str = "durabl-chaos-") -> Path:
    """A folder for scenario databases: in memory when the machine has /dev/shm (the grid tests
    logic, not fsync)."""
    shm = "/dev/shm"
    base = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


WINDOW = frozenset({crashpoints.AFTER_TOOL_DISPATCHED, crashpoints.AFTER_TOOL_RETURNED})
SAMPLE = {
    "in-process": Shape(first=1, again=(Again(occurrences=1, after_occurrence=1),)),
    "sigkill": Shape(
        first=1,
        again=(
            Again(
                occurrences=1,
                after_occurrence=1,
                after_points=WINDOW | {crashpoints.AFTER_TIMER_ARMED},
            ),
        ),
    ),
}
"""The default suite's grid. In-process: each point's first and last occurrence as a first
death; after each first death at occurrence 1, a second death at the first and the last
occurrence of every point its recovery reaches. Under SIGKILL: the same first deaths, and the
second deaths after a first death in a tool's window or beside a timer."""
FULL = {
    "in-process": Shape(
        again=(
            Again(occurrences=3),
            Again(
                occurrences=1,
                after_points=WINDOW | {crashpoints.AFTER_DEAD_LETTERED},
                after_dead_letter=True,
            ),
        )
    ),
    "sigkill": Shape(again=(Again(occurrences=1, after_occurrence=1),)),
}
"""``make chaos``. In-process: every occurrence of every point as a first death; after each, a
second death at occurrences 1-3 and the last of every point its recovery reaches; and when that
second death was in a tool's window or right after a dead letter, and the scenario went through
a dead letter, a third death
at the first and the last occurrence of every point (the operator's redrive or resolve, killed).
Under SIGKILL: every first death, and the second deaths (first and last occurrence of every
point) after each first death at occurrence 1."""
