"""Event kinds and the event record: the vocabulary of the log.

An event row is (run_id, seq, kind, step, fp, data, at_s, crc). ``step`` is the position of the
step inside the workflow (0 for run-level events); ``fp`` is the step fingerprint on the events
that identify a step; ``data`` is canonical JSON text or NULL.
"""

from __future__ import annotations

from typing import NamedTuple

from durabl import codec

RUN_STARTED = "RUN_STARTED"
"""The run exists: data holds the workflow name and the input."""
RUN_RESUMED = "RUN_RESUMED"
"""A new process took the run over: everything before it was served from the log after this."""
STEP_STARTED = "STEP_STARTED"
"""An attempt at a step began; fp identifies the step, data is its canonical text."""
TOOL_DISPATCHED = "TOOL_DISPATCHED"
"""Control is about to leave durabl for a tool; past this point a crash is ambiguous."""
STEP_COMPLETED = "STEP_COMPLETED"
"""The step's result (data); for a tool, committed with its side_effects row."""
TOOL_COMPLETED = "TOOL_COMPLETED"
"""An attempt at an ``IDEMPOTENT`` tool with a derived key that opened and succeeded in one
commit, as one event: it stands for STEP_STARTED, TOOL_DISPATCHED and STEP_COMPLETED at the same
seq. fp identifies the step; data is ``[canonical text, result]`` (``codec.pair``); committed
with the tool's side_effects row. ``expanded`` gives the three events it stands for."""
STEP_FAILED = "STEP_FAILED"
"""The step failed for good; data is the failure thrown into the workflow (and on replay)."""
STEP_PARTIAL = "STEP_PARTIAL"
"""A streamed model answer's text so far (data: attempt and text), recorded now and then while
it streams, without an fsync: what a crash mid-stream leaves of the answer."""
STEP_RETRY = "STEP_RETRY"
"""An attempt failed and another is scheduled; data holds the error and retry_at_s."""
TIMER_ARMED = "TIMER_ARMED"
"""A Sleep's deadline (data: fire_at_s), recorded once when first reached."""
TIMER_FIRED = "TIMER_FIRED"
"""The Sleep is over; written in the same transaction that disarms the timer."""
CTX_RECORDED = "CTX_RECORDED"
"""A ctx.now()/random()/uuid() value (data), recorded on first execution."""
DEAD_LETTERED = "DEAD_LETTERED"
"""An AT_MOST_ONCE step was interrupted inside the ambiguous window; the run stops here."""
DLQ_REDRIVEN = "DLQ_REDRIVEN"
"""An operator asked for the dead-lettered step to be called again."""
DLQ_RESOLVED = "DLQ_RESOLVED"
"""An operator supplied the dead-lettered step's result (the STEP_COMPLETED that follows)."""
RUN_COMPLETED = "RUN_COMPLETED"
"""The workflow returned; data is its result."""
RUN_FAILED = "RUN_FAILED"
"""The workflow raised; data describes the error."""
RUN_CANCELLED = "RUN_CANCELLED"
"""An operator cancelled the run."""
RUN_CONTINUED = "RUN_CONTINUED"
"""The workflow continued as a new run (ContinueAsNew): data names the next run, created in the
same transaction, which goes on with a fresh log."""

TERMINAL = frozenset({RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED, RUN_CONTINUED})

STEP_ENDS = frozenset({STEP_COMPLETED, TOOL_COMPLETED, STEP_FAILED, TIMER_FIRED, CTX_RECORDED})
"""The events that end a step: each finished position's last event."""


class Event(NamedTuple):
    """One row of the log, as the store hands it back (checksum already verified)."""

    seq: int
    kind: str
    step: int
    fp: str | None
    data: str | None
    at_s: float


def expanded(event: Event) -> tuple[Event, ...]:
    """``event`` as the events it stands for: a TOOL_COMPLETED as its STEP_STARTED,
    TOOL_DISPATCHED and STEP_COMPLETED (all at its seq), any other event as itself. For readers
    that follow a step's attempts event by event (the metrics, the spans, the command line)."""
    if event.kind != TOOL_COMPLETED:
        return (event,)
    seq, _, step, fp, data, at_s = event
    canonical, result = codec.unpair(data or "[null,null]")
    return (
        Event(seq, STEP_STARTED, step, fp, canonical, at_s),
        Event(seq, TOOL_DISPATCHED, step, None, None, at_s),
        Event(seq, STEP_COMPLETED, step, None, result, at_s),
    )


# Run statuses (strings, stable: they are stored and shown).
RUNNING = "RUNNING"
SLEEPING = "SLEEPING"
WAITING = "WAITING"
"""Parked on a WaitSignal: due again when a signal is sent to it, or at its timeout."""
HELD = "HELD"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
DEAD_LETTERED = "DEAD_LETTERED"
CANCELLED = "CANCELLED"
CONTINUED = "CONTINUED"
"""Ended by ContinueAsNew: its result names the run that goes on (``continued_as``)."""
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, CONTINUED})
