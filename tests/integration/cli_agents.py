"""Workflows and tools for the CLI tests, and a helper that puts a database in given states.

``durabl --import cli_agents ...`` loads this module (``tests/integration`` on PYTHONPATH).
``python cli_agents.py DB STATE:RUN_ID [STATE:RUN_ID ...]`` prepares runs in a process of its
own. A crash point ends the drive the way the chaos harness's in-process deaths do: the runtime
is abandoned without closing it, and when a state needs it a fresh runtime takes the run over,
as a restarted process would. The helper leaves with ``os._exit``, so nothing of the abandoned
runtimes runs after its crash point and no lease outlives the process.

Every tool and model call appends a line to the file named by ``DURABL_TEST_CALLS``. The model
reports token usage: ``len(prompt)`` input tokens and ``ANSWER_TOKENS`` output tokens.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Any

from durabl import ModelCall, Runtime, Sleep, ToolCall, tool, workflow
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.errors import NonDeterminismError

ANSWER_TOKENS = 5


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


def hold(gate: str) -> str:
    """Blocks until the file ``gate`` exists: keeps a run leased by a live process."""
    _called(f"hold\t{gate}")
    deadline = time.monotonic() + 30
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.02)
    return "released"


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    _called(f"model\t{prompt}")
    usage = {"input_tokens": len(prompt), "output_tokens": ANSWER_TOKENS}
    return {"text": f"plan: {prompt}", "usage": usage}


DURABL_LLM = llm
DURABL_TOOLS = {
    "effect": tool(effect, mode="IDEMPOTENT"),
    "notify": notify,  # a bare callable: AT_MOST_ONCE
    "broken": tool(broken, mode="IDEMPOTENT", max_attempts=1),
    "hold": tool(hold, mode="IDEMPOTENT"),
}


@workflow(name="cli_chain")
def chain(ctx: Any, steps: int = 3) -> Any:
    """A model call, then ``steps`` effects."""
    plan = yield ModelCall(f"plan for {ctx.run_id}")
    done = []
    for i in range(steps):
        done.append((yield ToolCall("effect", {"n": i})))
    return {"plan": plan["text"], "done": len(done)}


@workflow(name="cli_costly")
def costly(ctx: Any) -> Any:
    """Two model calls around two effects."""
    yield ModelCall(f"plan for {ctx.run_id}")
    for i in range(2):
        yield ToolCall("effect", {"n": i})
    summary = yield ModelCall(f"summarize the two effects of {ctx.run_id}")
    return summary["text"]


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


@workflow(name="cli_live")
def live(ctx: Any, gate: str) -> Any:
    """An effect, then a tool that blocks until ``gate`` exists."""
    yield ToolCall("effect", {"n": 0})
    return (yield ToolCall("hold", {"gate": gate}))


_PREPARE: dict[str, tuple[Any, str | None, int, str | None]] = {
    # state: (workflow, crash point or None, occurrence, what a second process does then)
    "completed": (chain, None, 1, None),
    "failed": (failing, None, 1, None),
    "sleeping": (sleeper, None, 1, None),
    "dead": (notify_then_effect, "after_tool_dispatched", 1, None),
    "dead_lettered": (notify_then_effect, "after_tool_dispatched", 1, "resume"),
    "interrupted": (chain, "after_step_committed", 2, None),
    "drifted": (drifting, "after_step_committed", 1, None),
    "held": (drifting, "after_step_committed", 1, "redeploy"),
    "costly": (costly, None, 1, None),
    "reasked": (costly, "after_model_returned", 2, "resume"),
    "long": (chain, None, 1, None),
    "live": (live, None, 1, None),
}
_INPUT: dict[str, dict[str, Any]] = {"long": {"steps": 150}}


def prepare(db: str, state: str, run_id: str) -> None:
    wf, point, occurrence, then = _PREPARE[state]
    run_input = _INPUT.get(state, {})
    if state == "live":
        run_input = {"gate": f"{db}.{run_id}.gate"}
    rt = Runtime(db, llm=llm, tools=DURABL_TOOLS)
    if point is None:
        rt.start(wf, run_input, run_id=run_id)
        rt.close()
        return
    with CrashAt(point, occurrence) as crash, contextlib.suppress(ProcessDeath):
        rt.start(wf, run_input, run_id=run_id)  # a death abandons the runtime as it stands
    if not crash.fired:
        raise SystemExit(f"crash point {point} was not reached")
    if then is not None:
        _take_over(db, run_id, redeploy=then == "redeploy")


def _take_over(db: str, run_id: str, *, redeploy: bool) -> None:
    """What the next process does: resume the run, with the changed code if ``redeploy``."""
    if redeploy:
        os.environ["DURABL_TEST_VERSION"] = "2"
    rt = Runtime(db, llm=llm, tools=DURABL_TOOLS)
    try:
        rt.resume(run_id)
    except NonDeterminismError:
        pass  # the run is held
    finally:
        os.environ.pop("DURABL_TEST_VERSION", None)
        rt.close()


if __name__ == "__main__":
    for pair in sys.argv[2:]:
        state, _, run = pair.partition(":")
        prepare(sys.argv[1], state, run)
    sys.stdout.flush()
    os._exit(0)
