"""What every throughput probe shares: the W40 workload without any runtime, the command line,
the concurrent driving and timing of the runs, the check of their effects, and the JSON line.

A probe is a script run by its runtime's own interpreter (so this module imports nothing but
the standard library). It builds its runtime durably, hands ``run_concurrently`` a function that
drives run number ``k`` to completion, counts from its runtime's own records how many steps
each run completed, and prints one JSON object (``emit``).

The workload, the same for every runtime: one model call to a stub that answers instantly, then
40 tool calls, each appending one line to a file of its run's own and returning a ~200-byte
dict; with ``--sleep-s`` above 0 each tool call first sleeps that long (``time.sleep``, standing
for a network call). This is the one copy of the stub model and the tool's result:
``bench/workload.py`` and the 0.1.0 probe (``bench/probe.py``) take them from here.

Timing: ``--concurrency`` threads wait at one barrier, then thread ``t`` drives runs ``t``,
``t + N``, ``t + 2N``, ... one after another. The span runs from the first thread's start to the
last thread's last completion; CPU is the whole process's user + system time over the same
stretch. ``time_pairs`` times the other way, for per-step overhead: in one thread, the plain
loop (``plain_loop``: the same calls with no runtime) then one run, pair after pair.

The database is a file in ``--work`` unless ``--db`` names one (a PostgreSQL URL, say), in the
form the runtime takes it.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOOL_CALLS = 40
STEPS = 1 + TOOL_CALLS
TOPIC = "sea otters"
RUN_ID_PREFIX = "run-"


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """The model: answers instantly with a small dict."""
    return {"plan": "query each source once", "queries": TOOL_CALLS, "tokens": 17}


def result_of(i: int, topic: str) -> dict[str, Any]:
    """What the tool returns for call ``i``: about 200 bytes of JSON."""
    return {
        "i": i,
        "topic": topic,
        "title": f"Search result {i} for {topic}",
        "url": f"https://example.org/search/{topic.replace(' ', '-')}/{i}",
        "snippet": "Sea otters hold hands while sleeping so they do not drift apart.",
        "score": 0.5,
    }


def run_id_of(k: int) -> str:
    return f"{RUN_ID_PREFIX}{k:05d}"


def topic_of(k: int) -> str:
    """Run ``k``'s input: the topic names the run, so that its tool knows which file is its."""
    return f"{TOPIC} {run_id_of(k)}"


def expected_result() -> dict[str, Any]:
    """What every run returns."""
    return {"plan": stub_model("")["plan"], "hits": TOOL_CALLS}


class Outbox:
    """The tool: sleeps ``sleep_s`` (if above 0), appends one line to its run's file in
    ``folder`` and returns ``result_of(i, topic)``."""

    def __init__(self, folder: Path, sleep_s: float) -> None:
        self.folder = folder
        self.sleep_s = sleep_s
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, i: int, topic: str) -> dict[str, Any]:
        if self.sleep_s > 0:
            time.sleep(self.sleep_s)
        with open(self.folder / f"{topic.rsplit(' ', 1)[-1]}.txt", "a", encoding="utf-8") as fh:
            fh.write(f"{i}\t{topic}\n")
        return result_of(i, topic)


def plain_loop(tool: Callable[[int, str], dict[str, Any]], topic: str) -> dict[str, Any]:
    """W40 with no runtime: the model call and the 40 tool calls, with the same arguments."""
    plan = stub_model(f"Plan a search about {topic}")
    found = []
    for i in range(TOOL_CALLS):
        found.append(tool(i, topic)["i"])
    return {"plan": plan["plan"], "hits": len(found)}


def check_outbox(folder: Path, runs: int) -> int:
    """Every run's file holds its 40 lines, once each and in order. Returns the effects."""
    effects = 0
    for k in range(runs):
        path = folder / f"{run_id_of(k)}.txt"
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        wanted = [f"{i}\t{topic_of(k)}" for i in range(TOOL_CALLS)]
        if lines != wanted:
            raise ProbeError(f"{path.name}: {len(lines)} lines, not the 40 tool calls in order")
        effects += len(lines)
    return effects


class ProbeError(Exception):
    """A run did not finish as the workload says it must."""


# -- the command line -----------------------------------------------------------------------


@dataclass(frozen=True)
class Args:
    work: Path
    """A fresh folder on a real disk: the runtime's database and the outbox go here."""
    concurrency: int
    runs: int
    sleep_s: float
    mode: str
    """The durability mode, for a runtime that has several; "default" otherwise."""
    db: str | None = None
    """The runtime's database as it takes it (a file, a PostgreSQL URL); None: a file in
    ``work``."""


