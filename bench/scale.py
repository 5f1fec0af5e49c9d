"""Scale: whether durabl's costs stay flat as its database grows to 1,000,000 events and 10,000
runs, what the read paths cost on such a database, and how much memory a worker holding parked
runs, and the resume of a long run, take.

The big database is built, not run: real runs take minutes to fill it. A few real runs of each
shape are made through the public API (``Runtime``, durability "process"): W40 completed
(bench/workload.py: 1 ModelCall + 40 ToolCalls), a short completed run (1 ModelCall + 4
ToolCalls), W40 killed after its 20th tool step (RUNNING, its owner gone), a run parked on an
hour's ``Sleep`` (SLEEPING), a run whose tool fails for good (FAILED), and W40 killed inside a tool
call and then resumed (DEAD_LETTERED). Their rows are copied in bulk by sqlite3 under new run ids,
in one transaction that passes through the schema's own triggers (gapless, fenced): the runs row,
every event, and the side_effects and key_claims rows, whose derived idempotency keys are
computed for the new id by ``durabl.steps.derived_key``. Each copy is moved back in time (the
copies were created over the last 30 days), the template's run id inside event data (the key a
TOOL_DISPATCHED names) becomes the copy's, and each event's crc is recomputed with
``durabl.codec.checksum``. The mix: 3% RUNNING, 3% SLEEPING, 1.5% FAILED, 0.5% DEAD_LETTERED, the
rest COMPLETED, W40 and short runs in the proportion that reaches the target number of events.
The file is then proved a durabl database: ``durabl doctor`` (integrity, schema and triggers,
every checksum, gapless logs, statuses that agree with their logs, no orphan rows) must find it
healthy, and a dry ``replay`` of a copy of each shape must give its template's status and result.
The built file is cached under the temp directory (or ``$DURABL_BENCH_SCALE_CACHE``), keyed by a
version string and the schema, so that a rerun reuses it; every measurement works on a copy.

What one invocation measures (medians, p95 and the raw samples are in the output). The reads
run first, on the copy as built; the scale part then adds its runs to that copy.

1. scale: W40's per-step overhead over the plain loop, ``(durabl run - plain run) / 41``, as
   bench/w40.py measures it, on an empty database and on the big one, for durability "process"
   and "full" (the tool a bare callable, AT_MOST_ONCE); repetitions interleaved in a rotating
   order, each durabl run paired with the plain run of its repetition. The ratio big/empty, of
   the medians and of the means (process-mode runs are bimodal: a WAL checkpoint lands in about
   every other run), must stay within 1.2.
2. reads on the big database: ``durabl runs`` as typed (the newest 100 runs; the 50 ms target
   is judged on it), with ``--all``, ``--status RUNNING`` and ``--limit 25``, as a whole process
   and inside its process from ``main()`` to the output written (what the target is judged on:
   interpreter start-up and imports are not the database's cost), and ``SQLiteStore.list_runs``, the query it calls, in this process. The dashboard's
   two polls, ``/api/runs`` (the run list) and ``/api/runs/<id>?after=<last seq>`` (a watched
   RUNNING run, nothing new), in this process through ``durabl.ui.server``'s own handlers and
   end to end through its HTTP server on a loopback port.
3. memory: a ``durabl worker`` process (``--concurrency 8``) over a database of parked runs (a
   tool step, then ``Sleep(hours=1)``): once with runs that parked before it started, and once
   with runs left RUNNING by a process that died after RUN_STARTED, which the worker itself
   drives to their timers. Its VmRSS and VmHWM (/proc/PID/status) once it has looked for work
   (or parked every run), then SIGTERM. And the resume of a run with 10,000 completed steps,
   killed by SIGKILL inside its 10,001st (its tool kills the process while a marker file
   exists): a fresh process opens a ``Runtime``, notes its VmRSS, resets VmHWM, resumes the
   run (and, in another process, replays it dry), and reports VmHWM above that baseline; a
   third process measures under tracemalloc how much of it is the Python heap, while the store
   loads the log and during a dry replay.

The latency targets are judged on medians (p95 beside them); the worker's on its VmHWM.

Databases live in a temporary directory on a real disk (never tmpfs: fsync must be real).

    python -m bench.scale --out bench/results/scale.json     # the full benchmark (make bench)
    python -m bench.scale --quick --out /tmp/scale.json      # seconds; exercises every path
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import durabl
from bench import harness
from bench.harness import Report, rotations, say, summary
from bench.workload import (
    EXPECTED,
    STEPS,
    TOOL_CALLS,
    TOOL_NAME,
    TOPIC,
    Outbox,
    plain_loop,
    result_of,
    stub_llm,
    w40,
)
from durabl import ModelCall, Runtime, Sleep, ToolCall, codec, events, tool, workflow
from durabl.cli import app as cli_app
from durabl.crashpoints import (
    AFTER_RUN_STARTED,
    AFTER_STEP_COMMITTED,
    AFTER_TOOL_DISPATCHED,
    CrashAt,
    ProcessDeath,
)
from durabl.steps import derived_key
from durabl.store import SQLiteStore
from durabl.store.schema import MIGRATIONS, SCHEMA_VERSION, Q

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
BUILD_VERSION = "scale-db-1"
"""Version of the way the big database is built: part of its cache key."""
CACHE_ENV = "DURABL_BENCH_SCALE_CACHE"
"""Where built databases are cached (default: a folder under the temp directory)."""

TARGETS = {
    "scale_ratio_process": 1.2,
    "scale_ratio_full": 1.2,
    "cli_runs_in_process_ms_median": 50.0,
    "dashboard_list_in_process_ms_median": 50.0,
    "dashboard_poll_in_process_ms_median": 50.0,
    "dashboard_list_http_ms_median": 50.0,
    "dashboard_poll_http_ms_median": 50.0,
    "worker_parked_hwm_mb": 200.0,
    "worker_parking_hwm_mb": 200.0,
    "resume_peak_above_baseline_mb": 50.0,
}
"""Design targets: reported against the figures, never asserted."""


@dataclass(frozen=True)
class Plan:
    """How big the database is and how many repetitions each part runs."""

    events: int
    runs: int
    warmup: int
    scaling_reps: int
    process_samples: int
    in_process_samples: int
    http_samples: int
    parked_runs: int
    long_steps: int
    fsync_samples: int


FULL = Plan(
    events=1_000_000,
    runs=10_000,
    warmup=5,
    scaling_reps=150,
    process_samples=15,
    in_process_samples=40,
    http_samples=200,
    parked_runs=1_000,
    long_steps=10_000,
    fsync_samples=200,
)
QUICK = Plan(
    events=50_000,
    runs=500,
    warmup=1,
    scaling_reps=3,
    process_samples=2,
    in_process_samples=3,
    http_samples=10,
    parked_runs=50,
    long_steps=1_000,
    fsync_samples=20,
)

MIX = {
    events.RUNNING: 0.03,
    events.SLEEPING: 0.03,
    events.FAILED: 0.015,
    events.DEAD_LETTERED: 0.005,
}
"""Shares of the copied runs by status; the rest are COMPLETED."""
SPREAD_S = 30 * 86400.0
"""The copies were created over this long before the templates."""
WORKER_CONCURRENCY = 8
WORKER_POLL_S = 0.2


# -- the workflows and tools of the templates, the parked runs and the long run ---------------

NOTE, REFUSE, TICK = "note", "refuse", "tick"
SHORT_TOOL_CALLS = 4
LONG_RUN_ID = "long-run"


def note(i: int) -> dict[str, Any]:
    return result_of(i, TOPIC)


def refuse(i: int) -> dict[str, Any]:
    raise RuntimeError(f"the service refused request {i}")


@workflow(name="bench.scale.short")
def short(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"Plan a search about {topic}")
    for i in range(SHORT_TOOL_CALLS):
        yield ToolCall(TOOL_NAME, {"i": i, "topic": topic})
    return {"plan": plan["plan"], "hits": SHORT_TOOL_CALLS}


@workflow(name="bench.scale.failing")
def failing(ctx: Any, topic: str) -> Any:
    yield ModelCall(f"Plan a search about {topic}")
    for i in range(5):
        yield ToolCall(TOOL_NAME, {"i": i, "topic": topic})
    yield ToolCall(REFUSE, {"i": 5})
    return {"hits": 6}


@workflow(name="bench.scale.parked")
def parked(ctx: Any, topic: str) -> Any:
    yield ToolCall(NOTE, {"i": 0})
    yield Sleep(hours=1)
    yield ToolCall(NOTE, {"i": 1})
    return {"woke": True}


@workflow(name="bench.scale.long")
def long_run(ctx: Any, steps: int) -> Any:
    """``steps`` + 1 tool steps: the kill lands inside the last one."""
    for i in range(steps + 1):
        yield ToolCall(TICK, {"i": i})
    return {"steps": steps + 1}


class Tick:
    """The long run's tool: SIGKILLs its own process at call ``kill_at`` while ``marker``
    exists (a real death: nothing below the tool gets to clean up)."""

    def __init__(self, kill_at: int, marker: str | None) -> None:
        self.kill_at = kill_at
        self.marker = marker

    def __call__(self, i: int) -> dict[str, Any]:
        if i == self.kill_at and self.marker and os.path.exists(self.marker):
            os.kill(os.getpid(), signal.SIGKILL)
        return result_of(i, TOPIC)


DURABL_TOOLS = {NOTE: tool(note, name=NOTE, mode="IDEMPOTENT")}
"""What ``durabl worker --import bench.scale`` registers: the parked runs' tool."""


