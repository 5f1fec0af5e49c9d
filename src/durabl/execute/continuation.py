"""Executing a ``ContinueAsNew``: end this run and create the next, in one transaction.

The commit records the step, its outcome (the next run's id) and RUN_CONTINUED, sets this run
CONTINUED with ``{"continued_as": next}`` as its result, creates the next run (leased to this
runtime; its RUN_STARTED names this run, and this run's parent if it has one) and hands it the
signals sent here that no wait took. A crash before it leaves this run where it was; after it,
the next run exists and is resumed like any other. The engine drives the next run on at once.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events
from durabl.errors import BadStepError
from durabl.execute.base import StepCall
from durabl.flow import Hold, Park
from durabl.journal import Journal
from durabl.steps import ContinueAsNew


def execute(call: StepCall) -> Any:
    step, journal = call.step, call.journal
    assert isinstance(step, ContinueAsNew) and isinstance(journal, Journal)
    children = call.services.children
    assert children is not None, "a runtime's executors always have its engine's children"
    history = journal.history
    try:
        row, first = children.next_run(history, step.input_text)
    except TypeError as exc:  # the workflow's parameters cannot take the input
        problem = f"ContinueAsNew input does not fit: {exc}"
        raise Hold(BadStepError(problem).where(call.run_id, call.position)) from None
    link = codec.encode({"run_id": row.run_id})
    crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
    journal.append(
        [
            *journal.started(step),
            (events.STEP_COMPLETED, None, link),
            (events.RUN_CONTINUED, None, link),
        ],
        status=events.CONTINUED,
        result_text=codec.encode({"continued_as": row.run_id}),
        wake_at_s=None,
        durable=True,
        new_run=(row, first),
        carry_signals=row.run_id,
    )
    crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
    call.executed()
    raise Park()
