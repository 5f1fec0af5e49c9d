"""The PostgreSQL benchmark runs end to end (``--quick --runtimes durabl``) and writes every cell
it promises, with the counts right.

DBOS is left out explicitly (``--runtimes durabl``): its probe needs its own virtualenv, which
``make bench-peers`` builds and ``make test`` does not; the report must say so. No timing
thresholds here: quick figures are noise. This proves the benchmark code works (worker
processes on a PostgreSQL database and on a SQLite file, every step counted from the log, real
SIGKILLs and takeovers, per-step probes and the floor on the machine's server), so that
``make bench`` does not rot between the times someone runs it. The server must be running, as
for every PostgreSQL test (``make postgres-up``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BACKENDS = ("postgres", "sqlite")
WORKERS = (1, 2, 4, 8)
SETTINGS = ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "postgres.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.postgres",
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
    assert "Worker processes" in proc.stdout and "Takeover" in proc.stdout
    assert not list(work.glob("*.tmp"))
    data = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def cells(report: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [c for c in report["cells"] if c["kind"] == kind]


def test_header_machine_server_and_load(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "postgres"
    assert report["schema"] == 1 and report["quick"] is True
    assert report["runtimes"] == ["durabl"]
    assert positive(report["elapsed_s"])
    assert "git_commit" in report["machine"]
    assert report["machine"]["scratch_filesystem"] not in ("tmpfs", "ramfs")
    server = report["postgres"]
    assert server["version"] and positive(server["version_num"])
    assert set(SETTINGS) <= set(server["settings"])
    assert {"before", "after"} <= set(report["load"]) and report["notes"]
    assert report["workload"]["steps_per_run"] == 41 and report["workload"]["tool_calls"] == 40
    assert report["dbos"] == {"measured": False, "why": "excluded by --runtimes"}
    assert all(report["checks"].values()), report["checks"]


def test_workers_count_every_step_and_effect(report: dict[str, Any]) -> None:
    found = {(c["backend"], c["workers"]) for c in cells(report, "workers")}
    assert found == {(b, n) for b in BACKENDS for n in WORKERS}
    runs = report["workload"]["worker_runs"]
    for c in cells(report, "workers"):
        where = f"{c['backend']} {c['workers']} workers"
        assert len(c["samples"]) == report["repetitions"]["workers"], where
        assert c["steps_counted"] == [runs * 41] * len(c["samples"]), where
        assert c["effects_counted"] == [runs * 40] * len(c["samples"]), where
        assert positive(c["steps_per_s_median"]), where
        assert c["steps_per_s_samples"] == [s["steps_per_s"] for s in c["samples"]], where
        for s in c["samples"]:
            assert len(s["runs_by_worker"]) == c["workers"], where
            assert sum(s["runs_by_worker"]) == sum(s["completed_by_worker"]) == runs, where
            assert positive(s["wall_s"]) and s["startup_s"] >= 0, where


def test_takeovers_are_timed_and_lose_nothing(report: dict[str, Any]) -> None:
    takeovers = cells(report, "takeover")
    assert {c["label"] for c in takeovers} == set(report["repetitions"]["takeover"])
    for c in takeovers:
        if not c["measured"]:  # another host name needs root: the report says why
            assert c["other_host"] and c["why"], c
            continue
        assert len(c["samples"]) == c["reps"] == report["repetitions"]["takeover"][c["label"]]
        assert c["effects"] == c["reps"] * 40 and c["effects_exactly_once"]
        for s in c["samples"]:
            assert positive(s["latency_s"]) and s["latency_s"] >= s["lease_taken_s"] > 0, s
            assert 0 <= s["steps_done_at_kill"] < 41, s
    same_host = [c for c in takeovers if c["measured"] and not c["other_host"]]
    assert {c["backend"] for c in same_host} == set(BACKENDS)
    assert all(c["taken_over_before_lease_expiry"] for c in same_host)


def test_overhead_and_floor_cells(report: dict[str, Any]) -> None:
    over = {(c["backend"], c["mode"]): c for c in cells(report, "overhead")}
    assert set(over) == {(b, m) for b in BACKENDS for m in ("full", "process")}
    pairs = report["repetitions"]["overhead_rounds"]
    for c in over.values():
        assert {c["runtime"]} == {"durabl"} and c["probes"] == pairs
        assert c["us_per_step"]["n"] == pairs * c["warm_pairs_per_probe"]
        for s in c["samples"]:
            assert s["steps"] == s["runs"] * 41 and s["effects"] == s["runs"] * 40
            assert len(s["us_per_step"]) == s["runs"] == len(s["plain_ns"])
        assert (c["ratio_to_floor"] is None) is (c["backend"] == "sqlite")
    floors = {c["column"]: c for c in cells(report, "floor")}
    assert set(floors) == {"full", "process"}
    assert all(positive(f["us_median"]) for f in floors.values())
