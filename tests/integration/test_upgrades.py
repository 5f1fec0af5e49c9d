"""Changing code under running runs: ``ctx.patched`` and ``durabl check`` (SPEC §18).

A deploy that changes what a workflow yields holds every run recorded by the old code at the
first step that differs. ``ctx.patched(id)`` lets one workflow carry both versions: a run that
meets the change for the first time takes the new branch (and records that it did), a run whose
log already holds the old step keeps to the old branch. ``durabl check`` replays every stored run
against the code about to be deployed, dry, and lists the runs it would hold, before it is
deployed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import upgrade_agents

from durabl import Runtime, events
from durabl.crashpoints import AFTER_STEP_COMMITTED, CrashAt, ProcessDeath
from durabl.errors import BadStepError, NonDeterminismError
from durabl.journal import Journal, NewEvent

HOUR_S = 3600.0
T0_S = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def deploy(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    def to(version: str) -> None:
        monkeypatch.setenv("DURABL_TEST_DEPLOY", version)

    to("v1")
    yield to


def runtime(db: Path, clock: Clock) -> Runtime:
    return Runtime(
        db,
        llm=upgrade_agents.llm,
        tools=upgrade_agents.DURABL_TOOLS,
        workflows=[upgrade_agents.summary, upgrade_agents.bad_patch, upgrade_agents.validate],
        clock=clock,
    )


def prompts(rt: Runtime, run_id: str) -> list[str]:
    """The prompts of the model calls the run's log records."""
    return [
        json.loads(e.data or "[]")[1]
        for e in rt.store.load_log(run_id)
        if e.kind == events.STEP_STARTED and (e.data or "").startswith('["model"')
    ]


def test_an_unguarded_change_holds_a_run_recorded_by_the_old_code(
    tmp_path: Path, clock: Clock, deploy: object
) -> None:
    db = tmp_path / "u.db"
    with runtime(db, clock) as rt:
        old = rt.start(upgrade_agents.summary, {"topic": "otters"})
    deploy("v2-unguarded")  # type: ignore[operator]
    clock.now_s += 2 * HOUR_S
    with runtime(db, clock) as rt:
        rt.tick()
        state = rt.state(old)
    assert state.status == "HELD"
    assert "ModelCall('summarise otters')" in (state.error or "")


def test_a_patched_change_keeps_old_runs_on_the_old_branch_and_new_runs_on_the_new(
    tmp_path: Path, clock: Clock, deploy: object
) -> None:
    db = tmp_path / "u.db"
    with runtime(db, clock) as rt:
        old = rt.start(upgrade_agents.summary, {"topic": "otters"})  # parked on its hour
    deploy("v2")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        new = rt.start(upgrade_agents.summary, {"topic": "seals"})
        assert rt.replay(new, dry=True).status == "SLEEPING"
        clock.now_s += 2 * HOUR_S
        rt.tick()
        done_old, done_new = rt.state(old), rt.state(new)
        assert (done_old.status, done_new.status) == ("COMPLETED", "COMPLETED")
        assert rt.result(old)["sent"] == "summary of: summarise otters"
        assert rt.result(new)["sent"] == "summary of: summarise seals in three bullets"
        assert prompts(rt, old) == ["summarise otters"]
        assert prompts(rt, new) == ["summarise seals in three bullets"]
        markers = [e for e in rt.store.load_log(new) if e.kind == events.CTX_RECORDED]
        assert [(m.step, m.data) for m in markers] == [(2, '"summary-v2"')]
        assert not any(e.kind == events.CTX_RECORDED for e in rt.store.load_log(old))
        # replay reproduces both, with nothing called
        assert rt.replay(old, dry=True).result == rt.result(old)
        assert rt.replay(new, dry=True).result == rt.result(new)


def test_a_run_that_meets_the_change_for_the_first_time_takes_the_new_branch(
    tmp_path: Path, clock: Clock, deploy: object
) -> None:
    db = tmp_path / "u.db"
    with (
        runtime(db, clock) as rt,
        CrashAt(AFTER_STEP_COMMITTED, 1),  # the old code's process dies after the search
        pytest.raises(ProcessDeath),
    ):
        rt.start(upgrade_agents.summary, {"topic": "crabs"}, run_id="mid")
    deploy("v2")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        assert rt.resume("mid").status == "SLEEPING"
        assert prompts(rt, "mid") == ["summarise crabs in three bullets"]


def test_a_patch_id_that_is_not_a_string_holds_the_run_naming_it_and_writes_nothing(
    tmp_path: Path, clock: Clock
) -> None:
    with runtime(tmp_path / "u.db", clock) as rt:
        with pytest.raises(BadStepError) as raised:
            rt.run(upgrade_agents.bad_patch, run_id="bad")
        assert str(raised.value) == (
            "run bad step 1: ctx.patched takes a non-empty string id, got int 5"
        )
        row = rt.store.get_run("bad")
        assert row is not None and row.status == "HELD"
        assert row.error == f"BadStepError: {raised.value}"
        assert [e.kind for e in rt.store.load_log("bad")] == ["RUN_STARTED"]


