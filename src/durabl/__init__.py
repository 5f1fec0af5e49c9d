"""durabl: durable execution for Python LLM agents.

A workflow is a generator that yields steps (ModelCall, ToolCall, Sleep). durabl appends every
step to a log, rebuilds state after a crash by replaying the workflow against that log, and
commits each tool's effect record together with its completion in one transaction.
"""

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
from durabl.ledger import Budget
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
