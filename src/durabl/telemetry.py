"""OpenTelemetry spans from the log: one per step when the commit that ends it lands, one per run
when the run ends, the step spans its children.

One pure fold builds them (``SpanFold``: a run's events in, the spans each one ends out), and
both paths go through it, so that the two agree by construction:

- live, ``instrument(rt)``: an observer of the runtime's commits (``Runtime.observe``) feeds
  each commit's events to its run's fold and hands the spans they end to OpenTelemetry. A
  replay commits nothing, so it emits nothing, and a process that resumes a run emits only the
  steps it ends itself: what an earlier process ended was emitted by that process.
- offline, ``trace_of(store, run_id)``: the same fold over the stored logs of a run and its
  child runs, written as OTLP/JSON by ``otlp_json`` (``durabl export-traces``), with no
  OpenTelemetry installed.

The ids are derived from the log, never drawn: the trace id is the root run's id (a durabl run
id is 32 hex digits and is used as it is; any other is hashed), a step's span id hashes the run
id and the step's position, and a run's span is position 0 of it. So a span built offline has
the id of the one emitted live, and a step ended by the second process after a crash has for
parent the span of the run that a third process may end. The OpenTelemetry API takes no ids,
so ``instrument`` gives the SDK tracer it is handed an id generator that returns the ids of the
span being emitted (``_LogIds``).

Only ``instrument`` imports ``opentelemetry``: ``import durabl`` and ``durabl export-traces``
never do, and without the extra ``instrument`` says in one line to ``pip install 'durabl[otel]'``.
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from durabl import __version__, codec, events
from durabl.events import Event
from durabl.replay import StepRecord, describe_record, patch_id_of, read_snapshot
from durabl.steps import CtxValue, child_run_id, describe_canonical
from durabl.store.base import Store
from durabl.store.reads import continued_as, lineage, require_run

if TYPE_CHECKING:
    from durabl.replay import History
    from durabl.runtime import Runtime

Attribute = str | int | float | bool

SCOPE = "durabl"
"""The instrumentation scope of durabl's spans, live and offline."""

KEPT_RUNS = 1024
"""How many runs' folds a live observer keeps between commits; one it dropped is folded again
from the database at its next commit."""

_STEP_ENDS = events.STEP_ENDS - {events.TOOL_COMPLETED}  # folded as the events it stands for
_CHILD_ENDS = frozenset({events.RUN_COMPLETED, events.RUN_FAILED, events.RUN_CANCELLED})
"""The ends of a child run whose commit ends its parent's ChildRun step too (the parent note);
a child that continues as another run leaves the step to the run that goes on."""
_OUTCOMES = {
    events.RUN_COMPLETED: "completed",
    events.RUN_FAILED: "failed",
    events.RUN_CANCELLED: "cancelled",
    events.RUN_CONTINUED: "continued",
}
_CTX_WHAT = {CtxValue(what).fingerprint: what for what in ("now", "random", "uuid")}
_HEX = frozenset("0123456789abcdef")

_log = logging.getLogger(__name__)


# -- ids -------------------------------------------------------------------------------------


def trace_id_of(root_run_id: str) -> str:
    """The trace id (32 hex digits) of the trace whose root is the run ``root_run_id``: the id
    itself for a run id durabl made (32 lowercase hex digits), else a hash of it."""
    if len(root_run_id) == 32 and _HEX.issuperset(root_run_id) and int(root_run_id, 16):
        return root_run_id
    return _hashed(f"trace\x00{root_run_id}", 32)


def span_id_of(run_id: str, position: int, seq: int | None = None) -> str:
    """The span id (16 hex digits) of the run's step at ``position``, or of the run itself at
    position 0; with ``seq``, of the dead letter recorded at that seq (a dead-lettered step that
    is redriven or resolved ends again later, under its own id)."""
    key = f"span\x00{run_id}\x00{position}" + ("" if seq is None else f"\x00{seq}")
    return _hashed(key, 16)


