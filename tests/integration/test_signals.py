"""Waiting for a human: ``WaitSignal`` with a timeout, ``Runtime.signal`` and ``durabl signal``
(SPEC §18), on both backends.

- A run waits, durably, for a named signal: nothing before the wait runs again when the answer
  comes, and the answer is what the yield returns.
- A signal sent before the wait is kept, and the first wait for its name takes it at once.
- Each signal is taken once, by one wait, in the order sent; a wait whose timeout passes first
  returns ``TIMED_OUT``, and a later signal waits for the next wait of its name.
- A process that dies around the delivery neither loses the signal nor delivers it twice.
- A signal sent while the wait is being parked is never missed.
- Sending to an unknown or finished run, a payload that is not JSON, a bad name or timeout: one
  clear error, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from durabl import TIMED_OUT, Runtime, ToolCall, WaitSignal, events, workflow
from durabl.crashpoints import AFTER_STEP_COMMITTED, CrashAt, ProcessDeath
from durabl.errors import EncodingError, RunEndedError, RunNotFoundError
from durabl.store import Commit, open_store
from durabl.store.reads import waiting_for

T0_S = 1_800_000_000.0
HOUR_S = 3600.0
calls: list[str] = []


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


@workflow(name="sig_approval")
def approval(ctx: Any, draft: str) -> Any:
    """Write a draft, wait up to an hour for a person's verdict, act on it."""
    yield ToolCall("note", {"text": f"drafted {draft}"})
    verdict = yield WaitSignal("approve", timeout=timedelta(hours=1))
    if verdict is TIMED_OUT:
        yield ToolCall("note", {"text": f"gave up on {draft}"})
        return "timed out"
    yield ToolCall("note", {"text": f"sent {draft}: {verdict['ok']}"})
    return verdict


@workflow(name="sig_two_answers")
def two_answers(ctx: Any) -> Any:
    first = yield WaitSignal("answer")
    second = yield WaitSignal("answer")
    return [first, second]


def note(text: str) -> str:
    calls.append(text)
    return text


@pytest.fixture
def db(either_db: str) -> str:
    return either_db


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def rt(db: str, clock: Clock) -> Iterator[Runtime]:
    calls.clear()
    with runtime(db, clock) as opened:
        yield opened


def runtime(db: str, clock: Clock) -> Runtime:
    return Runtime(db, tools={"note": note}, workflows=[approval, two_answers], clock=clock)


def test_a_run_waits_for_its_signal_and_nothing_before_the_wait_runs_again(
    rt: Runtime, clock: Clock
) -> None:
    run_id = rt.start(approval, {"draft": "memo"})
    waiting = rt.state(run_id)
    assert (waiting.status, waiting.wake_at_s) == ("WAITING", T0_S + HOUR_S)
    assert calls == ["drafted memo"]

    clock.now_s += 60
    assert rt.signal(run_id, "approve", {"ok": True}) == 1
    assert rt.store.due_runs(clock.now_s) == [run_id]  # due at once, for a worker or tick
    (state,) = rt.tick()
    assert (state.status, rt.result(run_id)) == ("COMPLETED", {"ok": True})
    assert calls == ["drafted memo", "sent memo: True"]
    completed = [e for e in rt.store.load_log(run_id) if e.kind == events.STEP_COMPLETED]
    answer = json.loads(completed[1].data or "{}")
    assert answer == {"payload": {"ok": True}, "signal": 1, "sent_s": T0_S + 60}
    assert [s.delivered_step for s in rt.store.signals(run_id)] == [2]
    assert rt.replay(run_id, dry=True).result == {"ok": True}
    assert rt.metrics(run_id).signals == 1


def test_a_signal_sent_before_the_wait_is_kept_for_it(rt: Runtime) -> None:
    run_id = rt.start(two_answers)
    assert rt.state(run_id).status == "WAITING"
    rt.signal(run_id, "answer", "first")
    rt.signal(run_id, "answer", "second")  # sent before the second wait exists
    (state,) = rt.tick()
    assert (state.status, rt.result(run_id)) == ("COMPLETED", ["first", "second"])
    assert [(s.id, s.delivered_step) for s in rt.store.signals(run_id)] == [(1, 1), (2, 2)]


