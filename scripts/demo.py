"""The demo `make demo` runs: an agent killed with SIGKILL, resumed from its log, and finished by
a third process once its durable timer is due.

    python scripts/demo.py [--kill-after N] [--keep DIR]

The research agent (``examples/research_agent.py``) runs in child processes against one database:

1. the first process is killed with a real SIGKILL inside step N (``--kill-after``, default 3,
   the second search), the moment the search tool says it is running. The search is IDEMPOTENT
   with a derived key, so its attempt is committed in one transaction once it returns: the kill
   leaves nothing of step N in the log, which ends with step N-1's completion;
2. a second process resumes the run from the log: the steps before N are served from it, step N
   runs again from its start, and the run parks on its durable timer; this process exits;
3. once the timer is due, a third process fires it and finishes the run.

Then it prints ``durabl show --trace`` (which steps came from the log and which ran, and where
the process boundaries are) and the email outbox, which holds exactly one line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from durabl import DurablError, events
from durabl.store.sqlite import SQLiteStore

REPO = Path(__file__).resolve().parent.parent
AGENT = REPO / "examples" / "research_agent.py"
RUN_ID = "demo-run"
SEARCHES = (2, 3, 4)
"""The steps of the research agent that are tool calls to its search tool."""


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def log_of(db: Path) -> list[events.Event]:
    try:
        store = SQLiteStore(db, read_only=True)
    except (DurablError, FileNotFoundError):  # not created yet, or being created
        return []
    try:
        return store.load_log(RUN_ID)
    finally:
        store.close()


def run_until_searching(command: list[str], db: Path, step: int) -> int:
    """Start the agent and SIGKILL it while its search tool runs step ``step``; returns its pid.

    The tool prints a line as it begins, then sleeps for the step delay: the kill lands in that
    sleep. Then the log must end with step ``step - 1``'s completion, holding nothing of step
    ``step``; otherwise the search returned first, and the kill did not land where this demo
    says it did."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(30, proc.kill)
    watchdog.start()
    try:
        searches = 0
        while searches < SEARCHES.index(step) + 1:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"the agent ended before step {step} began its search")
            searches += "search running" in line
    finally:
        watchdog.cancel()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
    last = log_of(db)[-1]
    if last.kind not in (events.STEP_COMPLETED, events.TOOL_COMPLETED) or last.step != step - 1:
        raise SystemExit(f"the kill missed the search of step {step}: the log ends with {last}")
    return proc.pid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--kill-after",
        type=int,
        choices=SEARCHES,
        default=3,
        metavar="N",
        help="the step to kill the first process in: a search, 2, 3 or 4 (default 3)",
    )
    parser.add_argument("--keep", type=Path, help="keep the database and outbox in this folder")
    args = parser.parse_args(argv)
    folder = Path(tempfile.mkdtemp(prefix="durabl-demo-"))
    db, outbox = folder / "agent.db", folder / "outbox.log"
    agent = [sys.executable, str(AGENT), "--db", str(db), "--outbox", str(outbox)]
    try:
        say(f"process 1: the research agent, SIGKILLed inside step {args.kill_after} (a search)")
        pid = run_until_searching([*agent, "--fresh", "--step-delay", "0.5"], db, args.kill_after)
        print(f"killed pid {pid} with SIGKILL while its search tool was running")
        print(
            f"the log ends with step {args.kill_after - 1}'s completion: the search is IDEMPOTENT "
            f"with a derived key, recorded in one commit once it returns, so nothing of step "
            f"{args.kill_after} was written"
        )
        say("process 2: the same command again; it resumes from the log, then parks on its timer")
        second = subprocess.run(
            [*agent, "--no-wait", "--step-delay", "0.05"], capture_output=True, text=True
        )
        print(second.stdout.strip())
        wake_at_s = SQLiteStore(db, read_only=True).get_run(RUN_ID).wake_at_s  # type: ignore[union-attr]
        wait_s = max(0.0, (wake_at_s or 0.0) - time.time()) + 0.1
        say(f"no process runs the agent now; the durable timer is due in {wait_s:.1f} s")
        time.sleep(wait_s)
        say("process 3: picks the due timer up and finishes the run")
        third = subprocess.run([*agent, "--step-delay", "0.05"], capture_output=True, text=True)
        print(third.stdout.strip())
        say(
            "durabl show --trace: which steps came from the log, which ran, where processes changed"
        )
        trace = subprocess.run(
            [sys.executable, "-m", "durabl", "--db", str(db), "show", RUN_ID, "--trace"],
            capture_output=True,
            text=True,
        )
        print(trace.stdout.strip())
        say(f"the email outbox ({outbox.name})")
        lines = outbox.read_text().splitlines()
        for line in lines:
            record = json.loads(line)
            print(f"  to {record['to']}: {record['subject']!r} (key {record['idempotency_key']})")
        print(f"{len(lines)} line(s): one email, whatever was killed")
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for path in folder.iterdir():
                shutil.copy2(path, args.keep / path.name)
            print(f"\nkept in {args.keep}: durabl --db {args.keep / 'agent.db'} ui")
        done = third.returncode == 0 and len(lines) == 1
        return 0 if done else 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
