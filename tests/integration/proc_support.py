"""Helpers for the tests that run durabl in real processes: spawning and reaping them, waiting
for a condition, and reading a database the way an outside observer does (plain sqlite3,
read-only, so nothing the test reads is changed by reading it)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
AGENT = HERE / "proc_agent.py"
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "DEAD_LETTERED")


def env_for(folder: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("DURABL_TEST_STOP_IN_TOOL", None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["DURABL_TEST_CALLS"] = str(folder / "calls.txt")
    env["DURABL_TEST_OUTBOX"] = str(folder / "outbox.txt")
    env.update(extra)
    return env


class Procs:
    """Every process a test starts; ``close`` kills whatever is still alive (SIGCONT first, so
    that a stopped process can die) and reaps it."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[str]] = []

    def spawn(
        self, argv: list[str], env: dict[str, str], *, stdin: bool = False
    ) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.started.append(proc)
        return proc

    def agent(self, env: dict[str, str], *args: str, stdin: bool = False) -> subprocess.Popen[str]:
        return self.spawn([sys.executable, str(AGENT), *args], env, stdin=stdin)

    def worker(
        self, env: dict[str, str], db: Path, *, concurrency: int = 1, poll_s: float = 0.5
    ) -> subprocess.Popen[str]:
        argv = [sys.executable, "-m", "durabl", "--db", str(db), "--import", "worker_agents"]
        argv += ["worker", "--concurrency", str(concurrency), "--poll", str(poll_s)]
        return self.spawn(argv, env)

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGCONT)
                    proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)


@contextlib.contextmanager
def processes() -> Iterator[Procs]:
    procs = Procs()
    try:
        yield procs
    finally:
        procs.close()


def finish(proc: subprocess.Popen[str], timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait for an agent to exit 0 and return its last line of output, parsed."""
    out, err = proc.communicate(timeout=timeout_s)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out}\n{err}"
    return dict(json.loads(out.strip().splitlines()[-1]))


def wait_until(
    what: str, check: Callable[[], Any], timeout_s: float = 20.0, every_s: float = 0.02
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def wait_ready(proc: subprocess.Popen[str]) -> None:
    """Read the agent's ``ready`` line (it prints it once it is set up and waiting)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"agent said {line!r}: {proc.stderr and proc.stderr.read()}"


def query(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def log_of(db: Path, run_id: str) -> list[tuple[int, str, int, str | None, int | None, float]]:
    """(seq, kind, step, data, fence, at_s) of every event of the run, in order."""
    return [
        (seq, kind, step, data, fence, at_s)
        for seq, kind, step, data, fence, at_s in query(
            db,
            "SELECT seq, kind, step, data, fence, at_s FROM events WHERE run_id = ? ORDER BY seq",
            (run_id,),
        )
    ]


def statuses(db: Path) -> dict[str, str]:
    return {run_id: status for run_id, status in query(db, "SELECT run_id, status FROM runs")}


def assert_gapless(db: Path, run_id: str) -> None:
    seqs = [e[0] for e in log_of(db, run_id)]
    assert seqs == list(range(1, len(seqs) + 1)), f"run {run_id} log is not gapless: {seqs}"


def lines(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()] if path.exists() else []


def count_by(rows: list[list[str]], *, kind: str, column: int = 2) -> dict[str, int]:
    """How many ``kind`` lines of the calls file each key (or prompt) has."""
    counts: dict[str, int] = {}
    for row in rows:
        if row[0] == kind:
            counts[row[column]] = counts.get(row[column], 0) + 1
    return counts


def outbox_keys(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in lines(path):
        counts[row[0]] = counts.get(row[0], 0) + 1
    return counts


def resumed_pids(db: Path, run_id: str) -> list[int]:
    return [
        json.loads(data or "{}")["pid"]
        for _, kind, _, data, _, _ in log_of(db, run_id)
        if kind == "RUN_RESUMED"
    ]


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (``T`` when stopped), None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2]


def pids_with_argument(marker: str) -> list[int]:
    """Every live (not zombie) process with ``marker`` in one of its command-line arguments."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(marker.encode() in arg for arg in argv) and process_state(int(entry)) not in (
            None,
            "Z",
        ):
            found.append(int(entry))
    return found
