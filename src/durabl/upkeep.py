"""What the operator's tools report: a stored run checked against the code at hand
(``Runtime.check``) and what compaction did (``Runtime.compact``).

Apart from ``durabl.states`` because nothing on the way to a run's first step needs them: each
dataclass costs its import a fraction of a millisecond, and ``import durabl`` would pay for
these without using them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from durabl.states import Report


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
