"""What a run cost, folded from its log alone: steps, retries, replays, time, model tokens.

``MetricsFold.apply`` folds one event, like ``History.apply``; nothing here runs workflow code
or touches the database. Compaction folds a prefix of the log into the run's snapshot and keeps
this fold's counters there (``counters`` / ``from_counters``), so the figures of a compacted
run are the figures of the full log.

Model tokens come from the usage the model reported in its answer: a result that is a JSON
object with a ``usage`` object holding ``input_tokens`` / ``output_tokens`` (or
``prompt_tokens`` / ``completion_tokens``, and optionally ``total_tokens``). A model call whose
process died after asking and before recording the answer is asked again; its lost answer was
never recorded, so its tokens are estimated as the usage of the answer that was recorded for the
same call (same prompt, same parameters).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any

from durabl import codec, events
from durabl.errors import MissingSnapshotError
from durabl.events import Event
from durabl.replay import read_snapshot
from durabl.states import Report
from durabl.store.base import Store

_KINDS = {
    '["model"': "model",
    '["tool",': "tool",
    '["sleep"': "sleep",
    '["signal': "signal",
    '["parall': "parallel",
    '["child"': "child",
    '["contin': "continue",
}
_WAITING = ("sleep", "signal", "parallel", "child")
"""Step kinds whose time is spent waiting (for a timer, an answer, branches, a child run), not
working: their own time is not counted as work (a Parallel's branches count theirs)."""


@dataclass(slots=True, kw_only=True)
class Metrics(Report):
    """The figures of one run, or the sums over many (``runs`` says how many). Not frozen: the
    fold counts into it in place."""

    runs: int = 1
    steps: int = 0
    """Finished steps (model calls, tool calls, sleeps), whether they succeeded or failed."""
    model_calls: int = 0
    tool_calls: int = 0
    sleeps: int = 0
    signals: int = 0
    """Waits for a signal that ended: answered, or timed out."""
    parallels: int = 0
    """Parallel steps that ended (their branches count as the model and tool calls they are)."""
    child_runs: int = 0
    """ChildRun steps that ended (the child's own steps are in the child's figures)."""
    continuations: int = 0
    """ContinueAsNew steps: 1 for a run that went on as another."""
    ctx_values: int = 0
    """ctx.now() / random() / uuid() values recorded."""
    attempts: int = 0
    """Times a step was started: first attempts, retries and re-executions after a crash."""
    retries: int = 0
    failed_steps: int = 0
    resumes: int = 0
    """Process boundaries: a new process took the run over and replayed it."""
    replayed_steps: int = 0
    """Steps served from the log instead of executed, summed over the resumes."""
    reexecuted_model_calls: int = 0
    """Model calls asked again because a crash lost the recorded answer."""
    reexecuted_tool_calls: int = 0
    """Tool attempts started again after a crash (before dispatch, or IDEMPOTENT after it)."""
    dead_letters: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    reexecuted_tokens: int = 0
    """Estimated tokens of the re-executed model calls (see the module docstring)."""
    cost_usd: float = 0.0
    """What the model answers recorded cost, by the price table they were priced with
    (``cost_usd`` in each answer); answers of models it had no price for are not in it."""
    unpriced_model_calls: int = 0
    """Model answers that report usage, of a model with no price: their cost is unknown."""
    reexecuted_cost_usd: float = 0.0
    """Estimated cost of the re-executed model calls: each lost attempt costed as the answer
    recorded in the end."""
    partial_chars: int = 0
    """Characters of streamed answers that a crash or a failed attempt cut off (the last
    STEP_PARTIAL of each lost attempt): spent, and asked again."""
    wall_s: float = 0.0
    """From the run's first event to its last."""
    step_s: float = 0.0
    """Time inside step attempts (started to recorded outcome), summed."""
    timer_wait_s: float = 0.0
    """Time between arming and firing timers, summed."""

    def __add__(self, other: Metrics) -> Metrics:
        return Metrics(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


_ZERO = Metrics().as_dict()


@dataclass(slots=True)
class _Open:
    """A step position whose outcome is not recorded yet."""

    kind: str
    attempting: bool = False  # an attempt started and has no recorded outcome yet
    started_at_s: float | None = None  # when, if this process started it
    lost: int = 0  # attempts that never got an outcome (a crash in between)
    armed_at_s: float | None = None
    partial: int = 0  # characters of the attempt in progress streamed so far (STEP_PARTIAL)


@dataclass
class MetricsFold:
    """The running fold. ``open`` holds the steps started and not finished yet."""

    m: Metrics = field(default_factory=Metrics)
    done_positions: int = 0
    first_at_s: float | None = None
    last_at_s: float | None = None
    open: dict[int, _Open] = field(default_factory=dict)
    copied_until: int = 0
    """A fork's last copied seq: the steps up to it were the run it came from's work, not its
    own, so they count only as steps it will replay."""

    @classmethod
    def of(cls, log: Iterable[Event], counters: dict[str, Any] | None = None) -> MetricsFold:
        fold = cls.from_counters(counters) if counters else cls()
        for event in log:
            fold.apply(event)
        return fold

    def apply(self, e: Event) -> None:
        m = self.m
        if e.seq <= self.copied_until:  # a fork's copy of its origin's step
            if e.kind in events.STEP_ENDS:
                self.done_positions += 1
            return
        if e.kind == events.TOOL_COMPLETED:
            for each in events.expanded(e):
                self.apply(each)
            return
        if e.kind == events.RUN_STARTED and e.seq == 1:
            forked = codec.decode(e.data or "{}").get("forked_from")
            if isinstance(forked, dict):
                self.copied_until = int(forked["seq"])
        if self.first_at_s is None:
            self.first_at_s = e.at_s
        self.last_at_s = e.at_s
        kind = e.kind
        if kind == events.RUN_RESUMED:
            m.resumes += 1
            m.replayed_steps += self.done_positions
            for step in self.open.values():
                step.started_at_s = None  # an attempt in progress died with its process
        elif kind == events.STEP_STARTED:
            m.attempts += 1
            if e.step not in self.open:
                self.open[e.step] = _Open(_KINDS.get((e.data or "")[:8], "tool"))
            step = self.open[e.step]
            if step.attempting:
                self._restarted(step)
            if step.kind not in _WAITING:
                step.attempting, step.started_at_s = True, e.at_s
        elif kind == events.STEP_RETRY:
            m.retries += 1
            self._end_attempt(e)
            if e.step in self.open:  # a stream cut off by the failure is spent text
                m.partial_chars += self.open[e.step].partial
                self.open[e.step].partial = 0
        elif kind in (events.STEP_COMPLETED, events.STEP_FAILED):
            step = self.open.pop(e.step) if e.step in self.open else _Open("tool")
            self._end_attempt(e, step)
            self._finish(step)
            if kind == events.STEP_FAILED:
                m.failed_steps += 1
                m.partial_chars += step.partial  # the last attempt's stream, cut off for good
            elif step.kind == "model":
                used = _usage(e.data)
                m.input_tokens += used[0]
                m.output_tokens += used[1]
                m.total_tokens += used[2]
                m.reexecuted_tokens += step.lost * used[2]
                priced = _cost(e.data)
                if priced is None:
                    m.unpriced_model_calls += 1 if used[2] else 0
                else:
                    m.cost_usd += priced
                    m.reexecuted_cost_usd += step.lost * priced
        elif kind == events.TIMER_ARMED:
            self.open.setdefault(e.step, _Open("sleep")).armed_at_s = e.at_s
        elif kind == events.TIMER_FIRED:
            step = self.open.pop(e.step) if e.step in self.open else _Open("sleep")
            if step.armed_at_s is not None:
                m.timer_wait_s += e.at_s - step.armed_at_s
            self._finish(step)
        elif kind == events.CTX_RECORDED:
            m.ctx_values += 1
            self.done_positions += 1
        elif kind == events.DEAD_LETTERED:
            m.dead_letters += 1
        elif kind == events.STEP_PARTIAL:
            self.open.setdefault(e.step, _Open("model")).partial = len(_partial_text(e.data))
        m.wall_s = self.last_at_s - self.first_at_s

    def _restarted(self, step: _Open) -> None:
        """A step started again without a recorded outcome in between: a crash lost it."""
        step.lost += 1
        self.m.partial_chars += step.partial
        step.partial = 0
        if step.kind == "model":
            self.m.reexecuted_model_calls += 1
        else:
            self.m.reexecuted_tool_calls += 1

    def _end_attempt(self, e: Event, step: _Open | None = None) -> None:
        step = step or self.open.get(e.step)
        if step is not None:
            if step.started_at_s is not None:
                self.m.step_s += e.at_s - step.started_at_s
            step.attempting, step.started_at_s = False, None

    def _finish(self, step: _Open) -> None:
        self.done_positions += 1
        self.m.steps += 1
        if step.kind == "model":
            self.m.model_calls += 1
        elif step.kind == "sleep":
            self.m.sleeps += 1
        elif step.kind == "signal":
            self.m.signals += 1
        elif step.kind == "parallel":
            self.m.parallels += 1
        elif step.kind == "child":
            self.m.child_runs += 1
        elif step.kind == "continue":
            self.m.continuations += 1
        else:
            self.m.tool_calls += 1

    def counters(self) -> dict[str, Any]:
        """What a snapshot keeps of the fold. Only for a fold with no step open (a resolved
        prefix): an open step's attempt could not be carried over."""
        if self.open:
            raise ValueError(f"steps {sorted(self.open)} are open; only a resolved prefix folds")
        return {
            "metrics": self.m.as_dict(),
            "done_positions": self.done_positions,
            "first_at_s": self.first_at_s,
            "last_at_s": self.last_at_s,
            "copied_until": self.copied_until,
        }

    @classmethod
    def from_counters(cls, counters: dict[str, Any]) -> MetricsFold:
        return cls(
            Metrics(**{**_ZERO, **counters["metrics"]}),  # older snapshots lack newer figures
            counters["done_positions"],
            counters["first_at_s"],
            counters["last_at_s"],
            copied_until=counters.get("copied_until", 0),  # absent from older snapshots
        )


def _usage(data: str | None) -> tuple[int, int, int]:
    """(input, output, total) tokens the model reported in a recorded answer, or zeros."""
    if not data or not data.startswith("{") or '"usage"' not in data:
        return 0, 0, 0
    usage = json.loads(data).get("usage")
    if not isinstance(usage, dict):
        return 0, 0, 0
    tokens_in = _count(usage.get("input_tokens", usage.get("prompt_tokens")))
    tokens_out = _count(usage.get("output_tokens", usage.get("completion_tokens")))
    total = _count(usage.get("total_tokens")) or tokens_in + tokens_out
    return tokens_in, tokens_out, total


def _cost(data: str | None) -> float | None:
    """The cost a recorded answer carries (``cost_usd``), or None if it has none."""
    if not data or '"cost_usd"' not in data:
        return None
    value = json.loads(data).get("cost_usd")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _partial_text(data: str | None) -> str:
    text = json.loads(data or "{}").get("text")
    return text if isinstance(text, str) else ""


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def of_runs(store: Store, run_ids: Iterable[str] | None = None) -> Metrics:
    """The figures of one run, or the sums over ``run_ids`` (None: every run of ``store``)."""
    ids = [row.run_id for row in store.list_runs()] if run_ids is None else list(run_ids)
    total = Metrics(runs=0)
    for run_id in ids:
        total = total + of_run(store, run_id)
    return total


def of_run(store: Store, run_id: str) -> Metrics:
    """The figures of one run, from its snapshot's counters and the log after it."""
    return of_history(run_id, store.load_history(run_id))


def of_history(run_id: str, history: tuple[int, str | None, list[Event]]) -> Metrics:
    """The figures of one run from what ``Store.load_history`` gave for it."""
    watermark, snapshot, log = history
    if snapshot is None:
        if watermark:
            # The figures of the folded prefix are gone with it: refuse, as replay does,
            # rather than report the tail of the log as the whole run.
            raise MissingSnapshotError(
                run_id=run_id, watermark=watermark, consequence="its figures cannot be known"
            )
        return MetricsFold.of(log).m
    return MetricsFold.of(log, read_snapshot(run_id, snapshot)["metrics"]).m
