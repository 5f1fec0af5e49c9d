"""Executing a step for real: one module per step kind, chosen from one table.

The drive asks the pure replay core what to do with each step a workflow yields; when the answer
is that the log holds no outcome, it hands the step here. ``EXECUTORS`` maps each step type to
the function that executes it; a new step kind is a new module and one entry in the table.
"""

from __future__ import annotations

from typing import Any

from durabl.execute import child, continuation, ctx, model, parallel, signal, timer, tool
from durabl.execute.base import Executor, Services, StepCall
from durabl.steps import (
    ChildRun,
    ContinueAsNew,
    CtxValue,
    ModelCall,
    Parallel,
    PatchMarker,
    Sleep,
    Step,
    ToolCall,
    WaitSignal,
)

EXECUTORS: dict[type[Step], Executor] = {
    ModelCall: model.execute,
    ToolCall: tool.execute,
    Sleep: timer.execute,
    WaitSignal: signal.execute,
    Parallel: parallel.execute,
    ChildRun: child.execute,
    ContinueAsNew: continuation.execute,
    CtxValue: ctx.execute,
    PatchMarker: ctx.execute,  # recorded as a ctx value whose value is the patch id
}


def execute(call: StepCall) -> Any:
    """Execute ``call.step`` with the executor of its type (or of the nearest base type)."""
    executor = EXECUTORS.get(type(call.step))
    if executor is not None:
        return executor(call)
    for kind in type(call.step).__mro__:
        executor = EXECUTORS.get(kind)
        if executor is not None:
            return executor(call)
    raise TypeError(f"no executor for steps of type {type(call.step).__name__}")


__all__ = ["EXECUTORS", "Executor", "Services", "StepCall", "execute"]