def parse_args(argv: list[str] | None = None, modes: tuple[str, ...] = ("default",)) -> Args:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--work", required=True, help="fresh folder for the database and outbox")
    parser.add_argument("--concurrency", type=int, required=True, help="threads driving runs")
    parser.add_argument("--runs", type=int, required=True, help="runs to drive, all told")
    parser.add_argument("--sleep-s", type=float, default=0.0, help="sleep in each tool call")
    parser.add_argument("--mode", choices=modes, default=modes[0], help="durability mode")
    parser.add_argument("--db", help="the runtime's database (default: a file in --work)")
    ns = parser.parse_args(argv)
    if ns.concurrency < 1 or ns.runs < ns.concurrency:
        parser.error("need 1 <= --concurrency <= --runs")
    return Args(Path(ns.work), ns.concurrency, ns.runs, ns.sleep_s, ns.mode, ns.db)


# -- driving and timing ---------------------------------------------------------------------


def run_concurrently(args: Args, run_one: Callable[[int], Any]) -> dict[str, Any]:
    """Drive runs 0..runs-1 with ``args.concurrency`` threads (see the module docstring).
    Returns the span, the CPU time and run 0's result; the first failure of any run is raised
    here, with the thread's traceback."""
    n = args.concurrency
    barrier = threading.Barrier(n + 1)
    starts: list[float] = [0.0] * n
    ends: list[float] = [0.0] * n
    failures: list[str] = []
    results: dict[int, Any] = {}

    def thread(t: int) -> None:
        barrier.wait()
        starts[t] = time.perf_counter()
        try:
            for k in range(t, args.runs, n):
                result = run_one(k)
                if k == 0:
                    results[0] = result
        except BaseException:
            failures.append(f"thread {t}:\n{traceback.format_exc()}")
        ends[t] = time.perf_counter()

    threads = [threading.Thread(target=thread, args=(t,), name=f"probe-{t}") for t in range(n)]
    for th in threads:
        th.start()
    cpu0 = _cpu_s()
    barrier.wait()
    for th in threads:
        th.join()
    cpu_s = _cpu_s() - cpu0
    if failures:
        raise ProbeError(f"{len(failures)} of {n} threads failed; the first:\n{failures[0]}")
    span_s = max(ends) - min(starts)
    return {"span_s": span_s, "cpu_s": cpu_s, "first_result": results.get(0)}


def time_pairs(args: Args, run_one: Callable[[int], Any]) -> dict[str, Any]:
    """``args.runs`` pairs in this thread, each the plain loop (on a tool like the runs', writing
    to a file of its own) then run ``k``, each timed on its own; the runtime's per-step overhead
    is (run - plain) / 41 of a pair. Returns what ``run_concurrently`` returns (the span being
    the runs' time alone), and under ``pairs`` the nanoseconds of each."""
    tool = Outbox(args.work / "outbox", args.sleep_s)
    plain_ns: list[int] = []
    run_ns: list[int] = []
    first: Any = None
    cpu0 = _cpu_s()
    for k in range(args.runs):
        t0 = time.perf_counter_ns()
        plain_loop(tool, f"{TOPIC} plain-{k:05d}")
        t1 = time.perf_counter_ns()
        result = run_one(k)
        t2 = time.perf_counter_ns()
        plain_ns.append(t1 - t0)
        run_ns.append(t2 - t1)
        if k == 0:
            first = result
    return {
        "span_s": sum(run_ns) / 1e9,
        "cpu_s": _cpu_s() - cpu0,
        "first_result": first,
        "pairs": {"plain_ns": plain_ns, "run_ns": run_ns},
    }


def _cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def emit(
    args: Args,
    timing: dict[str, Any],
    steps_by_run: list[int],
    *,
    runtime: str,
    version: str,
    durability: dict[str, Any],
    **extra: Any,
) -> None:
    """Check the runs' effects and step counts, and print the probe's one JSON object."""
    effects = check_outbox(args.work / "outbox", args.runs)
    short = [k for k, n in enumerate(steps_by_run) if n != STEPS]
    if len(steps_by_run) != args.runs or short:
        raise ProbeError(
            f"{len(short)} runs did not record {STEPS} completed steps (e.g. run "
            f"{short[:1]}: {[steps_by_run[k] for k in short[:1]]})"
        )
    if timing["first_result"] != expected_result():
        raise ProbeError(f"run 0 returned {timing['first_result']!r}")
    steps = sum(steps_by_run)
    report = {
        "runtime": runtime,
        "version": version,
        "mode": args.mode,
        "concurrency": args.concurrency,
        "runs": args.runs,
        "sleep_s": args.sleep_s,
        "steps": steps,
        "effects": effects,
        "span_s": round(timing["span_s"], 6),
        "steps_per_s": round(steps / timing["span_s"], 1),
        "cpu_s": round(timing["cpu_s"], 3),
        "cpu_us_per_step": round(timing["cpu_s"] / steps * 1e6, 1),
        "first_result": timing["first_result"],
        "tool_result": result_of(0, topic_of(0)),
        "durability": durability,
        **({"pairs": timing["pairs"]} if "pairs" in timing else {}),
        **extra,
    }
    print(json.dumps(report), flush=True)
