"""One small bench run (durabl and the plain loop, real processes, real SIGKILLs) shared by the
tests of this folder; each test that changes receipts works on its own copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KEY = "durability-bench-test-key-0001"
KILLS = 21
"""Three kills in each of the seven cells with arrivals (durabl: four windows; plain: no WRITE)."""


def bench(
    *args: str, key: str | None = KEY, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "DURABL_BENCH_KEY"}
    if key is not None:
        full_env["DURABL_BENCH_KEY"] = key
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "durabl.bench", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=600,
    )


@pytest.fixture(scope="session")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench") / "out"
    done = bench(
        "--runtimes",
        "durabl,plain",
        "--kills",
        str(KILLS),
        "--calibration",
        "2",
        "--seed",
        "7",
        "--quiet",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture
def run_copy(small_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(small_run, copy)
    return copy


def leaderboard(out: Path) -> dict:
    return json.loads((out / "leaderboard.json").read_text())
