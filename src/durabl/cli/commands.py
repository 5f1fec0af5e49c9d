"""The inspection and operator commands: runs, show, resume, dlq, replay, tick, metrics,
compact, doctor.

Read-only commands open the database with ``SQLiteStore(path, read_only=True)``: they never
create, migrate or write a file. Each handler returns the exit code. Output is plain text, or
JSON with ``--json``; on a terminal the tables are drawn with rich, imported only then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from durabl import codec, events, replay
from durabl.metrics import Metrics, of_run
from durabl.replay import History
from durabl.runtime import RunState, Runtime
from durabl.store import doctor
from durabl.store.base import RunRow
from durabl.store.reads import require_run
from durabl.store.sqlite import SQLiteStore
from durabl.text import counted

EXIT_OK, EXIT_FAILED = 0, 1
_SHORT = 60
_STATUSES = (
    events.RUNNING,
    events.SLEEPING,
    events.HELD,
    events.DEAD_LETTERED,
    events.COMPLETED,
    events.FAILED,
    events.CANCELLED,
)


def add_commands(commands: Any) -> None:
    """Add every subcommand of this module to the ``durabl`` parser."""
    _add_runs(commands)
    _add_show(commands)
    _add_resume(commands)
    _add_dlq(commands)
    _add_replay(commands)
    _add_tick(commands)
    _add_metrics(commands)
    _add_compact(commands)
    _add_doctor(commands)
    for parser in _all_parsers(commands):
        # the global options are accepted after the command too
        parser.add_argument("--db", default=argparse.SUPPRESS, help="the database file")
        parser.add_argument(
            "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
        )


def _all_parsers(commands: Any) -> Iterator[argparse.ArgumentParser]:
    for parser in commands.choices.values():
        yield parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield from _all_parsers(action)


# -- parsers ---------------------------------------------------------------------------------


def _add_runs(commands: Any) -> None:
    p = commands.add_parser(
        "runs",
        help="list runs, newest first",
        description="List the runs of the database, newest first (read-only).",
    )
    p.add_argument("--status", help="only runs with this status (e.g. RUNNING, COMPLETED)")
    p.add_argument("--workflow", help="only runs of this workflow")
    p.add_argument("--limit", type=_positive_int, help="at most N runs")
    p.set_defaults(handler=_runs, read_only=True)


def _add_show(commands: Any) -> None:
    p = commands.add_parser(
        "show",
        help="a run's event log as a timeline",
        description="Print a run's event log as a readable timeline (read-only). With --trace, "
        "one line per step saying whether the last process replayed it from the log or "
        "executed it.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")
    p.add_argument("--trace", action="store_true", help="per step: replayed or executed")
    p.set_defaults(handler=_show, read_only=True)


def _add_resume(commands: Any) -> None:
    p = commands.add_parser(
        "resume",
        help="drive a run on from where its log ends",
        description="Resume a run (needs --import for its workflow and tools). Prints the "
        "resulting state; exit 1 if the run ends FAILED.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")
    p.set_defaults(handler=_resume, needs_db=True)


def _add_dlq(commands: Any) -> None:
    p = commands.add_parser(
        "dlq",
        help="list dead-lettered runs; redrive, resolve or cancel one",
        description="Without an action, list the dead letters (read-only). The actions need "
        "--import for the run's workflow and tools; each is recorded in the run's log.",
    )
    p.set_defaults(handler=_dlq_list, read_only=True)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    redrive = actions.add_parser(
        "redrive",
        help="call the dead-lettered step again",
        description="Call the dead-lettered step again (accepting a possible duplicate).",
    )
    redrive.add_argument("run", metavar="RUN", help="the run id")
    redrive.set_defaults(handler=_dlq_redrive, read_only=False, needs_db=True)
    resolve = actions.add_parser(
        "resolve",
        help="supply the dead-lettered step's result",
        description="Record RESULT as the dead-lettered step's result and drive the run on.",
    )
    resolve.add_argument("run", metavar="RUN", help="the run id")
    resolve.add_argument("--result", required=True, metavar="JSON", help="the result, as JSON")
    resolve.set_defaults(handler=_dlq_resolve, read_only=False, needs_db=True)
    cancel = actions.add_parser(
        "cancel", help="cancel the run", description="Cancel the run; it never resumes."
    )
    cancel.add_argument("run", metavar="RUN", help="the run id")
    cancel.add_argument("--reason", default="cancelled by operator", help="recorded in the log")
    cancel.set_defaults(handler=_dlq_cancel, read_only=False, needs_db=True)


def _add_replay(commands: Any) -> None:
    p = commands.add_parser(
        "replay",
        help="rebuild a run's state from its log (--dry: executes and writes nothing)",
        description="Replay a run against its log with the workflow code (needs --import). "
        "--dry opens the database read-only: nothing is executed and nothing is written, even "
        "when the log ends mid-step.",
    )
    p.add_argument("run", metavar="RUN", help="the run id")
    p.add_argument("--dry", action="store_true", help="required: execute and write nothing")
    p.set_defaults(handler=_replay, read_only=True)


def _add_tick(commands: Any) -> None:
    p = commands.add_parser(
        "tick",
        help="fire the timers that are due and drive those runs on",
        description="Fire every durable timer due now (or at --now) and drive those runs on "
        "(needs --import for their workflows).",
    )
    p.add_argument("--now", type=float, metavar="T", help="epoch seconds (default: now)")
    p.set_defaults(handler=_tick, needs_db=True)


def _add_metrics(commands: Any) -> None:
    p = commands.add_parser(
        "metrics",
        help="what a run cost: steps, retries, replays, time, model tokens",
        description="Print a run's figures from its log alone (read-only): steps, model and "
        "tool calls, attempts, retries, resumes and the steps they replayed, model calls and "
        "tool calls executed again after a crash, dead letters, model tokens and the tokens "
        "re-executed calls cost (estimated from the usage recorded for the same call), and wall "
        "clock against time in steps and waiting on timers. Without RUN: the sums over every "
        "run, and one row per run.",
    )
    p.add_argument("run", metavar="RUN", nargs="?", help="the run id (default: every run)")
    p.set_defaults(handler=_metrics, read_only=True)


def _add_compact(commands: Any) -> None:
    p = commands.add_parser(
        "compact",
        help="fold finished steps into a snapshot and reclaim the space",
        description="Fold each run's finished prefix (less its last --keep-last steps) into a "
        "snapshot, delete the folded events and hand the space back to the file system. Replay "
        "gives the same state afterwards. Runs driven by a live process are skipped and listed; "
        "an explicit RUN driven by one is an error.",
    )
    p.add_argument("run", metavar="RUN", nargs="?", help="the run id (default: every run)")
    p.add_argument(
        "--keep-last",
        type=_whole,
        default=0,
        metavar="N",
        help="leave the last N finished steps of each run in the log (default 0)",
    )
    p.set_defaults(handler=_compact, needs_db=True)


def _add_doctor(commands: Any) -> None:
    p = commands.add_parser(
        "doctor",
        help="check the database for damage (read-only)",
        description="Check the database without changing it: SQLite's integrity check, the "
        "schema, every event's and snapshot's checksum, that each log is numbered without gaps "
        "and starts where it should, that each run's status agrees with its log, and that no "
        "row names a missing run. Exit 0 when healthy, 1 when damage was found.",
    )
    p.set_defaults(handler=_doctor, read_only=True)


def _positive_int(text: str) -> int:
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


# -- helpers ---------------------------------------------------------------------------------


@contextmanager
def _read_store(path: str) -> Iterator[SQLiteStore]:
    store = SQLiteStore(path, read_only=True)
    try:
        yield store
    finally:
        store.close()


@dataclass(frozen=True)
class _Grid:
    """A table: aligned plain text, or a rich table on a terminal."""

    headers: Sequence[str]
    rows: list[list[str]]


def _emit(args: argparse.Namespace, payload: Any, *parts: str | _Grid) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
        return
    console = _console()
    for part in parts:
        if console is None:
            print(part if isinstance(part, str) else _table(part.headers, part.rows))
        elif isinstance(part, str):
            console.print(part, markup=False, highlight=False)
        else:
            console.print(_rich_table(part))


def _console() -> Any:
    """A rich console when stdout is a terminal, else None (plain, greppable text)."""
    if not sys.stdout.isatty():
        return None
    from rich.console import Console

    return Console(highlight=False)


def _rich_table(grid: _Grid) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(*grid.headers, header_style="bold")
    for row in grid.rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _when(at_s: float | None) -> str:
    if at_s is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at_s))


def _short(text: str | None, width: int = _SHORT) -> str:
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def _table(headers: Sequence[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def _state_text(state: RunState) -> str:
    lines = [
        f"run {state.run_id} ({state.workflow}): {state.status}",
        f"steps replayed {state.steps_replayed}, executed {state.steps_executed}",
    ]
    if state.result is not None:
        lines.append(f"result: {_short(codec.encode(state.result), 200)}")
    if state.error:
        lines.append(f"error: {state.error}")
    if state.next_step:
        lines.append(f"next step: {state.next_step}")
    return "\n".join(lines)


def _print_state(args: argparse.Namespace, state: RunState) -> int:
    _emit(args, state.model_dump(mode="json"), _state_text(state))
    return EXIT_FAILED if state.status == events.FAILED else EXIT_OK


def _runtime(args: argparse.Namespace, store: SQLiteStore | None = None) -> Runtime:
    from durabl.cli import load_modules

    options = load_modules(args.imports)
    if store is not None:
        return Runtime(store=store, **options)
    return Runtime(args.db, **options)


# -- read-only commands ----------------------------------------------------------------------


def _runs(args: argparse.Namespace) -> int:
    statuses = (args.status.upper(),) if args.status else None
    if statuses and statuses[0] not in _STATUSES:
        from durabl.cli import UsageError

        raise UsageError(f"unknown status {args.status!r}; one of {', '.join(_STATUSES)}")
    with _read_store(args.db) as store:
        rows = store.list_runs(statuses=statuses, workflow=args.workflow, limit=args.limit)
    payload = [
        {
            "run_id": r.run_id,
            "workflow": r.workflow,
            "status": r.status,
            "created_s": r.created_s,
            "updated_s": r.updated_s,
            "wake_at_s": r.wake_at_s,
            "error": r.error,
        }
        for r in rows
    ]
    table = [[r.run_id, r.workflow, r.status, _when(r.updated_s), _short(r.error)] for r in rows]
    grid = _Grid(["RUN", "WORKFLOW", "STATUS", "UPDATED (UTC)", "ERROR"], table)
    _emit(args, payload, grid if rows else "no runs")
    return EXIT_OK


@dataclass(frozen=True)
class _Loaded:
    """A run's row, what is left of its log, and the history folded from both."""

    row: RunRow
    log: list[events.Event]
    history: History
    watermark: int

    @property
    def head(self) -> str:
        return f"run {self.row.run_id} ({self.row.workflow}): {self.row.status}"

    @property
    def folded_steps(self) -> int:
        return sum(1 for rec in self.history.steps.values() if rec.first_seq <= self.watermark)

    @property
    def compacted(self) -> str:
        return (
            f"seqs 1..{self.watermark} were compacted into a snapshot of "
            f"{counted(self.folded_steps, 'step')}"
        )


