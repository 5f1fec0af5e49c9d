"""The read-only commands about runs and their logs: ``runs``, ``show [--trace]``,
``export-traces`` and ``replay --dry``.

None of them writes to the database: ``runs``, ``show`` and ``export-traces`` read through a
read-only store, and ``replay --dry`` runs the workflow code against a runtime on one, which
executes nothing. ``export-traces --out`` writes its own file, and only that.

``show`` says what a run spent on models: each model answer's tokens and cost where its event
or its step is shown, a line that sums them (``durabl.metrics``: cost, tokens, what a crash made
the run spend again) and names the answers of a model with no price, whose cost is unknown, not
0. A streamed answer's text so far (STEP_PARTIAL) is shown shortened, and marked as cut off when
its attempt ended without an answer: a crash, a failure, or a process that is gone.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from durabl import codec, events, leases, replay, telemetry
from durabl.cli.opening import read_store, runtime
from durabl.cli.options import EXIT_FAILED, EXIT_OK, REQUIRED, Commands, UsageError, positive_whole
from durabl.cli.render import Grid, dollars, emit, headline, print_state, short, when
from durabl.metrics import Metrics, MetricsFold
from durabl.replay import History, StepRecord
from durabl.steps import describe_canonical
from durabl.store import Store, open_store
from durabl.store.base import RunRow
from durabl.store.reads import lineage, links, require_run, waiting_for
from durabl.text import counted
from durabl.upkeep import RunCheck

_STATUSES = (
    events.RUNNING,
    events.SLEEPING,
    events.WAITING,
    events.HELD,
    events.DEAD_LETTERED,
    events.COMPLETED,
    events.FAILED,
    events.CANCELLED,
    events.CONTINUED,
)

RUNS_SHOWN = 100
"""How many runs ``durabl runs`` lists unless told otherwise: its cost then does not grow with
the database (10,000 runs take about 120 ms to list in full)."""


def add_runs(commands: Commands) -> None:
    p = commands.add_command(
        "runs",
        _runs,
        help="list runs, newest first",
        description="List the runs of the database, newest first (read-only).",
        read_only=True,
    )
    p.add_argument("--status", help="only runs with this status (e.g. RUNNING, COMPLETED)")
    p.add_argument("--workflow", help="only runs of this workflow")
    count = p.add_mutually_exclusive_group()
    count.add_argument(
        "--limit",
        type=positive_whole,
        default=RUNS_SHOWN,
        help=f"at most N runs (default {RUNS_SHOWN})",
    )
    count.add_argument(
        "--all", dest="limit", action="store_const", const=None, help="every run, however many"
    )


def add_show(commands: Commands) -> None:
    p = commands.add_command(
        "show",
        _show,
        help="a run's event log as a timeline",
        description="Print a run's event log as a readable timeline (read-only). Above it, "
        "when they apply: what the run waits for, its parent run, the child runs it started "
        "with their statuses, and the runs it continued from and as. With --trace, one line "
        "per step saying whether the last process replayed it from the log or executed it; a "
        "Parallel's branches are indented under it.",
        run=REQUIRED,
        read_only=True,
    )
    p.add_argument("--trace", action="store_true", help="per step: replayed or executed")


def add_export_traces(commands: Commands) -> None:
    p = commands.add_command(
        "export-traces",
        _export_traces,
        help="a run and its child runs as OpenTelemetry spans (OTLP/JSON), from the log",
        description="Build the OpenTelemetry spans of a run and of its child runs from their "
        "logs, after the fact (read-only; needs no OpenTelemetry): one span per finished step "
        "and one per ended run, with the ids, times, parents and attributes that "
        "durabl.telemetry.instrument gives the spans it emits live. Printed as OTLP/JSON (what "
        "the OTLP HTTP exporter sends: resourceSpans, scopeSpans, spans), or written to --out "
        "FILE. Steps folded into a snapshot by compaction have no times left and are left out.",
        run=REQUIRED,
        read_only=True,
    )
    p.add_argument("--out", metavar="FILE", help="write the JSON to FILE instead of stdout")


def add_replay(commands: Commands) -> None:
    p = commands.add_command(
        "replay",
        _replay,
        help="rebuild a run's state from its log (--dry: executes and writes nothing)",
        description="Replay a run against its log with the workflow code (needs --import). "
        "--dry opens the database read-only: nothing is executed and nothing is written, even "
        "when the log ends mid-step.",
        run=REQUIRED,
        read_only=True,
    )
    p.add_argument("--dry", action="store_true", help="required: execute and write nothing")


def add_check(commands: Commands) -> None:
    commands.add_command(
        "check",
        _check,
        help="before a deploy: replay every run against the --import code, list what it would hold",
        description="Replay every stored run, dry, against the workflows of the --import modules "
        "(the code about to be deployed): each run that is not finished and whose log the code "
        "no longer matches is listed with the first step where they differ. Opens the database "
        "read-only; calls nothing. Exit 1 when a deploy of this code would hold any run.",
        read_only=True,
    )


def _check(args: argparse.Namespace) -> int:
    if not args.imports:
        raise UsageError("check needs the code to check: --import MODULE (repeatable)")
    with runtime(args, open_store(args.db, read_only=True)) as rt:
        found = rt.check()
    broken = [c for c in found if c.breaks]
    table = [
        [
            c.run_id,
            c.workflow,
            c.status,
            "ok" if c.ok else ("WOULD HOLD" if c.breaks else "differs (finished)"),
            _difference(c),
        ]
        for c in found
    ]
    summary = f"{counted(len(found), 'run')} checked: " + (
        f"{counted(len(broken), 'run')} would be held by this code"
        if broken
        else "none would be held"
    )
    emit(
        args,
        {"runs": [c.as_dict() for c in found], "would_hold": [c.run_id for c in broken]},
        Grid(["RUN", "WORKFLOW", "STATUS", "VERDICT", "FIRST DIFFERENCE"], table),
        summary,
    )
    return EXIT_FAILED if broken else EXIT_OK


def _difference(c: RunCheck) -> str:
    if c.ok:
        return ""
    if c.seq is None:
        return short(c.problem or "", 70)
    return f"seq {c.seq}: recorded {c.expected}, now {c.actual}"


def _runs(args: argparse.Namespace) -> int:
    statuses = (args.status.upper(),) if args.status else None
    if statuses and statuses[0] not in _STATUSES:
        raise UsageError(f"unknown status {args.status!r}; one of {', '.join(_STATUSES)}")
    limit = args.limit
    with read_store(args.db) as store:
        # One row past the limit tells whether there are more, without counting them all.
        rows = store.list_runs(
            statuses=statuses, workflow=args.workflow, limit=None if limit is None else limit + 1
        )
        more = limit is not None and len(rows) > limit
        rows = rows[:limit] if more else rows
        waits = {r.run_id: waiting_for(store, r) for r in rows if r.status == events.WAITING}
    payload = [
        {
            "run_id": r.run_id,
            "workflow": r.workflow,
            "status": r.status,
            "created_s": r.created_s,
            "updated_s": r.updated_s,
            "wake_at_s": r.wake_at_s,
            "error": r.error,
            **({"waiting_for": waits[r.run_id]} if r.run_id in waits else {}),
        }
        for r in rows
    ]
    table = [
        [r.run_id, r.workflow, _status(r, waits.get(r.run_id)), when(r.updated_s), short(r.error)]
        for r in rows
    ]
    grid = Grid(["RUN", "WORKFLOW", "STATUS", "UPDATED (UTC)", "ERROR"], table)
    emit(args, payload, grid if rows else "no runs")
    if more:
        print(
            f"the newest {limit} runs are shown; there are more: --limit N or --all",
            file=sys.stderr,
        )
    return EXIT_OK


def _status(row: RunRow, wait: dict[str, Any] | None) -> str:
    """The status, and for a waiting run what for and since when."""
    if wait is None:
        return row.status
    return f"{row.status} for {_waited(wait)}"


def _waited(wait: dict[str, Any]) -> str:
    """What a run waits for (as ``waiting_for`` says) and since when: "'approve' since ...",
    "child run R since ..."."""
    since = f"since {when(wait['since_s'])}"
    if "child" in wait:
        return f"child run {wait['child']} {since}"
    until = "" if wait["timeout_at_s"] is None else f", times out {when(wait['timeout_at_s'])}"
    return f"{wait['signal']!r} {since}{until}"


@dataclass(frozen=True)
class _Loaded:
    """A run's row, what is left of its log, the history folded from both, what the run waits
    for (if it is waiting) and the runs it is linked to (``reads.links``)."""

    row: RunRow
    log: list[events.Event]
    history: History
    watermark: int
    waiting: dict[str, Any] | None
    links: dict[str, Any]
    live: bool
    """A process holds the run's lease and is alive: a step in flight is being driven."""

    @property
    def folded_steps(self) -> int:
        return sum(1 for rec in self.history.steps.values() if rec.first_seq <= self.watermark)

    @property
    def compacted(self) -> str:
        return (
            f"seqs 1..{self.watermark} were compacted into a snapshot of "
            f"{counted(self.folded_steps, 'step')}"
        )


