"""The grammar every ``durabl`` command shares: the global options, the parser, the value
types, the exit codes and the error a user's mistake raises.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A mistake on the command line or in what it points at."""


class Parser(argparse.ArgumentParser):
    """A parser whose errors raise ``UsageError`` (argparse would print usage and exit itself)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """--db, --json and --import, with their defaults."""
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


def add_after_the_command(commands: Any) -> None:
    """--db and --json on every subcommand, so they are accepted after the command too."""
    for parser in _all_parsers(commands):
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


def positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argument type: a number of ``kind`` (int, float) greater than 0."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def whole(text: str) -> int:
    """An argument type: a whole number, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def positive_whole(text: str) -> int:
    """An argument type: a whole number, 1 or more."""
    value = whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value
