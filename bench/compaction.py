"""Compaction: what ``Runtime.compact`` does to the file size, replay, history loading and resume
of a 10,000-step run, and whether replay after compaction grows with the folded prefix.

The workload is an agent loop: each iteration is one ``ModelCall`` to a stub model, whose answer
names a tool call (arguments of about 400 bytes) and carries a ``usage`` object, then that
``ToolCall`` to a stub search tool that returns about 300 bytes. 5,000 iterations make 10,000
steps. The runtime uses ``durability="full"`` (the default) and the tool is registered as a bare
callable (``AT_MOST_ONCE``, the default), so every run is recorded the way a default
deployment records it.

Each repetition builds the run on a fresh database and then measures, in this process:

1. size: the database file plus its ``-wal``, each time after a ``wal_checkpoint(TRUNCATE)``
   with no runtime open, so every state is measured the same way. Before compaction, after
   ``compact(keep_last=0)`` and ``compact(keep_last=100)``, and after ``compact(keep_last=0,
   reclaim=False)`` (what compaction frees before the pages go back to the file system).
2. compaction time: ``compact(run_id, keep_last=k)`` with ``reclaim=True`` (the default), the
   whole call; for ``keep_last=0`` the fold and the reclaim timed apart; and a second
   compaction of a copy already compacted with ``keep_last=100``, which folds its last 100
   steps into the existing snapshot.
3. by prefix: copies of the same completed run compacted to 0, 25%, 50%, 75%, 99% and 100% of
   its steps (via ``keep_last``). For each: a dry ``replay(run_id)`` of the whole run and the
   history load alone (``store.load_history`` + ``History.from_events``), each after warm-up,
   interleaved across the copies in a rotating order. Replay minus load is what re-running the
   generator and serving the steps costs; it is the same work for every prefix, because a
   generator cannot be resumed from the middle.
4. resume: a fresh ``Runtime`` opened on a copy of a run killed just before its last step
   (``CrashAt("before_step_started")``), then ``resume(run_id)``, which serves every step but
   the last from the log and executes that one; on the uncompacted log and on the same log
   after ``compact(keep_last=0)``. The same with 200 steps left gives, by difference, what each
   step executed after the resume costs, before and after compaction. On both files, two
   things that touch the run's row, where the snapshot is stored: reading its ``lease_token``
   (the fencing trigger reads it for every event written), and the store's own statements that
   take, renew and release the lease, each timed with the WAL bytes it writes, on a throwaway
   copy.

Checked every time, and the script stops with an ``AssertionError`` otherwise: the dry replay,
``state()`` and ``metrics()`` of every compacted copy equal those of the uncompacted run; the
resumed state is the same before and after compaction; the run's result equals what the same
calls return without durabl; a dry replay calls neither the model nor the tool.

Databases live in a temporary directory on a real disk (never tmpfs: fsync must be real).

    python -m bench.compaction --out bench/results/compaction.json   # the full run (make bench)
    python -m bench.compaction --quick --out /tmp/compaction.json    # seconds; every path
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench import harness
from bench.harness import Report, median_of, percentile, rotations, say, timed
from durabl import ModelCall, Runtime, ToolCall, workflow
from durabl.crashpoints import BEFORE_STEP_STARTED, CrashAt, ProcessDeath
from durabl.replay import History
from durabl.store.sqlite import Q

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
RUN_ID = "compaction-bench"
TASK = "How do sea otters use tools to open shellfish?"
TOOL_NAME = "search_docs"
MODEL = "stub-1"
DURABILITY = "full"
PREFIX_FRACTIONS = (0.0, 0.25, 0.5, 0.75, 0.99, 1.0)
"""Share of the run's steps folded, one database copy each: 0, 2,500 ... 10,000 of 10,000."""


@dataclass(frozen=True)
class Plan:
    """How big the run is and how many repetitions each part runs."""

    steps: int
    databases: int
    warmup: int
    replay_reps: int
    load_reps: int
    resume_reps: int
    tail_steps: int
    fsync_samples: int


FULL = Plan(
    steps=10_000,
    databases=5,
    warmup=2,
    replay_reps=9,
    load_reps=9,
    resume_reps=5,
    tail_steps=200,
    fsync_samples=100,
)
QUICK = Plan(
    steps=200,
    databases=1,
    warmup=1,
    replay_reps=2,
    load_reps=2,
    resume_reps=1,
    tail_steps=20,
    fsync_samples=10,
)


# -- the workload --------------------------------------------------------------------------


