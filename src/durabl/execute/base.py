"""What an executor is handed: the step, what the log says of it, and the runtime's services."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durabl.journal import Journal
from durabl.replay import StepRecord
from durabl.steps import Step
from durabl.tools import RetryPolicy, Tool


@dataclass(frozen=True, slots=True)
class Services:
    """The runtime's configuration as the executors see it."""

    llm: Callable[..., Any] | None
    tools: dict[str, Tool]
    retry: RetryPolicy
    policy: Callable[[Tool], RetryPolicy]
    """The retry policy of one tool (its own, or the runtime's)."""
    call_tool: Callable[[Tool, dict[str, Any]], Any]
    """Hand control to a tool: the only place durabl calls one (a seam, see ``Runtime``)."""


@dataclass(frozen=True, slots=True)
class StepCall:
    """One step to execute for real: the replay decision said the log has no outcome for it."""

    journal: Journal
    step: Step
    rec: StepRecord | None
    """What the log holds at this position (an attempt begun, a timer armed), or None."""
    action: str
    """The replay decision (``replay.EXECUTE``, ``RESTART``, ``AMBIGUOUS``, ``WAIT`` ...)."""
    now: Callable[[], float]
    services: Services
    draw: Callable[[], Any] | None = None
    """For a ctx value: where the value comes from the first time."""

    @property
    def run_id(self) -> str:
        return self.journal.run_id

    @property
    def position(self) -> int:
        return self.journal.progress.position

    def executed(self) -> None:
        """Count the step as executed for real in this pass."""
        self.journal.progress.executed += 1


Executor = Callable[[StepCall], Any]
