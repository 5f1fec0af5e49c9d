"""The runtimes the benchmark can drive, and where each one's Python lives.

Each adapter is a script in ``kit/`` run by the Python of its own virtualenv (the project's own
Python for durabl and the plain loop). ``make bench-peers`` builds the peers' virtualenvs under
``.bench-venvs/`` from the pinned files in ``bench/peers/``; a peer that could not be installed
leaves an ``UNAVAILABLE`` file there saying why, and gets a "not measured" row.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from durabl.bench.seal import BenchInputError

KIT = Path(__file__).resolve().parent / "kit"
VENVS_VARIABLE = "DURABL_BENCH_VENVS"
UNAVAILABLE = "UNAVAILABLE"


@dataclass(frozen=True)
class Adapter:
    id: str
    label: str
    mechanism: str
    """How the runtime makes a run durable, as its docs describe it (shown on the leaderboard)."""
    script: str
    venv: str | None = None
    """The virtualenv under ``.bench-venvs/``; None for the project's own Python."""
    args: tuple[str, ...] = ()
    service: bool = False
    """Whether the runtime needs a server that outlives the killed process (started once)."""

    @property
    def path(self) -> Path:
        return KIT / self.script


ADAPTERS = (
    Adapter(
        "durabl", "durabl", "append-only step log, SQLite WAL, fsync per commit", "run_durabl.py"
    ),
    Adapter("plain", "plain Python loop", "none: state in memory (the baseline)", "run_plain.py"),
    Adapter(
        "langgraph-sync",
        "LangGraph (durability=sync)",
        "SqliteSaver checkpoint after every node, before the next",
        "run_langgraph.py",
        "langgraph",
        ("--durability", "sync"),
    ),
    Adapter(
        "langgraph-async",
        "LangGraph (durability=async)",
        "SqliteSaver checkpoint after every node, saved while the next runs",
        "run_langgraph.py",
        "langgraph",
        ("--durability", "async"),
    ),
    Adapter(
        "langgraph-exit",
        "LangGraph (durability=exit)",
        "SqliteSaver checkpoint only when the graph exits",
        "run_langgraph.py",
        "langgraph",
        ("--durability", "exit"),
    ),
    Adapter(
        "dbos",
        "DBOS Transact",
        "each step's output recorded in a SQLite system database",
        "run_dbos.py",
        "dbos",
    ),
    Adapter(
        "letitloop",
        "letitloop",
        "append-only log file, fsync per step (@durable, step())",
        "run_letitloop.py",
        "letitloop",
    ),
    Adapter(
        "temporal",
        "Temporal",
        "event history in the server (dev server, SQLite file)",
        "run_temporal.py",
        "temporal",
        service=True,
    ),
    Adapter(
        "crewai",
        "CrewAI Flows (@persist)",
        "a state snapshot in SQLite after each flow method",
        "run_crewai.py",
        "crewai",
    ),
    Adapter(
        "autogen",
        "AutoGen AgentChat",
        "save_state() written to a JSON file after each step",
        "run_autogen.py",
        "autogen",
    ),
)
BY_ID = {adapter.id: adapter for adapter in ADAPTERS}
DEFAULT = ("durabl", "plain")


def parse_runtimes(text: str | None, full_matrix: bool) -> list[Adapter]:
    if full_matrix and text:
        raise BenchInputError("--full-matrix runs every runtime: give it or --runtimes, not both")
    if full_matrix:
        return list(ADAPTERS)
    names = [name.strip() for name in (text or ",".join(DEFAULT)).split(",") if name.strip()]
    unknown = [name for name in names if name not in BY_ID]
    if unknown:
        raise BenchInputError(f"unknown runtime {unknown[0]!r}; known: {', '.join(BY_ID)}")
    if not names:
        raise BenchInputError("--runtimes is empty; known: " + ", ".join(BY_ID))
    seen: dict[str, Adapter] = {}
    for name in names:
        seen.setdefault(name, BY_ID[name])
    return list(seen.values())


def venvs_root(given: Path | None) -> Path:
    if given is not None:
        return given
    env = os.environ.get(VENVS_VARIABLE)
    return Path(env) if env else Path.cwd() / ".bench-venvs"


def python_of(adapter: Adapter, root: Path) -> tuple[str | None, str | None]:
    """(the Python to run ``adapter`` with, None) or (None, why it cannot run here).

    A virtualenv that is missing altogether is a user error (build it first); one whose
    install failed is a finding, reported as "not measured"."""
    if adapter.venv is None:
        return sys.executable, None
    venv = root / adapter.venv
    marker = venv / UNAVAILABLE
    if marker.exists():
        return None, marker.read_text().strip() or f"{venv} could not be built"
    python = venv / "bin" / "python"
    if not python.exists():
        raise BenchInputError(
            f"runtime {adapter.id!r} needs the virtualenv {venv}, which is missing: "
            f"run `make bench-peers` (or pass --venvs DIR)"
        )
    return str(python), None
