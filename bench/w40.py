"""W40: what durabl costs per step, what replay costs, and whether either grows with the log.

The workload is one ``ModelCall`` to a stub model that answers instantly, then 40 ``ToolCall``s
to a tool that appends one line to a file and returns a ~200-byte dict. The same stub and the
same tool, called directly by a plain Python loop with the same arguments, are the baseline.

What one invocation measures (every figure in the output file comes from this run):

1. overhead: per-step overhead over the plain loop, ``(durabl run - plain run) / 41``, for
   ``durability="process"`` and ``durability="full"`` (the tool registered as a bare callable,
   which is AT_MOST_ONCE, so TOOL_DISPATCHED is made durable before each call), plus
   ``durability="full"`` with the tool registered IDEMPOTENT (one fsync per step, the floor).
   Each configuration has its own fresh database; repetitions are interleaved, in a rotating
   order, so that machine noise hits every configuration and the baseline alike; each durabl
   run is paired with the plain run of the same repetition.
2. replay: a dry ``rt.replay(run_id)`` of a completed W40 run, and ``resume`` on a fresh
   ``Runtime`` of a run killed (``CrashAt("before_run_completed")``) just before completion,
   which serves all 41 steps from the log and writes only RUN_RESUMED + RUN_COMPLETED. Reported
   as the whole call divided by 41 served steps; nothing is subtracted.
3. scaling: the per-step overhead on a (nearly) empty database and on one that already holds
   100,000 events from earlier W40 runs, in both durability modes, and their ratio.
4. a census of the store work per run (transactions, fsync-bearing commits, SQL statements, WAL
   bytes, share of wall time inside the store) and cProfiles of executing and of resuming runs
   in process mode, so the cost can be attributed.

Run times in process mode are bimodal: SQLite's WAL auto-checkpoint (every 1000 frames) lands in
roughly every other W40 run, so a median can sit on either side of the gap from one invocation
to the next. The means, and the raw per-run samples (``raw_run_us``), are in the output too.

Databases live in a temporary directory on a real disk (never tmpfs: fsync must be real).

    python -m bench.w40 --out bench/results/w40.json          # the full benchmark (make bench)
    python -m bench.w40 --quick --out /tmp/w40.json           # seconds; exercises every path
"""

from __future__ import annotations

import cProfile
import json
import math
import pstats
import sqlite3
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

from bench import harness
from bench.harness import Report, percentile, rotations, say, summary
from bench.workload import (
    EXPECTED,
    STEPS,
    TOOL_CALLS,
    TOOL_NAME,
    TOPIC,
    Outbox,
    plain_loop,
    stub_llm,
    w40,
)
from durabl import ModelCall, Runtime, ToolCall, tool, workflow
from durabl.crashpoints import BEFORE_RUN_COMPLETED, CrashAt, ProcessDeath

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""

TARGETS = {
    "full_overhead_ms_per_step_median": 0.5,
    "process_overhead_ms_per_step_median": 0.15,
    "replay_us_per_served_step_median": 15.0,
    "scaling_ratio_100k_over_empty": 1.10,
}
"""Design targets: reported against the figures, never asserted."""


@dataclass(frozen=True)
class Plan:
    """How many repetitions each part runs."""

    warmup: int
    overhead_reps: int
    replay_reps: int
    resume_reps: int
    scaling_reps: int
    prior_events: int
    profile_runs: int
    census_runs: int
    fsync_samples: int


FULL = Plan(
    warmup=5,
    overhead_reps=200,
    replay_reps=500,
    resume_reps=100,
    scaling_reps=150,
    prior_events=100_000,
    profile_runs=200,
    census_runs=50,
    fsync_samples=300,
)
QUICK = Plan(
    warmup=1,
    overhead_reps=3,
    replay_reps=5,
    resume_reps=2,
    scaling_reps=2,
    prior_events=1_000,
    profile_runs=2,
    census_runs=2,
    fsync_samples=20,
)


# -- the workload (bench/workload.py) plus a variable-length twin ---------------------------


@workflow(name="bench.wn")
def wn(ctx: Any, topic: str, n: int) -> Any:
    """W40's shape with ``n`` tool calls: used to split resume cost into fixed and per-step."""
    plan = yield ModelCall(f"Plan a search about {topic}")
    for i in range(n):
        yield ToolCall(TOOL_NAME, {"i": i, "topic": topic})
    return {"plan": plan["plan"], "hits": n}


SLOPE_SIZES = (40, 400)
"""Tool calls in the short and the long run whose resume times give the per-step slope."""


def make_runtime(
    db: Path, durability: str, outbox: Outbox, tool_mode: str | None = None
) -> Runtime:
    """A runtime for W40. ``tool_mode=None`` registers the tool as a bare callable (the default,
    AT_MOST_ONCE); otherwise it is wrapped with ``tool(..., mode=tool_mode)``."""
    registered: Any = outbox if tool_mode is None else tool(outbox, name=TOOL_NAME, mode=tool_mode)
    return Runtime(db, llm=stub_llm, tools={TOOL_NAME: registered}, durability=durability)


