"""Workers: how fast 1, 2 and 4 worker processes drain one database, and how soon a run whose
worker was SIGKILLed is taken over.

Every worker is a real process: ``python -m durabl --db F --import bench.worker_app worker`` for
``durability="full"`` (the command line's default), and for ``durability="process"``, which the
command line has no flag for, a ``python -c`` process that builds ``Runtime(F,
durability="process")`` and hands it to the command line's own worker handler (same signals,
same ``Runtime.serve``). Each worker drives one run at a time (``--concurrency 1``).

1. throughput: 200 W40 runs (bench/workload.py: 1 ModelCall + 40 ToolCalls) are created first
   by a setup process that dies right after each RUN_STARTED (``CrashAt("after_run_started")``),
   which leaves them RUNNING with their lease owner gone. Then 1, 2 or 4 workers are started
   together and the database is polled read-only until all 200 runs are COMPLETED; the workers
   get SIGTERM. Rates come from the log: 200 runs (8,200 steps) over the span from the first
   RUN_RESUMED any worker wrote to the last RUN_COMPLETED; ``end_to_end`` rates count from the
   moment the workers were spawned (interpreter start-up included). Each configuration is
   repeated on a fresh database, in rounds of one repetition each in a rotating order; no new
   round starts once a time budget is spent (a virtual disk that throttles sustained fsyncs can
   make full durability ten times slower, so the disk is probed before and after). Checked
   every time: every tool effect is in the outbox exactly once, every log is gapless (seq
   1..N), every run has exactly one RUN_RESUMED and the expected result, and the workers' own
   counts add up to 200.
2. takeover: a worker drives a slow W40 run (each tool call sleeps ``step_sleep_s`` first; the
   tool is keyed and IDEMPOTENT, see bench/worker_app.py) and is SIGKILLed mid-run, at a delay
   after it picked the run up that is spread evenly over one poll interval, so the kill falls
   at a uniformly random point of the waiting worker's polling cycle. The latency is the time from the kill to the
   first event another worker writes for that run (its RUN_RESUMED, whose data names the new
   pid and owner, committed together with its first step event). Cases: the second worker is
   already running and idle ("running"), with the command line's default poll of 1 s and with a
   shorter one; the same in process mode; and a second worker started right after the kill
   ("started_after_kill"). The killed worker is reaped at once, as a supervisor would.

On one host a dead owner's lease is taken at once (its pid is gone), so the lease's 15 s expiry
does not bound the takeover: a waiting worker notices the dead owner at its next look for runs,
every ``--poll`` seconds. Each sample records how much of the lease was still left at the kill.

Databases live in a temporary directory on a real disk (never tmpfs: fsync must be real).

    python -m bench.workers --out bench/results/workers.json    # the full benchmark (make bench)
    python -m bench.workers --quick --out /tmp/workers.json     # seconds; exercises every path
"""

from __future__ import annotations

import inspect
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import BenchError, Monitor, Report, percentile, rotations, say, summary, wait_for
from bench.workload import EXPECTED, OUTBOX_ENV, SLEEP_ENV, STEPS, TOOL_CALLS, TOPIC
from durabl import Runtime
from durabl.events import Event
from durabl.store import RunRow, SQLiteStore

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
APP = "bench.worker_app"
CONCURRENCY = 1
"""Runs each worker process drives at once."""
DEFAULT_POLL_S = 1.0
"""The command line's default ``--poll``."""
LEASE_S: float = inspect.signature(Runtime).parameters["lease_s"].default
"""The lease a worker holds on a run: workers build their runtime with the default ``lease_s``."""


@dataclass(frozen=True)
class TakeoverCase:
    label: str
    durability: str
    poll_s: float
    standby: str  # "running" (already running and idle) or "started_after_kill"
    reps: int


@dataclass(frozen=True)
class Plan:
    runs: int
    worker_counts: tuple[int, ...]
    durabilities: tuple[str, ...]
    throughput_reps: int
    throughput_budget_s: float  # no new round of throughput repetitions starts after this
    step_sleep_s: float
    kill_after_s: float  # the kill comes this long after the pickup, plus up to one poll
    takeover: tuple[TakeoverCase, ...]
    fsync_samples: int
    timeout_s: float


FULL = Plan(
    runs=200,
    worker_counts=(1, 2, 4),
    durabilities=("full", "process"),
    throughput_reps=3,
    throughput_budget_s=150.0,
    step_sleep_s=0.04,
    kill_after_s=0.1,
    takeover=(
        TakeoverCase("full, idle worker, poll 1 s", "full", DEFAULT_POLL_S, "running", 12),
        TakeoverCase("full, idle worker, poll 0.25 s", "full", 0.25, "running", 12),
        TakeoverCase("process, idle worker, poll 1 s", "process", DEFAULT_POLL_S, "running", 8),
        TakeoverCase(
            "full, worker started after kill", "full", DEFAULT_POLL_S, "started_after_kill", 6
        ),
    ),
    fsync_samples=200,
    timeout_s=300.0,
)
QUICK = Plan(
    runs=16,
    worker_counts=(1, 2, 4),
    durabilities=("full", "process"),
    throughput_reps=1,
    throughput_budget_s=0.0,
    step_sleep_s=0.01,
    kill_after_s=0.05,
    takeover=(
        TakeoverCase("full, idle worker, poll 0.2 s", "full", 0.2, "running", 2),
        TakeoverCase("process, idle worker, poll 0.2 s", "process", 0.2, "running", 1),
        TakeoverCase("full, worker started after kill", "full", 0.2, "started_after_kill", 1),
    ),
    fsync_samples=20,
    timeout_s=60.0,
)


