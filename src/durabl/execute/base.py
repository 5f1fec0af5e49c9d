"""What an executor is handed: the step, what the log says of it, and the runtime's services."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from durabl.events import Event
from durabl.journal import Journal
from durabl.modelcall import Chunk
from durabl.prices import Price
from durabl.replay import History, StepRecord
from durabl.steps import Step
from durabl.store.base import RunRow
from durabl.tools import RetryPolicy, Tool

if TYPE_CHECKING:
    from concurrent.futures import Executor as Pool


class Children(Protocol):
    """What a ChildRun asks of the engine that drives its run."""

    def child_run(
        self,
        workflow: str,
        input_text: str,
        run_id: str,
        parent: tuple[str, int],
        budget: dict[str, Any] | None = None,
    ) -> tuple[RunRow, Event]:
        """The child's row (leased to this runtime) and RUN_STARTED, naming ``parent`` (the
        parent's run id and step) and carrying the parent's ``budget``; ``UnknownWorkflowError``
        for a workflow not registered, ``TypeError`` for an input its parameters cannot take."""

    def next_run(self, history: History, input_text: str) -> tuple[RunRow, Event]:
        """The row (leased to this runtime) and RUN_STARTED of the run a ContinueAsNew in the
        run of ``history`` goes on as: the same workflow, ``input_text``, a new id."""

    def drive_child(self, run_id: str, *, fresh: bool) -> None:
        """Drive the child as far as it goes now (``fresh``: just created, under the lease it
        was created with); a child this process cannot drive now is left as it is."""


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
    decide: Callable[[History, int, Step], tuple[str, StepRecord | None]]
    """The replay decision (the runtime's seam), for the branches of a Parallel."""
    pool: Callable[[], Pool]
    """The runtime's bounded pool of threads, made when a Parallel first needs it."""
    stopping: Callable[[], bool]
    """True once the runtime is stopping: no new branch of a Parallel begins."""
    children: Children | None = None
    """The engine, for ChildRun (set once the engine exists)."""
    call_model: Callable[[Callable[..., Any], Any, dict[str, Any]], Any] = (
        lambda llm, prompt, params: llm(prompt, **params)
    )
    """Hand control to the model client: ``llm(prompt, **params)``."""
    prices: Mapping[str, Price] = field(default_factory=dict)
    """The price table model answers are priced by (``durabl.prices``)."""
    on_chunk: Callable[[Chunk], None] | None = None
    """Where a streamed answer's pieces go as they arrive (``Runtime(on_chunk=...)``)."""


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
