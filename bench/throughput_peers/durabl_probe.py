"""The durabl probe of the throughput benchmark, run by durabl's own interpreter like the peers'.

Three commands:

- (none): ``--concurrency`` threads each call ``rt.start(w40, input)`` on ONE shared ``Runtime``
  (``durability=--mode``), which creates a run and drives it to completion in the calling
  thread; timed by ``kit.run_concurrently``. The workflow is ``bench.workload.w40``; the tool is
  kit's per-run outbox registered ``IDEMPOTENT`` (at-least-once, as DBOS's and LangGraph's steps
  are: durabl makes only the completion of each step durable, one fsync-bearing commit per step
  in full mode). Steps are counted afterwards from the log, through a read-only store: each
  run's STEP_COMPLETED events.
- ``create``: create ``--runs`` runs and leave each RUNNING right after its RUN_STARTED, its
  lease held by this process, which exits (``CrashAt("after_run_started")``): runs a worker
  process can take over at once. Prints their ids as JSON.
- ``serve``: a worker (``Runtime.serve(concurrency=--concurrency)``) until SIGTERM, then prints
  its counts as JSON.
"""

from __future__ import annotations

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
from durabl.store import SQLiteStore

MODES = ("full", "process")
DB_NAME = "durabl.db"
DURABILITY = {
    "full": "SQLite WAL; synchronous=NORMAL for bookkeeping commits, each step's completion "
    "commit made durable (the WAL fsynced) before the step returns",
    "process": "SQLite WAL, synchronous=NORMAL: no fsync; every commit survives the process's "
    "death, not the machine's",
}


def open_runtime(args: kit.Args) -> Runtime:
    outbox = kit.Outbox(args.work / "outbox", args.sleep_s)
    return Runtime(
        args.work / DB_NAME,
        llm=kit.stub_model,
        tools={TOOL_NAME: tool(outbox, name=TOOL_NAME, mode="IDEMPOTENT")},
        durability=args.mode,
    )


def steps_completed(db: Path, runs: int) -> list[int]:
    store = SQLiteStore(db, read_only=True)
    try:
        return [
            sum(1 for e in store.load_log(kit.run_id_of(k)) if e.kind == "STEP_COMPLETED")
            for k in range(runs)
        ]
    finally:
        store.close()


def measure(args: kit.Args) -> None:
    with open_runtime(args) as rt:

        def run_one(k: int) -> Any:
            state = rt.run(w40, {"topic": kit.topic_of(k)}, run_id=kit.run_id_of(k))
            if state.status != "COMPLETED":
                raise kit.ProbeError(f"run {state.run_id} is {state.status}: {state.error}")
            return state.result

        timing = kit.run_concurrently(args, run_one)
        # Group commit, seen from the store: how many commits shared each transaction (and so,
        # in full mode, each fsync).
        shared = round(rt.store.commits / max(1, rt.store.transactions), 3)
    kit.emit(
        args,
        timing,
        steps_completed(args.work / DB_NAME, args.runs),
        runtime="durabl",
        version=metadata.version("durabl"),
        durability={"mode": args.mode, "sqlite": DURABILITY[args.mode]},
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


def serve(args: kit.Args, poll_s: float = 0.05) -> None:
    with open_runtime(args) as rt:
        signal.signal(signal.SIGTERM, lambda *_: rt.stop())
        print("serving", flush=True)
        stats = rt.serve(concurrency=args.concurrency, poll_s=poll_s)
    print(json.dumps({"drives": stats.drives, "completed": stats.completed, **_errors(stats)}))


def _errors(stats: Any) -> dict[str, Any]:
    return {"errors": stats.errors} if stats.errors else {}


def main(argv: list[str]) -> None:
    command = argv[0] if argv and argv[0] in ("create", "serve") else None
    args = kit.parse_args(argv[1:] if command else argv, MODES)
    {"create": create, "serve": serve, None: measure}[command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
