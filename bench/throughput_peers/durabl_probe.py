"""The durabl probe of the throughput benchmark, run by durabl's own interpreter like the peers'.

Four commands:

- (none): ``--concurrency`` threads each call ``rt.start(w40, input)`` on ONE shared ``Runtime``
  (``durability=--mode``), which creates a run and drives it to completion in the calling
  thread; timed by ``kit.run_concurrently``. The workflow is ``bench.workload.w40``; the tool is
  kit's per-run outbox registered ``IDEMPOTENT`` (at-least-once, as DBOS's and LangGraph's steps
  are: durabl makes only the completion of each step durable, one fsync-bearing commit per step
  in full mode). Steps are counted afterwards from the log, through a read-only store: each
  run's STEP_COMPLETED and TOOL_COMPLETED events.
- ``create``: create ``--runs`` runs and leave each RUNNING right after its RUN_STARTED, its
  lease held by this process, which exits (``CrashAt("after_run_started")``): runs a worker
  process can take over at once. Prints their ids as JSON.
- ``serve``: a worker (``Runtime.serve(concurrency=--concurrency, poll_s=--poll-s)``, poll
  0.05 s unless told) until SIGTERM, then prints its counts as JSON. It prints "serving" once its
  SIGTERM handler is in place; with ``--gate`` it then waits for a line on stdin before it starts,
  so that a benchmark can start several workers at one instant, their start-up behind them.
- ``overhead``: ``--runs`` pairs in one thread (``kit.time_pairs``), each the plain loop then one
  ``rt.run``, for the per-step overhead over the plain loop.

``--db`` puts the runtime on another database than the file in ``--work``: a ``postgresql://``
URL runs it on PostgreSQL (durabl's ``durability`` maps to ``synchronous_commit`` there).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kit

from bench.workload import TOOL_NAME, w40
from durabl import Runtime, tool
from durabl.crashpoints import AFTER_RUN_STARTED, CrashAt, ProcessDeath
from durabl.store import is_postgres_url, open_store

MODES = ("full", "process")
COMPLETIONS = ("STEP_COMPLETED", "TOOL_COMPLETED")
"""The events that record a finished tool or model step."""
DB_NAME = "durabl.db"
DURABILITY = {
    "full": "SQLite WAL; synchronous=NORMAL for bookkeeping commits, each step's completion "
    "commit made durable (the WAL fsynced) before the step returns",
    "process": "SQLite WAL, synchronous=NORMAL: no fsync; every commit survives the process's "
    "death, not the machine's",
}
POSTGRES_DURABILITY = {
    "full": "PostgreSQL: each step's completion commit waits for the server's WAL flush "
    "(synchronous_commit on); bookkeeping commits do not (SET LOCAL synchronous_commit TO off)",
    "process": "PostgreSQL, synchronous_commit off on every connection: no commit waits for the "
    "WAL flush; a commit survives the worker's death, a crash of the server may lose the last "
    "moments of commits",
}


def db_of(args: kit.Args) -> str | Path:
    return args.db or args.work / DB_NAME


def durability_of(args: kit.Args) -> dict[str, Any]:
    if is_postgres_url(args.db):
        return {"mode": args.mode, "postgres": POSTGRES_DURABILITY[args.mode]}
    return {"mode": args.mode, "sqlite": DURABILITY[args.mode]}


def open_runtime(args: kit.Args) -> Runtime:
    outbox = kit.Outbox(args.work / "outbox", args.sleep_s)
    return Runtime(
        db_of(args),
        llm=kit.stub_model,
        tools={TOOL_NAME: tool(outbox, name=TOOL_NAME, mode="IDEMPOTENT")},
        durability=args.mode,
    )


def steps_completed(db: str | Path, runs: int) -> list[int]:
    store = open_store(db, read_only=True)
    try:
        return [
            sum(1 for e in store.load_log(kit.run_id_of(k)) if e.kind in COMPLETIONS)
            for k in range(runs)
        ]
    finally:
        store.close()


def measure(args: kit.Args, pairs: bool = False) -> None:
    """Time the runs: concurrently (``kit.run_concurrently``) or, with ``pairs``, each after a
    plain loop (``kit.time_pairs``)."""
    with open_runtime(args) as rt:

        def run_one(k: int) -> Any:
            state = rt.run(w40, {"topic": kit.topic_of(k)}, run_id=kit.run_id_of(k))
            if state.status != "COMPLETED":
                raise kit.ProbeError(f"run {state.run_id} is {state.status}: {state.error}")
            return state.result

        timing = (kit.time_pairs if pairs else kit.run_concurrently)(args, run_one)
        # Group commit, seen from the store: how many commits shared each transaction (and so,
        # in full mode, each fsync). The SQLite store counts them; the PostgreSQL one does not.
        counted = getattr(rt.store, "transactions", None)
        shared = None if counted is None else round(rt.store.commits / max(1, counted), 3)
    kit.emit(
        args,
        timing,
        steps_completed(db_of(args), args.runs),
        runtime="durabl",
        version=metadata.version("durabl"),
        durability=durability_of(args),
        concurrency_by="threads, each calling rt.start(w40, input) on one shared Runtime",
        tool_mode="IDEMPOTENT",
        commits_per_transaction=shared,
    )


def create(args: kit.Args) -> None:
    made = []
    with open_runtime(args) as rt:
        for k in range(args.runs):
            try:
                with CrashAt(AFTER_RUN_STARTED):
                    rt.start(w40, {"topic": kit.topic_of(k)}, run_id=kit.run_id_of(k))
            except ProcessDeath:
                made.append(kit.run_id_of(k))
    print(json.dumps(made), flush=True)


def serve(args: kit.Args, poll_s: float = 0.05, gate: bool = False) -> None:
    with open_runtime(args) as rt:
        signal.signal(signal.SIGTERM, lambda *_: rt.stop())
        print("serving", flush=True)
        if gate:
            sys.stdin.readline()
        stats = rt.serve(concurrency=args.concurrency, poll_s=poll_s)
    print(json.dumps({"drives": stats.drives, "completed": stats.completed, **_errors(stats)}))


def _errors(stats: Any) -> dict[str, Any]:
    return {"errors": stats.errors} if stats.errors else {}


def main(argv: list[str]) -> None:
    command = argv[0] if argv and argv[0] in ("create", "serve", "overhead") else None
    rest = argv[1:] if command else argv
    if command == "serve":
        own = argparse.ArgumentParser(add_help=False)
        own.add_argument("--poll-s", type=float, default=0.05)
        own.add_argument("--gate", action="store_true")
        ns, rest = own.parse_known_args(rest)
        serve(kit.parse_args(rest, MODES), ns.poll_s, ns.gate)
        return
    args = kit.parse_args(rest, MODES)
    if command == "create":
        create(args)
    else:
        measure(args, pairs=command == "overhead")


if __name__ == "__main__":
    main(sys.argv[1:])
