"""The ``durabl`` command line (SPEC §9, §16) as real processes against real databases.

Each database is put in its state by ``cli_agents.py`` in a process of its own, and every
command runs as ``python -m durabl`` with ``tests/integration`` on PYTHONPATH so that
``--import cli_agents`` finds the workflows. ``test_cli_states.py`` shares ``Cli`` and
``one_line_error``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from durabl.cli import build_parser
from durabl.store.sqlite import SQLiteStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
AGENTS = HERE / "cli_agents.py"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "src")])
    env["DURABL_TEST_CALLS"] = str(tmp_path / "calls.txt")
    env.pop("DURABL_TEST_VERSION", None)
    env.update(extra)
    return env


class Cli:
    """Runs ``durabl --db DB ...`` and the state-preparing helper against one database."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "cli.db"

    def prepare(self, state: str, run_id: str, *more: str) -> None:
        """Put run ``run_id`` in ``state``; ``more`` holds further "STATE:RUN_ID" pairs."""
        done = subprocess.run(
            [sys.executable, str(AGENTS), str(self.db), f"{state}:{run_id}", *more],
            env=_env(self.tmp),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr

    def __call__(
        self, *args: str, db: Path | None = None, **env: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durabl", "--db", str(db or self.db), *args],
            env=_env(self.tmp, **env),
            capture_output=True,
            text=True,
            timeout=30,
        )

    def many(self, commands: Sequence[Sequence[str]]) -> list[subprocess.CompletedProcess[str]]:
        """Run independent commands side by side, one process per core."""
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            return list(pool.map(lambda args: self(*args), commands))

    def json(self, *args: str) -> Any:
        done = self("--json", *args)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def kinds(self, run_id: str) -> list[str]:
        store = SQLiteStore(self.db, read_only=True)
        try:
            return [e.kind for e in store.load_log(run_id)]
        finally:
            store.close()

    def calls(self) -> list[str]:
        path = self.tmp / "calls.txt"
        return path.read_text().splitlines() if path.exists() else []

    def dead_letter(self, run_id: str) -> None:
        """A crash inside an AT_MOST_ONCE tool's window, then a resume that dead-letters it."""
        self.prepare("dead", run_id)
        done = self("--import", "cli_agents", "resume", run_id)
        assert done.returncode == 0, done.stderr
        assert "DEAD_LETTERED" in done.stdout


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("durabl: ")
    for needle in needles:
        assert needle in done.stderr


def test_runs_lists_every_state_newest_first_and_filters(cli: Cli) -> None:
    for state in ("completed", "failed", "sleeping", "interrupted"):
        cli.prepare(state, f"r-{state}")
    cli.dead_letter("r-dead")
    cli.prepare("drifted", "r-drifted")
    held = cli("--import", "cli_agents", "resume", "r-drifted", DURABL_TEST_VERSION="2")
    one_line_error(held, "r-drifted", "recorded as")

    table = cli("runs")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["RUN", "WORKFLOW", "STATUS", "UPDATED", "(UTC)", "ERROR"]
    status = {line.split()[0]: line.split()[2] for line in lines[1:]}
    assert status == {
        "r-completed": "COMPLETED",
        "r-failed": "FAILED",
        "r-sleeping": "SLEEPING",
        "r-interrupted": "RUNNING",
        "r-dead": "DEAD_LETTERED",
        "r-drifted": "HELD",
    }
    assert "RuntimeError" in table.stdout and "NonDeterminismError" in table.stdout

    rows = cli.json("runs")
    assert rows[0]["run_id"] == "r-drifted"  # the newest first
    assert [r["updated_s"] for r in rows] == sorted((r["updated_s"] for r in rows), reverse=True)
    assert [r["run_id"] for r in cli.json("runs", "--status", "HELD")] == ["r-drifted"]
    assert {r["run_id"] for r in cli.json("runs", "--workflow", "cli_chain")} == {
        "r-completed",
        "r-interrupted",
    }
    assert len(cli.json("runs", "--limit", "2")) == 2
    # a limit that cuts the list says so, on stderr, so that the JSON stays whole
    cut = cli("runs", "--limit", "2")
    assert cut.returncode == 0 and cut.stdout.count("\n") >= 2
    assert cut.stderr.strip() == "the newest 2 runs are shown; there are more: --limit N or --all"
    assert cli("runs", "--limit", "6").stderr == ""
    assert len(cli.json("runs", "--all")) == 6
    one_line_error(cli("runs", "--all", "--limit", "3"), "--limit")
    # the global options are accepted after the command too
    assert json.loads(cli("runs", "--json").stdout) == rows
    late = subprocess.run(
        [sys.executable, "-m", "durabl", "runs", "--db", str(cli.db), "--json"],
        env=_env(cli.tmp),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert json.loads(late.stdout) == rows


def test_show_prints_the_timeline_and_exit_1_for_a_failed_run(cli: Cli) -> None:
    cli.prepare("completed", "ok")
    cli.prepare("failed", "bad")
    shown = cli("show", "ok")
    assert shown.returncode == 0, shown.stderr
    for kind in ("RUN_STARTED", "STEP_STARTED", "STEP_COMPLETED", "RUN_COMPLETED"):
        assert kind in shown.stdout
    assert "plan for ok" in shown.stdout and "COMPLETED" in shown.stdout.splitlines()[0]
    payload = cli.json("show", "ok")
    assert [e["seq"] for e in payload["events"]] == list(range(1, len(payload["events"]) + 1))
    assert payload["events"][-1]["kind"] == "RUN_COMPLETED"

    failed = cli("show", "bad")
    assert failed.returncode == 1
    assert "RUN_FAILED" in failed.stdout and "the far end said no" in failed.stdout


def test_show_trace_marks_replayed_and_executed_after_a_resume_elsewhere(cli: Cli) -> None:
    cli.prepare("interrupted", "r")  # the first process died after committing step 2
    before = cli.json("show", "r", "--trace")
    assert [s["how"] for s in before["steps"]] == ["executed", "executed"]
    assert before["processes"] == 1

    resumed = cli("--import", "cli_agents", "resume", "r")
    assert resumed.returncode == 0, resumed.stderr
    assert "COMPLETED" in resumed.stdout and "replayed 2, executed 2" in resumed.stdout

    trace = cli("show", "r", "--trace")  # read-only, no --import
    assert trace.returncode == 0, trace.stderr
    rows = [line.split(None, 2) for line in trace.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [
        ("1", "replayed"),
        ("2", "replayed"),
        ("3", "executed"),
        ("4", "executed"),
    ]
    assert "plan for r" in rows[0][2] and '"n":2' in rows[3][2]
    payload = cli.json("show", "r", "--trace")
    assert payload["processes"] == 2
    assert [s["how"] for s in payload["steps"]] == ["replayed", "replayed", "executed", "executed"]


def test_resume_prints_state_and_exit_codes(cli: Cli) -> None:
    cli.prepare("interrupted", "r")
    cli.prepare("interrupted", "r2")
    cli.prepare("failed", "bad")
    state = cli.json("--import", "cli_agents", "resume", "r")
    assert state["status"] == "COMPLETED" and state["result"]["done"] == 3
    failed = cli("--import", "cli_agents", "resume", "bad")
    assert failed.returncode == 1 and "FAILED" in failed.stdout
    one_line_error(cli("--import", "cli_agents", "resume", "nope"), "nope")
    one_line_error(cli("resume", "r2"), "cli_chain")  # no --import: the workflow is unknown
    one_line_error(cli("--import", "no_such_module", "resume", "r2"), "no_such_module")


def test_dlq_lists_and_redrive_resolve_cancel_are_logged(cli: Cli) -> None:
    for run_id in ("d1", "d2", "d3"):
        cli.dead_letter(run_id)
    listing = cli("dlq")
    assert listing.returncode == 0, listing.stderr
    assert all(r in listing.stdout for r in ("d1", "d2", "d3")) and "notify" in listing.stdout
    letters = cli.json("dlq")
    assert [d["run_id"] for d in letters] == ["d1", "d2", "d3"]
    assert all(d["step"] == 1 and "AT_MOST_ONCE" in d["reason"] for d in letters)
    assert "notify\td1" not in cli.calls()  # the crash came before the tool ran

    redriven = cli("--import", "cli_agents", "dlq", "redrive", "d1")
    assert redriven.returncode == 0, redriven.stderr
    assert "COMPLETED" in redriven.stdout
    assert "DLQ_REDRIVEN" in cli.kinds("d1")
    assert cli.calls().count("notify\td1") == 1  # called again, at the operator's word

    resolved = cli.json(
        "--import", "cli_agents", "dlq", "resolve", "d2", "--result", '{"sent": "by hand"}'
    )
    assert resolved["status"] == "COMPLETED" and resolved["result"] == {"sent": "by hand"}
    kinds = cli.kinds("d2")
    assert kinds[kinds.index("DLQ_RESOLVED") + 1] == "STEP_COMPLETED"
    assert "notify\td2" not in cli.calls()  # resolved by hand: never called

    cancelled = cli("--import", "cli_agents", "dlq", "cancel", "d3", "--reason", "customer left")
    assert cancelled.returncode == 0, cancelled.stderr
    assert "CANCELLED" in cancelled.stdout and "customer left" in cancelled.stdout
    assert cli.kinds("d3")[-1] == "RUN_CANCELLED"
    assert "customer left" in cli("show", "d3").stdout

    assert cli.json("dlq") == []
    assert cli("dlq").stdout.strip() == "no dead letters"
    one_line_error(
        cli("--import", "cli_agents", "dlq", "resolve", "d3", "--result", "{bad"), "--result"
    )
    one_line_error(cli("--import", "cli_agents", "dlq", "redrive", "d3"), "d3")


def test_replay_dry_writes_nothing_even_mid_step(cli: Cli) -> None:
    cli.prepare("dead", "mid")  # the log ends at TOOL_DISPATCHED of an AT_MOST_ONCE tool
    wal = Path(f"{cli.db}-wal")
    before = (cli.db.read_bytes(), wal.read_bytes() if wal.exists() else None)
    calls = cli.calls()

    dry = cli("--import", "cli_agents", "replay", "mid", "--dry")
    assert dry.returncode == 0, dry.stderr
    assert "replayed 0" in dry.stdout and "next step: ToolCall('notify'" in dry.stdout
    cli.prepare("interrupted", "two")
    before = (cli.db.read_bytes(), wal.read_bytes() if wal.exists() else None)
    state = cli.json("--import", "cli_agents", "replay", "two", "--dry")
    assert state["steps_replayed"] == 2 and state["steps_executed"] == 0
    assert "effect" in state["next_step"] and state["status"] == "RUNNING"

    assert (cli.db.read_bytes(), wal.read_bytes() if wal.exists() else None) == before
    assert cli.calls() == [*calls, "model\tplan for two", "effect\t0"]  # only the preparation
    one_line_error(cli("--import", "cli_agents", "replay", "two"), "--dry")


def test_tick_fires_due_timers(cli: Cli) -> None:
    cli.prepare("sleeping", "s")
    early = cli("--import", "cli_agents", "tick", "--now", "0")
    assert early.returncode == 0 and "no timers due" in early.stdout
    assert cli.json("runs")[0]["status"] == "SLEEPING"
    fired = cli.json("--import", "cli_agents", "tick", "--now", "99999999999")
    assert [(s["run_id"], s["status"]) for s in fired] == [("s", "COMPLETED")]
    assert "TIMER_FIRED" in cli.kinds("s")


def test_missing_database_and_missing_run_are_one_line(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    for args in (["runs"], ["show", "r"], ["show", "r", "--trace"], ["dlq"]):
        one_line_error(cli(*args, db=missing), str(missing), "does not exist")
    for args in (["resume", "r"], ["tick"], ["dlq", "cancel", "r"]):
        one_line_error(cli("--import", "cli_agents", *args, db=missing), "does not exist")
    one_line_error(
        cli("--import", "cli_agents", "replay", "r", "--dry", db=missing), "does not exist"
    )
    assert not missing.exists() and not Path(f"{missing}-wal").exists()

    cli.prepare("completed", "ok")
    one_line_error(cli("show", "nope"), "nope")
    one_line_error(cli("show", "nope", "--trace"), "nope")
    one_line_error(cli("runs", "--limit", "0"), "--limit")
    one_line_error(cli("runs", "--status", "DONE"), "DONE", "COMPLETED")
    one_line_error(cli("frobnicate"), "frobnicate")
    (tmp_path / "broken_agents.py").write_text("raise RuntimeError('half deployed')\n")
    path = os.pathsep.join([str(tmp_path), str(HERE), str(ROOT / "src")])
    broken = cli("--import", "broken_agents", "resume", "ok", PYTHONPATH=path)
    one_line_error(broken, "broken_agents", "half deployed")
    not_db = tmp_path / "notes.txt"
    not_db.write_text("hello\n" * 50)
    one_line_error(cli("runs", db=not_db), "not a durabl database")


def subcommands(parser: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command of ``parser`` as the words that name it, nested ones too, parents first."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.append((*prefix, name))
                found.extend(subcommands(sub, (*prefix, name)))
    return found


def test_every_subcommand_has_help_and_is_in_the_readme(cli: Cli) -> None:
    commands = subcommands(build_parser())
    assert {c[0] for c in commands} >= {
        *("worker", "runs", "show", "resume", "dlq", "replay", "tick"),
        *("metrics", "compact", "doctor"),
    }
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Command line") :]
    section = section[: section.index("\n## ", 1)]
    helps = cli.many([(*command, "--help") for command in [(), *commands]])
    for command, done in zip([(), *commands], helps, strict=True):
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout.startswith("usage: durabl"), command
        if command:
            assert re.search(rf"durabl [^\n`]*{' '.join(command)}\b", section), command
