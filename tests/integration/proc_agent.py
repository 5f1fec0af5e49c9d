"""The agent processes of the lease, worker and shell tests. One role per invocation:

    proc_agent.py seed DB WORKFLOW COUNT PREFIX [--input JSON] [--crash-at POINT [--occurrence N]]
        Start COUNT runs PREFIX-0.. of WORKFLOW. With --crash-at each start dies (ProcessDeath)
        at that point, leaving an interrupted run whose lease names this process; the process
        then exits, so the lease's owner is gone. Prints the run ids as JSON.
    proc_agent.py race DB
        Print "ready", wait for a line on stdin (the starting gun), then resume_all().
    proc_agent.py start DB WORKFLOW RUN_ID [--input JSON] [--lease-s S] [--stop-after-step N]
        Start one run; with --stop-after-step the process sends SIGSTOP to itself right after
        the N-th step is committed. Reports whether it completed or lost its lease.
    proc_agent.py resume DB RUN_ID
        Resume one run.
    proc_agent.py hammer DB PREFIX COUNT
        Print "ready", wait for the starting gun, then run COUNT short runs back to back,
        pausing halfway (it prints "halfway" and waits for another line on stdin).

Each role prints one JSON line as its last output. Tools and the model come from
``worker_agents`` (which reads its environment variables).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from typing import Any

import worker_agents

from durabl import Runtime, ToolCall, crashpoints, workflow
from durabl.errors import DurablError, LeaseLost


@workflow(name="pa_only_here")
def only_here(ctx: Any) -> Any:
    """Registered in this script and not in ``worker_agents``: unknown to a worker."""
    done = yield ToolCall("effect", {"n": 0})
    return done


def runtime(db: str, **options: Any) -> Runtime:
    return Runtime(db, llm=worker_agents.DURABL_LLM, tools=worker_agents.DURABL_TOOLS, **options)


def report(**fields: Any) -> None:
    print(json.dumps({"pid": os.getpid(), **fields}), flush=True)


def seed(args: argparse.Namespace) -> None:
    run_input = json.loads(args.input)
    run_ids = []
    for i in range(args.count):
        run_id = f"{args.prefix}-{i}"
        rt = runtime(args.db)
        try:
            if args.crash_at:
                crash = crashpoints.CrashAt(args.crash_at, args.occurrence)
                with crash, contextlib.suppress(crashpoints.ProcessDeath):
                    rt.start(args.workflow, run_input, run_id=run_id)
                if not crash.fired:
                    raise SystemExit(f"run {run_id} never reached crash point {args.crash_at}")
            else:
                rt.start(args.workflow, run_input, run_id=run_id)
        finally:
            rt.close()
        run_ids.append(run_id)
    report(run_ids=run_ids)


def wait_for_gun() -> None:
    print("ready", flush=True)
    sys.stdin.readline()


def race(args: argparse.Namespace) -> None:
    with runtime(args.db) as rt:
        wait_for_gun()
        states = rt.resume_all()
    report(states=[{"run_id": s.run_id, "status": s.status, "error": s.error} for s in states])


def start(args: argparse.Namespace) -> None:
    if args.stop_after_step:
        seen = 0

        def freeze(point: str) -> None:
            nonlocal seen
            if point == crashpoints.AFTER_STEP_COMMITTED:
                seen += 1
                if seen == args.stop_after_step:
                    os.kill(os.getpid(), signal.SIGSTOP)

        crashpoints.install(freeze)
    with runtime(args.db, lease_s=args.lease_s) as rt:
        try:
            state = rt.run(args.workflow, json.loads(args.input), run_id=args.run_id)
        except LeaseLost as exc:
            report(outcome="lease_lost", error=str(exc))
            return
        except DurablError as exc:
            report(outcome="error", error=f"{type(exc).__name__}: {exc}")
            return
    report(outcome="finished", status=state.status, result=state.result)


def resume(args: argparse.Namespace) -> None:
    with runtime(args.db) as rt:
        state = rt.resume(args.run_id)
    report(outcome="finished", status=state.status, result=state.result)


def hammer(args: argparse.Namespace) -> None:
    statuses: dict[str, int] = {}
    with runtime(args.db) as rt:
        wait_for_gun()
        for i in range(args.count):
            if i == args.count // 2:
                print("halfway", flush=True)
                sys.stdin.readline()  # the second gun
            state = rt.run("wa_chain", {"steps": 2}, run_id=f"{args.prefix}-{i}")
            statuses[state.status] = statuses.get(state.status, 0) + 1
    report(statuses=statuses)


def main() -> None:
    parser = argparse.ArgumentParser()
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("seed")
    p.add_argument("db")
    p.add_argument("workflow")
    p.add_argument("count", type=int)
    p.add_argument("prefix")
    p.add_argument("--input", default="{}")
    p.add_argument("--crash-at", choices=crashpoints.ALL)
    p.add_argument("--occurrence", type=int, default=1)
    p.set_defaults(handler=seed)
    p = roles.add_parser("race")
    p.add_argument("db")
    p.set_defaults(handler=race)
    p = roles.add_parser("start")
    p.add_argument("db")
    p.add_argument("workflow")
    p.add_argument("run_id")
    p.add_argument("--input", default="{}")
    p.add_argument("--lease-s", type=float, default=15.0)
    p.add_argument("--stop-after-step", type=int, default=0)
    p.set_defaults(handler=start)
    p = roles.add_parser("resume")
    p.add_argument("db")
    p.add_argument("run_id")
    p.set_defaults(handler=resume)
    p = roles.add_parser("hammer")
    p.add_argument("db")
    p.add_argument("prefix")
    p.add_argument("count", type=int)
    p.set_defaults(handler=hammer)
    args = parser.parse_args()
    args.handler(args)


if __name__ == "__main__":
    main()
