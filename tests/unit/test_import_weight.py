"""`import durabl` pulls in nothing the first Runtime.start does not need: no network stack, no
command line, no dashboard, no benchmark, no validation library, no model client adapters, and
none of the runtime's parts that only other calls use (the operator, the metrics, the
long-running worker, the uuid module behind ``ctx.uuid()``, the budget ledger, the reads that
only the command line and the dashboard make, and the executors of the steps only some runs
take: timers, signals, parallel branches, child runs, continuations). Each is imported when
first used, and then works as if imported at the start."""

from __future__ import annotations

import inspect
import subprocess
import sys

from durabl import worker
from durabl.runtime import Runtime

NOT_NEEDED = (
    "urllib.request", "http.client", "ssl", "rich",
    "durabl.cli", "durabl.ui", "durabl.bench",
    "pydantic", "pydantic_core", "importlib.metadata", "importlib.resources", "email",
    "urllib.parse", "socket", "selectors", "concurrent.futures",
    "durabl.operator", "durabl.metrics", "durabl.worker",
    "uuid", "platform", "durabl.llm", "durabl.llm.schemas", "durabl.llm.openai", "durabl.upkeep",
    "durabl.ledger", "durabl.execute.timer", "durabl.execute.signal", "durabl.execute.parallel",
    "durabl.execute.child", "durabl.execute.continuation", "durabl.store.reads",
)  # fmt: skip


def test_import_durabl_stays_light() -> None:
    probe = f"import durabl, sys; print(' '.join(m for m in {NOT_NEEDED!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_what_is_left_out_is_there_when_asked_for() -> None:
    probe = (
        "import durabl, sys; budget = durabl.Budget(max_cost=1.0);"
        "from durabl import Budget; from durabl.execute import EXECUTORS;"
        "print(Budget is type(budget), Budget.__module__, 'durabl.ledger' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "durabl.ledger", "True"]
    missing = subprocess.run(
        [sys.executable, "-c", "import durabl; durabl.NoSuchThing"], capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "module 'durabl' has no attribute 'NoSuchThing'" in missing.stderr


def test_serve_polls_as_often_as_a_worker_by_default() -> None:
    # Runtime.serve names the default itself, so that importing the runtime imports no worker.
    default = inspect.signature(Runtime.serve).parameters["poll_s"].default
    assert default == worker.POLL_S