def test_check_lists_the_runs_a_deploy_would_hold_before_it_is_deployed(
    tmp_path: Path, clock: Clock, deploy: object
) -> None:
    db = tmp_path / "u.db"
    with runtime(db, clock) as rt:
        finished = rt.start(upgrade_agents.summary, {"topic": "gulls"})
        clock.now_s += 2 * HOUR_S
        rt.tick()
        assert rt.state(finished).status == "COMPLETED"
        parked = rt.start(upgrade_agents.summary, {"topic": "otters"})  # waiting its hour
        rt.start(upgrade_agents.summary, {"topic": "terns"})

    deploy("v2-unguarded")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        found = {c.run_id: c for c in rt.check()}
    assert found[parked].breaks and not found[parked].ok
    assert (found[parked].expected, found[parked].actual) == (
        "ModelCall('summarise otters')",
        "ModelCall('summarise otters in three bullets')",
    )
    assert found[parked].position == 2
    assert not found[finished].ok and not found[finished].breaks  # done: nothing holds it
    assert sum(c.breaks for c in found.values()) == 2

    deploy("v2")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        assert all(c.ok for c in rt.check())
        clock.now_s += 2 * HOUR_S
        rt.tick()  # the old runs finish on the old branch; nothing was held
        assert {rt.state(c.run_id).status for c in rt.check()} == {"COMPLETED"}
        late = rt.start(upgrade_agents.summary, {"topic": "skuas"})  # takes the new branch

    deploy("v3")  # the guard taken out once the runs recorded before the change are finished
    with runtime(db, clock) as rt:
        found = {c.run_id: c for c in rt.check()}
        assert found[late].ok  # its marker is stepped over: it took v3's only branch
        assert not found[parked].ok and not found[parked].breaks  # finished on the old one
        assert found[parked].expected == "ModelCall('summarise otters')"
        with pytest.raises(NonDeterminismError):
            rt.replay(parked, dry=True)
        clock.now_s += 2 * HOUR_S
        rt.tick()
        assert rt.result(late)["sent"] == "summary of: summarise skuas in three bullets"


class _DiesBeforeRunFailed(Journal):
    """The process dies after the run's last step is recorded and before its RUN_FAILED: no named
    crash point sits there, but a SIGKILL can."""

    def append(self, new: list[NewEvent], **rest: object) -> None:
        if any(kind == events.RUN_FAILED for kind, _fp, _data in new):
            raise ProcessDeath("before RUN_FAILED")
        super().append(new, **rest)  # type: ignore[arg-type]


class _DyingRuntime(Runtime):
    journal_class = _DiesBeforeRunFailed


def test_taking_the_guard_out_holds_no_run_that_raised_right_after_its_marker(
    tmp_path: Path, clock: Clock, deploy: object
) -> None:
    """The guard comes out once the old runs are finished; a run that took the new branch must
    then replay as it ran. Here the new branch yields no step and the workflow raises after it,
    so the run's log ends with its marker: the drive must step over it when the workflow raises,
    as it does when the workflow yields a step or returns."""
    db = tmp_path / "u.db"
    deploy("v2")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        failed = rt.run(upgrade_agents.validate, {"topic": " "})
    assert failed.status == "FAILED"
    with (
        _DyingRuntime(db, tools=upgrade_agents.DURABL_TOOLS, clock=clock) as dying,
        pytest.raises(ProcessDeath),
    ):
        dying.start(upgrade_agents.validate, {"topic": ""}, run_id="interrupted")

    deploy("v3")  # type: ignore[operator]
    with runtime(db, clock) as rt:
        found = {c.run_id: c for c in rt.check()}
        assert (found[failed.run_id].ok, found[failed.run_id].problem) == (True, None)
        assert (found["interrupted"].ok, found["interrupted"].problem) == (True, None)
        assert rt.resume("interrupted").status == "FAILED"


def _durabl(db: Path, *args: str, deploy: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parent),
        "DURABL_TEST_DEPLOY": deploy,
    }
    return subprocess.run(
        [sys.executable, "-m", "durabl", "--db", str(db), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def test_the_check_command_exits_1_naming_the_first_difference(
    tmp_path: Path, clock: Clock
) -> None:
    db = tmp_path / "u.db"
    with runtime(db, clock) as rt:
        parked = rt.start(upgrade_agents.summary, {"topic": "otters"})
        (model_seq,) = [
            e.seq
            for e in rt.store.load_log(parked)
            if e.kind == events.STEP_STARTED and e.step == 2
        ]
    before = db.read_bytes()

    held = _durabl(db, "--import", "upgrade_agents", "check", deploy="v2-unguarded")
    assert held.returncode == 1, held.stderr
    assert parked in held.stdout and "WOULD HOLD" in held.stdout
    assert f"seq {model_seq}: recorded ModelCall('summarise otters')" in held.stdout
    assert "1 run checked: 1 run would be held by this code" in held.stdout

    fine = _durabl(db, "--import", "upgrade_agents", "--json", "check", deploy="v2")
    assert fine.returncode == 0, fine.stderr
    report = json.loads(fine.stdout)
    assert report["would_hold"] == []
    assert [r["ok"] for r in report["runs"]] == [True]

    missing = _durabl(db, "check", deploy="v2")
    assert missing.returncode == 2
    assert missing.stderr.strip().endswith(
        "check needs the code to check: --import MODULE (repeatable)"
    )
    assert db.read_bytes() == before  # nothing written, by any of them
