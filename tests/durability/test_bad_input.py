"""Every mistake a user can make on the command line: one line on stderr, exit code 2, nothing
written."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import bench


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--runtimes", "durabl,nope"], "unknown runtime 'nope'; known: durabl, plain"),
        (["--windows", "EXEC,NAP"], "unknown window 'NAP'; known: PROMPT, EXEC, WRITE, VERIFY"),
        (["--kills", "0"], "--kills must be at least 1, got 0"),
        (["--kills", "many"], "invalid int value: 'many'"),
        (["--full-matrix", "--runtimes", "plain"], "give it or --runtimes, not both"),
        (["--runtimes", "langgraph-sync", "--venvs", "VENVS"], "needs the virtualenv"),
        (["--no-such-option"], "unrecognized arguments: --no-such-option"),
    ],
)
def test_bad_run_options(tmp_path: Path, args: list[str], says: str) -> None:
    out = tmp_path / "out"
    args = [a.replace("VENVS", str(tmp_path / "venvs")) for a in args]
    done = bench(*args, "--out", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith("durabl bench: ") and done.stderr.count("\n") == 1
    assert says in done.stderr
    assert not out.exists()


def test_a_folder_with_receipts_of_another_run_is_not_overwritten(small_run: Path) -> None:
    before = {p: p.read_bytes() for p in small_run.rglob("*") if p.is_file()}
    done = bench("--kills", "1", "--out", str(small_run))
    assert done.returncode == 2
    assert "already holds" in done.stderr and "nothing was overwritten" in done.stderr
    assert {p: p.read_bytes() for p in small_run.rglob("*") if p.is_file()} == before


def test_verifying_without_a_key(small_run: Path, tmp_path: Path) -> None:
    done = bench("verify", str(small_run), key=None, env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert done.returncode == 2
    assert "no key to verify with" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.parametrize("command", ["verify", "report"])
def test_a_folder_without_receipts(command: str, tmp_path: Path) -> None:
    done = bench(command, str(tmp_path))
    assert done.returncode == 2 and "holds no receipts" in done.stderr


def test_durabl_bench_is_the_same_command(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "durabl", "bench", "--windows", "NAP", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "unknown window 'NAP'" in done.stderr
