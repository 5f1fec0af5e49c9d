"""Workflows and tools for the CLI tests, and a helper that puts a database in a given state.

``durabl --import cli_agents ...`` loads this module (``tests/integration`` on PYTHONPATH).
``python cli_agents.py DB STATE RUN_ID`` prepares a run in a separate process; a crash point is
hit by leaving the process at once (``os._exit``), so no lease outlives it.

Every tool and model call appends a line to the file named by ``DURABL_TEST_CALLS``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from durabl import ModelCall, Runtime, Sleep, ToolCall, tool, workflow
from durabl.crashpoints import CrashAt, ProcessDeath


def _called(line: str) -> None:
    path = os.environ.get("DURABL_TEST_CALLS")
    if path:
        with open(path, "a") as handle:
            handle.write(line + "\n")


def effect(n: int) -> dict[str, Any]:
    _called(f"effect\t{n}")
    return {"n": n}


def notify(to: str) -> dict[str, Any]:
    _called(f"notify\t{to}")
    return {"sent": to}


def broken(n: int) -> Any:
    _called(f"broken\t{n}")
    raise RuntimeError("the far end said no")


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    _called(f"model\t{prompt}")
    return {"text": f"plan: {prompt}"}


DURABL_LLM = llm
DURABL_TOOLS = {
    "effect": tool(effect, mode="IDEMPOTENT"),
    "notify": notify,  # a bare callable: AT_MOST_ONCE
    "broken": tool(broken, mode="IDEMPOTENT", max_attempts=1),
}


@workflow(name="cli_chain")
def chain(ctx: Any, steps: int = 3) -> Any:
    """A model call, then ``steps`` effects."""
    plan = yield ModelCall(f"plan for {ctx.run_id}")
    done = []
    for i in range(steps):
        done.append((yield ToolCall("effect", {"n": i})))
    return {"plan": plan["text"], "done": len(done)}


@workflow(name="cli_notify")
def notify_then_effect(ctx: Any) -> Any:
    """An AT_MOST_ONCE notification, then an effect."""
    sent = yield ToolCall("notify", {"to": ctx.run_id})
    yield ToolCall("effect", {"n": 0})
    return sent


@workflow(name="cli_sleeper")
def sleeper(ctx: Any) -> Any:
    """A one-hour durable timer, then an effect."""
    yield Sleep(hours=1)
    return (yield ToolCall("effect", {"n": 0}))


@workflow(name="cli_drifting")
def drifting(ctx: Any) -> Any:
    """Its first step depends on the environment: a deploy can break its determinism."""
    yield ToolCall("effect", {"n": int(os.environ.get("DURABL_TEST_VERSION") or 1)})
    yield ToolCall("effect", {"n": 100})
    return "done"


@workflow(name="cli_failing")
def failing(ctx: Any) -> Any:
    """An effect, then a tool that always fails (uncaught: the run ends FAILED)."""
    yield ToolCall("effect", {"n": 0})
    return (yield ToolCall("broken", {"n": 1}))


_PREPARE: dict[str, tuple[Any, str | None, int]] = {
    # state: (workflow, crash point or None, occurrence)
    "completed": (chain, None, 1),
    "failed": (failing, None, 1),
    "sleeping": (sleeper, None, 1),
    "dead": (notify_then_effect, "after_tool_dispatched", 1),
    "interrupted": (chain, "after_step_committed", 2),
    "drifted": (drifting, "after_step_committed", 1),
}


def prepare(db: str, state: str, run_id: str) -> None:
    wf, point, occurrence = _PREPARE[state]
    rt = Runtime(db, llm=llm, tools=DURABL_TOOLS)
    if point is None:
        rt.start(wf, {}, run_id=run_id)
        rt.close()
        return
    with CrashAt(point, occurrence):
        try:
            rt.start(wf, {}, run_id=run_id)
        except ProcessDeath:
            os._exit(0)  # the process dies here: nothing runs after the crash point
    raise SystemExit(f"crash point {point} was not reached")


if __name__ == "__main__":
    prepare(sys.argv[1], sys.argv[2], sys.argv[3])
