"""The retry loop of model and tool steps, in one place.

An attempt opens with STEP_STARTED and, for a tool, TOOL_DISPATCHED; then control leaves durabl.
What comes back is recorded in one transaction: STEP_COMPLETED with the tool's side_effects row,
STEP_RETRY with the time of the next attempt, or STEP_FAILED once the policy gives up.

When the opening is committed is decided by what a crash during the call must leave behind:

- an AT_MOST_ONCE tool, or a tool holding an explicit key's claim: before the call, in one
  transaction (durable for AT_MOST_ONCE), because a crash inside the call must be recognised
  as ambiguous, and other runs holding the key must see the claim;
- a model call: before the call, without an fsync, so that a re-execution after a crash is
  counted (its tokens are spent twice);
- an IDEMPOTENT tool with a derived key: in the same transaction as the outcome. A crash
  during the call then leaves nothing, and the call is made again, which is what IDEMPOTENT
  promises anyway; the step costs one commit instead of three. When the outcome is a result,
  the opening and the result are one TOOL_COMPLETED event instead of three events.

``attempt_whole`` makes the first attempt of such a tool, the step nearly every run is made of,
without the spec, dispatch and opening the loop builds; the loop takes over if it raises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from durabl import codec, crashpoints, events
from durabl.errors import EncodingError, StepFailed
from durabl.execute.base import StepCall
from durabl.flow import Hold, Park
from durabl.journal import KEEP, NewEvent
from durabl.store.base import KeyClaim, SideEffect
from durabl.tools import RetryPolicy, Tool


@dataclass(slots=True)
class Dispatch:
    """A tool call: control leaves durabl, so TOOL_DISPATCHED is written before it, and its
    outcome is recorded under ``key`` in the side_effects table."""

    key: str
    claim: KeyClaim | None
    """The claim on an explicit key while the call is out; None for a derived key."""
    at_most_once: bool


@dataclass(slots=True)
class AttemptSpec:
    """How to attempt one model or tool step."""

    name: str
    """The name its failure carries: "ModelCall", or the tool's name."""
    call: Callable[[], Any]
    policy: RetryPolicy
    returned: str
    """The crash point right after control comes back."""
    failure: type[StepFailed]
    dispatch: Dispatch | None = None


@dataclass(slots=True)
class Opening:
    """The part of an attempt's opening not committed yet: it goes first into the attempt's
    closing commit. ``disarm``: the attempt was brought here by a retry timer, which the
    closing commit clears."""

    started: list[NewEvent]
    disarm: bool
    dispatched_key: str | None = None
    """The key of a TOOL_DISPATCHED that follows ``started``, set for the opening of an
    IDEMPOTENT tool with a derived key. Its event is made only if a closing commit writes the
    opening out (a failed attempt), never for a result, which closes such an opening as one
    TOOL_COMPLETED event (see ``whole``)."""

    @property
    def whole(self) -> bool:
        """A result closes this opening as one TOOL_COMPLETED event, which stands for the
        opening and the result together."""
        return self.dispatched_key is not None

    @property
    def events(self) -> list[NewEvent]:
        """The opening's events, as the closing commit writes them first."""
        key = self.dispatched_key
        if key is None:
            return self.started
        return [*self.started, (events.TOOL_DISPATCHED, None, dispatched_data(key))]

    def wake(self, wake_at_s: float | None) -> float | None:
        """The closing commit's timer: its own, else cleared if this attempt disarms one."""
        return None if self.disarm and wake_at_s == KEEP else wake_at_s


WRITTEN = Opening([], disarm=False)
"""An opening already committed: the closing commit adds nothing to it."""


def attempt(call: StepCall, spec: AttemptSpec, *, number: int | None = None) -> Any:
    """Attempt the step until it succeeds, fails for good, or parks on a backoff timer.
    ``number``: the attempt to begin with, when an earlier one was made outside this loop
    (``attempt_whole``); by default the one after the attempts the log records."""
    rec = call.rec
    retry_pending = False
    if number is None:
        number = (rec.retries if rec is not None else 0) + 1
        retry_pending = rec is not None and rec.wake_at_s is not None
    while True:
        opening = _begin(call, spec, retry_pending)
        retry_pending = False
        try:
            value = spec.call()
        except (Hold, Park):
            raise  # the step cannot be attempted as it is (a tool a ModelCall names is missing)
        except Exception as exc:
            _failed(call, spec, exc, number, opening)
            number += 1
            continue
        crashpoints.reach(spec.returned)
        return _complete(call, spec, value, number, opening)


