"""The engine: drives runs under their leases, between the public facade and the drive.

The imperative shell reads top to bottom: take the run's lease, load its log, fold it into a
history, open a journal that writes with the lease's fencing token, and let a ``Drive`` run the
workflow against the history. The engine also starts runs (idempotently, by run id) and answers
the questions a worker asks (``durabl.worker.Drives``): which runs have work, when the next timer
is due, and "drive this one".
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from durabl import codec, crashpoints, events, execute, leases
from durabl import workflow as workflows
from durabl.checks import check_text
from durabl.drive import Decide, Drive, Executes
from durabl.errors import RunConflictError, RunLeased
from durabl.events import Event
from durabl.execute import Services, StepCall
from durabl.journal import Journal, Writer
from durabl.replay import History, StepRecord
from durabl.states import Progress, RunState
from durabl.steps import Step
from durabl.store.base import RunRow, Store, require_run
from durabl.workflow import Workflow

if TYPE_CHECKING:
    from durabl.ledger import Budget


def new_run_id() -> str:
    """A new run's id: 32 hex digits, the creation time in microseconds (14 digits) and 72
    random bits. Ids that grow with time put each new run's rows at the end of the log's index
    (and of the side-effect keys derived from it), where SQLite appends to the last page; a
    random id lands mid-index, where each step's commit splits and rewrites several pages.
    They also sort by creation, like UUIDv7."""
    return f"{time.time_ns() // 1000:014x}{os.urandom(9).hex()}"


class Engine:
    """Drives the runs of one store for one runtime instance."""

    def __init__(
        self,
        *,
        store: Store,
        writer: Writer,
        leaser: leases.Leaser,
        workflows: dict[str, Workflow],
        services: Services,
        decide: Decide,
        clock: Callable[[], float],
        budget: Budget | None = None,
    ) -> None:
        self.store = store
        self.budget = budget
        """The budget of runs started without one (``Runtime(budget=...)``)."""
        self.writer = writer
        self.leaser = leaser
        self.workflows = workflows
        self.services = services
        self.decide = decide
        self.clock = clock
        self.halted = False  # a plain flag, no lock: halt() runs in signal handlers

    # -- reading ---------------------------------------------------------------------------

    def row(self, run_id: str) -> RunRow:
        return require_run(self.store, run_id)

    def history(self, run_id: str) -> History:
        watermark, snapshot, log = self.store.load_history(run_id)
        return History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)

    def workflow_of(self, target: Any) -> Workflow:
        return workflows.resolve(target, self.workflows)

    def state(self, run_id: str) -> RunState:
        """The run's state as recorded (no workflow code runs)."""
        row = self.row(run_id)
        history = self.history(run_id)
        boundary = history.last_resume_seq
        executed = sum(1 for r in history.steps.values() if r.done and r.done_seq > boundary)
        return RunState(
            run_id=row.run_id,
            workflow=row.workflow,
            status=row.status,
            result=codec.decode_or_none(row.result_text),
            error=row.error,
            steps_replayed=history.completed_positions() - executed,
            steps_executed=executed,
            wake_at_s=row.wake_at_s,
        )

    # -- starting and resuming -------------------------------------------------------------

    def start(
        self,
        target: Any,
        run_input: Any,
        run_id: str | None,
        boundary: dict[str, Any],
        budget: Budget | None = None,
    ) -> RunState:
        """Create the run (with a new id if ``run_id`` is None) and drive it; an existing run
        with this id is driven on instead, if it has the same workflow and input
        (RunConflictError if not)."""
        wf, row, first = self._new_run(
            target, run_input, run_id, boundary, leased=True, budget=budget or self.budget
        )
        existing = self.store.create_run(row, first)
        if existing is not None:
            return self._start_again(existing, wf, row.input_text)
        self.writer.written.add(row.run_id)
        self.workflows.setdefault(wf.name, wf)
        # The row and the log are what create_run has just written: not read back.
        with self.owning(row.run_id, token=1, current=row) as (row, token):
            crashpoints.reach(crashpoints.AFTER_RUN_STARTED)
            return self.drive_owned(row, wf, None, token, History.from_events(row.run_id, [first]))

    def submit(
        self,
        target: Any,
        run_input: Any,
        run_id: str | None,
        boundary: dict[str, Any],
        budget: Budget | None = None,
    ) -> str:
        """Create the run with no owner, for whichever worker claims it first; returns its id.
        Submitting again with the same id, workflow and input is the same submission."""
        wf, row, first = self._new_run(
            target, run_input, run_id, boundary, leased=False, budget=budget or self.budget
        )
        existing = self.store.create_run(row, first)
        if existing is not None:
            self._check_same(existing, wf, row.input_text)
        return row.run_id

    def _new_run(
        self,
        target: Any,
        run_input: Any,
        run_id: str | None,
        boundary: dict[str, Any],
        *,
        leased: bool,
        budget: Budget | dict[str, Any] | None = None,
    ) -> tuple[Workflow, RunRow, Event]:
        """A new run's workflow, row and RUN_STARTED event; leased to this runtime, or not.
        ``boundary`` goes into RUN_STARTED with them (where it came from, its parent), and the
        run's budget: a ``Budget`` given to it (charged to it), or one it carries on from the
        run that started it (charged where that one's is)."""
        wf = self.workflow_of(target)
        input_text, value = codec.round_trip(
            run_input, what=lambda: f"input of workflow {wf.name!r}"
        )
        wf.bind(value)
        if run_id is None:
            run_id = new_run_id()
        else:
            check_text("run_id", run_id)
        now_s = self.clock()
        if isinstance(budget, dict):  # carried on from the run that started this one
            boundary = {**boundary, "budget": budget}
        elif budget is not None:
            boundary = {**boundary, "budget": budget.record(run_id)}
        started = codec.encode({"workflow": wf.name, "input": value, **boundary})
        row = RunRow(
            run_id=run_id,
            workflow=wf.name,
            input_text=input_text,
            status=events.RUNNING,
            result_text=None,
            error=None,
            created_s=now_s,
            updated_s=now_s,
            wake_at_s=None,
            watermark=0,
            lease=self.leaser.lease() if leased else None,
            lease_token=1 if leased else 0,  # as create_run writes it
        )
        return wf, row, Event(1, events.RUN_STARTED, 0, None, started, now_s)

    def _start_again(self, existing: RunRow, wf: Workflow, input_text: str) -> RunState:
        self._check_same(existing, wf, input_text)
        if existing.status == events.RUNNING:
            return self.resume(existing, wf)
        if existing.status == events.CONTINUED:
            latest = self.row(self.latest(existing.run_id))
            return (
                self.resume(latest)
                if latest.status == events.RUNNING
                else self.state(latest.run_id)
            )
        return self.state(existing.run_id)

    def _check_same(self, existing: RunRow, wf: Workflow, input_text: str) -> None:
        """RunConflictError unless ``existing`` is a run of ``wf`` with this input."""
        if existing.workflow != wf.name or existing.input_text != input_text:
            raise RunConflictError(
                run_id=existing.run_id,
                workflow=wf.name,
                input_text=input_text,
                existing_workflow=existing.workflow,
                existing_input_text=existing.input_text,
            )

    def resume(
        self, row: RunRow, wf: Workflow | None = None, now_s: float | None = None
    ) -> RunState:
        """Take the run's lease and drive it on from where its log ends."""
        if not _drivable(row):
            return self.state(row.run_id)
        wf = wf or self.workflow_of(row.workflow)  # before touching the run
        with self.owning(row.run_id, seen=row) as (row, token):
            return self.drive_owned(row, wf, now_s, token)

    def resume_isolated(self, row: RunRow, now_s: float | None) -> RunState:
        """``resume``, reporting a failure in the returned state instead of raising it."""
        try:
            return self.resume(row, None, now_s)
        except crashpoints.ProcessDeath:
            raise
        except Exception as exc:
            import logging  # only here: a run that cannot be resumed is rare

            logging.getLogger("durabl").warning(
                "run %s (%s) could not be resumed: %s", row.run_id, row.workflow, exc
            )
            latest = self.store.get_run(row.run_id) or row
            return RunState(
                run_id=row.run_id, workflow=row.workflow, status=latest.status, error=str(exc)
            )

    # -- child runs (durabl.execute.base.Children) -----------------------------------------

    def child_run(
        self,
        workflow: str,
        input_text: str,
        run_id: str,
        parent: tuple[str, int],
        budget: dict[str, Any] | None = None,
    ) -> tuple[RunRow, Event]:
        boundary = {**self.writer.boundary, "parent": {"run_id": parent[0], "step": parent[1]}}
        _, row, first = self._new_run(
            workflow, codec.decode(input_text), run_id, boundary, leased=True, budget=budget
        )
        return row, first

    def next_run(self, history: History, input_text: str) -> tuple[RunRow, Event]:
        assert history.workflow is not None
        boundary: dict[str, Any] = {**self.writer.boundary, "continued_from": history.run_id}
        if history.parent is not None:
            boundary["parent"] = {"run_id": history.parent[0], "step": history.parent[1]}
        _, row, first = self._new_run(
            history.workflow,
            codec.decode(input_text),
            None,
            boundary,
            leased=True,
            budget=history.budget,
        )
        return row, first

    def latest(self, run_id: str) -> str:
        """The run a chain of ContinueAsNew has got to from ``run_id`` (itself if it did not
        continue)."""
        row = self.row(run_id)
        while row.status == events.CONTINUED and row.result_text is not None:
            row = self.row(codec.decode(row.result_text)["continued_as"])
        return row.run_id

    def drive_child(self, run_id: str, *, fresh: bool) -> None:
        if fresh:
            self.writer.written.add(run_id)
            try:
                with self.owning(run_id, token=1) as (row, token):
                    self.drive_owned(row, None, None, token)
            except crashpoints.ProcessDeath:
                raise
            except Exception as exc:  # the child is held or failed to drive: its row says
                _child_stopped(run_id, exc)
            return
        found = self.store.get_run(run_id)
        if found is None or not _drivable(found):
            return
        with contextlib.suppress(RunLeased):  # driven elsewhere: its end will wake the parent
            self.resume_isolated(found, None)

    def _parent_cancelled(self, journal: Journal) -> bool:
        """A child whose parent was cancelled is cancelled when it is next driven (a parent's
        cancellation cancels its children at once too; this is for one that missed it: a crash
        in between, or a child another process was driving)."""
        parent = journal.history.parent
        if parent is None:
            return False
        row = self.store.get_run(parent[0])
        if row is None or row.status != events.CANCELLED:
            return False
        journal.cancel(f"its parent run {parent[0]} was cancelled")
        return True

    # -- driving ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def owning(
        self,
        run_id: str,
        token: int | None = None,
        seen: RunRow | None = None,
        current: RunRow | None = None,
    ) -> Iterator[tuple[RunRow, int]]:
        """Hold the run's lease for the block: the fresh row and the fencing token to write
        with. A simulated death leaves the lease in the database, as a real one would.
        ``seen``: the run's row as the caller read it, tried first for a free lease.
        ``current``: the row as the caller has just written it, yielded instead of a read."""
        with leases.driving(run_id, self.leaser.owner):
            try:
                if token is None:
                    token = self._take_lease(run_id, seen)
                    crashpoints.reach(crashpoints.AFTER_LEASE_TAKEN)
                else:
                    self.leaser.hold(run_id, token)
                yield current or self.row(run_id), token
            except crashpoints.ProcessDeath:
                self.leaser.forget(run_id)
                raise
            except BaseException:
                self.leaser.release(run_id)
                raise
            self.leaser.release(run_id)

    def _take_lease(self, run_id: str, seen: RunRow | None) -> int:
        """The lease, taken on the row the caller has just read when that row shows it free
        (saving a read on the way to the first step); on the row as it is now otherwise, or
        when another process took the lease since the caller's read."""
        if seen is not None and self.leaser.free(seen):
            token = self.leaser.try_acquire(seen)
            if token is not None:
                return token
        return self.leaser.acquire(self.row(run_id))

    def journal(self, row: RunRow, token: int | None, history: History | None = None) -> Journal:
        """A journal for one pass through the run, over its history as the store has it now
        (or ``history``, when the caller knows it); with ``token`` None, one for a dry replay,
        which writes nothing."""
        if history is None:
            history = self.history(row.run_id)
        return self.writer.open(row, history, Progress(), token)

    def drive_owned(
        self,
        row: RunRow,
        wf: Workflow | None,
        now_s: float | None,
        token: int,
        history: History | None = None,
    ) -> RunState:
        """Drive a run whose lease this runtime holds with ``token`` (over ``history``, when
        the caller knows it)."""
        if not _drivable(row):
            return self.state(row.run_id)
        drive = self.drive(row, wf or self.workflow_of(row.workflow), now_s, token, history)
        state = self.state_of(drive, row)
        if state.status == events.CONTINUED and not self.halted:
            return self._drive_next(state)
        return state

    def _drive_next(self, state: RunState) -> RunState:
        """Drive on the run a ContinueAsNew just created (under the lease it was created
        with); its state, or that of the run its chain has got to."""
        fresh = self.store.get_run(state.run_id)
        assert fresh is not None and fresh.result_text is not None
        next_id = codec.decode(fresh.result_text)["continued_as"]
        self.writer.written.add(next_id)
        with self.owning(next_id, token=1) as (row, token):
            return self.drive_owned(row, None, None, token)

    def drive(
        self,
        row: RunRow,
        wf: Workflow,
        now_s: float | None,
        token: int | None,
        history: History | None = None,
    ) -> Drive:
        """One pass through the run (a dry replay with ``token`` None) over its history as the
        store has it, or ``history``; raises what held it."""
        journal = self.journal(row, token, history)
        now = self.clock if now_s is None else (lambda: now_s)
        drive = Drive(
            wf,
            row.input_text,
            journal,
            decide=self.decide,
            execute=self._executor(journal, now),
            now=now,
            dry=token is None,
            stopping=lambda: self.halted,
        )
        if token is not None:
            if self._parent_cancelled(journal):
                return drive
            self.leaser.renew()  # the workflow and its steps take as long as they take
        drive.run()
        if drive.hold is not None:
            raise drive.hold
        return drive

    def _executor(self, journal: Journal, now: Callable[[], float]) -> Executes:
        services = self.services

        def run(
            step: Step, rec: StepRecord | None, action: str, draw: Callable[[], Any] | None = None
        ) -> Any:
            return execute.execute(StepCall(journal, step, rec, action, now, services, draw))

        return run

    def state_of(self, drive: Drive, row: RunRow) -> RunState:
        """The state a pass left ``row``'s run in (for a dry one, the state it concluded)."""
        row = self.store.get_run(drive.run_id) or row
        return RunState(
            run_id=drive.run_id,
            workflow=row.workflow,
            status=drive.dry_status if drive.dry else row.status,
            result=drive.result if drive.dry else codec.decode_or_none(row.result_text),
            error=row.error if drive.hold is None else str(drive.hold),
            steps_replayed=drive.progress.replayed,
            steps_executed=drive.progress.executed,
            wake_at_s=row.wake_at_s,
            next_step=drive.next_step,
        )

    # -- what a worker asks (durabl.worker.Drives) -----------------------------------------

    def drive_run(self, run_id: str) -> str | None:
        """Drive the run on if it has work. Its status after, or None when this call did no
        work on it: it was finished, or another process finished it between the look and the
        lease (counting it would count one run as completed by two workers)."""
        row = self.store.get_run(run_id)
        if row is None or row.status in events.TERMINAL_STATUSES:
            return None
        wrote_before = run_id in self.writer.written
        state = self.resume(row)
        if not wrote_before and run_id not in self.writer.written:
            return None
        return state.status

    def interrupted_runs(self, *, include_held: bool) -> list[str]:
        statuses = (events.RUNNING, events.HELD) if include_held else (events.RUNNING,)
        return [row.run_id for row in reversed(self.store.list_runs(statuses=statuses))]

    def claim_runs(self, limit: int) -> list[str]:
        """Up to ``limit`` RUNNING runs nobody holds, their leases taken in one statement that
        other workers' claims skip (a store that several hosts share: ``claim_runs``); none
        from a store that cannot, whose runs the scan of ``interrupted_runs`` finds."""
        claim = getattr(self.store, "claim_runs", None)
        if claim is None or limit < 1:
            return []
        claimed = claim(self.leaser.lease(), self.clock(), limit)
        for run_id, token in claimed:
            self.leaser.hold(run_id, token)
        if claimed:
            self.leaser.renew()  # each waits for a drive to take it on
        return [run_id for run_id, _ in claimed]

    def watch(self, on_work: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``on_work`` called when a run may have work (a store that can tell: ``watch``);
        what stops it, or None."""
        watch = getattr(self.store, "watch", None)
        return None if watch is None else watch(on_work)

    def due_runs(self, now_s: float) -> list[str]:
        return self.store.due_runs(now_s)

    def next_wake_s(self) -> float | None:
        return self.store.next_wake_s()

    def now(self) -> float:
        return self.clock()

    def halt(self) -> None:
        """Let the steps in progress finish and park their runs; takes no lock."""
        self.halted = True


def _child_stopped(run_id: str, exc: Exception) -> None:
    import logging  # only here: a child that cannot be driven is rare

    logging.getLogger("durabl").warning("child run %s stopped: %s", run_id, exc)


def _drivable(row: RunRow) -> bool:
    return row.status not in events.TERMINAL_STATUSES and row.status != events.DEAD_LETTERED
