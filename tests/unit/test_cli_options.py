"""The global options as the parser reads them, for every command (nested ones too): before the
command, after it, between its words, or not at all. ``tests/integration/test_cli_grammar.py``
runs the same placements as real processes."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from durabl.cli import build_parser
from durabl.cli.options import UsageError


def _commands(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], list[str]]]:
    """Each command's words, with arguments that satisfy what it requires."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*words, name), _required(sub)
                yield from _commands(sub, (*words, name))


def _required(parser: argparse.ArgumentParser) -> list[str]:
    args = []
    for action in parser._actions:
        if not action.option_strings and action.nargs is None:
            args.append("r")  # a required positional: RUN
        elif action.required and action.option_strings:
            args += [action.option_strings[0], "1"]
    return args


COMMANDS = list(_commands(build_parser()))
IDS = [" ".join(words) for words, _ in COMMANDS]


@pytest.mark.parametrize(("words", "args"), COMMANDS, ids=IDS)
def test_before_or_after_the_command_reads_the_same(
    words: tuple[str, ...], args: list[str]
) -> None:
    parse = build_parser().parse_args
    options = ["--db", "x.db", "--json", "--import", "a", "--import", "b"]
    before = vars(parse([*options, *words, *args]))
    after = vars(parse([*words, *args, *options]))
    assert before == after
    assert (before["db"], before["json"], before["imports"]) == ("x.db", True, ["a", "b"])


@pytest.mark.parametrize(("words", "args"), COMMANDS, ids=IDS)
def test_imports_add_up_across_every_level(words: tuple[str, ...], args: list[str]) -> None:
    argv = ["--import", "m0"]
    for level, word in enumerate(words, start=1):
        argv += [word, "--import", f"m{level}"]
    argv += [*args, "--import", "last"]
    expected = [f"m{level}" for level in range(len(words) + 1)] + ["last"]
    assert build_parser().parse_args(argv).imports == expected


@pytest.mark.parametrize(("words", "args"), COMMANDS, ids=IDS)
def test_defaults_stand_unless_given_and_a_later_value_wins(
    words: tuple[str, ...], args: list[str]
) -> None:
    parse = build_parser().parse_args
    plain = parse([*words, *args])
    assert (plain.db, plain.json, plain.imports) == ("durabl.db", False, [])
    assert parse(["--db", "early.db", *words, *args, "--db", "late.db"]).db == "late.db"


def test_an_unknown_option_is_a_usage_error_on_either_side() -> None:
    for argv in (["--frob", "runs"], ["runs", "--frob"], ["dlq", "redrive", "r", "--frob"]):
        with pytest.raises(UsageError, match="--frob"):
            build_parser().parse_args(argv)
