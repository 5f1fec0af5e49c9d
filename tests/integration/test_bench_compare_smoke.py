"""The side-by-side benchmark (``make bench-compare``) runs end to end and writes every figure.

It runs ``--quick`` with this interpreter on both sides (``--baseline-python``), so it needs no
0.1.0 virtualenv, and with this durabl's throughput probe, in process mode, as the one peer
(``--peers durabl``), so it needs no peer's either. No timing thresholds: quick figures are noise. It checks that every figure is
there, that each ratio is the quotient of the two medians written beside it, and that those
medians come from the raw samples in the same file.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SIDES = ("ours", "baseline")
STEPS = 41


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("compare") / "compare.json"
    command = [sys.executable, "-m", "bench.compare", "--quick", "--out", str(out)]
    proc = subprocess.run(
        [*command, "--baseline-python", sys.executable, "--peers", "durabl"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(out.read_text(encoding="utf-8")), proc.stdout


@pytest.fixture(scope="module")
def report(run: tuple[dict[str, Any], str]) -> dict[str, Any]:
    return run[0]


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def check_side_by_side(figure: dict[str, Any], where: str) -> None:
    for side in SIDES:
        for name in ("median", "p95", "min", "max"):
            assert isinstance(figure[side][name], int | float), f"{where}.{side}.{name}"
        assert figure[side]["n"] >= 1, where
        assert figure[side]["min"] <= figure[side]["median"] <= figure[side]["max"], where
    expected = figure["ours"]["median"] / figure["baseline"]["median"]
    assert figure["ratio"] == pytest.approx(expected, rel=1e-3, abs=1e-4), where


def test_header_and_machine(report: dict[str, Any]) -> None:
    assert report["benchmark"] == "compare"
    assert report["quick"] is True
    assert positive(report["elapsed_s"])
    machine = report["machine"]
    assert positive(machine["cpu_count"])
    assert machine["scratch_filesystem"] not in ("tmpfs", "ramfs", "unknown")
    assert machine["git_commit"] is None or isinstance(machine["git_commit"], str)
    for side in SIDES:
        info = machine["sides"][side]
        for name in ("python", "python_version", "sqlite_version", "durabl_version"):
            assert isinstance(info[name], str) and info[name], (side, name)
        assert info["has_dry_replay"] is True
    assert report["workload"] == {
        "steps": 41,
        "model_calls": 1,
        "tool_calls": 40,
        "tool_mode": "IDEMPOTENT",
    }


def test_overhead_figures_come_from_the_samples(report: dict[str, Any]) -> None:
    figures, plan = report["figures"]["per_step_overhead"], report["plan"]
    probes = report["samples"]["w40_probes"]
    warm_from = 1 + plan["warmup_pairs"]
    for mode in ("full", "process"):
        for name in (
            "cold_us_per_step",
            "warm_us_per_step",
            "warm_run_ms",
            "plain_loop_us_per_step",
            "runtime_construct_ms",
        ):
            check_side_by_side(figures[mode][name], f"{mode}.{name}")
        for side in SIDES:
            mine = [p for p in probes if p["mode"] == mode and p["side"] == side]
            assert len(mine) == plan["rounds"]
            warm = [
                (w - b) / STEPS
                for p in mine
                for w, b in list(zip(p["run_us"], p["plain_us"], strict=True))[warm_from:]
            ]
            figure = figures[mode]["warm_us_per_step"][side]
            assert figure["n"] == len(warm) == plan["rounds"] * plan["warm_pairs"][mode]
            assert figure["median"] == pytest.approx(statistics.median(warm), abs=1e-3)
            cold = [(p["run_us"][0] - p["plain_us"][0]) / STEPS for p in mine]
            assert figures[mode]["cold_us_per_step"][side]["median"] == pytest.approx(
                statistics.median(cold), abs=1e-3
            )


def test_floors(report: dict[str, Any]) -> None:
    floors, plan = report["figures"]["floors_us"], report["plan"]
    commits = {"warm": plan["floor_commits"], "cold": max(1, plan["floor_commits"] // 3)}
    for phase, per_probe in commits.items():
        for name in (
            "fsync_commit_us",
            "fsync_two_commits_us",
            "raw_commit_us",
            "raw_two_commits_us",
        ):
            figure = floors[phase][name]
            assert positive(figure["median"]) and positive(figure["p95"]), (phase, name)
            assert figure["n"] == 2 * plan["rounds"] * per_probe, (phase, name)
            assert set(figure["median_by_side"]) == set(SIDES)
    assert all(200 <= size <= 300 for size in floors["row_payload_bytes"])
    # The warm floors were taken once each probe's WAL had started over, which takes commits.
    assert all(filled > 0 for filled in floors["fill_commits_to_restart_the_wal"])


PROBES_OF = {"long_resume": "long_resume_probes", "resume_after_kill": "kill_resume_probes"}


def test_replay_and_resume_figures(report: dict[str, Any]) -> None:
    figures = report["figures"]
    replay = figures["dry_replay"]
    assert replay["steps"] == report["plan"]["replay_steps"]
    for name in ("cold_us_per_served_step", "warm_us_per_served_step"):
        check_side_by_side(replay[name], f"dry_replay.{name}")
    for part in ("long_resume", "resume_after_kill"):
        section = figures[part]
        for name in (
            "runtime_to_first_new_step_ms",
            "runtime_and_resume_ms",
            "runtime_construct_ms",
            "raw_open_and_read_ms",
            "raw_open_and_read_after_resume_ms",
        ):
            check_side_by_side(section[name], f"{part}.{name}")
        for side in SIDES:
            assert all(positive(rows) for rows in section["raw_rows"][side])
            over = section["first_new_step_over_raw_read"][side]
            first = section["runtime_to_first_new_step_ms"][side]["median"]
            raw = section["raw_open_and_read_ms"][side]["median"]
            assert over == pytest.approx(first / raw, rel=1e-3)
        # The floor is read in a process of its own, apart from the resume's probe: every
        # probe has one of each, and they differ.
        probes = report["samples"][PROBES_OF[part]]
        assert all(p["raw_read_us"] != p["raw_read_in_process_us"] for p in probes)
    assert figures["long_resume"]["steps_completed_before_kill"] == report["plan"]["long_steps"]
    assert figures["resume_after_kill"]["killed_on_entry_to_tool_call"] == 21


def test_import_and_instructions(report: dict[str, Any]) -> None:
    figures = report["figures"]
    check_side_by_side(figures["import"]["cumulative_us"], "import.cumulative_us")
    for side in SIDES:
        samples = report["samples"]["import_cumulative_us"][side]
        assert len(samples) == report["plan"]["import_reps"]
        assert figures["import"]["cumulative_us"][side]["median"] == statistics.median(samples)
    counted = figures["instructions"]
    for side in SIDES:
        w40, plain = counted[side]["w40_per_step"], counted[side]["plain_loop_per_step"]
        assert positive(w40) and positive(plain) and w40 > plain, side
        assert counted[side]["overhead_per_step"] == w40 - plain
        for section in report["samples"]["callgrind_sections"][side]:
            assert len(section["dumps"]) == 1, section
    expected = counted["ours"]["w40_per_step"] / counted["baseline"]["w40_per_step"]
    assert counted["ratio_w40_per_step"] == pytest.approx(expected, rel=1e-3)


def test_the_peers_are_measured_beside_durabl(run: tuple[dict[str, Any], str]) -> None:
    report, printed = run
    peers = report["figures"]["peers"]
    samples = report["samples"]["peer_us_per_step"]
    assert set(samples) == {"durabl-full", "durabl"}
    for side, figure in peers["us_per_step"].items():
        assert figure["median"] == statistics.median(samples[side]) and positive(figure["median"])
    expected = (
        peers["us_per_step"]["durabl-full"]["median"] / peers["us_per_step"]["durabl"]["median"]
    )
    assert peers["ratio_durabl_over"]["durabl"] == pytest.approx(expected, rel=1e-3)
    assert "W40 against the peers" in printed


def test_a_missing_peer_is_one_line_naming_make_bench_peers(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare",
            "--quick",
            "--baseline-python",
            sys.executable,
            "--peers",
            "nosuchpeer",
            "--out",
            str(tmp_path / "compare.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "nosuchpeer" in last and "make bench-peers" in last
    assert not (tmp_path / "compare.json").exists()


def test_targets_and_table(run: tuple[dict[str, Any], str]) -> None:
    report, printed = run
    targets = report["targets"]
    assert len(targets) == 14
    for t in targets:
        assert isinstance(t["met"], bool) and t["met"] == (t["value"] <= t["limit"]), t
        assert t["target"] in printed
    by_name = {t["target"]: t for t in targets}
    process = report["figures"]["per_step_overhead"]["process"]["warm_us_per_step"]
    assert by_name["process per-step overhead (warm) / 0.1.0's"]["value"] == process["ratio"]
    floors = report["figures"]["floors_us"]
    step_rows = by_name["process per-step overhead (warm) / one raw commit of the step's rows"]
    raw_step_rows = floors["warm"]["raw_step_rows_commit_us"]["median"]
    assert step_rows["value"] == round(process["ours"]["median"] / raw_step_rows, 4)
    for line in printed.splitlines():
        if line.startswith(tuple(by_name)):
            assert line.rstrip().endswith(("met", "missed")), line


def test_a_missing_baseline_venv_is_one_line_naming_make_bench_peers(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare",
            "--quick",
            "--baseline-venv",
            str(tmp_path / "absent"),
            "--out",
            str(tmp_path / "compare.json"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    assert "make bench-peers" in proc.stderr
    assert not (tmp_path / "compare.json").exists()
