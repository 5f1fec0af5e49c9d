"""The chaos grid (SPEC §11), in both death modes, checked by every oracle.

The default suite runs a representative sample (``grid.SAMPLE``): each crash point's first and
last occurrence in every workflow of the corpus, and a second death (first and last occurrence of
every point) while recovering from each first death at occurrence 1, in-process; under real
SIGKILL, the same first deaths and the second deaths after a death in a tool's window or beside a
timer. ``DURABL_CHAOS=full`` (``make chaos``) runs the full grid (``grid.FULL``).

The grid runs once per session (a module fixture); each test states one property of it. The
workflows built on Parallel, ChildRun and ContinueAsNew die at every point in both modes, and end
with the runs (and the links between them) their uncrashed run made; the Parallel's twin whose
branches run at once is killed at every occurrence of every point on its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos import grid
from chaos.corpus import AT_ONCE, CORPUS, SPECS, Spec
from chaos.lives import MODES, Death, SharedClock, live_in_process
from durabl import crashpoints
from oracles.support import Database, Snapshot, copy_database

pytestmark = pytest.mark.timeout(900)
"""The grid runs in the first test's setup: minutes, more beside another test process."""
CHAOS = os.environ.get("DURABL_CHAOS", "sample")
SHAPES = {"sample": grid.SAMPLE, "full": grid.FULL}
MINIMUM = {
    "sample": {"in-process": 2600, "sigkill": 760},
    "full": {"in-process": 14_000, "sigkill": 1500},
}
"""Counted scenarios per mode: the grid must not silently shrink."""
PATCH_MARKERS = [[1, "chaos-plan-v2"], [4, "chaos-pay-v2"], [8, "chaos-close-v2"]]
"""Where ``chaos.patched`` records its markers: before its model call, after its timer, last."""
AROUND_A_MARKER = {
    crashpoints.AFTER_RUN_STARTED,  # the first marker is the run's first record
    crashpoints.BEFORE_CTX_RECORDED,  # drawn, not recorded
    crashpoints.BEFORE_STEP_STARTED,  # recorded, the step of its branch not begun
    crashpoints.AFTER_TIMER_FIRED,  # the step before the second marker
    crashpoints.BEFORE_RUN_COMPLETED,  # after the last marker
    crashpoints.DURING_REPLAY,  # a recovery replaying past recorded markers
}
SIGNALS = [[1, "budget", 4], [2, "approve", 2], [3, "close", 7]]
"""Which wait of ``chaos.signal`` takes each signal: ``budget``, sent first (while the run waits
for ``approve``), is kept for the wait at step 4, which takes it at once; ``approve`` and
``close`` are taken by the waits they answer, parked at steps 2 and 7."""
TIMEOUTS = [6]
"""The wait of ``chaos.signal`` that nobody answers."""
AROUND_A_WAIT = {
    crashpoints.BEFORE_STEP_STARTED,  # a wait reached, nothing of it recorded
    crashpoints.AFTER_TIMER_ARMED,  # a wait with a timeout parked
    crashpoints.AFTER_STEP_STARTED,  # a wait without one parked
    crashpoints.AFTER_LEASE_TAKEN,  # a run made due by a signal, taken by a tick
    crashpoints.AFTER_STEP_COMMITTED,  # a signal delivered, or a wait timed out
    crashpoints.DURING_REPLAY,  # a recovery replaying past the waits that ended
}
BESIDE_A_WAIT = {
    "parked approve",
    "due with approve",
    "took approve",
    "took budget",
    "parked reply",
    "reply timed out",
    "parked close",
    "due with close",
    "took close",
}
"""The instants of ``chaos.signal`` that ``wait_instants`` finds."""
PARKS = (crashpoints.AFTER_TIMER_ARMED, crashpoints.AFTER_STEP_STARTED)
FAMILIES = {
    "chaos.child": {"child-1": None, "child-1-2": ["child-1", 2]},
    "chaos.continue": {"continue-1": None, "continue-1~2": None, "continue-1~3": None},
}
"""The runs each of these workflows ends with, and the parent step each names."""
CHAIN = {"continue-1": None, "continue-1~2": "continue-1", "continue-1~3": "continue-1~2"}
"""The run each run of ``chaos.continue`` continued."""
HANDED_ON = {
    "continue-1": [[1, "next", 4], [2, "go", 1]],
    "continue-1~2": [[1, "next", 1]],
    "continue-1~3": [],
}
"""Which step took each signal of ``chaos.continue``'s runs: ``next``, sent with ``go`` to the
first turn, is marked delivered to its ContinueAsNew (step 4), which hands it to the second
turn, whose wait (step 1) takes it."""