# -- processes ------------------------------------------------------------------------------

SETUP = """
import json, sys
from bench.workload import TOPIC, w40
from durabl import Runtime
from durabl.crashpoints import AFTER_RUN_STARTED, CrashAt, ProcessDeath
db, durability, prefix, first, count = sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:6])
made = []
with Runtime(db, durability=durability) as rt:
    for k in range(first, first + count):
        run_id = f"{prefix}{k:03d}"
        try:
            with CrashAt(AFTER_RUN_STARTED):
                rt.start(w40, {"topic": f"{TOPIC} {run_id}"}, run_id=run_id)
        except ProcessDeath:
            made.append(run_id)
print(json.dumps(made))
"""
"""Creates runs and leaves each RUNNING with this (soon dead) process as its lease owner."""

SERVE = """
import logging, sys
from durabl import Runtime, cli
db, durability, poll, concurrency, app = sys.argv[1:6]
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
options = cli.load_modules([app])
args = cli.build_parser().parse_args(
    ["--db", db, "worker", "--poll", poll, "--concurrency", concurrency]
)
with Runtime(db, durability=durability, **options) as rt:
    raise SystemExit(args.handler(args, rt))
"""
"""``durabl worker`` on a runtime of the given durability, which the command line has no flag
for: its own parser picks the worker command's handler, called the way its ``main`` calls it."""

STOPPED = re.compile(r"worker stopped: (\d+) drives, (\d+) runs completed")


def worker_argv(db: Path, durability: str, poll_s: float) -> list[str]:
    if durability == "full":
        return [
            sys.executable,
            "-m",
            "durabl",
            "--db",
            str(db),
            "--import",
            APP,
            "worker",
            "--concurrency",
            str(CONCURRENCY),
            "--poll",
            str(poll_s),
        ]
    return [sys.executable, "-c", SERVE, str(db), durability, str(poll_s), str(CONCURRENCY), APP]


def launcher(durability: str) -> str:
    if durability == "full":
        return f"python -m durabl --db F --import {APP} worker --concurrency {CONCURRENCY}"
    return (
        f"python -c: Runtime(F, durability={durability!r}) handed to durabl.cli's worker handler "
        f"(--concurrency {CONCURRENCY})"
    )


def bench_env(outbox: Path, step_sleep_s: float = 0.0) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DURABL_BENCH_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO), env.get("PYTHONPATH")]))
    env[OUTBOX_ENV] = str(outbox)
    if step_sleep_s > 0:
        env[SLEEP_ENV] = repr(step_sleep_s)
    return env


