"""What can go wrong driving a run: ownership, the run's state, its workflow, steps and tools."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from durabl.errors.base import DurablError

# -- ownership ------------------------------------------------------------------------------------


class LeaseLost(DurablError):
    """Another process took this run over; this process must stop driving it without writing."""

    def __init__(
        self, *, run_id: str | None = None, token: int | None = None, path: str | None = None
    ) -> None:
        self.run_id, self.token, self.path = run_id, token, path
        where = path if run_id is None else f"run {run_id}"
        held = "" if token is None else f" (this process held token {token})"
        super().__init__(f"{where}: lease lost: another process owns this run now{held}")


class RunLeased(DurablError):
    """Another live process is driving this run right now."""


class RunDrivenHere(RunLeased, refines=True):
    """Another runtime in this process is driving the run right now."""

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} is being driven by another runtime in this process")


class RunDrivenElsewhere(RunLeased, refines=True):
    """A live process holds the run's lease; it is taken over if that process dies.

    ``until`` is the lease's expiry as the local time of day: the raise site formats it, as the
    exception tree reads no clock and no time zone.
    """

    def __init__(self, *, run_id: str, pid: int, host: str, until: str) -> None:
        self.run_id, self.pid, self.host, self.until = run_id, pid, host, until
        super().__init__(
            f"run {run_id} is being driven by process {pid} on {host} (lease until {until}); "
            f"it will be taken over if that process dies"
        )


class RunTakenOver(RunLeased, refines=True):
    """Another process took the run's lease between this process's look and its take."""

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"run {run_id} was just taken over by another process")


# -- runs ------------------------------------------------------------------------------------------


class NonDeterminismError(DurablError):
    """The workflow yielded a different step than the one its log recorded at this position."""

    def __init__(self, run_id: str, seq: int, position: int, expected: str, actual: str) -> None:
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


class DeadLetteredError(DurablError):
    """The run is stopped on a dead-lettered step and needs an operator: redrive, resolve or cancel."""

    def __init__(self, *, run_id: str, reason: str | None) -> None:
        self.run_id, self.reason = run_id, reason
        super().__init__(f"run {run_id} is dead-lettered: {reason}")


class AmbiguousEffect(DurablError):
    """An AT_MOST_ONCE tool was dispatched and its outcome never recorded: it ran zero or one times.

    Not raised: its text is the reason a run is dead-lettered with.
    """

    def __init__(self, *, step: str) -> None:
        self.step = step
        super().__init__(
            f"{step} is AT_MOST_ONCE and a process died after it was dispatched and before its "
            f"outcome was recorded: it ran zero or one times and durabl will not guess"
        )


class RunFailedError(DurablError):
    """The run ended FAILED; its recorded error says why."""

    def __init__(self, *, run_id: str, error: str | None) -> None:
        self.run_id, self.error = run_id, error
        super().__init__(f"run {run_id} failed: {error}")


class RunNotFinishedError(DurablError):
    """The run has no result yet."""

    def __init__(self, *, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} has no result: it is {status}")


class RunNotFoundError(DurablError):
    """No run with this id exists in the database."""

    def __init__(self, *, run_id: str, path: str) -> None:
        self.run_id, self.path = run_id, path
        super().__init__(f"no run {run_id!r} in {path}")


class RunConflictError(DurablError):
    """A run with this id already exists with a different workflow or input."""

    def __init__(
        self,
        *,
        run_id: str,
        workflow: str,
        input_text: str,
        existing_workflow: str,
        existing_input_text: str,
    ) -> None:
        self.run_id, self.workflow, self.input_text = run_id, workflow, input_text
        self.existing_workflow = existing_workflow
        self.existing_input_text = existing_input_text
        super().__init__(
            f"run {run_id!r} already exists with workflow {existing_workflow!r} and input "
            f"{existing_input_text}; it cannot be started again as {workflow!r} with input "
            f"{input_text}"
        )


class InvalidStateError(DurablError):
    """The run is not in a state that allows this operation."""


class NotDeadLetteredError(InvalidStateError, refines=True):
    """Only a dead-lettered run can be redriven or resolved."""

    def __init__(self, *, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} is {status}, not dead-lettered")


class AlreadyTerminalError(InvalidStateError, refines=True):
    """The run has already ended; there is nothing to cancel."""

    def __init__(self, *, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(f"run {run_id} is already {status}; nothing to cancel")


class ForkRefusedError(InvalidStateError, refines=True):
    """A run cannot be forked at that seq: the reason names the run, the seq and the step."""

    def __init__(self, *, run_id: str, seq: int, why: str) -> None:
        self.run_id, self.seq, self.why = run_id, seq, why
        super().__init__(f"cannot fork run {run_id} at seq {seq}: {why}")


class RunEndedError(InvalidStateError, refines=True):
    """The run has ended: no wait of it will ever take a signal."""

    def __init__(self, *, run_id: str, status: str) -> None:
        self.run_id, self.status = run_id, status
        super().__init__(
            f"run {run_id} is already {status}: no wait of it can take a signal any more"
        )


class EffectAlreadyRecordedError(InvalidStateError, refines=True):
    """The dead-lettered step's key already has a recorded effect: redrive the run instead."""

    def __init__(self, *, key: str, run_id: str) -> None:
        self.key, self.run_id = key, run_id
        super().__init__(
            f"idempotency key {key!r} already has a recorded effect; redrive run {run_id} to "
            f"pick it up instead of resolving it"
        )


