"""The ``durabl`` command line. Every error a user can cause is one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from durabl.errors import DurablError
from durabl.runtime import Runtime
from durabl.tools import RetryPolicy

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A mistake on the command line or in what it points at."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # argparse would print usage and exit itself
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="durabl", description="Durable execution for Python LLM agents.")
    parser.add_argument("--db", default="durabl.db", help="the database file (default: durabl.db)")
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of text"
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE to register its workflows; it may define DURABL_TOOLS (a dict of "
        "tools), DURABL_LLM (the model callable) and DURABL_RETRY (a RetryPolicy). Repeatable.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    worker = commands.add_parser(
        "worker",
        help="resume interrupted runs and fire timers as they come due, until SIGTERM/SIGINT",
        description="Drive every run of the database that has work. Several workers may share "
        "one database. SIGTERM or SIGINT lets the current steps finish, then exits 0.",
    )
    worker.add_argument(
        "--concurrency", type=_positive(int), default=1, help="runs driven at once (default 1)"
    )
    worker.add_argument(
        "--poll",
        type=_positive(float),
        default=1.0,
        help="seconds between looks for new runs (default 1)",
    )
    worker.set_defaults(handler=_worker)
    from durabl.cli import commands as more

    more.add_commands(commands)
    return parser


def load_modules(names: Sequence[str]) -> dict[str, Any]:
    """Import each module; collect the runtime options they define."""
    options: dict[str, Any] = {"tools": {}, "llm": None, "retry": None}
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            raise UsageError(f"cannot import module {name!r}: {exc}") from None
        except Exception as exc:  # the module's own code failed while loading
            raise UsageError(
                f"importing module {name!r} failed: {type(exc).__name__}: {exc}"
            ) from None
        options["tools"].update(getattr(module, "DURABL_TOOLS", {}) or {})
        options["llm"] = getattr(module, "DURABL_LLM", None) or options["llm"]
        retry = getattr(module, "DURABL_RETRY", None)
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise UsageError(f"{name}.DURABL_RETRY must be a RetryPolicy")
        options["retry"] = retry or options["retry"]
    return options


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def _worker(args: argparse.Namespace, rt: Runtime) -> int:
    def stop(_signum: int, _frame: Any) -> None:
        rt.stop()  # takes no lock and writes nothing: the handler may land anywhere

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stats = rt.serve(concurrency=args.concurrency, poll_s=args.poll)
    print(f"worker stopped: {stats.drives} drives, {stats.completed} runs completed", flush=True)
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "read_only", False):
            code_ro: int = args.handler(args)
            return code_ro
        if getattr(args, "needs_db", False) and not os.path.exists(args.db):
            raise UsageError(f"{args.db} does not exist")
        options = load_modules(args.imports)
        with Runtime(args.db, **options) as rt:
            code: int = args.handler(args, rt)
            return code
    except UsageError as exc:
        print(f"durabl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except DurablError as exc:
        print(f"durabl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # the reader went away (``durabl show RUN | head``)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
