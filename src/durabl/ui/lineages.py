"""The runs each run is linked to (its parent, its children, the runs before and after it in a
ContinueAsNew chain), kept by the dashboard server between one poll and the next.

They are folded from the whole log (``reads.Lineage``), and a page watching a run polls twice a
second for only the events after the last seq it holds: folding the log afresh would make every
poll cost the whole log. So the server keeps each run's lineage, folds into it the new events
the poll reads anyway, and reads the whole history only the first time it is asked about a run
(when the page's first poll reads it all too) or when compaction has removed events it had not
folded yet.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from durabl.events import Event
from durabl.store import Store
from durabl.store.base import RunRow
from durabl.store.reads import Lineage, lineage

KEPT_RUNS = 256
"""How many runs' lineages are kept; the run asked about longest ago is dropped first."""


class Lineages:
    """Each run's lineage as far as the server has read its log. Safe across threads: a poll
    folds into a copy and puts it back, so a request never sees another one's half-done fold."""

    def __init__(self, kept: int = KEPT_RUNS) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, Lineage] = OrderedDict()
        self._kept = kept

    def clear(self) -> None:
        """Forget every run: the file at the path is another one."""
        with self._lock:
            self._runs.clear()

    def read(self, store: Store, row: RunRow, after_seq: int) -> tuple[list[Event], Lineage]:
        """The run's events after ``after_seq`` (not before its watermark), and its lineage
        with every event up to the newest folded in."""
        with self._lock:
            known = self._runs.get(row.run_id)
            known = None if known is None or known.seq < row.watermark else known.copy()
        fresh: list[Event] = []
        if known is not None:
            start = min(after_seq, known.seq)
            log = store.load_log(row.run_id, after_seq=start)
            if log and log[0].seq != start + 1:
                known = None  # compacted since: the events in between are in the snapshot
            else:
                for event in log:
                    if event.seq > known.seq:
                        known.fold(event)
                fresh = [e for e in log if e.seq > after_seq]
        if known is None:
            history = store.load_history(row.run_id)
            known = lineage(store, row.run_id, history)
            fresh = [e for e in history[2] if e.seq > after_seq]
        with self._lock:
            self._runs[row.run_id] = known
            self._runs.move_to_end(row.run_id)
            while len(self._runs) > self._kept:
                self._runs.popitem(last=False)
        return fresh, known