def _hashed(key: str, digits: int) -> str:
    text = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:digits]
    return text if int(text, 16) else "1".rjust(digits, "0")  # an all-zero id is no id


# -- the pure fold ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpanRecord:
    """One span as the log gives it: ids in hex, times in unix nanoseconds, and ``error`` the
    description of a span whose status is ERROR (None: the status is left unset)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Attribute]
    error: str | None = None


@dataclass(slots=True)
class _Open:
    """A step started and not ended yet."""

    canonical: str | None
    started_s: float
    attempts: int = 0
    retries: int = 0


@dataclass(slots=True)
class SpanFold:
    """The spans one run's log ends, folded one event at a time (``apply``), as ``History``
    folds the log. Pure: ``root``, the run at the top of the run's trace, is found by the caller
    (``root_of``), and so is what a compaction snapshot kept (``from_snapshot``)."""

    run_id: str
    root: str
    seq: int = 0
    workflow: str | None = None
    parent: tuple[str, int] | None = None
    continued_from: str | None = None
    started_s: float | None = None
    resumes: int = 0
    ended: bool = False
    copied_until: int = 0
    """For a fork, the last seq it copied from the run it came from: those steps were that
    run's, and were traced there."""
    open: dict[int, _Open] = field(default_factory=dict)
    branch_of: dict[int, int] = field(default_factory=dict)
    """Each open Parallel's branch positions -> the Parallel's position."""

    @property
    def trace_id(self) -> str:
        return trace_id_of(self.root)

    @classmethod
    def from_snapshot(
        cls, run_id: str, root: str, text: str, watermark: int, created_s: float
    ) -> SpanFold:
        """The fold of a compacted run: what its snapshot kept (every folded step is finished,
        so nothing of them is open), and ``created_s``, the run's start, from its row."""
        data = read_snapshot(run_id, text)
        parent = data.get("parent")
        return cls(
            run_id,
            root,
            seq=watermark,
            workflow=data["workflow"],
            parent=None if parent is None else (parent[0], parent[1]),
            continued_from=data.get("continued_from"),
            started_s=created_s,
            resumes=len(data["resumed_at"]),
        )

    def apply(self, event: Event) -> list[SpanRecord]:
        """Fold ``event``; the spans it ends (none, one, or for a run's end, the run's)."""
        self.seq = max(self.seq, event.seq)
        if 1 < event.seq <= self.copied_until:
            return []
        if event.kind == events.TOOL_COMPLETED:
            return [span for e in events.expanded(event) for span in self.apply(e)]
        handler = _HANDLERS.get(event.kind)
        return [] if handler is None else handler(self, event)

    def _run_started(self, e: Event) -> list[SpanRecord]:
        data = codec.decode(e.data or "{}")
        self.workflow = data.get("workflow")
        parent = data.get("parent")
        self.parent = None if parent is None else (parent["run_id"], parent["step"])
        self.continued_from = data.get("continued_from")
        forked = data.get("forked_from")
        self.copied_until = int(forked["seq"]) if isinstance(forked, dict) else 0
        self.started_s = e.at_s
        return []

    def _run_resumed(self, e: Event) -> list[SpanRecord]:
        self.resumes += 1
        return []

    def _step_started(self, e: Event) -> list[SpanRecord]:
        rec = self.open.get(e.step)
        if rec is None:
            rec = self.open[e.step] = _Open(e.data, e.at_s)
            if (e.data or "").startswith('["parallel"'):
                for index in range(len(codec.decode(e.data or "")[1])):
                    self.branch_of[e.step + 1 + index] = e.step
        rec.attempts += 1
        return []

    def _step_retry(self, e: Event) -> list[SpanRecord]:
        rec = self.open.get(e.step)
        if rec is not None:
            rec.retries += 1
        return []

    def _step_ended(self, e: Event) -> list[SpanRecord]:
        rec = self.open.pop(e.step, None)
        span = self._step_span(e, rec)
        if rec is not None and (rec.canonical or "").startswith('["parallel"'):
            for branch in [p for p, of in self.branch_of.items() if of == e.step]:
                del self.branch_of[branch]
        return [span]

    def _dead_lettered(self, e: Event) -> list[SpanRecord]:
        return [self._step_span(e, self.open.get(e.step))]

    def _run_ended(self, e: Event) -> list[SpanRecord]:
        self.ended = True
        data = codec.decode(e.data or "null")
        attributes: dict[str, Attribute] = {
            "durabl.run_id": self.run_id,
            "durabl.outcome": _OUTCOMES[e.kind],
            "durabl.resumes": self.resumes,
        }
        if self.workflow is not None:
            attributes["durabl.workflow"] = self.workflow
        if self.parent is not None:
            attributes["durabl.parent_run_id"], attributes["durabl.parent_step"] = self.parent
        if self.continued_from is not None:
            attributes["durabl.continued_from"] = self.continued_from
        if e.kind == events.RUN_CONTINUED and isinstance(data, dict):
            attributes["durabl.continued_as"] = str(data.get("run_id"))
        error = None
        if e.kind == events.RUN_FAILED and isinstance(data, dict):
            error = _failure_text(data)
            attributes["error.type"] = str(data.get("error_type", "Error"))
        return [
            SpanRecord(
                trace_id=self.trace_id,
                span_id=span_id_of(self.run_id, 0),
                parent_span_id=None if self.parent is None else span_id_of(*self.parent),
                name="run" if self.workflow is None else f"run {self.workflow}",
                start_ns=_ns(e.at_s if self.started_s is None else self.started_s),
                end_ns=_ns(e.at_s),
                attributes=attributes,
                error=error,
            )
        ]

    def _step_span(self, e: Event, rec: _Open | None) -> SpanRecord:
        kind, name, about, specific = _describe(self.run_id, e, rec)
        attributes: dict[str, Attribute] = {
            "durabl.run_id": self.run_id,
            "durabl.step": e.step,
            "durabl.step.kind": kind,
            "durabl.step.description": about,
            # a ctx value is drawn once and records no start
            "durabl.attempts": rec.attempts if rec is not None else 1,
            "durabl.retries": rec.retries if rec is not None else 0,
            **specific,
        }
        error = None
        dead = e.kind == events.DEAD_LETTERED
        if e.kind == events.STEP_FAILED or dead:
            record = codec.decode(e.data or "{}")
            record = record if isinstance(record, dict) else {}
            error = str(record.get("reason", "dead-lettered")) if dead else _failure_text(record)
            attributes["error.type"] = (
                "DeadLettered" if dead else str(record.get("error_type", "Error"))
            )
        if dead:
            attributes["durabl.dead_lettered"] = True
        return SpanRecord(
            trace_id=self.trace_id,
            span_id=span_id_of(self.run_id, e.step, e.seq if dead else None),
            parent_span_id=span_id_of(self.run_id, self.branch_of.get(e.step, 0)),
            name=name,
            start_ns=_ns(e.at_s if rec is None else rec.started_s),
            end_ns=_ns(e.at_s),
            attributes=attributes,
            error=error,
        )


