"""Draw ``docs/img/dashboard.png``: the dashboard showing the demo run after a kill and a
timer-driven resume.

    python scripts/screenshot.py [--out docs/img/dashboard.png] [--width 1280]

The research agent (``examples/research_agent.py``) runs in a child process and is SIGKILLed
inside its second search; a second process resumes it from the log and is SIGKILLed while the
run sleeps on its durable timer; a third process, started once the timer is due, fires it and
finishes the run. ``durabl ui`` then serves the database and the system's Chromium (through
playwright) takes the picture once the page shows the run completed.
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from durabl import DurablError, events
from durabl.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "examples" / "research_agent.py"
RUN_ID = "demo-run"


def kinds(db: Path) -> list[tuple[str, int]]:
    try:
        store = SQLiteStore(db, read_only=True)
    except (DurablError, FileNotFoundError):  # not there yet, or still being created
        return []
    try:
        return [(e.kind, e.step) for e in store.load_log(RUN_ID)]
    finally:
        store.close()


def kill_when(command: list[str], db: Path, reached: tuple[str, int]) -> None:
    """Start ``command`` and SIGKILL it the moment the run's log holds ``reached``."""
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while reached not in kinds(db):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the agent ended before the log held {reached}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "img" / "dashboard.png")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        db, outbox = Path(tmp) / "agent.db", Path(tmp) / "outbox.log"
        agent = [sys.executable, str(AGENT), "--db", str(db), "--outbox", str(outbox)]
        # the first search (step 2) recorded: the agent is inside the second, which writes
        # nothing until it returns (an IDEMPOTENT call's attempt and result are one event)
        kill_when([*agent, "--fresh", "--step-delay", "0.5"], db, (events.TOOL_COMPLETED, 2))
        kill_when([*agent, "--step-delay", "0.1"], db, (events.TIMER_ARMED, 5))
        time.sleep(2.5)  # the timer is due now; the next process fires it
        subprocess.run([*agent, "--step-delay", "0.1"], check=True, capture_output=True)
        ui = subprocess.Popen(
            [sys.executable, "-m", "durabl", "--db", str(db), "ui", "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert ui.stdout is not None
            url = re.search(r"http://\S+/", ui.stdout.readline())
            if url is None:
                raise SystemExit("durabl ui did not start")
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path="/usr/bin/chromium", args=["--no-sandbox"]
                )
                page = browser.new_page(viewport={"width": args.width, "height": 900})
                page.goto(f"{url.group(0)}#run={RUN_ID}")
                page.wait_for_selector("#run-status:has-text('COMPLETED')", timeout=15_000)
                page.wait_for_selector("#runs tbody tr:has-text('COMPLETED')", timeout=15_000)
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
                browser.close()
        finally:
            ui.send_signal(signal.SIGTERM)
            ui.communicate(timeout=10)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
