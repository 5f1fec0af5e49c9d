"""What ``durabl worker --import bench.worker_app`` loads for the worker benchmark.

It registers the W40 workflow (by importing ``bench.workload``) and defines ``DURABL_LLM`` and
``DURABL_TOOLS`` from the environment:

- ``DURABL_BENCH_OUTBOX``: the file the tool appends to (required).
- ``DURABL_BENCH_STEP_SLEEP_S``: if set and above 0, each tool call first sleeps this long, and
  the tool is the keyed variant: registered IDEMPOTENT, it takes durabl's idempotency key and
  appends the line only if no line with that key is in the file yet. A worker killed inside the
  call leaves an ambiguous step; the worker that takes the run over calls the tool again, and the
  key keeps the effect to one line. Without the variable the tool is W40's own: a bare callable
  (AT_MOST_ONCE) that appends unconditionally.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from bench.workload import OUTBOX_ENV, SLEEP_ENV, TOOL_NAME, Outbox, result_of, stub_llm
from durabl import tool


class KeyedSlowOutbox:
    """W40's tool, slowed down and made idempotent by durabl's key: one line per key, ever."""

    def __init__(self, path: Path, delay_s: float) -> None:
        self.path = path
        self.delay_s = delay_s
        path.touch()

    def __call__(self, i: int, topic: str, *, idempotency_key: str) -> dict[str, Any]:
        time.sleep(self.delay_s)
        prefix = f"{idempotency_key}\t"
        with open(self.path, "a+", encoding="utf-8") as fh:
            fh.seek(0)
            if not any(line.startswith(prefix) for line in fh):
                fh.write(f"{prefix}{i}\t{topic}\n")
        return result_of(i, topic)


def _tools() -> dict[str, Any]:
    path = os.environ.get(OUTBOX_ENV)
    if not path:
        raise RuntimeError(
            f"bench.worker_app needs {OUTBOX_ENV} (the outbox file) in the environment"
        )
    delay_s = float(os.environ.get(SLEEP_ENV) or 0)
    if delay_s > 0:
        slow = KeyedSlowOutbox(Path(path), delay_s)
        return {TOOL_NAME: tool(slow, name=TOOL_NAME, mode="IDEMPOTENT")}
    return {TOOL_NAME: Outbox(Path(path))}


DURABL_LLM = stub_llm
DURABL_TOOLS = _tools()
