"""Every command with the global options before it, after it and spread around it (SPEC §9:
"each global option works before or after the command"), as real processes.

The commands come from walking the parser, so a new one is covered without being named here;
``ARGUMENTS`` holds what a command needs besides its name to succeed. Each command runs once per
placement, each time on its own copy of one prepared database and with its own calls file, so a
command that writes finds the same state every time. Its exit code, stdout, stderr and the calls
its workflows' tools made must be the same in every placement, and the modules given by
``--import`` after the command must have been imported.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_cli import Cli, _env, subcommands
from test_cli_states import _copy
from test_migrate import postgres_databases

from durabl.cli import build_parser
from durabl.store.sqlite import SQLiteStore

STATES = {"running": "interrupted", "dead": "dead_lettered", "sleeping": "sleeping"}
ARGUMENTS = {  # what a command needs besides its name, by its words
    "show": ["running"],
    "resume": ["running"],
    "replay": ["running", "--dry"],
    "dlq redrive": ["dead"],
    "dlq resolve": ["dead", "--result", '{"sent": "by hand"}'],
    "dlq cancel": ["dead"],
    "tick": ["--now", "99999999999"],
    "worker": ["--poll", "0.1"],
    "ui": ["--port", "0"],
    "migrate": ["--to", "TARGET"],  # each placement's own new PostgreSQL database
    "signal": ["running", "approve", '{"by": "ana"}'],
    "fork": ["running", "--at", "1", "--run-id", "forked"],
    "export-traces": ["running"],
}
IMPORTING = {  # the commands that load the --import modules (the others only read)
    *("worker", "resume", "replay", "tick", "compact", "check", "signal", "fork"),
    *("dlq redrive", "dlq resolve", "dlq cancel"),
}
MODULES = ("cli_agents", "cli_imported")
IMPORTED = "imported\tcli_imported"
_LOGGED_AT = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ", re.MULTILINE)
_MIGRATED = (  # what differs between two migrations of one file: their targets and timings
    (re.compile(r"postgresql://\S+/durabl_test_[0-9a-f]+"), "TARGET"),
    (re.compile(r'"(seconds|events_per_s)": [0-9.e+-]+'), r'"\1": 0'),
)


def _placements(command: Sequence[str], db: Path) -> dict[str, list[str]]:
    """The command line of ``command`` with the global options in each place they may go."""
    words, args = list(command), ARGUMENTS.get(" ".join(command), [])
    first, later = ["--import", MODULES[0]], ["--import", MODULES[1]]
    return {
        "before": ["--db", str(db), "--json", *first, *later, *words, *args],
        "after": [*words, *args, "--db", str(db), "--json", *first, *later],
        # one at each level: before the command, after its first word, after all of it
        "spread": [*first, words[0], "--json", *words[1:], *args, "--db", str(db), *later],
    }


@dataclass(frozen=True)
class _Job:
    """One command in one placement, on its own copy of the database and its own calls file."""

    name: str
    place: str
    argv: list[str]
    db: Path
    calls: Path

    def run(self, tmp: Path) -> tuple[int, str, str, list[str]]:
        """Exit code, stdout, stderr (log times cut) and the calls made."""
        command = [sys.executable, "-m", "durabl", *self.argv]
        env = _env(tmp, DURABL_TEST_CALLS=str(self.calls))
        if self.name == "worker":
            done = _serve_until_settled(command, self.db, env)
        elif self.name == "ui":
            done = _ask_dashboard(command, env)
        else:
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=30)
        made = self.calls.read_text().splitlines() if self.calls.exists() else []
        shown = done.stdout.replace(str(self.db), "DB")
        for pattern, same in _MIGRATED:
            shown = pattern.sub(same, shown)
        return done.returncode, shown, _LOGGED_AT.sub("", done.stderr), made


def _serve_until_settled(
    command: list[str], db: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """A worker, stopped with SIGTERM once no run of ``db`` is RUNNING any more."""
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as worker:
        deadline = time.monotonic() + 30
        while _running(db) and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    return subprocess.CompletedProcess(command, worker.returncode, out, err)


def _ask_dashboard(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The dashboard, asked for its run list once, then stopped with SIGTERM: its answer (not
    its address, which differs per run) stands as its output."""
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as ui:
        assert ui.stdout is not None
        address = re.search(r"http://\S+/", ui.stdout.readline())
        answer = ""
        if address:
            with urllib.request.urlopen(address.group(0) + "api/runs", timeout=10) as got:
                answer = json.dumps(json.loads(got.read()), sort_keys=True)
        ui.send_signal(signal.SIGTERM)
        _, err = ui.communicate(timeout=30)
    return subprocess.CompletedProcess(command, ui.returncode, answer, err)


def _running(db: Path) -> bool:
    store = SQLiteStore(db, read_only=True)
    try:
        return bool(store.list_runs(statuses=("RUNNING",)))
    finally:
        store.close()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    cli = Cli(tmp_path_factory.mktemp("grammar"))
    first, *more = (f"{state}:{run_id}" for run_id, state in STATES.items())
    cli.prepare(*first.split(":"), *more)
    return cli


def test_every_command_takes_the_global_options_on_either_side(prepared: Cli) -> None:
    commands = subcommands(build_parser())
    names = {" ".join(command) for command in commands}
    assert names >= set(ARGUMENTS) | IMPORTING  # no stale names in the tables above
    jobs = []
    with postgres_databases() as database:
        for command in commands:
            for place in ("before", "after", "spread"):
                label = f"{'-'.join(command)}-{place}"
                db = _copy(prepared, f"{label}.db")
                argv = [database() if a == "TARGET" else a for a in _placements(command, db)[place]]
                calls = prepared.tmp / f"{label}.calls"
                jobs.append(_Job(" ".join(command), place, argv, db, calls))
        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            done = pool.map(lambda job: job.run(prepared.tmp), jobs)
            answers = {
                (job.name, job.place): answer for job, answer in zip(jobs, done, strict=True)
            }

    for name in names:
        code, out, err, _ = answers[name, "before"]
        assert code == 0, (name, out, err)
        assert answers[name, "after"] == answers[name, "before"], name
        assert answers[name, "spread"] == answers[name, "before"], name
    imported = {name for name in names if IMPORTED in answers[name, "after"][3]}
    assert imported == IMPORTING
    # the workflow and the tools of cli_agents, named after the command, were used
    code, out, _, made = answers["resume", "after"]
    assert json.loads(out)["status"] == "COMPLETED"
    assert "effect\t2" in made
