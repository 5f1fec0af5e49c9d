"""``durabl``'s entry point: the parser (one command per entry of ``_COMMANDS``) and ``main``,
which runs the command and turns every error a user can cause into one line on stderr, exit 2.

Read-only commands open the database themselves; every other command is handed a runtime on
``--db`` with the ``--import`` modules' workflows and tools.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from durabl.cli import examine, logs, migrate, operate
from durabl.cli.opening import runtime
from durabl.cli.options import EXIT_OK, EXIT_USAGE, Commands, Parser, UsageError
from durabl.errors import DurablError
from durabl.store import is_postgres_url

_COMMANDS: tuple[Callable[[Commands], None], ...] = (
    # in the order ``durabl --help`` lists them
    operate.add_worker,
    logs.add_runs,
    logs.add_show,
    logs.add_export_traces,
    operate.add_resume,
    operate.add_dlq,
    logs.add_replay,
    operate.add_tick,
    operate.add_signal,
    operate.add_fork,
    examine.add_metrics,
    operate.add_compact,
    examine.add_doctor,
    logs.add_check,
    migrate.add_migrate,
    examine.add_ui,
)


def build_parser() -> Parser:
    """The ``durabl`` parser with every command."""
    parser = Parser(
        top=True,
        prog="durabl",
        description="Durable execution for Python LLM agents.",
        epilog="durabl bench: the durability benchmark, with a command line of its own "
        "(durabl bench --help).",
    )
    commands = parser.add_commands(dest="command", metavar="COMMAND")
    commands.required = True
    for add in _COMMANDS:
        add(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``durabl`` command in ``argv`` (default: the process's); the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    bench_args = _bench_arguments(args)
    if bench_args is not None:  # its own command line, shared with ``python -m durabl.bench``
        from durabl.bench.command import main as bench

        return bench(bench_args)
    try:
        return _run(build_parser().parse_args(args))
    except (UsageError, DurablError) as exc:
        print(f"durabl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (``durabl show RUN | head``)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def _bench_arguments(args: list[str]) -> list[str] | None:
    """What follows ``bench`` when it is the command (after any global options, which it does
    not use), else None."""
    i = 0
    while i < len(args):
        if args[i] in ("--db", "--import"):
            i += 2
        elif args[i] == "--json" or args[i].startswith(("--db=", "--import=")):
            i += 1
        else:
            break
    return args[i + 1 :] if args[i : i + 1] == ["bench"] else None


def _run(args: argparse.Namespace) -> int:
    if getattr(args, "read_only", False):
        code_ro: int = args.handler(args)
        return code_ro
    if getattr(args, "needs_db", False) and not (
        is_postgres_url(args.db) or os.path.exists(args.db)
    ):
        raise UsageError(f"{args.db} does not exist")
    with runtime(args) as rt:
        code: int = args.handler(args, rt)
        return code
