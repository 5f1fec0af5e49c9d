"""The throughput benchmark runs end to end (``--quick --runtimes durabl``) and writes every cell
it promises.

No timing thresholds here: quick figures are noise. This proves the benchmark code works (real
probe processes driving runs from many threads on one runtime, real worker processes sharing
one database, every step counted from the log), so that ``make bench`` does not rot between the
times someone runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
VARIANTS = {"instant": 0.0, "sleep_2ms": 0.002}
CONCURRENCIES = (1, 8, 64)
WORKER_PROCESSES = (2, 4)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "throughput.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.throughput",
            "--quick",
            "--runtimes",
            "durabl",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Throughput" in proc.stdout and "Target:" in proc.stdout
    assert not list(work.glob("*.tmp"))
    data = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_header_machine_and_disk(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "throughput"
    assert report["quick"] is True
    assert report["runtimes"] == ["durabl"]
    assert report["repetitions"] == 1
    assert positive(report["elapsed_s"])
    machine = report["machine"]
    assert machine["scratch_filesystem"] not in ("tmpfs", "ramfs")
    assert positive(machine["fsync_us_median"])
    disk = report["disk"]
    assert disk["filesystem"] not in ("tmpfs", "ramfs")
    for name in ("fsync_us_median", "one_fsync_per_step_cap_steps_per_s"):
        assert positive(disk[name]), name
    assert positive(disk["before"]["fsync_us_median"]) and positive(disk["after"]["samples"])
    workload = report["workload"]
    assert workload["steps_per_run"] == 41
    assert workload["model_calls"] == 1 and workload["tool_calls"] == 40
    assert workload["variants"] == {k: {"tool_sleep_s": v} for k, v in VARIANTS.items()}


def test_every_cell_present(report: dict[str, Any]) -> None:
    found = {
        (c["kind"], c["mode"], c["variant"], c["concurrency"], c["processes"])
        for c in report["cells"]
    }
    wanted = {
        ("threads", mode, variant, n, 1)
        for mode in ("full", "process")
        for variant in VARIANTS
        for n in CONCURRENCIES
    } | {
        ("workers", mode, variant, 8, p)
        for mode in ("full", "process")
        for variant in VARIANTS
        for p in WORKER_PROCESSES
    }
    assert found == wanted
    assert len(report["cells"]) == len(wanted)
    assert {c["runtime"] for c in report["cells"]} == {"durabl"}


def test_steps_counted_equal_runs_times_41(report: dict[str, Any]) -> None:
    fsync_us = report["disk"]["fsync_us_median"]
    for c in report["cells"]:
        where = f"{c['kind']} {c['mode']} {c['variant']} {c['processes']}x{c['concurrency']}"
        assert c["sleep_s"] == VARIANTS[c["variant"]], where
        assert len(c["samples"]) == report["repetitions"], where
        assert c["steps_counted"] == [c["runs"] * 41] * len(c["samples"]), where
        assert c["steps_per_s_samples"] == [s["steps_per_s"] for s in c["samples"]], where
        assert positive(c["steps_per_s_median"]) and positive(c["ratio_to_cap"]), where
        assert c["fsync_us_median"] == fsync_us, where
        assert c["durability"]["mode"] == c["mode"], where
        for s in c["samples"]:
            assert s["steps"] == s["runs"] * 41 and positive(s["span_s"]), where
        if c["kind"] == "threads":
            assert c["runs"] >= c["concurrency"], where
        else:
            for s in c["samples"]:
                assert s["effects"] == s["runs"] * 40, where
                assert len(s["runs_by_worker"]) == c["processes"], where
                assert sum(s["runs_by_worker"]) == s["runs"], where
                assert sum(s["completed_by_worker"]) == s["runs"], where


def test_target_is_reported(report: dict[str, Any]) -> None:
    target = report["target"]
    assert {(c["variant"], c["concurrency"]) for c in target["cells"]} == {
        (v, n) for v in VARIANTS for n in CONCURRENCIES if n > 1
    }
    for c in target["cells"]:
        assert c["met"] is (c["ratio_to_cap"] > 1)
    assert target["met"] is all(c["met"] for c in target["cells"])
