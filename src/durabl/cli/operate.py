"""The commands that drive or change runs: ``worker``, ``resume``, ``dlq`` (with redrive,
resolve and cancel), ``tick`` and ``compact``.

Each handler is given the runtime ``main`` opened on ``--db`` with the ``--import`` modules,
except the ``dlq`` listing, which only reads: it opens a runtime on a read-only store itself.
"""

from __future__ import annotations

import argparse
import json
import signal
from typing import Any

from durabl.cli.options import (
    EXIT_FAILED,
    EXIT_OK,
    OPTIONAL,
    REQUIRED,
    Commands,
    UsageError,
    positive,
    whole,
)
from durabl.cli.render import Grid, emit, print_state, short, state_text
from durabl.runtime import Runtime
from durabl.store import open_store


def add_worker(commands: Commands) -> None:
    p = commands.add_command(
        "worker",
        run_worker,
        help="resume interrupted runs and fire timers as they come due, until SIGTERM/SIGINT",
        description="Drive every run of the database that has work. Several workers may share "
        "one database. SIGTERM or SIGINT lets the current steps finish, then exits 0.",
    )
    p.add_argument(
        "--concurrency", type=positive(int), default=1, help="runs driven at once (default 1)"
    )
    p.add_argument(
        "--poll",
        type=positive(float),
        default=1.0,
        help="seconds between looks for new runs (default 1)",
    )


def add_resume(commands: Commands) -> None:
    commands.add_command(
        "resume",
        _resume,
        help="drive a run on from where its log ends",
        description="Resume a run (needs --import for its workflow and tools). Prints the "
        "resulting state; exit 1 if the run ends FAILED.",
        run=REQUIRED,
        needs_db=True,
    )


def add_dlq(commands: Commands) -> None:
    p = commands.add_command(
        "dlq",
        _dlq_list,
        help="list dead-lettered runs; redrive, resolve or cancel one",
        description="Without an action, list the dead letters (read-only). The actions need "
        "--import for the run's workflow and tools; each is recorded in the run's log.",
        read_only=True,
    )
    actions = p.add_commands(dest="action", metavar="ACTION")
    acting: dict[str, Any] = {"run": REQUIRED, "read_only": False, "needs_db": True}
    actions.add_command(
        "redrive",
        _dlq_redrive,
        help="call the dead-lettered step again",
        description="Call the dead-lettered step again (accepting a possible duplicate).",
        **acting,
    )
    resolve = actions.add_command(
        "resolve",
        _dlq_resolve,
        help="supply the dead-lettered step's result",
        description="Record RESULT as the dead-lettered step's result and drive the run on.",
        **acting,
    )
    resolve.add_argument("--result", required=True, metavar="JSON", help="the result, as JSON")
    cancel = actions.add_command(
        "cancel",
        _dlq_cancel,
        help="cancel the run",
        description="Cancel the run; it never resumes.",
        **acting,
    )
    cancel.add_argument("--reason", default="cancelled by operator", help="recorded in the log")


def add_signal(commands: Commands) -> None:
    p = commands.add_command(
        "signal",
        _signal,
        help="send a signal (an answer from outside, e.g. an approval) to a run's WaitSignal",
        description="Send PAYLOAD (JSON; default null) to the run, for its WaitSignal(NAME): "
        "kept until a wait for NAME takes it, and taken once. A run waiting for it is made "
        "due at once: a worker, or tick, drives it on. Prints the signal's number in the run.",
        run=REQUIRED,
        needs_db=True,
    )
    p.add_argument("name", metavar="NAME", help="the name the run's WaitSignal waits for")
    p.add_argument("payload", metavar="PAYLOAD", nargs="?", default="null", help="JSON")


def _signal(args: argparse.Namespace, rt: Runtime) -> int:
    try:
        payload = json.loads(args.payload)
    except ValueError as exc:
        raise UsageError(f"PAYLOAD is not JSON: {exc}") from None
    number = rt.signal(args.run, args.name, payload)
    target = rt.current(args.run)  # a chain of ContinueAsNew takes it where it has got to
    where = args.run if target == args.run else f"{target} ({args.run} continued as it)"
    emit(
        args,
        {"run_id": target, "name": args.name, "signal": number, "sent_to": args.run},
        f"signal {args.name!r} #{number} sent to run {where}",
    )
    return EXIT_OK


def add_fork(commands: Commands) -> None:
    p = commands.add_command(
        "fork",
        _fork,
        help="make a new run from a run's log up to SEQ, to run on with the code deployed now",
        description="Create a new run whose log is RUN's up to SEQ (the seq that ends a step, as "
        "`show RUN` lists them): resumed (resume, or a worker), it takes steps 1..N from the "
        "copied log without calling anything and goes on with today's code. Prints the new "
        "run's id.",
        run=REQUIRED,
        needs_db=True,
    )
    p.add_argument("--at", type=int, required=True, metavar="SEQ", help="the last seq to copy")
    p.add_argument("--run-id", metavar="NEW", help="the new run's id (default: a new one)")


