"""Writing a benchmark's results: one JSON file, replaced atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


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