def attempt_whole(
    call: StepCall,
    tool: Tool,
    args: dict[str, Any],
    key: str,
    spec_of: Callable[[], AttemptSpec],
) -> Any:
    """``attempt`` for the step nearly every run is made of: the first attempt of an
    IDEMPOTENT tool with a derived key, which writes nothing before the call and closes as one
    TOOL_COMPLETED event. It passes the same crash points and writes the same commit as the
    loop, without the spec, the dispatch and the opening the loop builds for every attempt:
    ``spec_of`` makes the spec only if the call raises or its result cannot be recorded, and
    the loop takes over from there."""
    if crashpoints.hooks:  # the three points before the call, passed as the loop does
        crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
        crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
        crashpoints.reach(crashpoints.AFTER_TOOL_DISPATCHED)
    try:
        value = call.services.call_tool(tool, args)
    except (Hold, Park):
        raise
    except Exception as exc:
        spec = spec_of()
        _failed(call, spec, exc, 1, _whole_opening(call, key))
        return attempt(call, spec, number=2)
    if crashpoints.hooks:
        crashpoints.reach(crashpoints.AFTER_TOOL_RETURNED)
    try:
        text, value = codec.round_trip(value)
    except EncodingError:  # the loop's completion records why, and the key as spent
        return _complete(call, spec_of(), value, 1, _whole_opening(call, key))
    data = _completion_data(call, text)
    call.journal.append_tool_result(call.step.fingerprint, data, key, tool.name, text, call.now())
    if crashpoints.hooks:
        crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
    call.executed()
    return value


def _whole_opening(call: StepCall, key: str) -> Opening:
    """The opening ``_begin`` makes for the first attempt of an IDEMPOTENT tool with a derived
    key."""
    step = call.step
    started: list[NewEvent] = [(events.STEP_STARTED, step.fingerprint, step.canonical)]
    return Opening(started, disarm=False, dispatched_key=key)


def _failed(
    call: StepCall, spec: AttemptSpec, exc: Exception, number: int, opening: Opening
) -> None:
    """Attempt ``number`` raised ``exc``: record the retry (parking the run if it is later), or
    once the policy gives up, the step's failure, which is raised."""
    crashpoints.reach(spec.returned)
    if number < spec.policy.max_attempts:
        error = {"error_type": type(exc).__name__, "message": str(exc), "attempt": number}
        delay_s = max(spec.policy.delay_s(number), retry_after_s(exc))
        schedule_retry(call, error, delay_s, opening)
        return
    err = spec.failure(spec.name, type(exc).__name__, str(exc), number)
    # An exception from an AT_MOST_ONCE tool does not prove nothing happened: the key is
    # spent, so no other run holding it calls the tool again.
    at_most_once = spec.dispatch is not None and spec.dispatch.at_most_once
    record_failure(call, err, spec.dispatch, opening, effect_happened=at_most_once)
    raise err from None


MAX_RETRY_AFTER_S = 3600.0
"""The longest wait a server's Retry-After is followed for."""


def retry_after_s(exc: BaseException) -> float:
    """How long the failed call's server asked to be left alone: the error's ``retry_after_s``,
    or the Retry-After header (seconds) of the HTTP response it carries, as the providers'
    clients' errors do (a 429 or a 503). 0 when it asked nothing."""
    value: Any = getattr(exc, "retry_after_s", None)
    if value is None:
        headers = getattr(getattr(exc, "response", None), "headers", None)
        getter = getattr(headers, "get", None)
        value = getter("retry-after") if callable(getter) else None
    try:
        seconds = float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        return 0.0  # an HTTP date, or nonsense: the policy's own delay stands
    if not math.isfinite(seconds):
        return 0.0
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _begin(call: StepCall, spec: AttemptSpec, retry_pending: bool) -> Opening:
    """Open the attempt: STEP_STARTED, and for a tool TOOL_DISPATCHED (past it, a crash is
    ambiguous). Commits them now when a crash during the call must find them (see the module
    docstring); otherwise returns them for the closing commit."""
    crashpoints.reach(crashpoints.BEFORE_STEP_STARTED)
    started: list[NewEvent] = [(events.STEP_STARTED, call.step.fingerprint, call.step.canonical)]
    wake_at_s = None if retry_pending else KEEP
    dispatch = spec.dispatch
    journal = call.journal
    if dispatch is None:
        journal.append(started, wake_at_s=wake_at_s)
        crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
        return WRITTEN
    crashpoints.reach(crashpoints.AFTER_STEP_STARTED)
    if not dispatch.at_most_once and dispatch.claim is None:
        crashpoints.reach(crashpoints.AFTER_TOOL_DISPATCHED)
        return Opening(started, disarm=retry_pending, dispatched_key=dispatch.key)
    opening = [*started, (events.TOOL_DISPATCHED, None, dispatched_data(dispatch.key))]
    journal.append(
        opening, claim=dispatch.claim, wake_at_s=wake_at_s, durable=dispatch.at_most_once
    )
    crashpoints.reach(crashpoints.AFTER_TOOL_DISPATCHED)
    return WRITTEN


