"""Regenerate the negative-control table (SPEC §12).

Plays every deliberately wrong runtime of tests/chaos/broken_runtime.py on the schedules aimed at
its bug, and the real runtime on the union of them, through the same runner the test uses
(tests/chaos/negative_control.py). Prints the table as Markdown on stdout, writes it with every
schedule's verdict to docs/negative_control_report.json, and shows progress on stderr.

    python scripts/negative_control_report.py              # writes docs/negative_control_report.json
    python scripts/negative_control_report.py OUT.json     # writes somewhere else

Exits 1 when a broken runtime got through a schedule or the real runtime was flagged.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from chaos.negative_control import (  # noqa: E402
    CONTROL,
    Bench,
    dumps,
    measure,
    report_json,
    report_markdown,
)

DEFAULT_OUT = ROOT / "docs" / "negative_control_report.json"


def progress(variant: str, index: int, total: int, label: str) -> None:
    """On a terminal, one line rewritten per schedule; elsewhere, one line per runtime."""
    if sys.stderr.isatty():
        print(f"\r\033[K{variant}: {index}/{total} {label}"[:120], end="", file=sys.stderr)
    elif index == 1:
        print(f"{variant}: {total} schedules", file=sys.stderr)
    sys.stderr.flush()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    # A broken runtime that cannot resume a run is expected; the oracles report it in the table.
    logging.getLogger("durabl").setLevel(logging.CRITICAL)
    tmpfs = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    scratch = Path(tempfile.mkdtemp(prefix="durabl-negative-", dir=tmpfs))
    try:
        reports = measure(Bench(scratch), progress)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    data = report_json(reports)
    out.write_text(dumps(data), encoding="utf-8")
    print(report_markdown(reports))
    totals = data["totals"]
    print(
        f"\n{totals['broken_flagged']} of {totals['broken_scenarios']} broken-runtime scenarios "
        f"flagged; the real runtime flagged {totals['control_flagged']} times out of "
        f"{totals['control_scenarios']}. Wrote {out}.",
        file=sys.stderr,
    )
    escaped = [
        f"{r.variant.name}: {o.schedule.label}"
        for r in reports
        if r.variant is not CONTROL
        for o in r.outcomes
        if not o.flagged
    ]
    wrongly = [
        f"{o.schedule.label}: {o.flags}"
        for r in reports
        if r.variant is CONTROL
        for o in r.outcomes
        if o.flagged
    ]
    for line in escaped:
        print(f"NOT FLAGGED: {line}", file=sys.stderr)
    for line in wrongly:
        print(f"REAL RUNTIME FLAGGED: {line}", file=sys.stderr)
    return 1 if escaped or wrongly else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
