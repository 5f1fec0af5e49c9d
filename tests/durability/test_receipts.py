"""Receipts: a changed byte, a moved, dropped or added receipt and another key are each caught
with one line; the key never lies beside the receipts."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from durabl.bench import seal

from .conftest import bench


def one_kill(out: Path, **how: Any) -> subprocess.CompletedProcess[str]:
    """The smallest bench run: one clean run and one kill of the plain loop."""
    one = ("--runtimes", "plain", "--windows", "EXEC", "--kills", "1", "--calibration", "1")
    return bench(*one, "--quiet", "--out", str(out), **how)


def receipts(out: Path) -> list[Path]:
    return list(seal.receipt_files(out / "receipts"))


def rejected(out: Path, *, key: str | None = None) -> list[str]:
    done = bench("verify", str(out), **({"key": key} if key else {}))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("REJECTED")]
    assert lines, done.stdout
    return lines


def test_an_untouched_run_verifies(small_run: Path) -> None:
    done = bench("verify", str(small_run))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(receipts(small_run))} receipts" in done.stdout


@pytest.mark.parametrize("where", ["body", "seal", "whitespace"])
def test_any_changed_byte_is_rejected(run_copy: Path, where: str) -> None:
    target = receipts(run_copy)[5]
    data = bytearray(target.read_bytes())
    if where == "body":
        i = data.index(b'"exit":') + len(b'"exit":')
        data[i : i + 1] = b"7" if data[i : i + 1] != b"7" else b"8"
    elif where == "seal":
        i = data.index(b'"mac":"') + len(b'"mac":"')
        data[i : i + 1] = b"0" if data[i : i + 1] != b"0" else b"1"
    else:
        data[1:1] = b" "
    target.write_bytes(bytes(data))
    assert rejected(run_copy) == [
        f"REJECTED {target.name}: " + rejected(run_copy)[0].split(": ", 1)[1]
    ]
    assert "changed after sealing" in rejected(run_copy)[0]


def test_reordered_receipts_are_rejected(run_copy: Path) -> None:
    a, b = receipts(run_copy)[2], receipts(run_copy)[3]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    lines = rejected(run_copy)
    assert any(a.name in line and "moved or reordered" in line for line in lines)


def test_a_deleted_receipt_is_rejected(run_copy: Path) -> None:
    gone = receipts(run_copy)[4]
    gone.unlink()
    assert any(gone.name in line and "missing" in line for line in rejected(run_copy))


def test_a_deleted_last_receipt_is_rejected(run_copy: Path) -> None:
    gone = receipts(run_copy)[-1]
    gone.unlink()
    assert any(gone.name in line and "missing" in line for line in rejected(run_copy))


def test_an_added_receipt_is_rejected(run_copy: Path) -> None:
    last = receipts(run_copy)[-1]
    extra = last.with_name(seal.receipt_name(len(receipts(run_copy)) + 1))
    extra.write_bytes(last.read_bytes())
    assert any(extra.name in line and "not in the manifest" in line for line in rejected(run_copy))


def test_a_receipt_from_another_run_is_rejected(
    run_copy: Path, tmp_path: Path, small_run: Path
) -> None:
    other = tmp_path / "other"
    done = one_kill(other)
    assert done.returncode == 0, done.stderr
    target = receipts(run_copy)[0]
    target.write_bytes(receipts(other)[0].read_bytes())
    assert any(
        target.name in line and "belongs to bench run" in line for line in rejected(run_copy)
    )


def test_another_key_is_rejected_with_its_key_id(small_run: Path) -> None:
    lines = rejected(small_run, key="a-different-key-of-enough-length")
    assert len(lines) == 1 and "sealed with another key" in lines[0]


def test_report_refuses_receipts_that_do_not_verify(run_copy: Path) -> None:
    receipts(run_copy)[1].unlink()
    (run_copy / "leaderboard.md").unlink()
    done = bench("report", str(run_copy))
    assert done.returncode == 1
    assert "no leaderboard written" in done.stderr
    assert not (run_copy / "leaderboard.md").exists()


def test_the_key_file_is_made_0600_outside_the_output_folder(tmp_path: Path) -> None:
    config = tmp_path / "config"
    out = tmp_path / "out"
    done = one_kill(out, key=None, env={"XDG_CONFIG_HOME": str(config)})
    assert done.returncode == 0, done.stderr
    key_file = config / "durabl" / "bench.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert not any(p.name == "bench.key" for p in out.rglob("*"))
    assert bench("verify", str(out), key=None, env={"XDG_CONFIG_HOME": str(config)}).returncode == 0


def test_a_key_file_inside_the_output_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = bench("--kills", "1", "--out", str(out), "--key-file", str(out / "k"), key=None)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "inside the output folder" in done.stderr
    assert not out.exists()


def test_a_key_file_others_can_read_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "bench.key"
    key_file.write_text("0123456789abcdef0123456789abcdef\n")
    os.chmod(key_file, 0o644)
    done = bench(
        "--kills", "1", "--out", str(tmp_path / "out"), "--key-file", str(key_file), key=None
    )
    assert done.returncode == 2 and "chmod 600" in done.stderr
