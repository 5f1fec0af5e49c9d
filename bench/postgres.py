"""PostgreSQL: durabl on a PostgreSQL server beside durabl on SQLite, and beside DBOS on the same
server, measured in one run.

The workload is W40 (bench/workload.py: one model call to a stub that answers at once, then 40
tool calls, each appending a line to a file and returning a ~200-byte dict), its tool registered
IDEMPOTENT, so that durabl makes one commit per step, its completion. The server is the one at
``--server`` (default postgresql://root@127.0.0.1:5432, on this host); every sample gets a
database of its own (``durabl_bench_<pid>_<n>``), created before it and dropped after it. SQLite
samples get a fresh file in a scratch folder on a real disk (never tmpfs: fsync must be real).

1. Workers: 1, 2, 4 and 8 worker processes drain ``worker_runs`` W40 runs from one database, on
   PostgreSQL and on SQLite. The runs are created first by a process that dies right after each
   RUN_STARTED (``durabl_probe.py create``), which leaves them RUNNING with their owner gone.
   Each worker is ``durabl_probe.py serve``: ``Runtime(db).serve(concurrency=1)`` with the
   worker's default poll, kit's per-run outbox as the tool. The workers start, open their
   runtimes and wait at a gate (a line on stdin); once every one waits, the gate opens for all
   at one instant. steps/s = the steps completed (counted afterwards from the log) / the wall
   time from the gate to the last RUN_COMPLETED in the log; beside it, the rate over the log's
   own span (first RUN_RESUMED to last RUN_COMPLETED) and from the workers' spawn (interpreter
   start-up included), and the share of the machine's CPUs busy meanwhile (the server's work
   included). Checked every time: every run COMPLETED with W40's result and one RUN_RESUMED,
   every log gapless with 41 steps, every tool effect in the outbox exactly once, and the
   workers' own counts add up. Rounds of one sample of each configuration, in a rotated order.
2. Takeover after SIGKILL: two ``durabl worker`` processes (the command line's handler, on a
   runtime with the lease given; bench/worker_app.py's tool: keyed by durabl's idempotency key,
   IDEMPOTENT, sleeping ``step_sleep_s`` in each call) serve one database. A run is created; one
   worker drives it and, once its first step is committed, at a delay spread evenly over one
   poll interval, is SIGKILLed mid-step (and reaped at once, as a supervisor would); the other,
   already running and idle, takes the run over. The latency runs from the kill to the first
   step the survivor commits (its first STEP_COMPLETED, by the log's clock); beside it, to the
   instant it took the lease (read from the run's row: a fresh lease expires ``lease_s`` after
   it was taken; a RUN_RESUMED is stamped when it is committed, with the first step it resumes,
   so it cannot tell), and how soon after its creation the run's first step was committed. A
   fresh idle worker replaces the killed one for the next repetition. A survivor takes a lease
   before it runs out (``durabl.leases.LEASE_S``) only when it can tell that the owner is gone:
   on one host, by its pid; across hosts, only if the store can tell. The "other host" cases run
   one of the two workers in a UTS namespace of its own under another host name (``unshare
   --uts``, root only), so that the survivor cannot look at its pid; the "hung" case stops the
   driver with SIGSTOP instead of killing it, at an instant when it is between two of its
   transactions (alive, its connections open, renewing nothing, as a host cut off from the
   network looks), so its lease has to run out. (Frozen inside a transaction, a worker keeps its
   run's row locked, and the takeover waits on that lock for as long as the freeze lasts.) Each
   case says which bound held, from its samples. The workers look for runs every ``poll_s``.
3. Per-step overhead in one process, durability "full" and "process": each sample is one probe
   process (``bench/throughput_peers/<runtime>_probe.py overhead``; DBOS's under its own
   interpreter, .bench-venvs/dbos) on a fresh database, timing pairs in one thread: the plain
   loop, then one W40 run. Per-step overhead = (run - plain) / 41 of a pair; each probe's first
   pairs warm it up and are left out. durabl on PostgreSQL and on SQLite; DBOS with its system
   database on the same server (``system_database_url``), as it configures itself
   (synchronous_commit as the server has it) and with ``options=-c synchronous_commit=off`` in
   its URL, the setting durabl's "process" mode makes there. The floor: one raw committed INSERT
   of a step-sized row into an events-like table on the same server, through psycopg,
   autocommit, synchronous_commit on (and off, beside "process"). Rounds: every probe and the
   floor once, in an order rotated from round to round.

The report holds the server's version and the settings that decide what a commit costs, and the
load average before, between and after the parts: the machine may be shared.

    python -m bench.postgres --out bench/results/postgres.json     # the full run (make bench)
    python -m bench.postgres --quick --runtimes durabl --out /tmp/p.json   # seconds
"""

from __future__ import annotations

import argparse
import functools
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench import harness
from bench.harness import (
    REPO,
    BenchError,
    Monitor,
    Report,
    rotations,
    run_probe,
    say,
    summary,
    wait_for,
)
from bench.throughput_peers import kit
from bench.workload import EXPECTED, OUTBOX_ENV, SLEEP_ENV, STEPS, TOOL_CALLS
from durabl.leases import HOST, LEASE_S
from durabl.store import Lease, open_store
from durabl.store.postgres import session_name
from durabl.worker import POLL_S

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
RUNTIMES = ("durabl", "dbos")
BACKENDS = ("postgres", "sqlite")
SERVER = "postgresql://root@127.0.0.1:5432"
ADMIN_DB = "postgres"
SETTINGS = (
    "synchronous_commit", "fsync", "wal_sync_method", "commit_delay", "commit_siblings",
    "full_page_writes", "wal_level", "wal_writer_delay", "shared_buffers", "max_connections",
)  # fmt: skip
"""The server settings that decide what a commit costs, reported with the figures."""
OTHER_HOST = "durabl-bench-elsewhere"
APP = "bench.worker_app"
SYNC_OFF = "?options=-c%20synchronous_commit%3Doff"
"""A libpq URL parameter: every connection of the URL runs with synchronous_commit off."""
FLOOR_TABLE = (
    "CREATE TABLE events (run_id text NOT NULL, seq integer NOT NULL, kind text NOT NULL, "
    "step integer NOT NULL, data text, at_s double precision NOT NULL, crc bigint NOT NULL, "
    "PRIMARY KEY (run_id, seq))"
)
"""The floor's table: an events table's columns and its (run_id, seq) key."""
FLOOR_INSERT = (
    "INSERT INTO events (run_id, seq, kind, step, data, at_s, crc) "
    "VALUES (%s, %s, 'STEP_COMPLETED', %s, %s, %s, 0)"
)
FLOOR_ROW = json.dumps(kit.result_of(0, kit.topic_of(0)))
"""The row's data: the ~200-byte result a W40 step records."""


@dataclass(frozen=True)
class TakeoverCase:
    backend: str
    poll_s: float
    lease_s: float
    other_host: bool  # the two workers run under two host names
    death: str  # "kill" (SIGKILL) or "hang" (SIGSTOP: alive, its sessions open, silent)
    reps: int

    @property
    def label(self) -> str:
        hung = ", hung" if self.death == "hang" else ""
        where = "other" if self.other_host else "same"
        return f"{self.backend}, {where} host{hung}, poll {self.poll_s:g} s"


