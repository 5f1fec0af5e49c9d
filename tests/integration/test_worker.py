"""``durabl worker`` as a real process (SPEC §7), and per-run failure isolation.

- A SIGKILLed worker's runs are taken over by the next worker at once (its pid is gone, so
  nobody waits for the 15 s lease), each IDEMPOTENT effect lands once, and an AT_MOST_ONCE step
  the kill interrupted inside its window is dead-lettered, never called again.
- SIGTERM lets the step in progress finish and record itself, then the worker exits 0 leaving
  the run RUNNING with its lease released; a later worker completes it.
- A worker fires a durable timer when it is due, never before, without anyone calling tick.
- Several workers on one database complete many runs with no duplicate effect.
- A broken run (a bug in the workflow, an unknown tool, non-determinism, an unknown workflow)
  does not stop a worker, ``Runtime.resume_all`` or ``Runtime.tick`` from completing the others.

Workflows and tools live in ``worker_agents.py``; ``proc_agent.py seed`` creates interrupted
runs from a process that then exits, as an agent that crashed would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import worker_agents
from proc_support import (
    TERMINAL,
    Procs,
    assert_gapless,
    count_by,
    env_for,
    finish,
    lines,
    log_of,
    outbox_keys,
    processes,
    query,
    resumed_pids,
    statuses,
    wait_until,
)

from durabl import Runtime, Sleep, ToolCall, crashpoints, workflow
from durabl.steps import derived_key
from durabl.workflow import Workflow


def seed(
    procs: Procs,
    env: dict[str, str],
    db: Path,
    workflow_name: str,
    count: int,
    prefix: str,
    *,
    run_input: str = "{}",
    crash: tuple[str, ...] = ("--crash-at", "after_run_started"),
) -> list[str]:
    argv = ["seed", str(db), workflow_name, str(count), prefix, "--input", run_input, *crash]
    run_ids: list[str] = finish(procs.agent(env, *argv))["run_ids"]
    return run_ids


def stop_worker(worker: subprocess.Popen[str], timeout_s: float = 20.0) -> tuple[str, str]:
    """SIGTERM a worker; it must exit 0 by itself. Returns its stdout and stderr."""
    worker.send_signal(signal.SIGTERM)
    out, err = worker.communicate(timeout=timeout_s)
    assert worker.returncode == 0, f"worker exited {worker.returncode}\n{out}\n{err}"
    assert "worker stopped" in out
    return out, err


def all_settled(db: Path, run_ids: list[str]) -> bool:
    found = statuses(db)
    return all(found.get(run_id) in TERMINAL for run_id in run_ids)


def test_a_killed_workers_runs_are_taken_over_at_once(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.5", DURABL_TEST_NOTIFY_S="8")
    calls_file = tmp_path / "calls.txt"
    with processes() as procs:
        chains = seed(procs, env, db, "wa_chain", 3, "chain", run_input='{"steps": 3}')
        (notifying,) = seed(procs, env, db, "wa_notify_first", 1, "notify")
        notify_key = derived_key(notifying, 1)

        first = procs.worker(env, db, concurrency=4)

        def mid_run() -> bool:
            calls = lines(calls_file)
            begun = count_by(calls, kind="begin")
            ended = count_by(calls, kind="end")
            return (
                begun.get(notify_key) == 1
                and notify_key not in ended
                and all(derived_key(run_id, 2) in begun for run_id in chains)
                and sum(1 for c in calls if c[:2] == ["end", "effect"]) >= 2
                and any(key not in ended for key in begun if key != notify_key)
            )

        wait_until("the first worker to be inside its steps", mid_run)
        first.kill()
        first.wait(timeout=10)
        killed_at_s = time.time()

        calls_before = lines(calls_file)
        assert count_by(calls_before, kind="end").get(notify_key) is None  # inside the window
        logs_before = {run_id: log_of(db, run_id) for run_id in [*chains, notifying]}
        leases = query(db, "SELECT run_id, lease_pid, lease_expires_s FROM runs")
        held = {run_id: expires for run_id, pid, expires in leases if pid == first.pid}
        assert notifying in held and held, leases
        assert min(held.values()) > killed_at_s + 5, "the lease would not have expired for a while"

        second = procs.worker(env, db, concurrency=4)
        wait_until(
            "the second worker to settle every run", lambda: all_settled(db, [*chains, notifying])
        )
        stop_worker(second)

    found = statuses(db)
    assert {run_id: found[run_id] for run_id in chains} == dict.fromkeys(chains, "COMPLETED")
    assert found[notifying] == "DEAD_LETTERED"

    # Taken over at once: the second worker's first event came long before any lease expiry.
    new_events = [
        event
        for run_id, before in logs_before.items()
        for event in log_of(db, run_id)[len(before) :]
    ]
    first_new_s = min(at_s for *_, at_s in new_events)
    assert first_new_s - killed_at_s < 8.0
    assert first_new_s < min(held.values())
    for run_id in [*chains, notifying]:
        assert_gapless(db, run_id)
        assert resumed_pids(db, run_id) == [first.pid, second.pid]

    calls = lines(calls_file)
    begun = count_by(calls, kind="begin")
    begun_before = count_by(calls_before, kind="begin")
    effect_keys = {derived_key(run_id, position) for run_id in chains for position in (2, 3, 4)}
    # What the log had recorded when the worker died, not what the tools had printed: a tool
    # that returned just before the kill, with its outcome not yet committed, is called again.
    recorded = {
        derived_key(run_id, step)
        for run_id, before in logs_before.items()
        for _, kind, step, *_ in before
        if kind in ("STEP_COMPLETED", "TOOL_COMPLETED")
    }
    interrupted = set(begun_before) - recorded - {notify_key}
    assert interrupted, "the kill interrupted no IDEMPOTENT effect"
    for key in effect_keys:  # called again only if its outcome was not recorded
        assert begun[key] == (2 if key in interrupted else 1), key
    # Each IDEMPOTENT effect landed once; the AT_MOST_ONCE notify was never called again.
    assert outbox_keys(tmp_path / "outbox.txt") == dict.fromkeys(effect_keys, 1)
    assert begun[notify_key] == 1
    assert [int(c[3]) for c in calls if c[:3] == ["begin", "notify", notify_key]] == [first.pid]
    last = log_of(db, notifying)[-1]
    assert (last[1], last[2]) == ("DEAD_LETTERED", 1)


def test_sigterm_lets_the_running_step_finish_and_parks_the_run(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    env = env_for(tmp_path, DURABL_TEST_STEP_S="1.0")
    calls_file = tmp_path / "calls.txt"
    with processes() as procs:
        (run_id,) = seed(procs, env, db, "wa_chain", 1, "term", run_input='{"steps": 3}')
        keys = [derived_key(run_id, position) for position in (2, 3, 4)]
        worker = procs.worker(env, db)
        wait_until("the first effect to begin", lambda: count_by(lines(calls_file), kind="begin"))
        stop_worker(worker)

        # The step that was running finished and was recorded; nothing after it began.
        assert count_by(lines(calls_file), kind="end") == {keys[0]: 1}
        kinds = [(kind, step) for _, kind, step, *_ in log_of(db, run_id)]
        assert kinds[-1] == ("TOOL_COMPLETED", 2)
        assert ("STEP_STARTED", 3) not in kinds
        ((status, owner, pid),) = query(
            db, "SELECT status, lease_owner, lease_pid FROM runs WHERE run_id = ?", (run_id,)
        )
        assert status in ("RUNNING", "SLEEPING")
        assert (owner, pid) == (None, None), "the worker left its lease behind"

        later = procs.worker(env, db)
        wait_until("a later worker to complete the run", lambda: all_settled(db, [run_id]))
        stop_worker(later)

    assert statuses(db)[run_id] == "COMPLETED"
    assert count_by(lines(calls_file), kind="begin") == dict.fromkeys(keys, 1)
    assert outbox_keys(tmp_path / "outbox.txt") == dict.fromkeys(keys, 1)
    assert resumed_pids(db, run_id) == [worker.pid, later.pid]
    assert_gapless(db, run_id)


def test_a_worker_fires_a_timer_when_it_is_due_without_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "w.db"
    env = env_for(tmp_path)
    with processes() as procs:
        worker = procs.worker(env, db)
        wait_until("the worker to create the database", db.exists)
        # Another process (this one) starts the run; it arms the timer and parks.
        for name, value in env_for(tmp_path).items():
            if name.startswith("DURABL_TEST_"):
                monkeypatch.setenv(name, value)
        with Runtime(db, tools=worker_agents.DURABL_TOOLS) as rt:
            state = rt.run("wa_sleeper", {"seconds": 1.5}, run_id="napper")
        assert state.status == "SLEEPING"
        wait_until("the worker to complete the run", lambda: all_settled(db, ["napper"]))
        stop_worker(worker)

    assert statuses(db)["napper"] == "COMPLETED"
    log = log_of(db, "napper")
    (armed,) = [json.loads(data or "{}") for _, kind, _, data, *_ in log if kind == "TIMER_ARMED"]
    (fired,) = [json.loads(data or "{}") for _, kind, _, data, *_ in log if kind == "TIMER_FIRED"]
    assert fired["fired_at_s"] >= armed["fire_at_s"], "the timer fired early"
    assert fired["fired_at_s"] - armed["fire_at_s"] < 5.0, "the timer fired long after it was due"
    assert resumed_pids(db, "napper") == [worker.pid]
    assert outbox_keys(tmp_path / "outbox.txt") == {derived_key("napper", 2): 1}


def test_several_workers_complete_many_runs_without_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.1")
    with processes() as procs:
        run_ids = seed(procs, env, db, "wa_chain", 24, "many", run_input='{"steps": 2}')
        workers = [procs.worker(env, db, concurrency=2) for _ in range(3)]
        wait_until("the workers to complete every run", lambda: all_settled(db, run_ids), 40)
        for worker in workers:
            stop_worker(worker)

    assert statuses(db) == dict.fromkeys(run_ids, "COMPLETED")
    keys = {derived_key(run_id, position) for run_id in run_ids for position in (2, 3)}
    calls = lines(tmp_path / "calls.txt")
    assert count_by(calls, kind="begin") == dict.fromkeys(keys, 1)
    assert count_by(calls, kind="model", column=1) == {f"plan for {r}": 1 for r in run_ids}
    assert outbox_keys(tmp_path / "outbox.txt") == dict.fromkeys(keys, 1)
    drivers = set()
    for run_id in run_ids:
        assert_gapless(db, run_id)
        (pid,) = resumed_pids(db, run_id)
        drivers.add(pid)
    assert drivers <= {w.pid for w in workers}
    assert len(drivers) >= 2, "one worker did everything"


def test_a_worker_isolates_broken_runs(tmp_path: Path) -> None:
    db = tmp_path / "w.db"
    env = env_for(tmp_path, DURABL_TEST_VERSION="1")
    with processes() as procs:
        # The broken runs are the oldest, so a one-at-a-time worker meets them first.
        (buggy,) = seed(procs, env, db, "wa_buggy", 1, "buggy")
        (no_tool,) = seed(procs, env, db, "wa_unknown_tool", 1, "no-tool")
        (drifting,) = seed(
            procs, env, db, "wa_drifting", 1, "drift", crash=("--crash-at", "after_step_committed")
        )
        (ghost,) = seed(procs, env, db, "pa_only_here", 1, "ghost")
        good = seed(procs, env, db, "wa_chain", 4, "good", run_input='{"steps": 1}')
        ghost_log = log_of(db, ghost)

        worker = procs.worker({**env, "DURABL_TEST_VERSION": "2"}, db)
        wait_until("the worker to complete the good runs", lambda: all_settled(db, good))
        wait_until("the worker to settle the broken runs", lambda: all_settled(db, [buggy]))
        assert worker.poll() is None, "a broken run stopped the worker"
        _, stderr = stop_worker(worker)

    found = statuses(db)
    assert {run_id: found[run_id] for run_id in good} == dict.fromkeys(good, "COMPLETED")
    assert found[buggy] == "FAILED"
    assert found[no_tool] == "HELD"
    assert found[drifting] == "HELD"
    assert found[ghost] == "RUNNING"
    assert log_of(db, ghost) == ghost_log, "a run of an unknown workflow was written to"
    errors = dict(query(db, "SELECT run_id, error FROM runs"))
    assert "KeyError" in errors[buggy]
    assert "no_such_tool" in errors[no_tool]
    assert "NonDeterminismError" in errors[drifting]
    for run_id in (no_tool, drifting, ghost):
        assert run_id in stderr, f"the worker did not report {run_id}"
    assert "pa_only_here" in stderr


# -- the same isolation in-process: Runtime.resume_all and Runtime.tick -----------------------

T0 = 1_900_000_000.0
DRIFT = {"n": 1}


@workflow(name="iso_sleep_then_bug")
def sleep_then_bug(ctx: Any) -> Any:
    yield Sleep(seconds=60)
    raise RuntimeError("a bug after the timer")


@workflow(name="iso_sleep_then_unknown_tool")
def sleep_then_unknown_tool(ctx: Any) -> Any:
    yield Sleep(seconds=60)
    yield ToolCall("no_such_tool", {})


@workflow(name="iso_drift_around_sleep")
def drift_around_sleep(ctx: Any) -> Any:
    yield ToolCall("effect", {"n": DRIFT["n"]})
    yield Sleep(seconds=60)
    return (yield ToolCall("effect", {"n": 100}))


def _ghost(ctx: Any) -> Any:
    yield Sleep(seconds=60)
    return "boo"


GHOST = Workflow(_ghost, "iso_ghost")  # never registered: a fresh runtime does not know it


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, value in env_for(tmp_path).items():
        if name.startswith("DURABL_TEST_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setitem(DRIFT, "n", 1)
    return tmp_path


def runtime(db: Path, **options: Any) -> Runtime:
    return Runtime(db, llm=worker_agents.llm, tools=worker_agents.DURABL_TOOLS, **options)


def test_resume_all_isolates_broken_runs_in_process(world: Path) -> None:
    db = world / "iso.db"
    crashed = runtime(db)
    for name, point, run_id in [
        ("wa_buggy", crashpoints.AFTER_RUN_STARTED, "buggy"),
        ("wa_unknown_tool", crashpoints.AFTER_RUN_STARTED, "no-tool"),
        ("iso_drift_around_sleep", crashpoints.AFTER_STEP_COMMITTED, "drift"),
        (GHOST, crashpoints.AFTER_RUN_STARTED, "ghost"),
        ("wa_chain", crashpoints.AFTER_RUN_STARTED, "good-1"),
        ("wa_chain", crashpoints.AFTER_STEP_COMMITTED, "good-2"),
    ]:
        with crashpoints.CrashAt(point), pytest.raises(crashpoints.ProcessDeath):
            crashed.start(name, {}, run_id=run_id)
    crashed.close()
    DRIFT["n"] = 2

    with runtime(db) as rt:
        states = {s.run_id: s for s in rt.resume_all()}
        assert set(states) == {"buggy", "no-tool", "drift", "ghost", "good-1", "good-2"}
        assert states["good-1"].status == states["good-2"].status == "COMPLETED"
        assert states["buggy"].status == "FAILED"
        assert states["no-tool"].status == "HELD" and "no_such_tool" in (
            states["no-tool"].error or ""
        )
        assert states["drift"].status == "HELD"
        assert "NonDeterminismError" in (rt.state("drift").error or "")
        assert states["ghost"].status == "RUNNING" and "iso_ghost" in (states["ghost"].error or "")
        assert rt.result("good-1")["keys"] == [derived_key("good-1", p) for p in (2, 3, 4)]
    for run_id in states:
        assert_gapless(db, run_id)


def test_tick_isolates_broken_runs_in_process(world: Path) -> None:
    db = world / "iso.db"
    with runtime(db, clock=lambda: T0) as first:
        for name, run_id, run_input in [
            ("iso_sleep_then_bug", "bug", {}),
            ("iso_sleep_then_unknown_tool", "no-tool", {}),
            ("iso_drift_around_sleep", "drift", {}),
            (GHOST, "ghost", {}),
            ("wa_sleeper", "good-1", {"seconds": 60}),
            ("wa_sleeper", "good-2", {"seconds": 30}),
        ]:
            assert first.run(name, run_input, run_id=run_id).status == "SLEEPING"
    DRIFT["n"] = 2

    with runtime(db, clock=lambda: T0) as rt:
        assert rt.tick(now=T0 + 10) == []  # nothing is due yet
        states = {s.run_id: s for s in rt.tick(now=T0 + 120)}
        assert set(states) == {"bug", "no-tool", "drift", "ghost", "good-1", "good-2"}
        assert states["good-1"].status == states["good-2"].status == "COMPLETED"
        assert states["bug"].status == "FAILED" and "a bug after the timer" in (
            states["bug"].error or ""
        )
        assert states["no-tool"].status == "HELD"
        assert states["drift"].status == "HELD"
        assert states["ghost"].status == "SLEEPING" and "iso_ghost" in (states["ghost"].error or "")
    outbox = outbox_keys(world / "outbox.txt")
    assert outbox == {
        derived_key("drift", 1): 1,
        derived_key("good-1", 2): 1,
        derived_key("good-2", 2): 1,
    }