def prompt_of(i: int, iterations: int, observation: str) -> str:
    return (
        f"You are a research agent. Task: {TASK}\n"
        f"Iteration {i + 1} of {iterations}. Last observation: {observation}\n"
        f"Decide the next tool call. Answer with one call to {TOOL_NAME}."
    )


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """The model: answers at once, with a tool call derived from the prompt and its usage."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=6).hexdigest()
    arguments = {
        "query": f"sea otter tool use, stones as anvils, angle {digest}",
        "filters": {"year_from": 2010, "sources": ["journals", "field notes"], "lang": "en"},
        "context": (
            "Earlier results described otters carrying a favourite stone in a skin pouch under "
            "the forelimb and hammering mussels against it while floating on their backs. "
            "Look for population differences and for how juveniles learn the behaviour."
        ),
        "max_results": 5,
    }
    output_tokens = 90 + int(digest[:2], 16) % 40
    return {
        "text": f"I will search the literature again ({digest}).",
        "tool_call": {"name": TOOL_NAME, "arguments": arguments},
        "usage": {
            "input_tokens": len(prompt) // 4,
            "output_tokens": output_tokens,
            "total_tokens": len(prompt) // 4 + output_tokens,
        },
    }


class SearchTool:
    """The tool: returns about 300 bytes derived from its arguments and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, query: str, filters: dict[str, Any], context: str, max_results: int
    ) -> dict[str, Any]:
        self.calls += 1
        return search_result(query, max_results)


def search_result(query: str, max_results: int) -> dict[str, Any]:
    seed = int(hashlib.blake2b(query.encode(), digest_size=4).hexdigest(), 16)
    hits = [
        {"id": f"doc-{(seed + k) % 100_000:05d}", "title": f"Otter tool use, study {k}", "rank": k}
        for k in range(1, 4)
    ]
    return {
        "summary": f"{len(hits)} of {max_results} documents about {query[:40]} (seed {seed % 997})",
        "hits": hits,
        "total": seed % 500,
    }


@workflow(name="bench.agent_loop")
def agent_loop(ctx: Any, task: str, steps: int) -> Any:
    """``steps`` / 2 iterations of: ask the model for a tool call, then make that call."""
    iterations = steps // 2
    observation = "none yet"
    total = 0
    for i in range(iterations):
        answer = yield ModelCall(prompt_of(i, iterations, observation), model=MODEL, temperature=0)
        call = answer["tool_call"]
        found = yield ToolCall(call["name"], call["arguments"])
        observation = found["summary"]
        total += found["total"]
    return {"iterations": iterations, "last": observation, "total": total}


def plain_agent(steps: int) -> Any:
    """The same calls without durabl: what every run must return."""
    iterations = steps // 2
    observation = "none yet"
    total = 0
    tool = SearchTool()
    for i in range(iterations):
        answer = stub_model(prompt_of(i, iterations, observation), model=MODEL, temperature=0)
        found = tool(**json.loads(json.dumps(answer["tool_call"]["arguments"])))
        observation = found["summary"]
        total += found["total"]
    return {"iterations": iterations, "last": observation, "total": total}


