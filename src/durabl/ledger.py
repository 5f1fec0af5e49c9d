"""The cost ledger: what a run and the runs it started have spent on models, and the budget
that stops a run before a call that would go past it.

Spend is read from the logs, never kept beside them: each model answer records its usage and
its cost (``cost_usd``) in the transaction that completes its step, so a replay, which writes
nothing, counts nothing again, and a crash loses no recorded call (a call whose answer a crash
lost is counted apart, as re-executed spend: ``durabl.metrics``).

A budget is given to a run when it starts (``rt.start(..., budget=Budget(...))``, or the
runtime's ``Runtime(budget=...)``) and recorded in its RUN_STARTED; the runs it starts (its
child runs, the runs it continues as) carry the same budget, charged to the same root, so the
limit holds over the whole tree of work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from durabl import codec, events
from durabl.store.base import Store


@dataclass(frozen=True, slots=True)
class Budget:
    """At most ``max_tokens`` model tokens (input and output) and at most ``max_cost`` US
    dollars, over a run and every run it starts. A model call is refused (``BudgetExceeded``,
    thrown into the workflow, which may catch it) when what was spent already reaches a limit,
    or when the call's own bound (its ``max_tokens`` or ``max_output_tokens`` parameter) would
    take it past ``max_tokens``. With ``max_cost``, a call to a model the price table does
    not have is refused too: its cost could not be counted."""

    max_tokens: int | None = None
    max_cost: float | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is None and self.max_cost is None:
            raise ValueError("Budget needs max_tokens, max_cost or both")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool)
            or not isinstance(self.max_tokens, int)
            or self.max_tokens < 1
        ):
            raise ValueError(
                f"Budget max_tokens must be a whole number of 1 or more (a budget of "
                f"{self.max_tokens!r} is spent before the first call)"
            )
        if self.max_cost is not None and (
            isinstance(self.max_cost, bool)
            or not isinstance(self.max_cost, int | float)
            or not math.isfinite(self.max_cost)
            or self.max_cost <= 0
        ):
            raise ValueError(
                f"Budget max_cost must be more than 0 dollars (a budget of "
                f"{self.max_cost!r} is spent before the first call)"
            )

    def record(self, root: str) -> dict[str, Any]:
        """How RUN_STARTED records it: the limits, and the run whose tree they cover."""
        return {"max_tokens": self.max_tokens, "max_cost": self.max_cost, "root": root}


@dataclass(frozen=True, slots=True)
class Spend:
    """What a tree of runs has spent on models, from their logs."""

    tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    runs: int = 0


def spend(store: Store, root: str) -> Spend:
    """The spend of ``root`` and every run it started, theirs in turn (child runs, and the
    runs a ContinueAsNew went on as): each model answer recorded in their logs."""
    from durabl.metrics import of_history  # only a budget check or a report needs them
    from durabl.store.reads import lineage

    tokens, cost, unpriced, seen = 0, 0.0, 0, 0
    todo, done = [root], set()
    while todo:
        run_id = todo.pop()
        row = None if run_id in done else store.get_run(run_id)
        if row is None:
            continue
        done.add(run_id)
        history = store.load_history(run_id)  # one read gives both the figures and the links
        figures = of_history(run_id, history)
        tokens += figures.total_tokens
        cost += figures.cost_usd
        unpriced += figures.unpriced_model_calls
        seen += 1
        todo.extend(lineage(store, run_id, history).children.values())
        if row.status == events.CONTINUED and row.result_text:
            todo.append(codec.decode(row.result_text)["continued_as"])
    return Spend(tokens, cost, unpriced, seen)
