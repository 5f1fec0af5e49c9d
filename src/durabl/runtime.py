"""The imperative shell: load a run's log, replay the workflow against it, execute what is new.

One ``_Drive`` drives one run for one call: it owns the generator, the folded history and the
position, and appends events through ``Runtime._commit`` so that the in-memory history and the
database never disagree. Decisions about a yielded step come from the pure ``replay.decide``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from durabl import codec, crashpoints, events, leases, replay
from durabl import workflow as workflows
from durabl.checks import check_int, check_text, check_type
from durabl.context import Context
from durabl.errors import (
    AlreadyTerminalError,
    AmbiguousEffect,
    DeadLetteredError,
    DeadLetterEventMissingError,
    DurablError,
    EffectAlreadyRecordedError,
    EncodingError,
    IdempotencyKeyConflict,
    ModelCallFailed,
    NoModelError,
    NonDeterminismError,
    NotDeadLetteredError,
    RunConflictError,
    RunFailedError,
    RunLeased,
    RunNotFinishedError,
    RunNotFoundError,
    StepFailed,
    ToolFailed,
    UnknownToolError,
    described,
    not_a_step,
)
from durabl.events import Event
from durabl.metrics import Metrics, MetricsFold, of_runs
from durabl.replay import History, StepRecord
from durabl.steps import CtxValue, ModelCall, Sleep, Step, ToolCall, derived_key
from durabl.store import Commit, KeyClaim, RunRow, SideEffect, SQLiteStore, Store
from durabl.store.base import UNCHANGED
from durabl.tools import RetryPolicy, Tool, ToolMode, build_registry
from durabl.worker import POLL_S, Worker, WorkerStats
from durabl.workflow import Workflow
from durabl.workflow import build_registry as build_workflow_registry

logger = logging.getLogger("durabl")

_KEEP = UNCHANGED
"""Default for a commit's wake_at_s: leave the run's timer as it is."""
_CTX_STEPS = {what: CtxValue(what) for what in ("now", "random", "uuid")}


class RunState(BaseModel):
    """A run as the caller sees it. ``steps_replayed``/``steps_executed`` count, for the call
    that produced this state, the steps served from the log and the steps that ran for real."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    workflow: str
    status: str
    result: Any = None
    error: str | None = None
    steps_replayed: int = 0
    steps_executed: int = 0
    wake_at_s: float | None = None
    next_step: str | None = None


class DeadLetter(BaseModel):
    """A run stopped on a step durabl will not guess about."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    workflow: str
    step: int
    seq: int
    step_description: str
    reason: str
    idempotency_key: str | None = None


class RunCompaction(BaseModel):
    """What compaction did to one run."""

    run_id: str
    steps_folded: int
    """Steps now held by the snapshot (in all, over every compaction of the run)."""
    events_deleted: int
    watermark: int
    """The log now starts after this seq."""
    events_kept: int


class Compaction(BaseModel):
    """What ``Runtime.compact`` did."""

    runs: list[RunCompaction] = []
    busy: list[str] = []
    """Runs skipped because another live process is driving them."""
    errors: dict[str, str] = {}
    """Runs that could not be folded (a damaged log, say), with the reason; the others were."""
    bytes_before: int | None = None
    """The file's size (WAL included) before anything was folded; None without reclaim."""
    bytes_after: int | None = None
    """Its size once the folded space was handed back."""


class _Park(Exception):
    """The run cannot go further now (timer pending, dead-lettered, log end in a dry replay)."""


class _Unwind(BaseException):
    """Stop the workflow from inside a ctx call (dry replay reached the log's end, or the log
    disagrees); a BaseException so that no ``except Exception`` in workflow code can swallow it."""


class _Hold(Exception):
    """The run must stop without failing: hold it with this error and re-raise it to the caller."""

    def __init__(self, error: DurablError) -> None:
        super().__init__(str(error))
        self.error = error


class _Drive:
    """The state of one pass of one run through its workflow."""

    def __init__(
        self,
        runtime: Runtime,
        row: RunRow,
        wf: Workflow,
        history: History,
        now_s: float | None,
        dry: bool,
    ) -> None:
        self.rt = runtime
        self.row = row
        self.run_id = row.run_id
        self.wf = wf
        self.history = history
        self.fixed_now_s = now_s
        self.dry = dry
        self.position = 0
        self.replayed = 0
        self.executed = 0
        self.status = row.status
        self.error = row.error
        self.hold: DurablError | None = None
        self.fatal: Exception | None = None
        self.token: int | None = None
        self.next_step: str | None = None
        self.result: Any = None
        self.wake_at_s = row.wake_at_s

    @property
    def replaying(self) -> bool:
        return self.dry or self.position < self.history.last_position

    def now(self) -> float:
        return self.fixed_now_s if self.fixed_now_s is not None else self.rt._clock()

    def effect(
        self,
        key: str,
        tool: str,
        args_fp: str,
        *,
        result: str | None = None,
        error: str | None = None,
    ) -> SideEffect:
        """The side effect the current step records for ``key``: its result or its error."""
        return SideEffect(
            key=key,
            run_id=self.run_id,
            step=self.position,
            tool=tool,
            args_fp=args_fp,
            result_text=result,
            error=error,
            at_s=self.now(),
        )

    def ctx_value(self, what: str, draw: Callable[[], Any]) -> Any:
        self.position += 1
        step = _CTX_STEPS[what]
        try:
            action, rec = self.rt._decide(self.history, self.position, step)
        except NonDeterminismError as exc:
            self.hold = exc
            raise _Unwind() from None
        if action == replay.SERVE and rec is not None:
            self.replayed += 1
            return codec.decode(rec.result_text or "null")
        if self.dry:
            self.next_step = step.describe()
            raise _Unwind()
        text, value = codec.round_trip(draw(), what=step.describe())
        crashpoints.reach(crashpoints.BEFORE_CTX_RECORDED)
        try:
            self.rt._commit(self, [(events.CTX_RECORDED, step.fingerprint, text)])
        except Exception as exc:
            # A storage failure is the runtime's, not the workflow's: its except clauses
            # must not see it. Unwind the workflow and re-raise it to the caller.
            self.fatal = exc
            raise _Unwind() from None
        self.executed += 1
        return value


