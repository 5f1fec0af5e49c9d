"""Throughput: steps per second of durabl, DBOS and LangGraph with many runs at once.

Steps per second with 1, 8 and 64 concurrent runs in one process, for durabl (durability "full"
and "process") and, on the same workload, on the same disk and in the same invocation, for DBOS
Transact and LangGraph; and for durabl with 2 and 4 worker processes sharing one database.

The workload is W40's (bench/workload.py): one model call to a stub that answers instantly, then
40 tool calls, each appending one line to a file of its run's own and returning a ~200-byte
dict. Two variants: "instant" (the tool returns at once) and "sleep_2ms" (each tool call first
sleeps 2 ms, standing for a network call, which gives concurrency something to overlap).

Each sample is one probe process (bench/throughput_peers/*_probe.py), run by the runtime's own
interpreter (durabl's, or the peer's virtualenv under .bench-venvs/) on a fresh database in a
scratch folder on a real disk. In it, N threads drive R runs (thread t drives runs t, t+N, ...),
all against one runtime instance; how each runtime is made durable and shared between threads
is in its probe's docstring. steps/s = the steps completed (counted afterwards from the
runtime's own records, and checked to be R * 41) / the wall time from the first thread's start
to the last run's completion; interpreter start-up and setup are outside it. Each probe also
checks every run's result and its 40 effects (the lines in its file, once each). A sample
drives 200 runs (256 with 64 threads: 4 each); ``--quick`` drives one per thread, at least 8.

durabl's tool is registered ``IDEMPOTENT``: like a DBOS step or a LangGraph node, it may run
again after a crash, and durabl then makes one commit per step durable, its completion (the
default bare callable, ``AT_MOST_ONCE``, makes its dispatch durable too: two fsyncs per step).

Several workers: R runs are created first by a process that dies right after each RUN_STARTED
(``durabl_probe.py create``), leaving them RUNNING with their owner gone; then 2 or 4 worker
processes (``Runtime.serve(concurrency=8)``) are started together on that database, and stopped
(SIGTERM) once every run is COMPLETED. Their rate comes from the log: R * 41 steps over the
span from the first RUN_RESUMED to the last RUN_COMPLETED.

Every cell is repeated in rounds; each round runs every cell once, the runtimes in an order
rotated from round to round, so that slow spells of the shared machine fall on each alike. The
cost of one fsync of a 4 KiB append is measured on the same disk before and after the rounds:
a runtime that waits for one fsync per step, one step at a time, cannot exceed 1 / fsync median
steps per second, and durabl's target is that its full-mode steps/s at 8 and 64 concurrent runs
does exceed it.

DBOS and LangGraph are measured as they configure SQLite by default (their probes report the
journal mode and ``synchronous`` of their connection): both fsync every commit, so their rows
are full durability.

    python -m bench.throughput --out bench/results/throughput.json     # the full run (make bench)
    python -m bench.throughput --quick --runtimes durabl --out /tmp/t.json   # seconds
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import durabl
from bench import harness
from bench.harness import REPO, BenchError, Report, median_of, percentile, rotations, run_probe, say
from bench.throughput_peers import kit
from bench.workload import EXPECTED, STEPS, TOOL_CALLS, result_of
from durabl.store import SQLiteStore

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
RUNTIMES = ("durabl", "dbos", "langgraph")
DURABL_MODES = ("full", "process")
VARIANTS = {"instant": 0.0, "sleep_2ms": 0.002}
"""Each variant's sleep in every tool call, in seconds."""
TARGET = "steps/s rises with concurrency instead of being capped at one fsync per step"


@dataclass(frozen=True)
class Plan:
    concurrencies: tuple[int, ...]
    min_runs: int
    runs_per_thread: int
    """A sample drives max(min_runs, runs_per_thread * concurrency) runs."""
    reps: int
    worker_processes: tuple[int, ...]
    worker_concurrency: int
    worker_runs: int
    fsync_samples: int
    timeout_s: float

    def runs_for(self, concurrency: int) -> int:
        return max(self.min_runs, self.runs_per_thread * concurrency)


