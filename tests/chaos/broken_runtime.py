"""Deliberately wrong runtimes: the negative control of the chaos harness (SPEC §12).

Each class is a real ``durabl.Runtime`` subclass that plants one plausible bug through one of
the runtime's documented seams: ``journal_class`` (the write path), ``decide`` (the replay
decision) or ``call_tool``. None of them is a mock: they open the same SQLite file, write the
same log and call the same tools as the real runtime. The harness is trusted only because it
catches every one of them (``negative_control.py``).

The split variants open a window the real runtime does not have: between two transactions.
They declare a crash point of their own for it, so that a schedule can aim a death there; the
real runtime's points are exactly ``crashpoints.ALL`` and none of them sits in such a gap.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from durabl import Runtime, codec, crashpoints, events, replay
from durabl.events import Event
from durabl.journal import Journal, NewEvent
from durabl.replay import History, StepRecord
from durabl.steps import PatchMarker, Step
from durabl.store import Commit, RunRow, SideEffect
from durabl.store.base import ParentNote
from durabl.tools import Tool

SPLIT_EFFECT_FIRST_GAP = crashpoints.declare("split_gap_effect_recorded_completion_not")
"""The side_effects row is committed; the STEP_COMPLETED that goes with it is not."""
SPLIT_COMPLETION_FIRST_GAP = crashpoints.declare("split_gap_completion_recorded_effect_not")
"""STEP_COMPLETED (and the key claim's release) is committed; the side_effects row is not."""
SPLIT_NOTE_GAP = crashpoints.declare("split_gap_child_ended_parent_not_told")
"""A child run's end is committed; the parent's record of it is not."""
SPLIT_CONTINUE_GAP = crashpoints.declare("split_gap_next_run_created_this_not_ended")
"""The run a ContinueAsNew goes on as is committed; the end of the run that continued is not."""
PROBES = (SPLIT_EFFECT_FIRST_GAP, SPLIT_COMPLETION_FIRST_GAP, SPLIT_NOTE_GAP, SPLIT_CONTINUE_GAP)


def _record_effect(journal: Journal, effect: SideEffect, durable: bool) -> None:
    """The side_effects row on its own: a transaction that carries no event."""
    commit = Commit(run_id=journal.run_id, side_effect=effect, durable=durable, at_s=journal.now())
    journal.store.commit(commit)


class _EffectFirstJournal(Journal):
    def append(
        self,
        new: list[NewEvent],
        *,
        side_effect: SideEffect | None = None,
        durable: bool = False,
        **rest: Any,
    ) -> None:
        if side_effect is not None:
            _record_effect(self, side_effect, durable)
            crashpoints.reach(SPLIT_EFFECT_FIRST_GAP)
        super().append(new, durable=durable, **rest)


class SplitEffectFirst(Runtime):
    """Records a tool's effect, then its completion, in two transactions.

    A death between them leaves an effect the log has never heard of: replay finds the step
    dispatched but not done and calls the tool again (or dead-letters it).
    """

    probe = SPLIT_EFFECT_FIRST_GAP
    journal_class = _EffectFirstJournal


class _CompletionFirstJournal(Journal):
    def append(
        self,
        new: list[NewEvent],
        *,
        side_effect: SideEffect | None = None,
        durable: bool = False,
        **rest: Any,
    ) -> None:
        super().append(new, durable=durable, **rest)
        if side_effect is not None:
            crashpoints.reach(SPLIT_COMPLETION_FIRST_GAP)
            _record_effect(self, side_effect, durable)


class SplitCompletionFirst(Runtime):
    """Records a tool's completion (releasing its key claim), then its effect, in two transactions.

    A death between them leaves a completion the deduplication table has never heard of: another
    run holding the same idempotency key finds neither an effect nor a claim and does it again.
    """

    probe = SPLIT_COMPLETION_FIRST_GAP
    journal_class = _CompletionFirstJournal


class IgnoresDispatched(Runtime):
    """Reads TOOL_DISPATCHED but treats the ambiguous window like a step that never left durabl:
    an AT_MOST_ONCE tool interrupted after dispatch is simply called again."""

    def decide(self, history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
        action, rec = super().decide(history, position, step)
        return (replay.RESTART if action == replay.AMBIGUOUS else action), rec


class _NoDispatchMarkerJournal(Journal):
    def append(self, new: list[NewEvent], **rest: Any) -> None:
        kept = [event for event in new if event[0] != events.TOOL_DISPATCHED]
        if kept or not new or rest.get("claim") is not None:
            super().append(kept, **rest)


class SkipsDispatchMarker(Runtime):
    """Never writes TOOL_DISPATCHED ("the claim row is enough"), so after a death the log cannot
    tell a tool that ran from one that did not, and the step is started over."""

    journal_class = _NoDispatchMarkerJournal


class NoFingerprintCheck(Runtime):
    """Replays by position: whatever was recorded at a position is handed to whatever step the
    workflow yields there. Past the end of the log it executes, like the real runtime."""

    def decide(self, history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
        rec = history.steps.get(position)
        if rec is not None and rec.fp != step.fingerprint:
            # decide matches by canonical text where the log has it, else by fingerprint
            forged = replace(rec, fp=step.fingerprint, canonical=step.canonical)
            steps = {**history.steps, position: forged}
            history = replace(history, steps=steps)
        return super().decide(history, position, step)


def _is_patch_marker(event: NewEvent) -> bool:
    """A ctx value whose recorded value is a patch id with that id's fingerprint."""
    kind, fp, data = event
    if kind != events.CTX_RECORDED or data is None or not data.startswith('"'):
        return False
    value = codec.decode(data)
    return isinstance(value, str) and PatchMarker(value).fingerprint == fp


class _ForgetsPatchJournal(Journal):
    def append(self, new: list[NewEvent], **rest: Any) -> None:
        kept = [event for event in new if not _is_patch_marker(event)]
        if kept or not new:
            super().append(kept, **rest)


class ForgetsPatchMarkers(Runtime):
    """Never records a ``ctx.patched`` marker ("the branch is in the code, and the steps it
    yields are recorded anyway").

    Under unchanged code nothing shows: the next pass finds the marker's position empty and takes
    the new branch again. Once the guard is taken out, a run that took the new branch has a hole
    where the code now yields that branch's first step: the step runs again, and every step after
    it meets the record of the one before.
    """

    journal_class = _ForgetsPatchJournal


class _ForgetsDeliveryJournal(Journal):
    def append(
        self, new: list[NewEvent], *, deliver_signal: int | None = None, **rest: Any
    ) -> None:
        super().append(new, **rest)


class ForgetsSignalDelivery(Runtime):
    """Completes a wait with the signal it took, but never marks the signal delivered ("the
    wait's completion records which signal it took"): the signal stays pending, and the next
    wait of its name takes it again."""

    journal_class = _ForgetsDeliveryJournal


def _parallel_at(history: History, position: int) -> list[Any] | None:
    """The branches of the Parallel the log started at ``position``, or None."""
    rec = history.steps.get(position)
    if rec is None or not (rec.canonical or "").startswith('["parallel"'):
        return None
    return list(codec.decode(rec.canonical or "[]")[1])


class _CompletionOrderJournal(Journal):
    def append(self, new: list[NewEvent], *, step: int | None = None, **rest: Any) -> None:
        position = self.progress.position if step is None else step
        branches = _parallel_at(self.history, position)
        if branches is not None and [kind for kind, _, _ in new] == [events.STEP_COMPLETED]:
            steps = self.history.steps
            done = sorted(range(len(branches)), key=lambda i: steps[position + 1 + i].done_seq)
            texts = [steps[position + 1 + i].result_text or "null" for i in done]
            new = [(events.STEP_COMPLETED, None, "[" + ",".join(texts) + "]")]
        super().append(new, step=step, **rest)


class ParallelInCompletionOrder(Runtime):
    """Records a Parallel's results in the order its branches finished ("as_completed"), not
    the order given. The pass that ran them hands the workflow the right list; a pass that
    serves the Parallel from the log hands it the branches' results shuffled."""

    journal_class = _CompletionOrderJournal


class RerunsServedBranches(Runtime):
    """Decides a Parallel's branches by the Parallel's own record: while the Parallel has no
    outcome, every branch is executed, those whose outcome the log holds too ("the branches
    are one step"). A Parallel reached again (after a backoff, a death) runs its finished
    branches again."""

    def decide(self, history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
        action, rec = super().decide(history, position, step)
        if action != replay.SERVE:
            return action, rec
        for before in range(position - 1, 0, -1):
            branches = _parallel_at(history, before)
            if branches is not None and before + len(branches) >= position:
                if not history.steps[before].done:
                    return replay.EXECUTE, None
                break
        return action, rec


class _SplitNoteJournal(Journal):
    """Holds the parent note back from the commit that ends the child, and commits it alone."""

    held: ParentNote | None = None

    def _parent_note(self, rows: list[Event]) -> ParentNote | None:
        self.held = super()._parent_note(rows)
        return None

    def append(self, new: list[NewEvent], **rest: Any) -> None:
        self.held = None
        super().append(new, **rest)
        note, self.held = self.held, None
        if note is not None:
            crashpoints.reach(SPLIT_NOTE_GAP)
            self.store.commit(
                Commit(run_id=self.run_id, parent_note=note, durable=True, at_s=self.now())
            )


class SplitParentNote(Runtime):
    """Commits a child run's end, then tells its parent, in two transactions.

    A death between them leaves a child that has ended and a parent that waits on it for ever:
    nothing will write the child's end again, and the parent's step sees no outcome."""

    probe = SPLIT_NOTE_GAP
    journal_class = _SplitNoteJournal


class _SplitContinueJournal(Journal):
    def append(
        self,
        new: list[NewEvent],
        *,
        new_run: tuple[RunRow, Event] | None = None,
        status: str | None = None,
        **rest: Any,
    ) -> None:
        if new_run is not None and status == events.CONTINUED:
            self.store.commit(
                Commit(run_id=self.run_id, new_run=new_run, durable=True, at_s=self.now())
            )
            crashpoints.reach(SPLIT_CONTINUE_GAP)
            new_run = None
        super().append(new, new_run=new_run, status=status, **rest)


class SplitContinuation(Runtime):
    """Creates the run a ContinueAsNew goes on as, then ends the run that continued, in two
    transactions.

    A death between them leaves the new run, and the old one with no record of its
    ContinueAsNew: resumed, it continues again, as a second new run, and both go on."""

    probe = SPLIT_CONTINUE_GAP
    journal_class = _SplitContinueJournal


class _DropsCarriedSignalsJournal(Journal):
    def append(self, new: list[NewEvent], *, carry_signals: str | None = None, **rest: Any) -> None:
        super().append(new, **rest)


class ForgetsCarriedSignals(Runtime):
    """Continues as a new run without handing it the signals no wait took ("the new run starts
    afresh"): a signal sent for a later turn is left behind in the run that continued."""

    journal_class = _DropsCarriedSignalsJournal


class DuplicatesEffects(Runtime):
    """Calls every tool twice. Not a plausible bug: if it got through, no figure means anything."""

    def call_tool(self, tool: Tool, args: dict[str, Any]) -> Any:
        tool.fn(**args)
        return tool.fn(**args)


class _ForgetsEffectJournal(Journal):
    def append(
        self, new: list[NewEvent], *, side_effect: SideEffect | None = None, **rest: Any
    ) -> None:
        super().append(new, **rest)


class ForgetsEffectRecord(Runtime):
    """Commits completions but never writes the side_effects row ("the log already says it"):
    a second run holding the same idempotency key cannot know the effect happened."""

    journal_class = _ForgetsEffectJournal


__all__ = [
    "PROBES",
    "SPLIT_COMPLETION_FIRST_GAP",
    "SPLIT_CONTINUE_GAP",
    "SPLIT_EFFECT_FIRST_GAP",
    "SPLIT_NOTE_GAP",
    "DuplicatesEffects",
    "ForgetsCarriedSignals",
    "ForgetsEffectRecord",
    "ForgetsPatchMarkers",
    "ForgetsSignalDelivery",
    "IgnoresDispatched",
    "NoFingerprintCheck",
    "ParallelInCompletionOrder",
    "RerunsServedBranches",
    "SkipsDispatchMarker",
    "SplitCompletionFirst",
    "SplitContinuation",
    "SplitEffectFirst",
    "SplitParentNote",
]
