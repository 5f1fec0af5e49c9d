"""Executing a ``WaitSignal``: take a signal already sent, or wait for one until the timeout.

The first time the wait is reached it records STEP_STARTED, and TIMER_ARMED with its deadline
if it has a timeout, and parks the run WAITING. Sending a signal makes a waiting run due at
once, so whoever fires due timers (a worker, ``tick``) drives it here again, and the wait takes
the oldest signal of its name not yet taken: its delivery and the step's completion are one
transaction, so a signal is taken once, by one wait. Past the deadline with none, the wait
completes as timed out. Nothing before the wait runs again: replay serves it.

Parking and sending cannot miss each other: the commit that parks the wait ends by making the
run due now if a signal of its name is pending (``Commit.wake_on_signal``), and a signal sent
after that commit finds the run WAITING and wakes it.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events
from durabl.execute.base import StepCall
from durabl.flow import Park
from durabl.journal import NewEvent
from durabl.steps import TIMED_OUT, WaitSignal


def execute(call: StepCall) -> Any:
    step, journal, rec = call.step, call.journal, call.rec
    assert isinstance(step, WaitSignal)
    now_s = call.now()
    opening: list[NewEvent] = []
    if rec is None:
        crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
        opening = [(events.STEP_STARTED, step.fingerprint, step.canonical)]
        deadline_s = None if step.timeout_s is None else now_s + step.timeout_s
    else:
        deadline_s = rec.wake_at_s
    signal = journal.store.pending_signal(call.run_id, step.name)
    if signal is not None:
        answer = {"payload": codec.decode(signal.payload_text), "signal": signal.id}
        journal.append(
            [
                *opening,
                (events.STEP_COMPLETED, None, codec.encode({**answer, "sent_s": signal.sent_s})),
            ],
            deliver_signal=signal.id,
            wake_at_s=None,
            durable=True,
        )
        crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
        call.executed()
        return answer["payload"]
    if deadline_s is not None and now_s >= deadline_s:
        journal.append(
            [*opening, (events.STEP_COMPLETED, None, '{"timed_out":true}')],
            wake_at_s=None,
            durable=True,
        )
        crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
        call.executed()
        return TIMED_OUT
    if deadline_s is not None and rec is None:
        opening.append((events.TIMER_ARMED, None, codec.encode({"fire_at_s": deadline_s})))
    journal.append(
        opening,
        status=events.WAITING,
        wake_at_s=deadline_s,
        wake_on_signal=step.name,
        durable=bool(opening),
    )
    if opening:
        crashpoints.reach(
            crashpoints.AFTER_TIMER_ARMED
            if deadline_s is not None
            else crashpoints.AFTER_STEP_STARTED
        )
    raise Park()
