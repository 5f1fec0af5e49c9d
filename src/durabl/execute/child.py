"""Executing a ``ChildRun``: create the child with this step's record, drive it, take its end.

The first time the step is reached, one transaction records its STEP_STARTED and creates the
child run (its row, leased to this runtime, and its RUN_STARTED naming the parent): a crash
before it leaves neither, after it both, so there is never an orphan child, and the child's id
(the step's own, or derived from the parent's and the position) names the same child on every
replay, so there is never a second one.

The child is then driven here, at once, as far as it goes. The commit that ends it appends its
outcome to this run's log (``Journal``: the parent note), so the step reads its own log's new
end: a result to return, a failure to throw, or nothing yet (the child sleeps, waits, is held,
or another process drives it), and then the parent parks WAITING until the child's end makes it
due again.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events
from durabl.errors import BadStepError, RunExistsError, StepFailed, UnknownWorkflowError
from durabl.execute.base import StepCall
from durabl.flow import Hold, Park
from durabl.journal import Journal
from durabl.steps import ChildRun, child_run_id


def execute(call: StepCall) -> Any:
    step, journal = call.step, call.journal
    assert isinstance(step, ChildRun) and isinstance(journal, Journal)
    children = call.services.children
    assert children is not None, "a runtime's executors always have its engine's children"
    child_id = child_run_id(call.run_id, call.position, step.run_id)
    fresh = call.rec is None
    if fresh:
        parent = (call.run_id, call.position)
        try:
            new_run = children.child_run(
                step.workflow, step.input_text, child_id, parent, journal.history.budget
            )
        except UnknownWorkflowError as exc:
            raise Hold(
                _bad(call, f"ChildRun of a workflow that is not registered: {exc}")
            ) from None
        except TypeError as exc:
            raise Hold(_bad(call, f"ChildRun input does not fit: {exc}")) from None
        crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
        try:
            journal.append(
                [(events.STEP_STARTED, step.fingerprint, step.canonical)],
                new_run=new_run,
                durable=True,
            )
        except RunExistsError:
            taken = f"ChildRun run_id {child_id!r} is the id of a run that exists already"
            raise Hold(_bad(call, taken)) from None
        crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
    children.drive_child(child_id, fresh=fresh)
    history = journal.history
    for event in journal.store.load_log(call.run_id, history.last_seq):
        history.apply(event)  # the child's end, written by the commit that ended it
    rec = history.steps[call.position]
    if not rec.done:
        journal.append([], status=events.WAITING)  # its timer is the child's to set
        raise Park()
    call.executed()
    if rec.failure is not None:
        raise StepFailed.from_record(rec.failure)
    return codec.decode(rec.result_text or "null")


def _bad(call: StepCall, problem: str) -> BadStepError:
    return BadStepError(problem).where(call.run_id, call.position)
