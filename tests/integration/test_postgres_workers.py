"""Workers in real processes on one PostgreSQL database (SPEC §7; the PostgreSQL backend).

- Submitted runs wake sleeping workers through LISTEN/NOTIFY and are divided between them by
  claims that skip each other's locked rows: with a poll interval far longer than the test, every
  run still completes, each effect once, driven by more than one worker.
- A timer armed on the server wakes a worker when it is due, again without polling.
- The connection is cut under the workers, over and over (``pg_terminate_backend``), and the
  server is restarted in immediate mode (a crash: no shutdown checkpoint) while they run: every
  run completes, no tool is called twice for one key (no process died, so a second call could
  only come from an acknowledged commit that was lost or a commit made twice), every log is
  gapless, and the workers said that they reconnected.
- A worker stopped (SIGSTOP) across such a restart has no session while the other is back and
  claiming: it keeps its runs all the same, since a young server's missing sessions prove
  nothing, and no call it was inside is made again.

Workflows and tools live in ``worker_agents.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from proc_support import Procs, count_by, env_for, lines, outbox_keys, processes, wait_until

import pg_support
from durabl import Runtime
from durabl.steps import derived_key
from durabl.store import open_store

LONG_POLL_S = 120.0
"""Longer than any test here: whatever a worker finds, it was told of, not polled for."""


@pytest.fixture
def url(postgres_db: Callable[[], str]) -> str:
    return postgres_db()


def completed(url: str, run_ids: list[str]) -> int:
    """How many of ``run_ids`` have completed."""
    store = open_store(url, read_only=True)
    try:
        found = {row.run_id: row.status for row in store.list_runs()}
    finally:
        store.close()
    return sum(found.get(run_id) == "COMPLETED" for run_id in run_ids)


def settled(url: str, run_ids: list[str]) -> bool:
    return completed(url, run_ids) == len(run_ids)


def check_every_log(url: str, run_ids: list[str]) -> set[int]:
    """Every run's log is 1..N with no hole; returns the pids that resumed the runs."""
    store = open_store(url, read_only=True)
    drivers: set[int] = set()
    try:
        for run_id in run_ids:
            log = store.load_log(run_id)
            assert [e.seq for e in log] == list(range(1, len(log) + 1)), run_id
            for e in log:
                if e.kind == "RUN_RESUMED":
                    drivers.add(int(json.loads(e.data or "{}")["pid"]))
    finally:
        store.close()
    return drivers


def submit(url: str, count: int, steps: int) -> list[str]:
    import worker_agents

    with Runtime(url, workflows=[worker_agents.chain]) as rt:
        return [rt.submit("wa_chain", {"steps": steps}, run_id=f"sub-{i}") for i in range(count)]


def stop(procs: list[subprocess.Popen[str]]) -> str:
    """SIGTERM each worker; each must exit 0. Their stderr, joined."""
    errs = []
    for proc in procs:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"worker exited {proc.returncode}\n{out}\n{err}"
        errs.append(err)
    return "\n".join(errs)


def each_effect_once(folder: Path, run_ids: list[str], steps: int) -> None:
    keys = {derived_key(run_id, position) for run_id in run_ids for position in range(2, 2 + steps)}
    calls = lines(folder / "calls.txt")
    assert count_by(calls, kind="begin") == dict.fromkeys(keys, 1)
    assert outbox_keys(folder / "outbox.txt") == dict.fromkeys(keys, 1)


def start_workers(
    procs: Procs, env: dict[str, str], url: str, count: int
) -> list[subprocess.Popen[str]]:
    workers = [procs.worker(env, url, concurrency=2, poll_s=LONG_POLL_S) for _ in range(count)]  # type: ignore[arg-type]
    time.sleep(1.5)  # listening before the first NOTIFY is sent
    return workers


def test_submitted_runs_are_divided_between_workers_woken_by_notify(
    tmp_path: Path, url: str
) -> None:
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.02")
    with processes() as procs:
        workers = start_workers(procs, env, url, 2)
        run_ids = submit(url, 24, steps=3)
        wait_until("the workers to complete every run", lambda: settled(url, run_ids), 40)
        stop(workers)

    each_effect_once(tmp_path, run_ids, steps=3)
    drivers = check_every_log(url, run_ids)
    assert drivers <= {w.pid for w in workers}
    assert len(drivers) == 2, "one worker did everything: the claims did not divide the runs"


