"""Executing a ``ModelCall``: call the runtime's llm, with the runtime's retry policy."""

from __future__ import annotations

from typing import Any

from durabl import crashpoints
from durabl.errors import ModelCallFailed, NoModelError
from durabl.execute.attempts import AttemptSpec, attempt
from durabl.execute.base import StepCall
from durabl.flow import Hold
from durabl.steps import ModelCall


def execute(call: StepCall) -> Any:
    step = call.step
    assert isinstance(step, ModelCall)
    llm = call.services.llm
    if llm is None:
        raise Hold(NoModelError(run_id=call.run_id, position=call.position, step=step.describe()))
    spec = AttemptSpec(
        name="ModelCall",
        call=lambda: llm(step.prompt, **step.params),
        policy=call.services.retry,
        returned=crashpoints.AFTER_MODEL_RETURNED,
        failure=ModelCallFailed,
    )
    return attempt(call, spec)