def _load(store: Store, run_id: str) -> _Loaded:
    row = require_run(store, run_id)
    watermark, snapshot, log = store.load_history(run_id)
    history = History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)
    found = lineage(store, run_id, (watermark, snapshot, log))
    lease = row.lease
    live = (
        lease is not None
        and lease.expires_s > time.time()
        and not leases.owner_gone(run_id, lease, store)
    )
    return _Loaded(
        row, log, history, watermark, waiting_for(store, row), links(store, row, found), live
    )


def _about(run: _Loaded) -> list[str | Grid]:
    """The lines that apply of what a run waits for and the runs it is linked to."""
    parts: list[str | Grid] = []
    if run.waiting is not None:
        signal = "" if "child" in run.waiting else "signal "
        parts.append(f"waiting for {signal}{_waited(run.waiting)}")
    found = run.links
    if found["parent"] is not None:
        parts.append(f"parent: run {found['parent']['run_id']}, step {found['parent']['step']}")
    if found["continued_from"] is not None:
        parts.append(f"continued from: run {found['continued_from']['run_id']}")
    if found["continued_as"] is not None:
        parts.append(f"continued as: run {found['continued_as']['run_id']}")
    for child in found["children"]:
        status = child["status"] or "not in this database"
        parts.append(f"child run {child['run_id']} (step {child['step']}): {status}")
    return parts