def test_a_timer_wakes_a_worker_when_due_without_polling(tmp_path: Path, url: str) -> None:
    import worker_agents

    env = env_for(tmp_path)
    with processes() as procs:
        (worker,) = start_workers(procs, env, url, 1)
        with Runtime(url, workflows=[worker_agents.sleeper]) as rt:
            armed_s = time.time()
            run_id = rt.submit("wa_sleeper", {"seconds": 1.0})
            wait_until("the timer to fire", lambda: settled(url, [run_id]), 20)
            done_s = time.time()
            row = rt.state(run_id)
        stop([worker])

    assert row.status == "COMPLETED"
    assert 1.0 <= done_s - armed_s < 10, "fired before its deadline, or only by a poll"


def test_connections_cut_again_and_again_lose_and_repeat_nothing(tmp_path: Path, url: str) -> None:
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.01")
    cut = 0
    with processes() as procs:
        workers = start_workers(procs, env, url, 2)
        run_ids = submit(url, 16, steps=6)
        done = threading.Event()

        def cutter() -> None:
            nonlocal cut
            while not done.wait(0.15):
                cut += pg_support.terminate_sessions(url)

        thread = threading.Thread(target=cutter)
        thread.start()
        try:
            time.sleep(2.0)
        finally:
            done.set()
            thread.join()
        wait_until("the workers to complete every run", lambda: settled(url, run_ids), 60)
        errors = stop(workers)

    assert cut >= 10, f"only {cut} sessions were cut: the test proved little"
    each_effect_once(tmp_path, run_ids, steps=6)
    check_every_log(url, run_ids)
    assert "lost the connection to" in errors
    assert "reconnected to" in errors


@pytest.mark.alone  # the restart cuts every other test's sessions on the server too
def test_a_server_crash_and_restart_while_workers_run(tmp_path: Path, url: str) -> None:
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.05")
    with processes() as procs:
        workers = start_workers(procs, env, url, 2)
        run_ids = submit(url, 12, steps=8)
        time.sleep(0.5)  # well into the runs, far from their end (96 steps of 50 ms, 4 at once)
        assert not settled(url, run_ids)
        pg_support.restart_server()
        wait_until("the workers to complete every run", lambda: settled(url, run_ids), 90)
        errors = stop(workers)

    each_effect_once(tmp_path, run_ids, steps=8)
    check_every_log(url, run_ids)
    assert "lost the connection to" in errors
    assert "reconnected to" in errors


@pytest.mark.alone  # the restart cuts every other test's sessions on the server too
def test_a_worker_slow_to_come_back_after_a_restart_keeps_its_runs(
    tmp_path: Path, url: str
) -> None:
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.05")
    with processes() as procs:
        slow, quick = start_workers(procs, env, url, 2)
        run_ids = submit(url, 12, steps=8)
        time.sleep(0.5)
        slow_runs = held_by(url, slow.pid)
        assert slow_runs, "the slow worker held no run: the test proved nothing"
        os.kill(slow.pid, signal.SIGSTOP)
        try:
            pg_support.restart_server()
            # The quick worker is back and claiming while the slow one has no session at all.
            wait_until("the quick worker to finish runs", lambda: completed(url, run_ids) > 4, 30)
            time.sleep(1.0)
        finally:
            os.kill(slow.pid, signal.SIGCONT)
        wait_until("the workers to complete every run", lambda: settled(url, run_ids), 90)
        stop([slow, quick])

    each_effect_once(tmp_path, run_ids, steps=8)
    check_every_log(url, run_ids)


def held_by(url: str, pid: int) -> list[str]:
    store = open_store(url, read_only=True)
    try:
        rows = store.list_runs(statuses=("RUNNING",))
    finally:
        store.close()
    return [row.run_id for row in rows if row.lease is not None and row.lease.pid == pid]


def test_a_takeover_does_not_wait_on_an_owner_frozen_inside_its_commit(url: str) -> None:
    import worker_agents

    with Runtime(url, workflows=[worker_agents.chain]) as rt:
        run_id = rt.submit("wa_chain", {"steps": 1})
        row = rt.store.get_run(run_id)
        assert row is not None
        lease = rt._leaser.lease()
        with psycopg.connect(url) as frozen:  # BEGIN ... the row locked, and then nothing
            frozen.execute("SELECT 1 FROM durabl.runs WHERE run_id = %s FOR UPDATE", (run_id,))
            started_s = time.monotonic()
            assert rt.store.take_lease(run_id, row.lease_token, lease) is None
            waited_s = time.monotonic() - started_s
            frozen.rollback()
        assert waited_s < 10, f"the takeover waited {waited_s:.1f} s on a frozen owner's lock"
        assert rt.store.take_lease(run_id, row.lease_token, lease) == row.lease_token + 1
