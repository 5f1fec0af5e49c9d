"""Run leases with real processes (SPEC §7): one driver per run, and a stale owner is fenced off.

- Several processes race ``resume_all`` on one database, released together by a starting gun
  on their stdin, over many interrupted runs: every step is executed exactly once (the tools
  log every invocation, keyed by idempotency key), every run completes, every log is gapless.
- A process freezes (SIGSTOP) while it owns a run with a short lease; the lease runs out,
  another process takes the run over and completes it; the frozen one is woken (SIGCONT), its
  next commit raises ``LeaseLost`` and it stops: nothing it tries to write lands, and no event
  after the takeover carries its fencing token. Where that next commit comes decides what the
  stale owner can still do: an IDEMPOTENT tool with a derived key commits its opening with its
  outcome, so the stale owner may call it once more (it dedupes on the key); an AT_MOST_ONCE
  tool commits its opening before the call, so the stale owner is refused before calling it.
- Several processes hammer one database with short runs while another holds a write
  transaction open for a second: SQLITE_BUSY is waited out inside the store, never surfaced.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from proc_support import (
    assert_gapless,
    count_by,
    env_for,
    finish,
    lines,
    log_of,
    outbox_keys,
    process_state,
    processes,
    query,
    resumed_pids,
    statuses,
    wait_ready,
    wait_until,
)

from durabl.steps import derived_key

RACERS = 4
FRESH = 14  # runs interrupted before their first step
HALFWAY = 14  # runs interrupted after their model call and first effect
STEPS = 3  # effects per run, after one model call


def test_racing_resume_all_drives_every_interrupted_run_once(tmp_path: Path) -> None:
    db = tmp_path / "race.db"
    # Each effect takes a little while, as real tools do; with instant steps one process keeps
    # SQLite's write lock busy and the others mostly find runs already finished.
    env = env_for(tmp_path, DURABL_TEST_STEP_S="0.03")
    steps = f'{{"steps": {STEPS}}}'
    with processes() as procs:
        for prefix, count, crash in (
            ("fresh", FRESH, ["--crash-at", "after_run_started"]),
            ("halfway", HALFWAY, ["--crash-at", "after_step_committed", "--occurrence", "2"]),
        ):
            seeded = finish(
                procs.agent(
                    env, "seed", str(db), "wa_chain", str(count), prefix, "--input", steps, *crash
                )
            )
            assert len(seeded["run_ids"]) == count
        run_ids = sorted(statuses(db))
        assert len(run_ids) == FRESH + HALFWAY
        assert set(statuses(db).values()) == {"RUNNING"}
        seed_calls = len(lines(tmp_path / "calls.txt"))
        assert seed_calls == HALFWAY * 3  # the model, and effect 0 begun and ended, per run

        racers = [procs.agent(env, "race", str(db), stdin=True) for _ in range(RACERS)]
        for racer in racers:
            wait_ready(racer)
        for racer in racers:  # the starting gun: all of them at once
            assert racer.stdin is not None
            racer.stdin.write("go\n")
            racer.stdin.flush()
        reports = [finish(racer, timeout_s=60) for racer in racers]

    racer_pids = {r["pid"] for r in reports}
    assert statuses(db) == dict.fromkeys(run_ids, "COMPLETED")

    calls = lines(tmp_path / "calls.txt")
    begun = count_by(calls, kind="begin")
    expected_keys = {
        derived_key(run_id, position) for run_id in run_ids for position in range(2, STEPS + 2)
    }
    assert set(begun) == expected_keys
    assert set(begun.values()) == {1}, {k: n for k, n in begun.items() if n != 1}
    assert count_by(calls, kind="end") == begun
    asked = count_by(calls, kind="model", column=1)
    assert asked == {f"plan for {run_id}": 1 for run_id in run_ids}
    assert outbox_keys(tmp_path / "outbox.txt") == dict.fromkeys(expected_keys, 1)

    drivers = set()
    for run_id in run_ids:
        assert_gapless(db, run_id)
        pids = resumed_pids(db, run_id)
        assert len(pids) == 1, f"run {run_id} was taken over {len(pids)} times: {pids}"
        assert pids[0] in racer_pids
        drivers.add(pids[0])
        kinds = [e[1] for e in log_of(db, run_id)]
        assert kinds.count("RUN_COMPLETED") == 1 and kinds[-1] == "RUN_COMPLETED"
    assert len(drivers) >= 2, "one process drove every run: the race never happened"

    # A racer that did not drive a run was refused its lease; nothing else went wrong.
    refusals = [state for report in reports for state in report["states"] if state["error"]]
    assert refusals, "no racer was ever refused a lease: the race never happened"
    for report in reports:
        for state in report["states"]:
            if state["error"] is not None:
                assert "driven by" in state["error"] or "taken over" in state["error"], state


@pytest.mark.parametrize(
    "where", ["inside_tool", "at_step_boundary", "at_step_boundary_before_at_most_once"]
)
def test_a_frozen_owner_is_fenced_off_after_a_takeover(tmp_path: Path, where: str) -> None:
    db = tmp_path / "fence.db"
    run_id = f"fenced-{where}"
    middle_key = derived_key(run_id, 2)
    middle = "notify" if where == "at_step_boundary_before_at_most_once" else "pausable"
    argv = ["start", str(db), "wa_fenced", run_id, "--lease-s", "0.6"]
    argv += ["--input", json.dumps({"middle": middle})]
    if where == "inside_tool":  # frozen inside step 2's tool, before any of step 2 is committed
        env_a = env_for(tmp_path, DURABL_TEST_STOP_IN_TOOL="1")
    else:  # frozen right after step 1 committed, before step 2 begins
        env_a = env_for(tmp_path)
        argv += ["--stop-after-step", "1"]
    with processes() as procs:
        a = procs.agent(env_a, *argv)
        wait_until("process A to freeze itself", lambda: process_state(a.pid) == "T")
        ((expires_s, token_a),) = query(
            db, "SELECT lease_expires_s, lease_token FROM runs WHERE run_id = ?", (run_id,)
        )
        assert token_a == 1
        wait_until("A's lease to run out", lambda: time.time() > expires_s + 0.1)
        log_a = log_of(db, run_id)

        b = procs.agent(env_for(tmp_path), "resume", str(db), run_id)
        out_b = finish(b)
        assert out_b["status"] == "COMPLETED"
        log_b = log_of(db, run_id)
        assert process_state(a.pid) == "T", "A must have stayed frozen through the takeover"

        os.kill(a.pid, signal.SIGCONT)
        out_a = finish(a)

    assert out_a["outcome"] == "lease_lost", out_a
    assert "lease lost" in out_a["error"]
    # A stopped without writing: the log is exactly what B left.
    assert log_of(db, run_id) == log_b
    assert_gapless(db, run_id)

    # Frozen in step 2 or before it, A had committed nothing of step 2: pausable's opening is
    # deferred to its outcome, and A never reached notify's. (Step 1 is IDEMPOTENT too: its
    # attempt and its result are one TOOL_COMPLETED.)
    assert log_a[-1][1:3] == ("TOOL_COMPLETED", 1)
    assert not [e for e in log_a if e[2] >= 2]
    takeover = len(log_a) + 1
    assert log_b[: len(log_a)] == log_a
    assert log_b[takeover - 1][1] == "RUN_RESUMED"
    assert resumed_pids(db, run_id) == [out_b["pid"]]
    assert {fence for *_, fence, _ in log_a} == {1}
    after = log_b[takeover - 1 :]
    assert all(fence == 2 for *_, fence, _ in after), after
    assert not any(fence == token_a for *_, fence, _ in after)
    assert after[-1][1] == "RUN_COMPLETED"

    ((status, result, token, owner),) = query(
        db, "SELECT status, result, lease_token, lease_owner FROM runs WHERE run_id = ?", (run_id,)
    )
    assert (status, token, owner) == ("COMPLETED", 2, None)
    assert result is not None and json.loads(result) == out_b["result"]  # B's result stands
    if middle == "pausable":
        assert out_b["result"]["middle_pid"] == out_b["pid"]
        assert str(out_b["pid"]) in result

    # Each effect is in the outbox once; notify appends on every call, so a call by A would
    # show as a second line under its key.
    keys = [derived_key(run_id, position) for position in (1, 2, 3)]
    assert outbox_keys(tmp_path / "outbox.txt") == dict.fromkeys(keys, 1)
    calls = lines(tmp_path / "calls.txt")
    a_calls = [c[:3] for c in calls if c[0] in ("begin", "end") and int(c[3]) == a.pid]
    middle_calls = [
        (c[0], "A" if int(c[3]) == a.pid else "B")
        for c in calls
        if c[0] in ("begin", "end") and c[1] == middle
    ]
    assert a_calls[:2] == [["begin", "effect", keys[0]], ["end", "effect", keys[0]]]
    if where == "inside_tool":
        # A woke inside the tool and finished it; its one commit of step 2 was refused.
        assert middle_calls == [("begin", "A"), ("begin", "B"), ("end", "B"), ("end", "A")]
    elif where == "at_step_boundary":
        # Step 2's first commit comes after its call (derived key, IDEMPOTENT): A called the
        # tool once more after the takeover, which the key dedupes, and that commit was refused.
        assert middle_calls == [("begin", "B"), ("end", "B"), ("begin", "A"), ("end", "A")]
    else:
        # An AT_MOST_ONCE opening is committed before the call: it was A's refused commit, so
        # A never called the tool.
        assert middle_calls == [("begin", "B"), ("end", "B")]
    assert a_calls[2:] == [[kind, middle, middle_key] for kind, who in middle_calls if who == "A"]


HAMMERS = 4
HAMMER_RUNS = 12


def test_a_busy_database_is_waited_for_never_surfaced(tmp_path: Path) -> None:
    db = tmp_path / "busy.db"
    env = env_for(tmp_path)

    def event_count() -> int:
        return int(query(db, "SELECT COUNT(*) FROM events")[0][0])

    def fire(guns: list[subprocess.Popen[str]]) -> None:
        for proc in guns:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    with processes() as procs:
        # They open (and create and migrate) the database at the same time, too.
        hammers = [
            procs.agent(env, "hammer", str(db), f"h{i}", str(HAMMER_RUNS), stdin=True)
            for i in range(HAMMERS)
        ]
        for hammer in hammers:
            wait_ready(hammer)
        fire(hammers)  # the first half: the hammers contend with each other
        for hammer in hammers:
            assert hammer.stdout is not None
            assert hammer.stdout.readline().strip() == "halfway"

        holder = sqlite3.connect(db, timeout=30, isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")  # the write lock, held for a second...
            held_from = event_count()
            fire(hammers)  # ...while the hammers go on with their second half
            time.sleep(1.0)
            assert all(hammer.poll() is None for hammer in hammers)
            assert event_count() == held_from, "someone wrote while the write lock was held"
            holder.execute("COMMIT")
        finally:
            holder.close()
        reports = [finish(hammer, timeout_s=60) for hammer in hammers]

    for report in reports:
        assert report["statuses"] == {"COMPLETED": HAMMER_RUNS}, report
    run_ids = [f"h{i}-{n}" for i in range(HAMMERS) for n in range(HAMMER_RUNS)]
    assert statuses(db) == dict.fromkeys(run_ids, "COMPLETED")
    keys = {derived_key(run_id, position) for run_id in run_ids for position in (2, 3)}
    assert count_by(lines(tmp_path / "calls.txt"), kind="begin") == dict.fromkeys(keys, 1)
    for run_id in run_ids:
        assert_gapless(db, run_id)
