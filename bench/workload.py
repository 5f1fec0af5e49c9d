"""The W40 workload, shared by the benchmarks: one ``ModelCall`` to a stub model that answers
instantly, then 40 ``ToolCall``s to a tool that appends one line to a file and returns a
~200-byte dict. ``plain_loop`` makes the same calls with no runtime: the baseline.

The stub model, the tool's result and the workload's shape come from
``bench/throughput_peers/kit.py``, which needs nothing but the standard library, so that the
probes other interpreters run (the peers', durabl 0.1.0's) share this one copy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.throughput_peers.kit import STEPS, TOOL_CALLS, TOPIC, result_of
from bench.throughput_peers.kit import stub_model as stub_llm
from durabl import ModelCall, ToolCall, workflow

WORKFLOW_NAME = "bench.w40"
TOOL_NAME = "append_line"

OUTBOX_ENV = "DURABL_BENCH_OUTBOX"
"""Where bench/worker_app.py's tool appends (a worker process learns it from its environment)."""
SLEEP_ENV = "DURABL_BENCH_STEP_SLEEP_S"
"""If set above 0, bench/worker_app.py's tool sleeps this long per call (and is keyed)."""


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


__all__ = [
    "EXPECTED",
    "OUTBOX_ENV",
    "SLEEP_ENV",
    "STEPS",
    "TOOL_CALLS",
    "TOOL_NAME",
    "TOPIC",
    "WORKFLOW_NAME",
    "Outbox",
    "plain_loop",
    "result_of",
    "stub_llm",
    "w40",
]
