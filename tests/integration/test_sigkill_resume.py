"""Real process deaths: SIGKILL a running agent at a named crash point, start it again.

``sigkill_agent.py`` runs a small workflow (a model call, an IDEMPOTENT publish with a derived
key, a durable timer, an IDEMPOTENT publish with an explicit key, an AT_MOST_ONCE notify) and
sends SIGKILL to itself the N-th time it reaches the named point. The test checks the crashed
database before anything resumes (gapless log, side effects and completions agree), then runs
the agent again without the kill and compares it with an uncrashed reference: same result, each
effect exactly once in the outbox, and a RUN_RESUMED event at the process boundary. A kill
inside the AT_MOST_ONCE tool's ambiguous window must dead-letter the run instead.

The derived-key publish commits its opening with its outcome, so a kill anywhere inside that
step leaves nothing of it, and the resumed process runs it again; the keyed publish and the
AT_MOST_ONCE notify commit their opening (STEP_STARTED with TOOL_DISPATCHED) before the call,
so a kill before that commit leaves nothing of the step either, and one after it leaves the
step in flight.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from logical_rows import logical

AGENT = Path(__file__).with_name("sigkill_agent.py")
RUN_ID = "courier-1"


@dataclass(frozen=True)
class Outcome:
    state: dict[str, Any]
    outbox: list[str]
    calls: list[str]


def run_agent(folder: Path, *crash: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            str(AGENT),
            str(folder / "agent.db"),
            str(folder / "outbox.txt"),
            str(folder / "calls.txt"),
            *crash,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def finished(folder: Path, done: subprocess.CompletedProcess[str]) -> Outcome:
    assert done.returncode == 0, done.stderr
    return Outcome(
        json.loads(done.stdout.strip().splitlines()[-1]),
        lines(folder / "outbox.txt"),
        lines(folder / "calls.txt"),
    )


def read_only(db: Path) -> sqlite3.Connection:
    """A reader that never checkpoints: the crashed files stay exactly as the kill left them."""
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def events(db: Path) -> list[tuple[Any, ...]]:
    """The run's log as (seq, kind, step, data), a TOOL_COMPLETED as the events it stands for."""
    conn = read_only(db)
    try:
        rows = conn.execute(
            "SELECT seq, kind, step, data FROM events WHERE run_id = ? ORDER BY seq", (RUN_ID,)
        ).fetchall()
        return logical(rows, kind=1, data=3, fp=None)
    finally:
        conn.close()


def effect_steps(db: Path) -> set[int]:
    conn = read_only(db)
    try:
        return {
            r[0] for r in conn.execute("SELECT step FROM side_effects WHERE run_id = ?", (RUN_ID,))
        }
    finally:
        conn.close()


def assert_not_torn(db: Path) -> None:
    """The log is gapless and every recorded effect has its completion, and vice versa."""
    log = events(db)
    seqs = sorted({seq for seq, *_ in log})  # a TOOL_COMPLETED's three events share its seq
    assert seqs == list(range(1, len(seqs) + 1)), log
    completed = {step for _, kind, step, _ in log if kind == "STEP_COMPLETED"}
    dispatched = {step for _, kind, step, _ in log if kind == "TOOL_DISPATCHED"}
    assert effect_steps(db) == completed & dispatched


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    folder = tmp_path_factory.mktemp("reference")
    outcome = finished(folder, run_agent(folder))
    assert outcome.state["status"] == "COMPLETED"
    kinds = [kind for _, kind, _, _ in events(folder / "agent.db")]
    assert "RUN_RESUMED" not in kinds
    return outcome


@dataclass(frozen=True)
class Case:
    point: str
    occurrence: int
    last_event: tuple[str, int]
    """(kind, step) of the last event the killed process committed: proves where it died."""
    status: str
    invocations: dict[str, int]
    """How often each tool was really called, over both processes."""
    unrecorded: int | None = None
    """The step the kill interrupted before any of it was committed: the crashed log holds
    nothing of it, and the resumed process records it once, as if it had never begun."""


