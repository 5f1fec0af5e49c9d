"""What the runtime reports: a run's state, a dead letter, what compaction did, and how far one
pass through a run has got."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict


class RunState(BaseModel):
    """A run as the caller sees it. ``steps_replayed``/``steps_executed`` count, for the call
    that produced this state, the steps served from the log and the steps that ran for real."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    workflow: str
    status: str
    result: Any = None
    error: str | None = None
    steps_replayed: int = 0
    steps_executed: int = 0
    wake_at_s: float | None = None
    next_step: str | None = None


class DeadLetter(BaseModel):
    """A run stopped on a step durabl will not guess about."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    workflow: str
    step: int
    seq: int
    step_description: str
    reason: str
    idempotency_key: str | None = None


class RunCompaction(BaseModel):
    """What compaction did to one run."""

    run_id: str
    steps_folded: int
    """Steps now held by the snapshot (in all, over every compaction of the run)."""
    events_deleted: int
    watermark: int
    """The log now starts after this seq."""
    events_kept: int


class Compaction(BaseModel):
    """What ``Runtime.compact`` did."""

    runs: list[RunCompaction] = []
    busy: list[str] = []
    """Runs skipped because another live process is driving them."""
    errors: dict[str, str] = {}
    """Runs that could not be folded (a damaged log, say), with the reason; the others were."""
    bytes_before: int | None = None
    """The file's size (WAL included) before anything was folded; None without reclaim."""
    bytes_after: int | None = None
    """Its size once the folded space was handed back."""


@dataclass(slots=True)
class Progress:
    """How far one pass through a run has got: the position of the step in hand (0 before the
    first), and the steps served from the log and executed for real so far."""

    position: int = 0
    replayed: int = 0
    executed: int = 0


__all__ = ["Compaction", "DeadLetter", "Progress", "RunCompaction", "RunState"]
