"""The W40 benchmark runs end to end (``--quick``) and writes every figure it promises.

No timing thresholds here: quick figures are noise. This only proves the benchmark code works,
so that ``make bench`` does not rot between the times someone runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

OVERHEAD_FIELDS = (
    "overhead_ms_per_step_median",
    "overhead_ms_per_step_p95",
    "overhead_ms_per_step_min",
    "overhead_ms_per_step_mean",
    "run_ms_median",
    "run_ms_p95",
)
PLAIN_FIELDS = ("us_per_step_median", "us_per_step_p95", "run_ms_median")
SERVED_FIELDS = (
    "us_per_served_step_median",
    "us_per_served_step_p95",
    "us_per_served_step_min",
    "call_ms_median",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "w40.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.w40", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert "Per-step overhead" in proc.stdout
    assert not list(work.glob("*.tmp"))
    data = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_fields(section: dict[str, Any], fields: tuple[str, ...], where: str) -> None:
    for name in fields:
        assert name in section, f"{where} lacks {name}"
        assert positive(section[name]), f"{where}.{name} = {section[name]!r}"
    assert count(section["reps"]), f"{where}.reps = {section.get('reps')!r}"


def test_header_machine_and_repetitions(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "W40"
    assert report["quick"] is True
    assert count(report["schema"])
    assert isinstance(report["timestamp"], str) and report["timestamp"][:2] == "20"
    assert positive(report["elapsed_s"])
    machine = report["machine"]
    assert count(machine["cpu_count"])
    for name in ("python_version", "sqlite_version", "platform", "durabl_version", "scratch_dir"):
        assert isinstance(machine[name], str) and machine[name], name
    assert machine["scratch_filesystem"] not in ("tmpfs", "ramfs")
    for name in ("fsync_us_median", "fsync_us_p95", "fdatasync_us_median", "fdatasync_us_p95"):
        assert positive(machine[name]), name
    assert report["workload"]["steps"] == 41
    assert report["workload"]["model_calls"] == 1
    assert report["workload"]["tool_calls"] == 40
    assert 150 <= report["workload"]["tool_result_bytes"] <= 300
    reps = report["repetitions"]
    for name in (
        "warmup",
        "overhead",
        "dry_replay",
        "resume",
        "scaling",
        "profile_runs",
        "census_runs",
    ):
        assert count(reps[name]), name


def test_overhead(report: dict[str, Any]) -> None:
    overhead = report["overhead"]
    assert set(overhead) == {"process", "full", "full_idempotent"}
    for label, section in overhead.items():
        check_fields(section, OVERHEAD_FIELDS, f"overhead.{label}")
        assert section["reps"] == report["repetitions"]["overhead"]
        assert section["durability"] in ("process", "full")
        assert section["tool_mode"] in ("AT_MOST_ONCE", "IDEMPOTENT")
        assert isinstance(section["tool_registration"], str)
        for name in ("durable_commits_per_run", "sync_floor_ms_per_step"):
            value = section[name]
            assert isinstance(value, int | float) and not isinstance(value, bool), name
            assert value > 0 if section["durability"] == "full" else value == 0, (label, name)
    check_fields(report["plain_loop"], PLAIN_FIELDS, "plain_loop")


def test_replay(report: dict[str, Any]) -> None:
    replay = report["replay"]
    assert set(replay) == {
        "dry_replay",
        "dry_replay_fresh_runtime",
        "resume_process",
        "resume_full",
    }
    for label, section in replay.items():
        check_fields(section, SERVED_FIELDS, f"replay.{label}")
        assert section["steps_served"] == 41
    for label in ("resume_process", "resume_full"):
        assert positive(replay[label]["runtime_open_ms_median"])


def test_scaling(report: dict[str, Any]) -> None:
    scaling = report["scaling"]
    assert scaling["prior_events"] >= 1_000
    for name in ("populate_runs", "events_per_run", "empty_db_events_at_end"):
        assert count(scaling[name]), name
    assert scaling["prior_db_events_at_end"] > scaling["prior_events"]
    assert positive(scaling["populate_s"])
    check_fields(scaling["plain"], PLAIN_FIELDS, "scaling.plain")
    for mode in ("process", "full"):
        check_fields(scaling[mode]["empty"], OVERHEAD_FIELDS, f"scaling.{mode}.empty")
        check_fields(scaling[mode]["prior"], OVERHEAD_FIELDS, f"scaling.{mode}.prior")
        assert positive(scaling[mode]["ratio_prior_over_empty"])
        assert positive(scaling[mode]["ratio_mean_prior_over_empty"])


def test_census(report: dict[str, Any]) -> None:
    census = report["census"]
    assert set(census) == set(report["overhead"])
    for label, c in census.items():
        assert count(c["runs"]), label
        for name in (
            "transactions_per_run",
            "sql_statements_per_run",
            "wal_bytes_per_run",
            "wal_frames_per_run",
            "run_ms_mean",
            "store_ms_per_run",
            "store_share_of_run",
        ):
            assert positive(c[name]), (label, name)
        assert 0 < c["store_share_of_run"] <= 1
        assert c["store_calls_per_run"] and c["sql_statements_by_kind"]
        for value in [*c["store_calls_per_run"].values(), *c["sql_statements_by_kind"].values()]:
            assert positive(value), label
    assert positive(census["full"]["durable_commits_per_run"])
    assert census["process"]["durable_commits_per_run"] == 0


def test_profiles(report: dict[str, Any]) -> None:
    assert set(report["profile"]) == {"execute", "resume"}
    for kind, profile in report["profile"].items():
        assert count(profile["runs"]) and count(profile["steps"]), kind
        assert positive(profile["profiled_us_per_step"]), kind
        assert profile["by_area_us_per_step"], kind
        assert all(isinstance(v, int | float) for v in profile["by_area_us_per_step"].values())
        assert profile["top_self"] and profile["top_cumulative_durabl"], kind
        for row in profile["top_self"] + profile["top_cumulative_durabl"]:
            assert isinstance(row["function"], str) and row["function"]
            assert positive(row["calls_per_step"])
            assert row["cumulative_us_per_step"] >= row["self_us_per_step"] >= 0


def test_targets(report: dict[str, Any]) -> None:
    targets = report["targets"]
    assert set(targets) == {
        "full_overhead_ms_per_step_median",
        "process_overhead_ms_per_step_median",
        "replay_us_per_served_step_median",
        "scaling_ratio_100k_over_empty",
    }
    for name, target in targets.items():
        assert positive(target["target"]) and positive(target["measured"]), name
        assert isinstance(target["met"], bool), name
