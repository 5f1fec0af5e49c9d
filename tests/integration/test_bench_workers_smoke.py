"""The worker benchmark runs end to end (``--quick``) and writes every figure it promises.

No timing thresholds here: quick figures are noise. This proves the benchmark code works (real
worker processes, a real SIGKILL, the exactly-once and gapless checks), so that ``make bench``
does not rot between the times someone runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "workers.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.workers", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Throughput" in proc.stdout and "Takeover after SIGKILL" in proc.stdout
    assert not list(work.glob("*.tmp"))
    data = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def positive(value: Any) -> bool:
    return number(value) and value > 0


def count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def test_header_machine_workload_and_repetitions(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "workers"
    assert report["quick"] is True
    assert count(report["schema"])
    assert isinstance(report["timestamp"], str) and report["timestamp"][:2] == "20"
    assert positive(report["elapsed_s"])
    machine = report["machine"]
    assert count(machine["cpu_count"])
    for name in ("python_version", "sqlite_version", "platform", "durabl_version", "scratch_dir"):
        assert isinstance(machine[name], str) and machine[name], name
    assert machine["scratch_filesystem"] not in ("tmpfs", "ramfs")
    for name in ("fsync_us_median", "fdatasync_us_median"):
        assert positive(machine[name]), name
    workload = report["workload"]
    assert count(workload["runs"])
    assert workload["steps_per_run"] == 41
    assert workload["model_calls"] == 1 and workload["tool_calls"] == 40
    assert count(workload["worker_concurrency"])
    assert set(workload["launcher"]) == {"full", "process"}
    assert count(report["repetitions"]["throughput"])
    assert report["repetitions"]["throughput"] <= report["repetitions"]["throughput_planned"]
    for when in ("before_throughput", "after_throughput"):
        probe = report["disk"][when]
        for name in ("fdatasync_us_median", "fdatasync_us_p95", "fdatasync_us_mean"):
            assert positive(probe[name]), (when, name)
        assert count(probe["samples"]), when
    takeover_reps = report["repetitions"]["takeover"]
    assert takeover_reps and all(count(n) for n in takeover_reps.values())


def test_throughput(report: dict[str, Any]) -> None:
    throughput = report["throughput"]
    runs = report["workload"]["runs"]
    assert set(throughput) == {"full", "process"}
    for durability, by_workers in throughput.items():
        assert set(by_workers) == {"1", "2", "4"}, durability
        for n, f in by_workers.items():
            where = f"throughput.{durability}.{n}"
            assert f["workers"] == int(n) and f["durability"] == durability, where
            assert f["reps"] == report["repetitions"]["throughput"], where
            for name in (
                "runs_per_s_median",
                "steps_per_s_median",
                "runs_per_s_min",
                "runs_per_s_max",
                "end_to_end_runs_per_s_median",
                "end_to_end_steps_per_s_median",
                "speedup_vs_1_worker",
                "cpu_ms_per_run_median",
            ):
                assert positive(f[name]), f"{where}.{name} = {f[name]!r}"
            assert f["effects_exactly_once"] is True and f["logs_gapless"] is True, where
            assert len(f["samples"]) == f["reps"], where
            for s in f["samples"]:
                for name in ("span_s", "end_to_end_s", "runs_per_s", "steps_per_s", "startup_s"):
                    assert positive(s[name]), f"{where}.samples.{name}"
                assert len(s["runs_by_worker"]) == int(n), where
                assert sum(s["runs_by_worker"]) == runs, where
                assert sum(s["completed_by_worker"]) == runs, where
                assert all(positive(c) for c in s["cpu_s_by_worker"]), where
                assert s["effects"] == runs * 40, where
                assert count(s["events"]), where
        assert by_workers["1"]["speedup_vs_1_worker"] == 1.0


def test_takeover(report: dict[str, Any]) -> None:
    cases = report["takeover"]["cases"]
    assert {c["standby"] for c in cases} == {"running", "started_after_kill"}
    assert {c["durability"] for c in cases} == {"full", "process"}
    assert [c["label"] for c in cases] == list(report["repetitions"]["takeover"])
    for c in cases:
        where = f"takeover[{c['label']}]"
        assert positive(c["poll_s"]) and positive(c["step_sleep_s"]), where
        assert c["reps"] == report["repetitions"]["takeover"][c["label"]], where
        for name in ("latency_s", "first_step_completed_s"):
            stats = c[name]
            for key in ("median", "p95", "min", "max", "mean"):
                assert positive(stats[key]), f"{where}.{name}.{key}"
            assert stats["n"] == c["reps"], where
        if c["standby"] == "running":
            assert positive(c["latency_max_over_poll"]), where
        else:
            assert c["latency_max_over_poll"] is None, where
        assert positive(c["lease_s"]) and positive(c["lease_left_at_kill_s_min"]), where
        assert c["taken_over_before_lease_expiry"] is True, where
        assert isinstance(c["tool_calls_repeated_after_kill"], int), where
        assert c["tool_calls_repeated_after_kill"] >= 0, where
        assert c["effects_exactly_once"] is True and c["logs_gapless"] is True, where
        assert len(c["samples"]) == c["reps"], where
        for s in c["samples"]:
            assert positive(s["latency_s"]), where
            assert s["first_step_completed_s"] >= s["latency_s"], where
            assert 0 <= s["steps_done_at_kill"] < 41, where
            assert positive(s["kill_after_pickup_s"]), where
            assert s["taker_pid"] != s["killed_pid"], where
            assert isinstance(s["taker_owner"], str) and s["taker_owner"], where
            if c["standby"] == "started_after_kill":
                assert number(s["taker_spawned_after_kill_s"]), where
            else:
                assert s["taker_spawned_after_kill_s"] is None, where


def test_checks(report: dict[str, Any]) -> None:
    assert report["checks"] == {
        "effects_exactly_once": True,
        "logs_gapless": True,
        "taken_over_before_lease_expiry": True,
    }
