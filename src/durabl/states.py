"""What the runtime reports: a run's state, a dead letter, what compaction did, and how far one
pass through a run has got.

Plain dataclasses: the runtime builds them from values it has checked already, so they validate
nothing. ``as_dict`` gives the JSON form the command line prints.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
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


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCheck(Report):
    """What replaying one stored run against the code at hand, dry, found (``Runtime.check``).

    ``breaks``: a deploy of this code would hold the run (it is not finished, and its replay
    differs or cannot run). A finished run that differs is reported, but nothing holds it."""

    run_id: str
    workflow: str
    status: str
    ok: bool
    breaks: bool
    problem: str | None = None
    """Why the replay differs or could not run: the error a resume would raise."""
    seq: int | None = None
    """Where the log and the code first differ: the log's seq, the step's position, and what
    each says is there."""
    position: int | None = None
    expected: str | None = None
    actual: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompaction(Report):
    """What compaction did to one run."""

    run_id: str
    steps_folded: int
    """Steps now held by the snapshot (in all, over every compaction of the run)."""
    events_deleted: int
    watermark: int
    """The log now starts after this seq."""
    events_kept: int


@dataclass(slots=True, kw_only=True)
class Compaction(Report):
    """What ``Runtime.compact`` did. Filled in as the runs are folded, so not frozen."""

    runs: list[RunCompaction] = field(default_factory=list)
    busy: list[str] = field(default_factory=list)
    """Runs skipped because another live process is driving them."""
    errors: dict[str, str] = field(default_factory=dict)
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
