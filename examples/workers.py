"""Several worker processes sharing one database, one of them killed mid-run.

The script starts 12 runs of a small batch job (a short durable timer, then four tool steps
that each take ~50 ms and append a line to an effects file), then starts three ``durabl
worker`` processes on the same database. The workers fire the timers as they come due and
drive the runs; each run's lease keeps it to one worker at a time. Once one worker has done
two steps, the script kills it with SIGKILL: the run it was in the middle of is taken over by
another worker at once (the dead worker's pid is gone, so nobody waits for its lease to
expire), and the steps the killed worker had finished are not done again. When every run has
COMPLETED the script stops the other workers with SIGTERM (they exit 0) and prints which worker
did each run's steps.

    python examples/workers.py              # files in a fresh temporary folder
    python examples/workers.py --dir DIR    # database, effects file and worker logs in DIR

The workers are started as ``python -m durabl worker --db DIR/jobs.db --import examples.workers``
from the repository root: importing this module registers the workflow and defines
``DURABL_TOOLS``, and the tools find the effects file through the ``WORKERS_EXAMPLE_DIR``
environment variable. ``process`` is IDEMPOTENT and dedupes on the idempotency key durabl
hands it, so a step the kill interrupted after its effect is called again but lands once.

Exit status 0 when all runs completed, one worker was killed and its unfinished run was taken
over, and the effects file holds each (run, step) exactly once; 1 otherwise.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from durabl import Runtime, Sleep, ToolCall, ToolMode, events, tool, workflow

REPO = Path(__file__).resolve().parents[1]
RUNS = 12
STEPS = 4
WORKERS = 3
STEP_S = 0.05
QUEUE_DELAY_S = 1.0
"""Each run opens with this durable timer, so ``start`` records the run and returns at once
instead of doing the work itself; the workers pick the runs up when the timers are due."""

KILL_AFTER_STEPS = 2
"""The victim is the first worker to finish this many steps: it is then inside its first run."""

DIR_ENV = "WORKERS_EXAMPLE_DIR"


# -- the workflow and its tool (imported by every worker) ------------------------------------


@workflow(name="batch_job")
def batch_job(ctx: Any, steps: int) -> Any:
    yield Sleep(seconds=QUEUE_DELAY_S)
    done = []
    for item in range(1, steps + 1):
        done.append((yield ToolCall("process", {"run_id": ctx.run_id, "item": item})))
    return {"items": len(done), "pids": [d["pid"] for d in done]}


def _folder() -> Path:
    return Path(os.environ[DIR_ENV])


def _append_locked(path: Path, line: str, *, unless_key: str | None = None) -> bool:
    """Append ``line`` under an exclusive lock (several workers write the same file); with
    ``unless_key``, only if no line starts with that key. True if it was written."""
    with path.open("a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            if unless_key is not None:
                handle.seek(0)
                if any(seen.split("\t")[0] == unless_key for seen in handle.read().splitlines()):
                    return False
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            return True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def process(run_id: str, item: int, *, idempotency_key: str) -> dict[str, Any]:
    """One unit of work. Every invocation is logged to calls.tsv; the effect (a line in
    effects.tsv) is written once per idempotency key, like an API that honours client keys."""
    pid = os.getpid()
    _append_locked(_folder() / "calls.tsv", f"{idempotency_key}\t{pid}")
    time.sleep(STEP_S)
    line = f"{idempotency_key}\t{run_id}\t{item}\t{pid}"
    _append_locked(_folder() / "effects.tsv", line, unless_key=idempotency_key)
    return {"item": item, "pid": pid}


DURABL_TOOLS = {"process": tool(process, mode=ToolMode.IDEMPOTENT)}


# -- the orchestration -----------------------------------------------------------------------


def read_tsv(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines() if line]


def start_worker(db: Path, folder: Path, n: int) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "durabl", "worker", "--db", str(db)]
    argv += ["--import", "examples.workers", "--poll", "0.2"]
    env = {**os.environ, DIR_ENV: str(folder)}
    out = (folder / f"worker-{n}.out").open("wb")
    err = (folder / f"worker-{n}.err").open("wb")
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=err)


def wait_for(what: str, done: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.01)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-workers-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "jobs.db"
    for stale in [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *folder.glob("*.tsv")]:
        stale.unlink(missing_ok=True)
    os.environ[DIR_ENV] = str(folder)
    print(f"files in {folder}")

    with Runtime(db, tools=DURABL_TOOLS) as rt:
        run_ids = [f"job-{n:02d}" for n in range(1, RUNS + 1)]
        for run_id in run_ids:
            rt.start(batch_job, {"steps": STEPS}, run_id=run_id)
        parked = sum(rt.state(run_id).status == events.SLEEPING for run_id in run_ids)
        print(
            f"started {RUNS} runs of {STEPS} steps; {parked} are SLEEPING on their "
            f"{QUEUE_DELAY_S:g} s queue timer"
        )

        workers = [start_worker(db, folder, n) for n in range(1, WORKERS + 1)]
        label = {str(w.pid): f"w{n}" for n, w in enumerate(workers, 1)}
        print("workers: " + ", ".join(f"{label[str(w.pid)]}=pid {w.pid}" for w in workers))

        def victim() -> subprocess.Popen[bytes] | None:
            counts = Counter(row[3] for row in read_tsv(folder / "effects.tsv"))
            busy = [w for w in workers if counts[str(w.pid)] >= KILL_AFTER_STEPS]
            return busy[0] if busy else None

        wait_for("a worker to do its first steps", lambda: victim() is not None)
        killed = victim()
        assert killed is not None
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        done_at_kill = len(read_tsv(folder / "effects.tsv"))
        print(
            f"killed {label[str(killed.pid)]} (pid {killed.pid}) with SIGKILL "
            f"after {done_at_kill} of {RUNS * STEPS} steps"
        )

        def all_completed() -> bool:
            return all(rt.state(run_id).status == events.COMPLETED for run_id in run_ids)

        wait_for("every run to complete", all_completed)
        print("every run COMPLETED; stopping the other workers with SIGTERM")
        survivors = [w for w in workers if w is not killed]
        for w in survivors:
            w.send_signal(signal.SIGTERM)
        for w in survivors:
            w.wait(timeout=30)
            said = (folder / f"worker-{label[str(w.pid)][1:]}.out").read_text().strip()
            print(f"  {label[str(w.pid)]} exited {w.returncode}: {said}")

    effects = read_tsv(folder / "effects.tsv")
    calls = read_tsv(folder / "calls.tsv")
    by_run: dict[str, dict[int, str]] = {run_id: {} for run_id in run_ids}
    for _key, run_id, item, pid in effects:
        by_run[run_id][int(item)] = pid
    killed_pid = str(killed.pid)
    print(f"\nwho did each step ({label[killed_pid]} was killed):")
    taken_over = []
    for run_id in run_ids:
        pids = [by_run[run_id].get(item, "?") for item in range(1, STEPS + 1)]
        note = ""
        if killed_pid in pids and len(set(pids)) > 1:
            taken_over.append(run_id)
            note = "  <- taken over after the kill"
        print(f"  {run_id}  " + " ".join(label.get(pid, pid) for pid in pids) + note)

    per_step = Counter((run_id, item) for _key, run_id, item, _pid in effects)
    once = len(effects) == RUNS * STEPS and set(per_step.values()) == {1}
    repeats = len(calls) - len({key for key, _pid in calls})
    print(
        f"\neffects: {len(effects)} for {RUNS * STEPS} steps, "
        f"{'each exactly once' if once else 'NOT each exactly once'}"
    )
    print(
        f"tool invocations: {len(calls)} ({repeats} called again after the kill: IDEMPOTENT "
        "is at-least-once invocation, and the effect dedupes on the idempotency key)"
    )
    ok = (
        once
        and killed.returncode == -signal.SIGKILL
        and len(taken_over) >= 1
        and all(w.returncode == 0 for w in survivors)
    )
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
