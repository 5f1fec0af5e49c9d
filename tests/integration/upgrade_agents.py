"""A workflow whose code changes between deploys, for the tests of ``ctx.patched`` and
``durabl check`` (``--import upgrade_agents``, with ``tests/integration`` on PYTHONPATH).

Which deploy is running is read from ``DURABL_TEST_DEPLOY`` each time the workflow runs:

- ``v1``: the first version.
- ``v2``: the summary prompt changed behind ``ctx.patched("summary-v2")``, the safe way.
- ``v2-unguarded``: the same change without the guard.
- ``v3``: the guard taken out again while runs that took the new branch still exist.
"""

from __future__ import annotations

import os
from typing import Any

from durabl import ModelCall, Sleep, ToolCall, workflow

OLD_PROMPT = "summarise {}"
NEW_PROMPT = "summarise {} in three bullets"


def deploy() -> str:
    return os.environ.get("DURABL_TEST_DEPLOY", "v1")


@workflow(name="up_summary")
def summary(ctx: Any, topic: str) -> Any:
    """Search, summarise, wait an hour for review, send."""
    found = yield ToolCall("search", {"q": topic})
    version = deploy()
    if version == "v2":
        if ctx.patched("summary-v2"):
            text = yield ModelCall(NEW_PROMPT.format(topic))
        else:
            text = yield ModelCall(OLD_PROMPT.format(topic))
    elif version in ("v2-unguarded", "v3"):
        text = yield ModelCall(NEW_PROMPT.format(topic))
    else:
        text = yield ModelCall(OLD_PROMPT.format(topic))
    yield Sleep(seconds=3600)
    sent = yield ToolCall("send", {"text": text["text"], "hits": found["hits"]})
    return sent


@workflow(name="up_validate")
def validate(ctx: Any, topic: str) -> Any:
    """Search, then refuse a blank topic: a check added by v2 behind ``ctx.patched``, whose new
    branch yields no step (v3 keeps the check and drops the guard)."""
    found = yield ToolCall("search", {"q": topic})
    version = deploy()
    strict = ctx.patched("validate-v2") if version == "v2" else version in ("v2-unguarded", "v3")
    if strict and not topic.strip():
        raise ValueError(f"a blank topic {topic!r}")
    return found


@workflow(name="up_bad_patch")
def bad_patch(ctx: Any) -> Any:
    """Asks ctx.patched with something that is not a patch id."""
    if ctx.patched(5):
        yield ToolCall("search", {"q": "never"})
    return None


def search(q: str) -> dict[str, Any]:
    return {"hits": 3, "q": q}


def send(text: str, hits: int) -> dict[str, Any]:
    return {"sent": text, "hits": hits}


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    return {"text": f"summary of: {prompt}"}


DURABL_TOOLS = {"search": search, "send": send}
DURABL_LLM = llm
