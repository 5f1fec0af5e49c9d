"""What the dashboard server keeps of each run between one poll and the next: the runs it is
linked to (its parent, its children, the runs before and after it in a ContinueAsNew chain) and
its figures (``durabl.metrics``: its steps, what its model answers cost, what a crash made it
spend again).

Both are folded from the whole log (``reads.Lineage``, ``metrics.MetricsFold``), and a page
watching a run polls twice a second for only the events after the last seq it holds: folding the
log afresh would make every poll cost the whole log. So the server keeps each run's folds, folds
into them the new events the poll reads anyway, and reads the whole history only the first time
it is asked about a run (when the page's first poll reads it all too) or when compaction has
removed events it had not folded yet.

The spend of a run with the runs it started (what ``durabl.ledger.spend`` sums) comes from the
same folds: each run of that tree is read for the events it got since the last poll, and a run
that has ended (its log gets no more events) is not read again at all.
"""

from __future__ import annotations

import copy
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

from durabl import events
from durabl.events import Event
from durabl.ledger import Spend
from durabl.metrics import Metrics, MetricsFold
from durabl.replay import read_snapshot
from durabl.store import Store
from durabl.store.base import RunRow
from durabl.store.reads import Lineage, continued_as, lineage

KEPT_RUNS = 256
"""How many runs' folds are kept; the run asked about longest ago is dropped first."""
MOST_TREE_RUNS = 100
"""How many runs a tree's spend sums on a poll (the run itself included): past that the sum
says it is incomplete, and ``durabl metrics RUN`` gives all of it."""
_NO_EVENTS = sys.maxsize  # an after_seq past every event: fold, return nothing


@dataclass(slots=True)
class RunFold:
    """One run's folds as far as the server has read its log. ``figures`` is None when they
    cannot be known: a compacted prefix whose snapshot is missing. ``ended``: the run had ended
    when it was read, so nothing will be added to its log."""

    lineage: Lineage
    figures: MetricsFold | None
    ended: bool = False
    continued_as: str | None = None
    """For an ended run, the run it continued as (``reads.continued_as``)."""

    @property
    def seq(self) -> int:
        return self.lineage.seq

    @property
    def metrics(self) -> Metrics | None:
        return None if self.figures is None else self.figures.m

    def fold(self, event: Event) -> None:
        self.lineage.fold(event)
        if self.figures is not None:
            self.figures.apply(event)

    def copy(self) -> RunFold:
        return RunFold(self.lineage.copy(), copy.deepcopy(self.figures))


@dataclass(frozen=True, slots=True)
class TreeSpend:
    """``ledger.Spend`` over a run and the runs it started; ``complete`` is False when the tree
    has more runs than a poll sums, or a run whose figures cannot be known."""

    spend: Spend
    complete: bool


class RunFolds:
    """Each run's folds as far as the server has read its log. Safe across threads: a poll
    folds into a copy and puts it back, so a request never sees another one's half-done fold,
    and a fold put back is never changed again."""

    def __init__(self, kept: int = KEPT_RUNS) -> None:
        self._lock = threading.Lock()
        self._runs: OrderedDict[str, RunFold] = OrderedDict()
        self._kept = kept

    def clear(self) -> None:
        """Forget every run: the file at the path is another one."""
        with self._lock:
            self._runs.clear()

    def read(self, store: Store, row: RunRow, after_seq: int) -> tuple[list[Event], RunFold]:
        """The run's events after ``after_seq`` (not before its watermark), and its folds with
        every event up to the newest folded in."""
        with self._lock:
            known = self._runs.get(row.run_id)
        if known is not None and known.seq < row.watermark:
            known = None
        if known is not None and known.ended and after_seq >= known.seq:
            self._keep(row.run_id, known)
            return [], known  # an ended run's log gets nothing after its end
        fresh: list[Event] = []
        if known is not None:
            start = min(after_seq, known.seq)
            log = store.load_log(row.run_id, after_seq=start)
            if log and log[0].seq != start + 1:
                known = None  # compacted since: the events in between are in the snapshot
            elif any(e.seq > known.seq for e in log):
                known = known.copy()
                for event in log:
                    if event.seq > known.seq:
                        known.fold(event)
                fresh = [e for e in log if e.seq > after_seq]
            else:
                fresh = [e for e in log if e.seq > after_seq]
        if known is None:
            known, log = _fold_history(store, row.run_id)
            fresh = [e for e in log if e.seq > after_seq]
        if row.status in events.TERMINAL_STATUSES and not known.ended:
            known = RunFold(known.lineage, known.figures, True, continued_as(row))
        self._keep(row.run_id, known)
        return fresh, known

    def spend(self, store: Store, row: RunRow, fold: RunFold) -> TreeSpend:
        """The spend of ``row``'s run (whose folds are ``fold``) and every run it started,
        theirs in turn, as ``ledger.spend`` sums it, over at most ``MOST_TREE_RUNS`` runs."""
        tokens, cost, unpriced, runs, complete = 0, 0.0, 0, 0, True
        todo: list[tuple[str, RunFold | None, str | None]] = [(row.run_id, fold, continued_as(row))]
        done: set[str] = set()
        while todo:
            run_id, found, after = todo.pop(0)
            if run_id in done:
                continue
            if runs == MOST_TREE_RUNS:
                complete = False
                break
            if found is None:
                found, after = self._member(store, run_id)
                if found is None:
                    continue  # named, but not in this database
            done.add(run_id)
            runs += 1
            figures = found.metrics
            if figures is None:
                complete = False
            else:
                tokens += figures.total_tokens
                cost += figures.cost_usd
                unpriced += figures.unpriced_model_calls
            todo.extend((child, None, None) for _, child in sorted(found.lineage.children.items()))
            if after is not None:
                todo.append((after, None, None))
        return TreeSpend(Spend(tokens, cost, unpriced, runs), complete)

    def _member(self, store: Store, run_id: str) -> tuple[RunFold | None, str | None]:
        """A run of a tree: its folds and the run it continued as. An ended run's are taken as
        kept, with no read; another's are brought up to date."""
        with self._lock:
            known = self._runs.get(run_id)
        if known is not None and known.ended:
            self._keep(run_id, known)
            return known, known.continued_as
        row = store.get_run(run_id)
        if row is None:
            return None, None
        _, found = self.read(store, row, _NO_EVENTS)
        return found, continued_as(row)

    def _keep(self, run_id: str, fold: RunFold) -> None:
        with self._lock:
            self._runs[run_id] = fold
            self._runs.move_to_end(run_id)
            while len(self._runs) > self._kept:
                self._runs.popitem(last=False)


def _fold_history(store: Store, run_id: str) -> tuple[RunFold, list[Event]]:
    """A run's folds from its whole history (its snapshot, then its log), and that log."""
    history = store.load_history(run_id)
    watermark, snapshot, log = history
    found = lineage(store, run_id, history)
    figures: MetricsFold | None
    if snapshot is not None:
        figures = MetricsFold.of(log, read_snapshot(run_id, snapshot)["metrics"])
    else:
        figures = None if watermark else MetricsFold.of(log)
    return RunFold(found, figures), log
