"""The drive: one pass of one run through its workflow, and how the pass ends.

It runs the workflow's generator with one send/throw loop. For each step yielded it asks the
replay decision (pure: ``replay.decide``) whether the log already holds the outcome; if so the
recorded result is sent back in, with no I/O; if not, the step goes to the executors. The pass
ends when the workflow returns or raises (the run completes or fails), a step parks it (a timer,
a dead letter, a shutdown), or the log disagrees with the code (the run is held).

The drive never touches the store: it writes through the journal it is handed and executes
through the function it is handed (both described below as protocols), so that it can be read,
and changed, as the loop alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from durabl import codec, crashpoints, events, replay
from durabl.context import Context
from durabl.errors import (
    BadStepError,
    DurablError,
    EncodingError,
    NonDeterminismError,
    StepFailed,
    not_a_step,
)
from durabl.flow import Hold, Park, Unwind
from durabl.replay import History, StepRecord
from durabl.states import Progress
from durabl.steps import (
    ContinueAsNew,
    CtxValue,
    PatchMarker,
    Sleep,
    Step,
    ToolCall,
    WaitSignal,
)
from durabl.workflow import Workflow

_CTX_STEPS = {what: CtxValue(what) for what in ("now", "random", "uuid")}

Decide = Callable[[History, int, Step], tuple[str, StepRecord | None]]
"""The replay decision (``replay.decide``, or a seam's override of it)."""


class Writes(Protocol):
    """What the drive asks of its journal (``durabl.journal.Journal``)."""

    run_id: str
    history: History
    progress: Progress
    status: str

    def append(
        self,
        new: list[tuple[str, str | None, str | None]],
        *,
        status: str | None = None,
        result_text: str | None = None,
        error: str | None = None,
        wake_at_s: float | None = ...,
        durable: bool = False,
    ) -> None: ...

    def set_status(self, status: str, error: str | None = None) -> None: ...


class Executes(Protocol):
    """Execute a step for real (``durabl.execute.execute``, bound to this pass)."""

    def __call__(
        self,
        step: Step,
        rec: StepRecord | None,
        action: str,
        draw: Callable[[], Any] | None = None,
    ) -> Any: ...


class Drive:
    """The state of one pass of one run through its workflow."""

    def __init__(
        self,
        wf: Workflow,
        input_text: str,
        journal: Writes,
        *,
        decide: Decide,
        execute: Executes,
        now: Callable[[], float],
        dry: bool,
        stopping: Callable[[], bool],
    ) -> None:
        self.wf = wf
        self.input_text = input_text
        self.journal = journal
        self.run_id = journal.run_id
        self.history = journal.history
        self.progress = journal.progress
        self.decide = decide
        self.execute = execute
        self.now = now
        self.dry = dry
        self.stopping = stopping
        self.dry_status = journal.status
        """What a dry replay concludes the run's status is (a dry pass writes nothing)."""
        self.hold: DurablError | None = None
        self.fatal: Exception | None = None
        self.next_step: str | None = None
        self.result: Any = None

    @property
    def replaying(self) -> bool:
        return self.dry or self.progress.position < self.history.last_position

    def run(self) -> None:
        """Run the generator with one send/throw loop until it finishes, parks or is held."""
        run_input = codec.decode(self.input_text)
        ctx = Context(self.run_id, self.wf.name, run_input, self, self.now)
        gen = self.wf.steps(ctx, **self.wf.bind(run_input))  # an async one's through an adapter
        send: Any = None
        throw: BaseException | None = None
        progress = self.progress
        try:
            while True:
                try:
                    yielded = gen.send(send) if throw is None else gen.throw(throw)
                except StopIteration as stop:
                    self._check_hold()
                    self._finish(stop.value)
                    return
                except Unwind:
                    self._check_hold()
                    if self.fatal is not None:
                        raise self.fatal from None
                    return
                except BadStepError as bad:
                    # A step the code cannot build is a bug to fix, not the run's failure.
                    raise Hold(bad.where(self.run_id, self.progress.position + 1)) from None
                except Exception as exc:
                    self._check_hold()
                    self._fail(exc)
                    return
                if self.hold is not None:  # _check_hold, inline: this runs at every step
                    raise Hold(self.hold)
                send, throw = None, None
                if type(yielded) is not ToolCall and (  # the step nearly every yield is
                    not isinstance(yielded, Step) or isinstance(yielded, CtxValue)
                ):
                    throw = not_a_step(workflow=self.wf.name, yielded=yielded)
                    continue
                progress.position += 1
                try:
                    send = self._step(yielded)
                except StepFailed as failed:
                    throw = failed
                finally:
                    progress.position += yielded.width - 1  # a Parallel's branches
        except Park:
            return
        except Hold as hold:
            self._hold(hold.error)
        finally:
            if self.wf.is_async:
                gen.close()  # the adapter closes the async generator and lets go of its loop

    def _check_hold(self) -> None:
        if self.hold is not None:
            raise Hold(self.hold)

    def _past_patches(self) -> bool:
        """Step over patch markers the code no longer asks for: a ``ctx.patched`` guard taken
        out once every run recorded before the change is finished leaves, in the runs that took
        the new branch, a marker where the code now yields the new branch's first step.
        Whether there was one."""
        steps = self.history.steps
        start = self.progress.position
        while (
            (rec := steps.get(self.progress.position)) is not None
            and rec.canonical is None  # a marker records no canonical text
            and replay.is_patch(rec)
        ):
            self.progress.position += 1
            self.progress.replayed += 1
        return self.progress.position != start

    def _step(self, step: Step) -> Any:
        """Serve the step from the log, throw its recorded failure, or execute it."""
        try:
            action, rec = self.decide(self.history, self.progress.position, step)
        except NonDeterminismError as exc:
            # A marker stands where no step does: the log disagrees there with every step but
            # its own, so markers are looked for only when it disagrees, not at every step.
            if not self._past_patches():
                raise Hold(exc) from None
            try:
                action, rec = self.decide(self.history, self.progress.position, step)
            except NonDeterminismError as again:
                raise Hold(again) from None
        if action == replay.SERVE and rec is not None:
            self.progress.replayed += step.width  # a Parallel served: its branches with it
            if crashpoints.hooks:  # ``reach``'s own test, without its call at every step served
                crashpoints.reach(crashpoints.DURING_REPLAY)
            if type(step) is ToolCall:  # nearly every step served: its result as recorded
                return codec.decode(rec.result_text or "null")
            if isinstance(step, ContinueAsNew):
                raise Park()  # the run went on as another: nothing after the yield runs here
            return step.served(codec.decode(rec.result_text or "null"))
        if action == replay.THROW and rec is not None and rec.failure is not None:
            self.progress.replayed += step.width
            raise StepFailed.from_record(rec.failure)
        if self.dry:
            self.next_step = step.describe()
            raise Park()
        if action == replay.DEAD or self.stopping():
            raise Park()  # dead-lettered, or the process is shutting down: leave it here
        if (
            action == replay.WAIT
            and not isinstance(step, Sleep | WaitSignal)  # these two look at their deadline
            and rec is not None
            and self.now() < (rec.wake_at_s or 0.0)
        ):
            self.journal.set_status(events.SLEEPING)  # a retry backoff that is not over yet
            raise Park()
        return self.execute(step, rec, action)

    def patched(self, patch_id: str) -> bool:
        """``ctx.patched``: True where the log records the patch here, or where the log ends
        (the run meets the change for the first time, which is recorded); False where the log
        holds another step here, recorded before the change, or the run has ended without one.
        Only True takes a position: the old branch's steps keep theirs. (The value recorded is
        the patch id, so that the log names the patch, not only its fingerprint.)"""
        marker = PatchMarker(patch_id)
        steps = self.history.steps
        position = self.progress.position + 1
        while (rec := steps.get(position)) is not None and (
            rec.fp != marker.fingerprint and replay.is_patch(rec)
        ):
            position += 1  # another patch's marker, whose guard was taken out
        if rec is not None:
            if rec.fp != marker.fingerprint:
                return False
            self.progress.replayed += position - self.progress.position
            self.progress.position = position
            return True
        if self.history.terminal is not None:
            return False
        self.progress.position = position
        if self.dry:
            return True  # what the run would take when it goes on; a dry pass writes nothing
        try:
            self.execute(marker, None, replay.EXECUTE, lambda: patch_id)
        except Unwind as unwind:
            self.fatal = unwind.fatal
            raise
        return True

    def ctx_value(self, what: str, draw: Callable[[], Any]) -> Any:
        """A ``ctx.now()``/``random()``/``uuid()`` value: from the log, or drawn and recorded."""
        self.progress.position += 1
        self._past_patches()
        step = _CTX_STEPS[what]
        try:
            action, rec = self.decide(self.history, self.progress.position, step)
        except NonDeterminismError as exc:
            self.hold = exc
            raise Unwind() from None
        if action == replay.SERVE and rec is not None:
            self.progress.replayed += 1
            return codec.decode(rec.result_text or "null")
        if self.dry:
            self.next_step = step.describe()
            raise Unwind()
        try:
            return self.execute(step, rec, action, draw)
        except Unwind as unwind:
            self.fatal = unwind.fatal
            raise

    # -- how a pass ends -------------------------------------------------------------------

    def _finish(self, value: Any) -> None:
        """The workflow returned: check the log agrees, then record the run's result."""
        history = self.history
        self.progress.position += 1  # past any marker after the last step, then back
        self._past_patches()
        self.progress.position -= 1
        try:
            replay.check_end(history, self.progress.position)
        except NonDeterminismError as exc:
            raise Hold(exc) from None
        try:
            text, self.result = codec.round_trip(
                value, what=lambda: f"the result of workflow {self.wf.name!r} (run {self.run_id})"
            )
        except EncodingError as exc:
            self._fail(exc)
            return
        self._check_recorded_end(text)
        if self.dry:
            if history.terminal == events.RUN_COMPLETED:
                self.dry_status = events.COMPLETED
            return
        if history.terminal is not None:
            return
        crashpoints.reach(crashpoints.BEFORE_RUN_COMPLETED)
        self.journal.append(
            [(events.RUN_COMPLETED, None, text)],
            status=events.COMPLETED,
            result_text=text,
            wake_at_s=None,
            durable=True,
        )

    def _check_recorded_end(self, text: str) -> None:
        """A run the log shows ended must end the same way now (only a replay gets here)."""
        history = self.history
        after = self.progress.position + 1
        if history.terminal == events.RUN_FAILED:
            expected = "the end of the workflow (RUN_FAILED)"
            raise Hold(
                replay.mismatch(history, after, expected, f"a return with the result {text}")
            )
        if history.terminal == events.RUN_COMPLETED and history.terminal_data != text:
            expected = f"the result {history.terminal_data}"
            raise Hold(replay.mismatch(history, after, expected, f"the result {text}"))

    def _fail(self, exc: Exception) -> None:
        """The workflow raised: fail the run, unless the log shows it did not raise here."""
        self.progress.position += 1  # past any patch marker the code no longer asks for
        self._past_patches()
        self.progress.position -= 1
        history, position = self.history, self.progress.position
        raised = f"an exception ({type(exc).__name__}: {exc})"
        if position < history.last_position:
            # The log goes on past this point, so the first execution did not raise here:
            # the code changed under the run. Failing it would destroy a healthy run.
            rec = history.steps[min(p for p in history.steps if p > position)]
            raise Hold(replay.mismatch(history, rec.position, replay.describe_record(rec), raised))
        if history.terminal in (events.RUN_COMPLETED, events.RUN_CANCELLED):
            # Only a dry replay re-runs a finished run: its code now raises where it returned.
            expected = f"the end of the workflow ({history.terminal})"
            raise Hold(replay.mismatch(history, position + 1, expected, raised))
        if self.dry:
            self.dry_status = events.FAILED
            return
        record = {"error_type": type(exc).__name__, "message": str(exc)}
        self.journal.append(
            [(events.RUN_FAILED, None, codec.encode(record))],
            status=events.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            wake_at_s=None,
            durable=True,
        )

    def _hold(self, error: DurablError) -> None:
        self.hold = error
        if not self.dry:
            self.journal.set_status(events.HELD, error=f"{type(error).__name__}: {error}")


__all__ = ["Decide", "Drive", "Executes", "Writes"]
