"""The negative control (SPEC §12): the harness must catch every broken runtime, every time,
and must never flag the real one.

The broken runtimes are real ``Runtime`` subclasses (``broken_runtime.py``); the schedules and
the runner live in ``negative_control.py``, which ``scripts/negative_control_report.py`` also
runs, so the table it prints is what these tests assert.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from durabl import Runtime, crashpoints

from . import broken_runtime as broken
from .negative_control import (
    AGENT,
    ANSWERED,
    AT_REST,
    BROKEN,
    CHILDREN,
    CONTROL,
    DUPLICATE,
    FAN,
    FINAL,
    GUARD_OUT,
    IN_ORDER,
    LINKED,
    LOOP,
    NESTED,
    SHARED,
    SIGNALS,
    TOOLS,
    TORN,
    TURNS,
    WINDOW,
    Bench,
    Schedule,
    Variant,
    control_schedules,
    patch_schedules,
)

SPLIT = {
    broken.SplitEffectFirst: broken.SPLIT_EFFECT_FIRST_GAP,
    broken.SplitCompletionFirst: broken.SPLIT_COMPLETION_FIRST_GAP,
}
SPLIT_LINKS = {
    broken.SplitParentNote: broken.SPLIT_NOTE_GAP,
    broken.SplitContinuation: broken.SPLIT_CONTINUE_GAP,
}
"""The split runtimes of ChildRun and ContinueAsNew: a link between two runs made in two
transactions."""
MIN_SCHEDULES = 6
"""No broken runtime may be judged on fewer schedules than this."""
TOOL_STEP_POINTS = {
    crashpoints.BEFORE_STEP_STARTED,
    crashpoints.AFTER_STEP_STARTED,
    crashpoints.AFTER_TOOL_DISPATCHED,
    crashpoints.AFTER_TOOL_RETURNED,
    crashpoints.AFTER_STEP_COMMITTED,
}


@pytest.fixture(scope="module")
def bench() -> Iterator[Bench]:
    tmpfs = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    scratch = Path(tempfile.mkdtemp(prefix="durabl-negative-", dir=tmpfs))
    try:
        yield Bench(scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_there_are_at_least_five_broken_runtimes_and_each_is_a_real_runtime() -> None:
    assert len(BROKEN) >= 5
    assert len({v.runtime for v in BROKEN}) == len(BROKEN)
    for variant in BROKEN:
        assert issubclass(variant.runtime, Runtime) and variant.runtime is not Runtime
    assert CONTROL.runtime is Runtime


@pytest.mark.parametrize("variant", BROKEN, ids=[v.name for v in BROKEN])
def test_every_broken_runtime_is_flagged_on_every_one_of_its_schedules(
    bench: Bench, variant: Variant
) -> None:
    report = bench.run_variant(variant)

    assert len(report.outcomes) >= MIN_SCHEDULES
    planned = [o for o in report.outcomes if o.schedule.point is not None]
    assert planned, "a negative control with no death aims at nothing"
    assert all(o.died for o in planned), [o.schedule.label for o in planned if not o.died]
    missed = [o.schedule.label for o in report.outcomes if not o.flagged]
    assert not missed, f"{variant.name} got through: {missed}"


@pytest.mark.parametrize("cls", list(SPLIT), ids=lambda cls: cls.__name__)
def test_the_split_runtimes_die_in_their_own_gap_and_only_the_crashed_file_shows_it(
    bench: Bench, cls: type[Runtime]
) -> None:
    [variant] = [v for v in BROKEN if v.runtime is cls]
    report = bench.run_variant(variant)

    assert {o.schedule.point for o in report.outcomes} == {SPLIT[cls]}
    assert all(TORN in o.flags for o in report.outcomes)
    # The recovery path consults the side_effects table as well as the log, so it heals some
    # of these: a check that only looked at the end would have let them through.
    healed = [o.schedule.label for o in report.outcomes if set(o.flags) == {TORN}]
    assert healed, "expected some split schedules to be visible only before resume"
    assert all(AT_REST not in o.flags for o in report.outcomes if o.schedule.label in healed)


def test_the_dispatch_schedules_die_inside_the_window_of_an_at_most_once_tool(
    bench: Bench,
) -> None:
    for variant in BROKEN:
        if variant.runtime in (broken.IgnoresDispatched, broken.SkipsDispatchMarker):
            report = bench.run_variant(variant)
            assert all(o.schedule.point in WINDOW and o.in_window for o in report.outcomes)
            scenarios = {o.schedule.scenario.name for o in report.outcomes}
            assert SHARED["charge"].name in scenarios and TOOLS.name in scenarios


def test_the_real_runtime_is_flagged_on_none_of_the_same_schedules(bench: Bench) -> None:
    report = bench.run_variant(CONTROL)
    schedules = control_schedules(bench)

    assert [o.schedule for o in report.outcomes] == schedules
    assert not any(o.schedule.point in broken.PROBES for o in report.outcomes)
    for variant in BROKEN:
        for schedule in variant.schedules(bench):
            if schedule.point not in broken.PROBES:
                assert schedule in schedules, f"{variant.name}: {schedule.label}"
    planned = [o for o in report.outcomes if o.schedule.point is not None]
    assert all(o.died for o in planned), [o.schedule.label for o in planned if not o.died]
    flagged = {o.schedule.label: o.flags for o in report.outcomes if o.flagged}
    assert flagged == {}, f"the real runtime was flagged: {flagged}"
    assert sum(o.in_window for o in report.outcomes) >= 4, "no death in the ambiguous window"


def test_the_real_runtime_has_no_instant_between_effect_and_completion(bench: Bench) -> None:
    assert not set(broken.PROBES) & set(crashpoints.ALL)
    assert not [p for p in crashpoints.ALL if "split" in p or "gap" in p]

    for scenario in (TOOLS, AGENT, SHARED["charge"]):
        seen, torn = bench.inspect_every_point(Runtime, scenario)
        assert set(seen) >= TOOL_STEP_POINTS, seen
        assert torn == [], f"{scenario.name}: {torn}"

    # The same inspection does see the gap a split runtime opens, at its probe.
    for cls, probe in SPLIT.items():
        seen, torn = bench.inspect_every_point(cls, TOOLS)
        assert seen[probe] == 4
        assert len([t for t in torn if t.startswith(f"{probe} ")]) == 4, torn


def test_a_forgotten_patch_marker_shows_once_the_guard_is_taken_out(bench: Bench) -> None:
    """Under unchanged code a run whose marker was never recorded finishes as it should: the
    next pass finds the marker's position empty and takes the new branch again. So the schedules
    deploy the code with the guard taken out before the recovery, as a team does once the old
    runs are finished: the real runtime steps over the marker, the broken one runs the branch's
    model call again and is held at the step after it."""
    [variant] = [v for v in BROKEN if v.runtime is broken.ForgetsPatchMarkers]
    caught = bench.run_variant(variant)
    assert all(o.died and set(o.flags) == {FINAL} for o in caught.outcomes)

    unchanged = replace(GUARD_OUT, name="patched, code unchanged", deployed=None)
    same_code = replace(variant, schedules=lambda _: patch_schedules(unchanged))
    missed = bench.run_variant(same_code)
    assert len(missed.outcomes) == len(caught.outcomes)
    assert all(o.died and not o.flagged for o in missed.outcomes)


def test_a_signal_taken_without_being_marked_delivered_is_taken_again(bench: Bench) -> None:
    """The broken runtime's first wait returns the signal's payload as the real one's does, so
    the run looks right up to there; but the signal stays pending, so the second wait of its
    name takes it again instead of timing out. The signals oracle sees the table disagree with
    the log, and the result differs from the reference; the real runtime, on the same
    schedules, takes the signal once and times the second wait out."""
    [variant] = [v for v in BROKEN if v.runtime is broken.ForgetsSignalDelivery]
    caught = bench.run_variant(variant)
    assert all(set(o.flags) == {SIGNALS, FINAL} for o in caught.outcomes), [
        (o.schedule.label, sorted(o.flags)) for o in caught.outcomes
    ]
    assert bench.reference(ANSWERED).results["A"].endswith('"no second answer"]')

    real = bench.run_variant(replace(variant, runtime=Runtime))
    assert [o.schedule for o in real.outcomes] == [o.schedule for o in caught.outcomes]
    assert all(not o.flagged for o in real.outcomes)
    assert all(o.died for o in real.outcomes if o.schedule.point is not None)


def variant_of(cls: type[Runtime]) -> Variant:
    [variant] = [v for v in BROKEN if v.runtime is cls]
    return variant


def test_a_parallel_recorded_in_completion_order_shows_in_its_log(bench: Bench) -> None:
    """The Parallel's first branch backs off and finishes last, so the broken runtime records
    the results shuffled. The pass that ran the branches hands the workflow the right list:
    when nothing serves the Parallel from the log after (no death, or a death before its
    commit) the run's result is right, and only the Parallel's record in the log shows the bug;
    a death after the commit makes the recovery serve the shuffled list, and the result goes
    wrong. The real runtime, on the same schedules, records the order given."""
    variant = variant_of(broken.ParallelInCompletionOrder)
    caught = bench.run_variant(variant)
    assert all(IN_ORDER in o.flags for o in caught.outcomes)
    only_the_log = [o.schedule.label for o in caught.outcomes if set(o.flags) == {IN_ORDER}]
    assert f"{FAN.name} x no crash" in only_the_log
    served_after = [
        o for o in caught.outcomes if o.schedule.point == crashpoints.BEFORE_RUN_COMPLETED
    ]
    assert served_after and all(FINAL in o.flags for o in served_after)

    real = bench.run_variant(replace(variant, runtime=Runtime))
    assert all(not o.flagged for o in real.outcomes)
    assert all(o.died for o in real.outcomes if o.schedule.point is not None)


def test_a_parallel_that_runs_its_finished_branches_again_charges_twice(bench: Bench) -> None:
    """The run parks on the flaky branch's backoff after the charge and the model call have
    finished; the broken runtime, reaching the Parallel again, runs them again: the world sees
    the AT_MOST_ONCE charge twice (or, after a death, more)."""
    caught = bench.run_variant(variant_of(broken.RerunsServedBranches))
    assert all(o.flagged for o in caught.outcomes)
    twice = [o for o in caught.outcomes if DUPLICATE in o.flags]
    assert len(twice) >= len(caught.outcomes) - 1
    assert all("charge" in o.flags[DUPLICATE] for o in twice)


@pytest.mark.parametrize("cls", list(SPLIT_LINKS), ids=lambda cls: cls.__name__)
def test_a_link_between_runs_made_in_two_transactions_shows_only_with_a_death_between(
    bench: Bench, cls: type[Runtime]
) -> None:
    """A child's end and its parent's record of it, or the next run of a chain and the end of
    the run that continued, are one commit in the real runtime. The split runtimes die in their
    own gap on every schedule, and the links oracle sees the half-made link on the file the
    dead process left (a child that ended unheard of, or a run that continues one still
    running); with no death there, the same runtimes finish every scenario unflagged."""
    variant = variant_of(cls)
    caught = bench.run_variant(variant)
    assert {o.schedule.point for o in caught.outcomes} == {SPLIT_LINKS[cls]}
    assert all(o.died and LINKED in o.flags for o in caught.outcomes)

    scenarios = {o.schedule.scenario for o in caught.outcomes}
    no_death = replace(variant, schedules=lambda _: [Schedule(s, None) for s in scenarios])
    missed = bench.run_variant(no_death)
    assert len(missed.outcomes) == len(scenarios) >= 2
    assert all(not o.flagged for o in missed.outcomes)


def test_the_real_runtime_dies_around_each_link_at_the_real_points_beside_it(
    bench: Bench,
) -> None:
    """In place of a split runtime's probe, the real runtime dies at the real points the split
    runtime passes just before and just after it: the child's last point before its end and
    the parent's first after it; the ContinueAsNew's BEFORE_STEP_STARTED and its
    AFTER_STEP_COMMITTED (one commit between them in the real runtime)."""
    note = bench.around(broken.SplitParentNote, Schedule(CHILDREN, broken.SPLIT_NOTE_GAP, 1))
    assert [(s.point, s.occurrence) for s in note] == [
        (crashpoints.BEFORE_RUN_COMPLETED, 1),
        (crashpoints.BEFORE_STEP_STARTED, 3),
    ]
    for scenario, n in ((TURNS, 1), (LOOP, 3), (CHILDREN, 1)):
        schedule = Schedule(scenario, broken.SPLIT_CONTINUE_GAP, n)
        points = [s.point for s in bench.around(broken.SplitContinuation, schedule)]
        assert points == [crashpoints.BEFORE_STEP_STARTED, crashpoints.AFTER_STEP_COMMITTED]
    control = set(control_schedules(bench))
    for variant in BROKEN:
        for schedule in variant.schedules(bench):
            if variant.runtime in SPLIT_LINKS:
                around = bench.around(variant.runtime, schedule)
                assert len(around) == 2 and {s.point for s in around} <= set(crashpoints.ALL)
                assert set(around) <= control, schedule.label
    assert NESTED in {s.scenario for s in control}


def test_signals_left_behind_by_a_continuation_are_never_taken(bench: Bench) -> None:
    """The broken runtime continues without handing ``later`` on: the first run is CONTINUED
    with a signal pending, which the signals oracle refuses, and the second turn's wait times
    out, so the result differs from the reference's; the real runtime hands it on."""
    variant = variant_of(broken.ForgetsCarriedSignals)
    caught = bench.run_variant(variant)
    assert all(set(o.flags) == {SIGNALS, FINAL} for o in caught.outcomes), [
        (o.schedule.label, sorted(o.flags)) for o in caught.outcomes
    ]
    assert '"heard":["go","see you"]' in bench.reference(TURNS).results["A"]

    real = bench.run_variant(replace(variant, runtime=Runtime))
    assert all(not o.flagged for o in real.outcomes)
