"""The scale benchmark runs end to end (``--quick``) and writes every figure it promises.

No timing thresholds here: quick figures are noise. This proves the benchmark works: the big
database is built afresh (the cache is pointed at this test's own folder), ``durabl doctor``
finds it healthy and copies replay like their templates, the CLI and the dashboard are read
through real processes and a real HTTP server, and real worker and resume processes are measured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
STATUSES = {"COMPLETED", "RUNNING", "SLEEPING", "FAILED", "DEAD_LETTERED"}
SHAPES = {"completed_w40", "completed_short", "running", "sleeping", "failed", "dead_lettered"}
TARGETS = {
    "scale_ratio_process",
    "scale_ratio_full",
    "cli_runs_in_process_ms_median",
    "dashboard_list_in_process_ms_median",
    "dashboard_poll_in_process_ms_median",
    "dashboard_list_http_ms_median",
    "dashboard_poll_http_ms_median",
    "worker_parked_hwm_mb",
    "worker_parking_hwm_mb",
    "resume_peak_above_baseline_mb",
}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "scale.json"
    env = {**os.environ, "DURABL_BENCH_SCALE_CACHE": str(work / "cache")}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--quick", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Targets (reported, not asserted)" in proc.stdout
    assert (work / "cache").is_dir() and not list(work.glob("*.tmp"))
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return data


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def summarised(stats: dict[str, Any], n: int) -> None:
    for key in ("median", "p95", "min", "max", "mean"):
        assert positive(stats[key]), (key, stats)
    assert stats["n"] == n


def test_header_and_the_big_database(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "scale" and report["quick"] is True
    assert positive(report["elapsed_s"])
    plan, db = report["plan"], report["database"]
    assert db["reused_from_cache"] is False
    assert db["runs"] == plan["runs"] == 500
    assert plan["events"] <= db["events"] < plan["events"] + max(db["template_events"].values())
    assert set(db["runs_by_status"]) == STATUSES
    assert sum(db["runs_by_status"].values()) == db["runs"]
    assert db["runs_by_status"]["COMPLETED"] > db["runs"] / 2
    assert positive(db["side_effects"]) and positive(db["file_mb"])
    assert set(db["templates"]) == set(db["copies"]) == set(db["template_events"]) == SHAPES
    assert sum(db["copies"].values()) + len(SHAPES) == db["runs"]
    assert db["doctor"]["healthy"] is True and db["doctor"]["exit_code"] == 0
    assert f"{db['events']} events" in db["doctor"]["findings"]["checksums"]
    assert set(db["replayed_copies"]) == SHAPES
    for shape, copy in db["replayed_copies"].items():
        assert copy["run_id"] != db["templates"][shape]


def test_scale(report: dict[str, Any]) -> None:
    scale = report["scale"]
    reps = scale["reps"]
    summarised(scale["plain_run_ms"], reps)
    for mode in ("process", "full"):
        for where in ("empty", "big"):
            summarised(scale[mode][where]["overhead_ms_per_step"], reps)
            summarised(scale[mode][where]["run_ms"], reps)
            assert len(scale["raw_run_us"][f"{mode}@{where}"]) == reps
        assert positive(scale[mode]["ratio_median_big_over_empty"])
        assert positive(scale[mode]["ratio_mean_big_over_empty"])


def test_reads(report: dict[str, Any]) -> None:
    cli, dashboard, db = report["cli"], report["dashboard"], report["database"]
    samples = report["plan"]["process_samples"]
    assert cli["all"]["rows"] == db["runs"]
    assert cli["default"]["rows"] == min(100, db["runs"])
    assert cli["status_running"]["rows"] == db["runs_by_status"]["RUNNING"]
    assert cli["limit_25"]["rows"] == 25
    for case in ("default", "all", "status_running", "limit_25"):
        for name in ("whole_process_ms", "import_ms", "in_process_ms"):
            summarised(cli[case][name], samples)
        assert len(cli[case]["raw_in_process_ms"]) == samples
    for stats in cli["list_runs_ms"].values():
        summarised(stats, report["plan"]["in_process_samples"])
    assert dashboard["runs_listed"]["list"] == 25
    assert dashboard["runs_listed"]["list_running"] == min(25, db["runs_by_status"]["RUNNING"])
    assert dashboard["after_seq"] > 1
    for name in ("list", "list_running", "poll"):
        summarised(dashboard[name]["in_process_ms"], dashboard["samples"])
        summarised(dashboard[name]["http_ms"], dashboard["samples"])


def test_memory(report: dict[str, Any]) -> None:
    memory = report["memory"]
    parked_runs = report["plan"]["parked_runs"]
    for name, drives in (("worker_over_parked", 0), ("worker_parking", parked_runs)):
        worker = memory[name]
        assert worker["runs"] == parked_runs
        assert positive(worker["rss_mb"]) and worker["hwm_mb"] >= worker["rss_mb"]
        assert worker["worker_said"] == f"worker stopped: {drives} drives, 0 runs completed"
    long_run = memory["long_run"]
    steps = report["plan"]["long_steps"]
    assert long_run["steps_completed_before_kill"] == steps
    assert long_run["resume"]["state"] == {
        "status": "COMPLETED",
        "steps_replayed": steps,
        "steps_executed": 1,
    }
    assert long_run["dry"]["state"]["steps_replayed"] == steps
    for how in ("resume", "dry"):
        figures = long_run[how]
        for name in ("baseline_rss_mb", "hwm_mb", "peak_above_baseline_mb", "call_s"):
            assert positive(figures[name]), (how, name)
    traced = long_run["traced"]
    assert traced["events_loaded"] > steps
    assert positive(traced["log_load_heap_peak_mb"]) and positive(traced["dry_replay_heap_peak_mb"])


def test_targets(report: dict[str, Any]) -> None:
    assert set(report["targets"]) == TARGETS
    for name, target in report["targets"].items():
        assert positive(target["target"]), name
        assert positive(target["measured"]), name
        assert target["met"] is (target["measured"] <= target["target"]), name
