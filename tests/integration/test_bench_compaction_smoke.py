"""The compaction benchmark runs end to end (``--quick``) and writes every figure it promises.

No timing thresholds here: quick figures are noise. The benchmark itself stops with an
``AssertionError`` if a compacted copy replays, reports its state or its metrics, or resumes
differently from the uncompacted run; this test checks that it got to the end, and that the
figures it wrote have the right shape and are sane (sizes positive, the file smaller after
compaction).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TIMINGS = ("ms_median", "ms_p95", "ms_min", "us_per_step_median")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    work = tmp_path_factory.mktemp("bench")
    out = work / "compaction.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compaction", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert not list(work.glob("*.tmp"))
    data = json.loads(out.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data, proc.stderr


@pytest.fixture(scope="module")
def report(run: tuple[dict[str, Any], str]) -> dict[str, Any]:
    return run[0]


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_timing(section: dict[str, Any], where: str) -> None:
    for name in TIMINGS:
        assert positive(section[name]), f"{where}.{name} = {section.get(name)!r}"
    assert section["ms_p95"] >= section["ms_median"] >= section["ms_min"], where
    assert count(section["n"]), where


def test_summary_goes_to_stderr(run: tuple[dict[str, Any], str]) -> None:
    stderr = run[1]
    assert "Compaction of a 200-step run" in stderr
    assert "resume (one step left" in stderr and "resume (20 steps left)" in stderr
    assert "wrote " in stderr


def test_header_machine_workload_and_repetitions(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "compaction"
    assert report["quick"] is True
    assert count(report["schema"])
    assert isinstance(report["timestamp"], str) and report["timestamp"][:2] == "20"
    assert positive(report["elapsed_s"])
    machine = report["machine"]
    assert count(machine["cpu_count"])
    for name in ("python_version", "sqlite_version", "platform", "durabl_version", "scratch_dir"):
        assert isinstance(machine[name], str) and machine[name], name
    assert machine["scratch_filesystem"] not in ("tmpfs", "ramfs")
    workload = report["workload"]
    assert workload["steps"] == 200
    assert workload["model_calls"] == workload["tool_calls"] == 100
    assert workload["durability"] == "full"
    assert workload["tool_mode"] == "AT_MOST_ONCE"
    assert 300 <= workload["tool_args_bytes"] <= 600
    for name in ("prompt_bytes", "model_answer_bytes", "tool_result_bytes"):
        assert count(workload[name]), name
    for name in ("databases", "warmup", "replay", "history_load", "resume", "resume_steps_left"):
        assert count(report["repetitions"][name]), name


def test_the_file_shrinks(report: dict[str, Any]) -> None:
    size = report["size"]
    for name in (
        "before_bytes_median",
        "after_keep_last_0_bytes_median",
        "after_keep_last_100_bytes_median",
        "unreclaimed_keep_last_0_bytes_median",
        "before_events",
        "page_size",
    ):
        assert positive(size[name]), name
    assert size["after_keep_last_0_bytes_median"] < size["before_bytes_median"]
    assert size["after_keep_last_100_bytes_median"] < size["before_bytes_median"]
    assert 0 < size["after_keep_last_0_over_before"] < 1
    assert size["after_keep_last_0_events"] < size["before_events"]
    assert positive(size["after_keep_last_0_snapshot_bytes"])
    assert size["auto_vacuum"] in (0, 2) and size["auto_vacuum_after_reclaim"] in (0, 2)
    assert isinstance(size["reclaim_path"], str) and size["reclaim_path"]


def test_compaction_time(report: dict[str, Any]) -> None:
    timing = report["compaction_time"]
    for name in (
        "keep_last_0_ms_median",
        "keep_last_0_fold_only_ms_median",
        "keep_last_0_reclaim_only_ms_median",
        "keep_last_100_ms_median",
    ):
        assert positive(timing[name]), name
    again = timing["second_compaction"]
    assert (again["steps_folded_before"], again["steps_folded_after"]) == (198, 200)
    assert positive(again["ms_median"]) and positive(again["file_bytes_median"])
    reported = timing["reported_by_compact_keep_last_0"]
    assert reported["run"]["steps_folded"] == 200
    assert positive(reported["bytes_before"]) and positive(reported["bytes_after"])


def test_replay_and_history_load_before_and_after(report: dict[str, Any]) -> None:
    for part in ("replay", "history_load"):
        assert set(report[part]) == {"before", "after_keep_last_0", "after_keep_last_100"}
        for label, section in report[part].items():
            check_timing(section, f"{part}.{label}")


def test_by_prefix_table(report: dict[str, Any]) -> None:
    rows = report["by_prefix"]
    assert [row["steps_folded"] for row in rows] == [0, 50, 100, 150, 198, 200]
    events = [row["events_kept"] for row in rows]
    assert events == sorted(events, reverse=True) and events[0] > events[-1] > 0
    assert rows[0]["snapshot_bytes"] == 0
    for row in rows:
        assert row["keep_last"] == 200 - row["steps_folded"]
        assert positive(row["file_bytes_median"])
        check_timing(row["replay"], f"by_prefix[{row['steps_folded']}].replay")
        check_timing(row["history_load"], f"by_prefix[{row['steps_folded']}].history_load")
        if row["steps_folded"]:
            assert positive(row["snapshot_bytes"]) and positive(row["compact_ms_median"])
    for name in (
        "replay_us_per_folded_step",
        "history_load_us_per_folded_step",
        "replay_minus_load_us_per_folded_step",
    ):
        assert isinstance(report["trend"][name], float), name


@pytest.mark.parametrize(("part", "left"), [("resume", 1), ("resume_with_steps_left", 20)])
def test_resume_before_and_after(report: dict[str, Any], part: str, left: int) -> None:
    resume = report[part]
    assert resume["steps_left"] == left
    for label in ("before", "after"):
        check_timing(resume[label]["resume"], f"{part}.{label}")
        for name in (
            "open_runtime_ms_median",
            "file_bytes_median",
            "lease_token_read_us_median",
        ):
            assert positive(resume[label][name]), (part, label, name)
        cycle = resume[label]["lease_cycle"]
        assert set(cycle) == {"take_lease", "renew_lease", "release_lease"}
        for op, cost in cycle.items():
            assert positive(cost["ms_median"]), (part, label, op)
            assert positive(cost["wal_bytes_median"]), (part, label, op)
        assert resume[label]["auto_vacuum"] in (0, 2)
    assert resume["before"]["steps_folded"] == 0
    assert resume["after"]["steps_folded"] == 200 - left
    assert positive(resume["after"]["compact_ms_median"])
    assert resume["after"]["events_in_log"] < resume["before"]["events_in_log"]
    assert resume["after"]["file_bytes_median"] < resume["before"]["file_bytes_median"]
    if left > 1:
        for label in ("before", "after"):
            assert isinstance(resume[label]["ms_per_executed_step"], float)


def test_replayed_state_is_the_same_and_raw_samples_are_kept(report: dict[str, Any]) -> None:
    assert report["identical_after_compaction"] == {
        "dry_replay_state": True,
        "state": True,
        "metrics": True,
        "resumed_state": True,
    }
    state = report["replayed_state"]
    assert state["status"] == "COMPLETED" and state["steps_replayed"] == 200
    assert state["result"]["iterations"] == 100
    metrics = report["metrics"]
    assert metrics["model_calls"] == metrics["tool_calls"] == 100
    assert metrics["total_tokens"] == metrics["input_tokens"] + metrics["output_tokens"] > 0
    raw = report["raw"]
    for part in ("replay_us", "history_load_us", "compact_us"):
        assert set(raw[part]) == {"0", "50", "100", "150", "198", "200"}, part
    assert len(raw["replay_us"]["0"][0]) == report["repetitions"]["replay"]
    assert set(raw["resume_us"]) == set(raw["resume_with_steps_left_us"]) == {"before", "after"}
    assert len(raw["files"]) == report["repetitions"]["databases"]