def _load(store: SQLiteStore, run_id: str) -> _Loaded:
    row = require_run(store, run_id)
    watermark, snapshot, log = store.load_history(run_id)
    history = History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)
    return _Loaded(row, log, history, watermark)


def _show(args: argparse.Namespace) -> int:
    with _read_store(args.db) as store:
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
        "watermark": run.watermark,
        "snapshot_steps": run.folded_steps,
        "events": [
            {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "step": e.step, "data": _data(e.data)}
            for e in run.log
        ],
    }
    table = [
        [str(e.seq), _when(e.at_s), e.kind, str(e.step) if e.step else "", _short(e.data)]
        for e in run.log
    ]
    parts: list[str | _Grid] = [run.head]
    if run.row.error:
        parts.append(f"error: {run.row.error}")
    if run.watermark:
        parts.append(run.compacted)
    parts.append(_Grid(["SEQ", "TIME (UTC)", "KIND", "STEP", "DATA"], table))
    _emit(args, payload, *parts)


def _data(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _trace(args: argparse.Namespace, run: _Loaded) -> None:
    """Per step: did the last process serve it from the log, or execute it?"""
    history = run.history
    boundary = history.last_resume_seq
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
        steps.append(
            {"position": position, "step": rec.canonical, "description": about, "how": how}
        )
    payload = {
        "run_id": run.row.run_id,
        "status": run.row.status,
        "processes": len(history.resumed_at) + 1,
        "last_resumed_seq": boundary or None,
        "watermark": run.watermark,
        "steps": steps,
    }
    table = [[str(s["position"]), str(s["how"]), _short(s["description"])] for s in steps]
    head = run.head + "; "
    head += f"last process took over at seq {boundary}" if boundary else "one process"
    parts: list[str | _Grid] = [head]
    if run.watermark:
        parts.append(run.compacted)
    _emit(args, payload, *parts, _Grid(["STEP", "HOW", "DESCRIPTION"], table))


def _dlq_list(args: argparse.Namespace) -> int:
    with Runtime(store=SQLiteStore(args.db, read_only=True)) as rt:
        letters = rt.dead_letters()
    table = [
        [d.run_id, d.workflow, str(d.step), _short(d.step_description, 40), _short(d.reason)]
        for d in letters
    ]
    grid = _Grid(["RUN", "WORKFLOW", "STEP", "DESCRIPTION", "REASON"], table)
    payload = [d.model_dump(mode="json") for d in letters]
    _emit(args, payload, grid if letters else "no dead letters")
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    from durabl.cli import UsageError

    if not args.dry:
        raise UsageError("replay only runs dry: add --dry (use `resume` to drive a run on)")
    with _runtime(args, SQLiteStore(args.db, read_only=True)) as rt:
        state = rt.replay(args.run, dry=True)
    _emit(args, state.model_dump(mode="json"), _state_text(state))
    return EXIT_FAILED if state.status == events.FAILED else EXIT_OK


def _metrics(args: argparse.Namespace) -> int:
    with _read_store(args.db) as store:
        if args.run is None:
            each = [(row, of_run(store, row.run_id)) for row in store.list_runs()]
        else:
            row = require_run(store, args.run)
            each = [(row, of_run(store, row.run_id))]
    per_run = [
        {"run_id": row.run_id, "workflow": row.workflow, "status": row.status, **m.model_dump()}
        for row, m in each
    ]
    if args.run is not None:
        [(row, figures)] = each
        head = f"run {row.run_id} ({row.workflow}): {row.status}"
        _emit(args, per_run[0], head, _Grid(["FIGURE", "VALUE"], _figures(figures)))
        return EXIT_FAILED if row.status == events.FAILED else EXIT_OK
    total = sum((m for _, m in each), Metrics(runs=0))
    table = [[row.run_id, row.workflow, row.status, *_columns(m)] for row, m in each]
    headers = ["RUN", "WORKFLOW", "STATUS", "STEPS", "RETRIES", "RESUMES", "RE-EXECUTED"]
    headers += ["TOKENS", "RE-EXECUTED TOKENS", "WALL (S)"]
    _emit(
        args,
        {"total": total.model_dump(), "runs": per_run},
        counted(total.runs, "run"),
        _Grid(["FIGURE", "VALUE"], _figures(total)),
        _Grid(headers, table) if table else "no runs",
    )
    return EXIT_OK


def _columns(m: Metrics) -> list[str]:
    again = m.reexecuted_model_calls + m.reexecuted_tool_calls
    counts = (m.steps, m.retries, m.resumes, again, m.total_tokens, m.reexecuted_tokens)
    return [*map(str, counts), f"{m.wall_s:.3f}"]


def _figures(m: Metrics) -> list[list[str]]:
    return [
        ["steps", str(m.steps)],
        ["model calls", str(m.model_calls)],
        ["tool calls", str(m.tool_calls)],
        ["sleeps", str(m.sleeps)],
        ["ctx values", str(m.ctx_values)],
        ["attempts", str(m.attempts)],
        ["retries", str(m.retries)],
        ["failed steps", str(m.failed_steps)],
        ["dead letters", str(m.dead_letters)],
        ["resumes", str(m.resumes)],
        ["replayed steps", str(m.replayed_steps)],
        ["re-executed model calls", str(m.reexecuted_model_calls)],
        ["re-executed tool calls", str(m.reexecuted_tool_calls)],
        ["input tokens", str(m.input_tokens)],
        ["output tokens", str(m.output_tokens)],
        ["total tokens", str(m.total_tokens)],
        ["re-executed tokens", f"{m.reexecuted_tokens} (estimated)"],
        ["wall clock", f"{m.wall_s:.3f} s"],
        ["time in steps", f"{m.step_s:.3f} s"],
        ["timer waits", f"{m.timer_wait_s:.3f} s"],
    ]


def _doctor(args: argparse.Namespace) -> int:
    from durabl.cli import UsageError

    if not os.path.lexists(args.db):
        raise UsageError(f"{args.db} does not exist")
    with _progress(args) as progress:
        found = doctor.examine(args.db, progress)
    healthy = all(f.ok for f in found)
    problems = sum(1 for f in found if not f.ok)
    table = [[f.check, "ok" if f.ok else "DAMAGED", f.message] for f in found]
    _emit(
        args,
        {"path": args.db, "healthy": healthy, "findings": [asdict(f) for f in found]},
        _Grid(["CHECK", "RESULT", "DETAIL"], table),
        "healthy" if healthy else f"damaged: {counted(problems, 'problem')} found",
    )
    return EXIT_OK if healthy else EXIT_FAILED


@contextmanager
def _progress(args: argparse.Namespace) -> Iterator[doctor.Progress | None]:
    """A progress bar for the checksum scan, on a terminal only."""
    console = None if args.json else _console()
    if console is None:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("checking checksums", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


# -- commands that write ---------------------------------------------------------------------


def _resume(args: argparse.Namespace, rt: Runtime) -> int:
    return _print_state(args, rt.resume(args.run))


def _dlq_redrive(args: argparse.Namespace, rt: Runtime) -> int:
    return _print_state(args, rt.redrive(args.run))


def _dlq_resolve(args: argparse.Namespace, rt: Runtime) -> int:
    from durabl.cli import UsageError

    try:
        result = json.loads(args.result)
    except ValueError as exc:
        raise UsageError(f"--result is not JSON: {exc}") from None
    return _print_state(args, rt.resolve(args.run, result))


def _dlq_cancel(args: argparse.Namespace, rt: Runtime) -> int:
    return _print_state(args, rt.cancel(args.run, args.reason))


def _tick(args: argparse.Namespace, rt: Runtime) -> int:
    states = rt.tick(now=args.now)
    payload = [s.model_dump(mode="json") for s in states]
    text = "\n".join(_state_text(s) for s in states) or "no timers due"
    _emit(args, payload, text)
    return EXIT_OK


def _compact(args: argparse.Namespace, rt: Runtime) -> int:
    report = rt.compact(args.run, keep_last=args.keep_last)
    table = [
        [c.run_id, str(c.steps_folded), str(c.events_deleted), str(c.watermark), str(c.events_kept)]
        for c in report.runs
    ]
    headers = ["RUN", "STEPS FOLDED", "EVENTS DELETED", "LOG STARTS AFTER SEQ", "EVENTS KEPT"]
    parts: list[str | _Grid] = [_Grid(headers, table) if table else "nothing to fold"]
    if report.busy:
        parts.append(f"skipped, driven by a live process: {', '.join(report.busy)}")
    parts.extend(f"not compacted: {run_id}: {why}" for run_id, why in report.errors.items())
    parts.append(f"file: {report.bytes_before} bytes before, {report.bytes_after} bytes after")
    _emit(args, report.model_dump(mode="json"), *parts)
    return EXIT_FAILED if report.errors else EXIT_OK
