"""`make demo`'s script: a real SIGKILL inside a search, a resume from the log in a second
process, a durable timer fired by a third, and one email in the outbox."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from durabl import events
from durabl.store import SQLiteStore

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("kill_after", [2, 3, 4])
def test_the_demo_kills_resumes_and_sends_once(kill_after: int, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--kill-after", str(kill_after),
         "--keep", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert f"SIGKILLed inside step {kill_after}" in out
    assert re.search(r"killed pid \d+ with SIGKILL", out)
    # the killed search is IDEMPOTENT with a derived key: it left nothing of its step
    assert f"the log ends with step {kill_after - 1}'s completion" in out
    # process 2 served the steps before the kill from the log and ran the killed one again
    second = out.split("== process 2")[1].split("== no process")[0]
    assert f"replayed {kill_after - 1} steps from the log" in second
    assert "now SLEEPING" in second and "the run sleeps on its durable timer" in second
    third = out.split("== process 3")[1].split("== durabl show")[0]
    assert "now COMPLETED" in third
    assert third.count("process boundary: pid") == 2  # one line per boundary
    trace = out.split("== durabl show --trace")[1]
    assert "3 processes, boundaries at seq" in trace
    assert "PROCESS" in trace and re.search(rf"\n{kill_after}\s+replayed\s+2\s", trace)
    assert "1 line(s): one email, whatever was killed" in out
    assert len((tmp_path / "outbox.log").read_text().splitlines()) == 1
    # in the kept log, the first boundary follows the step before the kill, and the killed step
    # has exactly one attempt, made below it
    store = SQLiteStore(tmp_path / "agent.db", read_only=True)
    try:
        log = store.load_log("demo-run")
    finally:
        store.close()
    first_boundary = next(i for i, e in enumerate(log) if e.kind == events.RUN_RESUMED)
    before = log[first_boundary - 1]
    assert before.kind in (events.STEP_COMPLETED, events.TOOL_COMPLETED)
    assert before.step == kill_after - 1
    killed = [(i, e.kind) for i, e in enumerate(log) if e.step == kill_after]
    # an IDEMPOTENT search: its one attempt and its result are one event
    assert [kind for _, kind in killed] == [events.TOOL_COMPLETED]
    assert killed[0][0] > first_boundary


def test_a_kill_outside_the_searches_is_refused() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--kill-after", "7"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2 and "invalid choice: 7" in done.stderr