FULL = Plan(
    concurrencies=(1, 8, 64),
    min_runs=200,
    runs_per_thread=4,
    reps=3,
    worker_processes=(2, 4),
    worker_concurrency=8,
    worker_runs=256,
    fsync_samples=300,
    timeout_s=900.0,
)
QUICK = Plan(
    concurrencies=(1, 8, 64),
    min_runs=8,
    runs_per_thread=1,
    reps=1,
    worker_processes=(2, 4),
    worker_concurrency=8,
    worker_runs=32,
    fsync_samples=20,
    timeout_s=120.0,
)


@dataclass(frozen=True)
class Config:
    """One runtime in one durability mode ("default" for a peer: as it configures itself)."""

    runtime: str
    mode: str

    @property
    def label(self) -> str:
        return f"{self.runtime}-{self.mode}"


def configs(runtimes: Sequence[str]) -> list[Config]:
    found = []
    for runtime in runtimes:
        modes = DURABL_MODES if runtime == "durabl" else ("default",)
        found += [Config(runtime, mode) for mode in modes]
    return found


def missing_peer(runtimes: Sequence[str]) -> str | None:
    """One line naming the first peer virtualenv that is not there, or None."""
    for runtime in runtimes:
        python = harness.peer_interpreter(runtime)
        if not python.exists():
            return (
                f"bench.throughput: no {runtime} virtualenv ({python.relative_to(REPO)} is "
                f"missing): build the peers' virtualenvs with `make bench-peers`"
            )
    return None


# -- one sample: a probe process ------------------------------------------------------------


def sample(
    work: Path, config: Config, variant: str, concurrency: int, rep: int, plan: Plan
) -> dict[str, Any]:
    """One probe process: ``concurrency`` threads driving ``plan.runs_for(concurrency)`` runs."""
    runs = plan.runs_for(concurrency)
    folder = work / f"{config.label}-{variant}-c{concurrency}-{rep}"
    argv = harness.peer_argv(
        config.runtime,
        "--work", folder,
        "--concurrency", concurrency,
        "--runs", runs,
        "--sleep-s", repr(VARIANTS[variant]),
        "--mode", config.mode,
    )  # fmt: skip
    lines = run_probe(argv, config.runtime, plan.timeout_s).strip().splitlines()
    out = json.loads(lines[-1])
    checks = {
        "steps": (out["steps"], runs * STEPS),
        "effects": (out["effects"], runs * TOOL_CALLS),
        "first_result": (out["first_result"], EXPECTED),
        "tool_result": (out["tool_result"], result_of(0, kit.topic_of(0))),
        "concurrency": (out["concurrency"], concurrency),
    }
    wrong = {name: pair for name, pair in checks.items() if pair[0] != pair[1]}
    if wrong:
        raise BenchError(f"{config.label} {variant} c={concurrency}: found != wanted: {wrong}")
    return {
        "rep": rep,
        "runs": runs,
        "steps": out["steps"],
        "span_s": out["span_s"],
        "steps_per_s": out["steps_per_s"],
        "cpu_us_per_step": out["cpu_us_per_step"],
        "version": out["version"],
        "durability": out["durability"],
        "concurrency_by": out["concurrency_by"],
        "commits_per_transaction": out.get("commits_per_transaction"),
    }


# -- one sample of several worker processes -------------------------------------------------