def test_a_timed_out_wait_returns_the_marker_and_a_late_signal_changes_nothing(
    rt: Runtime, clock: Clock
) -> None:
    run_id = rt.start(approval, {"draft": "memo"})
    clock.now_s += HOUR_S - 1
    assert rt.tick() == []  # not a moment early
    clock.now_s += 1
    (state,) = rt.tick()
    assert (state.status, rt.result(run_id)) == ("COMPLETED", "timed out")
    assert calls == ["drafted memo", "gave up on memo"]
    assert rt.replay(run_id, dry=True).result == "timed out"
    with pytest.raises(RunEndedError, match=f"run {run_id} is already COMPLETED"):
        rt.signal(run_id, "approve", {"ok": True})
    assert rt.store.signals(run_id) == []


def test_a_death_right_after_the_delivery_neither_loses_nor_repeats_it(
    db: str, clock: Clock
) -> None:
    calls.clear()
    with runtime(db, clock) as rt:
        run_id = rt.start(approval, {"draft": "memo"})
        rt.signal(run_id, "approve", {"ok": False})
    with runtime(db, clock) as rt, CrashAt(AFTER_STEP_COMMITTED, 1), pytest.raises(ProcessDeath):
        rt.resume(run_id)  # dies with the delivery committed, before the next step
    with runtime(db, clock) as rt:
        state = rt.resume(run_id)
        assert (state.status, rt.result(run_id)) == ("COMPLETED", {"ok": False})
        assert calls == ["drafted memo", "sent memo: False"]
        assert [s.delivered_step for s in rt.store.signals(run_id)] == [2]


def test_a_signal_pending_while_the_wait_is_parked_makes_the_run_due_now(
    rt: Runtime, clock: Clock
) -> None:
    """The race in the store's own terms: the commit that parks a wait finds a signal that was
    sent after the wait looked for one, and makes the run due instead of leaving it waiting."""
    run_id = rt.start(two_answers)
    row = rt.store.get_run(run_id)
    assert row is not None and row.status == "WAITING"
    rt.store.send_signal(run_id, "other", '"not for this wait"', clock.now_s)
    assert rt.store.due_runs(clock.now_s) == [run_id]  # a signal wakes a waiting run...
    token = rt.store.take_lease(run_id, row.lease_token, rt._leaser.lease())
    assert token is not None
    parked = Commit(run_id, status=None, wake_at_s=None, at_s=clock.now_s, fence=token)
    rt.store.commit(parked)
    assert rt.store.due_runs(clock.now_s) == []  # ...and a park for no signal clears it
    later_s = clock.now_s + 5
    rt.store.send_signal(run_id, "answer", '"yes"', clock.now_s)
    rt.store.commit(
        Commit(run_id, wake_at_s=None, at_s=later_s, fence=token, wake_on_signal="answer")
    )
    assert rt.store.due_runs(later_s) == [run_id]


def test_a_waiting_run_keeps_its_timeout_when_a_signal_makes_it_due(
    rt: Runtime, clock: Clock
) -> None:
    """What ``durabl runs`` and the dashboard say a run waits for: a signal sent to it makes it
    due, but does not move when its wait times out, nor give a timeout to a wait that has none."""
    timed = rt.start(approval, {"draft": "memo"})  # waits for 'approve', for an hour
    untimed = rt.start(two_answers)  # waits for 'answer', for ever
    clock.now_s += 60
    rt.signal(timed, "approve", {"ok": True})
    rt.signal(untimed, "not what it waits for", 1)
    assert sorted(rt.store.due_runs(clock.now_s)) == sorted([timed, untimed])

    def timeout_at_s(run_id: str) -> float | None:
        row = rt.store.get_run(run_id)
        assert row is not None
        wait = waiting_for(rt.store, row)
        assert wait is not None
        return wait["timeout_at_s"]

    assert timeout_at_s(untimed) is None
    assert timeout_at_s(timed) == T0_S + HOUR_S