_HANDLERS: dict[str, Callable[[SpanFold, Event], list[SpanRecord]]] = {
    events.RUN_STARTED: SpanFold._run_started,
    events.RUN_RESUMED: SpanFold._run_resumed,
    events.STEP_STARTED: SpanFold._step_started,
    events.STEP_RETRY: SpanFold._step_retry,
    **{kind: SpanFold._step_ended for kind in _STEP_ENDS},
    events.DEAD_LETTERED: SpanFold._dead_lettered,
    **{kind: SpanFold._run_ended for kind in events.TERMINAL},
}
"""One handler per event kind that tells the spans something; the others change nothing."""


def spans_of(
    run_id: str, log: Iterable[Event], *, root: str | None = None, fold: SpanFold | None = None
) -> list[SpanRecord]:
    """Every span ``log`` ends, in the order it ends them: of run ``run_id`` in the trace of
    run ``root`` (default: its own), or folded onto ``fold`` (a compacted run's)."""
    folding = fold if fold is not None else SpanFold(run_id, root or run_id)
    return [span for event in log for span in folding.apply(event)]


def _describe(
    run_id: str, e: Event, rec: _Open | None
) -> tuple[str, str, str, dict[str, Attribute]]:
    """A step's kind, span name, description and the attributes of its kind, from its recorded
    canonical text and, for a model call, the answer it recorded."""
    canonical = rec.canonical if rec is not None else None
    if canonical is None:  # a ctx value: named by its fingerprint, or a patch by its value
        record = StepRecord(e.step, e.fp or "", e.seq, done=True, _result_text=e.data)
        patch_id = patch_id_of(record)
        what = _CTX_WHAT.get(e.fp or "", "value")
        name = f"patch {patch_id}" if patch_id is not None else f"ctx {what}"
        return ("patch" if patch_id is not None else "ctx"), name, describe_record(record), {}
    about = describe_canonical(canonical)
    parsed = codec.decode(canonical)
    kind = parsed[0]
    if kind == "tool":
        return kind, f"tool {parsed[1]}", about, {"gen_ai.tool.name": parsed[1]}
    if kind == "model":
        model = parsed[2].get("model")
        found: dict[str, Attribute] = {}
        if isinstance(model, str):
            found["gen_ai.request.model"] = model
        if e.kind == events.STEP_COMPLETED:
            found.update(_answer(e.data))
        return kind, "model", about, found
    if kind == "sleep":
        return kind, "sleep", about, {"durabl.sleep_s": float(parsed[1])}
    if kind == "signal":
        return kind, f"signal {parsed[1]}", about, {"durabl.signal": parsed[1]}
    if kind == "parallel":
        return kind, "parallel", about, {"durabl.branches": len(parsed[1])}
    if kind == "child":
        child = child_run_id(run_id, e.step, parsed[3])
        return kind, f"child {parsed[1]}", about, {"durabl.child_run_id": child}
    return kind, str(kind), about, {}


