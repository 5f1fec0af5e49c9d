"""One exception tree for durabl.

Every class's docstring reads as its default message. Errors a user can cause derive from
``DurablError`` (an ``Exception``); the only ``BaseException`` in durabl is the chaos harness's
simulated process death (``durabl.crashpoints.ProcessDeath``), so that no ``except Exception`` in
the runtime or in a workflow can swallow it.
"""

from __future__ import annotations

from typing import Any


class DurablError(Exception):
    """durabl could not do what was asked."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class StorageError(DurablError):
    """The database could not be opened, read or written."""


class SchemaVersionError(StorageError):
    """The database was written by a newer durabl than this one."""


class NonDeterminismError(DurablError):
    """The workflow yielded a different step than the one its log recorded at this position."""

    def __init__(
        self,
        run_id: str,
        seq: int,
        position: int,
        expected: str,
        actual: str,
    ) -> None:
        self.run_id = run_id
        self.seq = seq
        self.position = position
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"run {run_id}: step {position} (log seq {seq}) was recorded as {expected} but the "
            f"workflow now yields {actual}. Either the workflow is not deterministic (it read "
            f"time, randomness or outside state directly instead of through ctx.now()/"
            f"ctx.random()/ctx.uuid() or a step), or its code changed while this run was in "
            f"flight. The run is held with its log untouched; deploy the code it started with "
            f"and resume it."
        )


class LeaseLost(DurablError):
    """Another process took this run over; this process must stop driving it without writing."""


class RunLeased(DurablError):
    """Another live process is driving this run right now."""


class DeadLetteredError(DurablError):
    """The run is stopped on a dead-lettered step and needs an operator: redrive, resolve or cancel."""


class RunFailedError(DurablError):
    """The run ended FAILED; its recorded error says why."""


class RunNotFinishedError(DurablError):
    """The run has no result yet."""


class RunNotFoundError(DurablError):
    """No run with this id exists in the database."""


class RunConflictError(DurablError):
    """A run with this id already exists with a different workflow or input."""


class UnknownWorkflowError(DurablError):
    """No workflow with this name is registered."""


class UnknownToolError(DurablError):
    """A workflow called a tool that is not registered with the runtime."""


class NoModelError(DurablError):
    """A workflow yielded a ModelCall but the runtime has no llm."""


class EncodingError(DurablError, TypeError):
    """A value cannot be represented in durabl's canonical JSON form."""


class InvalidStateError(DurablError):
    """The run is not in a state that allows this operation."""


class StepFailed(DurablError):
    """A step failed for good and the failure was thrown into the workflow.

    ``error_type`` and ``message`` describe the original exception; the same failure is thrown
    again at the same point when the run is replayed.
    """

    def __init__(self, step_name: str, error_type: str, message: str, attempts: int = 1) -> None:
        self.step_name = step_name
        self.error_type = error_type
        self.message = message
        self.attempts = attempts
        super().__init__(self.describe())

    def describe(self) -> str:
        tries = "attempt" if self.attempts == 1 else "attempts"
        return f"{self.step_name} failed after {self.attempts} {tries}: {self.error_type}: {self.message}"

    def to_record(self) -> dict[str, Any]:
        return {
            "class": type(self).__name__,
            "name": self.step_name,
            "error_type": self.error_type,
            "message": self.message,
            "attempts": self.attempts,
        }

    @staticmethod
    def from_record(record: dict[str, Any]) -> StepFailed:
        cls = ModelCallFailed if record.get("class") == "ModelCallFailed" else ToolFailed
        return cls(record["name"], record["error_type"], record["message"], record["attempts"])


class ToolFailed(StepFailed):
    """A tool call failed for good (retries exhausted, or a non-retryable error)."""

    @property
    def tool(self) -> str:
        return self.step_name


class ModelCallFailed(StepFailed):
    """A model call failed for good (retries exhausted, or a non-retryable error)."""


class IdempotencyKeyConflict(DurablError):
    """An idempotency key was reused with a different tool or different arguments."""
