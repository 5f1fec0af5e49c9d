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
- the side-by-side comparison with durabl 0.1.0 (``bench/results/compare.json``, from
  ``make bench-compare``), throughput under concurrency and the large-database figures
  (``bench/results/throughput.json``, ``bench/results/scale.json``, from ``make bench``);
- durabl on PostgreSQL beside SQLite and DBOS: workers, takeover and per-step cost
  (``bench/results/postgres.json``, from ``make bench``);
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
    "compare": "bench/results/compare.json",
    "throughput": "bench/results/throughput.json",
    "scale": "bench/results/scale.json",
    "postgres": "bench/results/postgres.json",
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


def _sig(x: float, digits: int = 3) -> float:
    """``x`` to ``digits`` significant figures, as the README shows it."""
    return float(f"{x:.{digits}g}")


def _sig_beside(value: float, limit: float) -> float:
    """``_sig``, with as many more figures as it takes for the value shown to fall on the same
    side of ``limit`` as the value itself: 0.2504 against a limit of 0.25 shows as 0.2504, not
    as 0.25 beside the word "missed"."""
    for digits in range(3, 8):
        shown = _sig(value, digits)
        if (shown <= limit) == (value <= limit):
            return shown
    return value


def compare() -> dict[str, Any]:
    report = _load("compare")
    f = report["figures"]
    over, floors, kill = f["per_step_overhead"], f["floors_us"], f["resume_after_kill"]

    def side_by_side(figure: dict[str, Any]) -> dict[str, Any]:
        return {
            "ours": _sig(figure["ours"]["median"]),
            "baseline": _sig(figure["baseline"]["median"]),
            "ratio": _sig(figure["ratio"]),
        }

    return {
        "timestamp": report["timestamp"],
        "full_warm_us": side_by_side(over["full"]["warm_us_per_step"]),
        "full_cold_us": side_by_side(over["full"]["cold_us_per_step"]),
        "process_warm_us": side_by_side(over["process"]["warm_us_per_step"]),
        "process_cold_us": side_by_side(over["process"]["cold_us_per_step"]),
        "fsync_commit_us": _sig(floors["warm"]["fsync_commit_us"]["median"]),
        "fsync_commit_cold_us": _sig(floors["cold"]["fsync_commit_us"]["median"]),
        "raw_commit_us": _sig(floors["warm"]["raw_commit_us"]["median"]),
        "raw_step_rows_commit_us": _sig(floors["warm"]["raw_step_rows_commit_us"]["median"]),
        "replay_warm_us": side_by_side(f["dry_replay"]["warm_us_per_served_step"]),
        "long_resume_ms": _sig(f["long_resume"]["runtime_and_resume_ms"]["ours"]["median"]),
        "long_resume_steps": f["long_resume"]["steps_completed_before_kill"],
        "resume_ms": side_by_side(kill["runtime_to_first_new_step_ms"]),
        "raw_read_ms": _sig(kill["raw_open_and_read_ms"]["ours"]["median"]),
        "import_ms": {
            k: _sig(v / 1000) if k != "ratio" else v
            for k, v in side_by_side(f["import"]["cumulative_us"]).items()
        },
        "instructions": {
            "ours": f["instructions"]["ours"]["overhead_per_step"],
            "baseline": f["instructions"]["baseline"]["overhead_per_step"],
            "ratio": f["instructions"]["ratio_overhead_per_step"],
        },
        "peers_us_per_step": {
            side.removesuffix("-full"): _sig(figure["median"])
            for side, figure in f["peers"]["us_per_step"].items()
        },
        "targets": [
            {
                **{k: t[k] for k in ("target", "limit", "met")},
                "value": _sig_beside(t["value"], t["limit"]),
            }
            for t in report["targets"]
        ],
    }


def throughput() -> dict[str, Any]:
    report = _load("throughput")
    keep = (
        "runtime", "mode", "variant", "kind", "concurrency", "processes",
        "steps_per_s_median", "commits_per_transaction_median",
    )  # fmt: skip
    cells = [{k: c.get(k) for k in keep} for c in report["cells"]]
    t = report["target"]
    return {
        "timestamp": report["timestamp"],
        "fsync_us": report["disk"]["fsync_us_median"],
        "cap_steps_per_s": report["disk"]["one_fsync_per_step_cap_steps_per_s"],
        "cells": cells,
        "target": {
            "cells": t["cells"],
            "met": t["met"],
            "shares_fsyncs": t["shares_fsyncs"],
        },
    }


def scale() -> dict[str, Any]:
    report = _load("scale")
    db = report["database"]
    return {
        "timestamp": report["timestamp"],
        "events": db["events"],
        "runs": db["runs"],
        "targets": report["targets"],
    }


def postgres() -> dict[str, Any]:
    report = _load("postgres")
    cells, server = report["cells"], report["postgres"]
    workers = [c for c in cells if c["kind"] == "workers"]
    keep = ("label", "backend", "other_host", "death", "poll_s", "lease_s", "reps", "bound")
    return {
        "timestamp": report["timestamp"],
        "server_version": server["version"].split()[0],
        "settings": {
            k: server["settings"][k]
            for k in ("synchronous_commit", "fsync", "wal_sync_method", "commit_delay")
        },
        "worker_runs": report["workload"]["worker_runs"],
        "worker_concurrency": report["workload"]["worker_concurrency"],
        "workers": {
            backend: {str(c["workers"]): c["steps_per_s_median"] for c in same}
            for backend in dict.fromkeys(c["backend"] for c in workers)
            if (same := [c for c in workers if c["backend"] == backend])
        },
        "takeover": [
            {k: c.get(k) for k in keep} | {"latency_s": _sig(c["latency_s_median"])}
            for c in cells
            if c["kind"] == "takeover" and c["measured"]
        ],
        "overhead_us": {
            c["label"]: {
                **{k: c[k] for k in ("runtime", "backend", "mode", "column")},
                "median": _sig(c["us_per_step_median"]),
                "ratio_to_floor": c["ratio_to_floor"],
            }
            for c in cells
            if c["kind"] == "overhead"
        },
        "floor_us": {c["column"]: _sig(c["us_median"]) for c in cells if c["kind"] == "floor"},
        "dbos": {k: report["dbos"].get(k) for k in ("measured", "why")},
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
        "compare": compare(),
        "throughput": throughput(),
        "scale": scale(),
        "postgres": postgres(),
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
