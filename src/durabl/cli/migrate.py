"""``durabl migrate``: copy a SQLite database to an empty PostgreSQL database, whole, with every
checksum verified on the way and every row read back before the copy commits
(``durabl.store.transfer``, which imports psycopg only when a copy is made).

The SQLite file is only read, so the command is handed no runtime: like the read-only commands,
it opens what it needs itself.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from contextlib import contextmanager

from durabl.cli.options import EXIT_OK, Commands, UsageError
from durabl.cli.render import Grid, console, emit
from durabl.store import is_postgres_url, transfer
from durabl.text import counted


def add_migrate(commands: Commands) -> None:
    p = commands.add_command(
        "migrate",
        _migrate,
        help="copy a SQLite database to an empty PostgreSQL database, verified on arrival",
        description="Copy every run of a durabl SQLite file to an empty PostgreSQL database: "
        "its whole log, its compaction snapshot, its side effects, key claims and signals, in "
        "one transaction. Every event's and snapshot's checksum is verified before anything is "
        "written, and every row is read back from the server and compared before the copy "
        "commits. A target that already holds durabl data is refused, and the file is only "
        "read. Leases are not copied (their tokens are): stop the processes using the file "
        "first.",
        read_only=True,
    )
    p.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        help="the SQLite file to copy (default: --db)",
    )
    p.add_argument(
        "--to",
        dest="target",
        metavar="URL",
        required=True,
        help="the PostgreSQL database: postgresql://[USER[:PASSWORD]@]HOST[:PORT]/DATABASE",
    )


def _migrate(args: argparse.Namespace) -> int:
    source = args.source
    if source is None:  # the global --db, when it names a file
        if is_postgres_url(args.db):
            raise UsageError("--db names PostgreSQL: name the SQLite file to copy with --from PATH")
        if not os.path.lexists(args.db):
            raise UsageError(
                f"{args.db} does not exist: name the SQLite file to copy with --from PATH"
            )
        source = args.db
    with _progress(args) as progress:
        report = transfer.copy_database(source, args.target, progress=progress)
    copied = [
        ["runs", str(report.runs)],
        ["events", str(report.events)],
        ["side effects", str(report.side_effects)],
        ["key claims", str(report.claims)],
        ["snapshots", str(report.snapshots)],
        ["signals", str(report.signals)],
    ]
    parts: list[str | Grid] = [
        f"migrated {report.source} to {report.target}, every row verified on arrival",
        Grid(["COPIED", "ROWS"], copied),
        f"{report.seconds:.2f} s ({report.events_per_s:.0f} events/s)",
    ]
    if report.leases_cleared:
        parts.append(
            f"{counted(report.leases_cleared, 'run')} had a lease on {report.source}: copied "
            f"without it; what a process still using the file writes now is not in the copy"
        )
    emit(args, report.as_dict(), *parts)
    return EXIT_OK


@contextmanager
def _progress(args: argparse.Namespace) -> Iterator[transfer.Progress | None]:
    """A progress bar per pass over the events, on a terminal only."""
    terminal = None if args.json else console()
    if terminal is None:
        yield None
        return
    from rich.progress import Progress, TaskID

    with Progress(console=terminal, transient=True) as bar:
        tasks: dict[str, TaskID] = {}

        def advance(step: str, done: int, total: int) -> None:
            if step not in tasks:
                tasks[step] = bar.add_task(step, total=total)
            bar.update(tasks[step], completed=done, total=total)

        yield advance
