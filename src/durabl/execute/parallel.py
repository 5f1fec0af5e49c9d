"""Executing a ``Parallel``: its branches at once, each a step of its own, then one outcome.

The Parallel at position P takes positions P+1..P+N for its N branches, in the order given, so
a branch's position never depends on when it finished: replay is the same whatever order the
first execution saw. The Parallel's own record is a STEP_STARTED at P (committed before any
branch writes) and, once every branch has settled, one durable commit at P: STEP_COMPLETED
with the branches' results as a list, or STEP_FAILED with the first failure in the order given.

Each branch goes through the executor of its kind with a journal of its own (``Branch``) that
writes at the branch's position and takes its turn with its siblings' writes, since one run's
log has one end. After a crash the Parallel is reached again; the branches whose outcome is in
the log are served from it and only the others run.

What a branch does to the run as a whole is decided once, here, after all have settled: a
branch that must back off parks the run until the earliest retry is due; a dead-lettered branch
leaves the run dead-lettered; a held one (an unknown tool, no model) holds it.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from durabl import codec, crashpoints, events, replay
from durabl.errors import NonDeterminismError, StepFailed
from durabl.execute.base import StepCall
from durabl.flow import Hold, Park
from durabl.journal import KEEP, Journal, NewEvent, append_tool_result
from durabl.replay import History, StepRecord
from durabl.states import Progress
from durabl.steps import Parallel, Step

if TYPE_CHECKING:
    from concurrent.futures import Future


class Siblings:
    """What the branches of one Parallel share: the turn to write, and whether one of them
    died (a simulated process death): after that no sibling writes, as after a real one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.died: crashpoints.ProcessDeath | None = None


class Branch:
    """The journal one branch writes through: the pass's journal, at the branch's position,
    one write at a time with its siblings'. A branch never sets the run's status or timer,
    which belong to the Parallel, except to dead-letter the run; once dead-lettered, the
    run stays so whatever a sibling writes after."""

    def __init__(self, journal: Journal, position: int, siblings: Siblings) -> None:
        self.journal = journal
        self.run_id = journal.run_id
        self.history = journal.history
        self.progress = Progress(position=position)
        self.siblings = siblings

    @property
    def store(self) -> Any:
        return self.journal.store

    def append(self, new: list[NewEvent], **changes: Any) -> None:
        changes.pop("wake_at_s", None)
        status = changes.pop("status", None)
        with self.siblings.lock:
            if self.siblings.died is not None:
                raise crashpoints.ProcessDeath(self.siblings.died.point)
            if status != events.DEAD_LETTERED and self.journal.status == events.DEAD_LETTERED:
                status = events.DEAD_LETTERED
            elif status != events.DEAD_LETTERED:
                status = None
            self.journal.append(
                new, status=status, step=self.progress.position, wake_at_s=KEEP, **changes
            )

    def append_tool_result(
        self, fp: str, data: str, key: str, tool: str, result_text: str, effect_at_s: float
    ) -> None:
        append_tool_result(self, fp, data, key, tool, result_text, effect_at_s)

    def started(self, step: Step) -> list[NewEvent]:
        with self.siblings.lock:
            if self.progress.position in self.history.steps:
                return []
        return [(events.STEP_STARTED, step.fingerprint, step.canonical)]


@dataclass(slots=True)
class Outcome:
    """How one branch settled: its result's text, its failure, or what stopped it."""

    text: str | None = None
    failure: StepFailed | None = None
    parked: bool = False
    stopped: BaseException | None = None  # a Hold, or a (simulated) process death


def execute(call: StepCall) -> Any:
    step, journal = call.step, call.journal
    assert isinstance(step, Parallel) and isinstance(journal, Journal)
    if call.rec is None:
        crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
        journal.append([(events.STEP_STARTED, step.fingerprint, step.canonical)])
        crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
    outcomes = _settle(call, step, journal)
    for outcome in outcomes:
        if outcome.stopped is not None:
            raise outcome.stopped
    failures = [o.failure for o in outcomes if o.failure is not None]
    if failures and (step.fail_fast or all(o.failure or o.text is not None for o in outcomes)):
        return _fail(call, journal, failures[0])
    if any(o.parked for o in outcomes) or any(o.text is None and not o.failure for o in outcomes):
        _park(call, journal)
    texts = [o.text or "null" for o in outcomes]
    journal.append(
        [(events.STEP_COMPLETED, None, "[" + ",".join(texts) + "]")],
        step=call.position,
        wake_at_s=None,
        durable=True,
    )
    crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
    call.executed()
    return [codec.decode(text) for text in texts]


