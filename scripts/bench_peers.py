"""Build every peer's virtualenv from its pinned requirements, then run the full benchmark.

    python scripts/bench_peers.py [--out bench/results/durability] [--kills 500] [--only-venvs]

Each peer gets ``.bench-venvs/<name>`` from ``bench/peers/<name>.txt``; a virtualenv whose
requirements have not changed since it was built is kept. A peer that fails to install gets an
``UNAVAILABLE`` file holding the end of pip's error, and the benchmark reports it as "not
measured" with that reason. The bench writes into a new folder that replaces ``--out`` only when
the run succeeded, so a failed run leaves the last results in place.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEERS = REPO / "bench" / "peers"
VENVS = REPO / ".bench-venvs"
STAMP = ".requirements-sha256"


def build(name: str, requirements: Path) -> str:
    """Make ``.bench-venvs/<name>``; returns a one-word status."""
    venv = VENVS / name
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    stamp = venv / STAMP
    if stamp.exists() and stamp.read_text().strip() == digest:
        return "up to date"
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run([*pip, "-r", str(requirements)], capture_output=True, text=True)
    if done.returncode != 0:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        (venv / "UNAVAILABLE").write_text(f"pip install -r {requirements.name} failed: {tail}\n")
        return "FAILED"
    stamp.write_text(digest + "\n")
    return "built"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "durability")
    parser.add_argument("--kills", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only-venvs", action="store_true", help="build the virtualenvs and stop")
    parser.add_argument(
        "--peer", action="append", help="with --only-venvs: build only this one (repeatable)"
    )
    args = parser.parse_args(argv)
    VENVS.mkdir(exist_ok=True)
    for requirements in sorted(PEERS.glob("*.txt")):
        name = requirements.stem
        if args.peer and name not in args.peer:
            continue
        print(f"{name:<10} {build(name, requirements)}", flush=True)
    if args.only_venvs:
        return 0
    if args.peer:
        parser.error("--peer builds virtualenvs only: give --only-venvs too")
    fresh = args.out.with_name(args.out.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    bench = [
        sys.executable, "-m", "durabl.bench", "--full-matrix", "--kills", str(args.kills),
        "--seed", str(args.seed), "--venvs", str(VENVS), "--out", str(fresh),
    ]
    code = subprocess.run(bench, cwd=REPO).returncode
    if code != 0:
        print(f"bench failed (exit {code}); {args.out} left as it was", file=sys.stderr)
        return code
    shutil.rmtree(fresh / "trials", ignore_errors=True)
    shutil.rmtree(args.out, ignore_errors=True)
    fresh.rename(args.out)
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
