"""The chaos grid (SPEC §11), in both death modes, checked by every oracle.

The default suite runs a representative sample (``grid.SAMPLE``): each crash point's first and
last occurrence in every workflow of the corpus, and a second death (first and last occurrence of
every point) while recovering from each first death at occurrence 1, in-process; under real
SIGKILL, the same first deaths and the second deaths after a death in a tool's window or beside a
timer. ``DURABL_CHAOS=full`` (``make chaos``) runs the full grid (``grid.FULL``).

The grid runs once per session (a module fixture); each test states one property of it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from chaos import grid
from chaos.corpus import CORPUS, SPECS
from chaos.lives import MODES, Death
from durabl import crashpoints

CHAOS = os.environ.get("DURABL_CHAOS", "sample")
SHAPES = {"sample": grid.SAMPLE, "full": grid.FULL}
MINIMUM = {
    "sample": {"in-process": 1200, "sigkill": 350},
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
    }
    assert any(v.workflow == "chaos.shared" and v.dead_letters == 2 for v in letters)


def test_crash_points_are_off_once_the_grid_is_done(tally: grid.Tally) -> None:
    """Production has no hook: the harness leaves none behind."""
    assert tally.verdicts
    assert crashpoints._hooks == []


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