def _show(args: argparse.Namespace) -> int:
    with read_store(args.db) as store:
        run = _load(store, args.run)
    if args.trace:
        _trace(args, run)
    else:
        _timeline(args, run)
    return EXIT_FAILED if run.row.status == events.FAILED else EXIT_OK


def _timeline(args: argparse.Namespace, run: _Loaded) -> None:
    """The events after the compacted prefix (all of them if there is none), one per line."""
    partials = {p.seq: p for p in _partials(run)}
    figures = MetricsFold.of(run.log, run.history.folded_metrics).m
    unpriced = _unpriced(run.history)
    payload = {
        "run_id": run.row.run_id,
        "status": run.row.status,
        "waiting_for": run.waiting,
        "links": run.links,
        "watermark": run.watermark,
        "snapshot_steps": run.folded_steps,
        "spend": _spend_json(figures, unpriced) if figures.total_tokens else None,
        "events": [
            {
                "seq": e.seq,
                "at_s": e.at_s,
                "kind": e.kind,
                "step": e.step,
                "data": _data(e.data),
                **({"outcome": partials[e.seq].outcome} if e.seq in partials else {}),
            }
            for e in run.log
        ],
    }
    table = [
        [str(e.seq), when(e.at_s), e.kind, str(e.step) if e.step else "", _cell(run, e, partials)]
        for e in run.log
    ]
    parts: list[str | Grid] = [headline(run.row)]
    if run.row.error:
        parts.append(f"error: {run.row.error}")
    parts.extend(_about(run))
    if figures.total_tokens:  # the answers report usage: what they cost, and what was lost
        parts.append(_spend_line(figures, _lost_unpriced(run.history, unpriced)))
        if unpriced:
            parts.append(_unpriced_line(unpriced))
    if run.watermark:
        parts.append(run.compacted)
    parts.append(Grid(["SEQ", "TIME (UTC)", "KIND", "STEP", "DATA"], table))
    emit(args, payload, *parts)