def _answer(data: str | None) -> dict[str, Attribute]:
    """What a model's recorded answer says of itself: the model, the tokens it reported (as
    ``durabl.metrics`` reads them) and the cost durabl priced it at."""
    answer = codec.decode(data) if data and data.startswith("{") else None
    if not isinstance(answer, dict):
        return {}
    found: dict[str, Attribute] = {}
    if isinstance(answer.get("model"), str):
        found["gen_ai.response.model"] = answer["model"]
    usage = answer.get("usage")
    if isinstance(usage, dict):
        for name, keys in _TOKENS:
            count = next((usage[k] for k in keys if k in usage), None)
            if isinstance(count, int) and not isinstance(count, bool):
                found[f"gen_ai.usage.{name}_tokens"] = count
    cost = answer.get("cost_usd")
    if isinstance(cost, int | float) and not isinstance(cost, bool):
        found["durabl.cost_usd"] = float(cost)
    return found


_TOKENS = (
    ("input", ("input_tokens", "prompt_tokens")),
    ("output", ("output_tokens", "completion_tokens")),
)


def _failure_text(record: dict[str, Any]) -> str:
    return f"{record.get('error_type', 'Error')}: {record.get('message', '')}"


def _ns(at_s: float) -> int:
    """Unix nanoseconds, to the microsecond: an epoch float holds no finer digits."""
    return round(at_s * 1_000_000) * 1000


# -- reading folds from a store --------------------------------------------------------------


