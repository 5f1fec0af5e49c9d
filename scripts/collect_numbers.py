"""Collect every figure the README quotes into one file, ``docs/numbers.json``.

    python scripts/collect_numbers.py [--out docs/numbers.json]

Each figure is measured here or read from the report of the script that measured it, and the
file names its source:

- the test count (``pytest --collect-only``);
- the lines and modules of the package (counted here);
- the chaos grid and the negative control (``docs/chaos_report.json``,
  ``docs/negative_control_report.json``, from ``scripts/chaos_report.py`` and
  ``scripts/negative_control_report.py``);
- the per-step cost and resume figures (``bench/results/w40.json``, from ``make bench``);
- the dashboard's poll (``bench/results/dashboard.json``);
- the durability leaderboard (``bench/results/durability/leaderboard.json``, from
  ``make bench-peers``).

``scripts/build_readme.py`` renders README.md from ``docs/README.template.md`` with them, and a
test fails when the README, this file and the sources disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "durabl"
FRONT_ENDS = ("cli", "bench", "ui")
"""Packages of durabl that are not the runtime: the command line, the benchmark, the dashboard."""
SOURCES = {
    "chaos": "docs/chaos_report.json",
    "negative_control": "docs/negative_control_report.json",
    "w40": "bench/results/w40.json",
    "dashboard": "bench/results/dashboard.json",
    "leaderboard": "bench/results/durability/leaderboard.json",
}


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((REPO / SOURCES[name]).read_text())
    return data


def test_count() -> int:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    found = re.search(r"^(\d+) tests? collected", done.stdout, re.MULTILINE)
    if found is None:
        raise SystemExit(f"pytest --collect-only gave no count:\n{done.stdout[-2000:]}")
    return int(found.group(1))


def _code_lines(path: Path) -> int:
    """Lines that are neither blank nor only a comment."""
    return sum(
        1
        for line in path.read_text().splitlines()
        if line.strip() and not line.strip().startswith("#")
    )


def code() -> dict[str, Any]:
    modules = sorted(PACKAGE.rglob("*.py"))
    runtime = [m for m in modules if m.relative_to(PACKAGE).parts[0] not in FRONT_ENDS]
    return {
        "runtime_modules": len(runtime),
        "runtime_lines": sum(_code_lines(m) for m in runtime),
        "package_modules": len(modules),
        "package_lines": sum(_code_lines(m) for m in modules),
    }


def chaos() -> dict[str, Any]:
    report = _load("chaos")
    return {
        key: report[key]
        for key in ("grid", "scenarios", "deaths", "skipped", "duplicates", "divergences")
    } | {"crash_points": len(report["crash_points"]), "workflows": len(report["workflows"])}


def negative_control() -> dict[str, Any]:
    report = _load("negative_control")
    rows = [
        {k: row[k] for k in ("variant", "bug", "scenarios", "flagged")} for row in report["rows"]
    ]
    return {"totals": report["totals"], "rows": rows}


def w40() -> dict[str, Any]:
    report = _load("w40")
    return {
        "steps": report["workload"]["steps"],
        "full_ms_per_step": report["overhead"]["full"]["overhead_ms_per_step_median"],
        "process_ms_per_step": report["overhead"]["process"]["overhead_ms_per_step_median"],
        "fsync_us": report["machine"]["fsync_us_median"],
        "replay_us_per_step": report["replay"]["dry_replay"]["us_per_served_step_median"],
        "resume_ms": report["replay"]["resume_full"]["call_ms_median"],
        "timestamp": report["timestamp"],
    }


def dashboard() -> dict[str, Any]:
    report = _load("dashboard")
    runs = report["runs"]
    return {
        "short_steps": runs["short"]["steps"],
        "long_steps": runs["long"]["steps"],
        "short_poll_ms": runs["short"]["poll_ms"]["median"],
        "long_poll_ms": runs["long"]["poll_ms"]["median"],
        "ratio": report["poll_long_over_short"],
    }


def leaderboard() -> dict[str, Any]:
    board = _load("leaderboard")
    keep = (
        "id", "label", "version", "mechanism", "kills", "recovered", "recovery_rate",
        "recovery_ci95", "held", "stalled", "failed", "wrong", "duplicated", "duplicate_effects",
        "orphans", "resume_ms_median", "token_waste", "overhead_ms",
    )  # fmt: skip
    return {
        "bench_run": board["bench_run"],
        "kills": board["kills"],
        "receipts": board["receipts"],
        "rows": [{k: row[k] for k in keep} for row in board["rows"]],
        "not_measured": board["not_measured"],
    }


def collect(*, tests: bool = True) -> dict[str, Any]:
    numbers: dict[str, Any] = {
        "sources": SOURCES,
        "code": code(),
        "chaos": chaos(),
        "negative_control": negative_control(),
        "w40": w40(),
        "dashboard": dashboard(),
        "leaderboard": leaderboard(),
    }
    if tests:
        numbers["tests"] = {"count": test_count()}
    return numbers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "numbers.json")
    args = parser.parse_args(argv)
    numbers = collect()
    args.out.write_text(json.dumps(numbers, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
