"""Executing a ctx value (``ctx.now()``, ``ctx.random()``, ``ctx.uuid()``): draw it once, record
it, and serve it from the log on every replay."""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events
from durabl.execute.base import StepCall
from durabl.flow import Unwind


def execute(call: StepCall) -> Any:
    step = call.step
    assert call.draw is not None
    text, value = codec.round_trip(call.draw(), what=step.describe())
    crashpoints.reach(crashpoints.BEFORE_CTX_RECORDED)
    try:
        call.journal.append([(events.CTX_RECORDED, step.fingerprint, text)])
    except Exception as exc:
        # A storage failure is the runtime's, not the workflow's: its except clauses must not
        # see it. Unwind the workflow; the drive re-raises it to the caller.
        raise Unwind(exc) from None
    call.executed()
    return value
