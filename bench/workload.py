"""The W40 workload, shared by the benchmarks: one ``ModelCall`` to a stub model that answers
instantly, then 40 ``ToolCall``s to a tool that appends one line to a file and returns a
~200-byte dict. ``plain_loop`` makes the same calls with no runtime: the baseline.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from durabl import ModelCall, ToolCall, workflow

TOOL_CALLS = 40
STEPS = 1 + TOOL_CALLS
TOPIC = "sea otters"
WORKFLOW_NAME = "bench.w40"
TOOL_NAME = "append_line"

OUTBOX_ENV = "DURABL_BENCH_OUTBOX"
"""Where bench/worker_app.py's tool appends (a worker process learns it from its environment)."""
SLEEP_ENV = "DURABL_BENCH_STEP_SLEEP_S"
"""If set above 0, bench/worker_app.py's tool sleeps this long per call (and is keyed)."""


def stub_llm(prompt: str, **params: Any) -> dict[str, Any]:
    """The model: answers instantly with a small dict."""
    return {"plan": "query each source once", "queries": TOOL_CALLS, "tokens": 17}


class Outbox:
    """The tool: appends one line to a file and returns a ~200-byte dict."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def __call__(self, i: int, topic: str) -> dict[str, Any]:
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{i}\t{topic}\n")
        return result_of(i, topic)

    def lines(self) -> int:
        with open(self.path, encoding="utf-8") as fh:
            return sum(1 for _ in fh)


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


@workflow(name=WORKFLOW_NAME)
def w40(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"Plan a search about {topic}")
    found = []
    for i in range(TOOL_CALLS):
        hit = yield ToolCall(TOOL_NAME, {"i": i, "topic": topic})
        found.append(hit["i"])
    return {"plan": plan["plan"], "hits": len(found)}


def plain_loop(llm: Callable[..., Any], append: Callable[..., Any], topic: str) -> Any:
    """The baseline: the same calls with the same arguments, and nothing else."""
    plan = llm(f"Plan a search about {topic}")
    found = []
    for i in range(TOOL_CALLS):
        hit = append(i=i, topic=topic)
        found.append(hit["i"])
    return {"plan": plan["plan"], "hits": len(found)}


EXPECTED = plain_loop(stub_llm, lambda i, topic: {"i": i}, TOPIC)
"""What every W40 run returns."""
