"""Reads that more than one caller of a ``Store`` needs, written once on top of the protocol.

The runtime and the command line both look runs up here, so a missing run is reported in the
same words wherever it is asked for; the command line and the dashboard both say from here what
a waiting run waits for, and which runs a run is linked to: the parent that started it, the
children it started, and the runs before and after it in a chain of ContinueAsNew.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from durabl import codec, events
from durabl.events import Event
from durabl.replay import read_snapshot
from durabl.steps import child_run_id
from durabl.store.base import RunRow, Store, require_run

_SIGNAL, _CHILD = '["signal"', '["child"'

__all__ = ["Lineage", "continued_as", "lineage", "links", "require_run", "waiting_for"]


def waiting_for(store: Store, row: RunRow) -> dict[str, Any] | None:
    """What a WAITING run waits for, and since when; None for a run that is not waiting.

    Read from the end of its log, where its last step is the wait: a WaitSignal gives the
    signal's name, when the wait began and when it times out (``timeout_at_s``, None: never);
    a ChildRun not yet finished gives the child's run id (``child``) and when it was started.
    """
    if row.status != events.WAITING:
        return None
    armed: dict[int, float] = {}
    finished: set[int] = set()
    for event in reversed(store.load_log(row.run_id)):
        if event.kind == events.TIMER_ARMED:
            armed[event.step] = codec.decode(event.data or "{}")["fire_at_s"]
        if event.kind in (events.STEP_COMPLETED, events.STEP_FAILED):
            finished.add(event.step)
        if event.kind == events.TOOL_COMPLETED:
            return None  # the last step is a tool's, finished: the run is about to go on
        if event.kind != events.STEP_STARTED:
            continue
        data = event.data or ""
        if data.startswith(_SIGNAL):
            _, name, _timeout = codec.decode(data)
            # The wait's own deadline: the run's timer is moved to now when a signal comes.
            timeout_at_s = armed.get(event.step)
            return {"signal": name, "since_s": event.at_s, "timeout_at_s": timeout_at_s}
        if data.startswith(_CHILD) and event.step not in finished:
            _, _workflow, _input, explicit = codec.decode(data)
            child = child_run_id(row.run_id, event.step, explicit)
            return {"child": child, "since_s": event.at_s}
        return None  # the last step is not a wait: the run is about to be driven on
    return None


@dataclass(slots=True)
class Lineage:
    """The runs a run's log names, folded from its events one at a time (``fold``): the
    parent (run id, step) whose ChildRun started it, the run it continued from, and the child
    run each of its ChildRun steps started (step -> run id). ``seq``: the last event folded."""

    run_id: str
    seq: int = 0
    parent: tuple[str, int] | None = None
    continued_from: str | None = None
    children: dict[int, str] = field(default_factory=dict)
    copied_until: int = 0
    """For a fork, the last seq copied from the run it came from: the ChildRun steps up to it
    were the other run's, and their children are that run's."""

    def fold(self, event: Event) -> None:
        if event.kind == events.RUN_STARTED:
            data = codec.decode(event.data or "{}")
            parent = data.get("parent")
            if parent is not None:
                self.parent = (parent["run_id"], parent["step"])
            self.continued_from = data.get("continued_from")
            forked = data.get("forked_from")
            self.copied_until = int(forked["seq"]) if isinstance(forked, dict) else 0
        elif (
            event.kind == events.STEP_STARTED
            and (event.data or "").startswith(_CHILD)
            and event.seq > self.copied_until
        ):
            _, _workflow, _input, explicit = codec.decode(event.data or "[]")
            self.children[event.step] = child_run_id(self.run_id, event.step, explicit)
        self.seq = max(self.seq, event.seq)

    def copy(self) -> Lineage:
        return replace(self, children=dict(self.children))


def lineage(store: Store, run_id: str, history: tuple[int, str | None, list[Event]]) -> Lineage:
    """The lineage of a run from what ``Store.load_history`` gave for it: its compaction
    snapshot, if any, then the log after it."""
    watermark, snapshot, log = history
    found = Lineage(run_id, seq=watermark)
    if snapshot is not None:
        _from_snapshot(store, found, read_snapshot(run_id, snapshot))
    for event in log:
        found.fold(event)
    return found


def _from_snapshot(store: Store, found: Lineage, data: dict[str, Any]) -> None:
    """What a compaction snapshot still tells: the parent, and the children of the folded
    ChildRun steps whose id was derived. A snapshot keeps a step's description, not the id a
    ChildRun gave, so a derived id is taken only if that run names this step as its parent."""
    parent = data.get("parent")
    if parent is not None:
        found.parent = (parent[0], parent[1])
    found.continued_from = found.continued_from or data.get("continued_from")
    for position, _fp, _first, _done, _attempts, _retries, about, *_ in data["steps"]:
        if isinstance(about, str) and about.startswith("ChildRun("):
            candidate = child_run_id(found.run_id, position, None)
            if _parent_of(store, candidate) == (found.run_id, position):
                found.children[position] = candidate


def _parent_of(store: Store, run_id: str) -> tuple[str, int] | None:
    """The parent and step a run names (in its snapshot or its RUN_STARTED); None for a run
    that names none, or is not in the database."""
    if store.get_run(run_id) is None:
        return None
    _, snapshot, log = store.load_history(run_id)
    if snapshot is not None:
        parent = read_snapshot(run_id, snapshot).get("parent")
        return None if parent is None else (parent[0], parent[1])
    first = Lineage(run_id)
    for event in log[:1]:
        first.fold(event)
    return first.parent


def continued_as(row: RunRow) -> str | None:
    """The run a CONTINUED run went on as (its result names it); None for any other run."""
    if row.status != events.CONTINUED or row.result_text is None:
        return None
    next_id = codec.decode(row.result_text).get("continued_as")
    return next_id if isinstance(next_id, str) else None


def links(
    store: Store, row: RunRow, found: Lineage, *, most_children: int | None = None
) -> dict[str, Any]:
    """The runs linked to ``row``'s run, each with its status now (None: not in the database):
    ``parent`` (with the parent's step that started it), ``continued_from``, ``continued_as``,
    and ``children`` in step order (the first ``most_children`` of them, if given; their
    number is ``children_count``). None where a link does not apply."""

    def linked(run_id: str | None, **more: Any) -> dict[str, Any] | None:
        if run_id is None:
            return None
        other = store.get_run(run_id)
        return {"run_id": run_id, **more, "status": None if other is None else other.status}

    parent = found.parent
    children = sorted(found.children.items())[:most_children]
    return {
        "parent": None if parent is None else linked(parent[0], step=parent[1]),
        "continued_from": linked(found.continued_from),
        "continued_as": linked(continued_as(row)),
        "children": [linked(run_id, step=step) for step, run_id in children],
        "children_count": len(found.children),
    }
