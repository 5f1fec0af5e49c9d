"""examples/research_agent.py, run as a real process: interrupted with SIGINT, run again.

The promise under test is the README's: Ctrl-C the example anywhere, run it again, and the run
completes with exactly one line in the email outbox. Each interrupted process is stopped while
it sits inside a tool (a long --step-delay or --email-delay keeps it there), so where the
interrupt lands does not depend on timing; the process that finishes runs with no delay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from durabl import events
from durabl.errors import StorageError
from durabl.events import Event
from durabl.store import SQLiteStore

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "research_agent.py"
RUN_ID = "demo-run"
EMAIL_STEP = 8
"""Position of the send_email step: plan, three searches, Sleep, summary, ctx.now(), email."""

LONG_DELAY = "600"
"""Step delay for a process that is going to be interrupted: it is inside a tool call until the
SIGINT arrives (KeyboardInterrupt cuts the sleep short, so the test does not wait for it)."""


def example(db: Path, outbox: Path, *extra: str) -> list[str]:
    return [sys.executable, str(EXAMPLE), "--db", str(db), "--outbox", str(outbox), *extra]


def read_log(db: Path) -> list[Event]:
    """The run's log as another process sees it right now; empty until there is one."""
    if not db.exists():
        return []
    try:
        store = SQLiteStore(db, read_only=True)
    except StorageError:  # the file exists but is not initialised yet
        return []
    try:
        return store.load_log(RUN_ID)
    finally:
        store.close()


def run_status(db: Path) -> str:
    store = SQLiteStore(db, read_only=True)
    try:
        row = store.get_run(RUN_ID)
        assert row is not None
        return row.status
    finally:
        store.close()


def interrupt_when(proc: subprocess.Popen[str], ready: Callable[[], bool]) -> str:
    """Wait until ``ready()`` (the process is then blocked inside a tool), send SIGINT and
    return the process's output. Fails if the process ends before it got there."""
    while not ready():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the example ended before the interrupt:\n{out}\n{err}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate()
    assert proc.returncode == 130, f"expected an interrupted exit:\n{out}\n{err}"
    assert "interrupted" in out
    return out


def printed(proc: subprocess.Popen[str], text: str) -> Callable[[], bool]:
    """True once the process has written a line containing ``text`` (its stdout must be
    unbuffered). A line is read per call, so it blocks until the process writes or exits."""
    assert proc.stdout is not None
    stdout = proc.stdout
    return lambda: text in stdout.readline()


def finish(db: Path, outbox: Path) -> str:
    proc = subprocess.run(
        example(db, outbox, "--step-delay", "0"), capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc.stdout


def outbox_lines(outbox: Path) -> list[str]:
    return [line for line in outbox.read_text(encoding="utf-8").splitlines() if line]


def test_interrupted_during_the_searches_resumes_and_emails_once(tmp_path: Path) -> None:
    db, outbox = tmp_path / "agent.db", tmp_path / "outbox.log"
    first = subprocess.Popen(
        example(db, outbox, "--fresh", "--step-delay", LONG_DELAY),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    # Step 1 is the plan, step 2 the first search: once the search says it is running, the
    # process is inside it until the interrupt lands.
    interrupt_when(first, printed(first, "search running 'sea otters habitat'"))
    assert run_status(db) == events.RUNNING
    # The search is IDEMPOTENT with a derived key: its opening is committed with its outcome,
    # so the interrupted call left nothing of step 2, and the log ends with the plan.
    log = read_log(db)
    assert [(e.kind, e.step) for e in log[-1:]] == [(events.STEP_COMPLETED, 1)]
    assert not [e for e in log if e.step >= 2]
    assert not outbox.exists()

    out = finish(db, outbox)

    assert run_status(db) == events.COMPLETED
    assert len(outbox_lines(outbox)) == 1
    log = read_log(db)
    assert [e.kind for e in log].count(events.RUN_RESUMED) == 1
    assert "from the log" in out and "executed" in out
    # The plan came from the log; the search ran again, once, after the process boundary.
    assert "model  answering 'Make a research plan" not in out
    assert out.count("search running 'sea otters habitat'") == 1
    resumed = next(e.seq for e in log if e.kind == events.RUN_RESUMED)
    search = [e for e in log if e.step == 2]
    assert [e.kind for e in search] == [events.TOOL_COMPLETED]  # one attempt, one result
    assert search[0].seq > resumed


def test_interrupted_inside_the_email_window_sends_one_email(tmp_path: Path) -> None:
    db, outbox = tmp_path / "agent.db", tmp_path / "outbox.log"
    # The email tool writes its outbox line, then waits for the "server": interrupted there, the
    # step is dispatched, its effect is done and its outcome is not recorded. The ambiguous
    # window, entered on purpose.
    first = subprocess.Popen(
        example(db, outbox, "--fresh", "--step-delay", "0", "--email-delay", LONG_DELAY),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    interrupt_when(first, lambda: outbox.exists() and len(outbox_lines(outbox)) == 1)
    assert run_status(db) == events.RUNNING
    email = [e.kind for e in read_log(db) if e.step == EMAIL_STEP]
    assert email == [events.STEP_STARTED, events.TOOL_DISPATCHED]

    # Resumed: the IDEMPOTENT tool is called again with the same key and dedupes on it.
    out = finish(db, outbox)

    assert run_status(db) == events.COMPLETED
    assert len(outbox_lines(outbox)) == 1
    email = [e.kind for e in read_log(db) if e.step == EMAIL_STEP]
    assert email.count(events.TOOL_DISPATCHED) == 2
    assert email[-1] == events.STEP_COMPLETED
    assert "already in the outbox" in out


def test_make_demo_command_exits_zero(tmp_path: Path) -> None:
    db, outbox = tmp_path / "agent.db", tmp_path / "outbox.log"
    proc = subprocess.run(example(db, outbox, "--fresh"), capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert run_status(db) == events.COMPLETED
    assert len(outbox_lines(outbox)) == 1