def open_fold(
    store: Store,
    run_id: str,
    root: str | None = None,
    *,
    known: Mapping[str, str] | None = None,
    loaded: tuple[int, str | None, list[Event]] | None = None,
) -> tuple[SpanFold, list[Event]]:
    """The fold of a stored run, with nothing of its log applied yet, and that log: the events
    after its compaction snapshot, whose contents the fold starts from. ``root``: the run at
    the top of its trace (default: found by following its parents, ``root_of`` with
    ``known``); ``loaded``: what ``Store.load_history`` gave for the run, if read already."""
    watermark, snapshot, log = loaded if loaded is not None else store.load_history(run_id)
    if root is None:
        parent = _parent_in(run_id, snapshot, log)
        root = run_id if parent is None else root_of(store, parent[0], known)
    if snapshot is None:
        return SpanFold(run_id, root, seq=watermark), log
    created_s = require_run(store, run_id).created_s
    return SpanFold.from_snapshot(run_id, root, snapshot, watermark, created_s), log


def root_of(store: Store, run_id: str, known: Mapping[str, str] | None = None) -> str:
    """The run at the top of ``run_id``'s trace: its parent's parent's ..., up to a run that
    names none (or is not in the database). ``known``: roots found before, by run id."""
    seen: set[str] = set()
    while run_id not in seen:
        if known is not None and run_id in known:
            return known[run_id]
        seen.add(run_id)
        if store.get_run(run_id) is None:
            return run_id
        _, snapshot, log = store.load_history(run_id)
        parent = _parent_in(run_id, snapshot, log[:1])
        if parent is None:
            return run_id
        run_id = parent[0]
    return run_id  # the parents loop (a damaged database): the trace is rooted where it closes


def _parent_in(run_id: str, snapshot: str | None, log: list[Event]) -> tuple[str, int] | None:
    """The parent a run's snapshot or RUN_STARTED names."""
    if snapshot is not None:
        parent = read_snapshot(run_id, snapshot).get("parent")
        return None if parent is None else (parent[0], parent[1])
    for event in log[:1]:
        if event.kind == events.RUN_STARTED:
            parent = codec.decode(event.data or "{}").get("parent")
            return None if parent is None else (parent["run_id"], parent["step"])
    return None


@dataclass(frozen=True, slots=True)
class Trace:
    """The spans of a run and of the child runs under it, built from the database."""

    spans: list[SpanRecord]
    runs: list[str]
    """The runs folded, the one asked for first."""
    compacted: list[str]
    """Those with a compacted prefix: its steps have no times left, and have no spans here."""


def trace_of(store: Store, run_id: str) -> Trace:
    """The spans of run ``run_id`` and of its child runs, theirs in turn, and the runs a child
    continued as (which keep its parent), from their logs: the spans ``instrument`` emitted, or
    would have, as they ended. ``RunNotFoundError`` for an unknown run."""
    require_run(store, run_id)
    root = root_of(store, run_id)
    spans: list[SpanRecord] = []
    runs: list[str] = []
    compacted: list[str] = []
    todo = [run_id]
    while todo:
        current = todo.pop(0)
        row = store.get_run(current)
        if row is None or current in runs:
            continue
        runs.append(current)
        loaded = store.load_history(current)
        fold, log = open_fold(store, current, root, loaded=loaded)
        if loaded[0]:
            compacted.append(current)
        spans.extend(spans_of(current, log, fold=fold))
        found = lineage(store, current, loaded)
        todo.extend(child for _, child in sorted(found.children.items()))
        next_id = continued_as(row)
        if next_id is not None and fold.parent is not None:
            todo.append(next_id)
    return Trace(spans, runs, compacted)


# -- OTLP/JSON -------------------------------------------------------------------------------


