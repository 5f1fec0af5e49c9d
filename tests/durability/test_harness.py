"""The harness tells a durable runtime from an unmanaged loop, under real SIGKILLs.

A harness that cannot tell them apart is broken: the plain loop, which keeps its state in
memory, must lose (duplicate effects, re-bill tokens, leave orphans) and durabl must lose
nothing. Every figure checked here is read from the leaderboard the run wrote, which is rebuilt
from the sealed receipts."""

from __future__ import annotations

import json
from pathlib import Path

from durabl.bench import board, seal
from durabl.bench.kit import agent

from .conftest import KEY, KILLS, bench, leaderboard


def rows(out: Path) -> dict[str, dict]:
    return {row["id"]: row for row in leaderboard(out)["rows"]}


def test_every_kill_is_a_real_trial_with_a_receipt(small_run: Path) -> None:
    board_ = leaderboard(small_run)
    assert board_["kills"] == KILLS
    counted = rows(small_run)
    assert set(counted) == {"durabl", "plain"}
    assert counted["durabl"]["kills"] + counted["plain"]["kills"] == KILLS
    receipts = list(seal.receipt_files(small_run / "receipts"))
    assert len(receipts) == KILLS + 2 * 2  # and two calibration runs per runtime
    for path in receipts:
        body = json.loads(path.read_text())["body"]
        if body["kind"] == "trial":
            first = body["processes"][0]
            assert first["killed"] and first["exit"] == -9  # a real SIGKILL, not an exit
            assert first["events"][-1]["event"] == "kill"
            assert first["events"][-1]["window"] == body["window"]
            assert len(body["processes"]) >= 2  # and a restart in a new process


def test_plain_loop_loses_and_durabl_does_not(small_run: Path) -> None:
    counted = rows(small_run)
    plain, durabl = counted["plain"], counted["durabl"]
    assert plain["duplicated"] > 0 and plain["duplicate_effects"] > 0
    assert plain["recovered"] < plain["kills"]
    assert plain["token_waste"] > 0.2
    assert plain["steps_rerun_per_kill"] > 2
    assert plain["windows"].keys() == {"PROMPT", "EXEC", "VERIFY"}  # nothing to kill in a write

    assert durabl["duplicated"] == durabl["duplicate_effects"] == 0
    assert durabl["wrong"] == durabl["failed"] == durabl["stalled"] == 0
    assert durabl["orphans"] == 0
    assert durabl["recovered"] + durabl["held"] == durabl["kills"]
    assert durabl["windows"].keys() == set(agent.WINDOWS)
    assert (
        durabl["store_broken"] == 0
        and durabl["store_checks"] == durabl["windows"]["WRITE"]["kills"]
    )
    assert (
        durabl["locks_left"] == 0 and durabl["lock_checks"] == durabl["windows"]["VERIFY"]["kills"]
    )
    assert durabl["tamper_rejected"] == durabl["tamper_checks"] == durabl["lock_checks"]
    assert durabl["token_waste"] < plain["token_waste"]
    assert isinstance(durabl["overhead_ms"], float) and isinstance(
        durabl["resume_ms_median"], float
    )


def test_the_chart_is_drawn(small_run: Path) -> None:
    assert (small_run / "leaderboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_durabl_holds_only_the_at_most_once_tool(small_run: Path) -> None:
    for path in seal.receipt_files(small_run / "receipts"):
        body = json.loads(path.read_text())["body"]
        if body["kind"] != "trial" or body["adapter"]["id"] != "durabl":
            continue
        if board.judge(body) == "held":
            reason = body["processes"][-1]["events"][-1]["reason"]
            assert "AT_MOST_ONCE" in reason and "'ledger'" in reason
            assert body["observed"]["ledger_lines"] == 1  # the effect happened once, no more


def test_the_leaderboard_is_what_report_rebuilds(small_run: Path, run_copy: Path) -> None:
    written = {
        name: (small_run / name).read_bytes() for name in ("leaderboard.md", "leaderboard.json")
    }
    (run_copy / "leaderboard.md").unlink()
    (run_copy / "leaderboard.json").unlink()
    done = bench("report", str(run_copy))
    assert done.returncode == 0, done.stderr
    for name, data in written.items():
        assert (run_copy / name).read_bytes() == data
    assert done.stdout.strip() == written["leaderboard.md"].decode().strip()
    receipts = seal.verify(small_run, seal.Key(KEY.encode(), "test")).receipts
    assert board.build(receipts) == json.loads(written["leaderboard.json"])


def test_the_same_seed_plans_the_same_kills(small_run: Path) -> None:
    planned = [
        (b["adapter"]["id"], b["window"], b["kill_at"])
        for b in (
            json.loads(p.read_text())["body"] for p in seal.receipt_files(small_run / "receipts")
        )
        if b["kind"] == "trial"
    ]
    from durabl.bench import adapters, run

    arrivals = {}
    for p in seal.receipt_files(small_run / "receipts"):
        b = json.loads(p.read_text())["body"]
        if b["kind"] == "trial":
            arrivals.setdefault(b["adapter"]["id"], {})[b["window"]] = b["arrivals"]
    again = run.plan_kills(
        arrivals, [adapters.BY_ID["durabl"], adapters.BY_ID["plain"]], list(agent.WINDOWS), KILLS, 7
    )
    assert [(a.id, w, n) for a, w, n in again] == planned


def test_a_killed_shell_tool_leaves_an_orphan_only_without_a_runtime_that_reaps_it(
    tmp_path: Path,
) -> None:
    """EXEC arrival 4 is the shell tool, while its child runs. The plain loop's subprocess.run
    child outlives the SIGKILL; durabl's run_command child dies with the agent."""
    import sys

    from durabl.bench import adapters, trial

    shell_arrival = 4
    assert [s.name for s in agent.STEPS if s.kind == "tool"][shell_arrival - 1] == "shell"
    for runtime, orphaned in (("plain", True), ("durabl", False)):
        launch = trial.Launch(adapters.BY_ID[runtime], sys.executable)
        result = trial.run_trial(launch, tmp_path / runtime, f"EXEC:{shell_arrival}")
        assert result["processes"][0]["killed"]
        assert bool(result["orphans"]) is orphaned, (runtime, result["orphans"])
        if orphaned:  # the shell and the command it forked
            assert {o["cmd"].split()[0] for o in result["orphans"]} == {"sh", "sleep"}
        assert result["processes"][-1]["exit"] == 0  # and the run still finishes


def test_the_committed_leaderboard_is_built_from_the_committed_receipts() -> None:
    """bench/results/durability holds the last `make bench-peers`: its leaderboard must be what
    the receipts beside it give, so no figure in it was typed or carried over. (Verifying the
    seals needs the key of the machine that ran it; rebuilding needs only the receipts.)"""
    results = Path(__file__).resolve().parents[2] / "bench" / "results" / "durability"
    bodies = [json.loads(p.read_text())["body"] for p in seal.receipt_files(results / "receipts")]
    built = board.build(bodies)
    assert built == json.loads((results / "leaderboard.json").read_text())
    assert board.markdown(built) == (results / "leaderboard.md").read_text()
    assert built["kills"] == 500 and len(built["rows"]) == 10