@pytest.fixture(scope="module")
def tally() -> Iterator[grid.Tally]:
    if CHAOS not in SHAPES:
        raise ValueError(f"DURABL_CHAOS must be one of {sorted(SHAPES)}, got {CHAOS!r}")
    scratch = grid.scratch_dir()
    try:
        yield grid.run_grid(scratch, SHAPES[CHAOS])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("mode", ["in-process", "sigkill"])
def test_every_scenario_passes_every_oracle(tally: grid.Tally, mode: str) -> None:
    failures = [
        f"{v.label}: {failure}" for v in tally.verdicts if v.mode == mode for failure in v.failures
    ]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    assert not [v.label for v in tally.verdicts if v.mode == mode and v.duplicates]
    assert not [v.label for v in tally.verdicts if v.mode == mode and v.diverged]


@pytest.mark.parametrize("mode", ["in-process", "sigkill"])
def test_every_counted_scenario_took_its_deaths(tally: grid.Tally, mode: str) -> None:
    verdicts = [v for v in tally.verdicts if v.mode == mode]
    assert verdicts
    assert all(v.counted and v.died == len(v.plan) >= 1 for v in verdicts), [
        v.label for v in verdicts if not v.counted
    ]
    assert len(tally.counted(mode)) >= MINIMUM[CHAOS][mode], tally.report()
    assert tally.skipped_in(mode) > 0, "impossible pairs are counted as skipped"


def test_both_modes_give_the_same_verdicts(tally: grid.Tally) -> None:
    problems = grid.disagreements(tally)
    assert not problems, "\n".join(problems[:10])
    assert len(tally.counted("sigkill")) >= MINIMUM[CHAOS]["sigkill"]


@pytest.mark.parametrize("mode", ["in-process", "sigkill"])
def test_every_crash_point_is_hit(tally: grid.Tally, mode: str) -> None:
    per_point = tally.per_point(mode)
    assert set(per_point) == set(crashpoints.ALL), tally.report()
    second = {v.plan[1].point for v in tally.counted(mode) if len(v.plan) == 2}
    assert crashpoints.AFTER_DEAD_LETTERED in second, "a death right after dead-lettering"
    assert crashpoints.DURING_REPLAY in second, "a death while replaying after a death"


def test_every_workflow_takes_first_and_repeated_deaths(tally: grid.Tally) -> None:
    for spec in CORPUS:
        plans = [v.plan for v in tally.counted("in-process") if v.workflow == spec.name]
        assert any(len(plan) == 1 for plan in plans), spec.name
        assert any(len(plan) == 2 for plan in plans), spec.name


def test_the_operator_had_work_and_shared_keys_were_contended(tally: grid.Tally) -> None:
    """Deaths inside an AT_MOST_ONCE window dead-letter; with a key two runs share, the second
    run dead-letters too (the first run's open claim on the key is just as ambiguous)."""
    letters = [v for v in tally.counted() if v.dead_letters]
    assert {v.workflow for v in letters} >= {
        "chaos.payment",
        "chaos.shared",
        "chaos.long",
        "chaos.mixed",
        "chaos.parallel",  # a branch of a Parallel: its siblings settle, the run is held
        "chaos.child",  # the child: its parent waits on it
        "chaos.continue",  # a run a ContinueAsNew made
    }
    assert any(v.workflow == "chaos.shared" and v.dead_letters == 2 for v in letters)


def test_crash_points_are_off_once_the_grid_is_done(tally: grid.Tally) -> None:
    """Production has no hook: the harness leaves none behind."""
    assert tally.verdicts
    assert crashpoints.hooks == []


def test_patch_markers_end_where_the_uncrashed_run_recorded_them(tally: grid.Tally) -> None:
    """The final state holds each run's ctx.patched markers (position and patch id), so a marker
    recorded twice, lost or moved by a death is a divergence; here, directly: every counted
    scenario of ``chaos.patched``, in both modes, ends with the same three, and deaths fell at
    every point around recording one."""
    verdicts = [v for v in tally.counted() if v.workflow == "chaos.patched"]
    assert {v.mode for v in verdicts} == set(MODES)
    assert all(v.final["runs"]["patched-1"]["patches"] == PATCH_MARKERS for v in verdicts)
    for mode in MODES:
        died = {death.point for v in verdicts if v.mode == mode for death in v.plan}
        assert died >= AROUND_A_MARKER, (mode, sorted(AROUND_A_MARKER - died))