def workload_info(plan: Plan) -> dict[str, Any]:
    answer = stub_model(prompt_of(0, plan.steps // 2, "none yet"))
    args = answer["tool_call"]["arguments"]
    return {
        "steps": plan.steps,
        "model_calls": plan.steps // 2,
        "tool_calls": plan.steps // 2,
        "durability": DURABILITY,
        "tool_mode": "AT_MOST_ONCE",
        "tool_registration": "bare callable",
        "prompt_bytes": len(prompt_of(0, plan.steps // 2, search_result("x", 5)["summary"])),
        "model_answer_bytes": len(_compact_json(answer)),
        "tool_args_bytes": len(_compact_json(args)),
        "tool_result_bytes": len(_compact_json(search_result(args["query"], 5))),
    }


def _compact_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


class Agent:
    """A runtime on one database file, with counters for every call made to the outside."""

    def __init__(self, db: Path) -> None:
        self.model_calls = 0
        self.tool = SearchTool()
        self.rt = Runtime(db, llm=self._model, tools={TOOL_NAME: self.tool}, durability=DURABILITY)

    def _model(self, prompt: str, **params: Any) -> Any:
        self.model_calls += 1
        return stub_model(prompt, **params)

    @property
    def outside_calls(self) -> int:
        return self.model_calls + self.tool.calls

    def close(self) -> None:
        self.rt.close()


# -- measuring ------------------------------------------------------------------------------


def file_stats(db: Path) -> dict[str, int]:
    """The database's bytes on disk (file + ``-wal``) after a TRUNCATE checkpoint, and its pages.
    Called with no runtime open on the file."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        pages = {
            name: int(conn.execute(f"PRAGMA {name}").fetchone()[0])
            for name in ("page_size", "page_count", "freelist_count", "auto_vacuum")
        }
        events = int(conn.execute("SELECT COUNT(*) FROM events").fetchone()[0])
        snapshot = conn.execute("SELECT SUM(LENGTH(body)) FROM snapshots").fetchone()[0]
    finally:
        conn.close()
    wal = Path(f"{db}-wal")
    return {
        "bytes": db.stat().st_size + (wal.stat().st_size if wal.exists() else 0),
        "wal_bytes": wal.stat().st_size if wal.exists() else 0,
        "events": events,
        "snapshot_bytes": int(snapshot or 0),
        **pages,
    }


def copy_db(src: Path, dst: Path) -> Path:
    """Copy a checkpointed database (no ``-wal`` left behind by ``file_stats``)."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{dst}{suffix}").unlink(missing_ok=True)
    if Path(f"{src}-wal").exists() and Path(f"{src}-wal").stat().st_size:
        raise AssertionError(f"{src} still has a WAL; checkpoint it before copying")
    shutil.copyfile(src, dst)
    return dst


def load_history(agent: Agent) -> History:
    watermark, snapshot, log = agent.rt.store.load_history(RUN_ID)
    return History.from_events(RUN_ID, log, watermark=watermark, snapshot=snapshot)


def same(label: str, before: Any, after: Any) -> None:
    if before != after:
        raise AssertionError(
            f"{label} differs after compaction:\n  before: {before!r}\n  after:  {after!r}"
        )


def prefixes(plan: Plan) -> list[int]:
    return sorted({round(plan.steps * f) for f in PREFIX_FRACTIONS})


def build_completed(db: Path, plan: Plan, expected: Any) -> tuple[float, dict[str, Any]]:
    agent = Agent(db)
    try:
        t0 = time.perf_counter()
        state = agent.rt.run(agent_loop, {"task": TASK, "steps": plan.steps}, run_id=RUN_ID)
        build_s = time.perf_counter() - t0
        if state.status != "COMPLETED" or state.result != expected:
            raise AssertionError(f"the {plan.steps}-step run ended as {state!r}")
        if agent.model_calls != plan.steps // 2 or agent.tool.calls != plan.steps // 2:
            raise AssertionError(
                f"{agent.model_calls} model and {agent.tool.calls} tool calls for "
                f"{plan.steps} steps"
            )
        metrics = agent.rt.metrics(RUN_ID).as_dict()
    finally:
        agent.close()
    return build_s, metrics


def build_unfinished(db: Path, plan: Plan, left: int) -> None:
    """A run killed just before its step ``steps - left + 1``: its log holds the steps before
    it, all finished, and ``left`` steps remain."""
    agent = Agent(db)
    try:
        with CrashAt(BEFORE_STEP_STARTED, occurrence=plan.steps - left + 1):
            agent.rt.start(agent_loop, {"task": TASK, "steps": plan.steps}, run_id=RUN_ID)
        raise AssertionError(f"the run was not killed {left} step(s) before its end")
    except ProcessDeath:
        pass
    finally:
        agent.close()
    check = Agent(db)
    try:
        history = load_history(check)
    finally:
        check.close()
    done = [p for p, rec in history.steps.items() if rec.done]
    if len(done) != plan.steps - left or max(history.steps) != plan.steps - left:
        raise AssertionError(f"the killed run holds {len(done)} finished steps")


def calls_for(plan: Plan, left: int) -> tuple[int, int]:
    """(model calls, tool calls) made by the last ``left`` steps: odd positions ask the model,
    even ones call the tool."""
    positions = range(plan.steps - left + 1, plan.steps + 1)
    model = sum(1 for p in positions if p % 2)
    return model, left - model


def compact_copy(base: Path, db: Path, keep_last: int, folded: int) -> dict[str, Any]:
    """Copy ``base`` to ``db`` and compact it with ``keep_last``, which must fold ``folded``
    steps: ``compact`` with its default ``reclaim=True``, the whole call timed."""
    copy_db(base, db)
    agent = Agent(db)
    try:
        ns, report = timed(lambda: agent.rt.compact(RUN_ID, keep_last=keep_last))
    finally:
        agent.close()
    if folded and (len(report.runs) != 1 or report.runs[0].steps_folded != folded):
        raise AssertionError(f"compact(keep_last={keep_last}) reported {report!r}")
    if not folded and report.runs:
        raise AssertionError(f"compact(keep_last={keep_last}) folded something: {report!r}")
    return {
        "compact_ns": ns,
        "reported": {
            "run": report.runs[0].as_dict() if report.runs else None,
            "bytes_before": report.bytes_before,
            "bytes_after": report.bytes_after,
        },
    }


def measure_compaction(
    rep_dir: Path, base: Path, plan: Plan, prefix_list: Sequence[int]
) -> dict[str, Any]:
    """Compact one copy of ``base`` per prefix; the fold and the reclaim of the full
    compaction timed apart, on a copy of their own; and a second compaction of an already
    compacted copy (the 99% one, folding its last steps), whose reclaim finds the file as the
    first one left it."""
    copies: dict[int, dict[str, Any]] = {}
    for folded in prefix_list:
        db = rep_dir / f"folded_{folded}.db"
        result = compact_copy(base, db, plan.steps - folded, folded)
        copies[folded] = {**result, "file": file_stats(db), "db": db}
    split_db = rep_dir / "split.db"
    copy_db(base, split_db)
    agent = Agent(split_db)
    try:
        fold_ns, _ = timed(lambda: agent.rt.compact(RUN_ID, keep_last=0, reclaim=False))
    finally:
        agent.close()
    unreclaimed = file_stats(split_db)
    agent = Agent(split_db)
    try:
        reclaim_ns, _ = timed(agent.rt.store.reclaim)
    finally:
        agent.close()
    again_from = prefix_list[-2]
    again_db = rep_dir / "again.db"
    again = compact_copy(copies[again_from]["db"], again_db, 0, plan.steps)
    return {
        "copies": copies,
        "again": {
            "from_steps_folded": again_from,
            "compact_ns": again["compact_ns"],
            "file_before": copies[again_from]["file"],
            "file_after": file_stats(again_db),
        },
        "split": {
            "fold_ns": fold_ns,
            "reclaim_ns": reclaim_ns,
            "unreclaimed_file": unreclaimed,
            "reclaimed_file": file_stats(split_db),
        },
    }


def measure_replay(
    copies: dict[int, dict[str, Any]], plan: Plan, reference: dict[str, Any]
) -> dict[int, dict[str, list[int]]]:
    """Dry replays and history loads of every copy, interleaved; checks them against the
    uncompacted run."""
    agents = {folded: Agent(c["db"]) for folded, c in copies.items()}
    samples: dict[int, dict[str, list[int]]] = {f: {"replay": [], "load": []} for f in agents}
    try:
        order = list(agents)
        for folded, agent in agents.items():
            state = agent.rt.replay(RUN_ID)
            same(f"the dry replay ({folded} steps folded)", reference["replay"], state)
            same(f"state() ({folded} steps folded)", reference["state"], agent.rt.state(RUN_ID))
            same(
                f"metrics() ({folded} steps folded)",
                reference["metrics"],
                agent.rt.metrics(RUN_ID).as_dict(),
            )
        for _ in range(plan.warmup):
            for agent in agents.values():
                agent.rt.replay(RUN_ID)
                load_history(agent)
        for round_ in rotations(order, plan.replay_reps):
            for folded in round_:
                ns, state = timed(partial(agents[folded].rt.replay, RUN_ID))
                same(f"the dry replay ({folded} steps folded)", reference["replay"], state)
                samples[folded]["replay"].append(ns)
        for round_ in rotations(order, plan.load_reps):
            for folded in round_:
                ns, history = timed(partial(load_history, agents[folded]))
                if history.completed_positions() != plan.steps:
                    raise AssertionError(f"{folded} folded: history holds the wrong steps")
                samples[folded]["load"].append(ns)
        for folded, agent in agents.items():
            if agent.outside_calls:
                raise AssertionError(f"a dry replay ({folded} folded) called the model or tool")
    finally:
        for agent in agents.values():
            agent.close()
    return samples


def lease_token_read_us(db: Path, reps: int = 50) -> float:
    """Median time to read the run's ``lease_token`` (what the fencing trigger reads for every
    event written), through a plain read-only connection."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            conn.execute("SELECT lease_token FROM runs WHERE run_id = ?", (RUN_ID,)).fetchone()
            times.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        conn.close()
    return round(statistics.median(times), 1)


LEASE_CYCLE = ("take_lease", "renew_lease", "release_lease")
"""The store's statements that touch the run's row on every drive, by their names in ``Q``."""


def lease_cycle_cost(db: Path, scratch: Path) -> dict[str, dict[str, float]]:
    """What the run's row costs to update: the store's own take / renew / release lease
    statements, in that order, on a throwaway copy through a plain connection with WAL
    checkpoints off; for each, its time and the WAL bytes it wrote. Taking and releasing change
    the row's stored size; a renewal (one float for another) does not."""
    copy_db(db, scratch)
    wal = Path(f"{scratch}-wal")
    conn = sqlite3.connect(scratch, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute("PRAGMA wal_autocheckpoint = 0").fetchall()
        (token,) = conn.execute(
            "SELECT lease_token FROM runs WHERE run_id = ?", (RUN_ID,)
        ).fetchone()
        cost: dict[str, dict[str, float]] = {}
        for name, values in lease_cycle(token).items():
            sql = Q[name]
            wal_before = wal.stat().st_size if wal.exists() else 0
            ns, cursor = timed(partial(conn.execute, sql, values))
            if cursor.rowcount != 1:
                raise AssertionError(f"{name} changed {cursor.rowcount} rows")
            wal_after = wal.stat().st_size if wal.exists() else 0
            cost[name] = {"ms": ns / 1e6, "wal_bytes": wal_after - wal_before}
    finally:
        conn.close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{scratch}{suffix}").unlink(missing_ok=True)
    return cost


def lease_cycle(token: int) -> dict[str, dict[str, Any]]:
    """The parameters of one take, renewal and release of the run's lease (found at fencing
    token ``token``) by a made-up owner, keyed by the column each one sets or matches."""
    owner, now_s = uuid.uuid4().hex, time.time()
    return {
        "take_lease": {
            "lease_owner": owner,
            "lease_pid": os.getpid(),
            "lease_host": platform.node(),
            "lease_started": "12345",
            "lease_expires_s": now_s + 15.25,
            "run_id": RUN_ID,
            "lease_token": token,
        },
        "renew_lease": {
            "lease_expires_s": now_s + 20.75,
            "run_id": RUN_ID,
            "lease_token": token + 1,
            "lease_owner": owner,
        },
        "release_lease": {"run_id": RUN_ID, "lease_token": token + 1},
    }


def measure_resume(rep_dir: Path, plan: Plan, expected: Any, left: int) -> dict[str, Any]:
    """Resume of a run killed ``left`` steps before its end: on its log as it is and after
    ``compact(keep_last=0)``, each time on a fresh copy with a fresh ``Runtime``."""
    base = rep_dir / f"unfinished_{left}.db"
    build_unfinished(base, plan, left)
    variants = {"before": base, "after": rep_dir / f"unfinished_{left}_compacted.db"}
    compacted = compact_copy(base, variants["after"], 0, plan.steps - left)
    files = {name: file_stats(db) for name, db in variants.items()}
    token_us = {name: lease_token_read_us(db) for name, db in variants.items()}
    lease_cycle = {
        name: lease_cycle_cost(db, rep_dir / "lease_cycle.db") for name, db in variants.items()
    }
    open_ns: dict[str, list[int]] = {name: [] for name in variants}
    resume_ns: dict[str, list[int]] = {name: [] for name in variants}
    states: dict[str, Any] = {}
    trial = rep_dir / "resume_trial.db"
    for i, round_ in enumerate(rotations(list(variants), plan.warmup + plan.resume_reps)):
        for name in round_:
            copy_db(variants[name], trial)
            opened, resumed, state = resume_trial(trial, plan, expected, left, name)
            same("the resumed state", states.setdefault("first", state), state)
            if i >= plan.warmup:
                open_ns[name].append(opened)
                resume_ns[name].append(resumed)
    return {
        "steps_left": left,
        "files": files,
        "lease_token_read_us": token_us,
        "lease_cycle": lease_cycle,
        "compact_ns": compacted["compact_ns"],
        "open_ns": open_ns,
        "resume_ns": resume_ns,
    }


def resume_trial(
    db: Path, plan: Plan, expected: Any, left: int, variant: str
) -> tuple[int, int, Any]:
    """Open a fresh runtime on ``db`` and resume the run, which must serve every step but the
    last ``left`` from the log and execute those: the ns the opening and the resume took, and
    the state it ended in."""
    t0 = time.perf_counter_ns()
    agent = Agent(db)
    t1 = time.perf_counter_ns()
    try:
        state = agent.rt.resume(RUN_ID)
        t2 = time.perf_counter_ns()
        calls = (agent.model_calls, agent.tool.calls)
    finally:
        agent.close()
    if (
        state.status != "COMPLETED"
        or state.result != expected
        or state.steps_replayed != plan.steps - left
        or state.steps_executed != left
        or calls != calls_for(plan, left)
    ):
        raise AssertionError(f"resume ({variant} compaction) gave {state!r}, calls {calls}")
    return t1 - t0, t2 - t1, state


def repetition(work: Path, rep: int, plan: Plan, expected: Any) -> dict[str, Any]:
    rep_dir = work / f"rep{rep}"
    rep_dir.mkdir()
    base = rep_dir / "completed.db"
    build_s, metrics = build_completed(base, plan, expected)
    before = file_stats(base)
    prefix_list = prefixes(plan)
    say(f"  rep {rep + 1}: built {plan.steps} steps in {build_s:.1f} s; compacting copies")
    compaction = measure_compaction(rep_dir, base, plan, prefix_list)
    reference_agent = Agent(base)
    try:
        reference: dict[str, Any] = {
            "replay": reference_agent.rt.replay(RUN_ID),
            "state": reference_agent.rt.state(RUN_ID),
            "metrics": metrics,
        }
    finally:
        reference_agent.close()
    same("metrics() of the run", metrics, reference["metrics"])
    say(f"  rep {rep + 1}: dry replays and history loads of {len(prefix_list)} copies")
    samples = measure_replay(compaction["copies"], plan, reference)
    say(f"  rep {rep + 1}: resume of a run one step short of the end")
    resume = measure_resume(rep_dir, plan, expected, 1)
    say(f"  rep {rep + 1}: resume of a run {plan.tail_steps} steps short of the end")
    tail = measure_resume(rep_dir, plan, expected, plan.tail_steps)
    for db in rep_dir.glob("*.db*"):
        db.unlink()
    return {
        "build_s": build_s,
        "before": before,
        "compaction": compaction,
        "samples": samples,
        "resume": resume,
        "tail": tail,
        "metrics": metrics,
        "replay_state": reference["replay"].as_dict(),
    }


# -- figures --------------------------------------------------------------------------------


def call_times(values_ns: Sequence[int], steps: int) -> dict[str, Any]:
    """Milliseconds for the call and microseconds per step of the run (``steps`` steps)."""
    ms = [v / 1e6 for v in values_ns]
    return {
        "ms_median": round(statistics.median(ms), 3),
        "ms_p95": round(percentile(ms, 95), 3),
        "ms_min": round(min(ms), 3),
        "us_per_step_median": round(statistics.median(ms) * 1e3 / steps, 3),
        "n": len(ms),
    }


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against ``xs``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def figures(reps: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """The report's figures, medians over the repetitions (one fresh database each)."""
    steps = plan.steps
    by_prefix = [prefix_row(reps, folded, steps) for folded in prefixes(plan)]
    rows = {row["steps_folded"]: row for row in by_prefix}
    before, full = rows[0], rows[steps]
    resume, tail = resume_pair(reps, plan)
    result: dict[str, Any] = {
        "size": size_figures(reps, full, steps),
        "compaction_time": compaction_time_figures(reps, full, steps),
        "replay": {"before": before["replay"], "after_keep_last_0": full["replay"]},
        "history_load": {
            "before": before["history_load"],
            "after_keep_last_0": full["history_load"],
        },
        "by_prefix": by_prefix,
        "trend": trend_figures(by_prefix),
        "resume": resume,
        "resume_with_steps_left": tail,
    }
    keep_100 = rows.get(steps - 100)
    if keep_100 is not None:  # a prefix of its own only when the run is long enough
        result["size"]["after_keep_last_100_bytes_median"] = keep_100["file_bytes_median"]
        result["size"]["after_keep_last_100_events"] = keep_100["events_kept"]
        result["compaction_time"]["keep_last_100_ms_median"] = keep_100["compact_ms_median"]
        result["replay"]["after_keep_last_100"] = keep_100["replay"]
        result["history_load"]["after_keep_last_100"] = keep_100["history_load"]
    return result


def prefix_row(reps: list[dict[str, Any]], folded: int, steps: int) -> dict[str, Any]:
    """The copies compacted to ``folded`` steps: their file, compaction, replay and load."""
    copies = [r["compaction"]["copies"][folded] for r in reps]
    replay = call_times([ns for r in reps for ns in r["samples"][folded]["replay"]], steps)
    load = call_times([ns for r in reps for ns in r["samples"][folded]["load"]], steps)
    return {
        "steps_folded": folded,
        "keep_last": steps - folded,
        "events_kept": copies[0]["file"]["events"],
        "snapshot_bytes": copies[0]["file"]["snapshot_bytes"],
        "file_bytes_median": median_of([c["file"]["bytes"] for c in copies], 0),
        "compact_ms_median": median_of([c["compact_ns"] / 1e6 for c in copies]),
        "replay": replay,
        "history_load": load,
        "replay_minus_load_ms_median": round(replay["ms_median"] - load["ms_median"], 3),
    }


def size_figures(reps: list[dict[str, Any]], full: dict[str, Any], steps: int) -> dict[str, Any]:
    """The file before compaction, after ``keep_last=0`` (``full``, its prefix row) and after
    the fold alone, before the reclaim."""
    first = reps[0]["before"]
    before_bytes = [r["before"]["bytes"] for r in reps]
    unreclaimed = [r["compaction"]["split"]["unreclaimed_file"] for r in reps]
    full_files = [r["compaction"]["copies"][steps]["file"] for r in reps]
    return {
        "before_bytes_median": median_of(before_bytes, 0),
        "before_events": first["events"],
        "before_pages": first["page_count"],
        "after_keep_last_0_bytes_median": full["file_bytes_median"],
        "after_keep_last_0_over_before": round(
            full["file_bytes_median"] / statistics.median(before_bytes), 4
        ),
        "after_keep_last_0_events": full["events_kept"],
        "after_keep_last_0_snapshot_bytes": full["snapshot_bytes"],
        "unreclaimed_keep_last_0_bytes_median": median_of([u["bytes"] for u in unreclaimed], 0),
        "unreclaimed_keep_last_0_freelist_pages": unreclaimed[0]["freelist_count"],
        "auto_vacuum": first["auto_vacuum"],
        "auto_vacuum_after_reclaim": full_files[0]["auto_vacuum"],
        "reclaim_path": (
            "PRAGMA incremental_vacuum"
            if first["auto_vacuum"] == 2
            else "VACUUM (the file's auto_vacuum is not incremental)"
        ),
        "page_size": first["page_size"],
        "bytes_raw": {
            "before": before_bytes,
            "after_keep_last_0": [f["bytes"] for f in full_files],
            "unreclaimed_keep_last_0": [u["bytes"] for u in unreclaimed],
        },
    }


def compaction_time_figures(
    reps: list[dict[str, Any]], full: dict[str, Any], steps: int
) -> dict[str, Any]:
    """``compact(keep_last=0)`` whole and as fold + reclaim timed apart, and a second
    compaction of a copy already compacted."""
    split = [r["compaction"]["split"] for r in reps]
    again = [r["compaction"]["again"] for r in reps]
    return {
        "keep_last_0_ms_median": full["compact_ms_median"],
        "keep_last_0_fold_only_ms_median": median_of([s["fold_ns"] / 1e6 for s in split]),
        "keep_last_0_reclaim_only_ms_median": median_of([s["reclaim_ns"] / 1e6 for s in split]),
        "reported_by_compact_keep_last_0": reps[0]["compaction"]["copies"][steps]["reported"],
        "second_compaction": {
            "steps_folded_before": again[0]["from_steps_folded"],
            "steps_folded_after": steps,
            "auto_vacuum_before": again[0]["file_before"]["auto_vacuum"],
            "ms_median": median_of([a["compact_ns"] / 1e6 for a in again]),
            "file_bytes_median": median_of([a["file_after"]["bytes"] for a in again], 0),
        },
    }


def trend_figures(by_prefix: list[dict[str, Any]]) -> dict[str, Any]:
    """How each call's cost moves with the number of steps folded."""
    xs = [float(r["steps_folded"]) for r in by_prefix]

    def us_per_folded_step(ms: Callable[[dict[str, Any]], float]) -> float:
        return round(slope(xs, [ms(r) * 1e3 for r in by_prefix]), 4)

    return {
        "replay_us_per_folded_step": us_per_folded_step(lambda r: r["replay"]["ms_median"]),
        "history_load_us_per_folded_step": us_per_folded_step(
            lambda r: r["history_load"]["ms_median"]
        ),
        "replay_minus_load_us_per_folded_step": us_per_folded_step(
            lambda r: r["replay_minus_load_ms_median"]
        ),
        "note": "least-squares slope of the medians against steps folded; a negative slope "
        "means each folded step makes the call cheaper",
    }


def resume_pair(reps: list[dict[str, Any]], plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
    """Resume with one step left and with ``tail_steps`` left, the second with what each step
    executed after a resume costs."""
    resume = resume_figures(reps, "resume", plan.steps)
    tail = resume_figures(reps, "tail", plan.steps)
    left = plan.tail_steps
    for name in ("before", "after"):
        # What each executed step costs: the slope between resuming with 1 and with
        # ``left`` steps to go (the served prefix differs by left - 1 steps, nothing else).
        tail[name]["ms_per_executed_step"] = round(
            (tail[name]["resume"]["ms_median"] - resume[name]["resume"]["ms_median"]) / (left - 1),
            4,
        )
    return resume, tail


def resume_figures(reps: list[dict[str, Any]], part: str, steps: int) -> dict[str, Any]:
    """Medians of one resume measurement (``resume``: one step left; ``tail``: more)."""
    left = reps[0][part]["steps_left"]
    figures: dict[str, Any] = {"steps_left": left}
    for name in ("before", "after"):
        figures[name] = {
            "steps_folded": 0 if name == "before" else steps - left,
            "open_runtime_ms_median": median_of(
                [ns / 1e6 for r in reps for ns in r[part]["open_ns"][name]]
            ),
            "resume": call_times([ns for r in reps for ns in r[part]["resume_ns"][name]], steps),
            "file_bytes_median": median_of([r[part]["files"][name]["bytes"] for r in reps], 0),
            "events_in_log": reps[0][part]["files"][name]["events"],
            "lease_token_read_us_median": median_of(
                [r[part]["lease_token_read_us"][name] for r in reps], 1
            ),
            "lease_cycle": {
                op: {
                    "ms_median": median_of([r[part]["lease_cycle"][name][op]["ms"] for r in reps]),
                    "wal_bytes_median": median_of(
                        [r[part]["lease_cycle"][name][op]["wal_bytes"] for r in reps], 0
                    ),
                }
                for op in LEASE_CYCLE
            },
            "auto_vacuum": reps[0][part]["files"][name]["auto_vacuum"],
        }
    figures["after"]["compact_ms_median"] = median_of([r[part]["compact_ns"] / 1e6 for r in reps])
    return figures


def raw_samples(reps: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Every timing, in microseconds, per repetition (one fresh database each)."""

    def us(values: Sequence[int]) -> list[int]:
        return [round(v / 1e3) for v in values]

    return {
        "build_s": [round(r["build_s"], 3) for r in reps],
        "replay_us": {
            str(f): [us(r["samples"][f]["replay"]) for r in reps] for f in prefixes(plan)
        },
        "history_load_us": {
            str(f): [us(r["samples"][f]["load"]) for r in reps] for f in prefixes(plan)
        },
        "compact_us": {
            str(f): [round(r["compaction"]["copies"][f]["compact_ns"] / 1e3) for r in reps]
            for f in prefixes(plan)
        },
        "second_compaction_us": [round(r["compaction"]["again"]["compact_ns"] / 1e3) for r in reps],
        "resume_us": {
            name: [us(r["resume"]["resume_ns"][name]) for r in reps] for name in ("before", "after")
        },
        "resume_with_steps_left_us": {
            name: [us(r["tail"]["resume_ns"][name]) for r in reps] for name in ("before", "after")
        },
        "open_runtime_us": {
            name: [us(r["resume"]["open_ns"][name]) for r in reps] for name in ("before", "after")
        },
        "files": [
            {
                "before": r["before"],
                "after": {str(f): r["compaction"]["copies"][f]["file"] for f in prefixes(plan)},
                "unreclaimed_keep_last_0": r["compaction"]["split"]["unreclaimed_file"],
                "second_compaction": r["compaction"]["again"]["file_after"],
                "resume": r["resume"]["files"],
                "resume_with_steps_left": r["tail"]["files"],
            }
            for r in reps
        ],
    }


def render(report: Report) -> str:
    return "\n".join(
        [*_size_lines(report), *_prefix_table(report["by_prefix"]), *_resume_lines(report)]
    )


def _size_lines(report: Report) -> list[str]:
    w, s, c = report["workload"], report["size"], report["compaction_time"]
    return [
        f"Compaction of a {w['steps']}-step run ({w['model_calls']} ModelCalls + "
        f"{w['tool_calls']} ToolCalls, durability {w['durability']}, "
        f"{report['repetitions']['databases']} fresh database(s)){harness.quick_mark(report)}",
        f"  file: {s['before_bytes_median'] / 1e6:.2f} MB before, "
        f"{s['after_keep_last_0_bytes_median'] / 1e6:.2f} MB after keep_last=0 "
        f"(x{s['after_keep_last_0_over_before']}), "
        f"{s['unreclaimed_keep_last_0_bytes_median'] / 1e6:.2f} MB without reclaim",
        f"  compact(keep_last=0): {c['keep_last_0_ms_median']} ms "
        f"(fold {c['keep_last_0_fold_only_ms_median']} ms + reclaim "
        f"{c['keep_last_0_reclaim_only_ms_median']} ms, timed apart)",
    ]


def _prefix_table(by_prefix: list[dict[str, Any]]) -> list[str]:
    lines = [
        "",
        f"  {'folded':>7}{'events':>8}{'file MB':>9}{'replay ms':>11}{'us/step':>9}"
        f"{'load ms':>9}{'us/step':>9}{'rest ms':>9}",
    ]
    for row in by_prefix:
        lines.append(
            f"  {row['steps_folded']:>7}{row['events_kept']:>8}"
            f"{row['file_bytes_median'] / 1e6:>9.2f}{row['replay']['ms_median']:>11.1f}"
            f"{row['replay']['us_per_step_median']:>9.2f}{row['history_load']['ms_median']:>9.1f}"
            f"{row['history_load']['us_per_step_median']:>9.2f}"
            f"{row['replay_minus_load_ms_median']:>9.1f}"
        )
    return lines


def _resume_lines(report: Report) -> list[str]:
    t, r, tl = report["trend"], report["resume"], report["resume_with_steps_left"]
    again, steps = report["compaction_time"]["second_compaction"], report["workload"]["steps"]
    return [
        f"  slope per folded step: replay {t['replay_us_per_folded_step']} us, "
        f"load {t['history_load_us_per_folded_step']} us",
        f"  resume (one step left, fresh runtime): {r['before']['resume']['ms_median']} ms "
        f"before, {r['after']['resume']['ms_median']} ms after compaction "
        f"(+ open {r['before']['open_runtime_ms_median']} / "
        f"{r['after']['open_runtime_ms_median']} ms)",
        f"  resume ({tl['steps_left']} steps left): {tl['before']['resume']['ms_median']} ms "
        f"before, {tl['after']['resume']['ms_median']} ms after compaction; per executed step "
        f"{tl['before']['ms_per_executed_step']} ms before, "
        f"{tl['after']['ms_per_executed_step']} ms after",
        f"  reading the run's lease_token: {r['before']['lease_token_read_us_median']} us "
        f"before, {r['after']['lease_token_read_us_median']} us after compaction",
        *[
            f"  {op.replace('_', ' ')}: {r['before']['lease_cycle'][op]['ms_median']} ms, "
            f"{r['before']['lease_cycle'][op]['wal_bytes_median'] / 1e3:.0f} kB of WAL before; "
            f"{r['after']['lease_cycle'][op]['ms_median']} ms, "
            f"{r['after']['lease_cycle'][op]['wal_bytes_median'] / 1e3:.0f} kB after compaction"
            for op in LEASE_CYCLE
        ],
        f"  first reclaim: {report['size']['reclaim_path']} (auto_vacuum "
        f"{report['size']['auto_vacuum']} on a new file, "
        f"{report['size']['auto_vacuum_after_reclaim']} after); a second compaction "
        f"(the last {steps - again['steps_folded_before']} steps): {again['ms_median']} ms",
    ]


# -- the run --------------------------------------------------------------------------------


def measure(work: Path, quick: bool) -> Report:
    plan = QUICK if quick else FULL
    expected = plain_agent(plan.steps)
    report: Report = {
        **harness.header("compaction", SCHEMA, quick, work, plan.fsync_samples),
        "workload": workload_info(plan),
        "repetitions": {
            "databases": plan.databases,
            "warmup": plan.warmup,
            "replay": plan.replay_reps,
            "history_load": plan.load_reps,
            "resume": plan.resume_reps,
            "resume_steps_left": plan.tail_steps,
        },
    }
    say(f"compaction: {plan.databases} repetition(s) of a {plan.steps}-step run")
    reps = [repetition(work, i, plan, expected) for i in range(plan.databases)]
    report.update(figures(reps, plan))
    report["identical_after_compaction"] = {
        "dry_replay_state": True,
        "state": True,
        "metrics": True,
        "resumed_state": True,
    }
    report["replayed_state"] = reps[0]["replay_state"]
    report["metrics"] = reps[0]["metrics"]
    report["raw"] = raw_samples(reps, plan)
    return report


def main(argv: list[str] | None = None) -> int:
    return harness.main(
        argv,
        name="compaction",
        doc=__doc__,
        quick_help="a 200-step run, one repetition: exercises the code, figures are noise",
        measure=measure,
        render=render,
        summary_to=sys.stderr,
    )


if __name__ == "__main__":
    raise SystemExit(main())
