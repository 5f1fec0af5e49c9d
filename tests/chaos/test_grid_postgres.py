"""A sample of the chaos grid on PostgreSQL: the scenarios of ``test_grid.py``, checked by the
same oracles (``grid.run_scenario``), with each scenario's database on the server.

The sample is fixed, so that a failure names a cell anyone can run again: for each workflow of
``IN_PROCESS``, every crash point its uncrashed run reaches, at the first and the last occurrence,
as a first death in-process; for each workflow of ``SIGKILL``, the first occurrence of every point
under a real SIGKILL (the server sees the client vanish mid-transaction), whose verdict must be
the in-process verdict of the same plan, as in the full grid; and, in ``shared``, a second death
at every point while recovering from a death in a tool's ambiguous window. The workflows: two runs
contending for the same explicit keys, with timers (``shared``); model and tool retries, backoff
timers and caught failures (``retrying``); derived and explicit keys on AT_MOST_ONCE tools, one
asked for twice (``payment``); a timer, a charge and a ctx value together (``mixed``); and waits
for signals sent before and after the run reaches them, one timing out (``signal``, in-process:
the signals table's deliveries and the log checked after every death); a Parallel of both tool
modes and a model call (``parallel``), a child run and its end recorded in its parent's log by
the commit that ends it (``child``), and a chain of ContinueAsNew runs, each created in the
commit that ends the one before and handed its signals there (``continue``, in-process and,
as runs created under a lease the killed client held, under SIGKILL). Between them, every
crash point is a death somewhere in the sample.

The uncrashed reference runs themselves must be the same on both backends.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import pg_support
from chaos import grid
from chaos.corpus import SPECS
from chaos.lives import Death
from durabl import crashpoints

IN_PROCESS = (
    "chaos.shared",
    "chaos.retrying",
    "chaos.payment",
    "chaos.mixed",
    "chaos.signal",
    "chaos.parallel",
    "chaos.child",
    "chaos.continue",
)
SIGKILL = ("chaos.shared", "chaos.mixed", "chaos.continue")
AGAIN_IN = "chaos.shared"
AGAIN_AFTER = Death(crashpoints.AFTER_TOOL_DISPATCHED, 1)
"""The first death, in ``AGAIN_IN``, that a second death follows at every point."""
pytestmark = pytest.mark.timeout(900)
"""The grid runs in the first test's setup: minutes, more beside another test process."""
MINIMUM = 200
"""Counted scenarios: the sample must not silently shrink."""


@contextlib.contextmanager
def on_server(folder: Path) -> Iterator[grid.Database]:
    """A database of the scenario's own on the server, emptied when the scenario is done."""
    url = pg_support.new_database()
    try:
        yield url
    finally:
        pg_support.release(url)


@dataclass
class Sample:
    verdicts: list[grid.Verdict]
    references: dict[str, grid.Reference]
    sqlite_references: dict[str, grid.Reference]


def first_and_last(ref: grid.Reference) -> list[grid.Plan]:
    """A first death at the first and the last occurrence of every point the run reaches."""
    plans, _never = grid.first_deaths(ref, grid.Shape(first=1))
    return plans


def first_of_each(reaches: dict[str, int], before: grid.Plan = ()) -> list[grid.Plan]:
    """``before``, then a death at the first occurrence of every point in ``reaches``."""
    return [(*before, Death(p, 1)) for p in crashpoints.ALL if reaches.get(p)]


@pytest.fixture(scope="module")
def sample() -> Iterator[Sample]:
    scratch = grid.scratch_dir("durabl-chaos-pg-")
    try:
        workflows = sorted({*IN_PROCESS, *SIGKILL})
        refs = {name: grid.reference(scratch, SPECS[name], on_server) for name in workflows}
        sqlite_refs = {name: grid.reference(scratch, SPECS[name]) for name in workflows}
        verdicts = []

        def run(mode: str, name: str, plan: grid.Plan) -> grid.Verdict:
            v = grid.run_scenario(scratch, mode, SPECS[name], plan, refs[name], on_server)
            verdicts.append(v)
            return v

        for name in IN_PROCESS:
            for plan in first_and_last(refs[name]):
                v = run("in-process", name, plan)
                if plan == (AGAIN_AFTER,) and name == AGAIN_IN:
                    for again in first_of_each(v.reaches, before=plan):
                        run("in-process", name, again)
        for name in SIGKILL:
            for plan in first_of_each(refs[name].reaches):
                run("sigkill", name, plan)
        yield Sample(verdicts, refs, sqlite_refs)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def test_every_sampled_scenario_passes_every_oracle(sample: Sample) -> None:
    failures = [f"{v.label} [{v.mode}]: {f}" for v in sample.verdicts for f in v.failures]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures[:20])
    assert not [v.label for v in sample.verdicts if v.duplicates or v.diverged]


def test_every_sampled_scenario_took_its_deaths(sample: Sample) -> None:
    assert all(v.counted and v.died == len(v.plan) >= 1 for v in sample.verdicts), [
        v.label for v in sample.verdicts if not v.counted
    ]
    assert len(sample.verdicts) >= MINIMUM, len(sample.verdicts)
    assert any(len(v.plan) == 2 for v in sample.verdicts), "no second death was sampled"


def test_every_point_each_workflow_reaches_is_a_death_in_the_sample(sample: Sample) -> None:
    for name in IN_PROCESS:
        reached = {p for p, n in sample.references[name].reaches.items() if n}
        died = {v.plan[0].point for v in sample.verdicts if v.workflow == name}
        assert died == reached, (name, sorted(reached - died))
    every = {death.point for v in sample.verdicts for death in v.plan}
    assert every == set(crashpoints.ALL), sorted(set(crashpoints.ALL) - every)
    for name in SIGKILL:
        killed = {
            v.plan[0].point for v in sample.verdicts if v.mode == "sigkill" and v.workflow == name
        }
        assert killed == {p for p, n in sample.references[name].reaches.items() if n}, name


def test_the_operator_had_work_and_the_shared_keys_were_contended(sample: Sample) -> None:
    letters = [v for v in sample.verdicts if v.dead_letters]
    assert any(v.workflow == "chaos.shared" and v.dead_letters == 2 for v in letters)
    assert {v.mode for v in letters} == {"in-process", "sigkill"}


def test_a_sigkill_and_an_in_process_death_give_the_same_verdict(sample: Sample) -> None:
    by_plan = {(v.workflow, v.plan, v.mode): v for v in sample.verdicts}
    killed = [v for v in sample.verdicts if v.mode == "sigkill"]
    assert killed
    for v in killed:
        twin = by_plan.get((v.workflow, v.plan, "in-process"))
        assert twin is not None, f"{v.label} has no in-process twin"
        assert twin.comparable() == v.comparable(), v.label


def test_the_uncrashed_runs_are_the_same_on_both_backends(sample: Sample) -> None:
    for name, on_postgres in sample.references.items():
        on_sqlite = sample.sqlite_references[name]
        assert on_postgres.final == on_sqlite.final, name
        assert on_postgres.reaches == on_sqlite.reaches, name


def test_crash_points_are_off_once_the_sample_is_done(sample: Sample) -> None:
    assert sample.verdicts
    assert crashpoints.hooks == []
