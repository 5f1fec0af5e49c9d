"""One trial: run an adapter until its run ends, killing the first process at one instant.

The first process is told where to die (``WINDOW:N``); when it announces the arrival the parent
sends SIGKILL at once. Then the runtime is restarted in new processes, with no kill, until one
exits with a verdict (0), says the run is held for an operator (3) or failed (4), or the trial
gives up: a process that runs past its time limit is stalled, and so is a run that keeps
crashing. Between processes the parent looks for orphans (live processes that still carry the
trial's tag), and after a WRITE kill it asks the adapter whether its store is whole.

What a trial saw goes into its receipt as observations; judging them is the leaderboard's job.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durabl.bench.adapters import Adapter
from durabl.bench.kit import agent

PROCESS_LIMIT_S = 120.0
MAX_PROCESSES = 6
ORPHAN_GRACE_S = 0.25
"""How long after the kill a child may take to die with its parent before it is an orphan."""


@dataclass
class Launch:
    adapter: Adapter
    python: str
    service: str | None = None


def _tagged(tag: str) -> list[int]:
    """Live (not zombie) processes whose environment carries the trial's tag."""
    needle = f"{agent.TAG_VARIABLE}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            found.append(int(entry.name))
    return found


def _describe(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip())[
            :120
        ]
    except OSError:
        return "?"


def orphans_after_kill(tag: str) -> list[dict[str, Any]]:
    """Wait up to ORPHAN_GRACE_S for the killed process's children to die; SIGKILL and report
    the ones that did not (so the next process starts in a clean world)."""
    deadline = time.monotonic() + ORPHAN_GRACE_S
    alive = _tagged(tag)
    while alive and time.monotonic() < deadline:
        time.sleep(0.01)
        alive = _tagged(tag)
    found = [{"pid": pid, "cmd": _describe(pid)} for pid in alive]
    for pid in alive:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return found


