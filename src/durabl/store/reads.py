"""Reads that more than one caller of a ``Store`` needs, written once on top of the protocol.

The runtime and the command line both look runs up here, so a missing run is reported in the
same words wherever it is asked for; the command line and the dashboard both say what a
waiting run waits for from here.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, events
from durabl.errors import RunNotFoundError
from durabl.store.base import RunRow, Store


def require_run(store: Store, run_id: str) -> RunRow:
    """The run's row; ``RunNotFoundError`` naming the run and the database when there is none."""
    row = store.get_run(run_id)
    if row is None:
        raise RunNotFoundError(run_id=run_id, path=store.path)
    return row


def waiting_for(store: Store, row: RunRow) -> dict[str, Any] | None:
    """What a WAITING run waits for, and since when: the signal's name, when the wait began,
    and when it times out (None: never); None for a run that is not waiting. Read from the end
    of its log, which ends with the wait's events."""
    if row.status != events.WAITING:
        return None
    armed: dict[int, float] = {}
    for event in reversed(store.load_log(row.run_id)):
        if event.kind == events.TIMER_ARMED:
            armed[event.step] = codec.decode(event.data or "{}")["fire_at_s"]
        if event.kind == events.STEP_STARTED and (event.data or "").startswith('["signal"'):
            _, name, _timeout = codec.decode(event.data or "[]")
            # The wait's own deadline: the run's timer is moved to now when a signal comes.
            timeout_at_s = armed.get(event.step)
            return {"signal": name, "since_s": event.at_s, "timeout_at_s": timeout_at_s}
    return None
