"""The pure replay core: fold a log into per-step records, and decide what to do with a step.

Nothing here touches a database, a clock or the outside world. ``History.apply`` folds one event;
``decide`` answers, for the step a workflow just yielded at a position, one of:

- SERVE: recorded and done, hand back the recorded result (zero I/O);
- THROW: recorded as failed for good, throw the recorded failure into the workflow;
- EXECUTE: the log ends here, run the step for real;
- RESTART: an attempt began but control never left durabl (or it is a model call), run it again;
- AMBIGUOUS: a tool was dispatched and no outcome was recorded: the tool mode decides;
- WAIT: a timer (Sleep or retry backoff) is armed, due at ``record.wake_at_s``;
- DEAD: dead-lettered and not yet redriven or resolved;

or raise ``NonDeterminismError`` when the log recorded a different step at this position.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from durabl import codec, events
from durabl.errors import (
    CompactedLogGapError,
    MissingSnapshotError,
    NonDeterminismError,
    UnknownEventKindError,
    UnknownSnapshotFormatError,
)
from durabl.events import Event
from durabl.steps import CtxValue, PatchMarker, Step, describe_canonical

SERVE = "SERVE"
THROW = "THROW"
EXECUTE = "EXECUTE"
RESTART = "RESTART"
AMBIGUOUS = "AMBIGUOUS"
WAIT = "WAIT"
DEAD = "DEAD"

SNAPSHOT_FORMAT = 1


@dataclass(slots=True)
class StepRecord:
    """Everything the log says about one step position."""

    position: int
    fp: str
    first_seq: int
    _canonical: str | None = None
    attempts: int = 0
    dispatched: bool = False
    done: bool = False
    _result_text: str | None = None
    failure: dict[str, Any] | None = None
    wake_at_s: float | None = None
    partial: str | None = None
    """The text so far of the attempt streaming now, or cut off by a crash (STEP_PARTIAL)."""
    retries: int = 0
    dead: bool = False
    redriven: bool = False
    last_seq: int = 0
    done_seq: int = 0
    description: str | None = None  # kept by a snapshot instead of the canonical text
    _pair: str | None = None
    """A TOOL_COMPLETED's data, ``[canonical,result]``, not yet split in two: splitting it
    means parsing the canonical text to find where it ends, and the step a workflow yields at
    this position, when replay meets it, names the split for the price of a comparison
    (``decide``). Whatever reads ``canonical`` or ``result_text`` first splits it."""

    @property
    def canonical(self) -> str | None:
        """The step's canonical text; None for a ctx value, a patch marker and a step folded
        into a snapshot (which keeps its ``description``)."""
        if self._pair is not None:
            self._split()
        return self._canonical

    @canonical.setter
    def canonical(self, text: str | None) -> None:
        if self._pair is not None:
            self._split()
        self._canonical = text

    @property
    def result_text(self) -> str | None:
        """The recorded result, as JSON text."""
        if self._pair is not None:
            self._split()
        return self._result_text

    @result_text.setter
    def result_text(self, text: str | None) -> None:
        if self._pair is not None:
            self._split()
        self._result_text = text

    def _split(self) -> None:
        pair = self._pair
        assert pair is not None
        self._pair = None
        canonical, self._result_text = codec.unpair(pair)
        if self._canonical is None:
            self._canonical = canonical


@dataclass(slots=True)
class History:
    """The fold of a run's log. ``apply`` is the only way it changes."""

    run_id: str
    steps: dict[int, StepRecord] = field(default_factory=dict)
    last_seq: int = 0
    workflow: str | None = None
    input_text: str | None = None
    terminal: str | None = None
    terminal_data: str | None = None
    resumed_at: list[int] = field(default_factory=list)
    parent: tuple[str, int] | None = None
    """A child run's parent and the parent's step that started it (from RUN_STARTED)."""
    continued_from: str | None = None
    """The run this one continues, for a run started by a ContinueAsNew (from RUN_STARTED)."""
    budget: dict[str, Any] | None = None
    """The run's budget as RUN_STARTED records it (``durabl.ledger.Budget.record``), if any."""
    folded_metrics: dict[str, Any] | None = None  # what a snapshot kept for the metrics fold

    @classmethod
    def from_events(
        cls, run_id: str, log: Iterable[Event], *, watermark: int = 0, snapshot: str | None = None
    ) -> History:
        """Fold ``log`` (the events after ``watermark``) onto the run's compaction snapshot."""
        if snapshot is not None:
            history = cls.from_snapshot(run_id, snapshot, watermark)
        elif watermark:
            raise MissingSnapshotError(run_id=run_id, watermark=watermark)
        else:
            history = cls(run_id)
        rows = iter(log)
        first = next(rows, None)
        if first is None:
            return history
        if first.seq != watermark + 1:
            raise CompactedLogGapError(run_id=run_id, seq=first.seq, watermark=watermark)
        history.apply(first)
        # ``apply``, inline: this loop runs once for every event of every log folded.
        handlers, last = _HANDLERS, first
        for last in rows:
            handler = handlers.get(last.kind)
            if handler is None:
                raise UnknownEventKindError(run_id=run_id, seq=last.seq, kind=last.kind)
            handler(history, last)
        history.last_seq = last.seq
        return history

    @classmethod
    def from_snapshot(cls, run_id: str, text: str, watermark: int) -> History:
        """The history a compaction folded into ``text`` (see ``snapshot``)."""
        data = read_snapshot(run_id, text)
        history = cls(run_id, last_seq=watermark, workflow=data["workflow"])
        history.folded_metrics = data["metrics"]
        history.input_text = data["input"]
        history.resumed_at = data["resumed_at"]
        parent = data.get("parent")
        history.parent = None if parent is None else (parent[0], parent[1])
        history.continued_from = data.get("continued_from")
        history.budget = data.get("budget")
        steps = history.steps
        for position, fp, first, done, attempts, retries, about, result, failure in data["steps"]:
            steps[position] = StepRecord(
                position,
                fp,
                first,
                attempts=attempts,
                done=True,
                _result_text=result,
                failure=failure,
                retries=retries,
                last_seq=done,
                done_seq=done,
                description=about,
            )
        return history

    def foldable(self, keep_last: int = 0) -> tuple[int, int]:
        """(position, seq): the longest resolved prefix, less its last ``keep_last`` steps.
        Positions 1..position are all finished and every event up to seq belongs to them (or
        to the run: its start, process boundaries). (0, 0) when nothing can be folded."""
        finished = 0
        while (rec := self.steps.get(finished + 1)) is not None and rec.done:
            finished += 1
        position = finished - keep_last
        if position <= 0:
            return 0, 0
        # A step may end after a later one began (a Parallel ends after its branches), so the
        # prefix is cut where every event of the steps in it comes before every event of the
        # steps after it.
        later = [rec.first_seq for p, rec in self.steps.items() if p > position]
        first_after = min(later, default=self.last_seq + 1)
        ends: list[int] = []
        for p in range(1, position + 1):
            ends.append(max(self.steps[p].done_seq, ends[-1] if ends else 0))
        for p in range(position, 0, -1):
            if ends[p - 1] < first_after:
                return p, ends[p - 1]
            first_after = min(first_after, self.steps[p].first_seq)
        return 0, 0

    def snapshot(self, position: int, seq: int, metrics: dict[str, Any]) -> str:
        """The text that stands in for the log up to ``seq`` (steps 1..``position``, all
        finished): per step its fingerprint, outcome and a short description, plus the run's
        workflow, input, process boundaries and ``metrics`` (the cost figures of the prefix)."""
        steps = []
        for p in range(1, position + 1):
            rec = self.steps[p]
            about = rec.description or (describe_record(rec) if rec.canonical else None)
            steps.append(
                [
                    p,
                    rec.fp,
                    rec.first_seq,
                    rec.done_seq,
                    rec.attempts,
                    rec.retries,
                    about,
                    rec.result_text,
                    rec.failure,
                ]
            )
        return codec.encode(
            {
                "format": SNAPSHOT_FORMAT,
                "workflow": self.workflow,
                "input": self.input_text,
                "resumed_at": [s for s in self.resumed_at if s <= seq],
                "parent": None if self.parent is None else list(self.parent),
                "continued_from": self.continued_from,
                "budget": self.budget,
                "steps": steps,
                "metrics": metrics,
            }
        )

    def apply(self, event: Event) -> None:
        handler = _HANDLERS.get(event.kind)
        if handler is None:
            raise UnknownEventKindError(run_id=self.run_id, seq=event.seq, kind=event.kind)
        handler(self, event)
        self.last_seq = event.seq

    def record(self, event: Event) -> StepRecord:
        rec = self.steps.get(event.step)
        if rec is None:
            rec = StepRecord(event.step, event.fp or "", event.seq)
            self.steps[event.step] = rec
        rec.last_seq = event.seq
        return rec

    @property
    def last_position(self) -> int:
        return max(self.steps, default=0)

    @property
    def last_resume_seq(self) -> int:
        """The seq of the last RUN_RESUMED: where the last process took the run over. Steps
        finished before it were served from the log to that process. 0 if one process ran it."""
        return self.resumed_at[-1] if self.resumed_at else 0

    def completed_positions(self) -> int:
        return sum(1 for rec in self.steps.values() if rec.done)