def _cell(run: _Loaded, e: events.Event, partials: dict[int, _Partial]) -> str:
    """An event's DATA: a model answer as its model, tokens, cost and text; a streamed
    answer's text so far, marked as cut off when its attempt ended without an answer."""
    if e.seq in partials:
        return partials[e.seq].cell()
    if e.kind == events.TOOL_COMPLETED:  # the step and its result, in one event
        canonical, result = codec.unpair(e.data or "[null,null]")
        return f"{describe_canonical(canonical)} -> {short(result)}"
    rec = run.history.steps.get(e.step) if e.kind == events.STEP_COMPLETED else None
    answer = _answer(rec) if rec is not None else None
    if answer is None:
        return short(e.data)
    text = answer.get("text")
    about = f"{answer['model']}, " if isinstance(answer.get("model"), str) else ""
    said = f'"{short(text)}"' if isinstance(text, str) else short(e.data)
    return f"{about}{_spent(_spend_of(answer))}: {said}"


def _is_model(rec: StepRecord) -> bool:
    if rec.canonical is not None:
        return rec.canonical.startswith('["model"')
    return (rec.description or "").startswith("ModelCall(")


def _answer(rec: StepRecord) -> dict[str, Any] | None:
    """A model step's recorded answer, if it is an object that reports its usage."""
    if not _is_model(rec) or not rec.done or not (rec.result_text or "").startswith("{"):
        return None
    answer = json.loads(rec.result_text or "{}")
    return answer if isinstance(answer.get("usage"), dict) else None


def _tokens(usage: dict[str, Any]) -> int:
    """The answer's tokens, as ``durabl.metrics`` counts them: its total, else in + out."""
    total = usage.get("total_tokens")
    if isinstance(total, int) and total > 0:
        return total
    parts = (
        usage.get("input_tokens", usage.get("prompt_tokens")),
        usage.get("output_tokens", usage.get("completion_tokens")),
    )
    return sum(n for n in parts if isinstance(n, int) and n > 0)


def _spend_of(answer: dict[str, Any]) -> dict[str, Any]:
    """A model answer's tokens, cost (None: unknown) and model."""
    cost = answer.get("cost_usd")
    model = answer.get("model")
    return {
        "tokens": _tokens(answer["usage"]),
        "cost_usd": cost if isinstance(cost, int | float) and not isinstance(cost, bool) else None,
        "model": model if isinstance(model, str) else None,
    }


def _spent(spend: dict[str, Any]) -> str:
    """An answer's tokens and cost ("1500 tokens, $0.000435"); a model's with no price is
    unknown, never $0."""
    cost, model = spend["cost_usd"], spend["model"]
    if cost is not None:
        priced = f"${cost:.6f}"
    else:
        priced = "cost unknown" + ("" if model is None else f" (no price for {model})")
    return f"{spend['tokens']} tokens, {priced}"


