"""The one write path: how a pass through a run appends to its log and changes its row.

Every write a drive makes goes through the journal. ``Journal.append`` writes the events for
the step in hand and the run row's new status, timer, result or error, in one transaction,
fenced by the run's lease token so that a stale owner's write is refused inside the database.
The commit nearly every step makes, a tool call's completion with its side_effects row and
nothing else, has a method of its own, ``append_tool_result``, which hands the store that
commit's parts. After the database has taken a write, the journal folds the same events into
the in-memory history, so the two never disagree.

``Writer`` is what every journal of one runtime instance shares: the store, the clock, the
process boundary, and which runs this instance has written to. The first write it makes to a run
it did not start is preceded, in the same transaction, by ``RUN_RESUMED``: the boundary between
two processes, recorded so that the log alone can show it.

A seam: ``Runtime.journal_class`` names the journal a runtime opens, so that the chaos harness's
deliberately broken runtimes can plant a bug in ``append`` and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabl import codec, events
from durabl.errors import ChildRunFailed
from durabl.events import Event
from durabl.replay import History
from durabl.states import Progress
from durabl.steps import Step
from durabl.store.base import (
    UNCHANGED,
    Commit,
    KeyClaim,
    ParentNote,
    RunRow,
    SideEffect,
    Store,
    ToolResult,
)

KEEP = UNCHANGED
"""Default for ``Journal.append``'s ``wake_at_s``: leave the run's timer as it is."""

NewEvent = tuple[str, str | None, str | None]
"""An event to append for the step in hand: (kind, fingerprint, data)."""

_HEALTHY = (events.RUNNING, events.SLEEPING, events.WAITING, events.COMPLETED)


class Writer:
    """The write state one runtime instance shares between its journals."""

    def __init__(
        self,
        store: Store,
        clock: Callable[[], float],
        boundary: dict[str, Any],
        journal_class: type[Journal],
    ) -> None:
        self.store = store
        self.clock = clock
        self.boundary = boundary
        self.journal_class = journal_class
        self.written: set[str] = set()
        """The runs this instance started or appended to (set.add is atomic: worker threads
        share it)."""
        self.observers: list[Callable[[str, list[Event], History], None]] = []
        """Called after each commit that appended events, with the run id, the events and the
        run's history with them folded in (telemetry: ``durabl.telemetry``). A replay commits
        nothing, so it calls nothing."""

    def open(self, row: RunRow, history: History, progress: Progress, token: int | None) -> Journal:
        """A journal for one pass through ``row``'s run, writing with fencing ``token``; with
        ``token`` None (a dry replay), one that refuses to write."""
        return self.journal_class(self, row, history, progress, token)


class Journal:
    """Appends to one run's log for one pass through it."""

    def __init__(
        self,
        writer: Writer,
        row: RunRow,
        history: History,
        progress: Progress,
        token: int | None,
    ) -> None:
        self.writer = writer
        self.run_id = row.run_id
        self.history = history
        self.progress = progress
        self.token = token
        self.status = row.status
        self.error = row.error
        self._plain = type(self).append is Journal.append
        """Whether ``append`` is this class's own: a journal that plants a bug in it (the seam
        above) has every write go through it, the tool results ``append_tool_result`` writes
        too."""

    @property
    def store(self) -> Store:
        return self.writer.store

    def now(self) -> float:
        return self.writer.clock()

    def append(
        self,
        new: list[NewEvent],
        *,
        status: str | None = None,
        step: int | None = None,
        result_text: str | None = None,
        error: str | None = None,
        wake_at_s: float | None = KEEP,
        side_effect: SideEffect | None = None,
        claim: KeyClaim | None = None,
        release_claim: str | None = None,
        durable: bool = False,
        deliver_signal: int | None = None,
        wake_on_signal: str | None = None,
        new_run: tuple[RunRow, Event] | None = None,
        carry_signals: str | None = None,
    ) -> None:
        """Append ``new`` at the step in hand (or at ``step``) and set the run's row, in ONE
        transaction. Without an explicit status, writing events means the run is RUNNING.
        ``new_run``: a run to create in the same transaction (a child, the next of a chain);
        ``carry_signals``: the run that takes over this run's signals no wait has taken.
        The commit that ends a child run records its outcome in its parent's log too."""
        if self.token is None:
            raise AssertionError("a dry replay never writes")
        if status is None:
            status = events.RUNNING if new else self.status
        writer = self.writer
        now_s = writer.clock()
        if error is not None:
            error = codec.storable(error)
        rows = self._rows(new, self.progress.position if step is None else step, now_s)
        clear_error = status in _HEALTHY and error is None and self.error is not None
        writer.store.commit(
            Commit(
                run_id=self.run_id,
                events=rows,
                status=None if status == self.status else status,
                result_text=result_text,
                error=error,
                clear_error=clear_error,
                wake_at_s=wake_at_s,
                side_effect=side_effect,
                claim=claim,
                release_claim=release_claim,
                durable=durable,
                at_s=now_s,
                fence=self.token,
                deliver_signal=deliver_signal,
                wake_on_signal=wake_on_signal,
                new_run=new_run,
                carry_signals=carry_signals,
                parent_note=self._parent_note(rows) if self.history.parent else None,
            )
        )
        if new:
            writer.written.add(self.run_id)
        for row in rows:
            self.history.apply(row)
        if rows:
            for observe in writer.observers:
                observe(self.run_id, rows, self.history)
        self.status = status
        self.error = error if error is not None else (None if clear_error else self.error)

    def append_tool_result(
        self, fp: str, data: str, key: str, tool: str, result_text: str, effect_at_s: float
    ) -> None:
        """``append`` of the commit nearly every step makes: a tool call's completion at the
        step in hand (one event of ``data``, the step's fingerprint ``fp``) with the
        side_effects row of its effect (``key``, ``tool``, ``result_text``, recorded at
        ``effect_at_s``), durably. When the run is RUNNING with no error to clear and this
        runtime has written to it before, that is all the transaction holds, and the store is
        handed the parts (a ``ToolResult``, to ``Store.commit_tool_result``) instead of a
        ``Commit`` it would have to take apart again; otherwise it goes through ``append``."""
        writer = self.writer
        if (
            self._plain
            and self.status == events.RUNNING
            and self.error is None
            and self.token is not None
            and self.run_id in writer.written
        ):
            row = Event(
                self.history.last_seq + 1,
                events.TOOL_COMPLETED,
                self.progress.position,
                fp,
                data,
                writer.clock(),
            )
            writer.store.commit_tool_result(
                ToolResult(self.run_id, self.token, row, key, tool, result_text, effect_at_s)
            )
            self.history.apply(row)
            for observe in writer.observers:
                observe(self.run_id, [row], self.history)
            return
        append_tool_result(self, fp, data, key, tool, result_text, effect_at_s)

    def _rows(self, new: list[NewEvent], position: int, now_s: float) -> list[Event]:
        rows: list[Event] = []
        seq = self.history.last_seq
        if new and self.run_id not in self.writer.written:
            seq += 1
            boundary = codec.encode({**self.writer.boundary, "replayed": self.progress.replayed})
            rows.append(Event(seq, events.RUN_RESUMED, 0, None, boundary, now_s))
        for kind, fp, data in new:
            seq += 1
            at = 0 if kind in events.TERMINAL else position
            rows.append(Event(seq, kind, at, fp, data, now_s))
        return rows

    def _parent_note(self, rows: list[Event]) -> ParentNote | None:
        """For a commit that ends a child run: its outcome, for the parent's ChildRun step."""
        assert self.history.parent is not None
        parent_id, step = self.history.parent
        for row in rows:
            if row.kind == events.RUN_COMPLETED:
                return ParentNote(
                    run_id=parent_id, step=step, kind=events.STEP_COMPLETED, data=row.data
                )
            if row.kind in (events.RUN_FAILED, events.RUN_CANCELLED):
                record = codec.decode(row.data or "{}")
                failed = row.kind == events.RUN_FAILED
                failure = ChildRunFailed(
                    f"ChildRun({self.history.workflow!r})",
                    record.get("error_type", "Error") if failed else "RunCancelled",
                    record.get("message", "") if failed else record.get("reason", ""),
                    child=self.run_id,
                )
                data = codec.encode(failure.to_record())
                return ParentNote(run_id=parent_id, step=step, kind=events.STEP_FAILED, data=data)
        return None

    def started(self, step: Step) -> list[NewEvent]:
        """STEP_STARTED for the step in hand, unless the log already holds its position."""
        if self.progress.position in self.history.steps:
            return []
        return [(events.STEP_STARTED, step.fingerprint, step.canonical)]

    def cancel(self, reason: str) -> None:
        """End the run CANCELLED, for ``reason``: RUN_CANCELLED, durably (and, for a child run,
        its outcome in its parent's log with it)."""
        self.append(
            [(events.RUN_CANCELLED, None, codec.encode({"reason": reason}))],
            status=events.CANCELLED,
            error=f"cancelled: {reason}",
            wake_at_s=None,
            durable=True,
        )

    def set_status(self, status: str, error: str | None = None) -> None:
        """Change the run's status (and error) with no event; nothing is written if the status
        is already ``status`` and no error is given."""
        if status != self.status or error is not None:
            self.append([], status=status, error=error)


def append_tool_result(
    journal: Any, fp: str, data: str, key: str, tool: str, result_text: str, effect_at_s: float
) -> None:
    """``Journal.append_tool_result`` through ``journal.append``, the general write path: for
    a journal whose run needs more in the transaction, and for a journal of another kind (a
    Parallel's branch)."""
    effect = SideEffect(
        key=key,
        run_id=journal.run_id,
        step=journal.progress.position,
        tool=tool,
        args_fp=fp,
        result_text=result_text,
        error=None,
        at_s=effect_at_s,
    )
    journal.append([(events.TOOL_COMPLETED, fp, data)], side_effect=effect, durable=True)


__all__ = ["KEEP", "Journal", "NewEvent", "Writer", "append_tool_result"]
