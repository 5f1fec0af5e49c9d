"""How commands print: JSON with ``--json``; otherwise lines of text and tables, drawn with rich
on a terminal (imported only then) and as aligned plain text anywhere else, so that output piped
to a file or ``grep`` stays plain.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from durabl import codec, events
from durabl.cli.options import EXIT_FAILED, EXIT_OK
from durabl.runtime import RunState
from durabl.store.base import RunRow
from durabl.text import counted

_SHORT = 60


@dataclass(frozen=True)
class Grid:
    """A table: aligned plain text, or a rich table on a terminal."""

    headers: Sequence[str]
    rows: list[list[str]]


def emit(args: argparse.Namespace, payload: Any, *parts: str | Grid) -> None:
    """Print ``payload`` as JSON with ``--json``, else ``parts`` one after the other."""
    if args.json:
        print(json.dumps(payload, indent=2, sort_keys=True, default=str))
        return
    terminal = console()
    for part in parts:
        if terminal is None:
            print(part if isinstance(part, str) else _table(part.headers, part.rows))
        elif isinstance(part, str):
            terminal.print(part, markup=False, highlight=False)
        else:
            terminal.print(_rich_table(part))


def console() -> Any:
    """A rich console when stdout is a terminal, else None (plain, greppable text)."""
    if not sys.stdout.isatty():
        return None
    from rich.console import Console

    return Console(highlight=False)


def _rich_table(grid: Grid) -> Any:
    from rich.table import Table
    from rich.text import Text

    table = Table(*grid.headers, header_style="bold")
    for row in grid.rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def _table(headers: Sequence[str], rows: list[list[str]]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    lines = [headers, *rows]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


def when(at_s: float | None) -> str:
    """Epoch seconds as UTC date and time; "-" for none."""
    if at_s is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at_s))


def short(text: str | None, width: int = _SHORT) -> str:
    """``text`` on one line, cut to ``width`` characters with "..." when longer."""
    if not text:
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 3] + "..."


def headline(run: RunRow | RunState) -> str:
    """The line a run's report starts with: its id, workflow and status."""
    return f"run {run.run_id} ({run.workflow}): {run.status}"


def state_text(state: RunState) -> str:
    """A run's state in a few lines: status, steps, then result, error, next step if any."""
    lines = [
        headline(state),
        f"steps replayed {state.steps_replayed}, executed {state.steps_executed}",
    ]
    if state.result is not None:
        lines.append(f"result: {short(codec.encode(state.result), 200)}")
    if state.error:
        lines.append(f"error: {state.error}")
    if state.next_step:
        lines.append(f"next step: {state.next_step}")
    return "\n".join(lines)


def print_state(args: argparse.Namespace, state: RunState) -> int:
    """Print a run's state; the exit code: 1 if the run ended FAILED, else 0."""
    emit(args, state.as_dict(), state_text(state))
    return EXIT_FAILED if state.status == events.FAILED else EXIT_OK


def dollars(cost_usd: float, unpriced: int) -> str:
    """A cost, and how many answers it leaves out for want of a price (unknown, not free)."""
    if not unpriced:
        return f"${cost_usd:.6f}"
    unknown = f"{counted(unpriced, 'answer')} of a model with no price"
    return f"${cost_usd:.6f} + {unknown}" if cost_usd else f"unknown ({unknown})"