def _fork(args: argparse.Namespace, rt: Runtime) -> int:
    new_id = rt.fork(args.run, args.at, new_run_id=args.run_id)
    emit(
        args,
        {"run_id": new_id, "forked_from": {"run_id": args.run, "seq": args.at}},
        f"run {new_id} forked from run {args.run} at seq {args.at}",
    )
    return EXIT_OK


def add_tick(commands: Commands) -> None:
    p = commands.add_command(
        "tick",
        _tick,
        help="fire the timers that are due and drive those runs on",
        description="Fire every durable timer due now (or at --now) and drive those runs on "
        "(needs --import for their workflows).",
        needs_db=True,
    )
    p.add_argument("--now", type=float, metavar="T", help="epoch seconds (default: now)")


def add_compact(commands: Commands) -> None:
    p = commands.add_command(
        "compact",
        _compact,
        help="fold finished steps into a snapshot and reclaim the space",
        description="Fold each run's finished prefix (less its last --keep-last steps) into a "
        "snapshot, delete the folded events and hand the space back to the file system. Replay "
        "gives the same state afterwards. Runs driven by a live process are skipped and listed; "
        "an explicit RUN driven by one is an error.",
        run=OPTIONAL,
        needs_db=True,
    )
    p.add_argument(
        "--keep-last",
        type=whole,
        default=0,
        metavar="N",
        help="leave the last N finished steps of each run in the log (default 0)",
    )


def run_worker(args: argparse.Namespace, rt: Runtime) -> int:
    """``durabl worker``: serve until SIGTERM or SIGINT, then say what was done."""

    def stop(_signum: int, _frame: Any) -> None:
        rt.stop()  # takes no lock and writes nothing: the handler may land anywhere

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stats = rt.serve(concurrency=args.concurrency, poll_s=args.poll)
    print(f"worker stopped: {stats.drives} drives, {stats.completed} runs completed", flush=True)
    return EXIT_OK


def _resume(args: argparse.Namespace, rt: Runtime) -> int:
    return print_state(args, rt.resume(args.run))


def _dlq_list(args: argparse.Namespace) -> int:
    with Runtime(store=open_store(args.db, read_only=True)) as rt:
        letters = rt.dead_letters()
    table = [
        [d.run_id, d.workflow, str(d.step), short(d.step_description, 40), short(d.reason)]
        for d in letters
    ]
    grid = Grid(["RUN", "WORKFLOW", "STEP", "DESCRIPTION", "REASON"], table)
    payload = [d.as_dict() for d in letters]
    emit(args, payload, grid if letters else "no dead letters")
    return EXIT_OK


def _dlq_redrive(args: argparse.Namespace, rt: Runtime) -> int:
    return print_state(args, rt.redrive(args.run))


def _dlq_resolve(args: argparse.Namespace, rt: Runtime) -> int:
    try:
        result = json.loads(args.result)
    except ValueError as exc:
        raise UsageError(f"--result is not JSON: {exc}") from None
    return print_state(args, rt.resolve(args.run, result))


def _dlq_cancel(args: argparse.Namespace, rt: Runtime) -> int:
    return print_state(args, rt.cancel(args.run, args.reason))


def _tick(args: argparse.Namespace, rt: Runtime) -> int:
    states = rt.tick(now=args.now)
    payload = [s.as_dict() for s in states]
    text = "\n".join(state_text(s) for s in states) or "no timers due"
    emit(args, payload, text)
    return EXIT_OK


def _compact(args: argparse.Namespace, rt: Runtime) -> int:
    report = rt.compact(args.run, keep_last=args.keep_last)
    table = [
        [c.run_id, str(c.steps_folded), str(c.events_deleted), str(c.watermark), str(c.events_kept)]
        for c in report.runs
    ]
    headers = ["RUN", "STEPS FOLDED", "EVENTS DELETED", "LOG STARTS AFTER SEQ", "EVENTS KEPT"]
    parts: list[str | Grid] = [Grid(headers, table) if table else "nothing to fold"]
    if report.busy:
        parts.append(f"skipped, driven by a live process: {', '.join(report.busy)}")
    parts.extend(f"not compacted: {run_id}: {why}" for run_id, why in report.errors.items())
    parts.append(f"file: {report.bytes_before} bytes before, {report.bytes_after} bytes after")
    emit(args, report.as_dict(), *parts)
    return EXIT_FAILED if report.errors else EXIT_OK