def _settle(call: StepCall, step: Parallel, journal: Journal) -> list[Outcome]:
    """Every branch's outcome: from the log, or by running it, at most ``max_concurrency`` at a
    time in the runtime's pool. Returns once every branch begun has settled."""
    history = journal.history
    outcomes = [Outcome() for _ in step.steps]
    siblings = Siblings()
    todo: list[tuple[int, Callable[[], None]]] = []
    for index, branch in enumerate(step.steps):
        position = call.position + 1 + index
        action, rec = _decide(call, history, position, branch)
        outcome = outcomes[index]
        if action == replay.SERVE and rec is not None:
            outcome.text = rec.result_text or "null"
            journal.progress.replayed += 1
        elif action == replay.THROW and rec is not None and rec.failure is not None:
            outcome.failure = StepFailed.from_record(rec.failure)
            journal.progress.replayed += 1
        elif action == replay.DEAD:
            outcome.parked = True
        elif action == replay.WAIT and rec is not None and call.now() < (rec.wake_at_s or 0.0):
            outcome.parked = True  # its backoff is not over
        else:
            runner = _runner(
                call, Branch(journal, position, siblings), branch, rec, action, outcome
            )
            todo.append((index, runner))
    if step.fail_fast and any(o.failure for o in outcomes):
        todo = []
    if len(todo) == 1:
        todo[0][1]()
    elif todo:
        _run_all(call, step, todo, outcomes)
    return outcomes


def _decide(
    call: StepCall, history: History, position: int, branch: Step
) -> tuple[str, StepRecord | None]:
    try:
        return call.services.decide(history, position, branch)
    except NonDeterminismError as exc:
        raise Hold(exc) from None


def _runner(
    call: StepCall,
    journal: Branch,
    branch: Step,
    rec: StepRecord | None,
    action: str,
    outcome: Outcome,
) -> Callable[[], None]:
    """The work of one branch: execute it and record how it settled in ``outcome``."""
    from durabl.execute import execute as execute_step  # the dispatch table, which holds this

    def run() -> None:
        sub = StepCall(journal, branch, rec, action, call.now, call.services)  # type: ignore[arg-type]
        siblings = journal.siblings
        try:
            execute_step(sub)
            outcome.text = journal.history.steps[sub.position].result_text or "null"
        except StepFailed as failed:
            outcome.failure = failed
        except Park:
            outcome.parked = True
        except Hold as hold:
            outcome.stopped = hold
        except crashpoints.ProcessDeath as death:
            outcome.stopped = death
            with siblings.lock:
                siblings.died = siblings.died or death
        finally:
            with siblings.lock:
                call.journal.progress.executed += journal.progress.executed

    return run


def _run_all(
    call: StepCall,
    step: Parallel,
    todo: list[tuple[int, Callable[[], None]]],
    outcomes: list[Outcome],
) -> None:
    """Run ``todo`` in the runtime's pool, at most ``max_concurrency`` at once; stop beginning
    new ones once a branch fails with ``fail_fast``, one stops the pass, or the runtime is
    stopping. Waits for every one begun."""
    from concurrent.futures import FIRST_COMPLETED, wait  # only a Parallel needs them

    pool = call.services.pool()
    limit = step.max_concurrency or len(todo)
    waiting = list(reversed(todo))
    running: set[Future[None]] = set()
    while waiting or running:
        halt = any(o.stopped is not None for o in outcomes) or call.services.stopping()
        if step.fail_fast and any(o.failure is not None for o in outcomes):
            halt = True
        while waiting and len(running) < limit and not halt:
            # In a copy of this thread's context: an async call in a branch runs on the loop
            # the drive's own calls run on (the caller's, from the async API).
            running.add(pool.submit(contextvars.copy_context().run, waiting.pop()[1]))
        if halt:
            waiting = []
        if not running:
            break
        done, running = wait(running, return_when=FIRST_COMPLETED)
        for future in done:
            future.result()  # a runner records its outcome; anything else is a bug to raise


def _fail(call: StepCall, journal: Journal, failure: StepFailed) -> Any:
    """Record the Parallel's failure (the first failed branch's, in the order given), throw it."""
    journal.append(
        [(events.STEP_FAILED, None, codec.encode(failure.to_record()))],
        step=call.position,
        wake_at_s=None,
        durable=True,
    )
    crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
    call.executed()
    raise failure


def _park(call: StepCall, journal: Journal) -> None:
    """Some branch cannot settle now: park the run, dead-lettered if a branch is, else until
    the earliest branch retry is due (or RUNNING, for a runtime that is stopping)."""
    if journal.status == events.DEAD_LETTERED:
        raise Park()
    step = call.step
    assert isinstance(step, Parallel)
    wakes = []
    for index in range(len(step.steps)):
        rec = journal.history.steps.get(call.position + 1 + index)
        if rec is not None and not rec.done and rec.wake_at_s is not None:
            wakes.append(rec.wake_at_s)
    if wakes:
        journal.append([], status=events.SLEEPING, wake_at_s=min(wakes), durable=True)
    raise Park()
