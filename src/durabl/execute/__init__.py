"""Executing a step for real: one module per step kind, chosen from one table.

The drive asks the pure replay core what to do with each step a workflow yields; when the answer
is that the log holds no outcome, it hands the step here. ``EXECUTORS`` maps each step type to
the function that executes it; a new step kind is a new module and one entry in the table.
"""

from __future__ import annotations

import importlib
from typing import Any

from durabl.execute import ctx, model, tool
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


def _on_first_use(kind: type[Step], module: str) -> Executor:
    """The executor of ``kind``, imported from ``module`` the first time a run takes such a
    step: ``import durabl`` loads only the executors of the steps nearly every run takes."""

    def first(call: StepCall) -> Any:
        executor: Executor = importlib.import_module(f"durabl.execute.{module}").execute
        EXECUTORS[kind] = executor
        return executor(call)

    return first


EXECUTORS: dict[type[Step], Executor] = {
    ModelCall: model.execute,
    ToolCall: tool.execute,
    Sleep: _on_first_use(Sleep, "timer"),
    WaitSignal: _on_first_use(WaitSignal, "signal"),
    Parallel: _on_first_use(Parallel, "parallel"),
    ChildRun: _on_first_use(ChildRun, "child"),
    ContinueAsNew: _on_first_use(ContinueAsNew, "continuation"),
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