def template_tools(outbox: Outbox) -> dict[str, Any]:
    return {
        TOOL_NAME: outbox,  # a bare callable (AT_MOST_ONCE), as in W40
        NOTE: DURABL_TOOLS[NOTE],
        REFUSE: tool(refuse, name=REFUSE, max_attempts=1),
    }


# -- building the big database ----------------------------------------------------------------


def make_templates(db: Path, work: Path) -> dict[str, str]:
    """Real runs of every shape through the public API; their ids by shape."""
    tools = template_tools(Outbox(work / "templates.txt"))
    ids: dict[str, str] = {}
    with Runtime(db, llm=stub_llm, tools=tools, durability="process") as rt:
        ids["completed_w40"] = rt.start(w40, {"topic": TOPIC})
        ids["completed_short"] = rt.start(short, {"topic": TOPIC})
        ids["sleeping"] = rt.start(parked, {"topic": TOPIC})
        ids["failed"] = rt.start(failing, {"topic": TOPIC})
    ids["running"] = start_killed(db, tools, CrashAt(AFTER_STEP_COMMITTED, 21))
    ids["dead_lettered"] = start_killed(db, tools, CrashAt(AFTER_TOOL_DISPATCHED, 11))
    with Runtime(db, llm=stub_llm, tools=tools, durability="process") as rt:
        rt.resume(ids["dead_lettered"])  # the crash was inside the call: dead-lettered
        found = {shape: rt.state(run_id).status for shape, run_id in ids.items()}
    if found != STATUS_OF:
        raise AssertionError(f"the templates ended {found}, expected {STATUS_OF}")
    return ids


def start_killed(db: Path, tools: dict[str, Any], crash: CrashAt) -> str:
    """A W40 run whose runtime dies at ``crash``; left RUNNING with its owner gone."""
    run_id = f"{random.getrandbits(128):032x}"
    doomed = Runtime(db, llm=stub_llm, tools=tools, durability="process")
    try:
        with crash:
            doomed.start(w40, {"topic": TOPIC}, run_id=run_id)
        raise AssertionError(f"the runtime did not die at {crash.point}")
    except ProcessDeath:
        return run_id
    finally:
        doomed.close()


STATUS_OF = {
    "completed_w40": events.COMPLETED,
    "completed_short": events.COMPLETED,
    "running": events.RUNNING,
    "sleeping": events.SLEEPING,
    "failed": events.FAILED,
    "dead_lettered": events.DEAD_LETTERED,
}