def _unpriced(history: History) -> dict[int, str]:
    """The model steps whose answer reports usage and has no cost (position -> its model)."""
    found = {}
    for position, rec in sorted(history.steps.items()):
        answer = _answer(rec)
        if answer is not None and answer.get("cost_usd") is None:
            model = answer.get("model")
            found[position] = model if isinstance(model, str) else "no model named"
    return found


def _lost_unpriced(history: History, unpriced: dict[int, str]) -> bool:
    """Whether an answer of a model with no price was asked more than once for want of a
    recorded outcome (a crash lost it): re-executed spend that no price can cost."""
    return any(history.steps[p].attempts - history.steps[p].retries > 1 for p in unpriced)


def _spend_line(m: Metrics, lost_unpriced: bool) -> str:
    """The run's spend in one line: cost, tokens, what was spent again, cut-off text."""
    line = (
        f"spend: {dollars(m.cost_usd, m.unpriced_model_calls)}, {m.total_tokens} tokens "
        f"({m.input_tokens} in, {m.output_tokens} out) over {counted(m.model_calls, 'model call')}"
    )
    if m.reexecuted_model_calls:
        cost = f"${m.reexecuted_cost_usd:.6f}"
        if lost_unpriced:  # a call of a model with no price was among them
            cost = f"{cost} + unknown" if m.reexecuted_cost_usd else "unknown"
        again = (
            f"{cost}, {m.reexecuted_tokens} tokens for "
            f"{counted(m.reexecuted_model_calls, 'model call')} made again"
        )
    else:
        again = "none"
    line += f"; re-executed (estimated): {again}"
    if m.partial_chars:
        line += f"; cut-off streamed text: {counted(m.partial_chars, 'character')}"
    return line


def _unpriced_line(unpriced: dict[int, str]) -> str:
    """Names the answers of a model with no price: their step and their model."""
    named = ", ".join(f"step {position} ({model})" for position, model in unpriced.items())
    return f"no price, cost unknown: {named}"


_SPEND_FIGURES = (
    "cost_usd", "unpriced_model_calls", "model_calls", "input_tokens", "output_tokens",
    "total_tokens", "reexecuted_model_calls", "reexecuted_tokens", "reexecuted_cost_usd",
    "partial_chars",
)  # fmt: skip


def _spend_json(m: Metrics, unpriced: dict[int, str]) -> dict[str, Any]:
    """The figures the spend line sums (``durabl.metrics``), and the answers with no price."""
    return {
        **{name: getattr(m, name) for name in _SPEND_FIGURES},
        "unpriced_steps": [{"step": step, "model": model} for step, model in unpriced.items()],
    }


@dataclass
class _Partial:
    """One STEP_PARTIAL: the text an attempt had streamed by then, and how that attempt ended:
    "finished" (its answer is recorded), "cut off" (a crash, a failure or a retry ended it
    without an answer, or no live process drives it), or "streaming" (its process lives)."""

    seq: int
    step: int
    attempt: int
    text: str
    outcome: str = "streaming"
    last: bool = True
    """The last text recorded for its attempt: where a cut-off attempt stopped."""

    def cell(self) -> str:
        said = f'"{short(self.text, 50)}"'
        if self.outcome == "cut off" and self.last:
            return (
                f"cut off, attempt {self.attempt} ({counted(len(self.text), 'character')}): {said}"
            )
        later = {"cut off": "cut off later", "finished": "finished"}.get(self.outcome, "streaming")
        return f"attempt {self.attempt} so far ({later}): {said}"


