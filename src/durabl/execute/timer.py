"""Executing a ``Sleep``: arm a durable timer the first time, fire it once it is due."""

from __future__ import annotations

from durabl import codec, crashpoints, events
from durabl.execute.base import StepCall
from durabl.flow import Park
from durabl.steps import Sleep


def execute(call: StepCall) -> None:
    step, journal, rec = call.step, call.journal, call.rec
    assert isinstance(step, Sleep)
    now_s = call.now()
    if rec is None:
        crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
        fire_at_s = now_s + step.seconds
        journal.append(
            [
                (events.STEP_STARTED, step.fingerprint, step.canonical),
                (events.TIMER_ARMED, None, codec.encode({"fire_at_s": fire_at_s})),
            ],
            status=events.SLEEPING if now_s < fire_at_s else events.RUNNING,
            wake_at_s=fire_at_s,
            durable=True,
        )
        crashpoints.reach(crashpoints.AFTER_TIMER_ARMED)
    else:
        assert rec.wake_at_s is not None
        fire_at_s = rec.wake_at_s
    if now_s < fire_at_s:
        journal.set_status(events.SLEEPING)
        raise Park()
    crashpoints.reach(crashpoints.BEFORE_TIMER_FIRED)
    journal.append(
        [(events.TIMER_FIRED, None, codec.encode({"fired_at_s": now_s}))],
        wake_at_s=None,
        durable=True,
    )
    crashpoints.reach(crashpoints.AFTER_TIMER_FIRED)
    call.executed()