def create_runs(
    db: Path, durability: str, prefix: str, first: int, count: int, env: dict[str, str]
) -> list[str]:
    """Runs created by a process that is gone by the time this returns."""
    proc = subprocess.run(
        [sys.executable, "-c", SETUP, str(db), durability, prefix, str(first), str(count)],
        cwd=harness.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise BenchError(f"the setup process failed:\n{proc.stderr}")
    made: list[str] = json.loads(proc.stdout)
    if len(made) != count:
        raise BenchError(f"the setup process made {len(made)} runs, expected {count}")
    return made


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a live process so far (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Worker:
    """One worker process: spawned, then stopped (SIGTERM) or killed (SIGKILL), and reaped."""

    def __init__(self, db: Path, durability: str, poll_s: float, env: dict[str, str]) -> None:
        self.db = db
        self.log_path = db.with_name(f"worker-{time.monotonic_ns()}.log")
        self._log = open(self.log_path, "w", encoding="utf-8")  # noqa: SIM115 (closed in _reaped)
        self.spawned_s = time.time()
        self.proc = subprocess.Popen(
            worker_argv(db, durability, poll_s),
            cwd=harness.REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid
        self.exit_code: int | None = None
        self.terminated = False
        self.cpu_s: float | None = None
        self.drives: int | None = None
        self.completed: int | None = None

    def alive(self) -> bool:
        """Not exited yet. Looks without reaping: ``_reap`` collects the resource usage."""
        if self.exit_code is not None:
            return False
        exited = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        return exited is None

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the worker has installed its SIGTERM handler: the command line does that after
        opening the database, right before it starts looking for runs. (A SIGTERM before then
        would kill the worker by default action, holding nothing, but not the clean way.)"""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise BenchError(f"worker {self.pid} exited early:\n{self.output()}")
            if harness.handles(self.pid, signal.SIGTERM):
                return
            time.sleep(0.005)
        raise BenchError(f"worker {self.pid} was not serving within {timeout_s} s")

    def terminate(self) -> None:
        """SIGTERM, once: a second one could land while the interpreter shuts down, when the
        worker's handler is no longer installed, and kill it."""
        if not self.terminated and self.alive():
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL, then reap at once (as a supervisor would)."""
        os.kill(self.pid, signal.SIGKILL)
        self._reap(10.0)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (if not sent yet) and reap; a worker that does not exit is an error."""
        self.terminate()
        self._reap(timeout_s)
        if self.exit_code != 0:
            raise BenchError(f"worker {self.pid} exited {self.exit_code}:\n{self.output()}")
        found = STOPPED.search(self.output())
        if found is None:
            raise BenchError(f"worker {self.pid} did not report its counts:\n{self.output()}")
        self.drives, self.completed = int(found.group(1)), int(found.group(2))

    def _reap(self, timeout_s: float) -> None:
        if self.exit_code is not None:
            return
        deadline = time.monotonic() + timeout_s
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                break
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                _, status, usage = os.wait4(self.pid, 0)
                self.exit_code = os.waitstatus_to_exitcode(status)
                self.proc.returncode = self.exit_code
                self._log.close()
                raise BenchError(f"worker {self.pid} did not exit within {timeout_s} s")
            time.sleep(0.005)
        self.exit_code = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.exit_code  # reaped here, with its resource usage
        self.cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
        self._log.close()

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def stop_all(workers: Sequence[Worker]) -> None:
    """SIGTERM every worker at once, then reap each: none waits for another to finish."""
    for w in workers:
        w.terminate()
    for w in workers:
        w.stop()


def kill_leftovers(workers: Sequence[Worker]) -> None:
    """After a failure: no worker process may outlive the benchmark."""
    for w in workers:
        if w.alive():
            w.proc.kill()
            w.proc.wait()


# -- reading the database (read-only) -------------------------------------------------------


def verify(db: Path, outbox: Path, run_ids: Sequence[str], *, keyed: bool) -> dict[str, Any]:
    """Every run COMPLETED with W40's result, every log gapless, every effect exactly once."""
    runs, logs = read_back(db)
    if set(runs) != set(run_ids):
        raise BenchError(f"the database holds {len(runs)} runs, expected {len(run_ids)}")
    resumed_by: Counter[int] = Counter()
    resumes_per_run: Counter[int] = Counter()
    dispatches = 0
    first_resumed_s, last_completed_s = float("inf"), 0.0
    for run_id in run_ids:
        events = check_log(runs[run_id], logs[run_id])
        dispatches += sum(1 for e in events if e.kind in ("TOOL_DISPATCHED", "TOOL_COMPLETED"))
        resumes = [e for e in events if e.kind == "RUN_RESUMED"]
        resumes_per_run[len(resumes)] += 1
        for e in resumes:
            resumed_by[json.loads(e.data or "{}")["pid"]] += 1
            first_resumed_s = min(first_resumed_s, e.at_s)
        last_completed_s = max(last_completed_s, events[-1].at_s)
    return {
        "runs": len(run_ids),
        "events": sum(len(log) for log in logs.values()),
        "effects": check_outbox(outbox, run_ids, keyed=keyed),
        "effects_exactly_once": True,
        "logs_gapless": True,
        "tool_dispatches": dispatches,
        "runs_by_resume_count": {str(k): v for k, v in sorted(resumes_per_run.items())},
        "runs_by_pid": dict(resumed_by),
        "first_resumed_s": first_resumed_s,
        "last_completed_s": last_completed_s,
    }


def read_back(db: Path) -> tuple[dict[str, RunRow], dict[str, list[Event]]]:
    """Every run's row and whole log, through a read-only store (which checks every event's
    checksum on the way)."""
    store = SQLiteStore(db, read_only=True)
    try:
        runs = {row.run_id: row for row in store.list_runs()}
        return runs, {run_id: store.load_log(run_id) for run_id in runs}
    finally:
        store.close()


def check_log(row: RunRow, events: list[Event]) -> list[Event]:
    """The run finished with W40's result, and its log is whole: seqs 1..N with no gap, one
    RUN_STARTED, every step completed, RUN_COMPLETED last."""
    run_id = row.run_id
    if row.status != "COMPLETED" or json.loads(row.result_text or "null") != EXPECTED:
        raise BenchError(f"run {run_id} is {row.status} with result {row.result_text}")
    seqs = [e.seq for e in events]
    if seqs != list(range(1, len(events) + 1)):
        raise BenchError(f"run {run_id}: the log is not gapless: seqs {seqs}")
    kinds = Counter(e.kind for e in events)
    if (
        kinds["RUN_STARTED"] != 1
        or kinds["RUN_COMPLETED"] != 1
        or events[-1].kind != "RUN_COMPLETED"
    ):
        raise BenchError(f"run {run_id}: unexpected log shape {dict(kinds)}")
    completed = kinds["STEP_COMPLETED"] + kinds["TOOL_COMPLETED"]
    if completed != STEPS:
        raise BenchError(f"run {run_id}: {completed} steps completed")
    return events


def check_outbox(outbox: Path, run_ids: Sequence[str], *, keyed: bool) -> int:
    """One line per tool call of every run, no more and no fewer (and, when the tool is keyed,
    no key twice): the effects happened exactly once. Returns the number of effects."""
    lines = outbox.read_text(encoding="utf-8").splitlines()
    if keyed:
        keys = Counter(line.split("\t", 1)[0] for line in lines)
        if any(n != 1 for n in keys.values()):
            raise BenchError("an idempotency key appears twice in the outbox")
        effects = Counter(line.split("\t", 1)[1] for line in lines)
    else:
        effects = Counter(lines)
    wanted = Counter(f"{i}\t{TOPIC} {run_id}" for run_id in run_ids for i in range(TOOL_CALLS))
    if effects != wanted:
        missing, extra = wanted - effects, effects - wanted
        raise BenchError(
            f"the outbox is not one line per tool call: {sum(missing.values())} missing, "
            f"{sum(extra.values())} extra (e.g. {list(missing or extra)[:3]})"
        )
    return sum(effects.values())


def disk_probe(work: Path, samples: int) -> dict[str, Any]:
    """4 KiB append + fdatasync, ``samples`` times. The mean shows what the median hides: a
    virtual disk that throttles sustained syncing stalls some of them for milliseconds."""
    times = harness.sync_times_us(work, os.fdatasync, samples)
    return {
        "fdatasync_us_median": round(statistics.median(times), 1),
        "fdatasync_us_p95": round(percentile(times, 95), 1),
        "fdatasync_us_mean": round(statistics.fmean(times), 1),
        "samples": samples,
    }


# -- part 1: throughput ---------------------------------------------------------------------


def throughput_once(
    work: Path, plan: Plan, durability: str, workers: int, rep: int
) -> dict[str, Any]:
    """One repetition: ``plan.runs`` runs left behind by a dead setup process, drained by
    ``workers`` fresh worker processes on a fresh database."""
    folder = work / f"throughput-{durability}-{workers}w-{rep}"
    folder.mkdir()
    db, outbox = folder / "workers.db", folder / "outbox.txt"
    outbox.touch()
    env = bench_env(outbox)
    t_setup = time.perf_counter()
    run_ids = create_runs(db, durability, "r", 0, plan.runs, env)
    setup_s = time.perf_counter() - t_setup
    spawned_s, procs = drain(db, durability, workers, env, plan)
    checked = verify(db, outbox, run_ids, keyed=False)
    if checked["runs_by_resume_count"] != {"1": plan.runs}:
        raise BenchError(f"runs resumed other than once: {checked['runs_by_resume_count']}")
    if checked["tool_dispatches"] != plan.runs * TOOL_CALLS:
        raise BenchError(f"{checked['tool_dispatches']} tool dispatches")
    reported = sum(w.completed or 0 for w in procs)
    if reported != plan.runs:
        raise BenchError(f"the workers report {reported} completed runs, expected {plan.runs}")
    return {
        "rep": rep,
        **rates(checked, spawned_s, plan.runs),
        "setup_s": round(setup_s, 3),
        **by_worker(checked, procs),
    }


def drain(
    db: Path, durability: str, workers: int, env: dict[str, str], plan: Plan
) -> tuple[float, list[Worker]]:
    """Spawn ``workers`` worker processes on runs left RUNNING, wait until every run is
    COMPLETED, and stop them. Returns when they were spawned (wall clock, as the log's times)
    and the stopped workers."""
    mon = Monitor(db)
    procs: list[Worker] = []
    try:
        if mon.statuses() != Counter({"RUNNING": plan.runs}):
            raise BenchError(f"after setup the runs are {dict(mon.statuses())}")
        spawned_s = time.time()
        procs = [Worker(db, durability, DEFAULT_POLL_S, env) for _ in range(workers)]
        wait_until_completed(mon, procs, plan)
        for w in procs:
            w.wait_ready()  # a worker that found no run left may still be starting up
        stop_all(procs)
    finally:
        mon.close()
        kill_leftovers(procs)
    return spawned_s, procs


def wait_until_completed(mon: Monitor, procs: Sequence[Worker], plan: Plan) -> None:
    """Until all ``plan.runs`` runs are COMPLETED; a run in any state but RUNNING or COMPLETED,
    a worker that exits, or the timeout is an error."""
    deadline = time.monotonic() + plan.timeout_s
    while True:
        counts = mon.statuses()
        if counts["COMPLETED"] == plan.runs:
            return
        stray = {k: v for k, v in counts.items() if k not in ("RUNNING", "COMPLETED")}
        if stray:
            raise BenchError(f"runs left the happy path: {stray}")
        dead = [w.pid for w in procs if not w.alive()]
        if dead or time.monotonic() > deadline:
            raise BenchError(f"{counts['COMPLETED']}/{plan.runs} runs done; workers exited: {dead}")
        time.sleep(0.05)


def rates(checked: dict[str, Any], spawned_s: float, runs: int) -> dict[str, Any]:
    """Runs and steps per second over the log's span (first RUN_RESUMED to last RUN_COMPLETED),
    and end to end, from the workers' spawn."""
    span_s = checked["last_completed_s"] - checked["first_resumed_s"]
    wall_s = checked["last_completed_s"] - spawned_s
    steps = runs * STEPS
    return {
        "span_s": round(span_s, 4),
        "end_to_end_s": round(wall_s, 4),
        "runs_per_s": round(runs / span_s, 2),
        "steps_per_s": round(steps / span_s, 1),
        "end_to_end_runs_per_s": round(runs / wall_s, 2),
        "end_to_end_steps_per_s": round(steps / wall_s, 1),
        "startup_s": round(checked["first_resumed_s"] - spawned_s, 4),
    }


def by_worker(checked: dict[str, Any], procs: Sequence[Worker]) -> dict[str, Any]:
    """How the work fell on the workers (from the log and from their own counts), and the
    checks' totals."""
    by_pid = checked["runs_by_pid"]
    return {
        "runs_by_worker": [by_pid.get(w.pid, 0) for w in procs],
        "completed_by_worker": [w.completed for w in procs],
        "drives_by_worker": [w.drives for w in procs],
        "cpu_s_by_worker": [w.cpu_s for w in procs],
        "events": checked["events"],
        "effects": checked["effects"],
        "effects_exactly_once": checked["effects_exactly_once"],
        "logs_gapless": checked["logs_gapless"],
    }


def measure_throughput(work: Path, plan: Plan) -> tuple[dict[str, Any], int]:
    """Rounds of one repetition of every configuration, in a rotating order, until
    ``throughput_reps`` rounds are done or the time budget is spent (one round at least: a disk
    whose fsyncs are throttled under sustained load can make full durability very slow)."""
    samples, rounds = throughput_rounds(work, plan)
    figures: dict[str, Any] = {}
    for durability in plan.durabilities:
        base = statistics.median(s["runs_per_s"] for s in samples[(durability, 1)])
        figures[durability] = {
            str(workers): throughput_figures(
                durability, workers, samples[(durability, workers)], base, plan.runs
            )
            for workers in plan.worker_counts
        }
    return figures, rounds


def throughput_rounds(
    work: Path, plan: Plan
) -> tuple[dict[tuple[str, int], list[dict[str, Any]]], int]:
    """The samples of every (durability, workers) configuration, and how many rounds ran."""
    configs = [(d, n) for d in plan.durabilities for n in plan.worker_counts]
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    total = len(configs) * plan.throughput_reps
    done = rounds = 0
    started = time.monotonic()
    for rep, order in enumerate(rotations(configs, plan.throughput_reps)):
        if rep and time.monotonic() - started > plan.throughput_budget_s:
            say(f"  time budget spent: {rep} round(s) of {plan.throughput_reps}")
            break
        rounds += 1
        for durability, workers in order:
            sample = throughput_once(work, plan, durability, workers, rep)
            samples[(durability, workers)].append(sample)
            done += 1
            say(
                f"  [{done}/{total}] {durability:<7} {workers} worker(s): "
                f"{sample['runs_per_s']:.1f} runs/s, {sample['steps_per_s']:.0f} steps/s, "
                f"runs per worker {sample['runs_by_worker']}"
            )
    return samples, rounds


def throughput_figures(
    durability: str, workers: int, ss: list[dict[str, Any]], base: float, runs: int
) -> dict[str, Any]:
    """Medians over the repetitions of one configuration; ``base`` is the median rate of one
    worker of the same durability."""
    runs_per_s = statistics.median(s["runs_per_s"] for s in ss)
    return {
        "workers": workers,
        "durability": durability,
        "reps": len(ss),
        "runs_per_s_median": round(runs_per_s, 2),
        "steps_per_s_median": round(statistics.median(s["steps_per_s"] for s in ss), 1),
        "runs_per_s_min": round(min(s["runs_per_s"] for s in ss), 2),
        "runs_per_s_max": round(max(s["runs_per_s"] for s in ss), 2),
        "end_to_end_runs_per_s_median": round(
            statistics.median(s["end_to_end_runs_per_s"] for s in ss), 2
        ),
        "end_to_end_steps_per_s_median": round(
            statistics.median(s["end_to_end_steps_per_s"] for s in ss), 1
        ),
        "speedup_vs_1_worker": round(runs_per_s / base, 3),
        "cpu_ms_per_run_median": round(
            statistics.median(sum(s["cpu_s_by_worker"]) / runs for s in ss) * 1e3, 3
        ),
        "effects_exactly_once": all(s["effects_exactly_once"] for s in ss),
        "logs_gapless": all(s["logs_gapless"] for s in ss),
        "samples": ss,
    }


# -- part 2: takeover after SIGKILL ---------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    """One SIGKILL of the worker driving a run, and what stood at that instant."""

    killed_pid: int
    killed_s: float  # wall clock, as the log's times
    kill_after_s: float  # after the pickup
    steps_done: int
    lease_expires_s: float | None
    standby_idle_s: float
    standby_idle_cpu_share: float | None  # None when no standby's CPU time could be read


class Takeover:
    """One takeover case: a pool of workers on a fresh database, one slow run per repetition."""

    def __init__(self, work: Path, plan: Plan, case: TakeoverCase, rng: random.Random) -> None:
        slug = re.sub(r"[^a-z0-9]+", "-", case.label.lower()).strip("-")
        folder = work / f"takeover-{slug}"
        folder.mkdir()
        self.plan, self.case, self.rng = plan, case, rng
        self.db, self.outbox = folder / "workers.db", folder / "outbox.txt"
        self.outbox.touch()
        self.env = bench_env(self.outbox, plan.step_sleep_s)
        create_runs(self.db, case.durability, "t", 0, 0, self.env)  # the schema, before workers
        self.mon = Monitor(self.db)
        self.pool: list[Worker] = []  # the live workers
        self.every: list[Worker] = []
        self.run_ids: list[str] = []

    def spawn(self) -> Worker:
        w = Worker(self.db, self.case.durability, self.case.poll_s, self.env)
        self.pool.append(w)
        self.every.append(w)
        return w

    def settle(self) -> None:
        """Past the workers' first look for runs: idle."""
        time.sleep(min(self.case.poll_s, 0.3))

    def measure(self) -> dict[str, Any]:
        case = self.case
        samples: list[dict[str, Any]] = []
        try:
            for w in [self.spawn() for _ in range(2 if case.standby == "running" else 1)]:
                w.wait_ready()
            self.settle()
            for rep in range(case.reps):
                sample = self.once(rep)
                samples.append(sample)
                say(
                    f"  {case.label} [{rep + 1}/{case.reps}]: killed after "
                    f"{sample['steps_done_at_kill']} steps; taken over in "
                    f"{sample['latency_s'] * 1e3:.0f} ms"
                )
                if case.standby == "running":
                    self.spawn().wait_ready()  # a new standby in place of the killed worker
                    self.settle()
            stop_all(self.pool)
        finally:
            self.mon.close()
            kill_leftovers(self.every)
        return self.figures(samples)

    def once(self, rep: int) -> dict[str, Any]:
        """Start a slow run, SIGKILL the worker driving it mid-run, time the takeover."""
        (run_id,) = create_runs(self.db, self.case.durability, "t", rep, 1, self.env)
        self.run_ids.append(run_id)
        first = wait_for(f"a worker to take run {run_id}", lambda: self.mon.resumes(run_id), 30.0)
        picked_up_s, pid = first[0][1], first[0][2]["pid"]
        driver = next((w for w in self.pool if w.pid == pid), None)
        if driver is None:
            raise BenchError(f"run {run_id} was taken by pid {pid}, not a worker")
        standby = next((w for w in self.pool if w is not driver), None)
        kill = self.kill_mid_run(run_id, driver, standby, picked_up_s)
        if self.case.standby == "started_after_kill":
            standby = self.spawn()
        assert standby is not None
        resumed, first_step_s = self.taken_over(run_id, standby)
        return self.sample(rep, kill, resumed, first_step_s, standby)

    def kill_mid_run(
        self, run_id: str, driver: Worker, standby: Worker | None, picked_up_s: float
    ) -> Kill:
        """SIGKILL ``driver`` while it drives ``run_id`` (and reap it at once), noting the
        standby's CPU use while it waited."""
        mon = self.mon
        cpu0 = None if standby is None else cpu_s(standby.pid)
        waited_from = time.monotonic()
        # A delay spread evenly over one poll interval puts the kill at a uniformly random
        # instant of the waiting worker's polling cycle (and inside some step).
        kill_after_s = self.plan.kill_after_s + self.rng.uniform(0, self.case.poll_s)
        time.sleep(max(0.0, picked_up_s + kill_after_s - time.time()))
        steps_done = len(mon.completed_steps(run_id))
        expires_s = mon.lease_expires_s(run_id)
        if mon.status(run_id) != "RUNNING" or steps_done >= STEPS:
            raise BenchError(f"run {run_id} finished before the kill")
        cpu1 = None if standby is None else cpu_s(standby.pid)
        idle_s = time.monotonic() - waited_from
        killed_s = time.time()
        driver.kill()
        self.pool.remove(driver)
        idle_share = None
        if cpu0 is not None and cpu1 is not None and idle_s > 0:
            idle_share = round((cpu1 - cpu0) / idle_s, 4)
        return Kill(driver.pid, killed_s, kill_after_s, steps_done, expires_s, idle_s, idle_share)

    def taken_over(
        self, run_id: str, standby: Worker
    ) -> tuple[tuple[int, float, dict[str, Any]], float]:
        """Wait for ``standby`` to take ``run_id`` over and finish it. Returns its RUN_RESUMED
        (seq, time, data) and when it completed its first step."""
        mon, timeout_s = self.mon, self.plan.timeout_s
        resumes = wait_for(
            f"a second worker to take run {run_id} over",
            lambda: (r := mon.resumes(run_id)) and len(r) >= 2 and r,
            timeout_s,
            0.002,
        )
        seq, _, boundary = resumes[1]
        if boundary["pid"] != standby.pid:
            raise BenchError(f"run {run_id} was taken over by {boundary['pid']}")
        stepped = wait_for(
            f"the first step the second worker completes in run {run_id}",
            lambda: mon.completed_steps(run_id, seq),
            timeout_s,
        )
        wait_for(f"run {run_id} to complete", lambda: mon.status(run_id) == "COMPLETED", 60.0)
        return resumes[1], stepped[0][1]

    def sample(
        self,
        rep: int,
        kill: Kill,
        resumed: tuple[int, float, dict[str, Any]],
        first_step_s: float,
        taker: Worker,
    ) -> dict[str, Any]:
        _, resumed_s, boundary = resumed
        left = None if kill.lease_expires_s is None else kill.lease_expires_s - kill.killed_s
        idle_known = kill.standby_idle_cpu_share is not None
        return {
            "rep": rep,
            "latency_s": round(resumed_s - kill.killed_s, 4),
            "first_step_completed_s": round(first_step_s - kill.killed_s, 4),
            "kill_after_pickup_s": round(kill.kill_after_s, 4),
            "steps_done_at_kill": kill.steps_done,
            "steps_replayed_by_taker": boundary.get("replayed"),
            "lease_left_at_kill_s": None if left is None else round(left, 3),
            "killed_pid": kill.killed_pid,
            "taker_pid": boundary["pid"],
            "taker_owner": boundary["owner"],
            "taker_spawned_after_kill_s": round(taker.spawned_s - kill.killed_s, 4)
            if self.case.standby == "started_after_kill"
            else None,
            "standby_idle_s": round(kill.standby_idle_s, 3) if idle_known else None,
            "standby_idle_cpu_share": kill.standby_idle_cpu_share,
        }

    def figures(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        case, run_ids = self.case, self.run_ids
        checked = verify(self.db, self.outbox, run_ids, keyed=True)
        if checked["runs_by_resume_count"] != {"2": len(run_ids)}:
            raise BenchError(f"runs resumed other than twice: {checked['runs_by_resume_count']}")
        latencies = [s["latency_s"] for s in samples]
        lease_left = [s["lease_left_at_kill_s"] for s in samples if s["lease_left_at_kill_s"]]
        idle = [s["standby_idle_cpu_share"] for s in samples]
        idle_known = [v for v in idle if v is not None]
        return {
            "label": case.label,
            "durability": case.durability,
            "poll_s": case.poll_s,
            "standby": case.standby,
            "reps": case.reps,
            "step_sleep_s": self.plan.step_sleep_s,
            "latency_s": summary(latencies),
            "first_step_completed_s": summary([s["first_step_completed_s"] for s in samples]),
            # A worker started after the kill looks for runs as it starts: its poll plays no part.
            "latency_max_over_poll": round(max(latencies) / case.poll_s, 3)
            if case.standby == "running"
            else None,
            "lease_s": LEASE_S,
            "lease_left_at_kill_s_min": round(min(lease_left), 3) if lease_left else None,
            "taken_over_before_lease_expiry": all(
                s["latency_s"] < (s["lease_left_at_kill_s"] or 0) for s in samples
            ),
            "standby_idle_cpu_share_max": round(max(idle_known), 4) if idle_known else None,
            "tool_calls_repeated_after_kill": checked["tool_dispatches"]
            - len(run_ids) * TOOL_CALLS,
            "effects_exactly_once": checked["effects_exactly_once"],
            "logs_gapless": checked["logs_gapless"],
            "samples": samples,
        }


def measure_takeover(work: Path, plan: Plan) -> dict[str, Any]:
    rng = random.Random(7)
    return {
        "lease_s": LEASE_S,
        "bound": "On one host a lease whose owner pid is gone is taken at once, without waiting "
        "for its expiry; a worker already running notices at its next look for runs (every "
        "poll_s), a worker started after the kill looks as it starts. latency_s runs from the "
        "SIGKILL to the taker's RUN_RESUMED (committed with its first step event).",
        "cases": [Takeover(work, plan, case, rng).measure() for case in plan.takeover],
    }


# -- the report -----------------------------------------------------------------------------


def render(report: Report) -> str:
    return "\n".join(
        [
            *_header_lines(report),
            *_throughput_lines(report),
            *_takeover_lines(report["takeover"]),
            *_check_lines(report["checks"]),
        ]
    )


def _header_lines(report: Report) -> list[str]:
    m, w = report["machine"], report["workload"]
    d0, d1 = report["disk"]["before_throughput"], report["disk"]["after_throughput"]
    return [
        f"Workers: {w['runs']} W40 runs ({w['steps_per_run']} steps each) on one SQLite file"
        f"{harness.quick_mark(report)}",
        harness.machine_line(m),
        f"  scratch: {m['scratch_dir']} ({m['scratch_filesystem']}); 4 KiB append + fdatasync, "
        f"median / mean: {d0['fdatasync_us_median']:g} / {d0['fdatasync_us_mean']:g} us before "
        f"the throughput runs, {d1['fdatasync_us_median']:g} / {d1['fdatasync_us_mean']:g} us "
        f"after",
    ]


def _throughput_lines(report: Report) -> list[str]:
    w = report["workload"]
    lines = [
        "",
        f"Throughput ({report['repetitions']['throughput']} reps each, medians; worker processes "
        f"with {w['worker_concurrency']} thread each; rates over first resume -> last "
        f"completion; e2e from spawn; CPU of all workers, start-up included)",
        f"  {'durability':<11}{'workers':>8}{'runs/s':>9}{'min-max':>14}{'steps/s':>9}"
        f"{'speedup':>9}{'e2e runs/s':>12}{'CPU ms/run':>12}  runs per worker (last rep)",
    ]
    for durability, by_n in report["throughput"].items():
        for f in by_n.values():
            lines.append(
                f"  {durability:<11}{f['workers']:>8}{f['runs_per_s_median']:>9.1f}"
                f"{f['runs_per_s_min']:>8.1f}-{f['runs_per_s_max']:<5.1f}"
                f"{f['steps_per_s_median']:>9.0f}{f['speedup_vs_1_worker']:>9.2f}"
                f"{f['end_to_end_runs_per_s_median']:>12.1f}{f['cpu_ms_per_run_median']:>12.2f}"
                f"  {f['samples'][-1]['runs_by_worker']}"
            )
    return lines


def _takeover_lines(takeover: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Takeover after SIGKILL (kill -> the second worker's first event; lease "
        f"{takeover['lease_s']:g} s; tool sleeps {takeover['cases'][0]['step_sleep_s']} s "
        f"per call)",
        f"  {'case':<36}{'reps':>5}{'median ms':>11}{'p95 ms':>9}{'max ms':>9}{'max/poll':>10}"
        f"{'lease left':>12}",
    ]
    for c in takeover["cases"]:
        lat = c["latency_s"]
        left = c["lease_left_at_kill_s_min"]
        ratio = "-" if c["latency_max_over_poll"] is None else f"{c['latency_max_over_poll']:.2f}"
        lines.append(
            f"  {c['label']:<36}{c['reps']:>5}{lat['median'] * 1e3:>11.0f}{lat['p95'] * 1e3:>9.0f}"
            f"{lat['max'] * 1e3:>9.0f}{ratio:>10}"
            f"{'' if left is None else f'{left:.1f} s':>12}"
        )
    return lines


def _check_lines(checks: dict[str, Any]) -> list[str]:
    return [
        "",
        "  lease left: the least lease time remaining at any kill. Every takeover came long "
        "before expiry:",
        "  a dead owner's pid is noticed at the waiting worker's next look for runs, so its poll "
        "bounds",
        "  the latency (max/poll); a worker started after the kill looks at once, as it starts.",
        "",
        f"Checks: effects exactly once {checks['effects_exactly_once']}, logs gapless "
        f"{checks['logs_gapless']}, takeovers before lease expiry "
        f"{checks['taken_over_before_lease_expiry']}",
    ]


# -- the run --------------------------------------------------------------------------------


def measure(work: Path, quick: bool) -> Report:
    plan = QUICK if quick else FULL
    report: Report = {
        **harness.header("workers", SCHEMA, quick, work, plan.fsync_samples),
        "workload": {
            "runs": plan.runs,
            "steps_per_run": STEPS,
            "model_calls": 1,
            "tool_calls": TOOL_CALLS,
            "worker_concurrency": CONCURRENCY,
            "throughput_tool": "W40's outbox, a bare callable (AT_MOST_ONCE)",
            "takeover_tool": "W40's outbox keyed by durabl's idempotency key, IDEMPOTENT, "
            "sleeping step_sleep_s before each call",
            "launcher": {d: launcher(d) for d in plan.durabilities},
            "runs_created_by": "a setup process that dies at after_run_started",
        },
        "repetitions": {
            "throughput": plan.throughput_reps,
            "throughput_planned": plan.throughput_reps,
            "throughput_budget_s": plan.throughput_budget_s,
            "takeover": {case.label: case.reps for case in plan.takeover},
        },
    }
    say(f"[1/2] throughput: {plan.runs} runs, {plan.worker_counts} worker processes")
    report["disk"] = {"before_throughput": disk_probe(work, plan.fsync_samples)}
    report["throughput"], rounds = measure_throughput(work, plan)
    report["repetitions"]["throughput"] = rounds
    report["disk"]["after_throughput"] = disk_probe(work, plan.fsync_samples)
    say("[2/2] takeover after SIGKILL")
    report["takeover"] = measure_takeover(work, plan)
    cases = report["takeover"]["cases"]
    sections = [f for by_n in report["throughput"].values() for f in by_n.values()] + cases
    report["checks"] = {
        "effects_exactly_once": all(f["effects_exactly_once"] for f in sections),
        "logs_gapless": all(f["logs_gapless"] for f in sections),
        "taken_over_before_lease_expiry": all(c["taken_over_before_lease_expiry"] for c in cases),
    }
    return report


def main(argv: list[str] | None = None) -> int:
    return harness.main(
        argv,
        name="workers",
        doc=__doc__,
        quick_help="few runs and repetitions: exercises the code, figures are noise",
        measure=measure,
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
