"""A small agent that the SIGKILL tests run as a real process, and kill.

    python sigkill_agent.py DB OUTBOX CALLS [--crash-at POINT [--occurrence N]]

It boots the way an agent script does (resume interrupted runs, start its run idempotently,
fire due timers), then prints the run's state as one line of JSON. With ``--crash-at`` it
installs a crash-point hook that sends SIGKILL to its own process the N-th time POINT is
reached: no exception, no cleanup, no flush; the process is simply gone.

The outside world is two files: OUTBOX holds the effects the world has seen (the publish
endpoint dedupes on the idempotency key, like an API that honours client keys; the notify
endpoint does not), CALLS holds every invocation, including repeated ones.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path
from typing import Any

from durabl import ModelCall, Runtime, Sleep, ToolCall, crashpoints, tool, workflow

RUN_ID = "courier-1"
START_S = 1_800_000_000.0
WAKE_S = START_S + 3600.0


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    topic = prompt.rsplit(" about ", 1)[-1]
    return {"headline": f"All about {topic}", "body": f"{topic} hold hands while they sleep"}


def append(path: Path, line: str) -> None:
    with open(path, "a") as handle:
        handle.write(line + "\n")


def make_tools(outbox: Path, calls: Path) -> dict[str, Any]:
    def publish(text: str, *, idempotency_key: str) -> dict[str, Any]:
        append(calls, f"publish\t{idempotency_key}")
        seen = outbox.read_text().splitlines() if outbox.exists() else []
        if not any(line.startswith(f"publish\t{idempotency_key}\t") for line in seen):
            append(outbox, f"publish\t{idempotency_key}\t{text}")
        post_id = "post-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:10]
        return {"id": post_id, "text": text}

    def notify(to: str, about: str) -> dict[str, Any]:
        append(calls, f"notify\t{to}")
        append(outbox, f"notify\t{to}\t{about}")
        return {"sent": True, "to": to}

    # A bare callable is AT_MOST_ONCE: after an ambiguous death it is dead-lettered.
    return {"publish": tool(publish, mode="IDEMPOTENT"), "notify": notify}


@workflow(name="courier")
def courier(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"Plan a post about {topic}")
    first = yield ToolCall("publish", {"text": plan["headline"]})
    yield Sleep(minutes=30)
    second = yield ToolCall("publish", {"text": plan["body"]}, idempotency_key=f"body-{ctx.run_id}")
    receipt = yield ToolCall("notify", {"to": "ops", "about": second["id"]})
    return {"plan": plan, "first": first, "second": second, "receipt": receipt}


def kill_at(point: str, occurrence: int) -> None:
    seen = 0

    def hook(reached: str) -> None:
        nonlocal seen
        if reached == point:
            seen += 1
            if seen == occurrence:
                os.kill(os.getpid(), signal.SIGKILL)

    crashpoints.install(hook)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("outbox", type=Path)
    parser.add_argument("calls", type=Path)
    parser.add_argument("--crash-at", choices=crashpoints.ALL)
    parser.add_argument("--occurrence", type=int, default=1)
    args = parser.parse_args()

    rt = Runtime(
        args.db,
        llm=llm,
        tools=make_tools(args.outbox, args.calls),
        workflows=[courier],
        clock=lambda: START_S,
    )
    if args.crash_at:
        kill_at(args.crash_at, args.occurrence)
    rt.resume_all()
    rt.start(courier, {"topic": "sea otters"}, run_id=RUN_ID)
    rt.tick(now=WAKE_S)
    state = rt.state(RUN_ID)
    rt.close()
    print(
        json.dumps(
            {
                "pid": os.getpid(),
                "status": state.status,
                "result": state.result,
                "error": state.error,
            }
        )
    )


if __name__ == "__main__":
    main()
