"""What an executor is handed: the step, what the log says of it, and the runtime's services."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durabl.journal import Journal
from durabl.replay import StepRecord
from durabl.steps import Step
from durabl.tools import RetryPolicy, Tool


@dataclass(slots=True)
class Services:
    """The runtime's configuration as the executors see it."""

    llm: Callable[..., Any] | None
    tools: dict[str, Tool]
    retry: RetryPolicy
    policy: Callable[[Tool], RetryPolicy]
    """The retry policy of one tool (its own, or the runtime's)."""
    call_tool: Callable[[Tool, dict[str, Any]], Any]
    """Hand control to a tool: the only place durabl calls one (a seam, see ``Runtime``)."""


class StepCall:
    """One step to execute for real: the replay decision said the log has no outcome for it."""

    __slots__ = (
        "action",
        "draw",
        "journal",
        "now",
        "position",
        "rec",
        "run_id",
        "services",
        "step",
    )

    def __init__(
        self,
        journal: Journal,
        step: Step,
        rec: StepRecord | None,
        action: str,
        now: Callable[[], float],
        services: Services,
        draw: Callable[[], Any] | None = None,
    ) -> None:
        self.journal = journal
        self.step = step
        self.rec = rec
        """What the log holds at this position (an attempt begun, a timer armed), or None."""
        self.action = action
        """The replay decision (``replay.EXECUTE``, ``RESTART``, ``AMBIGUOUS``, ``WAIT`` ...)."""
        self.now = now
        self.services = services
        self.draw = draw
        """For a ctx value: where the value comes from the first time."""
        self.run_id = journal.run_id
        self.position = journal.progress.position
        """The step's position: fixed for the call, however far the pass gets after it."""

    def executed(self) -> None:
        """Count the step as executed for real in this pass."""
        self.journal.progress.executed += 1


Executor = Callable[[StepCall], Any]