def start_killed(db: Path, durability: str, outbox: Outbox, wf: Any, run_input: Any) -> str:
    """Start a run on a runtime that dies just before completing it
    (``CrashAt("before_run_completed")``): every step is in the log, finished, and the run is
    left RUNNING for another runtime to resume. Returns its id."""
    run_id = uuid.uuid4().hex
    doomed = make_runtime(db, durability, outbox)
    try:
        with CrashAt(BEFORE_RUN_COMPLETED):
            doomed.start(wf, run_input, run_id=run_id)
        raise AssertionError("the run was not killed before completion")
    except ProcessDeath:
        return run_id
    finally:
        doomed.close()


# -- measuring ------------------------------------------------------------------------------


class Subject:
    """One thing that executes W40 once per call of ``run`` and returns its wall time (ns)."""

    label: str
    outbox: Outbox
    runs: int = 0

    def run(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class PlainSubject(Subject):
    def __init__(self, label: str, outbox: Outbox) -> None:
        self.label = label
        self.outbox = outbox
        self.runs = 0

    def run(self) -> int:
        t0 = time.perf_counter_ns()
        result = plain_loop(stub_llm, self.outbox, TOPIC)
        elapsed = time.perf_counter_ns() - t0
        if result != EXPECTED:
            raise AssertionError(f"plain loop returned {result!r}")
        self.runs += 1
        return elapsed


class DurablSubject(Subject):
    def __init__(
        self,
        label: str,
        db: Path,
        durability: str,
        outbox: Outbox,
        tool_mode: str | None = None,
    ) -> None:
        self.label = label
        self.db = db
        self.durability = durability
        self.tool_mode = tool_mode or "AT_MOST_ONCE"
        self.registration = "bare callable" if tool_mode is None else f"tool(mode={tool_mode!r})"
        self.outbox = outbox
        self.rt = make_runtime(db, durability, outbox, tool_mode)
        self.runs = 0

    def run(self) -> int:
        t0 = time.perf_counter_ns()
        run_id = self.rt.start(w40, {"topic": TOPIC})
        elapsed = time.perf_counter_ns() - t0
        result = self.rt.result(run_id)  # raises unless COMPLETED
        if result != EXPECTED:
            raise AssertionError(f"{self.label}: run {run_id} returned {result!r}")
        self.runs += 1
        return elapsed

    def close(self) -> None:
        self.rt.close()


def interleave(
    subjects: Sequence[Subject], reps: int, warmup: int, progress: str
) -> dict[str, list[int]]:
    """Run every subject ``reps`` times, one of each per repetition, in a rotating order."""
    for _ in range(warmup):
        for s in subjects:
            s.run()
    samples: dict[str, list[int]] = {s.label: [] for s in subjects}
    for rep, order in enumerate(rotations(subjects, reps)):
        for s in order:
            samples[s.label].append(s.run())
        if reps >= 10 and (rep + 1) % max(1, reps // 4) == 0:
            say(f"  {progress}: {rep + 1}/{reps}")
    for s in subjects:
        expected_lines = TOOL_CALLS * s.runs
        if s.outbox.lines() != expected_lines:
            raise AssertionError(
                f"{s.label}: the outbox has {s.outbox.lines()} lines after {s.runs} runs, "
                f"expected {expected_lines}"
            )
    return samples


def interleave_and_close(
    subjects: Sequence[Subject], reps: int, warmup: int, progress: str
) -> dict[str, list[int]]:
    try:
        return interleave(subjects, reps, warmup, progress)
    finally:
        for s in subjects:
            s.close()


def overhead_figures(durabl_ns: Sequence[int], plain_ns: Sequence[int]) -> dict[str, Any]:
    """Per-step overhead of each durabl run over the plain run of the same repetition, in ms."""
    per_step = [(d - p) / STEPS / 1e6 for d, p in zip(durabl_ns, plain_ns, strict=True)]
    s = summary(per_step)
    return {
        "overhead_ms_per_step_median": s["median"],
        "overhead_ms_per_step_p95": s["p95"],
        "overhead_ms_per_step_min": s["min"],
        "overhead_ms_per_step_mean": s["mean"],
        "run_ms_median": round(statistics.median(durabl_ns) / 1e6, 4),
        "run_ms_p95": round(percentile(durabl_ns, 95) / 1e6, 4),
        "reps": len(per_step),
    }


def plain_figures(plain_ns: Sequence[int]) -> dict[str, Any]:
    return {
        "us_per_step_median": round(statistics.median(plain_ns) / STEPS / 1e3, 3),
        "us_per_step_p95": round(percentile(plain_ns, 95) / STEPS / 1e3, 3),
        "run_ms_median": round(statistics.median(plain_ns) / 1e6, 4),
        "reps": len(plain_ns),
    }


def served_figures(times_ns: Sequence[int]) -> dict[str, Any]:
    """A call that serves all 41 steps from the log, per served step in us; nothing subtracted."""
    per_step = [t / STEPS / 1e3 for t in times_ns]
    s = summary(per_step, digits=3)
    return {
        "us_per_served_step_median": s["median"],
        "us_per_served_step_p95": s["p95"],
        "us_per_served_step_min": s["min"],
        "call_ms_median": round(statistics.median(times_ns) / 1e6, 4),
        "steps_served": STEPS,
        "reps": len(times_ns),
    }


def raw_us(samples: dict[str, list[int]]) -> dict[str, list[int]]:
    return {label: [round(t / 1e3) for t in ts] for label, ts in samples.items()}


# -- part 1: per-step overhead --------------------------------------------------------------


def measure_overhead(
    work: Path, plan: Plan, raw: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    say("[1/5] per-step overhead: process, full, full+IDEMPOTENT vs the plain loop")
    plain = PlainSubject("plain", Outbox(work / "overhead_plain.txt"))
    subjects: list[Subject] = [
        plain,
        DurablSubject(
            "process",
            work / "overhead_process.db",
            "process",
            Outbox(work / "overhead_process.txt"),
        ),
        DurablSubject(
            "full", work / "overhead_full.db", "full", Outbox(work / "overhead_full.txt")
        ),
        DurablSubject(
            "full_idempotent",
            work / "overhead_full_idem.db",
            "full",
            Outbox(work / "overhead_full_idem.txt"),
            tool_mode="IDEMPOTENT",
        ),
    ]
    samples = interleave_and_close(subjects, plan.overhead_reps, plan.warmup, "overhead")
    raw["overhead"] = raw_us(samples)
    figures: dict[str, Any] = {}
    for s in subjects:
        if isinstance(s, DurablSubject):
            figures[s.label] = {
                "durability": s.durability,
                "tool_mode": s.tool_mode,
                "tool_registration": s.registration,
                **overhead_figures(samples[s.label], samples["plain"]),
            }
    return figures, plain_figures(samples["plain"])


# -- part 2: replay cost --------------------------------------------------------------------


def measure_replay(work: Path, plan: Plan) -> dict[str, Any]:
    say("[2/5] replay: dry replay of a completed run, resume of a run killed before completion")
    return {"dry_replay": measure_dry_replay(work, plan), **measure_resumes(work, plan)}


def measure_dry_replay(work: Path, plan: Plan) -> dict[str, Any]:
    """A dry ``rt.replay`` of one completed run, again and again on the runtime that ran it."""
    outbox = Outbox(work / "replay.txt")
    rt = make_runtime(work / "replay.db", "process", outbox)
    try:
        run_id = rt.start(w40, {"topic": TOPIC})
        times: list[int] = []
        for i in range(plan.warmup + plan.replay_reps):
            t0 = time.perf_counter_ns()
            state = rt.replay(run_id)
            elapsed = time.perf_counter_ns() - t0
            if state.status != "COMPLETED" or state.steps_replayed != STEPS or state.steps_executed:
                raise AssertionError(f"dry replay gave {state!r}")
            if i >= plan.warmup:
                times.append(elapsed)
    finally:
        rt.close()
    if outbox.lines() != TOOL_CALLS:
        raise AssertionError("a dry replay called the tool")
    return served_figures(times)


def measure_resumes(work: Path, plan: Plan) -> dict[str, Any]:
    """``resume`` on a fresh runtime of a run killed just before completion, in both modes; and,
    in process mode, a dry replay of the same log on yet another fresh runtime: the resume
    without its two writes."""
    modes = ("process", "full")
    outboxes = {mode: Outbox(work / f"resume_{mode}.txt") for mode in modes}
    open_ns: dict[str, list[int]] = {mode: [] for mode in modes}
    resume_ns: dict[str, list[int]] = {mode: [] for mode in modes}
    fresh_dry_ns: list[int] = []
    for i, order in enumerate(rotations(modes, plan.warmup + plan.resume_reps)):
        counted = i >= plan.warmup
        for mode in order:
            db = work / f"resume_{mode}.db"
            run_id = start_killed(db, mode, outboxes[mode], w40, {"topic": TOPIC})
            opened, resumed = resume_on_fresh_runtime(db, mode, outboxes[mode], run_id)
            if counted:
                open_ns[mode].append(opened)
                resume_ns[mode].append(resumed)
            if mode == "process":
                dry = dry_replay_on_fresh_runtime(db, outboxes[mode], run_id)
                if counted:
                    fresh_dry_ns.append(dry)
    for mode, ob in outboxes.items():
        if ob.lines() != TOOL_CALLS * (plan.warmup + plan.resume_reps):
            raise AssertionError(f"resume ({mode}) called the tool again: {ob.lines()} lines")
    figures: dict[str, Any] = {"dry_replay_fresh_runtime": served_figures(fresh_dry_ns)}
    for mode in modes:
        figures[f"resume_{mode}"] = {
            **served_figures(resume_ns[mode]),
            "runtime_open_ms_median": round(statistics.median(open_ns[mode]) / 1e6, 4),
        }
    return figures


def resume_on_fresh_runtime(
    db: Path, durability: str, outbox: Outbox, run_id: str
) -> tuple[int, int]:
    """Open a fresh runtime and resume the killed run ``run_id`` on it, serving all 41 steps
    from the log: the ns the opening took, and the ns the resume took."""
    t0 = time.perf_counter_ns()
    fresh = make_runtime(db, durability, outbox)
    t1 = time.perf_counter_ns()
    try:
        state = fresh.resume(run_id)
        t2 = time.perf_counter_ns()
    finally:
        fresh.close()
    if (
        state.status != "COMPLETED"
        or state.steps_replayed != STEPS
        or state.steps_executed != 0
        or state.result != EXPECTED
    ):
        raise AssertionError(f"resume after the crash gave {state!r}")
    return t1 - t0, t2 - t1


def dry_replay_on_fresh_runtime(db: Path, outbox: Outbox, run_id: str) -> int:
    """The ns a dry replay of ``run_id`` takes on a runtime that has not seen the run before."""
    other = make_runtime(db, "process", outbox)
    try:
        t0 = time.perf_counter_ns()
        state = other.replay(run_id)
        t1 = time.perf_counter_ns()
    finally:
        other.close()
    if state.status != "COMPLETED" or state.steps_replayed != STEPS:
        raise AssertionError(f"dry replay on a fresh runtime gave {state!r}")
    return t1 - t0


def measure_resume_slope(work: Path, plan: Plan) -> dict[str, Any]:
    """Resume cost split into a fixed part (open the log, write RUN_RESUMED + RUN_COMPLETED)
    and a per-served-step part: the slope between runs of 41 and 401 steps, process mode."""
    outbox = Outbox(work / "slope.txt")
    db = work / "slope.db"
    times: dict[int, list[int]] = {n: [] for n in SLOPE_SIZES}
    for i, order in enumerate(rotations(SLOPE_SIZES, plan.warmup + plan.resume_reps)):
        for n in order:
            run_id = start_killed(db, "process", outbox, wn, {"topic": TOPIC, "n": n})
            fresh = make_runtime(db, "process", outbox)
            try:
                t0 = time.perf_counter_ns()
                state = fresh.resume(run_id)
                elapsed = time.perf_counter_ns() - t0
            finally:
                fresh.close()
            if state.status != "COMPLETED" or state.steps_replayed != n + 1:
                raise AssertionError(f"resume of a {n + 1}-step run gave {state!r}")
            if i >= plan.warmup:
                times[n].append(elapsed)
    short, long = (statistics.median(times[n]) for n in SLOPE_SIZES)
    slope_us = (long - short) / (SLOPE_SIZES[1] - SLOPE_SIZES[0]) / 1e3
    return {
        "sizes_steps": [n + 1 for n in SLOPE_SIZES],
        "resume_ms_median": [round(statistics.median(times[n]) / 1e6, 4) for n in SLOPE_SIZES],
        "us_per_served_step": round(slope_us, 3),
        "fixed_ms": round((short / 1e3 - (SLOPE_SIZES[0] + 1) * slope_us) / 1e3, 4),
        "reps": plan.resume_reps,
    }


# -- part 3: scaling with the size of the log ------------------------------------------------


def count_events(db: Path) -> int:
    """Events in the file, counted by SQLite: the store has no verb for it, and reading every
    event back through it would check every checksum only to count them."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
    finally:
        conn.close()


def populate(db: Path, outbox: Outbox, target_events: int) -> tuple[int, int, float]:
    """Run W40 in process mode until the database holds ``target_events`` events."""
    t0 = time.perf_counter()
    runs = 0
    rt = make_runtime(db, "process", outbox)
    try:
        rt.start(w40, {"topic": TOPIC})
        runs = 1
        per_run = count_events(db)
        events_now = per_run
        while events_now < target_events:
            batch = math.ceil((target_events - events_now) / per_run)
            for _ in range(batch):
                rt.start(w40, {"topic": TOPIC})
            runs += batch
            events_now = count_events(db)
            say(f"  populated {events_now} events ({runs} runs)")
    finally:
        rt.close()
    return events_now, runs, time.perf_counter() - t0


def measure_scaling(work: Path, plan: Plan, raw: dict[str, Any]) -> dict[str, Any]:
    say(f"[3/5] scaling: empty database vs one holding >= {plan.prior_events} events")
    big = work / "scaling_prior.db"
    prior, populate_runs, populate_s = populate(
        big, Outbox(work / "scaling_populate.txt"), plan.prior_events
    )
    empty = work / "scaling_empty.db"
    subjects: list[Subject] = [PlainSubject("plain", Outbox(work / "scaling_plain.txt"))]
    for mode in ("process", "full"):
        subjects.append(
            DurablSubject(f"{mode}@empty", empty, mode, Outbox(work / f"scaling_{mode}_e.txt"))
        )
        subjects.append(
            DurablSubject(f"{mode}@prior", big, mode, Outbox(work / f"scaling_{mode}_p.txt"))
        )
    samples = interleave_and_close(subjects, plan.scaling_reps, plan.warmup, "scaling")
    raw["scaling"] = raw_us(samples)
    figures: dict[str, Any] = {
        "prior_events": prior,
        "populate_runs": populate_runs,
        "populate_s": round(populate_s, 2),
        "events_per_run": prior // populate_runs,
        "empty_db_events_at_end": count_events(empty),
        "prior_db_events_at_end": count_events(big),
        "plain": plain_figures(samples["plain"]),
    }
    for mode in ("process", "full"):
        figures[mode] = growth_figures(samples[f"{mode}@empty"], samples[f"{mode}@prior"], samples)
    return figures


def growth_figures(
    at_empty_ns: Sequence[int], at_prior_ns: Sequence[int], samples: dict[str, list[int]]
) -> dict[str, Any]:
    """One mode's overhead on the empty and on the full database, and how much it grew."""
    at_empty = overhead_figures(at_empty_ns, samples["plain"])
    at_prior = overhead_figures(at_prior_ns, samples["plain"])
    return {
        "empty": at_empty,
        "prior": at_prior,
        "ratio_prior_over_empty": round(
            at_prior["overhead_ms_per_step_median"] / at_empty["overhead_ms_per_step_median"], 3
        ),
        "ratio_mean_prior_over_empty": round(
            at_prior["overhead_ms_per_step_mean"] / at_empty["overhead_ms_per_step_mean"], 3
        ),
    }


# -- part 4: where the time goes -------------------------------------------------------------


STORE_METHODS = ("create_run", "commit", "get_run", "load_log", "side_effect", "key_claim")


class _CountingConnection:
    """Stands in for the store's sqlite3 connection and counts the statements it is handed."""

    def __init__(self, conn: sqlite3.Connection, issued: Counter[str]) -> None:
        self._real = conn
        self._issued = issued

    def execute(self, sql: str, *params: Any) -> sqlite3.Cursor:
        self._issued[_statement_kind(sql)] += 1
        return self._real.execute(sql, *params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The store sets attributes such as ``row_factory``: they belong to the real connection.
        if name in ("_real", "_issued"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._real, name, value)


@contextmanager
def counting_statements(issued: Counter[str]) -> Iterator[None]:
    """While inside, every SQLite connection opened counts in ``issued`` the statements it is
    handed: a runtime opened here has its store's connection counted without anything reaching
    into the store for it."""
    real = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        return _CountingConnection(real(*args, **kwargs), issued)

    with mock.patch.object(sqlite3, "connect", connect):
        yield


class StoreTally:
    """What a runtime asks of its store: calls per store method (durable commits apart), the SQL
    statements its connection is handed, by kind, and the time spent inside the store methods
    (timed by wrappers, not by a profiler)."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.issued: Counter[str] = Counter()
        self.store_ns = 0

    def count_calls(self, store: Any) -> None:
        """From now on, count and time every call of the store's ``STORE_METHODS``."""
        for name in STORE_METHODS:
            setattr(store, name, self._counted(name, getattr(store, name)))

    def _counted(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if name == "commit" and getattr(args[0], "durable", False):
                self.calls["commit(durable=True)"] += 1
            t0 = time.perf_counter_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.store_ns += time.perf_counter_ns() - t0

        return wrapper


def measure_census(work: Path, plan: Plan, overhead: dict[str, Any]) -> dict[str, Any]:
    """The census of every configuration the overhead part measured."""
    say("[4/5] census of store work per run")
    return {
        label: census(
            work,
            label,
            f["durability"],
            None if f["tool_mode"] == "AT_MOST_ONCE" else f["tool_mode"],
            plan.census_runs,
        )
        for label, f in overhead.items()
    }


def census(
    work: Path, label: str, durability: str, tool_mode: str | None, runs: int
) -> dict[str, Any]:
    """Store calls, transactions, SQL statements and WAL bytes per W40 run, and the share of a
    run's wall time spent inside the store."""
    db = work / f"census_{label}.db"
    tally = StoreTally()
    with counting_statements(tally.issued):
        rt = make_runtime(db, durability, Outbox(work / f"census_{label}.txt"), tool_mode)
    try:
        rt.start(w40, {"topic": TOPIC})  # warm-up, uncounted
        tally.issued.clear()
        tally.count_calls(rt.store)
        wal_bytes, page_size, run_ns = time_census_runs(rt, db, runs)
    finally:
        rt.close()
    calls, issued = tally.calls, tally.issued
    fsync_commits = calls["create_run"] + calls["commit(durable=True)"]
    return {
        "durability": durability,
        "tool_mode": tool_mode or "AT_MOST_ONCE",
        "runs": runs,
        "store_calls_per_run": {k: round(v / runs, 2) for k, v in sorted(calls.items())},
        "transactions_per_run": round((calls["create_run"] + calls["commit"]) / runs, 2),
        "durable_commits_per_run": round(fsync_commits / runs, 2) if durability == "full" else 0,
        "sql_statements_per_run": round(sum(issued.values()) / runs, 2),
        "sql_statements_by_kind": {k: round(v / runs, 2) for k, v in issued.most_common()},
        "wal_bytes_per_run": wal_bytes,
        "wal_frames_per_run": round(wal_bytes / (page_size + 24), 1),
        "run_ms_mean": round(run_ns / runs / 1e6, 4),
        "store_ms_per_run": round(tally.store_ns / runs / 1e6, 4),
        "store_share_of_run": round(tally.store_ns / run_ns, 3),
    }


def time_census_runs(rt: Runtime, db: Path, runs: int) -> tuple[int, int, int]:
    """Run W40 ``runs`` times: the WAL bytes the first run writes into a just truncated WAL, the
    database's page size (a WAL frame is a page plus 24 bytes), and the ns all runs took."""
    wal = Path(f"{db}-wal")
    side = sqlite3.connect(db)
    try:
        side.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = int(side.execute("PRAGMA page_size").fetchone()[0])
    finally:
        side.close()
    wal_before = wal.stat().st_size if wal.exists() else 0
    run_ns = 0
    t0 = time.perf_counter_ns()
    rt.start(w40, {"topic": TOPIC})
    run_ns += time.perf_counter_ns() - t0
    wal_bytes = (wal.stat().st_size if wal.exists() else 0) - wal_before
    for _ in range(runs - 1):
        t0 = time.perf_counter_ns()
        rt.start(w40, {"topic": TOPIC})
        run_ns += time.perf_counter_ns() - t0
    return wal_bytes, page_size, run_ns


def _statement_kind(sql: str) -> str:
    text = " ".join(sql.split())
    if text.startswith("--"):
        return "trigger body"
    upper = text.upper()
    if upper.startswith("PRAGMA"):
        return text
    for prefix in ("BEGIN", "COMMIT", "ROLLBACK"):
        if upper.startswith(prefix):
            return prefix
    words = upper.split()
    if words[0] == "INSERT":
        return f"INSERT {words[2]}"
    if words[0] == "UPDATE":
        return f"UPDATE {words[1]}"
    if words[0] == "DELETE":
        return f"DELETE {words[2]}"
    if words[0] == "SELECT":
        return f"SELECT .. FROM {words[words.index('FROM') + 1]}" if "FROM" in words else "SELECT"
    return words[0]


def add_sync_floor(overhead: dict[str, Any], census: dict[str, Any], sync_us: float) -> None:
    """Give each configuration the floor its fsyncs set: the durable commits the census counted
    per run, each costing one fdatasync, spread over the run's 41 steps."""
    for label, f in overhead.items():
        durable = census[label]["durable_commits_per_run"]
        f["durable_commits_per_run"] = durable
        f["sync_floor_ms_per_step"] = round(durable * sync_us / STEPS / 1e3, 4)


def profile_execution(work: Path, plan: Plan) -> dict[str, Any]:
    """cProfile of W40 runs in process mode: where an executed step's time goes."""
    outbox = Outbox(work / "profile.txt")
    rt = make_runtime(work / "profile.db", "process", outbox)
    prof = cProfile.Profile()
    try:
        for _ in range(plan.warmup):
            rt.start(w40, {"topic": TOPIC})
        prof.enable()
        for _ in range(plan.profile_runs):
            rt.start(w40, {"topic": TOPIC})
        prof.disable()
    finally:
        rt.close()
    return {"durability": "process", **profile_figures(prof, plan.profile_runs)}


def profile_resume(work: Path, plan: Plan) -> dict[str, Any]:
    """cProfile of resume on a fresh Runtime (process mode), all 41 steps served from the log."""
    outbox = Outbox(work / "profile_resume.txt")
    db = work / "profile_resume.db"
    pending = [
        start_killed(db, "process", outbox, w40, {"topic": TOPIC}) for _ in range(plan.profile_runs)
    ]
    fresh = [make_runtime(db, "process", outbox) for _ in pending]
    prof = cProfile.Profile()
    try:
        prof.enable()
        for rt, run_id in zip(fresh, pending, strict=True):
            rt.resume(run_id)
        prof.disable()
    finally:
        for rt in fresh:
            rt.close()
    return {"durability": "process", **profile_figures(prof, len(pending))}


ProfileRow = tuple[float, float, int, str]
"""One profiled function: self seconds, cumulative seconds, calls, label."""


def profile_figures(prof: cProfile.Profile, runs: int) -> dict[str, Any]:
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    steps = runs * STEPS
    total_s = sum(tt for (_, _, tt, _, _) in raw.values())
    rows: list[ProfileRow] = []
    areas: dict[str, float] = {}
    for (filename, line, func), (_cc, ncalls, tt, ct, _callers) in raw.items():
        rows.append((tt, ct, ncalls, _profile_label(filename, line, func)))
        area = _profile_area(filename, func)
        areas[area] = areas.get(area, 0.0) + tt
    rows.sort(reverse=True)
    by_cum = sorted(
        (r for r in rows if r[3].startswith("durabl/")), key=lambda r: r[1], reverse=True
    )
    return {
        "runs": runs,
        "steps": steps,
        "profiled_us_per_step": round(total_s / steps * 1e6, 2),
        "by_area_us_per_step": {
            area: round(tt / steps * 1e6, 2)
            for area, tt in sorted(areas.items(), key=lambda kv: kv[1], reverse=True)[:12]
        },
        "top_self": [_profile_entry(r, steps) for r in rows[:20]],
        "top_cumulative_durabl": [_profile_entry(r, steps) for r in by_cum[:20]],
    }


def _profile_entry(row: ProfileRow, steps: int) -> dict[str, Any]:
    tt, ct, ncalls, label = row
    return {
        "function": label,
        "calls_per_step": round(ncalls / steps, 3),
        "self_us_per_step": round(tt / steps * 1e6, 2),
        "cumulative_us_per_step": round(ct / steps * 1e6, 2),
    }


def _profile_label(filename: str, line: int, func: str) -> str:
    if filename == "~":
        return func
    path = Path(filename)
    parts = path.parts
    if "durabl" in parts:
        short = "/".join(parts[parts.index("durabl") :])
    elif "bench" in parts:
        short = "/".join(parts[parts.index("bench") :])
    else:
        short = path.name
    return f"{short}:{line}({func})"


def _profile_area(filename: str, func: str) -> str:
    if filename == "~":
        if "sqlite3" in func:
            return "sqlite3 (C: " + func.split("'")[1] + ")" if "'" in func else "sqlite3 (C)"
        if "json" in func or "encode" in func or "decode" in func:
            return "json (C)"
        return "other builtins"
    parts = Path(filename).parts
    if "durabl" in parts:
        return "/".join(parts[parts.index("durabl") :])
    if "bench" in parts:
        return "benchmark workload (llm stub, tool, workflow body)"
    return f"stdlib {Path(filename).name}"


# -- the report -----------------------------------------------------------------------------


def assess(report: Report) -> dict[str, Any]:
    o, r, s = report["overhead"], report["replay"], report["scaling"]
    # The mean ratio: process-mode run times are bimodal (a WAL checkpoint lands in roughly
    # every other run), which makes the ratio of two medians jump between invocations.
    worst_ratio = max(
        s["process"]["ratio_mean_prior_over_empty"], s["full"]["ratio_mean_prior_over_empty"]
    )
    checks = {
        "full_overhead_ms_per_step_median": o["full"]["overhead_ms_per_step_median"],
        "process_overhead_ms_per_step_median": o["process"]["overhead_ms_per_step_median"],
        "replay_us_per_served_step_median": max(
            r["dry_replay"]["us_per_served_step_median"],
            report["resume_slope"]["us_per_served_step"],
        ),
        "scaling_ratio_100k_over_empty": worst_ratio,
    }
    return {
        name: {"target": TARGETS[name], "measured": value, "met": value <= TARGETS[name]}
        for name, value in checks.items()
    }


def render(report: Report) -> str:
    return "\n".join(
        [
            *_header_lines(report),
            *_overhead_lines(report),
            *_replay_lines(report),
            *_scaling_lines(report["scaling"]),
            *_census_lines(report["census"]),
            *_profile_lines(report["profile"]),
            *_target_lines(report["targets"]),
        ]
    )


def _header_lines(report: Report) -> list[str]:
    m = report["machine"]
    return [
        f"W40 ({STEPS} steps: 1 ModelCall + {TOOL_CALLS} ToolCalls){harness.quick_mark(report)}",
        harness.machine_line(m),
        f"  scratch: {m['scratch_dir']} ({m['scratch_filesystem']}); 4 KiB append + fsync "
        f"{m['fsync_us_median']} us, + fdatasync {m['fdatasync_us_median']} us (medians)",
    ]


def _overhead_lines(report: Report) -> list[str]:
    o, p = report["overhead"], report["plain_loop"]
    lines = [
        "",
        f"Per-step overhead over the plain loop ({p['reps']} interleaved reps each; "
        f"sync floor = durable commits x fdatasync / {STEPS})",
        f"  {'configuration':<34}{'median ms':>10}{'p95 ms':>10}{'mean ms':>10}"
        f"{'run ms':>9}{'fsyncs':>8}{'floor ms':>10}",
    ]
    for label, f in o.items():
        name = f"{label} ({f['durability']}, {f['tool_mode']})"
        lines.append(
            f"  {name:<34}{f['overhead_ms_per_step_median']:>10.4f}"
            f"{f['overhead_ms_per_step_p95']:>10.4f}{f['overhead_ms_per_step_mean']:>10.4f}"
            f"{f['run_ms_median']:>9.3f}"
            f"{f['durable_commits_per_run']:>8g}{f['sync_floor_ms_per_step']:>10.4f}"
        )
    lines.append(
        f"  {'plain loop (us per step)':<34}{p['us_per_step_median']:>10.3f}"
        f"{p['us_per_step_p95']:>10.3f}{'':>10}{p['run_ms_median']:>9.3f}"
    )
    return lines


def _replay_lines(report: Report) -> list[str]:
    lines = [
        "",
        f"Replay cost per served step ({STEPS} served steps per call, nothing subtracted)",
        f"  {'operation':<34}{'median us':>10}{'p95 us':>10}{'call ms':>10}",
    ]
    for label, f in report["replay"].items():
        lines.append(
            f"  {label:<34}{f['us_per_served_step_median']:>10.2f}"
            f"{f['us_per_served_step_p95']:>10.2f}{f['call_ms_median']:>10.3f}"
        )
    sl = report["resume_slope"]
    lines.append(
        f"  resume, per served step (slope {sl['sizes_steps'][0]} -> {sl['sizes_steps'][1]} steps)"
        f"{sl['us_per_served_step']:>8.2f} us; fixed part {sl['fixed_ms']:.3f} ms per resume"
    )
    return lines


def _scaling_lines(s: dict[str, Any]) -> list[str]:
    lines = [
        "",
        f"Scaling: per-step overhead, empty db vs {s['prior_events']} prior events "
        f"({s['populate_runs']} runs, populated in {s['populate_s']} s)",
        f"  {'':<10}{'--- empty db (ms/step) ---':>29}{'--- prior events (ms/step) ---':>32}"
        f"{'ratio':>8}{'ratio':>7}",
        f"  {'mode':<10}{'median':>10}{'p95':>9}{'mean':>10}{'median':>11}{'p95':>9}{'mean':>12}"
        f"{'median':>8}{'mean':>7}",
    ]
    for mode in ("process", "full"):
        f = s[mode]
        e, q = f["empty"], f["prior"]
        lines.append(
            f"  {mode:<10}{e['overhead_ms_per_step_median']:>10.4f}"
            f"{e['overhead_ms_per_step_p95']:>9.4f}{e['overhead_ms_per_step_mean']:>10.4f}"
            f"{q['overhead_ms_per_step_median']:>11.4f}"
            f"{q['overhead_ms_per_step_p95']:>9.4f}{q['overhead_ms_per_step_mean']:>12.4f}"
            f"{f['ratio_prior_over_empty']:>8.3f}{f['ratio_mean_prior_over_empty']:>7.3f}"
        )
    return lines


def _census_lines(census: dict[str, Any]) -> list[str]:
    lines = ["", "Store work per run (census)"]
    for label, c in census.items():
        lines.append(
            f"  {label:<16} {c['transactions_per_run']:g} transactions, "
            f"{c['durable_commits_per_run']:g} fsync commits, "
            f"{c['sql_statements_per_run']:g} SQL statements, "
            f"{c['wal_bytes_per_run'] / 1024:.0f} KiB WAL ({c['wal_frames_per_run']:g} frames); "
            f"{c['store_share_of_run'] * 100:.0f}% of wall time in the store"
        )
    return lines


def _profile_lines(profiles: dict[str, Any]) -> list[str]:
    lines = []
    for kind, prof in profiles.items():
        lines += [
            "",
            f"Profile of {kind} (process mode, {prof['runs']} runs, "
            f"{prof['profiled_us_per_step']} us/step under cProfile): self time, us per step",
        ]
        for area, us in list(prof["by_area_us_per_step"].items())[:8]:
            lines.append(f"  {us:>8.2f}  {area}")
    return lines


def _target_lines(targets: dict[str, Any]) -> list[str]:
    lines = ["", "Targets (reported, not asserted)"]
    for name, t in targets.items():
        verdict = "met" if t["met"] else "NOT met"
        lines.append(
            f"  {name:<38} target <= {t['target']:<6} measured {t['measured']:<8} {verdict}"
        )
    return lines


# -- the run --------------------------------------------------------------------------------


def measure(work: Path, quick: bool) -> Report:
    plan = QUICK if quick else FULL
    probe = Outbox(work / "probe.txt")(0, TOPIC)
    report: Report = {
        **harness.header("W40", SCHEMA, quick, work, plan.fsync_samples),
        "workload": {
            "steps": STEPS,
            "model_calls": 1,
            "tool_calls": TOOL_CALLS,
            "tool_result_bytes": len(json.dumps(probe, separators=(",", ":"))),
        },
        "repetitions": {
            "warmup": plan.warmup,
            "overhead": plan.overhead_reps,
            "dry_replay": plan.replay_reps,
            "resume": plan.resume_reps,
            "scaling": plan.scaling_reps,
            "profile_runs": plan.profile_runs,
            "census_runs": plan.census_runs,
        },
    }
    raw: dict[str, Any] = {}
    report["overhead"], report["plain_loop"] = measure_overhead(work, plan, raw)
    report["replay"] = measure_replay(work, plan)
    report["resume_slope"] = measure_resume_slope(work, plan)
    report["scaling"] = measure_scaling(work, plan, raw)
    report["census"] = measure_census(work, plan, report["overhead"])
    add_sync_floor(report["overhead"], report["census"], report["machine"]["fdatasync_us_median"])
    say("[5/5] profiles (process mode): executing runs, resuming runs")
    report["profile"] = {
        "execute": profile_execution(work, plan),
        "resume": profile_resume(work, plan),
    }
    report["targets"] = assess(report)
    report["raw_run_us"] = raw
    return report


def main(argv: list[str] | None = None) -> int:
    return harness.main(
        argv,
        name="w40",
        doc=__doc__,
        quick_help="a few repetitions of everything: exercises the code, figures are noise",
        measure=measure,
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