def test_signals_to_the_wrong_place_are_refused_and_write_nothing(rt: Runtime) -> None:
    run_id = rt.start(approval, {"draft": "memo"})
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        rt.signal("nope", "approve", 1)
    with pytest.raises(EncodingError, match=f"signal 'approve' to run {run_id}"):
        rt.signal(run_id, "approve", {"when": object()})
    with pytest.raises(TypeError, match="name must be a non-empty string"):
        rt.signal(run_id, "", 1)
    assert rt.store.signals(run_id) == []
    assert rt.state(run_id).status == "WAITING"


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"name": ""}, TypeError, "WaitSignal name must be a non-empty string"),
        ({"name": 7}, TypeError, "WaitSignal name must be a non-empty string"),
        ({"name": "a", "timeout": "soon"}, TypeError, "seconds or a timedelta"),
        ({"name": "a", "timeout": -1}, ValueError, "between 0 s and a century"),
        ({"name": "a", "timeout": float("nan")}, ValueError, "between 0 s and a century"),
    ],
)
def test_a_wait_that_cannot_be_is_refused_by_name(
    kwargs: dict[str, Any], error: type[Exception], words: str
) -> None:
    name = kwargs.pop("name")
    with pytest.raises(error, match=words):
        WaitSignal(name, **kwargs)


def test_a_worker_drives_the_run_on_when_another_process_signals_it(db: str, clock: Clock) -> None:
    """On PostgreSQL the signal itself wakes the worker (NOTIFY): it looks for work only every
    minute here. A SQLite file has no way to tell another process, so the worker finds the run,
    made due by the signal, at its next look."""
    calls.clear()
    with runtime(db, time.time) as client:  # type: ignore[arg-type]
        run_id = client.start(approval, {"draft": "memo"})
    worker = runtime(db, time.time)  # type: ignore[arg-type]
    poll_s = 60.0 if db.startswith("postgresql://") else 0.2
    serving = threading.Thread(target=lambda: worker.serve(poll_s=poll_s))
    serving.start()
    try:
        time.sleep(0.5)
        with runtime(db, time.time) as client:  # type: ignore[arg-type]
            sent_s = time.monotonic()
            client.signal(run_id, "approve", {"ok": True})
            while client.state(run_id).status != "COMPLETED":
                assert time.monotonic() - sent_s < 30, "the worker never took the signal"
                time.sleep(0.02)
    finally:
        worker.stop()
        serving.join()
        worker.close()
    assert calls == ["drafted memo", "sent memo: True"]


def test_the_signal_command(db: str, clock: Clock) -> None:
    with runtime(db, clock) as rt:
        run_id = rt.start(approval, {"draft": "memo"})

    def durabl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durabl", "--db", db, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ},
        )

    listed = durabl("runs")
    assert "WAITING for 'approve' since 2027-01-15 08:00:00, times out 2027-01-15 09:00:00" in (
        listed.stdout
    ), listed.stdout
    (row,) = json.loads(durabl("--json", "runs").stdout)
    assert row["waiting_for"] == {
        "signal": "approve",
        "since_s": T0_S,
        "timeout_at_s": T0_S + HOUR_S,
    }

    sent = durabl("signal", run_id, "approve", '{"ok": true}')
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.strip() == f"signal 'approve' #1 sent to run {run_id}"
    bad = durabl("signal", run_id, "approve", "{not json")
    assert bad.returncode == 2
    assert bad.stderr.startswith("durabl: PAYLOAD is not JSON")
    missing = durabl("--json", "signal", "nope", "approve")
    assert missing.returncode == 2
    assert "no run 'nope'" in missing.stderr
    store = open_store(db, read_only=True)
    try:
        assert [s.payload_text for s in store.signals(run_id)] == ['{"ok":true}']
    finally:
        store.close()