class DeadLetterEventMissingError(InvalidStateError, refines=True):
    """The run is marked dead-lettered but its log does not say which step."""

    def __init__(self, *, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"run {run_id} is marked dead-lettered but its log has no DEAD_LETTERED event"
        )


# -- workflows, steps and tools ----------------------------------------------------------------


class UnknownWorkflowError(DurablError):
    """No workflow with this name is registered."""

    def __init__(self, *, name: str, known: Iterable[str]) -> None:
        self.name, self.known = name, sorted(known)
        listed = ", ".join(self.known) if self.known else "none"
        super().__init__(
            f"no workflow named {name!r} is registered (known: {listed}); decorate it with "
            f"@workflow and import its module, or pass workflows=[...] to Runtime"
        )


class UnknownToolError(DurablError):
    """A workflow called a tool that is not registered with the runtime."""

    def __init__(self, *, run_id: str, position: int, tool: str, registered: Iterable[str]) -> None:
        self.run_id, self.position, self.tool = run_id, position, tool
        self.registered = sorted(registered)
        known = ", ".join(self.registered) or "none"
        super().__init__(
            f"run {run_id} step {position} calls tool {tool!r}, which is not registered "
            f"(registered: {known}); register it and resume the run"
        )


class NoModelError(DurablError):
    """A workflow yielded a ModelCall but the runtime has no llm."""

    def __init__(self, *, run_id: str, position: int, step: str) -> None:
        self.run_id, self.position, self.step = run_id, position, step
        super().__init__(
            f"run {run_id} step {position} is {step} but the runtime has no llm; pass "
            f"Runtime(llm=...) and resume the run"
        )


class BadStepError(DurablError, ValueError):
    """A step built with arguments it cannot run with (``Parallel([])``, a nested Parallel, a
    ChildRun of a workflow that is not registered). Raised where the step is built; a run that
    raises it is held, not failed: nothing is written, and a deploy that fixes the code resumes
    it. ``at`` names the run and the position the step would have taken, once known."""

    def __init__(self, problem: str, *, at: str | None = None) -> None:
        self.problem, self.at = problem, at
        super().__init__(problem if at is None else f"{at}: {problem}")

    def where(self, run_id: str, position: int) -> BadStepError:
        """The same error, naming the run and the step."""
        return BadStepError(self.problem, at=f"run {run_id} step {position}")


