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
from chaos.corpus import CORPUS
from durabl import crashpoints

CHAOS = os.environ.get("DURABL_CHAOS", "sample")
SHAPES = {"sample": grid.SAMPLE, "full": grid.FULL}
MINIMUM = {
    "sample": {"in-process": 1200, "sigkill": 350},
    "full": {"in-process": 14_000, "sigkill": 1500},
}
"""Counted scenarios per mode: the grid must not silently shrink."""


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
