"""The read-only commands about runs and their logs: ``runs``, ``show [--trace]``,
``export-traces`` and ``replay --dry``.

None of them writes to the database: ``runs``, ``show`` and ``export-traces`` read through a
read-only store, and ``replay --dry`` runs the workflow code against a runtime on one, which
executes nothing. ``export-traces --out`` writes its own file, and only that.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from durabl import events, replay, telemetry
from durabl.cli.opening import read_store, runtime
from durabl.cli.options import EXIT_FAILED, EXIT_OK, REQUIRED, Commands, UsageError, positive_whole
from durabl.cli.render import Grid, emit, headline, print_state, short, when
from durabl.replay import History
from durabl.states import RunCheck
from durabl.store import Store, open_store
from durabl.store.base import RunRow
from durabl.store.reads import lineage, links, require_run, waiting_for
from durabl.text import counted

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
    return _Loaded(row, log, history, watermark, waiting_for(store, row), links(store, row, found))


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
    payload = {
        "run_id": run.row.run_id,
        "status": run.row.status,
        "waiting_for": run.waiting,
        "links": run.links,
        "watermark": run.watermark,
        "snapshot_steps": run.folded_steps,
        "events": [
            {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "step": e.step, "data": _data(e.data)}
            for e in run.log
        ],
    }
    table = [
        [str(e.seq), when(e.at_s), e.kind, str(e.step) if e.step else "", short(e.data)]
        for e in run.log
    ]
    parts: list[str | Grid] = [headline(run.row)]
    if run.row.error:
        parts.append(f"error: {run.row.error}")
    parts.extend(_about(run))
    if run.watermark:
        parts.append(run.compacted)
    parts.append(Grid(["SEQ", "TIME (UTC)", "KIND", "STEP", "DATA"], table))
    emit(args, payload, *parts)


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
    table = [
        [str(s["position"]), str(s["how"]), str(s["process"] or "-"), _step_cell(s)] for s in steps
    ]
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
    emit(args, payload, *parts, Grid(["STEP", "HOW", "PROCESS", "DESCRIPTION"], table))


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
    """A step's description in the trace; a Parallel's branch indented under it and marked."""
    branch = step["branch_of"]
    if branch is None:
        return short(step["description"])
    mark = f"branch {branch['branch']} of {branch['of']} (step {branch['step']}): "
    return "  " + short(mark + step["description"])


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
