"""`import durabl` pulls in nothing the first Runtime.start does not need: no network stack, no
command line, no dashboard, no benchmark."""

from __future__ import annotations

import subprocess
import sys

NOT_NEEDED = (
    "urllib.request", "http.client", "ssl", "rich",
    "durabl.cli", "durabl.ui", "durabl.bench",
)  # fmt: skip


def test_import_durabl_stays_light() -> None:
    probe = f"import durabl, sys; print(' '.join(m for m in {NOT_NEEDED!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []
