"""Hand-built run logs for the pure replay core: no database, no clock, no runtime.

``Log`` appends events the way the runtime would and numbers them 1..N, so a test reads as the
story of a run: ``Log().started(1, SEARCH).dispatched(1)`` is a search that left durabl and
never came back.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, events
from durabl.errors import StepFailed
from durabl.events import Event
from durabl.replay import History
from durabl.steps import CtxValue, ModelCall, Sleep, Step, ToolCall

RUN_ID = "run-7f3a"
WORKFLOW = "research_agent"
T0_S = 1_700_000_000.0


class Log:
    """A run's log under construction; every method appends events and returns the log."""

    def __init__(
        self, run_input: Any = None, *, watermark: int = 0, snapshot: str | None = None
    ) -> None:
        self.events: list[Event] = []
        self.watermark = watermark
        self.snapshot = snapshot
        if watermark == 0:
            started = {"workflow": WORKFLOW, "input": run_input if run_input is not None else {}}
            self.add(events.RUN_STARTED, 0, None, codec.encode(started))

    @property
    def last_seq(self) -> int:
        return self.events[-1].seq if self.events else self.watermark

    def add(self, kind: str, step: int = 0, fp: str | None = None, data: str | None = None) -> Log:
        seq = self.last_seq + 1
        self.events.append(Event(seq, kind, step, fp, data, T0_S + seq))
        return self

    def history(self, run_id: str = RUN_ID) -> History:
        return History.from_events(
            run_id, self.events, watermark=self.watermark, snapshot=self.snapshot
        )

    def compacted(self, keep_last: int = 0) -> Log:
        """The log as compaction leaves it: its resolved prefix folded into a snapshot."""
        history = self.history()
        position, seq = history.foldable(keep_last)
        assert seq > self.watermark, "nothing to fold"
        folded = Log(watermark=seq, snapshot=history.snapshot(position, seq, {}))
        folded.events = [e for e in self.events if e.seq > seq]
        return folded

    # -- one event each ---------------------------------------------------------------------

    def resumed(self) -> Log:
        return self.add(events.RUN_RESUMED, 0, None, codec.encode({"pid": 1, "replayed": 0}))

    def started(self, position: int, step: Step) -> Log:
        return self.add(events.STEP_STARTED, position, step.fingerprint, step.canonical)

    def dispatched(self, position: int, key: str | None = None) -> Log:
        data = None if key is None else codec.encode({"key": key})
        return self.add(events.TOOL_DISPATCHED, position, None, data)

    def completed(self, position: int, result: Any) -> Log:
        return self.add(events.STEP_COMPLETED, position, None, codec.encode(result))

    def tool_completed(self, position: int, step: ToolCall, result: Any) -> Log:
        """The one event of an IDEMPOTENT tool call with a derived key: its canonical text and
        its result in one pair."""
        data = codec.pair(step.canonical, codec.encode(result))
        return self.add(events.TOOL_COMPLETED, position, step.fingerprint, data)

    def failed(self, position: int, failure: StepFailed) -> Log:
        return self.add(events.STEP_FAILED, position, None, codec.encode(failure.to_record()))

    def retry(self, position: int, retry_at_s: float) -> Log:
        error = {"error_type": "TimeoutError", "message": "slow", "attempt": 1}
        return self.add(
            events.STEP_RETRY, position, None, codec.encode({**error, "retry_at_s": retry_at_s})
        )

    def armed(self, position: int, fire_at_s: float) -> Log:
        return self.add(events.TIMER_ARMED, position, None, codec.encode({"fire_at_s": fire_at_s}))

    def fired(self, position: int, fired_at_s: float) -> Log:
        return self.add(
            events.TIMER_FIRED, position, None, codec.encode({"fired_at_s": fired_at_s})
        )

    def ctx(self, position: int, what: str, value: Any) -> Log:
        return self.add(
            events.CTX_RECORDED, position, CtxValue(what).fingerprint, codec.encode(value)
        )

    def dead_lettered(self, position: int) -> Log:
        reason = {"reason": "died inside the ambiguous window", "key": None}
        return self.add(events.DEAD_LETTERED, position, None, codec.encode(reason))

    def redriven(self, position: int) -> Log:
        return self.add(events.DLQ_REDRIVEN, position)

    def resolved(self, position: int, result: Any) -> Log:
        return self.add(events.DLQ_RESOLVED, position).completed(position, result)

    def run_completed(self, result: Any) -> Log:
        return self.add(events.RUN_COMPLETED, 0, None, codec.encode(result))

    def run_failed(self, error_type: str, message: str) -> Log:
        record = {"error_type": error_type, "message": message}
        return self.add(events.RUN_FAILED, 0, None, codec.encode(record))

    # -- a whole step, as a successful first execution records it ---------------------------

    def step_done(self, position: int, step: Step, result: Any = None) -> Log:
        """The events the runtime writes for ``step`` when it succeeds first time."""
        if isinstance(step, CtxValue):
            return self.ctx(position, step.what, result)
        self.started(position, step)
        if isinstance(step, Sleep):
            fire_at_s = T0_S + step.seconds
            return self.armed(position, fire_at_s).fired(position, fire_at_s)
        if isinstance(step, ToolCall):
            self.dispatched(position, step.idempotency_key)
        return self.completed(position, result)


def recorded_result(step: Step, result: Any) -> Any:
    """What replay must hand back for ``step`` completed with ``result``."""
    if isinstance(step, Sleep):
        return None
    return codec.decode(codec.encode(result))


SEARCH = ToolCall("search", {"q": "sea otters"})
EMAIL = ToolCall("send_email", {"to": "a@b.c", "body": "hi"}, idempotency_key="summary-1")
PLAN = ModelCall("Make a research plan for sea otters", temperature=0)
NAP = Sleep(hours=1)