@pytest.mark.parametrize("mode", MODES)
def test_a_death_before_each_ctx_record_of_the_patched_workflow_changes_nothing(
    mode: str,
) -> None:
    """The sample kills ``chaos.patched`` before its first and its last ctx record; this kills
    it before each (its markers are records 1, 2 and 4, its uuid record 3), so that every
    marker is lost once as it is drawn. The resumed run must record it again, once, where the
    uncrashed run did."""
    spec = SPECS["chaos.patched"]
    scratch = grid.scratch_dir()
    try:
        ref = grid.reference(scratch, spec)
        assert ref.final["runs"]["patched-1"]["patches"] == PATCH_MARKERS
        assert '"stamp":"<ctx patched-1:7>"' in ref.final["runs"]["patched-1"]["result"]
        records = ref.reaches[crashpoints.BEFORE_CTX_RECORDED]
        assert records == 4
        for n in range(1, records + 1):
            plan = (Death(crashpoints.BEFORE_CTX_RECORDED, n),)
            v = grid.run_scenario(scratch, mode, spec, plan, ref)
            assert v.counted and not v.failures, (v.label, v.failures)
            assert v.final == ref.final
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_signals_end_where_the_uncrashed_run_took_them(tally: grid.Tally) -> None:
    """The final state holds which wait took each signal and which waits timed out, so a signal
    lost, taken twice or taken by another wait, or a timeout missed, is a divergence; here,
    directly: every counted scenario of ``chaos.signal``, in both modes, ends with the same
    deliveries, and deaths fell at every point around parking a wait and delivering to it."""
    verdicts = [v for v in tally.counted() if v.workflow == "chaos.signal"]
    assert {v.mode for v in verdicts} == set(MODES)
    for v in verdicts:
        run = v.final["runs"]["signal-1"]
        assert (run["signals"], run["timeouts"]) == (SIGNALS, TIMEOUTS), v.label
    for mode in MODES:
        died = {death.point for v in verdicts if v.mode == mode for death in v.plan}
        assert died >= AROUND_A_WAIT, (mode, sorted(AROUND_A_WAIT - died))


def wait_instants(scratch: Path, spec: Spec) -> dict[Death, str]:
    """The reaches of ``spec``'s uncrashed run that fall beside one of its waits, found by
    reading its database at every reach: a wait just parked, a run a signal made due just taken
    by a tick (the delivery not yet made), a wait just ended (its signal taken, or timed out)."""
    folder = Path(tempfile.mkdtemp(prefix="instants-", dir=scratch))
    db = folder / "durabl.db"
    [(run_id, _)] = spec.runs
    seen: Counter[str] = Counter()
    found: dict[Death, str] = {}

    def look(point: str) -> None:
        seen[point] += 1
        snap = Snapshot(db)
        waits = snap.waits(run_id)
        _seq, kind, step, _fp, data, _at = snap.events[run_id][-1]
        if step not in waits:
            return
        name, here = waits[step], Death(point, seen[point])
        if point in PARKS and kind in ("STEP_STARTED", "TIMER_ARMED"):
            found[here] = f"parked {name}"
        elif point == crashpoints.AFTER_STEP_COMMITTED and kind == "STEP_COMPLETED":
            found[here] = f"{name} timed out" if '"timed_out":true' in data else f"took {name}"
        elif point == crashpoints.AFTER_LEASE_TAKEN and kind != "STEP_COMPLETED":
            pending = {signal[1] for signal in snap.signals[run_id] if signal[4] is None}
            if name in pending:
                found[here] = f"due with {name}"

    clock = SharedClock()
    remove = crashpoints.install(look)
    try:
        life = live_in_process(db, folder, spec, clock, None)
        assert life.error is None, life.error
    finally:
        remove()
        clock.close()
        shutil.rmtree(folder, ignore_errors=True)
    return found


@pytest.mark.parametrize("mode", MODES)
def test_a_death_beside_each_wait_of_the_signal_workflow_changes_nothing(mode: str) -> None:
    """The sample kills ``chaos.signal`` at the first and the last reach of each point; this
    kills it at every instant beside one of its waits (found by reading the database at every
    reach), so that each wait is interrupted just after it parks, each delivery just before
    and just after it is made, and the timeout just after it ends the wait. In-process, the
    recovery from each is killed again, at the first and the last reach of every point around a
    wait."""
    spec = SPECS["chaos.signal"]
    scratch = grid.scratch_dir()
    try:
        ref = grid.reference(scratch, spec)
        instants = wait_instants(scratch, spec)
        assert set(instants.values()) == BESIDE_A_WAIT, instants
        again = grid.Shape(again=(grid.Again(occurrences=1),))
        for death, what in sorted(instants.items()):
            v = grid.run_scenario(scratch, mode, spec, (death,), ref)
            assert v.counted and not v.failures, (what, v.label, v.failures)
            assert v.final == ref.final, what
            if mode != "in-process":
                continue
            plans, _never = grid.next_deaths(v, again)
            around = [plan for plan in plans if plan[-1].point in AROUND_A_WAIT]
            assert around, what
            for plan in around:
                twice = grid.run_scenario(scratch, mode, spec, plan, ref)
                assert twice.counted and not twice.failures, (twice.label, twice.failures)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("workflow", ["chaos.parallel", "chaos.child", "chaos.continue"])