class Runtime:
    """Runs workflows durably against one database."""

    def __init__(
        self,
        db: str | os.PathLike[str] | None = None,
        *,
        llm: Callable[..., Any] | None = None,
        tools: Mapping[str, Any] | None = None,
        clock: Callable[[], float] | None = None,
        retry: RetryPolicy | None = None,
        workflows: Iterable[Any] | Mapping[str, Any] | None = None,
        durability: str = "full",
        store: Store | None = None,
        lease_s: float = leases.LEASE_S,
    ) -> None:
        if llm is not None and not callable(llm):
            raise TypeError(
                f"llm must be a callable llm(prompt, **params), got {type(llm).__name__}"
            )
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a zero-argument callable returning epoch seconds")
        if retry is not None:
            check_type("retry", retry, RetryPolicy)
        self._tools: dict[str, Tool] = build_registry(tools)
        self._workflows = build_workflow_registry(workflows)
        self._llm = llm
        user_clock = clock or time.time
        self._clock: Callable[[], float] = lambda: float(user_clock())
        self._retry = retry or RetryPolicy()
        self.store: Store = (
            store
            if store is not None
            else SQLiteStore("durabl.db" if db is None else db, durability=durability)
        )
        self.instance_id = uuid.uuid4().hex
        self._leaser = leases.Leaser(self.store, self.instance_id, lease_s)
        self._stop_requested = False  # a plain flag: stop() runs in signal handlers
        self._worker: Worker | None = None
        self._owned: set[str] = set()
        self._policies: dict[str, RetryPolicy] = {}
        self._boundary = {
            "pid": os.getpid(),
            "host": leases.HOST,
            "owner": self.instance_id,
        }

    # -- lifecycle -------------------------------------------------------------------------

    def serve(self, *, concurrency: int = 1, poll_s: float = POLL_S) -> WorkerStats:
        """Run a worker on this runtime until ``stop()`` is called (from another thread or a
        signal handler): resume interrupted runs, fire timers as they come due."""
        worker = Worker(self, concurrency=concurrency, poll_s=poll_s)
        self._worker = worker
        if self._stop_requested:
            worker.stop()
        return worker.run()

    def stop(self) -> None:
        """Ask a serving runtime to let its current steps finish, park, and return."""
        self._stop_requested = True
        if self._worker is not None:
            self._worker.stop()

    def close(self) -> None:
        self._leaser.close()
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public API ------------------------------------------------------------------------

    def start(self, workflow: Any, input: Any = None, *, run_id: str | None = None) -> str:
        """Create a run and drive it as far as it goes; returns its id.

        Starting again with an existing run id and the same workflow and input returns that run
        (driving it on if it was interrupted); with a different workflow or input it is an error.
        """
        return self._start(workflow, input, run_id).run_id

    def run(self, workflow: Any, input: Any = None, *, run_id: str | None = None) -> RunState:
        """``start``, and return the state the run reached."""
        return self._start(workflow, input, run_id)

    def _start(self, workflow: Any, run_input: Any, run_id: str | None) -> RunState:
        wf = workflows.resolve(workflow, self._workflows)
        input_text, value = codec.round_trip(run_input, what=f"input of workflow {wf.name!r}")
        wf.bind(value)
        if run_id is None:
            run_id = uuid.uuid4().hex
        else:
            check_text("run_id", run_id)
        now_s = self._clock()
        started = codec.encode({"workflow": wf.name, "input": value, **self._boundary})
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
            lease=self._leaser.lease(),
        )
        existing = self.store.create_run(row, Event(1, events.RUN_STARTED, 0, None, started, now_s))
        if existing is not None:
            if existing.workflow != wf.name or existing.input_text != input_text:
                raise RunConflictError(
                    run_id=run_id,
                    workflow=wf.name,
                    input_text=input_text,
                    existing_workflow=existing.workflow,
                    existing_input_text=existing.input_text,
                )
            if existing.status == events.RUNNING:
                return self._resume_row(existing, wf)
            return self.state(run_id)
        self._owned.add(run_id)
        self._register(wf)
        with self._owning(run_id, token=1) as (row, token):
            crashpoints.reach(crashpoints.AFTER_RUN_STARTED)
            return self._drive_owned(row, wf, None, token)

    def resume(self, run_id: str) -> RunState:
        """Drive an existing run on from where its log ends."""
        return self._resume_row(self._row(run_id))

    def resume_all(self) -> list[RunState]:
        """Resume every interrupted or held run. One broken run is reported and skipped."""
        rows = self.store.list_runs(statuses=(events.RUNNING, events.HELD))
        return [self._isolated(row, None) for row in reversed(rows)]

    def tick(self, now: float | None = None) -> list[RunState]:
        """Fire every timer due at ``now`` (default: the clock) and drive those runs on."""
        now_s = self._clock() if now is None else float(now)
        states = []
        for run_id in self.store.due_runs(now_s):
            row = self.store.get_run(run_id)
            if row is not None and row.status not in events.TERMINAL_STATUSES:
                states.append(self._isolated(row, now_s))
        return states

    def replay(self, run_id: str, *, dry: bool = True) -> RunState:
        """Rebuild the run's state from its log. ``dry`` (the default) executes and writes
        nothing, even when the log ends mid-step; ``dry=False`` is ``resume``."""
        if not dry:
            return self.resume(run_id)
        row = self._row(run_id)
        wf = workflows.resolve(row.workflow, self._workflows)
        d = self._new_drive(row, wf, None, dry=True)
        self._drive(d)
        if d.hold is not None:
            raise d.hold
        return self._state_of(d)

    def state(self, run_id: str) -> RunState:
        """The run's state as recorded (no workflow code runs)."""
        row = self._row(run_id)
        history = self._history(run_id)
        boundary = history.resumed_at[-1] if history.resumed_at else 0
        executed = sum(1 for r in history.steps.values() if r.done and r.done_seq > boundary)
        return RunState(
            run_id=row.run_id,
            workflow=row.workflow,
            status=row.status,
            result=None if row.result_text is None else codec.decode(row.result_text),
            error=row.error,
            steps_replayed=history.completed_positions() - executed,
            steps_executed=executed,
            wake_at_s=row.wake_at_s,
        )

    def result(self, run_id: str) -> Any:
        """The run's result; raises if the run failed, was cancelled or has not finished."""
        row = self._row(run_id)
        if row.status == events.COMPLETED:
            return None if row.result_text is None else codec.decode(row.result_text)
        if row.status == events.FAILED:
            raise RunFailedError(run_id=run_id, error=row.error)
        if row.status == events.DEAD_LETTERED:
            raise DeadLetteredError(run_id=run_id, reason=row.error)
        raise RunNotFinishedError(run_id=run_id, status=row.status)

    def dead_letters(self) -> list[DeadLetter]:
        """Every run stopped on a dead-lettered step, oldest first."""
        found = []
        for row in reversed(self.store.list_runs(statuses=(events.DEAD_LETTERED,))):
            last = self._dead_letter_event(row)
            data = codec.decode(last.data or "{}")
            found.append(
                DeadLetter(
                    run_id=row.run_id,
                    workflow=row.workflow,
                    step=last.step,
                    seq=last.seq,
                    step_description=data.get("step", ""),
                    reason=data.get("reason", ""),
                    idempotency_key=data.get("key"),
                )
            )
        return found

    def redrive(self, run_id: str) -> RunState:
        """Call the dead-lettered step again (the operator accepts a possible duplicate)."""
        with self._owning(run_id) as (row, token):
            event = self._dead_letter_event(self._check_dead(row))
            wf = workflows.resolve(row.workflow, self._workflows)
            d = self._new_drive(row, wf, None, dry=False, token=token)
            self._commit(d, [(events.DLQ_REDRIVEN, None, None)], step=event.step)
            return self._drive_owned(self._row(run_id), wf, None, token)

    def resolve(self, run_id: str, result: Any) -> RunState:
        """Supply the dead-lettered step's result (the operator checked what happened)."""
        with self._owning(run_id) as (row, token):
            event = self._dead_letter_event(self._check_dead(row))
            data = codec.decode(event.data or "{}")
            what = f"resolution of run {run_id} step {event.step}"
            text, _ = codec.round_trip(result, what=what)
            explicit_key = data.get("key")
            key = explicit_key or derived_key(run_id, event.step)
            if self.store.side_effect(key) is not None:
                raise EffectAlreadyRecordedError(key=key, run_id=run_id)
            effect = SideEffect(
                key=key,
                run_id=run_id,
                step=event.step,
                tool=data["tool"],
                args_fp=data["fp"],
                result_text=text,
                error=None,
                at_s=self._clock(),
            )
            wf = workflows.resolve(row.workflow, self._workflows)
            d = self._new_drive(row, wf, None, dry=False, token=token)
            self._commit(
                d,
                [(events.DLQ_RESOLVED, None, None), (events.STEP_COMPLETED, None, text)],
                step=event.step,
                side_effect=effect,
                release_claim=explicit_key,
                durable=True,
            )
            return self._drive_owned(self._row(run_id), wf, None, token)

    def cancel(self, run_id: str, reason: str = "cancelled by operator") -> RunState:
        """End a run that has not finished. Recorded in the log; the run never resumes."""
        with self._owning(run_id) as (row, token):
            if row.status in events.TERMINAL_STATUSES:
                raise AlreadyTerminalError(run_id=run_id, status=row.status)
            d = self._new_drive(row, None, None, dry=False, token=token)
            self._commit(
                d,
                [(events.RUN_CANCELLED, None, codec.encode({"reason": reason}))],
                status=events.CANCELLED,
                error=f"cancelled: {reason}",
                wake_at_s=None,
                durable=True,
            )
        return self.state(run_id)

    # -- upkeep ----------------------------------------------------------------------------

    def compact(
        self, run_id: str | None = None, *, keep_last: int = 0, reclaim: bool = True
    ) -> Compaction:
        """Fold each run's resolved prefix (its finished steps, less the last ``keep_last``)
        into its snapshot, one transaction per run; then, with ``reclaim``, hand the freed
        space back to the file system. ``run_id`` None means every run; then a run another
        live process is driving is skipped (listed in ``busy``), and a run that cannot be
        folded (listed in ``errors``) does not stop the others. Replay is unchanged either way."""
        check_int("keep_last", keep_last, at_least=0)
        rows = [self._row(run_id)] if run_id is not None else self.store.list_runs()
        report = Compaction()
        if reclaim:  # the size before, measured the way the size after will be
            report.bytes_before, _ = self.store.reclaim()
        for row in reversed(rows):
            try:
                folded = self._compact_run(row.run_id, keep_last)
            except RunLeased:
                if run_id is not None:
                    raise
                report.busy.append(row.run_id)
                continue
            except DurablError as exc:  # one damaged run never stops the others
                if run_id is not None:
                    raise
                logger.warning("run %s not compacted: %s", row.run_id, exc)
                report.errors[row.run_id] = described(exc)
                continue
            if folded is not None:
                report.runs.append(folded)
        if reclaim:
            _, report.bytes_after = self.store.reclaim()
        return report

    def _compact_run(self, run_id: str, keep_last: int) -> RunCompaction | None:
        with self._owning(run_id) as (_, token):
            watermark, snapshot, log = self.store.load_history(run_id)
            history = History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)
            position, seq = history.foldable(keep_last)
            if seq <= watermark:
                return None
            folded = [e for e in log if e.seq <= seq]
            counters = MetricsFold.of(folded, history.folded_metrics).counters()
            text = history.snapshot(position, seq, counters)
            deleted = self.store.compact(run_id, seq, text, token)
        return RunCompaction(
            run_id=run_id,
            steps_folded=position,
            events_deleted=deleted,
            watermark=seq,
            events_kept=len(log) - deleted,
        )

    def metrics(self, run_id: str | None = None) -> Metrics:
        """What the run cost (or, with ``run_id`` None, the sums over every run), from the log
        alone: see ``durabl.metrics``."""
        run_ids = [self._row(run_id).run_id] if run_id is not None else None
        return of_runs(self.store, run_ids)

    # -- driving ---------------------------------------------------------------------------

    def _history(self, run_id: str) -> History:
        watermark, snapshot, log = self.store.load_history(run_id)
        return History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)

    def _row(self, run_id: str) -> RunRow:
        row = self.store.get_run(run_id)
        if row is None:
            raise RunNotFoundError(run_id=run_id, path=self.store.path)
        return row

    def _register(self, wf: Workflow) -> None:
        self._workflows.setdefault(wf.name, wf)

    def _isolated(self, row: RunRow, now_s: float | None) -> RunState:
        try:
            return self._resume_row(row, None, now_s)
        except crashpoints.ProcessDeath:
            raise
        except Exception as exc:
            logger.warning("run %s (%s) could not be resumed: %s", row.run_id, row.workflow, exc)
            latest = self.store.get_run(row.run_id) or row
            return RunState(
                run_id=row.run_id, workflow=row.workflow, status=latest.status, error=str(exc)
            )

    def _resume_row(
        self,
        row: RunRow,
        wf: Workflow | None = None,
        now_s: float | None = None,
        token: int | None = None,
    ) -> RunState:
        if row.status in events.TERMINAL_STATUSES or row.status == events.DEAD_LETTERED:
            return self.state(row.run_id)
        wf = wf or workflows.resolve(row.workflow, self._workflows)  # before touching the run
        with self._owning(row.run_id, token) as (row, token):
            return self._drive_owned(row, wf, now_s, token)

    def _drive_owned(
        self, row: RunRow, wf: Workflow | None, now_s: float | None, token: int
    ) -> RunState:
        """Drive a run whose lease this runtime holds with ``token``."""
        if row.status in events.TERMINAL_STATUSES or row.status == events.DEAD_LETTERED:
            return self.state(row.run_id)
        wf = wf or workflows.resolve(row.workflow, self._workflows)
        d = self._new_drive(row, wf, now_s, dry=False, token=token)
        self._drive(d)
        if d.hold is not None:
            raise d.hold
        return self._state_of(d)

    @contextlib.contextmanager
    def _owning(self, run_id: str, token: int | None = None) -> Iterator[tuple[RunRow, int]]:
        """Hold the run's lease for the block: the fresh row and the fencing token to write
        with. A simulated death leaves the lease in the database, as a real one would."""
        with leases.driving(run_id, self.instance_id):
            try:
                if token is None:
                    token = self._leaser.acquire(self._row(run_id))
                    crashpoints.reach(crashpoints.AFTER_LEASE_TAKEN)
                else:
                    self._leaser.hold(run_id, token)
                yield self._row(run_id), token
            except crashpoints.ProcessDeath:
                self._leaser.forget(run_id)
                raise
            except BaseException:
                self._leaser.release(run_id)
                raise
            self._leaser.release(run_id)

    def _new_drive(
        self,
        row: RunRow,
        wf: Workflow | None,
        now_s: float | None,
        *,
        dry: bool,
        token: int | None = None,
    ) -> _Drive:
        history = self._history(row.run_id)
        d = _Drive(self, row, wf, history, now_s, dry)  # type: ignore[arg-type]
        d.token = token
        return d

    def _state_of(self, d: _Drive) -> RunState:
        row = self.store.get_run(d.run_id) or d.row
        return RunState(
            run_id=d.run_id,
            workflow=row.workflow,
            status=row.status if not d.dry else d.status,
            result=d.result if d.dry else _decoded(row.result_text),
            error=row.error if d.hold is None else str(d.hold),
            steps_replayed=d.replayed,
            steps_executed=d.executed,
            wake_at_s=row.wake_at_s,
            next_step=d.next_step,
        )

    def _drive(self, d: _Drive) -> None:
        """Run the generator with one send/throw loop until it finishes, parks or is held."""
        run_input = codec.decode(d.row.input_text)
        ctx = Context(d.run_id, d.wf.name, run_input, d, d.now)
        gen = d.wf.fn(ctx, **d.wf.bind(run_input))
        send: Any = None
        throw: BaseException | None = None
        try:
            while True:
                try:
                    yielded = gen.send(send) if throw is None else gen.throw(throw)
                except StopIteration as stop:
                    self._check_hold(d)
                    self._finish(d, stop.value)
                    return
                except _Unwind:
                    self._check_hold(d)
                    if d.fatal is not None:
                        raise d.fatal from None
                    return
                except Exception as exc:
                    self._check_hold(d)
                    self._fail(d, exc)
                    return
                self._check_hold(d)
                send, throw = None, None
                if not isinstance(yielded, Step) or isinstance(yielded, CtxValue):
                    throw = not_a_step(workflow=d.wf.name, yielded=yielded)
                    continue
                d.position += 1
                try:
                    send = self._step(d, yielded)
                except StepFailed as failed:
                    throw = failed
        except _Park:
            return
        except _Hold as hold:
            self._hold(d, hold.error)

    def _check_hold(self, d: _Drive) -> None:
        if d.hold is not None:
            raise _Hold(d.hold)

    def _step(self, d: _Drive, step: Step) -> Any:
        try:
            action, rec = self._decide(d.history, d.position, step)
        except NonDeterminismError as exc:
            raise _Hold(exc) from None
        if action == replay.SERVE and rec is not None:
            d.replayed += 1
            crashpoints.reach(crashpoints.DURING_REPLAY)
            return codec.decode(rec.result_text or "null")
        if action == replay.THROW and rec is not None and rec.failure is not None:
            d.replayed += 1
            raise StepFailed.from_record(rec.failure)
        if d.dry:
            d.next_step = step.describe()
            raise _Park()
        if action == replay.DEAD or self._stop_requested:
            raise _Park()  # dead-lettered, or the process is shutting down: leave it here
        if isinstance(step, Sleep):
            return self._sleep(d, step, rec)
        if action == replay.WAIT and rec is not None and d.now() < (rec.wake_at_s or 0.0):
            self._park(d, events.SLEEPING)  # a retry backoff that is not over yet
        if isinstance(step, ModelCall):
            return self._model(d, step, rec)
        assert isinstance(step, ToolCall)
        return self._tool(d, step, rec, action)

    def _decide(self, history: History, position: int, step: Step) -> tuple[str, StepRecord | None]:
        """The replay decision for a step. One method, so that the negative control's broken
        runtimes can override exactly this and nothing else."""
        return replay.decide(history, position, step)

    def _call_tool(self, tool: Tool, args: dict[str, Any]) -> Any:
        """Hand control to a tool: the only place durabl calls one."""
        return tool.fn(**args)

    def _policy(self, tool: Tool) -> RetryPolicy:
        policy = self._policies.get(tool.name)
        if policy is None:
            policy = self._policies[tool.name] = tool.policy(self._retry)
        return policy

    # -- executing steps -------------------------------------------------------------------

    def _sleep(self, d: _Drive, step: Sleep, rec: StepRecord | None) -> None:
        now_s = d.now()
        if rec is None:
            crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
            fire_at_s = now_s + step.seconds
            self._commit(
                d,
                [
                    (events.STEP_STARTED, step.fingerprint, step.canonical),
                    (events.TIMER_ARMED, None, codec.encode({"fire_at_s": fire_at_s})),
                ],
                status=events.SLEEPING if now_s < fire_at_s else events.RUNNING,
                wake_at_s=fire_at_s,
                durable=True,
            )
            crashpoints.reach(crashpoints.AFTER_TIMER_ARMED)
        else:
            assert rec.wake_at_s is not None
            fire_at_s = rec.wake_at_s
        if now_s < fire_at_s:
            self._park(d, events.SLEEPING)
        crashpoints.reach(crashpoints.BEFORE_TIMER_FIRED)
        self._commit(
            d,
            [(events.TIMER_FIRED, None, codec.encode({"fired_at_s": now_s}))],
            wake_at_s=None,
            durable=True,
        )
        crashpoints.reach(crashpoints.AFTER_TIMER_FIRED)
        d.executed += 1

    def _model(self, d: _Drive, step: ModelCall, rec: StepRecord | None) -> Any:
        if self._llm is None:
            raise _Hold(NoModelError(run_id=d.run_id, position=d.position, step=step.describe()))
        llm = self._llm
        return self._attempts(
            d,
            step,
            rec,
            self._retry,
            lambda: llm(step.prompt, **step.params),
            returned=crashpoints.AFTER_MODEL_RETURNED,
            failure=ModelCallFailed,
            name="ModelCall",
        )

    def _tool(self, d: _Drive, step: ToolCall, rec: StepRecord | None, action: str) -> Any:
        tool = self._tools.get(step.name)
        if tool is None:
            raise _Hold(
                UnknownToolError(
                    run_id=d.run_id, position=d.position, tool=step.name, registered=self._tools
                )
            )
        explicit = step.idempotency_key is not None
        key = step.idempotency_key or derived_key(d.run_id, d.position)
        ambiguous = action == replay.AMBIGUOUS
        if explicit:
            effect = self.store.side_effect(key)
            if effect is not None:
                return self._complete_from_effect(d, step, rec, effect)
            claim = self.store.key_claim(key)
            redriven = rec is not None and rec.redriven
            if claim is not None and (claim.run_id, claim.step) != (d.run_id, d.position):
                self._check_key(d, step, key, claim.tool, claim.args_fp, claim.run_id)
                # Another run died inside this key's window: this run is in the same window,
                # unless an operator has redriven this step and accepted the risk.
                ambiguous = not redriven
        if ambiguous and tool.mode is ToolMode.AT_MOST_ONCE:
            self._dead_letter(d, step, key if explicit else None)
        args = dict(step.args)
        if tool.wants_key:
            args["idempotency_key"] = key

        def call() -> Any:
            return self._call_tool(tool, args)

        claim = (
            KeyClaim(
                key=key, run_id=d.run_id, step=d.position, tool=step.name, args_fp=step.fingerprint
            )
            if explicit
            else None
        )
        return self._attempts(
            d,
            step,
            rec,
            self._policy(tool),
            call,
            returned=crashpoints.AFTER_TOOL_RETURNED,
            failure=ToolFailed,
            name=step.name,
            dispatch=True,
            at_most_once=tool.mode is ToolMode.AT_MOST_ONCE,
            key=key,
            claim=claim,
        )

    def _attempts(
        self,
        d: _Drive,
        step: ToolCall | ModelCall,
        rec: StepRecord | None,
        policy: RetryPolicy,
        call: Callable[[], Any],
        *,
        returned: str,
        failure: type[StepFailed],
        name: str,
        dispatch: bool = False,
        at_most_once: bool = False,
        key: str | None = None,
        claim: KeyClaim | None = None,
    ) -> Any:
        """Attempt the step until it succeeds, fails for good, or parks on a backoff timer."""
        attempt = (rec.retries if rec is not None else 0) + 1
        retry_pending = rec is not None and rec.wake_at_s is not None
        while True:
            crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
            self._commit(
                d,
                [(events.STEP_STARTED, step.fingerprint, step.canonical)],
                wake_at_s=None if retry_pending else _KEEP,
            )
            retry_pending = False
            crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
            if dispatch:
                self._commit(
                    d,
                    [
                        (
                            events.TOOL_DISPATCHED,
                            None,
                            None if key is None else f'{{"key":{json.dumps(key)}}}',
                        )
                    ],
                    claim=claim,
                    durable=at_most_once,
                )
                crashpoints.reach(crashpoints.AFTER_TOOL_DISPATCHED)
            try:
                value = call()
            except Exception as exc:
                crashpoints.reach(returned)
                error = {"error_type": type(exc).__name__, "message": str(exc), "attempt": attempt}
                if attempt < policy.max_attempts:
                    delay_s = policy.delay_s(attempt)
                    self._schedule_retry(d, error, delay_s)
                    attempt += 1
                    retry_pending = delay_s > 0
                    continue
                err = failure(name, type(exc).__name__, str(exc), attempt)
                # An exception from an AT_MOST_ONCE tool does not prove nothing happened: the
                # key is spent, so no other run holding it calls the tool again.
                self._record_failure(
                    d, err, step.fingerprint, key, claim is not None, effect_happened=at_most_once
                )
                raise err from None
            crashpoints.reach(returned)
            try:
                text, value = codec.round_trip(
                    value,
                    what=f"the result of {step.describe()} (run {d.run_id} step {d.position})",
                )
            except EncodingError as exc:
                err = failure(name, "EncodingError", str(exc), attempt)
                self._record_failure(
                    d, err, step.fingerprint, key, claim is not None, effect_happened=dispatch
                )
                raise err from None
            effect = None
            if dispatch and key is not None:
                effect = d.effect(key, name, step.fingerprint, result=text)
            self._commit(
                d,
                [(events.STEP_COMPLETED, None, text)],
                side_effect=effect,
                release_claim=key if claim is not None else None,
                durable=True,
            )
            crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
            d.executed += 1
            return value

    def _schedule_retry(self, d: _Drive, error: dict[str, Any], delay_s: float) -> None:
        """Record a failed attempt and when the next begins. An explicit key's claim is kept:
        until the step ends, another run holding the key is inside the same window."""
        retry_at_s = d.now() + delay_s
        self._commit(
            d,
            [(events.STEP_RETRY, None, codec.encode({**error, "retry_at_s": retry_at_s}))],
            status=events.SLEEPING if delay_s > 0 else events.RUNNING,
            wake_at_s=retry_at_s if delay_s > 0 else _KEEP,
            durable=delay_s > 0,
        )
        crashpoints.reach(crashpoints.AFTER_RETRY_SCHEDULED)
        if delay_s > 0:
            raise _Park()

    def _record_failure(
        self,
        d: _Drive,
        err: StepFailed,
        fp: str,
        key: str | None,
        claimed: bool,
        *,
        effect_happened: bool = False,
    ) -> None:
        """Record a step's final failure; if the effect happened (the tool returned a result
        durabl cannot record), its key is spent: the side_effects row records the failure."""
        effect = None
        if effect_happened and key is not None:
            effect = d.effect(key, err.step_name, fp, error=str(err))
        self._commit(
            d,
            [(events.STEP_FAILED, None, codec.encode(err.to_record()))],
            side_effect=effect,
            release_claim=key if claimed else None,
            wake_at_s=None,
            durable=True,
        )
        d.executed += 1

    def _complete_from_effect(
        self, d: _Drive, step: ToolCall, rec: StepRecord | None, effect: SideEffect
    ) -> Any:
        """Another step already did this key's effect: record its outcome, call nothing."""
        assert step.idempotency_key is not None
        self._check_key(d, step, step.idempotency_key, effect.tool, effect.args_fp, effect.run_id)
        started = (
            [] if rec is not None else [(events.STEP_STARTED, step.fingerprint, step.canonical)]
        )
        if effect.error is not None or effect.result_text is None:
            err = ToolFailed(step.name, "RecordedFailure", effect.error or "no result recorded")
            self._commit(
                d,
                [*started, (events.STEP_FAILED, None, codec.encode(err.to_record()))],
                release_claim=step.idempotency_key,
                wake_at_s=None,
                durable=True,
            )
            d.executed += 1
            raise err
        self._commit(
            d,
            [*started, (events.STEP_COMPLETED, None, effect.result_text)],
            release_claim=step.idempotency_key,
            wake_at_s=None,
            durable=True,
        )
        d.executed += 1
        return codec.decode(effect.result_text)

    def _check_key(
        self, d: _Drive, step: ToolCall, key: str, tool: str, args_fp: str, other_run: str
    ) -> None:
        if tool == step.name and args_fp == step.fingerprint:
            return
        err = ToolFailed(
            step.name,
            "IdempotencyKeyConflict",
            str(
                IdempotencyKeyConflict(
                    key=key,
                    first_run_id=other_run,
                    first_tool=tool,
                    run_id=d.run_id,
                    position=d.position,
                    step=step.describe(),
                )
            ),
        )
        started = (
            [(events.STEP_STARTED, step.fingerprint, step.canonical)]
            if d.position not in d.history.steps
            else []
        )
        self._commit(
            d, [*started, (events.STEP_FAILED, None, codec.encode(err.to_record()))], durable=True
        )
        d.executed += 1
        raise err

    def _dead_letter(self, d: _Drive, step: ToolCall, key: str | None) -> None:
        reason = str(AmbiguousEffect(step=step.describe()))
        data = {
            "reason": reason,
            "step": step.describe(),
            "tool": step.name,
            "fp": step.fingerprint,
            "key": key,
        }
        started = (
            []
            if d.position in d.history.steps
            else [(events.STEP_STARTED, step.fingerprint, step.canonical)]
        )
        self._commit(
            d,
            [*started, (events.DEAD_LETTERED, None, codec.encode(data))],
            status=events.DEAD_LETTERED,
            error=reason,
            durable=True,
        )
        crashpoints.reach(crashpoints.AFTER_DEAD_LETTERED)
        raise _Park()

    # -- ending a pass ---------------------------------------------------------------------

    def _park(self, d: _Drive, status: str) -> None:
        if d.status != status:
            self._commit(d, [], status=status)
        raise _Park()

    def _finish(self, d: _Drive, value: Any) -> None:
        try:
            replay.check_end(d.history, d.position)
        except NonDeterminismError as exc:
            raise _Hold(exc) from None
        try:
            text, d.result = codec.round_trip(
                value, what=f"the result of workflow {d.wf.name!r} (run {d.run_id})"
            )
        except EncodingError as exc:
            self._fail(d, exc)
            return
        if d.history.terminal == events.RUN_FAILED:
            raise _Hold(
                replay.mismatch(
                    d.history,
                    d.position + 1,
                    "the end of the workflow (RUN_FAILED)",
                    f"a return with the result {text}",
                )
            )
        if d.history.terminal == events.RUN_COMPLETED and d.history.terminal_data != text:
            raise _Hold(
                replay.mismatch(
                    d.history,
                    d.position + 1,
                    f"the result {d.history.terminal_data}",
                    f"the result {text}",
                )
            )
        if d.dry:
            if d.history.terminal == events.RUN_COMPLETED:
                d.status = events.COMPLETED
            return
        if d.history.terminal is not None:
            return
        crashpoints.reach(crashpoints.BEFORE_RUN_COMPLETED)
        self._commit(
            d,
            [(events.RUN_COMPLETED, None, text)],
            status=events.COMPLETED,
            result_text=text,
            wake_at_s=None,
            durable=True,
        )

    def _fail(self, d: _Drive, exc: Exception) -> None:
        if d.position < d.history.last_position:
            # The log goes on past this point, so the first execution did not raise here:
            # the code changed under the run. Failing it would destroy a healthy run.
            rec = d.history.steps[min(p for p in d.history.steps if p > d.position)]
            raise _Hold(
                replay.mismatch(
                    d.history,
                    rec.position,
                    replay.describe_record(rec),
                    f"an exception ({type(exc).__name__}: {exc})",
                )
            )
        if d.history.terminal in (events.RUN_COMPLETED, events.RUN_CANCELLED):
            # Only a dry replay re-runs a finished run: its code now raises where it returned.
            raise _Hold(
                replay.mismatch(
                    d.history,
                    d.position + 1,
                    f"the end of the workflow ({d.history.terminal})",
                    f"an exception ({type(exc).__name__}: {exc})",
                )
            )
        if d.dry:
            d.status = events.FAILED
            return
        record = {"error_type": type(exc).__name__, "message": str(exc)}
        self._commit(
            d,
            [(events.RUN_FAILED, None, codec.encode(record))],
            status=events.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            wake_at_s=None,
            durable=True,
        )

    def _hold(self, d: _Drive, error: DurablError) -> None:
        d.hold = error
        if d.dry:
            return
        self._commit(d, [], status=events.HELD, error=f"{type(error).__name__}: {error}")

    # -- the one write path ----------------------------------------------------------------

    def _commit(
        self,
        d: _Drive,
        new: list[tuple[str, str | None, str | None]],
        *,
        status: str | None = None,
        step: int | None = None,
        result_text: str | None = None,
        error: str | None = None,
        wake_at_s: float | None = _KEEP,
        side_effect: SideEffect | None = None,
        claim: KeyClaim | None = None,
        release_claim: str | None = None,
        durable: bool = False,
    ) -> None:
        """Append events for the current step and set the run's status, in one transaction.

        Without an explicit status, writing events means the run is RUNNING. The first write a
        runtime makes to a run it did not start is preceded, in the same transaction, by
        RUN_RESUMED: the process boundary, recorded so the log alone can show it.
        """
        if d.dry:
            raise AssertionError("a dry replay never writes")
        if status is None:
            status = events.RUNNING if new else d.status
        now_s = self._clock()
        position = d.position if step is None else step
        rows: list[Event] = []
        seq = d.history.last_seq
        if new and d.run_id not in self._owned:
            seq += 1
            boundary = codec.encode({**self._boundary, "replayed": d.replayed})
            rows.append(Event(seq, events.RUN_RESUMED, 0, None, boundary, now_s))
        for kind, fp, data in new:
            seq += 1
            rows.append(
                Event(seq, kind, 0 if kind in events.TERMINAL else position, fp, data, now_s)
            )
        healthy = status in (events.RUNNING, events.SLEEPING, events.COMPLETED)
        clear_error = healthy and error is None and d.error is not None
        self.store.commit(
            Commit(
                d.run_id,
                rows,
                status=None if status == d.status else status,
                result_text=result_text,
                error=error,
                clear_error=clear_error,
                wake_at_s=wake_at_s,
                side_effect=side_effect,
                claim=claim,
                release_claim=release_claim,
                durable=durable,
                at_s=now_s,
                fence=d.token,
            )
        )
        if new:
            self._owned.add(d.run_id)
        for row in rows:
            d.history.apply(row)
        d.status = status
        d.error = error if error is not None else (None if clear_error else d.error)

    def _check_dead(self, row: RunRow) -> RunRow:
        if row.status != events.DEAD_LETTERED:
            raise NotDeadLetteredError(run_id=row.run_id, status=row.status)
        return row

    def _dead_letter_event(self, row: RunRow) -> Event:
        for event in reversed(self.store.load_log(row.run_id)):
            if event.kind == events.DEAD_LETTERED:
                return event
        raise DeadLetterEventMissingError(run_id=row.run_id)


def _decoded(text: str | None) -> Any:
    return None if text is None else codec.decode(text)


__all__ = ["Compaction", "DeadLetter", "RunCompaction", "RunState", "Runtime"]