def otlp_json(spans: Iterable[SpanRecord], *, service: str = SCOPE) -> dict[str, Any]:
    """``spans`` as the OTLP HTTP exporter sends them in JSON (``resourceSpans`` /
    ``scopeSpans`` / ``spans``): hex ids, unix-nanosecond times as strings, kind INTERNAL."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes({"service.name": service})},
                "scopeSpans": [
                    {
                        "scope": {"name": SCOPE, "version": __version__},
                        "spans": [_otlp_span(span) for span in spans],
                    }
                ],
            }
        ]
    }


_SPAN_KIND_INTERNAL, _STATUS_CODE_ERROR = 1, 2


def _otlp_span(span: SpanRecord) -> dict[str, Any]:
    found: dict[str, Any] = {"traceId": span.trace_id, "spanId": span.span_id}
    if span.parent_span_id is not None:
        found["parentSpanId"] = span.parent_span_id
    found.update(
        name=span.name,
        kind=_SPAN_KIND_INTERNAL,
        startTimeUnixNano=str(span.start_ns),
        endTimeUnixNano=str(span.end_ns),
        attributes=_attributes(span.attributes),
    )
    if span.error is not None:
        found["status"] = {"code": _STATUS_CODE_ERROR, "message": span.error}
    return found


def _attributes(values: Mapping[str, Attribute]) -> list[dict[str, Any]]:
    return [{"key": key, "value": _any_value(value)} for key, value in values.items()]


def _any_value(value: Attribute) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}  # int64 in protobuf's JSON is a string
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": value}


# -- live ------------------------------------------------------------------------------------


def instrument(rt: Runtime, tracer_provider: Any = None) -> Callable[[], None]:
    """Emit, through OpenTelemetry, a span for each step ``rt`` ends and each run it ends, as
    the commit that ends it lands: with ``tracer_provider``'s tracer (default: the global
    provider's), which must be the OpenTelemetry SDK's (durabl sets the ids; see the module
    docstring). Returns a function that stops it.

    A span is emitted after its commit, in the committing thread, and at most once: a process
    death between the two loses it (``durabl export-traces`` rebuilds it from the log). A
    failure to emit is logged (``durabl.telemetry``) and never fails the step."""
    tracer = _tracer(tracer_provider)
    return rt.observe(LiveSpans(rt.store, lambda span: _emit(tracer, span)))


class LiveSpans:
    """The observer ``instrument`` registers: each commit's events go to their run's fold, and
    the spans they end to ``emit``. A run's fold is kept between its commits; one this process
    has not seen (a run it resumes, or one whose log others appended to) is folded again from
    the database first, up to the commit in hand, and what it ends there is not emitted: the
    commits that ended it did that, in whatever process made them."""

    def __init__(self, store: Store, emit: Callable[[SpanRecord], None]) -> None:
        self.store = store
        self.emit = emit
        self.lock = threading.Lock()  # worker threads commit runs side by side
        self.folds: OrderedDict[str, SpanFold] = OrderedDict()

    def __call__(self, run_id: str, rows: list[Event], history: History) -> None:
        try:
            with self.lock:
                spans = self.ended(run_id, rows)
            for span in spans:
                self.emit(span)
        except Exception:  # tracing must never fail the step whose commit has landed
            with self.lock:
                self.folds.pop(run_id, None)  # folded afresh at the run's next commit
            _log.warning("no spans emitted for the commit to run %s", run_id, exc_info=True)

    def ended(self, run_id: str, rows: list[Event]) -> list[SpanRecord]:
        """The spans the commit of ``rows`` to run ``run_id`` ends."""
        fold = self._fold_before(run_id, rows[0].seq)
        spans = spans_of(run_id, rows, fold=fold)
        if fold.ended:
            self.folds.pop(run_id, None)
            if fold.parent is not None and any(row.kind in _CHILD_ENDS for row in rows):
                spans.extend(self._parent_step(fold))
        return spans

    def _fold_before(self, run_id: str, seq: int) -> SpanFold:
        """The run's fold with every event before ``seq`` applied."""
        fold = self.folds.pop(run_id, None)
        if fold is None or fold.seq != seq - 1:
            known = {rid: f.root for rid, f in self.folds.items()}
            fold, log = open_fold(self.store, run_id, known=known)
            spans_of(run_id, [event for event in log if event.seq < seq], fold=fold)
        self.folds[run_id] = fold
        while len(self.folds) > KEPT_RUNS:
            self.folds.popitem(last=False)
        return fold

    def _parent_step(self, child: SpanFold) -> list[SpanRecord]:
        """The span of the ChildRun step the child's end ended in its parent's log (written by
        the same commit, when the parent had not ended), from a fresh fold of that log."""
        assert child.parent is not None
        parent_id, step = child.parent
        fold, log = open_fold(self.store, parent_id, child.root)
        wanted = span_id_of(parent_id, step)
        return [span for span in spans_of(parent_id, log, fold=fold) if span.span_id == wanted]