def copies_per_shape(plan: Plan, events_of: dict[str, int]) -> dict[str, int]:
    """How many copies of each template: the status mix, and completed runs split between W40
    and short ones so that the events reach ``plan.events`` (within one run)."""
    copies = plan.runs - len(events_of)
    counts = {s: round(copies * MIX[status]) for s, status in STATUS_OF.items() if status in MIX}
    completed = copies - sum(counts.values())
    left = plan.events - sum(events_of.values()) - sum(events_of[s] * n for s, n in counts.items())
    long_, short_ = events_of["completed_w40"], events_of["completed_short"]
    w40_runs = -(-(left - short_ * completed) // (long_ - short_))  # ceiling
    counts["completed_w40"] = min(completed, max(0, w40_runs))
    counts["completed_short"] = completed - counts["completed_w40"]
    return counts


COPY_RUNS = """
INSERT INTO runs (run_id, workflow, input, status, result, error, created_s, updated_s,
                  wake_at_s, watermark, lease_owner, lease_pid, lease_host, lease_started,
                  lease_expires_s, lease_token)
SELECT c.run_id, t.workflow, t.input, t.status, t.result, t.error, t.created_s + c.shift_s,
       t.updated_s + c.shift_s, t.wake_at_s, t.watermark, t.lease_owner, t.lease_pid,
       t.lease_host, t.lease_started, t.lease_expires_s + c.shift_s, 0
FROM copies c JOIN runs t ON t.run_id = c.template
ORDER BY c.n
"""
SET_TOKEN = """
UPDATE runs SET lease_token = :token
WHERE run_id IN (SELECT run_id FROM copies WHERE template = :template)
"""
COPY_EVENTS = """
INSERT INTO events (run_id, seq, kind, step, fp, data, at_s, crc, fence)
SELECT run_id, seq, kind, step, fp, data, at_s, scale_checksum(seq, kind, step, fp, data, at_s),
       fence
FROM (SELECT c.run_id AS run_id, e.seq AS seq, e.kind AS kind, e.step AS step, e.fp AS fp,
             replace(e.data, c.template, c.run_id) AS data, e.at_s + c.shift_s AS at_s,
             e.fence AS fence
      FROM copies c JOIN events e ON e.run_id = c.template
      WHERE c.template = :template AND e.fence IS :token
      ORDER BY c.n, e.seq)
"""
COPY_SIDE_EFFECTS = """
INSERT INTO side_effects (idempotency_key, run_id, step, tool, args_fp, result, error, at_s)
SELECT scale_derived_key(c.run_id, s.step), c.run_id, s.step, s.tool, s.args_fp, s.result,
       s.error, s.at_s + c.shift_s
FROM copies c JOIN side_effects s ON s.run_id = c.template
ORDER BY c.n, s.step
"""
COPY_CLAIMS = """
INSERT INTO key_claims (idempotency_key, run_id, step, tool, args_fp, at_s)
SELECT scale_derived_key(c.run_id, k.step), c.run_id, k.step, k.tool, k.args_fp,
       k.at_s + c.shift_s
FROM copies c JOIN key_claims k ON k.run_id = c.template
ORDER BY c.n
"""
FOREIGN_KEYS = """
SELECT COUNT(*) FROM (SELECT idempotency_key, run_id, step FROM side_effects
                      UNION ALL SELECT idempotency_key, run_id, step FROM key_claims)
WHERE idempotency_key != scale_derived_key(run_id, step)
"""


def copy_runs(db: Path, counts: dict[str, int], templates: dict[str, str], seed: int) -> None:
    """Copy each template ``counts[shape]`` times, in one transaction. A copy's events are
    inserted one fence at a time, the run's lease token set to that fence first, so that the
    fencing trigger checks every row as it checks the runtime's own writes."""
    rng = random.Random(seed)
    shapes = [shape for shape, n in counts.items() for _ in range(n)]
    rng.shuffle(shapes)
    rows = [
        (
            n,
            f"{rng.getrandbits(128):032x}",
            templates[shape],
            -SPREAD_S * (len(shapes) - n) / len(shapes),
        )
        for n, shape in enumerate(shapes)
    ]
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.create_function("scale_checksum", 6, codec.checksum, deterministic=True)
        conn.create_function("scale_derived_key", 2, derived_key, deterministic=True)
        if conn.execute(FOREIGN_KEYS).fetchone()[0]:
            raise AssertionError("a template holds an idempotency key durabl did not derive")
        # A rollback journal while copying: a WAL would hold the whole copy a second time.
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA cache_size = -262144")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "CREATE TEMP TABLE copies (n INTEGER PRIMARY KEY, run_id TEXT, template TEXT, "
            "shift_s REAL)"
        )
        conn.executemany("INSERT INTO copies VALUES (?, ?, ?, ?)", rows)
        conn.execute(COPY_RUNS)
        for template in templates.values():
            fences = conn.execute(
                "SELECT DISTINCT fence FROM events WHERE run_id = ? ORDER BY fence", (template,)
            ).fetchall()
            for (token,) in fences:
                conn.execute(SET_TOKEN, {"token": token or 0, "template": template})
                conn.execute(COPY_EVENTS, {"token": token, "template": template})
            final = conn.execute("SELECT lease_token FROM runs WHERE run_id = ?", (template,))
            conn.execute(SET_TOKEN, {"token": final.fetchone()[0], "template": template})
        conn.execute(COPY_SIDE_EFFECTS)
        conn.execute(COPY_CLAIMS)
        conn.execute("DROP TABLE copies")
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode = WAL")
    finally:
        conn.close()


def census(db: Path) -> Report:
    """What the file holds: runs by status, events, side effects, bytes."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        by_status = dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))
        return {
            "runs": sum(by_status.values()),
            "runs_by_status": dict(sorted(by_status.items())),
            "events": conn.execute("SELECT COUNT(*) FROM events").fetchone()[0],
            "side_effects": conn.execute("SELECT COUNT(*) FROM side_effects").fetchone()[0],
            "key_claims": conn.execute("SELECT COUNT(*) FROM key_claims").fetchone()[0],
            "file_mb": round(db.stat().st_size / 2**20, 1),
        }
    finally:
        conn.close()


def events_per_run(db: Path, run_ids: Sequence[str]) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            r: conn.execute("SELECT COUNT(*) FROM events WHERE run_id = ?", (r,)).fetchone()[0]
            for r in run_ids
        }
    finally:
        conn.close()


def build(db: Path, work: Path, plan: Plan) -> Report:
    """Build the big database at ``db``; what it holds and how long that took."""
    t0 = time.perf_counter()
    templates = make_templates(db, work)
    t1 = time.perf_counter()
    sizes = events_per_run(db, list(templates.values()))
    counts = copies_per_shape(plan, {shape: sizes[r] for shape, r in templates.items()})
    copy_runs(db, counts, templates, seed=plan.runs)
    t2 = time.perf_counter()
    return {
        "templates": templates,
        "template_events": {shape: sizes[r] for shape, r in templates.items()},
        "copies": counts,
        "templates_s": round(t1 - t0, 2),
        "copy_s": round(t2 - t1, 2),
        **census(db),
    }


def durabl_command() -> list[str]:
    """The ``durabl`` entry point of this interpreter's environment."""
    script = Path(sys.executable).with_name("durabl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "durabl"]


def doctor(db: Path) -> Report:
    """``durabl doctor`` on the file, as a user runs it; it must find the file healthy."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [*durabl_command(), "--db", str(db), "--json", "doctor"],
        capture_output=True, text=True, timeout=1800, cwd=harness.REPO,
    )  # fmt: skip
    elapsed = time.perf_counter() - t0
    found = json.loads(done.stdout)
    if done.returncode != 0 or not found["healthy"]:
        raise AssertionError(f"durabl doctor found the built database damaged:\n{done.stdout}")
    return {
        "healthy": found["healthy"],
        "exit_code": done.returncode,
        "findings": {f["check"]: f["message"] for f in found["findings"]},
        "doctor_s": round(elapsed, 2),
    }


def replay_copies(db: Path, work: Path, templates: dict[str, str]) -> dict[str, Any]:
    """A dry replay of one copy of every shape, on a runtime over a read-only store: the same
    status, result and steps as its template's."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        copy_of = {
            shape: conn.execute(
                "SELECT run_id FROM runs WHERE workflow = (SELECT workflow FROM runs WHERE "
                "run_id = :t) AND status = :s AND run_id != :t LIMIT 1",
                {"t": template, "s": STATUS_OF[shape]},
            ).fetchone()
            for shape, template in templates.items()
        }
    finally:
        conn.close()
    tools = template_tools(Outbox(work / "replay.txt"))
    checked: dict[str, Any] = {}
    with Runtime(store=SQLiteStore(db, read_only=True), llm=stub_llm, tools=tools) as rt:
        for shape, found in copy_of.items():
            if found is None:
                continue  # quick mode may copy no run of a rare shape
            mine, theirs = rt.replay(found[0]), rt.replay(templates[shape])
            same = (mine.status, mine.result, mine.steps_replayed, mine.next_step) == (
                theirs.status, theirs.result, theirs.steps_replayed, theirs.next_step
            )  # fmt: skip
            if not same or mine.steps_executed:
                raise AssertionError(f"copy {found[0]} replays as {mine!r}, not as {theirs!r}")
            checked[shape] = {
                "run_id": found[0],
                "status": mine.status,
                "steps": mine.steps_replayed,
            }
    return checked


def cache_key(plan: Plan) -> str:
    scripts = "".join(script for _, script in MIGRATIONS)
    digest = hashlib.sha256(
        f"{BUILD_VERSION}\n{durabl.__version__}\n{scripts}".encode()
    ).hexdigest()[:12]
    return f"{BUILD_VERSION}-v{SCHEMA_VERSION}-{digest}-{plan.events}e-{plan.runs}r"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "durabl-bench-scale")