def dispatched_data(key: str) -> str:
    """A TOOL_DISPATCHED event's data: the key the call was dispatched under."""
    return f'{{"key":{codec.encode_str(key)}}}'


def _complete(call: StepCall, spec: AttemptSpec, value: Any, attempt: int, opening: Opening) -> Any:
    """Record the result, and a tool's side_effects row with it, in one durable transaction."""
    dispatch = spec.dispatch
    try:
        text, value = codec.round_trip(value)
    except EncodingError as exc:  # named here, not by a function made at every step
        what = f"the result of {call.step.describe()} (run {call.run_id} step {call.position})"
        named = EncodingError(what=what, reason=exc.reason)
        err = spec.failure(spec.name, "EncodingError", str(named), attempt)
        record_failure(call, err, dispatch, opening, effect_happened=dispatch is not None)
        raise err from None
    effect = None
    if dispatch is not None:
        effect = _effect(call, dispatch.key, spec.name, result_text=text)
    recorded: list[NewEvent]
    if opening.whole:
        recorded = [_tool_completed(call, text)]
    else:
        recorded = [*opening.events, (events.STEP_COMPLETED, None, text)]
    call.journal.append(
        recorded,
        side_effect=effect,
        release_claim=_claimed_key(dispatch),
        wake_at_s=opening.wake(KEEP),
        durable=True,
    )
    crashpoints.reach(crashpoints.AFTER_STEP_COMMITTED)
    call.executed()
    return value


def _tool_completed(call: StepCall, result_text: str) -> NewEvent:
    """The one event that records an IDEMPOTENT tool's opening and its result together."""
    return (events.TOOL_COMPLETED, call.step.fingerprint, _completion_data(call, result_text))


def _completion_data(call: StepCall, result_text: str) -> str:
    """A TOOL_COMPLETED's data: the step's canonical text and its result, as one pair."""
    return codec.pair(call.step.canonical, result_text)


def schedule_retry(
    call: StepCall, error: dict[str, Any], delay_s: float, opening: Opening = WRITTEN
) -> None:
    """Record a failed attempt and when the next begins; park until then if that is later.
    An explicit key's claim is kept: until the step ends, another run holding the key is inside
    the same window."""
    retry_at_s = call.now() + delay_s
    call.journal.append(
        [
            *opening.events,
            (events.STEP_RETRY, None, codec.encode({**error, "retry_at_s": retry_at_s})),
        ],
        status=events.SLEEPING if delay_s > 0 else events.RUNNING,
        wake_at_s=opening.wake(retry_at_s if delay_s > 0 else KEEP),
        durable=delay_s > 0,
    )
    crashpoints.reach(crashpoints.AFTER_RETRY_SCHEDULED)
    if delay_s > 0:
        raise Park()


def record_failure(
    call: StepCall,
    err: StepFailed,
    dispatch: Dispatch | None,
    opening: Opening = WRITTEN,
    *,
    effect_happened: bool,
) -> None:
    """Record a step's final failure. If the effect may have happened (the tool returned a
    result durabl cannot record, or an AT_MOST_ONCE tool raised), its key is spent: the
    side_effects row records the failure."""
    effect = None
    if effect_happened and dispatch is not None:
        effect = _effect(call, dispatch.key, err.step_name, error=str(err))
    call.journal.append(
        [*opening.events, (events.STEP_FAILED, None, codec.encode(err.to_record()))],
        side_effect=effect,
        release_claim=_claimed_key(dispatch),
        wake_at_s=None,
        durable=True,
    )
    call.executed()


def _effect(
    call: StepCall,
    key: str,
    tool: str,
    *,
    result_text: str | None = None,
    error: str | None = None,
) -> SideEffect:
    return SideEffect(
        key=key,
        run_id=call.run_id,
        step=call.position,
        tool=tool,
        args_fp=call.step.fingerprint,
        result_text=result_text,
        error=None if error is None else codec.storable(error),
        at_s=call.now(),
    )


def _claimed_key(dispatch: Dispatch | None) -> str | None:
    return dispatch.key if dispatch is not None and dispatch.claim is not None else None