def not_a_step(*, workflow: str, yielded: Any) -> TypeError:
    """What is thrown into a workflow that yielded something other than a step. A plain
    TypeError, not a class of its own: its name is recorded when the run fails on it."""
    return TypeError(
        f"workflow {workflow!r} yielded {yielded!r} ({type(yielded).__name__}), which is not a "
        f"step: yield ModelCall, ToolCall or Sleep"
    )


class EncodingError(DurablError, TypeError):
    """A value cannot be represented in durabl's canonical JSON form."""

    def __init__(self, *, what: str, reason: str) -> None:
        self.what, self.reason = what, reason
        super().__init__(
            f"{what} cannot be recorded: it is not plain JSON data "
            f"(dict with str keys, list, str, int, float, bool, None): {reason}"
        )


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
        kind = record.get("class")
        if kind == "BudgetExceeded":
            return BudgetExceeded(record["message"])
        if kind == "ChildRunFailed":
            return ChildRunFailed(
                record["name"], record["error_type"], record["message"], child=record["child"]
            )
        cls = ModelCallFailed if kind == "ModelCallFailed" else ToolFailed
        return cls(record["name"], record["error_type"], record["message"], record["attempts"])


class ToolFailed(StepFailed):
    """A tool call failed for good (retries exhausted, or a non-retryable error)."""

    @property
    def tool(self) -> str:
        return self.step_name


class ModelCallFailed(StepFailed):
    """A model call failed for good (retries exhausted, or a non-retryable error)."""


class BudgetExceeded(StepFailed):
    """A model call was refused before it was made: it would take the run (and the runs it
    started) past its ``Budget``. Thrown into the workflow at the ModelCall, which may catch
    it; recorded, so a replay throws it at the same point."""

    def __init__(self, message: str) -> None:
        super().__init__("ModelCall", "BudgetExceeded", message)

    def describe(self) -> str:
        return f"ModelCall refused: {self.message}"


class ChildRunFailed(StepFailed):
    """A child run ended without a result (it failed, or was cancelled): thrown into the
    parent at its ChildRun. ``child`` is the child's run id; ``error_type`` is the child's
    error's type (``RunCancelled`` for a cancelled child)."""

    def __init__(self, step_name: str, error_type: str, message: str, *, child: str) -> None:
        self.child = child
        super().__init__(step_name, error_type, message)

    def describe(self) -> str:
        return f"{self.step_name} (run {self.child}) ended without a result: {self.error_type}: {self.message}"

    def to_record(self) -> dict[str, Any]:
        return {**super().to_record(), "child": self.child}


class IdempotencyKeyConflict(DurablError):
    """An idempotency key was reused with a different tool or different arguments."""

    def __init__(
        self, *, key: str, first_run_id: str, first_tool: str, run_id: str, position: int, step: str
    ) -> None:
        self.key, self.first_run_id, self.first_tool = key, first_run_id, first_tool
        self.run_id, self.position, self.step = run_id, position, step
        super().__init__(
            f"idempotency key {key!r} was first used by run {first_run_id} for tool "
            f"{first_tool!r} with other arguments; run {run_id} step {position} reuses it for "
            f"{step}. One key names one effect: derive keys from what they protect."
        )


class CommandFailed(DurablError):
    """A command exited with a non-zero status."""

    def __init__(self, *, command: Any, returncode: int, stderr: str) -> None:
        self.command, self.returncode, self.stderr = command, returncode, stderr
        tail = stderr.strip().splitlines()[-1:] or ["(no output on stderr)"]
        super().__init__(f"command {command!r} exited with {returncode}: {tail[0]}")


class CommandTimedOut(DurablError):
    """A command ran past its timeout; its whole process group was killed."""

    def __init__(self, *, command: Any, timeout_s: float | None) -> None:
        self.command, self.timeout_s = command, timeout_s
        super().__init__(f"command {command!r} ran past {timeout_s} s and was killed")