def big_database(work: Path, plan: Plan) -> tuple[Path, Report]:
    """The big database, copied into ``work`` from the cache (built and verified first if the
    cache has none), and its manifest: what it holds and how it was proved valid."""
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = cache_key(plan)
    cached, manifest_path = folder / f"{key}.db", folder / f"{key}.json"
    if cached.exists() and manifest_path.exists():
        say(f"  reusing the database cached at {cached}")
        manifest = json.loads(manifest_path.read_text())
        manifest["reused_from_cache"] = True
    else:
        manifest = build_and_verify(work, plan)
        shutil.move(work / "build" / "scale.db", folder / f"{key}.db.tmp")
        os.replace(folder / f"{key}.db.tmp", cached)
        harness.write_json(manifest_path, manifest)
        manifest["reused_from_cache"] = False
    manifest["cache_file"] = str(cached)
    mine = work / "big.db"
    shutil.copyfile(cached, mine)
    # Written out before anything is timed: else the first checkpoint's fsync of the database
    # file waits for the OS to write back the whole fresh copy, and the step in flight then
    # pays for the benchmark's own copy (one run of 150 ms among runs of 6).
    with open(mine, "rb") as copied:
        os.fsync(copied.fileno())
    return mine, manifest


def build_and_verify(work: Path, plan: Plan) -> Report:
    folder = work / "build"
    folder.mkdir()
    db = folder / "scale.db"
    say(f"  building: templates, then copies up to {plan.events} events, {plan.runs} runs")
    built = build(db, folder, plan)
    say(f"  built in {built['templates_s'] + built['copy_s']:.1f} s; durabl doctor ...")
    checked = doctor(db)
    replayed = replay_copies(db, folder, built["templates"])
    say(f"  doctor: healthy in {checked['doctor_s']} s; dry replays of copies match")
    return {"cache_key": cache_key(plan), **built, "doctor": checked, "replayed_copies": replayed}


# -- part 1: per-step cost, empty database vs big database ------------------------------------


class Subject:
    """Runs W40 once per ``run()``: with durabl on ``db`` or, with ``db`` None, the plain loop.
    Returns the wall time in ns."""

    def __init__(self, label: str, outbox: Outbox, db: Path | None, durability: str) -> None:
        self.label = label
        self.outbox = outbox
        self.runs = 0
        tools = {TOOL_NAME: outbox}
        self.rt = (
            None if db is None else Runtime(db, llm=stub_llm, tools=tools, durability=durability)
        )

    def run(self) -> int:
        t0 = time.perf_counter_ns()
        if self.rt is None:
            result = plain_loop(stub_llm, self.outbox, TOPIC)
            elapsed = time.perf_counter_ns() - t0
        else:
            run_id = self.rt.start(w40, {"topic": TOPIC})
            elapsed = time.perf_counter_ns() - t0
            result = self.rt.result(run_id)
        if result != EXPECTED:
            raise AssertionError(f"{self.label}: W40 returned {result!r}")
        self.runs += 1
        return elapsed

    def close(self) -> None:
        if self.rt is not None:
            self.rt.close()