def run_process(
    launch: Launch, root: Path, tag: str, kill: str | None, number: int
) -> dict[str, Any]:
    """One process of a trial, from spawn to exit; the record of what it announced."""
    read_fd, write_fd = os.pipe()
    env = {
        **os.environ,
        "DURABL_BENCH_TRIAL": str(root),
        "DURABL_BENCH_FD": str(write_fd),
        agent.TAG_VARIABLE: tag,
        "PYTHONDONTWRITEBYTECODE": "1",
        "TMPDIR": str(root / "tmp"),  # what a runtime leaves in the temp folder goes with the trial
    }
    env.pop("DURABL_BENCH_KILL", None)
    if kill:
        env["DURABL_BENCH_KILL"] = kill
    if launch.service:
        env["DURABL_BENCH_SERVICE"] = launch.service
    (root / "tmp").mkdir(exist_ok=True)
    stderr_path = root / f"process-{number}.stderr"
    spawned = time.monotonic()
    with open(stderr_path, "wb") as stderr:
        proc = subprocess.Popen(
            [launch.python, str(launch.adapter.path), *launch.adapter.args],
            env=env,
            pass_fds=(write_fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
    os.close(write_fd)
    try:
        events, killed, stalled = _listen(proc, read_fd, spawned)
    finally:
        os.close(read_fd)
    code = proc.wait()
    record: dict[str, Any] = {
        "number": number,
        "kill_target": kill,
        "exit": code,
        "killed": killed,
        "stalled": stalled,
        "events": events,
    }
    if not killed and code not in (0, agent.HELD):
        record["stderr_tail"] = stderr_path.read_bytes()[-600:].decode(errors="replace")
    return record


def _listen(
    proc: subprocess.Popen[bytes], read_fd: int, spawned: float
) -> tuple[list[dict[str, Any]], bool, bool]:
    """Read the child's announcements until it exits; SIGKILL it the moment it announces the
    kill, or when it outlives PROCESS_LIMIT_S. Returns (events, killed, stalled), each event's
    time made relative to the spawn."""
    events: list[dict[str, Any]] = []
    buffer = b""
    deadline = spawned + PROCESS_LIMIT_S
    with selectors.DefaultSelector() as selector:
        selector.register(read_fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                proc.kill()
                return events, False, True
            if not selector.select(timeout=remaining):
                continue
            chunk = os.read(read_fd, 65536)
            if not chunk:
                return events, False, False
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                event["t"] = round(event["t"] - spawned, 6)
                events.append(event)
                if event["event"] == "kill":
                    proc.send_signal(signal.SIGKILL)
                    return events, True, False


def check_store(launch: Launch, root: Path) -> dict[str, Any]:
    """Ask the adapter whether its store is whole (``--check``), in a fresh process."""
    env = {**os.environ, "DURABL_BENCH_TRIAL": str(root)}
    if launch.service:
        env["DURABL_BENCH_SERVICE"] = launch.service
    try:
        done = subprocess.run(
            [launch.python, str(launch.adapter.path), *launch.adapter.args, "--check"],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROCESS_LIMIT_S,
        )
        report = json.loads(done.stdout.strip().splitlines()[-1])
        return {"whole": bool(report["whole"]), "detail": str(report["detail"])[:300]}
    except (subprocess.TimeoutExpired, ValueError, IndexError, KeyError) as exc:
        return {"whole": False, "detail": f"check did not answer: {exc}"[:300]}


def observe(root: Path) -> dict[str, Any]:
    """The world after the trial: every effect file, the verdict and the verdict lock."""
    effects = root / "effects"
    verdict_path = effects / "verdict.json"
    verdict: dict[str, Any] | None = None
    if verdict_path.exists():
        try:
            verdict = json.loads(verdict_path.read_text())
        except ValueError:
            verdict = {"unreadable": True}
    expected = agent.expected_outputs()
    files_ok = {}
    for name in ("search_habitat", "search_diet"):
        path = effects / f"{name}.json"
        files_ok[name] = path.exists() and json.loads(path.read_text()) == expected[name]
    shell_out = effects / "shell.out"
    files_ok["shell"] = (
        shell_out.exists() and shell_out.read_text().strip() == expected["shell"]["digest"]
    )
    return {
        "ledger_lines": len(agent.read_lines(effects / "ledger.log")),
        "outbox_lines": len(agent.read_lines(effects / "outbox.log")),
        "tokens": [
            [line["step"], line["tokens"]] for line in agent.read_lines(effects / "tokens.log")
        ],
        "files_ok": files_ok,
        "verdict": verdict,
        "lock_left": (effects / "verify.lock").exists(),
    }


def run_trial(launch: Launch, root: Path, kill: str | None) -> dict[str, Any]:
    """Run one trial in ``root`` (created fresh, removed by the caller)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    tag = uuid.uuid4().hex
    processes: list[dict[str, Any]] = []
    orphans: list[dict[str, Any]] = []
    store: dict[str, Any] | None = None
    lock_after_kill: bool | None = None
    for number in range(MAX_PROCESSES):
        record = run_process(launch, root, tag, kill if number == 0 else None, number)
        processes.append(record)
        if record["killed"] or record["stalled"]:
            orphans += orphans_after_kill(tag)
        if record["killed"]:
            window = kill.split(":")[0] if kill else ""
            if window == "WRITE":
                store = check_store(launch, root)
            if window == "VERIFY":
                lock_after_kill = (root / "effects" / "verify.lock").exists()
        if record["stalled"] or (
            not record["killed"] and record["exit"] in (0, agent.HELD, agent.FAILED)
        ):
            break
        if kill is None and not record["killed"]:
            # a clean run that crashed is not restarted: the adapter does not work here
            break
    orphans += orphans_after_kill(tag)
    return {
        "processes": processes,
        "orphans": orphans,
        "store_check": store,
        "lock_after_kill": lock_after_kill,
        "observed": observe(root),
    }
