"""Workflows, tools and a model for the tests that run durabl in real processes.

``durabl worker --import worker_agents`` loads this module (``tests/integration`` on
PYTHONPATH), and ``proc_agent.py`` imports it for the other roles. The outside world is files
named by environment variables, read when a tool is called:

- ``DURABL_TEST_CALLS``: every invocation, one line each:
  ``begin|end <TAB> tool <TAB> key <TAB> pid`` (the model writes ``model <TAB> prompt <TAB> pid``).
- ``DURABL_TEST_OUTBOX``: the effects the world has seen. ``effect`` and ``pausable`` are
  IDEMPOTENT and dedupe on the idempotency key (like an API that honours client keys), so they
  add at most one line per key; ``notify`` is AT_MOST_ONCE and adds a line on every call.
- ``DURABL_TEST_STEP_S`` / ``DURABL_TEST_NOTIFY_S``: how long each ``effect`` / ``notify``
  call takes (default 0).
- ``DURABL_TEST_STOP_IN_TOOL=1``: ``pausable`` sends SIGSTOP to its own process, once.
- ``DURABL_TEST_VERSION``: the argument ``drifting`` yields first; changing it between the
  process that recorded a run and the one resuming it is a deploy that broke determinism.
"""

from __future__ import annotations

import fcntl
import os
import signal
import time
from typing import Any

from durabl import ModelCall, Sleep, ToolCall, tool, workflow
from durabl.shell import shell_tool

_stopped_once = False


def _env_path(name: str) -> str | None:
    return os.environ.get(name) or None


def _append(path: str | None, line: str) -> None:
    if path is None:
        return
    with open(path, "a") as handle:
        handle.write(line + "\n")


def _delay(name: str) -> None:
    seconds = float(os.environ.get(name) or 0)
    if seconds > 0:
        time.sleep(seconds)


def _publish_once(key: str, line: str) -> None:
    """Add ``line`` to the outbox unless the key is there already (under a file lock)."""
    outbox = _env_path("DURABL_TEST_OUTBOX")
    if outbox is None:
        return
    with open(outbox, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        if not any(seen.split("\t")[0] == key for seen in handle.read().splitlines()):
            handle.write(line + "\n")
            handle.flush()
        fcntl.flock(handle, fcntl.LOCK_UN)


def _call(kind: str, tool_name: str, key: str) -> None:
    _append(_env_path("DURABL_TEST_CALLS"), f"{kind}\t{tool_name}\t{key}\t{os.getpid()}")


def effect(n: int, *, idempotency_key: str) -> dict[str, Any]:
    _call("begin", "effect", idempotency_key)
    _delay("DURABL_TEST_STEP_S")
    _publish_once(idempotency_key, f"{idempotency_key}\teffect\t{n}")
    _call("end", "effect", idempotency_key)
    return {"n": n, "key": idempotency_key}


def pausable(n: int, *, idempotency_key: str) -> dict[str, Any]:
    global _stopped_once
    _call("begin", "pausable", idempotency_key)
    if os.environ.get("DURABL_TEST_STOP_IN_TOOL") == "1" and not _stopped_once:
        _stopped_once = True
        os.kill(os.getpid(), signal.SIGSTOP)  # frozen here until SIGCONT
    _publish_once(idempotency_key, f"{idempotency_key}\tpausable\t{n}")
    _call("end", "pausable", idempotency_key)
    return {"n": n, "key": idempotency_key, "pid": os.getpid()}


def notify(to: str, *, idempotency_key: str) -> dict[str, Any]:
    _call("begin", "notify", idempotency_key)
    _delay("DURABL_TEST_NOTIFY_S")
    _append(_env_path("DURABL_TEST_OUTBOX"), f"{idempotency_key}\tnotify\t{to}")
    _call("end", "notify", idempotency_key)
    return {"sent": to}


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    _append(_env_path("DURABL_TEST_CALLS"), f"model\t{prompt}\t{os.getpid()}")
    return {"text": f"plan: {prompt}", "steps": 3}


DURABL_LLM = llm
DURABL_TOOLS = {
    "effect": tool(effect, mode="IDEMPOTENT"),
    "pausable": tool(pausable, mode="IDEMPOTENT"),
    "notify": notify,  # a bare callable: AT_MOST_ONCE
    "shell": shell_tool(name="shell", mode="IDEMPOTENT"),
}


@workflow(name="wa_chain")
def chain(ctx: Any, steps: int = 3) -> Any:
    """A model call, then ``steps`` IDEMPOTENT effects."""
    plan = yield ModelCall(f"plan for {ctx.run_id}")
    done = []
    for i in range(steps):
        done.append((yield ToolCall("effect", {"n": i})))
    return {"plan": plan["text"], "keys": [d["key"] for d in done]}


@workflow(name="wa_notify_first")
def notify_first(ctx: Any) -> Any:
    """An AT_MOST_ONCE notification, then an IDEMPOTENT effect."""
    sent = yield ToolCall("notify", {"to": ctx.run_id})
    done = yield ToolCall("effect", {"n": 0})
    return {"sent": sent, "key": done["key"]}


@workflow(name="wa_fenced")
def fenced(ctx: Any, middle: str = "pausable") -> Any:
    """Two IDEMPOTENT effects around a middle step: ``pausable`` (IDEMPOTENT with a derived key,
    and it can freeze its process) or ``notify`` (AT_MOST_ONCE: its opening is committed before
    the call)."""
    first = yield ToolCall("effect", {"n": 0})
    args = {"n": 1} if middle == "pausable" else {"to": ctx.run_id}
    done = yield ToolCall(middle, args)
    last = yield ToolCall("effect", {"n": 2})
    return {"keys": [first["key"], done.get("key"), last["key"]], "middle_pid": done.get("pid")}


@workflow(name="wa_sleeper")
def sleeper(ctx: Any, seconds: float) -> Any:
    """A durable timer, then an effect."""
    yield Sleep(seconds=seconds)
    done = yield ToolCall("effect", {"n": 0})
    return {"key": done["key"]}


@workflow(name="wa_buggy")
def buggy(ctx: Any) -> Any:
    """An effect, then a bug in the workflow's own code."""
    yield ToolCall("effect", {"n": 0})
    return {}["missing"]


@workflow(name="wa_unknown_tool")
def unknown_tool(ctx: Any) -> Any:
    yield ToolCall("no_such_tool", {"x": 1})
    return "unreachable"


@workflow(name="wa_drifting")
def drifting(ctx: Any) -> Any:
    """Yields an argument read from the environment: not deterministic across deploys."""
    first = yield ToolCall("effect", {"n": int(os.environ.get("DURABL_TEST_VERSION") or 1)})
    second = yield ToolCall("effect", {"n": 100})
    return [first["key"], second["key"]]


@workflow(name="wa_shell")
def shell(ctx: Any, command: Any) -> Any:
    """One shell command as a step."""
    out = yield ToolCall("shell", {"command": command})
    return out
