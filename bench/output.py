"""What every benchmark shares: its command line, its scratch folder, and writing its results
to one JSON file, replaced atomically."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(name: str, doc: str | None, quick: str, argv: Sequence[str] | None) -> Any:
    """The options every benchmark takes: --out (default bench/results/NAME.json), --quick
    (described by ``quick``), --tmp-dir and --keep."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=(doc or "").split("\n")[0]
    )
    parser.add_argument(
        "--out", default=str(RESULTS / f"{name}.json"), help="where to write the JSON figures"
    )
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--tmp-dir", help="directory (on a real disk) for the scratch databases")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    return parser.parse_args(argv)


def release_scratch(work: Path, keep: bool) -> None:
    """Remove the scratch folder, or say where it was kept."""
    if keep:
        print(f"scratch databases kept in {work}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(work, ignore_errors=True)


def write_json(path: str | Path, report: dict[str, Any]) -> Path:
    """Write ``report`` to ``path``: temp file, fsync, rename, fsync the directory, so that a
    crash mid-write leaves the previous results rather than half a file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(report, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    directory = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return out
