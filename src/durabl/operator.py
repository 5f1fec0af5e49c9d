"""What an operator does to runs: the dead-letter queue (list, redrive, resolve, cancel),
compaction, and the check before a deploy (every run replayed dry against the new code). Every
change is written to the run's log under its lease, like a drive's; the check writes nothing."""

from __future__ import annotations

import logging
from typing import Any

from durabl import codec, events
from durabl.checks import check_int, check_text
from durabl.engine import Engine
from durabl.engine import new_run_id as new_run_id_of
from durabl.errors import (
    AlreadyTerminalError,
    DeadLetterEventMissingError,
    DurablError,
    EffectAlreadyRecordedError,
    ForkRefusedError,
    NonDeterminismError,
    NotDeadLetteredError,
    RunLeased,
    RunNotFoundError,
    described,
)
from durabl.events import Event
from durabl.metrics import MetricsFold
from durabl.replay import History, describe_record
from durabl.states import DeadLetter, RunState
from durabl.steps import child_run_id, derived_key
from durabl.store.base import RunRow, SideEffect
from durabl.upkeep import Compaction, RunCheck, RunCompaction

logger = logging.getLogger("durabl")


# -- before a deploy ---------------------------------------------------------------------------


def check(engine: Engine) -> list[RunCheck]:
    """Replay every stored run, dry, against the engine's workflows (``Runtime.check``)."""
    found = []
    for row in reversed(engine.store.list_runs()):
        at: dict[str, Any] = {}
        try:
            engine.drive(row, engine.workflow_of(row.workflow), None, None)
            problem = None
        except NonDeterminismError as exc:
            problem = str(exc)
            at = {"seq": exc.seq, "position": exc.position}
            at.update(expected=exc.expected, actual=exc.actual)
        except DurablError as exc:  # its workflow is not registered, its log is damaged...
            problem = str(exc)
        ok = problem is None
        finished = row.status in events.TERMINAL_STATUSES
        found.append(
            RunCheck(
                run_id=row.run_id,
                workflow=row.workflow,
                status=row.status,
                ok=ok,
                breaks=not ok and not finished,
                problem=problem,
                **at,
            )
        )
    return found


# -- forks ------------------------------------------------------------------------------------


def fork(
    engine: Engine, run_id: str, at_seq: int, new_run_id: str | None, boundary: dict[str, Any]
) -> str:
    """A new run whose log is ``run_id``'s up to ``at_seq`` (``Runtime.fork``)."""
    row = engine.row(run_id)
    watermark, _, log = engine.store.load_history(run_id)

    def refuse(why: str) -> ForkRefusedError:
        return ForkRefusedError(run_id=run_id, seq=at_seq, why=why)

    if watermark:
        raise refuse(f"its log is compacted up to seq {watermark}, and a fork copies its events")
    last = log[-1].seq if log else 0
    if not 1 <= at_seq <= last:
        raise refuse(f"its log holds seqs 1..{last}")
    at = log[at_seq - 1]
    if at.kind in events.TERMINAL:
        raise refuse(f"seq {at_seq} is the run's end ({at.kind}): fork at the seq that ends a step")
    prefix = log[:at_seq]
    history = History.from_events(run_id, prefix)
    for position, rec in sorted(history.steps.items()):
        if not rec.done:
            raise refuse(
                f"it is inside step {position} ({describe_record(rec)}), which has begun but "
                f"not ended there: fork at the seq that ends a step"
            )
    started = codec.decode(prefix[0].data or "{}")
    now_s = engine.clock()
    forked = {
        "workflow": started["workflow"],
        "input": started["input"],
        **boundary,
        "forked_from": {"run_id": run_id, "seq": at_seq},
    }
    new_id = new_run_id if new_run_id is not None else new_run_id_of()
    check_text("run_id", new_id)
    copy = RunRow(
        run_id=new_id,
        workflow=row.workflow,
        input_text=row.input_text,
        status=events.RUNNING,
        result_text=None,
        error=None,
        created_s=now_s,
        updated_s=now_s,
        wake_at_s=None,
        watermark=0,
    )
    first = Event(1, events.RUN_STARTED, 0, None, codec.encode(forked), now_s)
    existing = engine.store.create_run(copy, first, prefix[1:])
    if existing is not None:
        raise refuse(f"a run with id {new_id} exists already")
    return new_id


# -- the dead-letter queue -------------------------------------------------------------------


def dead_letters(engine: Engine) -> list[DeadLetter]:
    """Every run stopped on a dead-lettered step, oldest first."""
    found = []
    for row in reversed(engine.store.list_runs(statuses=(events.DEAD_LETTERED,))):
        event = dead_lettered_event(engine, row)
        data = codec.decode(event.data or "{}")
        found.append(
            DeadLetter(
                run_id=row.run_id,
                workflow=row.workflow,
                step=event.step,
                seq=event.seq,
                step_description=data.get("step", ""),
                reason=data.get("reason", ""),
                idempotency_key=data.get("key"),
            )
        )
    return found


