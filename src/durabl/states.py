"""What the runtime reports: a run's state, a dead letter, and how far one pass through a run has
got. (What the operator's tools report, a check and a compaction, is in ``durabl.upkeep``.)

Plain dataclasses: the runtime builds them from values it has checked already, so they validate
nothing. ``as_dict`` gives the JSON form the command line prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


class Report:
    """A record the runtime hands back, and prints as JSON through ``as_dict``."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        """The fields as a new dict of JSON types (nested records become dicts)."""
        return asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunState(Report):
    """A run as the caller sees it. ``steps_replayed``/``steps_executed`` count, for the call
    that produced this state, the steps served from the log and the steps that ran for real."""

    run_id: str
    workflow: str
    status: str
    result: Any = None
    error: str | None = None
    steps_replayed: int = 0
    steps_executed: int = 0
    wake_at_s: float | None = None
    next_step: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter(Report):
    """A run stopped on a step durabl will not guess about."""

    run_id: str
    workflow: str
    step: int
    seq: int
    step_description: str
    reason: str
    idempotency_key: str | None = None


@dataclass(slots=True)
class Progress:
    """How far one pass through a run has got: the position of the step in hand (0 before the
    first), and the steps served from the log and executed for real so far."""

    position: int = 0
    replayed: int = 0
    executed: int = 0


__all__ = ["DeadLetter", "Progress", "RunState"]