def interleave(subjects: Sequence[Subject], reps: int, warmup: int) -> dict[str, list[int]]:
    """Every subject once per repetition, in a rotating order; the outboxes are checked."""
    for _ in range(warmup):
        for s in subjects:
            s.run()
    samples: dict[str, list[int]] = {s.label: [] for s in subjects}
    for rep, order in enumerate(rotations(subjects, reps)):
        for s in order:
            samples[s.label].append(s.run())
        if reps >= 10 and (rep + 1) % max(1, reps // 4) == 0:
            say(f"  scale: {rep + 1}/{reps}")
    for s in subjects:
        if s.outbox.lines() != TOOL_CALLS * s.runs:
            raise AssertionError(f"{s.label}: {s.outbox.lines()} tool calls for {s.runs} runs")
    return samples


def overhead(durabl_ns: Sequence[int], plain_ns: Sequence[int]) -> Report:
    per_step = [(d - p) / STEPS / 1e6 for d, p in zip(durabl_ns, plain_ns, strict=True)]
    return {
        "overhead_ms_per_step": summary(per_step),
        "run_ms": summary([d / 1e6 for d in durabl_ns]),
    }


def measure_scale(work: Path, big: Path, plan: Plan) -> Report:
    say(f"[3/4] scale: W40 per-step overhead, empty database vs {plan.events} events")
    empty = work / "empty.db"
    subjects = [Subject("plain", Outbox(work / "plain.txt"), None, "")]
    for mode in ("process", "full"):
        for where, db in (("empty", empty), ("big", big)):
            outbox = Outbox(work / f"scale_{mode}_{where}.txt")
            subjects.append(Subject(f"{mode}@{where}", outbox, db, mode))
    try:
        samples = interleave(subjects, plan.scaling_reps, plan.warmup)
    finally:
        for s in subjects:
            s.close()
    plain_ms = [p / 1e6 for p in samples["plain"]]
    figures: Report = {"reps": plan.scaling_reps, "plain_run_ms": summary(plain_ms)}
    for mode in ("process", "full"):
        at_empty = overhead(samples[f"{mode}@empty"], samples["plain"])
        at_big = overhead(samples[f"{mode}@big"], samples["plain"])
        e, b = at_empty["overhead_ms_per_step"], at_big["overhead_ms_per_step"]
        figures[mode] = {
            "empty": at_empty,
            "big": at_big,
            "ratio_median_big_over_empty": round(b["median"] / e["median"], 3),
            "ratio_mean_big_over_empty": round(b["mean"] / e["mean"], 3),
        }
    figures["raw_run_us"] = {k: [round(t / 1e3) for t in v] for k, v in samples.items()}
    return figures


# -- part 2: the read paths on the big database -----------------------------------------------

CLI_TIMED = """
import json, os, sys, time
t0 = time.perf_counter()
from durabl.cli.app import main
imported = time.perf_counter()
with open(os.devnull, "w") as sink:
    shown, sys.stdout = sys.stdout, sink
    t1 = time.perf_counter()
    code = main(sys.argv[1:])
    sink.flush()
    done = time.perf_counter()
    sys.stdout = shown
print(json.dumps({"code": code, "import_ms": (imported - t0) * 1000, "main_ms": (done - t1) * 1000}))
"""
"""A ``durabl`` process that times itself from ``main()`` to its output written."""

CLI_CASES = {
    "default": [],
    "all": ["--all"],
    "status_running": ["--status", "RUNNING"],
    "limit_25": ["--limit", "25"],
}
"""``durabl runs`` as a user types it (``default``: the newest 100), with ``--all`` (every run)
and two narrower asks."""


def ms_since(t0: int) -> float:
    return (time.perf_counter_ns() - t0) / 1e6


def measure_cli(db: Path, plan: Plan) -> Report:
    """``durabl runs``: whole process, inside its process, and its query in this one."""
    figures: Report = {}
    for case, extra in CLI_CASES.items():
        argv = ["runs", "--db", str(db), *extra]
        whole, inside, imports = [], [], []
        for _ in range(plan.process_samples):
            t0 = time.perf_counter_ns()
            subprocess.run([*durabl_command(), *argv], check=True, stdout=subprocess.DEVNULL)
            whole.append(ms_since(t0))
            done = subprocess.run(
                [sys.executable, "-c", CLI_TIMED, *argv], check=True, capture_output=True,
                text=True,
            )  # fmt: skip
            timed = json.loads(done.stdout.splitlines()[-1])
            inside.append(timed["main_ms"])
            imports.append(timed["import_ms"])
        figures[case] = {
            "argv": ["durabl", *argv[:1], "--db", "FILE", *extra],
            "rows": cli_rows(argv),
            "whole_process_ms": summary(whole, 2),
            "import_ms": summary(imports, 2),
            "in_process_ms": summary(inside, 2),
            "raw_whole_process_ms": [round(t, 2) for t in whole],
            "raw_in_process_ms": [round(t, 2) for t in inside],
        }
    figures["list_runs_ms"] = time_list_runs(db, plan)
    figures["query_plans"] = query_plans(db)
    return figures


def cli_rows(argv: list[str]) -> int:
    """The rows ``durabl runs`` prints (a header line, then one line per run)."""
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        cli_app.main(argv)
    return max(0, len(shown.getvalue().splitlines()) - 1)


def time_list_runs(db: Path, plan: Plan) -> Report:
    """``SQLiteStore.list_runs``, the store call ``durabl runs`` makes, on one open store."""
    asks: dict[str, dict[str, Any]] = {
        "all": {},
        "status_running": {"statuses": (events.RUNNING,)},
        "limit_25": {"limit": 25},
        "limit_26_status_completed": {"statuses": (events.COMPLETED,), "limit": 26},
    }
    figures: Report = {}
    with contextlib.closing(SQLiteStore(db, read_only=True)) as store:
        for name, ask in asks.items():
            times = []
            for _ in range(plan.in_process_samples + 1):
                t0 = time.perf_counter_ns()
                store.list_runs(**ask)
                times.append(ms_since(t0))
            figures[name] = summary(times[1:], 3)
    return figures


PLANNED: dict[str, dict[str, Any]] = {
    "list_runs": {"statuses": None, "workflow": None, "limit": -1},
    "list_runs (one status, page of 26)": {
        "statuses": '["RUNNING"]',
        "workflow": None,
        "limit": 26,
    },
    "load_log": {"run_id": "", "after_seq": 0},
    "last_step": {"run_id": ""},
    "get_run": {"run_id": ""},
}
"""The store's named statements the read paths run, with parameters to plan them by."""


def query_plans(db: Path) -> dict[str, list[str]]:
    """SQLite's EXPLAIN QUERY PLAN of each statement in ``PLANNED``, on the big database."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            name: [
                row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {Q[name.split()[0]]}", params)
            ]
            for name, params in PLANNED.items()
        }
    finally:
        conn.close()


def watched_run(db: Path) -> tuple[str, int]:
    """A copied RUNNING run, and its last seq: what a watching page polls after."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        run_id = conn.execute(
            "SELECT run_id FROM runs WHERE status = 'RUNNING' ORDER BY created_s DESC LIMIT 1"
        ).fetchone()[0]
        last = conn.execute("SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,))
        return run_id, int(last.fetchone()[0])
    finally:
        conn.close()


def measure_dashboard(db: Path, plan: Plan) -> Report:
    """The dashboard's two polls, through its handlers in this process and over HTTP."""
    # Imported here: the worker this benchmark starts imports this module, and the dashboard's
    # HTTP stack is no part of a worker's memory.
    import threading
    import urllib.request

    from durabl.ui import server

    run_id, last = watched_run(db)
    asks = {
        "list": ("/api/runs", {}),
        "list_running": ("/api/runs?status=RUNNING", {"status": ["RUNNING"]}),
        "poll": (f"/api/runs/{run_id}?after={last}", {"after": [str(last)]}),
    }
    reader = server.Reader(str(db))
    handlers: dict[str, Callable[[], Any]] = {
        "list": lambda: server.list_runs(reader, asks["list"][1], time.time()),
        "list_running": lambda: server.list_runs(reader, asks["list_running"][1], time.time()),
        "poll": lambda: server.run_events(reader, run_id, asks["poll"][1], time.time()),
    }
    httpd = server.serve(str(db), port=0, out=io.StringIO())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_port}"

    def get(path: str) -> Any:
        with urllib.request.urlopen(base + path, timeout=30) as answer:
            return json.loads(answer.read())

    try:
        answers = {name: get(path) for name, (path, _) in asks.items()}
        inside: dict[str, list[float]] = {name: [] for name in asks}
        http: dict[str, list[float]] = {name: [] for name in asks}
        for _ in range(plan.http_samples):
            for name, (path, _) in asks.items():
                t0 = time.perf_counter_ns()
                handlers[name]()
                inside[name].append(ms_since(t0))
                t0 = time.perf_counter_ns()
                get(path)
                http[name].append(ms_since(t0))
    finally:
        httpd.shutdown()
        httpd.server_close()
        httpd.reader.drop()
        reader.drop()
    if answers["poll"]["events"] or answers["poll"]["run"]["status"] != events.RUNNING:
        raise AssertionError(f"the poll of {run_id} after seq {last}: {answers['poll']!r}")
    return {
        "watched_run": run_id,
        "after_seq": last,
        "samples": plan.http_samples,
        "runs_listed": {name: len(answers[name]["runs"]) for name in ("list", "list_running")},
        **{
            name: {
                "path": asks[name][0].replace(run_id, "<id>"),
                "in_process_ms": summary(inside[name], 3),
                "http_ms": summary(http[name], 3),
                "raw_in_process_ms": [round(t, 3) for t in inside[name]],
                "raw_http_ms": [round(t, 3) for t in http[name]],
            }
            for name in asks
        },
    }