@dataclass(frozen=True)
class Plan:
    worker_counts: tuple[int, ...]
    worker_runs: int
    worker_concurrency: int
    throughput_reps: int
    step_sleep_s: float  # in each tool call of a takeover run
    kill_after_s: float  # the kill comes this long after the pickup, plus up to one poll
    takeover: tuple[TakeoverCase, ...]
    overhead_rounds: int
    warmup_pairs: int
    warm_pairs: int
    floor_inserts: int
    fsync_samples: int
    timeout_s: float


FULL = Plan(
    worker_counts=(1, 2, 4, 8),
    worker_runs=64,
    worker_concurrency=1,
    throughput_reps=5,
    step_sleep_s=0.05,
    kill_after_s=0.1,
    takeover=(
        TakeoverCase("postgres", POLL_S, LEASE_S, False, "kill", 8),
        TakeoverCase("sqlite", POLL_S, LEASE_S, False, "kill", 8),
        TakeoverCase("postgres", 0.25, LEASE_S, False, "kill", 4),
        TakeoverCase("sqlite", 0.25, LEASE_S, False, "kill", 4),
        TakeoverCase("postgres", POLL_S, LEASE_S, True, "kill", 6),
        TakeoverCase("postgres", POLL_S, LEASE_S, True, "hang", 3),
    ),
    overhead_rounds=8,
    warmup_pairs=3,
    warm_pairs=15,
    floor_inserts=200,
    fsync_samples=200,
    timeout_s=300.0,
)
QUICK = Plan(
    worker_counts=(1, 2, 4, 8),
    worker_runs=8,
    worker_concurrency=1,
    throughput_reps=1,
    step_sleep_s=0.02,
    kill_after_s=0.05,
    takeover=(
        TakeoverCase("postgres", 0.2, LEASE_S, False, "kill", 1),
        TakeoverCase("sqlite", 0.2, LEASE_S, False, "kill", 1),
        TakeoverCase("postgres", 0.2, 1.0, True, "kill", 1),
        TakeoverCase("postgres", 0.2, 1.0, True, "hang", 1),
    ),
    overhead_rounds=1,
    warmup_pairs=1,
    warm_pairs=2,
    floor_inserts=20,
    fsync_samples=20,
    timeout_s=60.0,
)


# -- the server -----------------------------------------------------------------------------