def _run_started(h: History, e: Event) -> None:
    data = codec.decode(e.data or "{}")
    h.workflow = data["workflow"]
    h.input_text = codec.encode(data["input"])
    parent = data.get("parent")
    if parent is not None:
        h.parent = (parent["run_id"], parent["step"])
    h.continued_from = data.get("continued_from")
    h.budget = data.get("budget")


def _run_resumed(h: History, e: Event) -> None:
    h.resumed_at.append(e.seq)


def _step_started(h: History, e: Event) -> None:
    rec = h.record(e)
    if rec.canonical is None:
        rec.canonical = e.data
    rec.attempts += 1
    rec.dispatched = False
    rec.wake_at_s = None


def _tool_dispatched(h: History, e: Event) -> None:
    h.record(e).dispatched = True


def _finish(rec: StepRecord, e: Event) -> None:
    rec.done = True
    rec.done_seq = e.seq
    rec.wake_at_s = None
    rec.dead = False


def _step_completed(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.result_text = e.data
    _finish(rec, e)


def _tool_completed(h: History, e: Event) -> None:
    # ``record``, inline: a replay folds one of these for nearly every step of a run.
    seq = e.seq
    rec = h.steps.get(e.step)
    if rec is None:
        # The step's one event, nearly always: the record is made finished, its fields given
        # in order (position, fp, first_seq, _canonical, attempts, dispatched, done), which
        # the dataclass's __init__ takes faster than by keyword.
        rec = h.steps[e.step] = StepRecord(e.step, e.fp or "", seq, None, 1, False, True)
        rec.last_seq = rec.done_seq = seq
        rec._pair = e.data or "[null,null]"  # split when first read (see StepRecord._pair)
        return
    rec.last_seq = seq
    if rec._pair is not None:  # a second completion of the step: the first's text goes
        rec._split()
    rec._pair = e.data or "[null,null]"
    rec.attempts += 1
    rec.dispatched = False
    rec.done = True  # the rest is _finish, inline
    rec.done_seq = seq
    rec.wake_at_s = None
    rec.dead = False


def _step_failed(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.failure = codec.decode(e.data or "{}")
    _finish(rec, e)


def _step_partial(h: History, e: Event) -> None:
    h.record(e).partial = e.data


def _step_retry(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.retries += 1
    rec.dispatched = False
    rec.wake_at_s = codec.decode(e.data or "{}")["retry_at_s"]


def _timer_armed(h: History, e: Event) -> None:
    h.record(e).wake_at_s = codec.decode(e.data or "{}")["fire_at_s"]


def _timer_fired(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.result_text = "null"
    _finish(rec, e)


def _ctx_recorded(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.result_text = e.data
    _finish(rec, e)


def _dead_lettered(h: History, e: Event) -> None:
    h.record(e).dead = True


def _dlq_redriven(h: History, e: Event) -> None:
    rec = h.record(e)
    rec.dead = False
    rec.dispatched = False
    rec.redriven = True


def _dlq_resolved(h: History, e: Event) -> None:
    h.record(e).dead = False


def _terminal(h: History, e: Event) -> None:
    h.terminal = e.kind
    h.terminal_data = e.data


_HANDLERS = {
    events.RUN_STARTED: _run_started,
    events.RUN_RESUMED: _run_resumed,
    events.STEP_STARTED: _step_started,
    events.TOOL_DISPATCHED: _tool_dispatched,
    events.STEP_COMPLETED: _step_completed,
    events.TOOL_COMPLETED: _tool_completed,
    events.STEP_FAILED: _step_failed,
    events.STEP_RETRY: _step_retry,
    events.STEP_PARTIAL: _step_partial,
    events.TIMER_ARMED: _timer_armed,
    events.TIMER_FIRED: _timer_fired,
    events.CTX_RECORDED: _ctx_recorded,
    events.DEAD_LETTERED: _dead_lettered,
    events.DLQ_REDRIVEN: _dlq_redriven,
    events.DLQ_RESOLVED: _dlq_resolved,
    events.RUN_COMPLETED: _terminal,
    events.RUN_FAILED: _terminal,
    events.RUN_CANCELLED: _terminal,
    events.RUN_CONTINUED: _terminal,
}


def read_snapshot(run_id: str, text: str) -> dict[str, Any]:
    """A snapshot's contents; one in a format this durabl does not know is a StorageError."""
    data: dict[str, Any] = codec.decode(text)
    if data.get("format") != SNAPSHOT_FORMAT:
        raise UnknownSnapshotFormatError(run_id=run_id, snapshot_format=data.get("format"))
    return data


def decide(history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
    """What to do with ``step``, yielded at ``position``, given the log folded into ``history``."""
    rec = history.steps.get(position)
    if rec is None:
        if history.terminal is not None:
            raise mismatch(history, position, "the end of the workflow", step.describe())
        return EXECUTE, None
    pair, text = rec._pair, step.canonical
    if pair is not None and pair.startswith(text, 1) and pair.startswith(",", len(text) + 1):
        # A TOOL_COMPLETED not yet split whose text starts with the step's canonical text and
        # a comma: that is its first half (a JSON value ends where its text says, so no longer
        # value can begin with a whole one), the step's, and the rest is the result.
        rec._pair = None
        rec._result_text = pair[len(text) + 2 : -1]
        if rec._canonical is None:
            rec._canonical = text
        matched = rec._canonical == text
    else:
        # The same canonical text is the same fingerprint (which is its hash), and comparing
        # the texts saves hashing the step on every step served; a folded step has only its fp.
        recorded = rec.canonical
        matched = recorded == text if recorded is not None else rec.fp == step.fingerprint
    if not matched:
        expected, actual = describe_record(rec), step.describe()
        if expected == actual and rec.canonical is not None:
            # Short descriptions can coincide for long arguments: show everything.
            expected, actual = f"{expected} = {rec.canonical}", f"{actual} = {step.canonical}"
        elif expected == actual:
            # Compacted: the snapshot kept the description, not the full text.
            expected = f"{expected} (fingerprint {rec.fp})"
            actual = f"{actual} (fingerprint {step.fingerprint})"
        raise mismatch(history, position, expected, actual)
    if rec.done:
        return (THROW if rec.failure is not None else SERVE), rec
    if rec.dead:
        return DEAD, rec
    if rec.wake_at_s is not None:
        return WAIT, rec
    if rec.dispatched:
        return AMBIGUOUS, rec
    return RESTART, rec


def check_end(history: History, position: int) -> None:
    """The workflow returned after ``position`` steps: the log must not hold more."""
    extra = [p for p in history.steps if p > position]
    if extra:
        first = history.steps[min(extra)]
        raise mismatch(history, first.position, describe_record(first), "the end of the workflow")


def mismatch(history: History, position: int, expected: str, actual: str) -> NonDeterminismError:
    rec = history.steps.get(position)
    seq = rec.first_seq if rec is not None else history.last_seq + 1
    return NonDeterminismError(history.run_id, seq, position, expected, actual)


_CTX_BY_FP = {CtxValue(what).fingerprint: f"ctx.{what}()" for what in ("now", "random", "uuid")}


def patch_id_of(rec: StepRecord) -> str | None:
    """The patch id if ``rec`` is a ``ctx.patched`` marker: its recorded value is the id, and
    a marker's fingerprint is that id's, so the record proves what it is by itself."""
    if rec.canonical is not None or rec.result_text is None or not rec.done:
        return None
    if not rec.result_text.startswith('"'):
        return None
    patch_id = codec.decode(rec.result_text)
    if isinstance(patch_id, str) and PatchMarker(patch_id).fingerprint == rec.fp:
        return patch_id
    return None


def is_patch(rec: StepRecord) -> bool:
    return patch_id_of(rec) is not None


def describe_record(rec: StepRecord) -> str:
    """How the log names a recorded step: its short description, for errors and the CLI."""
    if rec.fp in _CTX_BY_FP:
        return _CTX_BY_FP[rec.fp]
    patch_id = patch_id_of(rec)
    if patch_id is not None:
        return f"ctx.patched({patch_id!r})"
    if rec.canonical is None and rec.description is not None:
        return rec.description
    if rec.canonical is None:
        return f"a step with fingerprint {rec.fp}"
    return describe_canonical(rec.canonical)
