"""The dashboard's poll benchmark runs end to end (``--quick``) and writes what it promises.

No timing threshold: quick figures are noise. It proves the benchmark works and that both runs
were really built and read through the server (every event of the long run was loaded)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dashboard_benchmark_quick(tmp_path: Path) -> None:
    out = tmp_path / "dashboard.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.dashboard", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "dashboard" and report["quick"] is True
    long, short = report["runs"]["long"], report["runs"]["short"]
    assert (short["steps"], long["steps"]) == (10, 10_000)
    assert long["events"] == 10_000 + 2  # one TOOL_COMPLETED each, RUN_STARTED, RUN_COMPLETED
    for run in (long, short):
        for kind in ("poll_ms", "poll_one_ms"):
            assert run[kind]["n"] == report["samples"] and run[kind]["median"] > 0
    assert report["poll_long_over_short"] > 0
    assert "long/short: poll" in done.stdout