def _partials(run: _Loaded) -> list[_Partial]:
    """Every STEP_PARTIAL of the log, with how its attempt ended."""
    found: list[_Partial] = []
    open_steps: dict[int, list[_Partial]] = {}  # step -> the partials of its attempt in flight

    def end(step: int, outcome: str) -> None:
        for partial in open_steps.pop(step, []):
            partial.outcome = outcome

    for e in run.log:
        if e.kind == events.STEP_PARTIAL:
            data = _data(e.data)
            data = data if isinstance(data, dict) else {}
            text = data.get("text")
            text = text if isinstance(text, str) else ""
            partial = _Partial(e.seq, e.step, data.get("attempt") or 0, text)
            for earlier in open_steps.get(e.step, []):
                if earlier.attempt == partial.attempt:
                    earlier.last = False
            open_steps.setdefault(e.step, []).append(partial)
            found.append(partial)
        elif e.kind == events.STEP_COMPLETED:
            end(e.step, "finished")
        elif e.kind in (events.STEP_STARTED, events.STEP_RETRY, events.STEP_FAILED):
            end(e.step, "cut off")  # a new attempt, or a failed one: no answer came of it
        elif e.kind == events.RUN_RESUMED:
            for step in list(open_steps):  # its streams died with the process before
                end(step, "cut off")
    for step in list(open_steps):
        end(step, "streaming" if run.live else "cut off")
    return found