class Workers:
    """``processes`` durabl worker processes draining ``plan.worker_runs`` runs left RUNNING in
    one fresh database."""

    def __init__(
        self, work: Path, mode: str, variant: str, processes: int, rep: int, plan: Plan
    ) -> None:
        self.folder = work / f"workers-{mode}-{variant}-{processes}p-{rep}"
        self.db = self.folder / "durabl.db"
        self.mode, self.variant, self.processes, self.rep, self.plan = (
            mode,
            variant,
            processes,
            rep,
            plan,
        )

    def argv(self, command: str, concurrency: int) -> list[str]:
        return harness.peer_argv(
            "durabl",
            command,
            "--work", self.folder,
            "--concurrency", concurrency,
            "--runs", self.plan.worker_runs,
            "--sleep-s", repr(VARIANTS[self.variant]),
            "--mode", self.mode,
        )  # fmt: skip

    def measure(self) -> dict[str, Any]:
        made = json.loads(run_probe(self.argv("create", 1), "durabl", self.plan.timeout_s))
        if len(made) != self.plan.worker_runs:
            raise BenchError(f"the setup process made {len(made)} runs")
        logs = [self.folder / f"worker-{i}.log" for i in range(self.processes)]
        procs = [self.spawn(log) for log in logs]
        try:
            self.wait_until_completed(procs)
            self.wait_serving(logs)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        stats = [self.stopped(proc, log) for proc, log in zip(procs, logs, strict=True)]
        return self.figures(procs, stats)

    def spawn(self, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            return subprocess.Popen(
                self.argv("serve", self.plan.worker_concurrency),
                cwd=REPO,
                env=harness.peer_env("durabl"),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def wait_until_completed(self, procs: Sequence[subprocess.Popen[bytes]]) -> None:
        """Until every run is COMPLETED, looking through a read-only store; a run in any other
        state but RUNNING, a worker that exits, or the timeout is an error."""
        runs, deadline = self.plan.worker_runs, time.monotonic() + self.plan.timeout_s
        store = SQLiteStore(self.db, read_only=True)
        try:
            while True:
                counts = Counter(row.status for row in store.list_runs())
                if counts["COMPLETED"] == runs:
                    return
                stray = {k: v for k, v in counts.items() if k not in ("RUNNING", "COMPLETED")}
                exited = [p.pid for p in procs if p.poll() is not None]
                if stray or exited or time.monotonic() > deadline:
                    raise BenchError(
                        f"workers {self.folder.name}: {dict(counts)} of {runs} runs; "
                        f"exited workers {exited}"
                    )
                time.sleep(0.05)
        finally:
            store.close()

    def wait_serving(self, logs: Sequence[Path], timeout_s: float = 30.0) -> None:
        """Until every worker has installed its SIGTERM handler (it says "serving" then): a
        worker that found no run left may still be starting, and a SIGTERM before the handler
        would kill it rather than stop it."""
        deadline = time.monotonic() + timeout_s
        while not all(log.read_bytes().startswith(b"serving") for log in logs):
            if time.monotonic() > deadline:
                raise BenchError(f"workers {self.folder.name}: not serving after {timeout_s} s")
            time.sleep(0.02)

    def stopped(self, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
        text = log.read_text(encoding="utf-8", errors="replace")
        last = text.strip().splitlines()[-1] if text.strip() else ""
        if proc.returncode != 0 or not last.startswith("{"):
            raise BenchError(f"worker {proc.pid} exited {proc.returncode}:\n{text[-4000:]}")
        stats: dict[str, Any] = json.loads(last)
        if stats.get("errors"):
            raise BenchError(f"worker {proc.pid} reported errors: {stats['errors'][:3]}")
        return stats

    def figures(
        self, procs: Sequence[subprocess.Popen[bytes]], stats: Sequence[dict[str, Any]]
    ) -> dict[str, Any]:
        """The rate from the log, with its checks: every run COMPLETED with W40's result, 41
        steps each, every effect once."""
        store = SQLiteStore(self.db, read_only=True)
        try:
            rows = store.list_runs()
            logs = {row.run_id: store.load_log(row.run_id) for row in rows}
        finally:
            store.close()
        wrong = [r.run_id for r in rows if r.status != "COMPLETED" or r.result_text is None]
        if len(rows) != self.plan.worker_runs or wrong:
            raise BenchError(f"{len(rows)} runs, not COMPLETED: {wrong[:3]}")
        if any(json.loads(r.result_text or "null") != EXPECTED for r in rows):
            raise BenchError("a run's result is not W40's")
        events = [e for log in logs.values() for e in log]
        steps = sum(1 for e in events if e.kind in ("STEP_COMPLETED", "TOOL_COMPLETED"))
        if steps != self.plan.worker_runs * STEPS:
            raise BenchError(f"{steps} steps completed, not {self.plan.worker_runs * STEPS}")
        effects = kit.check_outbox(self.folder / "outbox", self.plan.worker_runs)
        resumes = [json.loads(e.data or "{}") for e in events if e.kind == "RUN_RESUMED"]
        first_s = min(e.at_s for e in events if e.kind == "RUN_RESUMED")
        last_s = max(e.at_s for e in events if e.kind == "RUN_COMPLETED")
        by_pid = Counter(r["pid"] for r in resumes)
        return {
            "rep": self.rep,
            "runs": self.plan.worker_runs,
            "steps": steps,
            "effects": effects,
            "span_s": round(last_s - first_s, 6),
            "steps_per_s": round(steps / (last_s - first_s), 1),
            "runs_by_worker": [by_pid.get(p.pid, 0) for p in procs],
            "completed_by_worker": [s["completed"] for s in stats],
            "version": durabl.__version__,
            "durability": {"mode": self.mode},
            "concurrency_by": f"{self.processes} worker processes sharing one database, each "
            f"Runtime.serve(concurrency={self.plan.worker_concurrency})",
        }


# -- the rounds -----------------------------------------------------------------------------


Key = tuple[str, str, str, int, int]
"""(runtime, mode, variant, concurrency per process, processes)"""


def rounds(work: Path, plan: Plan, runtimes: Sequence[str]) -> dict[Key, list[dict[str, Any]]]:
    """Every cell's samples: ``plan.reps`` rounds, each running every cell once, the runtimes
    (and the worker configurations) in an order rotated from round to round."""
    cfgs = configs(runtimes)
    worker_cfgs = (
        [(m, p) for m in DURABL_MODES for p in plan.worker_processes]
        if "durabl" in runtimes
        else []
    )
    orders = rotations(cfgs, plan.reps)
    worker_orders = rotations(worker_cfgs, plan.reps) if worker_cfgs else [[]] * plan.reps
    samples: dict[Key, list[dict[str, Any]]] = {}
    total = plan.reps * len(VARIANTS) * (len(cfgs) * len(plan.concurrencies) + len(worker_cfgs))
    done = 0
    for rep in range(plan.reps):
        for variant in VARIANTS:
            for concurrency in plan.concurrencies:
                for cfg in orders[rep]:
                    s = sample(work, cfg, variant, concurrency, rep, plan)
                    samples.setdefault((cfg.runtime, cfg.mode, variant, concurrency, 1), [])
                    samples[(cfg.runtime, cfg.mode, variant, concurrency, 1)].append(s)
                    done += 1
                    say(
                        f"  [{done}/{total}] {cfg.label:<18}{variant:<10}{concurrency:>3} "
                        f"threads: {s['steps_per_s']:>8.0f} steps/s"
                    )
            for mode, processes in worker_orders[rep]:
                w = Workers(work, mode, variant, processes, rep, plan).measure()
                key = ("durabl", mode, variant, plan.worker_concurrency, processes)
                samples.setdefault(key, []).append(w)
                done += 1
                say(
                    f"  [{done}/{total}] durabl-{mode:<11}{variant:<10}{processes} workers x "
                    f"{plan.worker_concurrency}: {w['steps_per_s']:>8.0f} steps/s, runs per "
                    f"worker {w['runs_by_worker']}"
                )
    return samples


def cell(key: Key, ss: list[dict[str, Any]], cap: float, fsync_us: float) -> dict[str, Any]:
    runtime, mode, variant, concurrency, processes = key
    rates = [s["steps_per_s"] for s in ss]
    median = round(statistics.median(rates), 1)
    first = ss[0]
    return {
        "kind": "threads" if processes == 1 else "workers",
        "runtime": runtime,
        "mode": mode,
        "variant": variant,
        "sleep_s": VARIANTS[variant],
        "concurrency": concurrency,
        "processes": processes,
        "runs": first["runs"],
        "steps_per_s_median": median,
        "steps_per_s_samples": rates,
        "steps_counted": [s["steps"] for s in ss],
        "version": first["version"],
        "durability": first["durability"],
        "concurrency_by": first["concurrency_by"],
        "fsync_us_median": fsync_us,
        "one_fsync_per_step_cap_steps_per_s": round(cap, 1),
        "ratio_to_cap": round(median / cap, 3),
        "commits_per_transaction_median": _median_or_none(
            [s.get("commits_per_transaction") for s in ss]
        ),
        "samples": ss,
    }


def _median_or_none(values: list[Any]) -> float | None:
    """The median of the values a probe reported (durabl's in-process cells), else None."""
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def target(cells: list[dict[str, Any]], plan: Plan) -> dict[str, Any] | None:
    """Full-mode steps/s at 8 and 64 concurrent runs against 1 / fsync median, per variant;
    beside it, the same cell in process mode (no fsync at all), which shows how much of what
    is left the fsyncs cost, and how much the CPU does."""
    wanted = [c for c in plan.concurrencies if c > 1]
    threads = {
        (c["mode"], c["variant"], c["concurrency"]): c
        for c in cells
        if c["kind"] == "threads" and c["runtime"] == "durabl"
    }
    checked = []
    for (mode, variant, concurrency), c in threads.items():
        if mode != "full" or concurrency not in wanted:
            continue
        process = threads.get(("process", variant, concurrency))
        alone = threads.get(("full", variant, 1))
        shared = c.get("commits_per_transaction_median")
        rise = alone and round(c["steps_per_s_median"] / alone["steps_per_s_median"], 3)
        checked.append(
            {
                "variant": variant,
                "concurrency": concurrency,
                "steps_per_s_median": c["steps_per_s_median"],
                "cap_steps_per_s": c["one_fsync_per_step_cap_steps_per_s"],
                "ratio_to_cap": c["ratio_to_cap"],
                "met": c["ratio_to_cap"] > 1,
                "commits_per_fsync": shared,
                "over_one_run": rise,
                "shares_fsyncs": bool(shared and shared > 1 and rise and rise > 1),
                "process_steps_per_s_median": process and process["steps_per_s_median"],
                "full_over_process": process
                and round(c["steps_per_s_median"] / process["steps_per_s_median"], 3),
            }
        )
    if not checked:
        return None
    return {
        "target": TARGET,
        "test": "durabl's full-mode steps/s with "
        + " and ".join(map(str, wanted))
        + " concurrent runs > 1 / fsync median",
        "cells": checked,
        "met": all(c["met"] for c in checked),
        "sharing": "commits share fsyncs (more than one commit per transaction) and full-mode "
        "steps/s is higher than with one run",
        "shares_fsyncs": all(c["shares_fsyncs"] for c in checked),
    }


# -- the run --------------------------------------------------------------------------------


def fsync_probe(work: Path, samples: int) -> list[float]:
    return harness.sync_times_us(work, os.fsync, samples)


def fsync_summary(times: list[float]) -> dict[str, Any]:
    return {
        "fsync_us_median": median_of(times, 1),
        "fsync_us_p95": round(percentile(times, 95), 1),
        "fsync_us_mean": round(statistics.fmean(times), 1),
        "samples": len(times),
    }


def measure(work: Path, quick: bool, runtimes: Sequence[str] = RUNTIMES) -> Report:
    plan = QUICK if quick else FULL
    report: Report = {
        **harness.header("throughput", SCHEMA, quick, work, plan.fsync_samples),
        "workload": {
            "model_calls": 1,
            "tool_calls": TOOL_CALLS,
            "steps_per_run": STEPS,
            "tool": "appends one line to its run's own file, returns a ~200-byte dict",
            "variants": {name: {"tool_sleep_s": s} for name, s in VARIANTS.items()},
            "runs_per_sample": {str(c): plan.runs_for(c) for c in plan.concurrencies},
            "worker_runs_per_sample": plan.worker_runs,
            "worker_concurrency": plan.worker_concurrency,
            "durabl_tool_mode": "IDEMPOTENT",
            "rate": "steps completed (counted from the runtime's records) / wall time from the "
            "first run's start to the last run's completion",
        },
        "runtimes": list(runtimes),
        "repetitions": plan.reps,
    }
    say(f"throughput: {', '.join(runtimes)}; {plan.reps} round(s); scratch {work}")
    before = fsync_probe(work, plan.fsync_samples)
    samples = rounds(work, plan, runtimes)
    after = fsync_probe(work, plan.fsync_samples)
    fsync_us = median_of(before + after, 1)
    cap = 1e6 / fsync_us
    report["disk"] = {
        "filesystem": harness.filesystem_of(work),
        "fsync_us_median": fsync_us,
        "one_fsync_per_step_cap_steps_per_s": round(cap, 1),
        "before": fsync_summary(before),
        "after": fsync_summary(after),
    }
    cells = [cell(key, ss, cap, fsync_us) for key, ss in samples.items()]
    report["cells"] = sorted(cells, key=order_of)
    report["target"] = target(report["cells"], plan)
    return report


def order_of(c: dict[str, Any]) -> tuple[Any, ...]:
    return (
        list(VARIANTS).index(c["variant"]),
        c["kind"],
        RUNTIMES.index(c["runtime"]),
        c["mode"],
        c["processes"],
        c["concurrency"],
    )


# -- the printed summary --------------------------------------------------------------------


def render(report: Report) -> str:
    m, disk = report["machine"], report["disk"]
    lines = [
        f"Throughput: W40 ({report['workload']['steps_per_run']} steps per run), steps/s, "
        f"median of {report['repetitions']} round(s){harness.quick_mark(report)}",
        harness.machine_line(m),
        f"  scratch: {m['scratch_dir']} ({disk['filesystem']}); fsync of a 4 KiB append: "
        f"median {disk['fsync_us_median']:g} us (before {disk['before']['fsync_us_median']:g}, "
        f"after {disk['after']['fsync_us_median']:g}) -> one fsync per step caps a serial log "
        f"at {disk['one_fsync_per_step_cap_steps_per_s']:.0f} steps/s",
        "",
        f"  {'variant':<10}{'runtime':<11}{'durability':<40}{'at once':>8}{'steps/s':>9}"
        f"{'x cap':>7}{'commits/txn':>12}  samples",
    ]
    for i, c in enumerate(report["cells"]):
        if i and c["variant"] != report["cells"][i - 1]["variant"]:
            lines.append("")
        lines.append(
            f"  {c['variant']:<10}{c['runtime']:<11}{durability_label(c):<40}"
            f"{concurrency_label(c):>8}{c['steps_per_s_median']:>9.0f}{c['ratio_to_cap']:>7.2f}"
            f"{shared_label(c):>12}  {' '.join(f'{r:.0f}' for r in c['steps_per_s_samples'])}"
        )
    lines += target_lines(report["target"])
    return "\n".join(lines)


def shared_label(c: dict[str, Any]) -> str:
    shared = c.get("commits_per_transaction_median")
    return "-" if shared is None else f"{shared:.2f}"


def durability_label(c: dict[str, Any]) -> str:
    d = c["durability"]
    if c["runtime"] == "durabl":
        return f"{c['mode']}" + (" (fsync per batch)" if c["mode"] == "full" else " (no fsync)")
    return f"default: {d['journal_mode']} journal, synchronous={d['synchronous']}"


def concurrency_label(c: dict[str, Any]) -> str:
    if c["kind"] == "workers":
        return f"{c['processes']}x{c['concurrency']}"
    return str(c["concurrency"])


def target_lines(t: dict[str, Any] | None) -> list[str]:
    if t is None:
        return []
    lines = ["", f"Target: {t['target']} ({t['test']})"]
    for c in t["cells"]:
        lines.append(
            f"  {c['variant']:<10}{c['concurrency']:>3} runs: {c['steps_per_s_median']:>8.0f} "
            f"steps/s = {c['ratio_to_cap']:.2f} x the cap of {c['cap_steps_per_s']:.0f}: "
            f"{'met' if c['met'] else 'NOT met'}; process mode "
            f"{c['process_steps_per_s_median']:.0f} steps/s (full/process "
            f"{c['full_over_process']:.2f}); {c['commits_per_fsync']:.2f} commits per fsync, "
            f"{c['over_one_run']:.2f} x one run's steps/s"
        )
    lines.append(f"  target {'met' if t['met'] else 'NOT met'}")
    lines.append(f"  {t['sharing']}: {'yes' if t['shares_fsyncs'] else 'NO'}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument(
        "--runtimes",
        default=",".join(RUNTIMES),
        help=f"comma-separated subset of {','.join(RUNTIMES)} (default: all)",
    )
    ns, rest = own.parse_known_args(argv)
    runtimes = [r for r in RUNTIMES if r in ns.runtimes.split(",")]
    unknown = set(ns.runtimes.split(",")) - set(RUNTIMES)
    if unknown or not runtimes:
        raise SystemExit(f"bench.throughput: --runtimes takes a subset of {','.join(RUNTIMES)}")
    problem = missing_peer([r for r in runtimes if r != "durabl"])
    if problem and not {"-h", "--help"} & set(rest):
        raise SystemExit(problem)
    return harness.main(
        rest,
        name="throughput",
        doc=__doc__,
        quick_help="a few runs per cell, one round: exercises every path, figures are noise "
        "(--runtimes durabl,dbos,langgraph picks the runtimes, default all)",
        measure=functools.partial(measure, runtimes=runtimes),
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
