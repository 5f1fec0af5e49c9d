"""durabl: durable execution for Python LLM agents.

A workflow is a generator that yields steps (ModelCall, ToolCall, Sleep). durabl appends every
step to a log, rebuilds state after a crash by replaying the workflow against that log, and
commits each tool's effect record together with its completion in one transaction.
"""

from typing import TYPE_CHECKING, Any

from durabl.aio import Return
from durabl.crashpoints import ProcessDeath
from durabl.errors import (
    BudgetExceeded,
    ChildRunFailed,
    DeadLetteredError,
    DurablError,
    EncodingError,
    IdempotencyKeyConflict,
    InvalidStateError,
    ModelCallFailed,
    NoModelError,
    NonDeterminismError,
    RunConflictError,
    RunFailedError,
    RunNotFinishedError,
    RunNotFoundError,
    SchemaVersionError,
    StepFailed,
    StorageError,
    ToolFailed,
    UnknownToolError,
    UnknownWorkflowError,
)
from durabl.runtime import DeadLetter, RunState, Runtime
from durabl.steps import (
    TIMED_OUT,
    ChildRun,
    ContinueAsNew,
    ModelCall,
    Parallel,
    Sleep,
    Step,
    ToolCall,
    WaitSignal,
)
from durabl.tools import RetryPolicy, Tool, ToolMode, tool
from durabl.workflow import Workflow, workflow

__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    from durabl.ledger import Budget


def __getattr__(name: str) -> Any:
    """``durabl.Budget``, imported on first use: a run without a budget never needs
    ``durabl.ledger``."""
    if name == "Budget":
        from durabl.ledger import Budget

        return Budget
    raise AttributeError(f"module 'durabl' has no attribute {name!r}")


__all__ = [
    "TIMED_OUT",
    "Budget",
    "BudgetExceeded",
    "ChildRun",
    "ChildRunFailed",
    "ContinueAsNew",
    "DeadLetter",
    "DeadLetteredError",
    "DurablError",
    "EncodingError",
    "IdempotencyKeyConflict",
    "InvalidStateError",
    "ModelCall",
    "ModelCallFailed",
    "NoModelError",
    "NonDeterminismError",
    "Parallel",
    "ProcessDeath",
    "RetryPolicy",
    "Return",
    "RunConflictError",
    "RunFailedError",
    "RunNotFinishedError",
    "RunNotFoundError",
    "RunState",
    "Runtime",
    "SchemaVersionError",
    "Sleep",
    "Step",
    "StepFailed",
    "StorageError",
    "Tool",
    "ToolCall",
    "ToolFailed",
    "ToolMode",
    "UnknownToolError",
    "UnknownWorkflowError",
    "WaitSignal",
    "Workflow",
    "__version__",
    "tool",
    "workflow",
]
