"""The read-only commands that examine the database as a whole or a run's cost: ``metrics``
(figures folded from the logs alone) and ``doctor`` (damage checks; exit 1 if it finds any).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

from durabl import events
from durabl.cli.opening import read_store
from durabl.cli.options import EXIT_FAILED, EXIT_OK, OPTIONAL, Commands, UsageError, port
from durabl.cli.render import Grid, console, dollars, emit, headline
from durabl.ledger import spend
from durabl.metrics import Metrics, of_run
from durabl.store import doctor, is_postgres_url
from durabl.store.reads import require_run
from durabl.text import counted


def add_metrics(commands: Commands) -> None:
    commands.add_command(
        "metrics",
        _metrics,
        help="what a run cost: steps, retries, replays, time, model tokens",
        description="Print a run's figures from its log alone (read-only): steps, model and "
        "tool calls, attempts, retries, resumes and the steps they replayed, model calls and "
        "tool calls executed again after a crash, dead letters, model tokens and the tokens "
        "re-executed calls cost (estimated from the usage recorded for the same call), and wall "
        "clock against time in steps and waiting on timers. Without RUN: the sums over every "
        "run, and one row per run.",
        run=OPTIONAL,
        read_only=True,
    )


def add_doctor(commands: Commands) -> None:
    commands.add_command(
        "doctor",
        _doctor,
        help="check the database for damage (read-only)",
        description="Check the database without changing it: SQLite's integrity check, the "
        "schema, every event's and snapshot's checksum, that each log is numbered without gaps "
        "and starts where it should, that each run's status agrees with its log, and that no "
        "row names a missing run. Exit 0 when healthy, 1 when damage was found.",
        read_only=True,
    )


def add_ui(commands: Commands) -> None:
    p = commands.add_command(
        "ui",
        _ui,
        help="serve a read-only page that watches the runs (127.0.0.1)",
        description="Serve the dashboard: the runs, and each run's steps as they happen, across "
        "crashes and restarts. Read-only: the database is never migrated or written (SQLite "
        "may leave empty -wal/-shm files beside it, as any reader can). Binds 127.0.0.1 unless "
        "--host says otherwise; stop it with Ctrl-C or SIGTERM.",
        read_only=True,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument(
        "--port", type=port, default=8765, help="port (default 8765; 0 picks a free one)"
    )


def _ui(args: argparse.Namespace) -> int:
    from durabl.ui import server

    try:
        httpd = server.serve(args.db, host=args.host, port=args.port)
    except FileNotFoundError:
        raise UsageError(f"{args.db} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise UsageError(
                f"port {args.port} on {args.host} is in use: choose another --port, or --port 0 "
                "for a free one"
            ) from None
        raise UsageError(f"cannot serve on {args.host}:{args.port}: {exc.strerror}") from None
    stopping = threading.Event()

    def stop(*_: object) -> None:
        if not stopping.is_set():
            stopping.set()
            threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    try:
        httpd.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        httpd.server_close()
        httpd.reader.drop()
    return EXIT_OK


def _metrics(args: argparse.Namespace) -> int:
    with read_store(args.db) as store:
        if args.run is None:
            each = [(row, of_run(store, row.run_id)) for row in store.list_runs()]
        else:
            row = require_run(store, args.run)
            each = [(row, of_run(store, row.run_id))]
    per_run = [
        {"run_id": row.run_id, "workflow": row.workflow, "status": row.status, **m.as_dict()}
        for row, m in each
    ]
    if args.run is not None:
        [(row, figures)] = each
        with read_store(args.db) as store:
            tree = spend(store, row.run_id)
        together = {"runs": tree.runs, "tokens": tree.tokens, "cost_usd": tree.cost_usd}
        together["unpriced_model_calls"] = tree.unpriced_calls
        lines: list[str | Grid] = [headline(row), Grid(["FIGURE", "VALUE"], _figures(figures))]
        if tree.runs > 1:
            lines.append(
                f"with the {counted(tree.runs - 1, 'run')} it started: {tree.tokens} tokens, "
                f"{dollars(tree.cost_usd, tree.unpriced_calls)}"
            )
        emit(args, {**per_run[0], "with_runs_started": together}, *lines)
        return EXIT_FAILED if row.status == events.FAILED else EXIT_OK
    total = sum((m for _, m in each), Metrics(runs=0))
    table = [[row.run_id, row.workflow, row.status, *_columns(m)] for row, m in each]
    headers = ["RUN", "WORKFLOW", "STATUS", "STEPS", "RETRIES", "RESUMES", "RE-EXECUTED"]
    headers += ["TOKENS", "RE-EXECUTED TOKENS", "WALL (S)"]
    emit(
        args,
        {"total": total.as_dict(), "runs": per_run},
        counted(total.runs, "run"),
        Grid(["FIGURE", "VALUE"], _figures(total)),
        Grid(headers, table) if table else "no runs",
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
        ["cost", dollars(m.cost_usd, m.unpriced_model_calls)],
        ["re-executed cost", f"${m.reexecuted_cost_usd:.6f} (estimated)"],
        ["cut-off streamed text", f"{m.partial_chars} characters"],
        ["wall clock", f"{m.wall_s:.3f} s"],
        ["time in steps", f"{m.step_s:.3f} s"],
        ["timer waits", f"{m.timer_wait_s:.3f} s"],
    ]


def _doctor(args: argparse.Namespace) -> int:
    if not is_postgres_url(args.db) and not os.path.lexists(args.db):
        raise UsageError(f"{args.db} does not exist")
    with _progress(args) as progress:
        found = doctor.examine(args.db, progress)
    healthy = all(f.ok for f in found)
    problems = sum(1 for f in found if not f.ok)
    table = [[f.check, "ok" if f.ok else "DAMAGED", f.message] for f in found]
    emit(
        args,
        {"path": args.db, "healthy": healthy, "findings": [asdict(f) for f in found]},
        Grid(["CHECK", "RESULT", "DETAIL"], table),
        "healthy" if healthy else f"damaged: {counted(problems, 'problem')} found",
    )
    return EXIT_OK if healthy else EXIT_FAILED


@contextmanager
def _progress(args: argparse.Namespace) -> Iterator[doctor.Progress | None]:
    """A progress bar for the checksum scan, on a terminal only."""
    terminal = None if args.json else console()
    if terminal is None:
        yield None
        return
    from rich.progress import Progress

    with Progress(console=terminal, transient=True) as bar:
        task = bar.add_task("checking checksums", total=None)

        def advance(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield advance