def redrive(engine: Engine, run_id: str) -> RunState:
    """Call the dead-lettered step again (the operator accepts a possible duplicate)."""
    with engine.owning(run_id) as (row, token):
        event = dead_lettered_event(engine, row)
        wf = engine.workflow_of(row.workflow)
        engine.journal(row, token).append([(events.DLQ_REDRIVEN, None, None)], step=event.step)
        return engine.drive_owned(engine.row(run_id), wf, None, token)


def resolve(engine: Engine, run_id: str, result: Any) -> RunState:
    """Supply the dead-lettered step's result (the operator checked what happened)."""
    with engine.owning(run_id) as (row, token):
        event = dead_lettered_event(engine, row)
        data = codec.decode(event.data or "{}")
        text, _ = codec.round_trip(result, what=f"resolution of run {run_id} step {event.step}")
        explicit_key = data.get("key")
        key = explicit_key or derived_key(run_id, event.step)
        if engine.store.side_effect(key) is not None:
            raise EffectAlreadyRecordedError(key=key, run_id=run_id)
        effect = SideEffect(
            key=key,
            run_id=run_id,
            step=event.step,
            tool=data["tool"],
            args_fp=data["fp"],
            result_text=text,
            error=None,
            at_s=engine.clock(),
        )
        wf = engine.workflow_of(row.workflow)
        engine.journal(row, token).append(
            [(events.DLQ_RESOLVED, None, None), (events.STEP_COMPLETED, None, text)],
            step=event.step,
            side_effect=effect,
            release_claim=explicit_key,
            durable=True,
        )
        return engine.drive_owned(engine.row(run_id), wf, None, token)


def cancel(engine: Engine, run_id: str, reason: str) -> RunState:
    """End a run that has not finished, and then the children it waits on, theirs in turn.
    Recorded in each log; none of them resumes. A child another process is driving now is
    cancelled when it is next driven (it finds its parent cancelled)."""
    with engine.owning(run_id) as (row, token):
        if row.status in events.TERMINAL_STATUSES:
            raise AlreadyTerminalError(run_id=run_id, status=row.status)
        journal = engine.journal(row, token)
        journal.cancel(reason)
    for child_id in open_children(journal.history):
        try:
            child_id = engine.latest(child_id)  # where a child's ContinueAsNew chain has got
            cancel(engine, child_id, f"its parent run {run_id} was cancelled")
        except (AlreadyTerminalError, RunLeased, RunNotFoundError):
            continue
    return engine.state(run_id)


def open_children(history: History) -> list[str]:
    """The ids of the child runs the run started and has no outcome of, in step order."""
    found = []
    for position in sorted(history.steps):
        rec = history.steps[position]
        if rec.done or rec.canonical is None or not rec.canonical.startswith('["child",'):
            continue
        explicit = codec.decode(rec.canonical)[3]
        found.append(child_run_id(history.run_id, position, explicit))
    return found


def dead_lettered_event(engine: Engine, row: RunRow) -> Event:
    """The DEAD_LETTERED event the run is stopped on; InvalidStateError if it is not stopped
    on one."""
    if row.status != events.DEAD_LETTERED:
        raise NotDeadLetteredError(run_id=row.run_id, status=row.status)
    for event in reversed(engine.store.load_log(row.run_id)):
        if event.kind == events.DEAD_LETTERED:
            return event
    raise DeadLetterEventMissingError(run_id=row.run_id)


# -- compaction ------------------------------------------------------------------------------


def compact(engine: Engine, run_id: str | None, keep_last: int, reclaim: bool) -> Compaction:
    """Fold each run's resolved prefix into its snapshot; see ``Runtime.compact``."""
    check_int("keep_last", keep_last, at_least=0)
    rows = [engine.row(run_id)] if run_id is not None else engine.store.list_runs()
    report = Compaction()
    if reclaim:  # the size before, measured the way the size after will be
        report.bytes_before, _ = engine.store.reclaim()
    for row in reversed(rows):
        try:
            folded = compact_run(engine, row.run_id, keep_last)
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
        _, report.bytes_after = engine.store.reclaim()
    return report


def compact_run(engine: Engine, run_id: str, keep_last: int) -> RunCompaction | None:
    """Fold one run's resolved prefix, less its last ``keep_last`` steps, in one transaction
    under its lease; None when there is nothing new to fold."""
    with engine.owning(run_id) as (_, token):
        engine.leaser.renew()  # a long log takes a while to read and fold
        watermark, snapshot, log = engine.store.load_history(run_id)
        history = History.from_events(run_id, log, watermark=watermark, snapshot=snapshot)
        position, seq = history.foldable(keep_last)
        if seq <= watermark:
            return None
        folded = [e for e in log if e.seq <= seq]
        counters = MetricsFold.of(folded, history.folded_metrics).counters()
        text = history.snapshot(position, seq, counters)
        deleted = engine.store.compact(run_id, seq, text, token)
    return RunCompaction(
        run_id=run_id,
        steps_folded=position,
        events_deleted=deleted,
        watermark=seq,
        events_kept=len(log) - deleted,
    )