# -- part 3: memory ---------------------------------------------------------------------------


def proc_status_kb(pid: int | str = "self") -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB (Linux)."""
    found = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0])
    return found


def reset_peak() -> bool:
    """Reset this process's VmHWM to its VmRSS (Linux: clear_refs 5); False if refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def bench_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(harness.REPO), env.get("PYTHONPATH")]))
    return env


def python(code: str, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with this repository importable."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=harness.REPO, env=bench_env(), capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def statuses(db: Path) -> dict[str, int]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return dict(conn.execute("SELECT status, COUNT(*) FROM runs GROUP BY status"))
    finally:
        conn.close()


def park_runs(db: Path, count: int) -> None:
    """``count`` runs that each do a step and park on an hour's timer, started here."""
    with Runtime(db, tools=DURABL_TOOLS, durability="process") as rt:
        for _ in range(count):
            rt.start(parked, {"topic": TOPIC})


LEAVE_RUNNING = """
import sys
from bench.scale import leave_running
leave_running(sys.argv[1], int(sys.argv[2]))
"""


def leave_running(db: str, count: int) -> None:
    """``count`` runs left RUNNING by this process, which dies (exits) after each
    RUN_STARTED: a worker finds their owner gone and drives them to their timers."""
    with Runtime(db, tools=DURABL_TOOLS, durability="process") as rt:
        for _ in range(count):
            try:
                with CrashAt(AFTER_RUN_STARTED):
                    rt.start(parked, {"topic": TOPIC})
            except ProcessDeath:
                continue
            raise AssertionError("the run was not left after RUN_STARTED")


class WorkerProcess:
    """``durabl worker`` over ``db``: started, watched through /proc, stopped by SIGTERM."""

    def __init__(self, db: Path) -> None:
        self.log = db.with_suffix(".worker.log")
        argv = [
            *durabl_command(), "--db", str(db), "--import", "bench.scale", "worker",
            "--concurrency", str(WORKER_CONCURRENCY), "--poll", str(WORKER_POLL_S),
        ]  # fmt: skip
        with open(self.log, "w", encoding="utf-8") as out:
            self.proc = subprocess.Popen(
                argv, cwd=harness.REPO, env=bench_env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        self.started = time.perf_counter()
        self.argv = ["durabl", "--db", "FILE", *argv[argv.index("--import") :]]

    def wait_serving(self, timeout_s: float = 60.0) -> float:
        """Until its SIGTERM handler is installed (the command line installs it right before
        it serves); seconds since the start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"the worker exited early:\n{self.log.read_text()}")
            if harness.handles(self.proc.pid, signal.SIGTERM):
                return time.perf_counter() - self.started
            time.sleep(0.005)
        raise AssertionError(f"the worker was not serving within {timeout_s} s")

    def memory(self) -> dict[str, float]:
        kb = proc_status_kb(self.proc.pid)
        return {"rss_mb": round(kb["VmRSS"] / 1024, 1), "hwm_mb": round(kb["VmHWM"] / 1024, 1)}

    def stop(self) -> str:
        """SIGTERM, reap; its last line (what it did)."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        text = self.log.read_text()
        if code != 0:
            raise AssertionError(f"the worker exited {code}:\n{text}")
        return text.strip().splitlines()[-1]


def worker_memory(db: Path, count: int, already_parked: bool) -> Report:
    """A worker over ``count`` runs: parked before it started, or parked by it."""
    worker = WorkerProcess(db)
    try:
        serving_s = worker.wait_serving()
        deadline = time.monotonic() + 600
        while not already_parked and statuses(db).get(events.SLEEPING, 0) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker parked only {statuses(db)} in 600 s")
            time.sleep(0.05)
        parked_s = time.perf_counter() - worker.started
        time.sleep(WORKER_POLL_S * 5)  # several looks for work, and idle waits on the timers
        memory = worker.memory()
    finally:
        last_line = worker.stop()
    found = statuses(db)
    if found != {events.SLEEPING: count}:
        raise AssertionError(f"after the worker: {found}, not {count} parked runs")
    return {
        "runs": count,
        "runs_parked_before_worker": already_parked,
        "argv": worker.argv,
        "serving_after_s": round(serving_s, 3),
        "all_parked_after_s": round(parked_s, 3),
        **memory,
        "worker_said": last_line,
    }


BUILD_LONG = """
import sys
from bench.scale import build_long
build_long(sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""
RESUME_LONG = """
import sys
from bench.scale import resume_long
resume_long(sys.argv[1], int(sys.argv[2]), sys.argv[3])
"""


def build_long(db: str, steps: int, marker: str) -> None:
    """Drive the long run until its tool kills this process inside step ``steps`` + 1."""
    tick = tool(Tick(steps, marker), name=TICK, mode="IDEMPOTENT")
    with Runtime(db, tools={TICK: tick}, durability="process") as rt:
        rt.start(long_run, {"steps": steps}, run_id=LONG_RUN_ID)
    raise AssertionError("the long run was not killed")


def resume_long(db: str, steps: int, how: str) -> None:
    """In a fresh process: open a runtime, note VmRSS, reset VmHWM, then ``how`` the long run
    ("resume", or "dry" replay); print the figures. "traced" measures instead, under
    tracemalloc, the Python heap's peak while the store loads the log and during a dry replay."""
    tick = tool(Tick(steps, None), name=TICK, mode="IDEMPOTENT")
    with Runtime(db, tools={TICK: tick}, durability="process") as rt:
        gc.collect()
        if how == "traced":
            print(json.dumps({"how": how, **traced_replay(rt)}))
            return
        peak_reset = reset_peak()
        before = proc_status_kb()
        t0 = time.perf_counter()
        state = rt.resume(LONG_RUN_ID) if how == "resume" else rt.replay(LONG_RUN_ID)
        elapsed = time.perf_counter() - t0
        after = proc_status_kb()
    report = {
        "how": how,
        "peak_reset": peak_reset,
        "baseline_rss_mb": round(before["VmRSS"] / 1024, 1),
        "rss_after_mb": round(after["VmRSS"] / 1024, 1),
        "hwm_mb": round(after["VmHWM"] / 1024, 1),
        "peak_above_baseline_mb": round((after["VmHWM"] - before["VmRSS"]) / 1024, 1),
        "call_s": round(elapsed, 3),
        "state": {
            "status": state.status,
            "steps_replayed": state.steps_replayed,
            "steps_executed": state.steps_executed,
        },
    }
    print(json.dumps(report))


def traced_replay(rt: Runtime) -> Report:
    """The heap's peak (tracemalloc) while the store loads the log, and during a dry replay."""
    import tracemalloc  # here: it is no part of what the other modes measure

    tracemalloc.start()
    loaded = rt.store.load_history(LONG_RUN_ID)
    _, load_peak = tracemalloc.get_traced_memory()
    events_loaded = len(loaded[2])
    del loaded
    tracemalloc.reset_peak()
    rt.replay(LONG_RUN_ID)
    _, replay_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "events_loaded": events_loaded,
        "log_load_heap_peak_mb": round(load_peak / 2**20, 1),
        "dry_replay_heap_peak_mb": round(replay_peak / 2**20, 1),
    }


def measure_long_resume(work: Path, steps: int) -> Report:
    """Build a run of ``steps`` completed steps killed inside the next, then measure a dry
    replay (under tracemalloc, then not) and a resume of it, each in a fresh process."""
    db, marker = work / "long.db", work / "long.kill"
    marker.touch()
    t0 = time.perf_counter()
    built = python(BUILD_LONG, str(db), str(steps), str(marker))
    if built.returncode != -signal.SIGKILL:
        raise AssertionError(f"the long run's builder exited {built.returncode}:\n{built.stderr}")
    marker.unlink()
    build_s = time.perf_counter() - t0
    found: Report = {}
    for how in ("traced", "dry", "resume"):
        done = python(RESUME_LONG, str(db), str(steps), how)
        if done.returncode != 0:
            raise AssertionError(f"{how} of the long run failed:\n{done.stderr}")
        found[how] = json.loads(done.stdout.splitlines()[-1])
    resumed = found["resume"]["state"]
    if resumed != {"status": events.COMPLETED, "steps_replayed": steps, "steps_executed": 1}:
        raise AssertionError(f"the resume of the long run gave {resumed}")
    return {"steps_completed_before_kill": steps, "build_s": round(build_s, 2), **found}


def measure_memory(work: Path, plan: Plan) -> Report:
    say(f"[4/4] memory: a worker over {plan.parked_runs} parked runs; "
        f"resuming a {plan.long_steps}-step run")  # fmt: skip
    parked_db, parking_db = work / "parked.db", work / "parking.db"
    t0 = time.perf_counter()
    park_runs(parked_db, plan.parked_runs)
    park_s = time.perf_counter() - t0
    left = python(LEAVE_RUNNING, str(parking_db), str(plan.parked_runs))
    if left.returncode != 0:
        raise AssertionError(f"leaving runs RUNNING failed:\n{left.stderr}")
    return {
        "worker_concurrency": WORKER_CONCURRENCY,
        "worker_poll_s": WORKER_POLL_S,
        "parked_in_s": round(park_s, 2),
        "worker_over_parked": worker_memory(parked_db, plan.parked_runs, already_parked=True),
        "worker_parking": worker_memory(parking_db, plan.parked_runs, already_parked=False),
        "long_run": measure_long_resume(work, plan.long_steps),
    }


# -- the report -------------------------------------------------------------------------------


def assess(report: Report) -> dict[str, Any]:
    s, c, d, m = report["scale"], report["cli"], report["dashboard"], report["memory"]
    measured = {
        "scale_ratio_process": max(
            s["process"]["ratio_median_big_over_empty"], s["process"]["ratio_mean_big_over_empty"]
        ),
        "scale_ratio_full": max(
            s["full"]["ratio_median_big_over_empty"], s["full"]["ratio_mean_big_over_empty"]
        ),
        "cli_runs_in_process_ms_median": c["default"]["in_process_ms"]["median"],
        "dashboard_list_in_process_ms_median": d["list"]["in_process_ms"]["median"],
        "dashboard_poll_in_process_ms_median": d["poll"]["in_process_ms"]["median"],
        "dashboard_list_http_ms_median": d["list"]["http_ms"]["median"],
        "dashboard_poll_http_ms_median": d["poll"]["http_ms"]["median"],
        "worker_parked_hwm_mb": m["worker_over_parked"]["hwm_mb"],
        "worker_parking_hwm_mb": m["worker_parking"]["hwm_mb"],
        "resume_peak_above_baseline_mb": m["long_run"]["resume"]["peak_above_baseline_mb"],
    }
    return {
        name: {"target": TARGETS[name], "measured": value, "met": value <= TARGETS[name]}
        for name, value in measured.items()
    }


def render(report: Report) -> str:
    return "\n".join(
        [
            *header_lines(report),
            *scale_lines(report["scale"]),
            *cli_lines(report["cli"]),
            *dashboard_lines(report["dashboard"]),
            *memory_lines(report["memory"]),
            *target_lines(report["targets"]),
        ]
    )


def header_lines(report: Report) -> list[str]:
    db = report["database"]
    by_status = ", ".join(f"{k} {v}" for k, v in db["runs_by_status"].items())
    built = f"built in {db['templates_s'] + db['copy_s']:.1f} s"
    if db["reused_from_cache"]:
        built += ", reused from the cache"
    return [
        f"Scale: W40 and the read paths on a big database{harness.quick_mark(report)}",
        harness.machine_line(report["machine"]),
        f"  database: {db['events']} events, {db['runs']} runs ({by_status}), "
        f"{db['side_effects']} side effects, {db['file_mb']} MB; {built}; durabl doctor: "
        f"healthy ({db['doctor']['doctor_s']} s)",
    ]


def scale_lines(s: Report) -> list[str]:
    lines = [
        "",
        f"Per-step overhead over the plain loop, ms ({s['reps']} interleaved reps)",
        f"  {'mode':<9}{'empty median':>13}{'mean':>8}{'big median':>12}{'mean':>8}"
        f"{'ratio median':>14}{'mean':>7}",
    ]
    for mode in ("process", "full"):
        f = s[mode]
        e, b = f["empty"]["overhead_ms_per_step"], f["big"]["overhead_ms_per_step"]
        lines.append(
            f"  {mode:<9}{e['median']:>13.4f}{e['mean']:>8.4f}{b['median']:>12.4f}"
            f"{b['mean']:>8.4f}{f['ratio_median_big_over_empty']:>14.3f}"
            f"{f['ratio_mean_big_over_empty']:>7.3f}"
        )
    return lines


def cli_lines(c: Report) -> list[str]:
    lines = [
        "",
        "durabl runs, ms (medians; the target is judged inside the process)",
        f"  {'ask':<16}{'rows':>7}{'whole process':>15}{'imports':>9}{'main() to output':>18}",
    ]
    for case in CLI_CASES:
        f = c[case]
        lines.append(
            f"  {case:<16}{f['rows']:>7}{f['whole_process_ms']['median']:>15.1f}"
            f"{f['import_ms']['median']:>9.1f}{f['in_process_ms']['median']:>18.1f}"
        )
    asks = ", ".join(f"{k} {v['median']}" for k, v in c["list_runs_ms"].items())
    lines.append(f"  SQLiteStore.list_runs alone: {asks}")
    return lines


def dashboard_lines(d: Report) -> list[str]:
    lines = [
        "",
        f"Dashboard, ms ({d['samples']} requests each; the poll is a RUNNING run after seq "
        f"{d['after_seq']})",
        f"  {'request':<36}{'handler median':>15}{'p95':>8}{'HTTP median':>13}{'p95':>8}",
    ]
    for name in ("list", "list_running", "poll"):
        f = d[name]
        i, h = f["in_process_ms"], f["http_ms"]
        lines.append(
            f"  {f['path']:<36}{i['median']:>15.3f}{i['p95']:>8.3f}{h['median']:>13.3f}"
            f"{h['p95']:>8.3f}"
        )
    return lines


def memory_lines(m: Report) -> list[str]:
    lines = ["", f"Memory (worker --concurrency {m['worker_concurrency']})"]
    for name in ("worker_over_parked", "worker_parking"):
        f = m[name]
        how = "parked before it started" if f["runs_parked_before_worker"] else "parked by it"
        lines.append(
            f"  worker, {f['runs']} runs {how}: RSS {f['rss_mb']} MB, peak {f['hwm_mb']} MB"
        )
    long_ = m["long_run"]
    for how in ("resume", "dry"):
        f = long_[how]
        lines.append(
            f"  {how} of a {long_['steps_completed_before_kill']}-step run: baseline "
            f"{f['baseline_rss_mb']} MB, peak {f['hwm_mb']} MB, +{f['peak_above_baseline_mb']} MB "
            f"({f['call_s']} s)"
        )
    t = long_["traced"]
    lines.append(
        f"  Python heap peak (tracemalloc): the store loading the log ({t['events_loaded']} "
        f"events) {t['log_load_heap_peak_mb']} MB, a dry replay {t['dry_replay_heap_peak_mb']} MB"
    )
    return lines


def target_lines(targets: dict[str, Any]) -> list[str]:
    lines = ["", "Targets (reported, not asserted)"]
    for name, t in targets.items():
        verdict = "met" if t["met"] else "MISSED"
        lines.append(
            f"  {name:<38} target <= {t['target']:<6} measured {t['measured']:<8} {verdict}"
        )
    return lines


# -- the run ----------------------------------------------------------------------------------


def measure(work: Path, quick: bool) -> Report:
    plan = QUICK if quick else FULL
    report: Report = {
        **harness.header("scale", SCHEMA, quick, work, plan.fsync_samples),
        "plan": asdict(plan),
    }
    say(f"[1/4] the big database: {plan.events} events, {plan.runs} runs")
    big, report["database"] = big_database(work, plan)
    say("[2/4] reads: durabl runs, the dashboard's polls")
    report["cli"] = measure_cli(big, plan)
    report["dashboard"] = measure_dashboard(big, plan)
    report["scale"] = measure_scale(work, big, plan)
    report["memory"] = measure_memory(work, plan)
    report["targets"] = assess(report)
    return report


def main(argv: list[str] | None = None) -> int:
    return harness.main(
        argv,
        name="scale",
        doc=__doc__,
        quick_help="50,000 events, 500 runs, 50 parked runs, a 1,000-step resume: "
        "exercises every path, figures are noise",
        measure=measure,
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
