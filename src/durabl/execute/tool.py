"""Executing a ``ToolCall``: idempotency keys, the ambiguous window, then the attempts.

A tool call is the one step whose effect leaves durabl. Its key (explicit, or derived from the
run and position) names the effect: once the side_effects table holds an outcome for the key,
no run calls the tool for it again. An AT_MOST_ONCE tool found dispatched with no outcome (a
process died in the window) is dead-lettered, never guessed about.
"""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events, replay
from durabl.errors import AmbiguousEffect, IdempotencyKeyConflict, ToolFailed, UnknownToolError
from durabl.execute.attempts import AttemptSpec, Dispatch, attempt, attempt_whole
from durabl.execute.base import StepCall
from durabl.flow import Hold, Park
from durabl.steps import ToolCall, derived_key
from durabl.store.base import KeyClaim, SideEffect
from durabl.tools import Tool, ToolMode


def execute(call: StepCall) -> Any:
    step = call.step
    assert isinstance(step, ToolCall)
    tool = _registered(call, step)
    explicit = step.idempotency_key is not None
    key = step.idempotency_key or derived_key(call.run_id, call.position)
    ambiguous = call.action == replay.AMBIGUOUS
    if explicit:
        effect = call.journal.store.side_effect(key)
        if effect is not None:
            return _complete_from_effect(call, step, key, effect)
        claim = call.journal.store.key_claim(key)
        if claim is not None and (claim.run_id, claim.step) != (call.run_id, call.position):
            _fail_on_key_conflict(call, step, key, claim.tool, claim.args_fp, claim.run_id)
            # Another run died inside this key's window: this run is in the same window,
            # unless an operator has redriven this step and accepted the risk.
            ambiguous = not (call.rec is not None and call.rec.redriven)
    if ambiguous and tool.mode is ToolMode.AT_MOST_ONCE:
        _dead_letter(call, step, key if explicit else None)
    args = step.args  # a new dict at every read: the key can go into it
    if tool.wants_key:
        args["idempotency_key"] = key
    claim = (
        KeyClaim(
            key=key,
            run_id=call.run_id,
            step=call.position,
            tool=step.name,
            args_fp=step.fingerprint,
        )
        if explicit
        else None
    )
    if not explicit and call.rec is None and tool.mode is ToolMode.IDEMPOTENT:
        return attempt_whole(call, tool, args, key, lambda: _spec(call, tool, args, key, None))
    return attempt(call, _spec(call, tool, args, key, claim))


def _spec(
    call: StepCall, tool: Tool, args: dict[str, Any], key: str, claim: KeyClaim | None
) -> AttemptSpec:
    call_tool = call.services.call_tool
    return AttemptSpec(
        name=tool.name,  # the name it is registered under, which the step names
        call=lambda: call_tool(tool, args),
        policy=call.services.policy(tool),
        returned=crashpoints.AFTER_TOOL_RETURNED,
        failure=ToolFailed,
        dispatch=Dispatch(key, claim, at_most_once=tool.mode is ToolMode.AT_MOST_ONCE),
    )


def _registered(call: StepCall, step: ToolCall) -> Tool:
    tools = call.services.tools
    tool = tools.get(step.name)
    if tool is None:
        raise Hold(
            UnknownToolError(
                run_id=call.run_id, position=call.position, tool=step.name, registered=tools
            )
        )
    return tool


def _complete_from_effect(call: StepCall, step: ToolCall, key: str, effect: SideEffect) -> Any:
    """Another step already did this key's effect: record its outcome, call nothing."""
    _fail_on_key_conflict(call, step, key, effect.tool, effect.args_fp, effect.run_id)
    journal = call.journal
    started = journal.started(step)
    if effect.error is not None or effect.result_text is None:
        err = ToolFailed(step.name, "RecordedFailure", effect.error or "no result recorded")
        journal.append(
            [*started, (events.STEP_FAILED, None, codec.encode(err.to_record()))],
            release_claim=key,
            wake_at_s=None,
            durable=True,
        )
        call.executed()
        raise err
    journal.append(
        [*started, (events.STEP_COMPLETED, None, effect.result_text)],
        release_claim=key,
        wake_at_s=None,
        durable=True,
    )
    call.executed()
    return codec.decode(effect.result_text)


def _fail_on_key_conflict(
    call: StepCall, step: ToolCall, key: str, tool: str, args_fp: str, other_run: str
) -> None:
    """If ``key`` was first used for another tool or other arguments, record this step's
    failure and raise it: one key names one effect."""
    if tool == step.name and args_fp == step.fingerprint:
        return
    conflict = IdempotencyKeyConflict(
        key=key,
        first_run_id=other_run,
        first_tool=tool,
        run_id=call.run_id,
        position=call.position,
        step=step.describe(),
    )
    err = ToolFailed(step.name, "IdempotencyKeyConflict", str(conflict))
    journal = call.journal
    journal.append(
        [*journal.started(step), (events.STEP_FAILED, None, codec.encode(err.to_record()))],
        durable=True,
    )
    call.executed()
    raise err


def _dead_letter(call: StepCall, step: ToolCall, key: str | None) -> None:
    """Stop the run on an AT_MOST_ONCE step that may or may not have run."""
    reason = str(AmbiguousEffect(step=step.describe()))
    data = {
        "reason": reason,
        "step": step.describe(),
        "tool": step.name,
        "fp": step.fingerprint,
        "key": key,
    }
    journal = call.journal
    journal.append(
        [*journal.started(step), (events.DEAD_LETTERED, None, codec.encode(data))],
        status=events.DEAD_LETTERED,
        error=reason,
        durable=True,
    )
    crashpoints.reach(crashpoints.AFTER_DEAD_LETTERED)
    raise Park()