# Steps: 1 ModelCall, 2 publish (derived key), 3 Sleep, 4 publish (explicit key), 5 notify.
# after_step_started is reached at steps 1, 2, 4 and 5 (a Sleep has no such point); the other
# tool points at steps 2, 4 and 5.
CASES = [
    Case("after_step_started", 1, ("STEP_STARTED", 1), "COMPLETED", {"publish": 2, "notify": 1}),
    Case(
        "after_step_committed", 1, ("STEP_COMPLETED", 1), "COMPLETED", {"publish": 2, "notify": 1}
    ),
    # Inside the derived-key publish: nothing of step 2 is committed until it returns.
    Case(
        "after_step_started",
        2,
        ("STEP_COMPLETED", 1),
        "COMPLETED",
        {"publish": 2, "notify": 1},
        unrecorded=2,
    ),
    Case(
        "after_tool_dispatched",
        1,
        ("STEP_COMPLETED", 1),
        "COMPLETED",
        {"publish": 2, "notify": 1},
        unrecorded=2,
    ),
    # The publish ran and its outcome was lost with the opening: it is called again, and the
    # endpoint dedupes on the key.
    Case(
        "after_tool_returned",
        1,
        ("STEP_COMPLETED", 1),
        "COMPLETED",
        {"publish": 3, "notify": 1},
        unrecorded=2,
    ),
    Case(
        "after_step_committed", 2, ("STEP_COMPLETED", 2), "COMPLETED", {"publish": 2, "notify": 1}
    ),
    Case("after_timer_armed", 1, ("TIMER_ARMED", 3), "COMPLETED", {"publish": 2, "notify": 1}),
    # The keyed publish: its opening (and its claim) is not committed yet...
    Case(
        "after_step_started",
        3,
        ("TIMER_FIRED", 3),
        "COMPLETED",
        {"publish": 2, "notify": 1},
        unrecorded=4,
    ),
    # ... and then it is, before the call.
    Case(
        "after_tool_dispatched", 2, ("TOOL_DISPATCHED", 4), "COMPLETED", {"publish": 2, "notify": 1}
    ),
    Case(
        "after_tool_returned", 2, ("TOOL_DISPATCHED", 4), "COMPLETED", {"publish": 3, "notify": 1}
    ),
    Case(
        "after_step_committed", 3, ("STEP_COMPLETED", 4), "COMPLETED", {"publish": 2, "notify": 1}
    ),
    # AT_MOST_ONCE: before its opening commits, nothing happened and the step simply begins
    # again; after it, the death is ambiguous and the run is dead-lettered.
    Case(
        "after_step_started",
        4,
        ("STEP_COMPLETED", 4),
        "COMPLETED",
        {"publish": 2, "notify": 1},
        unrecorded=5,
    ),
    Case(
        "after_tool_dispatched",
        3,
        ("TOOL_DISPATCHED", 5),
        "DEAD_LETTERED",
        {"publish": 2, "notify": 0},
    ),
    Case(
        "after_tool_returned",
        3,
        ("TOOL_DISPATCHED", 5),
        "DEAD_LETTERED",
        {"publish": 2, "notify": 1},
    ),
    Case(
        "before_run_completed", 1, ("STEP_COMPLETED", 5), "COMPLETED", {"publish": 2, "notify": 1}
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.point}#{c.occurrence}")
def test_a_sigkilled_agent_resumes_to_the_reference_outcome(
    tmp_path: Path, reference: Outcome, case: Case
) -> None:
    db = tmp_path / "agent.db"
    crashed = run_agent(tmp_path, "--crash-at", case.point, "--occurrence", str(case.occurrence))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert crashed.stdout == ""

    # The crashed database, before anything resumes.
    assert Path(f"{db}-wal").exists()
    crashed_log = events(db)
    seq, kind, step, _ = crashed_log[-1]
    assert (kind, step) == case.last_event
    assert_not_torn(db)
    if case.unrecorded is not None:
        assert not [e for e in crashed_log if e[2] >= case.unrecorded], crashed_log

    outcome = finished(tmp_path, run_agent(tmp_path))
    assert outcome.state["status"] == case.status, outcome.state

    log = events(db)
    assert log[: len(crashed_log)] == crashed_log, "the resumed process rewrote history"
    boundary = log[len(crashed_log)]
    assert boundary[0] == seq + 1 and boundary[1] == "RUN_RESUMED"
    assert json.loads(boundary[3] or "{}")["pid"] == outcome.state["pid"]
    assert [e[1] for e in log].count("RUN_RESUMED") == 1
    assert_not_torn(db)
    if case.unrecorded is not None:
        # Run again from its start, below the boundary: one attempt, one dispatch, one outcome.
        again = [e[1] for e in log if e[2] == case.unrecorded]
        assert again == ["STEP_STARTED", "TOOL_DISPATCHED", "STEP_COMPLETED"], again
        assert log.index(next(e for e in log if e[2] == case.unrecorded)) > len(crashed_log)

    called = {
        name: sum(1 for c in outcome.calls if c.split("\t")[0] == name)
        for name in ("publish", "notify")
    }
    assert called == case.invocations

    if case.status == "COMPLETED":
        assert outcome.state["result"] == reference.state["result"]
        assert sorted(outcome.outbox) == sorted(reference.outbox)
        assert len(set(outcome.outbox)) == len(outcome.outbox), "an effect happened twice"
        assert log[-1][1] == "RUN_COMPLETED"
    else:
        published = [line for line in outcome.outbox if line.startswith("publish\t")]
        assert sorted(published) == sorted(
            line for line in reference.outbox if line.startswith("publish\t")
        )
        notified = [line for line in outcome.outbox if line.startswith("notify\t")]
        assert len(notified) == case.invocations["notify"]
        assert outcome.state["result"] is None
        assert outcome.state["error"] is not None and "AT_MOST_ONCE" in outcome.state["error"]
        assert log[-1][1] == "DEAD_LETTERED" and log[-1][2] == 5