def _data(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _copied_until(run: _Loaded) -> int:
    """For a fork, the last seq it copied from the run it came from (0 for any other run)."""
    first = run.log[0] if run.log and run.log[0].seq == 1 else None
    if first is None or first.kind != events.RUN_STARTED:
        return 0
    forked = json.loads(first.data or "{}").get("forked_from")
    return int(forked["seq"]) if isinstance(forked, dict) else 0


def _trace(args: argparse.Namespace, run: _Loaded) -> None:
    """Per step: did the last process serve it from the log, or execute it?"""
    history = run.history
    boundary = history.last_resume_seq
    copied = _copied_until(run)
    resumed_at = [seq for seq in history.resumed_at if seq > copied]  # the fork's own
    branches = _branches(history)
    streamed = _streamed(run)
    steps: list[dict[str, Any]] = []
    for position in sorted(history.steps):
        rec = history.steps[position]
        if rec.dead:
            how = "dead-lettered"
        elif not rec.done:
            how = "pending"
        elif rec.done_seq < boundary:
            how = "replayed"
        else:
            how = "executed"
        about = replay.describe_record(rec)
        # the process that recorded its outcome: 1 for the first, +1 at every RUN_RESUMED;
        # a fork's copied step was recorded by the run it came from
        process: int | str | None = (
            bisect.bisect_right(resumed_at, rec.done_seq) + 1 if rec.done else None
        )
        if rec.done and rec.done_seq <= copied:
            process = "copied"
        steps.append(
            {
                "position": position,
                "step": rec.canonical,
                "description": about,
                "how": how,
                "process": process,
                "branch_of": branches.get(position),
                "spend": _step_spend(rec),
                "partials": [
                    {"attempt": p.attempt, "text": p.text, "outcome": p.outcome}
                    for p in streamed.get(position, [])
                ],
            }
        )
    payload = {
        "run_id": run.row.run_id,
        "status": run.row.status,
        "processes": len(resumed_at) + 1,
        "last_resumed_seq": boundary or None,
        "boundaries": resumed_at,
        "watermark": run.watermark,
        "waiting_for": run.waiting,
        "links": run.links,
        "steps": steps,
    }
    head = headline(run.row) + "; "
    if resumed_at:
        seqs = ", ".join(str(seq) for seq in resumed_at)
        head += (
            f"last process took over at seq {boundary}; "
            f"{len(resumed_at) + 1} processes, boundaries at seq {seqs}"
        )
    else:
        head += "one process"
    parts: list[str | Grid] = [head]
    if copied:
        forked = json.loads(run.log[0].data or "{}")["forked_from"]
        parts.append(f"forked from run {forked['run_id']} at seq {copied}: steps up to it copied")
    parts.extend(_about(run))
    if run.watermark:
        parts.append(run.compacted)
    emit(args, payload, *parts, _trace_table(steps, streamed))


def _trace_table(steps: list[dict[str, Any]], streamed: dict[int, list[_Partial]]) -> Grid:
    """One row per step; under a model step, a row for each attempt that streamed text and
    has no answer (cut off, or streaming now)."""
    table: list[list[str]] = []
    for s in steps:
        table.append([str(s["position"]), str(s["how"]), str(s["process"] or "-"), _step_cell(s)])
        indent = "    " if s["branch_of"] else "  "
        for p in streamed.get(s["position"], []):
            if p.outcome != "finished":  # a finished attempt's text is its answer, above
                table.append(["", "", "", indent + p.cell()])
    return Grid(["STEP", "HOW", "PROCESS", "DESCRIPTION"], table)


_FOLDED_PARALLEL = re.compile(r"Parallel\((\d+) steps?: ")


def _branches(history: History) -> dict[int, dict[str, int]]:
    """Each Parallel branch's position -> the Parallel's position (``step``), the branch's
    number in it from 1 (``branch``) and how many it has (``of``). A Parallel at P has its N
    branches at P+1..P+N; a compacted one is known by its description, which counts them."""
    found: dict[int, dict[str, int]] = {}
    for position, rec in history.steps.items():
        if rec.canonical is not None and rec.canonical.startswith('["parallel"'):
            count = len(json.loads(rec.canonical)[1])
        elif rec.canonical is None and (folded := _FOLDED_PARALLEL.match(rec.description or "")):
            count = int(folded.group(1))
        else:
            continue
        for index in range(count):
            found[position + 1 + index] = {"step": position, "branch": index + 1, "of": count}
    return found


def _step_cell(step: dict[str, Any]) -> str:
    """A step's description in the trace, with a model answer's tokens and cost after it; a
    Parallel's branch indented under it and marked."""
    branch = step["branch_of"]
    spend = step["spend"]
    spent = "" if spend is None else f"; {_spent(spend)}"
    if branch is None:
        return short(step["description"]) + spent
    mark = f"branch {branch['branch']} of {branch['of']} (step {branch['step']}): "
    return "  " + short(mark + step["description"]) + spent


def _step_spend(rec: StepRecord) -> dict[str, Any] | None:
    """A model step's answer's tokens, cost and model; None for any other step."""
    answer = _answer(rec)
    return None if answer is None else _spend_of(answer)


def _streamed(run: _Loaded) -> dict[int, list[_Partial]]:
    """Per step, the last text each of its streamed attempts recorded (in the log after any
    compacted prefix), with how the attempt ended."""
    found: dict[int, list[_Partial]] = {}
    for partial in _partials(run):
        if partial.last:
            found.setdefault(partial.step, []).append(partial)
    return found


def _export_traces(args: argparse.Namespace) -> int:
    with read_store(args.db) as store:
        found = telemetry.trace_of(store, args.run)
    text = json.dumps(telemetry.otlp_json(found.spans), indent=2) + "\n"
    for run_id in found.compacted:
        print(
            f"run {run_id} was compacted: the steps in its snapshot have no spans here",
            file=sys.stderr,
        )
    if args.out is None:
        sys.stdout.write(text)
        return EXIT_OK
    _write_file(args.out, text)
    summary = (
        f"{counted(len(found.spans), 'span')} of {counted(len(found.runs), 'run')} "
        f"written to {args.out}"
    )
    emit(args, {"out": args.out, "spans": len(found.spans), "runs": found.runs}, summary)
    return EXIT_OK


def _write_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a temporary file beside it, synced, then
    renamed over it, and the directory synced."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".durabl-traces-")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o644)  # an export to share, not mkstemp's 0600
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except OSError as exc:
        os.unlink(temporary)
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    directory = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _replay(args: argparse.Namespace) -> int:
    if not args.dry:
        raise UsageError("replay only runs dry: add --dry (use `resume` to drive a run on)")
    with runtime(args, open_store(args.db, read_only=True)) as rt:
        state = rt.replay(args.run, dry=True)
    return print_state(args, state)
