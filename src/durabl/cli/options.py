"""The grammar every ``durabl`` command shares: the global options, the parser and its
subcommands, the value types, the exit codes and the error a user's mistake raises.

``--db``, ``--json`` and ``--import`` are defined once, in ``_global_options``, and every parser
gets them: the top one with their defaults, each subcommand (nested ones too) with SUPPRESS
defaults, so an option given before the command is not reset by the subcommand, and one given
after it still counts. ``--import`` adds up across every position.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

REQUIRED, OPTIONAL = "required", "optional"
_RUN: dict[str, dict[str, Any]] = {
    REQUIRED: {"help": "the run id"},
    OPTIONAL: {"nargs": "?", "help": "the run id (default: every run)"},
}


class UsageError(Exception):
    """A mistake on the command line or in what it points at."""


class Parser(argparse.ArgumentParser):
    """A parser with the global options whose errors raise ``UsageError`` (argparse would print
    usage and exit itself). ``top`` is the ``durabl`` parser itself; its subcommands are not."""

    def __init__(self, *, top: bool = False, **kwargs: Any) -> None:
        super().__init__(parents=[_global_options(top=top)], **kwargs)

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)

    def add_commands(self, **kwargs: Any) -> Commands:
        """``add_subparsers``, whose subcommands are ``Parser``s with the global options."""
        commands = self.add_subparsers(action=Commands, **kwargs)
        assert isinstance(commands, Commands)
        return commands


class Commands(argparse._SubParsersAction):
    """A parser's subcommands. argparse parses a subcommand's options into a namespace of its
    own and copies it over its parent's, which would drop the modules of an ``--import`` given
    before the command; this adds the ones given after it to them instead."""

    def add_command(
        self,
        name: str,
        handler: Callable[..., int],
        *,
        help: str,
        description: str,
        run: str | None = None,
        **defaults: Any,
    ) -> Parser:
        """The command ``name``: its parser, a RUN argument if ``run`` is ``REQUIRED`` or
        ``OPTIONAL``, and the ``handler`` that ``main`` calls (with ``defaults`` set)."""
        parser: Parser = self.add_parser(name, help=help, description=description)
        if run is not None:
            parser.add_argument("run", metavar="RUN", **_RUN[run])
        parser.set_defaults(handler=handler, **defaults)
        return parser

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        before = getattr(namespace, "imports", [])
        super().__call__(parser, namespace, values, option_string)
        after = getattr(namespace, "imports", before)
        if after is not before:
            namespace.imports = [*before, *after]


def _global_options(*, top: bool) -> argparse.ArgumentParser:
    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    options = argparse.ArgumentParser(add_help=False)
    group = options.add_argument_group("global options (before or after the command)")
    group.add_argument(
        "--db", default=default("durabl.db"), help="the database file (default: durabl.db)"
    )
    group.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print machine-readable JSON instead of text",
    )
    group.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=default([]),
        metavar="MODULE",
        help="import MODULE to register its workflows; it may define DURABL_TOOLS (a dict of "
        "tools), DURABL_LLM (the model callable) and DURABL_RETRY (a RetryPolicy). Repeatable.",
    )
    return options


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


def port(text: str) -> int:
    """An argument type: a TCP port, 0 (any free one) to 65535."""
    value = whole(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, got {text}")
    return value


def positive_whole(text: str) -> int:
    """An argument type: a whole number, 1 or more."""
    value = whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value