class Server:
    """The PostgreSQL server: what it runs with, and one database per sample, created here and
    dropped after it (any left at the end are dropped too)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        try:
            self._admin = psycopg.connect(
                f"{self.url}/{ADMIN_DB}", autocommit=True, connect_timeout=10
            )
        except psycopg.OperationalError as exc:
            raise SystemExit(
                f"bench.postgres: cannot reach {self.url} ({' '.join(str(exc).split())}); "
                f"`make postgres-up` starts the machine's server"
            ) from None
        self._made: set[str] = set()
        self._count = 0

    def url_of(self, name: str) -> str:
        return f"{self.url}/{name}"

    def create(self) -> str:
        name = f"durabl_bench_{os.getpid()}_{self._count}"
        self._count += 1
        self._admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        self._made.add(name)
        return name

    def drop(self, name: str) -> None:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        self._admin.execute(drop)
        self._made.discard(name)

    def close(self) -> None:
        for name in sorted(self._made):
            self.drop(name)
        self._admin.close()

    def one(self, query: str, params: Sequence[Any] = ()) -> Any:
        row = self._admin.execute(query, params).fetchone()  # type: ignore[call-overload]
        return None if row is None else row[0]

    def sessions(self) -> int:
        """Client sessions open on the server besides this one: other work sharing it."""
        return int(
            self.one(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        )

    def info(self) -> dict[str, Any]:
        data_dir = self.one("SELECT current_setting('data_directory')")
        before = time.time()
        server_s = float(self.one("SELECT extract(epoch FROM clock_timestamp())"))
        after = time.time()
        return {
            "server": self.url.split("@")[-1],
            "version": self.one("SHOW server_version"),
            "version_num": int(self.one("SHOW server_version_num")),
            "settings": {
                name: self.one("SELECT current_setting(%s)", (name,)) for name in SETTINGS
            },
            "data_directory": data_dir,
            "data_filesystem": harness.filesystem_of(Path(data_dir)) if data_dir else None,
            "clock_offset_s": round(server_s - (before + after) / 2, 6),
            "other_sessions_at_start": self.sessions(),
        }

    def in_transaction(self, application_name: str) -> bool:
        """Whether a session of that name is inside a transaction now."""
        query = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = %s AND xact_start IS NOT NULL"
        )
        return bool(self.one(query, (application_name,)))

    def transactions(self, name: str) -> int | None:
        """Transactions committed in database ``name`` so far, once the server's statistics
        have settled: a backend reports its counts as it exits, a moment after its client has
        closed the connection."""
        last = None
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            found = self.one("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (name,))
            if found is not None and found == last:
                break
            last = found
            time.sleep(0.15)
        return None if last is None else int(last)


@contextmanager
def database(server: Server, backend: str, folder: Path) -> Iterator[tuple[str, str | None]]:
    """A fresh database for one sample: what the runtime opens, and the server's name for it
    (None for SQLite)."""
    folder.mkdir(parents=True, exist_ok=True)
    if backend == "sqlite":
        yield str(folder / "durabl.db"), None
        return
    name = server.create()
    try:
        yield server.url_of(name), name
    finally:
        server.drop(name)


# -- processes ------------------------------------------------------------------------------


def last_json(text: str) -> Any:
    lines = text.strip().splitlines()
    return json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None


class Worker:
    """One worker process: spawned, then stopped (SIGTERM) or killed (SIGKILL), and reaped with
    its CPU time."""

    def __init__(
        self, argv: list[str], env: dict[str, str], log: Path, *, gated: bool = False
    ) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.PIPE if gated else subprocess.DEVNULL,
            )
        self.pid = self.proc.pid
        self.spawned_s = time.time()
        self.exit_code: int | None = None
        self.cpu_s: float | None = None
        self.terminated = False

    def alive(self) -> bool:
        """Not exited yet; looks without reaping (``_reap`` collects the resource usage)."""
        if self.exit_code is not None:
            return False
        return os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the worker has its SIGTERM handler in place: both kinds install it after
        opening the database, right before they look for runs (or wait at the gate)."""
        deadline = time.monotonic() + timeout_s
        while not harness.handles(self.pid, signal.SIGTERM):
            if not self.alive() or time.monotonic() > deadline:
                raise BenchError(f"worker {self.pid} is not serving:\n{self.output()[-3000:]}")
            time.sleep(0.005)

    def open_gate(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.write(b"go\n")
            self.proc.stdin.close()

    def kill(self) -> None:
        """SIGKILL, then reap at once (as a supervisor would)."""
        os.kill(self.pid, signal.SIGKILL)
        self._reap(10.0)

    def terminate(self) -> None:
        """SIGTERM, once: a second one could land while the interpreter shuts down, when the
        worker's handler is no longer installed, and kill it."""
        if not self.terminated and self.alive():
            self.terminated = True
            self.proc.send_signal(signal.SIGTERM)
        self.open_gate()  # a worker still at the gate reads the line, then sees it must stop

    def stop(self, timeout_s: float = 30.0) -> str:
        """SIGTERM (unless sent already) and reap; a worker that does not exit 0 is an error.
        Returns its output."""
        self.terminate()
        self._reap(timeout_s)
        if self.exit_code != 0:
            raise BenchError(f"worker {self.pid} exited {self.exit_code}:\n{self.output()[-3000:]}")
        return self.output()

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
                self._reaped(status, usage)
                raise BenchError(f"worker {self.pid} did not exit within {timeout_s} s")
            time.sleep(0.005)
        self._reaped(status, usage)

    def _reaped(self, status: int, usage: Any) -> None:
        self.exit_code = self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_s = round(usage.ru_utime + usage.ru_stime, 3)
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def stop_all(workers: Sequence[Worker]) -> list[str]:
    """SIGTERM every worker at once, then reap each; their outputs."""
    for w in workers:
        w.terminate()
    return [w.stop() for w in workers]


def kill_leftovers(workers: Sequence[Worker]) -> None:
    for w in workers:
        if w.alive():
            w.kill()


def cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs so far (Linux /proc/stat)."""
    with open("/proc/stat", encoding="ascii") as handle:
        fields = [int(v) for v in handle.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float | None:
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else None


def load_average() -> str:
    return Path("/proc/loadavg").read_text(encoding="ascii").strip()


# -- reading back ---------------------------------------------------------------------------


def read_back(db: str, runs: int, resumes: int) -> dict[str, Any]:
    """Every run ``kit.run_id_of(0..runs-1)`` COMPLETED with W40's result, its log gapless with
    41 completed steps and ``resumes`` RUN_RESUMED, read through a read-only store (which checks
    every event's checksum on the way)."""
    store = open_store(db, read_only=True)
    try:
        rows = {row.run_id: row for row in store.list_runs()}
        wanted = [kit.run_id_of(k) for k in range(runs)]
        if sorted(rows) != wanted:
            raise BenchError(f"the database holds {len(rows)} runs, expected {runs}")
        logs = {run_id: store.load_log(run_id) for run_id in wanted}
    finally:
        store.close()
    by_pid: Counter[int] = Counter()
    first_resumed_s, last_completed_s, steps = float("inf"), 0.0, 0
    for run_id, log in logs.items():
        row = rows[run_id]
        kinds = Counter(e.kind for e in log)
        done = kinds["STEP_COMPLETED"] + kinds["TOOL_COMPLETED"]
        shape = (done, kinds["RUN_RESUMED"], log[-1].kind if log else None)
        if (
            row.status != "COMPLETED"
            or json.loads(row.result_text or "null") != EXPECTED
            or [e.seq for e in log] != list(range(1, len(log) + 1))
            or shape != (STEPS, resumes, "RUN_COMPLETED")
        ):
            raise BenchError(f"run {run_id} is {row.status}, its log {dict(kinds)}")
        steps += kinds["STEP_COMPLETED"] + kinds["TOOL_COMPLETED"]
        for e in log:
            if e.kind == "RUN_RESUMED":
                by_pid[json.loads(e.data or "{}")["pid"]] += 1
                first_resumed_s = min(first_resumed_s, e.at_s)
        last_completed_s = max(last_completed_s, log[-1].at_s)
    return {
        "steps": steps,
        "events": sum(len(log) for log in logs.values()),
        "runs_by_pid": by_pid,
        "first_resumed_s": first_resumed_s,
        "last_completed_s": last_completed_s,
    }


def check_kit_outbox(folder: Path, runs: int) -> int:
    try:
        return kit.check_outbox(folder, runs)
    except kit.ProbeError as exc:
        raise BenchError(f"effects not exactly once: {exc}") from None


def check_keyed_outbox(path: Path, runs: int) -> int:
    """bench/worker_app.py's keyed outbox: no key twice, and every run's 40 tool calls once
    each. Returns the number of effects."""
    lines = path.read_text(encoding="utf-8").splitlines()
    keys = Counter(line.split("\t", 1)[0] for line in lines)
    effects = Counter(line.split("\t", 1)[1] for line in lines)
    wanted = Counter(f"{i}\t{kit.topic_of(k)}" for k in range(runs) for i in range(TOOL_CALLS))
    if any(n != 1 for n in keys.values()) or effects != wanted:
        raise BenchError(
            f"the outbox is not one line per tool call: {sum((wanted - effects).values())} "
            f"missing, {sum((effects - wanted).values())} extra"
        )
    return len(lines)


# -- part 1: workers ------------------------------------------------------------------------


def probe_argv(command: str, folder: Path, db: str, runs: int, *extra: Any) -> list[str]:
    """``durabl_probe.py COMMAND`` on ``db``, durability "full", kit's tool in ``folder``."""
    return harness.peer_argv(
        "durabl", command, "--work", folder, "--db", db, "--runs", runs, "--mode", "full", *extra
    )


def drain_once(
    work: Path, server: Server, backend: str, workers: int, rep: int, plan: Plan
) -> dict[str, Any]:
    """One sample: ``plan.worker_runs`` runs left RUNNING, drained by ``workers`` fresh worker
    processes on a fresh database, started at one instant (the gate)."""
    folder = work / f"workers-{backend}-{workers}w-{rep}"
    runs = plan.worker_runs
    with database(server, backend, folder) as (db, _):
        made = json.loads(
            run_probe(probe_argv("create", folder, db, runs, "--concurrency", 1), "durabl", 120)
        )
        if len(made) != runs:
            raise BenchError(f"the setup process made {len(made)} runs, expected {runs}")
        serve = ("--concurrency", plan.worker_concurrency, "--poll-s", POLL_S, "--gate")
        env = harness.peer_env("durabl")
        spawned_s = time.time()
        pool = [
            Worker(
                probe_argv("serve", folder, db, runs, *serve), env, folder / f"w{i}.log", gated=True
            )
            for i in range(workers)
        ]
        try:
            for w in pool:
                w.wait_ready()
            ticks = cpu_ticks()
            gate_s = time.time()
            for w in pool:
                w.open_gate()
            wait_completed(db, pool, runs, plan.timeout_s)
            busy = busy_share(ticks, cpu_ticks())
            outputs = stop_all(pool)
        finally:
            kill_leftovers(pool)
        checked = read_back(db, runs, resumes=1)
    effects = check_kit_outbox(folder / "outbox", runs)
    stats = [last_json(text) or {} for text in outputs]
    if sum(s.get("completed", 0) for s in stats) != runs or any(s.get("errors") for s in stats):
        raise BenchError(f"the workers report {stats}")
    return throughput_sample(rep, runs, checked, effects, spawned_s, gate_s, pool, stats, busy)


def wait_completed(db: str, pool: Sequence[Worker], runs: int, timeout_s: float) -> None:
    """Until all ``runs`` runs are COMPLETED, looking through a read-only store; a run in any
    state but RUNNING or COMPLETED, a worker that exits, or the timeout is an error."""
    store = open_store(db, read_only=True)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            counts = Counter(row.status for row in store.list_runs())
            if counts["COMPLETED"] == runs:
                return
            stray = {k: v for k, v in counts.items() if k not in ("RUNNING", "COMPLETED")}
            exited = [w.pid for w in pool if not w.alive()]
            if stray or exited or time.monotonic() > deadline:
                raise BenchError(f"{dict(counts)} of {runs} runs; exited workers {exited}")
            time.sleep(0.05)
    finally:
        store.close()


def throughput_sample(
    rep: int,
    runs: int,
    checked: dict[str, Any],
    effects: int,
    spawned_s: float,
    gate_s: float,
    pool: Sequence[Worker],
    stats: Sequence[dict[str, Any]],
    busy: float | None,
) -> dict[str, Any]:
    steps, last_s = checked["steps"], checked["last_completed_s"]
    span_s = last_s - checked["first_resumed_s"]
    return {
        "rep": rep,
        "runs": runs,
        "steps": steps,
        "effects": effects,
        "wall_s": round(last_s - gate_s, 4),
        "steps_per_s": round(steps / (last_s - gate_s), 1),
        "log_span_s": round(span_s, 4),
        "log_span_steps_per_s": round(steps / span_s, 1),
        "end_to_end_steps_per_s": round(steps / (last_s - spawned_s), 1),
        "startup_s": round(gate_s - spawned_s, 3),
        "runs_by_worker": [checked["runs_by_pid"].get(w.pid, 0) for w in pool],
        "completed_by_worker": [s.get("completed") for s in stats],
        "cpu_s_by_worker": [w.cpu_s for w in pool],
        "machine_cpu_busy": busy,
    }


def measure_workers(work: Path, server: Server, plan: Plan) -> list[dict[str, Any]]:
    """Rounds of one sample of every (backend, workers) configuration, in rotated orders."""
    configs = [(b, n) for b in BACKENDS for n in plan.worker_counts]
    samples: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configs}
    done, total = 0, len(configs) * plan.throughput_reps
    for rep, order in enumerate(rotations(configs, plan.throughput_reps)):
        for backend, workers in order:
            s = drain_once(work, server, backend, workers, rep, plan)
            samples[(backend, workers)].append(s)
            done += 1
            say(
                f"  [{done}/{total}] {backend:<8} {workers} worker(s): {s['steps_per_s']:>6.0f} "
                f"steps/s, runs per worker {s['runs_by_worker']}, CPUs busy "
                f"{s['machine_cpu_busy']}"
            )
    return [workers_cell(b, n, samples[(b, n)], samples[(b, 1)], plan) for b, n in configs]


def workers_cell(
    backend: str, workers: int, ss: list[dict[str, Any]], alone: list[dict[str, Any]], plan: Plan
) -> dict[str, Any]:
    rates = [s["steps_per_s"] for s in ss]
    median = statistics.median(rates)

    def median_of(key: str) -> float:
        return round(statistics.median(s[key] for s in ss), 1)

    return {
        "kind": "workers",
        "runtime": "durabl",
        "backend": backend,
        "mode": "full",
        "workers": workers,
        "worker_concurrency": plan.worker_concurrency,
        "poll_s": POLL_S,
        "runs": plan.worker_runs,
        "steps_per_s": summary(rates, 1),
        "steps_per_s_median": round(median, 1),
        "steps_per_s_samples": rates,
        "log_span_steps_per_s_median": median_of("log_span_steps_per_s"),
        "end_to_end_steps_per_s_median": median_of("end_to_end_steps_per_s"),
        "speedup_vs_1_worker": round(
            median / statistics.median(s["steps_per_s"] for s in alone), 3
        ),
        "cpu_ms_per_step_median": round(
            statistics.median(sum(s["cpu_s_by_worker"]) / s["steps"] for s in ss) * 1e3, 3
        ),
        "machine_cpu_busy_median": statistics.median(s["machine_cpu_busy"] or 0 for s in ss),
        "steps_counted": [s["steps"] for s in ss],
        "effects_counted": [s["effects"] for s in ss],
        "effects_exactly_once": True,
        "samples": ss,
    }


# -- part 2: takeover after SIGKILL ---------------------------------------------------------

SETUP = """
import json, sys
from bench.throughput_peers import kit
from bench.workload import w40
from durabl import Runtime
from durabl.crashpoints import AFTER_RUN_STARTED, CrashAt, ProcessDeath
made = []
with Runtime(sys.argv[1]) as rt:
    for k in map(int, sys.argv[2:]):
        try:
            with CrashAt(AFTER_RUN_STARTED):
                rt.start(w40, {"topic": kit.topic_of(k)}, run_id=kit.run_id_of(k))
        except ProcessDeath:
            made.append(kit.run_id_of(k))
print(json.dumps(made))
"""
"""Creates runs ``kit.run_id_of(k)`` and leaves each RUNNING with this (soon dead) process as
its lease owner; with no k, only the schema."""

SERVE = """
import sys
from durabl import Runtime, cli
db, app, poll, lease_s = sys.argv[1:5]
options = cli.load_modules([app])
args = cli.build_parser().parse_args(["--db", db, "worker", "--poll", poll, "--concurrency", "1"])
with Runtime(db, lease_s=float(lease_s), **options) as rt:
    raise SystemExit(args.handler(args, rt))
"""
"""``durabl worker`` on a runtime with the given lease, which the command line has no flag for:
its own parser picks the worker command's handler, called the way its ``main`` calls it."""

ELSEWHERE = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', OTHER_HOST]
"""Runs a command under another host name, in a UTS namespace of its own (root only)."""


def elsewhere_problem() -> str | None:
    """Why a worker cannot be run under another host name here, or None if it can."""
    try:
        done = subprocess.run([*ELSEWHERE, "hostname"], capture_output=True, text=True, timeout=10)
    except OSError as exc:
        return f"unshare: {exc}"
    if done.returncode != 0 or done.stdout.strip() != OTHER_HOST:
        return f"unshare --uts failed (it needs root): {done.stderr.strip()[-300:]}"
    return None


@dataclass(frozen=True)
class Kill:
    """One SIGKILL (or SIGSTOP) of the worker driving a run, and what stood at that instant."""

    killed: Worker
    killed_s: float  # wall clock, as the log's times
    kill_after_s: float  # after the pickup
    steps_done: int
    lease_expires_s: float | None
    tries: int  # SIGSTOPs until one froze the worker between two transactions


class Takeover:
    """One takeover case: two workers on a fresh database, one slow run per repetition."""

    def __init__(
        self,
        folder: Path,
        db: str,
        plan: Plan,
        case: TakeoverCase,
        rng: random.Random,
        server: Server,
    ) -> None:
        self.folder, self.db, self.plan, self.case, self.rng = folder, db, plan, case, rng
        self.server = server
        self.outbox = folder / "outbox.txt"
        self.outbox.touch()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DURABL_BENCH_")}
        self.env |= {
            "PYTHONPATH": str(REPO),
            OUTBOX_ENV: str(self.outbox),
            SLEEP_ENV: repr(plan.step_sleep_s),
        }
        self.pool: list[Worker] = []  # the live workers
        self.every: list[Worker] = []
        self.hosts: dict[int, str] = {}  # pid -> the host name it runs under

    def create(self, *ks: int) -> None:
        argv = [sys.executable, "-c", SETUP, self.db, *map(str, ks)]
        made = json.loads(run_probe(argv, "durabl", 120) or "[]")
        if len(made) != len(ks):
            raise BenchError(f"the setup process made {made}")

    def spawn(self, elsewhere: bool) -> Worker:
        case = self.case
        argv = [sys.executable, "-c", SERVE, self.db, APP, str(case.poll_s), str(case.lease_s)]
        log = self.folder / f"worker-{len(self.every)}.log"
        w = Worker([*ELSEWHERE, *argv] if elsewhere else argv, self.env, log)
        self.hosts[w.pid] = OTHER_HOST if elsewhere else HOST
        self.pool.append(w)
        self.every.append(w)
        return w

    def settle(self) -> None:
        """Past the workers' first look for runs: idle."""
        time.sleep(min(self.case.poll_s, 0.3))

    def measure(self) -> dict[str, Any]:
        case, samples = self.case, []
        self.create()  # the schema, before the workers and the monitor open the database
        mon = Monitor(self.db)
        try:
            for elsewhere in (case.other_host, False):
                self.spawn(elsewhere).wait_ready()
            self.settle()
            for rep in range(case.reps):
                sample, gone = self.once(mon, rep)
                samples.append(sample)
                say(
                    f"  {case.label} [{rep + 1}/{case.reps}]: {sample['death']} after "
                    f"{sample['steps_done_at_kill']} steps; first new step "
                    f"{sample['latency_s'] * 1e3:.0f} ms after it"
                )
                # The next driver's replacement comes up on the host of the one that is gone.
                self.spawn(self.hosts[gone.pid] == OTHER_HOST).wait_ready()
                self.settle()
            stop_all(self.pool)
        finally:
            mon.close()
            kill_leftovers(self.every)
        read_back(self.db, case.reps, resumes=2)
        effects = check_keyed_outbox(self.outbox, case.reps)
        return takeover_cell(case, self.plan, samples, effects)

    def once(self, mon: Monitor, rep: int) -> tuple[dict[str, Any], Worker]:
        """Create a slow run, stop the worker that picks it up mid-step (SIGKILL, or SIGSTOP
        until the other has taken over), time the takeover."""
        run_id = kit.run_id_of(rep)
        self.create(rep)
        # Driving, not merely holding the lease: a worker may claim a run a moment before it
        # drives it, and one stopped in between would leave nothing to take over.
        first = wait_for(f"a worker to drive run {run_id}", lambda: mon.resumes(run_id))
        picked_up_s, pid = first[0][1], first[0][2]["pid"]
        driver = next((w for w in self.pool if w.pid == pid), None)
        standby = next((w for w in self.pool if w.pid != pid), None)
        if driver is None or standby is None:
            raise BenchError(f"run {run_id} was taken by pid {pid}, not a worker of the pool")
        kill = self.stop_mid_step(mon, run_id, driver, picked_up_s)
        taken = wait_for(
            f"the idle worker to take run {run_id} over",
            lambda: self.holder(mon, run_id, {standby.pid}),
            self.plan.timeout_s,
        )
        resumes = wait_for(
            f"the survivor's RUN_RESUMED in run {run_id}",
            lambda: (r := mon.resumes(run_id)) and len(r) >= 2 and r,
        )
        seq, _, boundary = resumes[1]
        if boundary["pid"] != standby.pid:
            raise BenchError(f"run {run_id} was taken over by {boundary['pid']}")
        stepped = wait_for(
            f"the survivor's first step in run {run_id}", lambda: mon.completed_steps(run_id, seq)
        )
        if self.case.death == "hang":
            driver.kill()  # its part is over: it held its lease, alive, until the lease ran out
        wait_for(f"run {run_id} to complete", lambda: mon.run(run_id).status == "COMPLETED")
        sample = self.sample(rep, kill, taken.expires_s - self.case.lease_s, stepped[0][1])
        sample["first_step_after_create_s"] = round(picked_up_s - mon.log(run_id)[0].at_s, 4)
        sample["steps_replayed_by_taker"] = boundary.get("replayed")
        sample["taker_host"] = boundary.get("host")
        return sample, driver

    def holder(self, mon: Monitor, run_id: str, pids: set[int]) -> Lease | None:
        """The run's lease if one of ``pids`` holds it. A lease taken (not yet renewed)
        expires ``lease_s`` after the moment it was taken, by the taker's clock."""
        lease = mon.run(run_id).lease
        return lease if lease is not None and lease.pid in pids else None

    def stop_mid_step(self, mon: Monitor, run_id: str, driver: Worker, picked_up_s: float) -> Kill:
        # A delay spread evenly over one poll interval puts the kill at a uniformly random
        # instant of the idle worker's polling cycle (and, mostly, inside a tool call's sleep).
        kill_after_s = self.plan.kill_after_s + self.rng.uniform(0, self.case.poll_s)
        time.sleep(max(0.0, picked_up_s + kill_after_s - time.time()))
        steps_done = len(mon.completed_steps(run_id))
        row = mon.run(run_id)
        if row.status != "RUNNING" or steps_done >= STEPS:
            raise BenchError(f"run {run_id} finished before the kill")
        if self.case.death == "hang":
            killed_s, tries = self.freeze_between_transactions(driver)
        else:
            killed_s, tries = time.time(), 1
            driver.kill()
        self.pool.remove(driver)
        expires_s = None if row.lease is None else row.lease.expires_s
        return Kill(driver, killed_s, kill_after_s, steps_done, expires_s, tries)

    def freeze_between_transactions(self, driver: Worker) -> tuple[float, int]:
        """SIGSTOP ``driver`` at an instant when none of its sessions is inside a transaction:
        when it was, SIGCONT and try again. Returns when it froze and the tries it took. A
        worker frozen inside a transaction keeps its run's row locked (the log's trigger takes
        that lock first), and the takeover then waits on the lock, without a timeout, for as
        long as the freeze lasts: a hang, not a latency, so it is not what this case times."""
        name = session_name(self.hosts[driver.pid], driver.pid)
        for tries in range(1, 51):
            frozen_s = time.time()
            os.kill(driver.pid, signal.SIGSTOP)
            time.sleep(0.02)  # a statement sent before the stop finishes; a transaction stays
            if self.case.backend != "postgres" or not self.server.in_transaction(name):
                return frozen_s, tries
            os.kill(driver.pid, signal.SIGCONT)
            time.sleep(self.rng.uniform(0.0, 0.01))
        raise BenchError(f"worker {driver.pid} was inside a transaction at 50 tries to freeze it")

    def sample(self, rep: int, kill: Kill, taken_s: float, first_step_s: float) -> dict[str, Any]:
        left = None if kill.lease_expires_s is None else kill.lease_expires_s - kill.killed_s
        return {
            "rep": rep,
            "death": "SIGSTOP" if self.case.death == "hang" else "SIGKILL",
            "latency_s": round(first_step_s - kill.killed_s, 4),
            "lease_taken_s": round(taken_s - kill.killed_s, 4),
            "kill_after_pickup_s": round(kill.kill_after_s, 4),
            "steps_done_at_kill": kill.steps_done,
            "lease_left_at_kill_s": None if left is None else round(left, 3),
            "stop_tries": kill.tries,
            "killed_pid": kill.killed.pid,
            "killed_host": self.hosts[kill.killed.pid],
        }


def takeover_cell(
    case: TakeoverCase, plan: Plan, ss: list[dict[str, Any]], effects: int
) -> dict[str, Any]:
    """The case's figures, and what bounded its latency, read from the samples: a survivor
    that took over before the lease ran out was told at once that the owner was gone (its pid,
    or its sessions on the server), and found out at its next look for runs."""
    latencies = [s["latency_s"] for s in ss]
    taken = [s["lease_taken_s"] for s in ss]
    lease_left = [s["lease_left_at_kill_s"] for s in ss if s["lease_left_at_kill_s"] is not None]
    waited = [
        s["lease_taken_s"] - s["lease_left_at_kill_s"] for s in ss if s["lease_left_at_kill_s"]
    ]
    before_expiry = all(w < 0 for w in waited) and len(waited) == len(ss)
    after_expiry = all(w >= 0 for w in waited) and len(waited) == len(ss)
    return {
        "kind": "takeover",
        "runtime": "durabl",
        "backend": case.backend,
        "mode": "full",
        "label": case.label,
        "measured": True,
        "death": "SIGSTOP" if case.death == "hang" else "SIGKILL",
        "stopped": "SIGSTOP at an instant when none of its sessions was inside a transaction "
        "(retried otherwise: stop_tries), SIGKILLed after the takeover"
        if case.death == "hang"
        else "SIGKILL, reaped at once",
        "poll_s": case.poll_s,
        "lease_s": case.lease_s,
        "other_host": case.other_host,
        "standby": "running",
        "reps": case.reps,
        "step_sleep_s": plan.step_sleep_s,
        "latency_s": summary(latencies),
        "latency_s_median": round(statistics.median(latencies), 4),
        "latency_s_p95": summary(latencies)["p95"],
        "lease_taken_s": summary(taken),
        "lease_taken_max_over_poll": round(max(taken) / case.poll_s, 3),
        "first_step_after_create_s": summary([s["first_step_after_create_s"] for s in ss]),
        "lease_left_at_kill_s": summary(lease_left, 3) if lease_left else None,
        "lease_taken_after_expiry_s": summary(waited) if waited else None,
        "taken_over_before_lease_expiry": before_expiry,
        "taken_over_after_lease_expiry": after_expiry,
        "bound": "the lease's expiry, then the survivor's next look for runs"
        if after_expiry
        else "the survivor's next look for runs (poll_s): the owner was known gone at once"
        if before_expiry
        else "mixed",
        "effects": effects,
        "effects_exactly_once": True,
        "logs_gapless": True,
        "samples": ss,
    }


def measure_takeover(work: Path, server: Server, plan: Plan) -> list[dict[str, Any]]:
    rng = random.Random(7)
    problem = elsewhere_problem() if any(c.other_host for c in plan.takeover) else None
    cells = []
    for case in plan.takeover:
        if case.other_host and problem:
            say(f"  {case.label}: not measured: {problem}")
            cells.append({"kind": "takeover", "label": case.label, "backend": case.backend,
                          "other_host": True, "death": case.death, "measured": False,
                          "why": problem})  # fmt: skip
            continue
        slug = re.sub(r"[^a-z0-9]+", "-", case.label.lower()).strip("-")
        with database(server, case.backend, work / f"takeover-{slug}") as (db, _):
            cells.append(Takeover(work / f"takeover-{slug}", db, plan, case, rng, server).measure())
    return cells


# -- part 3: per-step overhead and the floor ------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One side of the per-step comparison: a runtime on a backend in one durability mode
    ("default" and "sync_off" for DBOS; "column" says which of durabl's modes it stands
    beside)."""

    runtime: str
    backend: str
    mode: str
    column: str

    @property
    def label(self) -> str:
        return f"{self.runtime}-{self.backend}-{self.mode}"


DBOS_MODES = {"default": "full", "sync_off": "process"}
FLOOR = Config("floor", "postgres", "insert", "full")


def overhead_configs(runtimes: Sequence[str]) -> list[Config]:
    found = [
        Config("durabl", backend, mode, mode)
        for backend in BACKENDS
        for mode in ("full", "process")
        if "durabl" in runtimes
    ]
    if "dbos" in runtimes:
        found += [Config("dbos", "postgres", mode, col) for mode, col in DBOS_MODES.items()]
    return [*found, FLOOR]


class Overhead:
    """Rounds of every probe and the floor, and what went wrong with DBOS, if anything."""

    def __init__(self, work: Path, server: Server, plan: Plan, runtimes: Sequence[str]) -> None:
        self.work, self.server, self.plan = work, server, plan
        self.configs = overhead_configs(runtimes)
        self.samples: dict[str, list[dict[str, Any]]] = {c.label: [] for c in self.configs}
        self.dbos: dict[str, Any] = {"measured": False, "why": "excluded by --runtimes"}
        if "dbos" in runtimes:
            python = harness.peer_interpreter("dbos")
            self.dbos = {"measured": True, "why": None, "interpreter": str(python)}
            if not python.exists():
                self.fail_dbos(f"no virtualenv: {python} is missing (make bench-peers builds it)")

    def fail_dbos(self, why: str) -> None:
        say(f"  DBOS not measured: {why.splitlines()[0] if why else why}")
        self.dbos = {"measured": False, "why": why}
        self.configs = [c for c in self.configs if c.runtime != "dbos"]

    def run(self) -> list[dict[str, Any]]:
        for rep, order in enumerate(rotations(self.configs, self.plan.overhead_rounds)):
            for config in order:
                if config not in self.configs:  # DBOS failed earlier in this round
                    continue
                self.once(config, rep)
            say(f"  round {rep + 1}/{self.plan.overhead_rounds}: " + ", ".join(self.progress()))
        floors = floor_cells(self.samples[FLOOR.label])
        return [
            *[overhead_cell(c, self.samples[c.label], self.plan, floors) for c in self.configs
              if c != FLOOR and self.samples[c.label]],
            *floors.values(),
        ]  # fmt: skip

    def progress(self) -> list[str]:
        out = []
        for c in self.configs:
            if c != FLOOR and self.samples[c.label]:
                last = self.samples[c.label][-1]
                out.append(f"{c.label} {last['warm_median_us']:.0f}")
        return out

    def once(self, config: Config, rep: int) -> None:
        folder = self.work / f"overhead-{config.label}-{rep}"
        if config == FLOOR:
            self.samples[FLOOR.label].append(floor_once(self.server, rep, self.plan.floor_inserts))
            return
        try:
            with database(self.server, config.backend, folder) as (db, name):
                sample = self.probe(config, folder, db, rep)
                if name is not None:
                    commits = self.server.transactions(name)
                    steps = sample["runs"] * STEPS
                    sample["server_transactions_per_step"] = (
                        None if commits is None else round(commits / steps, 3)
                    )
        except BenchError as exc:
            if config.runtime != "dbos":
                raise
            self.fail_dbos(str(exc))
            return
        self.samples[config.label].append(sample)

    def probe(self, config: Config, folder: Path, db: str, rep: int) -> dict[str, Any]:
        plan = self.plan
        runs = plan.warmup_pairs + plan.warm_pairs
        url = db + SYNC_OFF if config.mode == "sync_off" else db
        mode = config.mode if config.runtime == "durabl" else "default"
        argv = harness.peer_argv(
            config.runtime, "overhead", "--work", folder, "--db", url,
            "--concurrency", 1, "--runs", runs, "--mode", mode,
        )  # fmt: skip
        out = json.loads(run_probe(argv, config.runtime, plan.timeout_s).strip().splitlines()[-1])
        wrong = {
            k: (out[k], want)
            for k, want in (("steps", runs * STEPS), ("effects", runs * TOOL_CALLS))
            if out[k] != want
        }
        if wrong or out["first_result"] != EXPECTED:
            raise BenchError(f"{config.label}: found != wanted: {wrong or out['first_result']}")
        pairs = out["pairs"]
        per_step = [
            round((r - p) / STEPS / 1e3, 2)
            for r, p in zip(pairs["run_ns"], pairs["plain_ns"], strict=True)
        ]
        return {
            "rep": rep,
            "runs": runs,
            "steps": out["steps"],
            "effects": out["effects"],
            "plain_ns": pairs["plain_ns"],
            "run_ns": pairs["run_ns"],
            "us_per_step": per_step,
            "warm_median_us": statistics.median(per_step[plan.warmup_pairs :]),
            "version": out["version"],
            "durability": out["durability"],
        }


def floor_once(server: Server, rep: int, inserts: int) -> dict[str, Any]:
    """``inserts`` raw INSERTs of a step-sized row, each its own autocommitted transaction, in
    a fresh database: with synchronous_commit on (each waits for the WAL flush), then off."""
    name = server.create()
    times: dict[str, list[float]] = {}
    try:
        url = server.url_of(name)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(FLOOR_TABLE)
        for column, sync in (("full", "on"), ("process", "off")):
            with psycopg.connect(
                url, autocommit=True, options=f"-c synchronous_commit={sync}"
            ) as conn:
                row = conn.execute("SHOW synchronous_commit").fetchone()
                if row is None or row[0] != sync:
                    raise BenchError(f"synchronous_commit is {row}, not {sync}")
                taken = []
                for i in range(inserts):
                    t0 = time.perf_counter_ns()
                    conn.execute(FLOOR_INSERT, (f"{column}-{rep}", i, i, FLOOR_ROW, time.time()))
                    taken.append(round((time.perf_counter_ns() - t0) / 1e3, 1))
                times[column] = taken
    finally:
        server.drop(name)
    return {"rep": rep, "us": times}


def floor_cells(ss: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    cells = {}
    for column, sync in (("full", "on"), ("process", "off")):
        pooled = [t for s in ss for t in s["us"][column]]
        cells[column] = {
            "kind": "floor",
            "runtime": "psycopg",
            "backend": "postgres",
            "mode": f"synchronous_commit={sync}",
            "column": column,
            "label": f"floor-postgres-{column}",
            "statement": "one INSERT of a step-sized row (~200-byte data) into an events-like "
            "table keyed (run_id, seq), autocommitted",
            "payload_bytes": len(FLOOR_ROW),
            "us": summary(pooled, 1),
            "us_median": round(statistics.median(pooled), 1),
            "us_p95": summary(pooled, 1)["p95"],
            "samples": [s["us"][column] for s in ss],
        }
    return cells


def overhead_cell(
    config: Config, ss: list[dict[str, Any]], plan: Plan, floors: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    warm = [v for s in ss for v in s["us_per_step"][plan.warmup_pairs :]]
    median = round(statistics.median(warm), 1)
    floor = floors[config.column]["us_median"] if config.backend == "postgres" else None
    per_txn = [s.get("server_transactions_per_step") for s in ss]
    known = [v for v in per_txn if v is not None]
    return {
        "kind": "overhead",
        "runtime": config.runtime,
        "backend": config.backend,
        "mode": config.mode,
        "column": config.column,
        "label": config.label,
        "us_per_step": summary(warm, 1),
        "us_per_step_median": median,
        "us_per_step_p95": summary(warm, 1)["p95"],
        "per_probe_median_us": [round(s["warm_median_us"], 1) for s in ss],
        "plain_loop_us_per_step_median": round(
            statistics.median(p / STEPS / 1e3 for s in ss for p in s["plain_ns"]), 2
        ),
        "run_ms_median": round(statistics.median(r / 1e6 for s in ss for r in s["run_ns"]), 3),
        "warmup_pairs": plan.warmup_pairs,
        "warm_pairs_per_probe": plan.warm_pairs,
        "probes": len(ss),
        "version": ss[0]["version"],
        "durability": ss[0]["durability"],
        "server_transactions_per_step_median": statistics.median(known) if known else None,
        "floor_us_median": floor,
        "ratio_to_floor": None if floor is None else round(median / floor, 2),
        "samples": ss,
    }


# -- the run --------------------------------------------------------------------------------


def measure(
    work: Path, quick: bool, runtimes: Sequence[str] = RUNTIMES, server_url: str = SERVER
) -> Report:
    plan = QUICK if quick else FULL
    server = Server(server_url)
    load = {"before": load_average()}
    try:
        report: Report = {
            **harness.header("postgres", SCHEMA, quick, work, plan.fsync_samples),
            "postgres": server.info(),
            "workload": workload(plan),
            "runtimes": list(runtimes),
            "repetitions": {
                "workers": plan.throughput_reps,
                "takeover": {case.label: case.reps for case in plan.takeover},
                "overhead_rounds": plan.overhead_rounds,
            },
        }
        say(f"[1/3] {plan.worker_counts} worker processes, {plan.worker_runs} runs; scratch {work}")
        cells = measure_workers(work, server, plan)
        load["after_workers"] = load_average()
        say("[2/3] takeover after SIGKILL")
        cells += measure_takeover(work, server, plan)
        load["after_takeover"] = load_average()
        say(f"[3/3] per-step overhead: {plan.overhead_rounds} round(s)")
        overhead = Overhead(work, server, plan, runtimes)
        cells += overhead.run()
        load["after"] = load_average()
        report["postgres"]["other_sessions_at_end"] = server.sessions()
    finally:
        server.close()
    report["dbos"] = overhead.dbos
    report["cells"] = cells
    report["summary"] = summarise(cells)
    report["checks"] = checks(cells, plan)
    report["load"] = load
    report["notes"] = notes(report)
    return report


def workload(plan: Plan) -> dict[str, Any]:
    return {
        "model_calls": 1,
        "tool_calls": TOOL_CALLS,
        "steps_per_run": STEPS,
        "tool_mode": "IDEMPOTENT",
        "workers_tool": "kit's outbox: appends one line to its run's own file",
        "takeover_tool": "bench/worker_app.py's outbox, keyed by durabl's idempotency key, "
        f"sleeping {plan.step_sleep_s} s in each call",
        "worker_runs": plan.worker_runs,
        "worker_concurrency": plan.worker_concurrency,
        "worker_poll_s": POLL_S,
        "lease_s": LEASE_S,
        "rate": "steps completed (counted from the log) / wall time from the gate that starts "
        "every worker at once to the last RUN_COMPLETED",
        "takeover_latency": "from the SIGKILL (or SIGSTOP) to the survivor's first "
        "STEP_COMPLETED, by the log's clock; lease_taken_s: to the moment it took the lease "
        "(its lease's expiry less lease_s)",
        "overhead": "(W40 run - plain loop) / 41 per pair, warm pairs only, pooled over probes",
        "floor": "one raw autocommitted INSERT through psycopg on the same server",
    }


def summarise(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures, each read from its cell (the cells have the samples)."""
    workers = {
        b: {str(c["workers"]): c["steps_per_s_median"] for c in cells
            if c["kind"] == "workers" and c["backend"] == b}
        for b in BACKENDS
    }  # fmt: skip
    over = {c["label"]: c["us_per_step_median"] for c in cells if c["kind"] == "overhead"}
    floor = {c["column"]: c["us_median"] for c in cells if c["kind"] == "floor"}
    ratios: dict[str, float] = {}
    for mode in ("full", "process"):
        pg, lite = over.get(f"durabl-postgres-{mode}"), over.get(f"durabl-sqlite-{mode}")
        dbos = over.get(f"dbos-postgres-{'default' if mode == 'full' else 'sync_off'}")
        if pg and lite:
            ratios[f"durabl_postgres_over_sqlite_{mode}"] = round(pg / lite, 2)
        if pg and dbos:
            ratios[f"durabl_postgres_over_dbos_{mode}"] = round(pg / dbos, 2)
        if pg and floor.get(mode):
            ratios[f"durabl_postgres_{mode}_over_floor"] = round(pg / floor[mode], 2)
    return {
        "workers_steps_per_s": workers,
        "postgres_over_sqlite_steps_per_s": {
            n: round(rate / workers["sqlite"][n], 3)
            for n, rate in workers["postgres"].items()
            if workers["sqlite"].get(n)
        },
        "takeover_latency_s_median": {
            c["label"]: c["latency_s_median"]
            for c in cells
            if c["kind"] == "takeover" and c["measured"]
        },
        "overhead_us_per_step_median": over,
        "floor_us_median": floor,
        "ratios": ratios,
    }


def checks(cells: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    workers = [c for c in cells if c["kind"] == "workers"]
    takeovers = [c for c in cells if c["kind"] == "takeover" and c["measured"]]
    return {
        "steps_counted": all(
            n == plan.worker_runs * STEPS for c in workers for n in c["steps_counted"]
        ),
        "effects_exactly_once": all(c["effects_exactly_once"] for c in workers + takeovers),
        "logs_gapless": all(c.get("logs_gapless", True) for c in workers + takeovers),
        # A dead owner on this host is seen gone at once; a hung one holds its lease to the end.
        "same_host_kills_taken_over_before_lease_expiry": all(
            c["taken_over_before_lease_expiry"]
            for c in takeovers
            if not c["other_host"] and c["death"] == "SIGKILL"
        ),
        "hung_owners_kept_their_leases_to_expiry": all(
            c["taken_over_after_lease_expiry"] for c in takeovers if c["death"] == "SIGSTOP"
        ),
    }


def notes(report: Report) -> list[str]:
    load, cpus = report["load"], report["machine"]["cpu_count"] or 1
    before = float(load["before"].split()[0])
    found = [
        f"load average (1, 5, 15 min) {load['before']} before the run and {load['after']} "
        f"after it, on {cpus} CPUs; the later figures include this benchmark's own load",
        f"{report['postgres']['other_sessions_at_start']} other client sessions were open on "
        f"the server at the start, {report['postgres']['other_sessions_at_end']} at the end",
    ]
    if before >= 0.5 * cpus or report["postgres"]["other_sessions_at_start"]:
        found.append(
            "the machine was busy when the run started (other work on its CPUs or its "
            "PostgreSQL server): the figures carry that noise"
        )
    if not report["dbos"]["measured"]:
        found.append(f"DBOS was not measured: {report['dbos']['why']}")
    return found


# -- the printed summary --------------------------------------------------------------------


def render(report: Report) -> str:
    pg = report["postgres"]
    settings = ", ".join(f"{k}={v}" for k, v in pg["settings"].items() if k in SETTINGS[:4])
    lines = [
        f"PostgreSQL {pg['version']} ({settings}) against SQLite, W40{harness.quick_mark(report)}",
        harness.machine_line(report["machine"]),
        f"  fsync of a 4 KiB append here: {report['machine']['fsync_us_median']:g} us median; "
        f"load {report['load']['before']} -> {report['load']['after']}",
        *_workers_lines(report["cells"]),
        *_takeover_lines(report["cells"]),
        *_overhead_lines(report),
        "",
        "Checks: " + ", ".join(f"{k} {v}" for k, v in report["checks"].items()),
    ]
    return "\n".join(lines)


def _workers_lines(cells: list[dict[str, Any]]) -> list[str]:
    rows = [c for c in cells if c["kind"] == "workers"]
    lines = [
        "",
        f"Worker processes (concurrency {rows[0]['worker_concurrency']} each, poll "
        f"{rows[0]['poll_s']:g} s), {rows[0]['runs']} runs: steps/s from the gate to the last "
        f"completion, median of {rows[0]['steps_per_s']['n']}",
        f"  {'backend':<10}{'workers':>8}{'steps/s':>9}{'min-max':>14}{'speedup':>9}"
        f"{'CPU ms/step':>13}{'CPUs busy':>11}   (workers' CPU, start-up included)",
    ]
    for c in rows:
        s = c["steps_per_s"]
        lines.append(
            f"  {c['backend']:<10}{c['workers']:>8}{c['steps_per_s_median']:>9.0f}"
            f"{s['min']:>8.0f}-{s['max']:<5.0f}{c['speedup_vs_1_worker']:>9.2f}"
            f"{c['cpu_ms_per_step_median']:>13.3f}{c['machine_cpu_busy_median']:>11.2f}"
        )
    return lines


def _takeover_lines(cells: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        "Takeover (stop -> the survivor's first committed step; -> its taking the lease beside)",
        f"  {'case':<38}{'reps':>5}{'median ms':>11}{'p95 ms':>9}{'lease ms':>10}"
        f"{'lease left':>12}  bound",
    ]
    for c in (c for c in cells if c["kind"] == "takeover"):
        if not c["measured"]:
            lines.append(f"  {c['label']:<38} not measured: {c['why']}")
            continue
        left = c["lease_left_at_kill_s"]
        lines.append(
            f"  {c['label']:<38}{c['reps']:>5}{c['latency_s']['median'] * 1e3:>11.0f}"
            f"{c['latency_s']['p95'] * 1e3:>9.0f}{c['lease_taken_s']['median'] * 1e3:>10.0f}"
            f"{'' if left is None else format(left['min'], '.1f') + ' s':>12}  "
            f"{c['bound'].split(':')[0]}"
        )
    return lines


def _overhead_lines(report: Report) -> list[str]:
    cells = report["cells"]
    lines = [
        "",
        "Per-step overhead over the plain loop, one process (us; warm pairs pooled)",
        f"  {'side':<28}{'median':>9}{'p95':>9}{'x floor':>9}{'txn/step':>10}  probe medians",
    ]
    for c in (c for c in cells if c["kind"] == "overhead"):
        ratio = "-" if c["ratio_to_floor"] is None else f"{c['ratio_to_floor']:.1f}"
        txn = c["server_transactions_per_step_median"]
        lines.append(
            f"  {c['label']:<28}{c['us_per_step_median']:>9.0f}{c['us_per_step_p95']:>9.0f}"
            f"{ratio:>9}{'-' if txn is None else f'{txn:.2f}':>10}  "
            f"{' '.join(f'{v:.0f}' for v in c['per_probe_median_us'])}"
        )
    for c in (c for c in cells if c["kind"] == "floor"):
        lines.append(
            f"  {c['label'] + ' (' + c['mode'] + ')':<28}{c['us_median']:>9.0f}{c['us_p95']:>9.0f}"
        )
    if not report["dbos"]["measured"]:
        lines.append(f"  DBOS not measured: {report['dbos']['why']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--runtimes",
        default=",".join(RUNTIMES),
        help=f"comma-separated subset of {','.join(RUNTIMES)} (default: all; durabl's workers "
        "and takeover parts always run)",
    )
    own.add_argument("--server", default=SERVER, help=f"the PostgreSQL server (default {SERVER})")
    ns, rest = own.parse_known_args(argv)
    wanted = ns.runtimes.split(",")
    runtimes = [r for r in RUNTIMES if r in wanted]
    if set(wanted) - set(RUNTIMES) or "durabl" not in runtimes:
        raise SystemExit("bench.postgres: --runtimes takes durabl, and dbos if wanted")
    return harness.main(
        rest,
        name="postgres",
        doc=__doc__,
        quick_help="few runs and repetitions: exercises every path, figures are noise "
        "(--runtimes durabl leaves DBOS out, --server picks the server)",
        measure=functools.partial(measure, runtimes=runtimes, server_url=ns.server),
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
