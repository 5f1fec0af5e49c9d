"""The inspection and operator commands: runs, show, resume, dlq, replay, tick.

Read-only commands open the database with ``SQLiteStore(path, read_only=True)``: they never
create, migrate or write a file. Each handler returns the exit code.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from durabl import codec, events
from durabl.replay import History
from durabl.runtime import RunState, Runtime
from durabl.store.sqlite import SQLiteStore

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


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


# -- helpers ---------------------------------------------------------------------------------


@contextmanager
def _read_store(path: str) -> Iterator[SQLiteStore]:
    store = SQLiteStore(path, read_only=True)
    try:
        yield store
    finally:
        store.close()


def _emit(args: argparse.Namespace, payload: Any, text: str) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
    elif text:
        print(text)


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
    text = _table(["RUN", "WORKFLOW", "STATUS", "UPDATED (UTC)", "ERROR"], table)
    _emit(args, payload, text if rows else "no runs")
    return EXIT_OK


def _load(store: SQLiteStore, run_id: str) -> tuple[Any, list[events.Event]]:
    from durabl.errors import RunNotFoundError

    row = store.get_run(run_id)
    if row is None:
        raise RunNotFoundError(f"no run {run_id!r} in {store.path}")
    return row, store.load_log(run_id)


def _show(args: argparse.Namespace) -> int:
    with _read_store(args.db) as store:
        row, log = _load(store, args.run)
    if args.trace:
        _emit(args, *_trace(row, log))
    else:
        payload = [
            {"seq": e.seq, "at_s": e.at_s, "kind": e.kind, "step": e.step, "data": _data(e.data)}
            for e in log
        ]
        table = [
            [str(e.seq), _when(e.at_s), e.kind, str(e.step) if e.step else "", _short(e.data)]
            for e in log
        ]
        head = f"run {row.run_id} ({row.workflow}): {row.status}"
        if row.error:
            head += f"\nerror: {row.error}"
        text = head + "\n" + _table(["SEQ", "TIME (UTC)", "KIND", "STEP", "DATA"], table)
        _emit(args, {"run_id": row.run_id, "status": row.status, "events": payload}, text)
    return EXIT_FAILED if row.status == events.FAILED else EXIT_OK


def _data(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _trace(row: Any, log: list[events.Event]) -> tuple[Any, str]:
    """Per step: did the last process serve it from the log, or execute it?"""
    history = History.from_events(row.run_id, log, watermark=row.watermark)
    boundary = history.resumed_at[-1] if history.resumed_at else 0
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
        steps.append({"position": position, "step": rec.canonical, "how": how})
    payload = {
        "run_id": row.run_id,
        "status": row.status,
        "processes": len(history.resumed_at) + 1,
        "last_resumed_seq": boundary or None,
        "steps": steps,
    }
    table = [[str(s["position"]), str(s["how"]), _short(s["step"])] for s in steps]
    head = f"run {row.run_id} ({row.workflow}): {row.status}; "
    head += f"last process took over at seq {boundary}" if boundary else "one process"
    return payload, head + "\n" + _table(["STEP", "HOW", "DESCRIPTION"], table)


def _dlq_list(args: argparse.Namespace) -> int:
    with Runtime(store=SQLiteStore(args.db, read_only=True)) as rt:
        letters = rt.dead_letters()
    table = [
        [d.run_id, d.workflow, str(d.step), _short(d.step_description, 40), _short(d.reason)]
        for d in letters
    ]
    text = _table(["RUN", "WORKFLOW", "STEP", "DESCRIPTION", "REASON"], table)
    _emit(
        args, [d.model_dump(mode="json") for d in letters], text if letters else "no dead letters"
    )
    return EXIT_OK


def _replay(args: argparse.Namespace) -> int:
    from durabl.cli import UsageError

    if not args.dry:
        raise UsageError("replay only runs dry: add --dry (use `resume` to drive a run on)")
    with _runtime(args, SQLiteStore(args.db, read_only=True)) as rt:
        state = rt.replay(args.run, dry=True)
    _emit(args, state.model_dump(mode="json"), _state_text(state))
    return EXIT_FAILED if state.status == events.FAILED else EXIT_OK


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