def test_the_new_step_kinds_die_at_every_point_in_both_modes(
    tally: grid.Tally, workflow: str
) -> None:
    """Each of the workflows built on Parallel, ChildRun and ContinueAsNew reaches every crash
    point (a dead letter's only in a recovery, as everywhere), and the grid killed it at every
    one, as a first or a later death, in-process and under SIGKILL."""
    verdicts = [v for v in tally.counted() if v.workflow == workflow]
    for mode in MODES:
        died = {death.point for v in verdicts if v.mode == mode for death in v.plan}
        assert died == set(crashpoints.ALL), (mode, sorted(set(crashpoints.ALL) - died))
        first = {v.plan[0].point for v in verdicts if v.mode == mode}
        assert first == set(crashpoints.ALL) - {crashpoints.AFTER_DEAD_LETTERED}, mode


def test_child_runs_and_chains_end_with_the_runs_the_uncrashed_one_made(
    tally: grid.Tally,
) -> None:
    """The final state names every run of the database and where it came from, so a child
    started twice, a chain continued twice, a lost link or a signal handed on wrongly is a
    divergence; here, directly: every counted scenario of ``chaos.child`` ends with the parent
    and one child naming the parent's step 2, and every one of ``chaos.continue`` with one
    chain of three runs, each continuing the one before, the signal ``next`` handed on."""
    for workflow, family in FAMILIES.items():
        verdicts = [v for v in tally.counted() if v.workflow == workflow]
        assert {v.mode for v in verdicts} == set(MODES)
        for v in verdicts:
            runs = v.final["runs"]
            assert {name: run["parent"] for name, run in runs.items()} == family, v.label
    for v in (v for v in tally.counted() if v.workflow == "chaos.continue"):
        runs = v.final["runs"]
        assert {name: run["continued_from"] for name, run in runs.items()} == CHAIN, v.label
        assert {name: run["signals"] for name, run in runs.items()} == HANDED_ON, v.label
        assert [runs[name]["status"] for name in CHAIN] == ["CONTINUED", "CONTINUED", "COMPLETED"]


@contextlib.contextmanager
def kept(folder: Path, into: Path) -> Iterator[Database]:
    """A scenario's database in its folder, copied to ``into`` once the scenario is done."""
    db = folder / "durabl.db"
    try:
        yield db
    finally:
        copy_database(db, into)


@pytest.mark.parametrize("mode", MODES)
def test_a_death_in_a_branch_window_lets_its_siblings_settle_before_it(mode: str) -> None:
    """The grid kills ``chaos.parallel`` inside its charge's window (the first branch); the
    recovery dead-letters the charge and settles the other two branches all the same (the
    send; the model call, which backs off), and only then does the operator's redrive finish
    the charge: the branches finish out of the order given, and the Parallel, recorded once
    all of them have, lists them in it (the grid's oracles, and the reference's result)."""
    spec = SPECS["chaos.parallel"]
    scratch = grid.scratch_dir()
    try:
        ref = grid.reference(scratch, spec)
        kept_db = scratch / "kept.db"
        plan = (Death(crashpoints.AFTER_TOOL_DISPATCHED, 1),)
        v = grid.run_scenario(scratch, mode, spec, plan, ref, lambda folder: kept(folder, kept_db))
        assert v.counted and not v.failures and v.dead_letters == 1, (v.label, v.failures)
        assert v.final == ref.final
        rows = Snapshot(kept_db).events["parallel-1"]
        done = {step: seq for seq, kind, step, *_ in rows if kind == "STEP_COMPLETED"}
        lettered = [step for _seq, kind, step, *_ in rows if kind == "DEAD_LETTERED"]
        assert lettered == [3]  # the charge, the Parallel's first branch (at 2)
        assert done[4] < done[3]  # the second branch finished before the first
        assert max(done[3], done[4], done[5]) < done[2]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_parallel_whose_branches_run_at_once_survives_a_death_at_every_point(
    mode: str,
) -> None:
    """``chaos.parallel`` with its branches at once (``chaos.parallel.at_once``), killed at
    every occurrence of every point its uncrashed run reaches. Which branch reaches a point
    first is the threads' affair, so a plan does not name the same instant in every process or
    both modes, and the grid's agreement between modes cannot hold; every other oracle must,
    and the final state must be the reference's, whichever branch died."""
    scratch = grid.scratch_dir()
    try:
        ref = grid.reference(scratch, AT_ONCE)
        plans, never = grid.first_deaths(ref, grid.Shape())
        assert never == [crashpoints.AFTER_DEAD_LETTERED]
        for plan in plans:
            v = grid.run_scenario(scratch, mode, AT_ONCE, plan, ref)
            assert v.counted and not v.failures, (v.label, v.failures)
            assert v.final == ref.final, v.label
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