_EMITTING: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "durabl_span_ids", default=None
)
"""The (trace id, span id) of the span being emitted in this thread, for ``_LogIds``."""


class _LogIds:
    """An OpenTelemetry SDK id generator (by its methods: the SDK is not imported) that gives
    the span durabl is emitting the ids from its log, and any other span the ids of the
    generator it wraps."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped = wrapped

    def generate_span_id(self) -> int:
        ids = _EMITTING.get()
        return ids[1] if ids is not None else int(self.wrapped.generate_span_id())

    def generate_trace_id(self) -> int:
        ids = _EMITTING.get()
        return ids[0] if ids is not None else int(self.wrapped.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        if _EMITTING.get() is not None:
            return False  # a run id, or a hash of one: nothing promises its bits are random
        return bool(getattr(self.wrapped, "is_trace_id_random", lambda: False)())


def _tracer(provider: Any) -> Any:
    """durabl's tracer from ``provider`` (default: the global one), with ``_LogIds``."""
    try:
        from opentelemetry import trace
    except ImportError:
        raise ImportError(
            "durabl.telemetry.instrument needs OpenTelemetry: pip install 'durabl[otel]'"
        ) from None
    provider = provider if provider is not None else trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider):
        raise TypeError(
            "durabl.telemetry.instrument: no tracer provider is set; pass tracer_provider= "
            "or call opentelemetry.trace.set_tracer_provider first"
        )
    tracer = provider.get_tracer(SCOPE, __version__)
    ids = getattr(tracer, "id_generator", None)
    if ids is None and not isinstance(tracer, trace.NoOpTracer):
        raise TypeError(
            f"durabl.telemetry.instrument derives span ids from the log and needs the "
            f"OpenTelemetry SDK's TracerProvider, got {type(provider).__name__}"
        )
    if ids is not None and not isinstance(ids, _LogIds):
        tracer.id_generator = _LogIds(ids)
    return tracer


def _emit(tracer: Any, span: SpanRecord) -> None:
    """Hand ``span`` to OpenTelemetry, with its own ids, parent, times and status."""
    from opentelemetry import trace
    from opentelemetry.context import Context

    trace_id = int(span.trace_id, 16)
    context = Context()  # never the caller's current span: the parent is the log's
    if span.parent_span_id is not None:
        parent = trace.SpanContext(
            trace_id,
            int(span.parent_span_id, 16),
            is_remote=True,
            trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
        )
        context = trace.set_span_in_context(trace.NonRecordingSpan(parent), context)
    token = _EMITTING.set((trace_id, int(span.span_id, 16)))
    try:
        emitted = tracer.start_span(
            span.name,
            context=context,
            kind=trace.SpanKind.INTERNAL,
            attributes=dict(span.attributes),
            start_time=span.start_ns,
        )
    finally:
        _EMITTING.reset(token)
    if span.error is not None:
        emitted.set_status(trace.Status(trace.StatusCode.ERROR, span.error))
    emitted.end(end_time=span.end_ns)


__all__ = [
    "KEPT_RUNS",
    "SCOPE",
    "LiveSpans",
    "SpanFold",
    "SpanRecord",
    "Trace",
    "instrument",
    "open_fold",
    "otlp_json",
    "root_of",
    "span_id_of",
    "spans_of",
    "trace_id_of",
]
