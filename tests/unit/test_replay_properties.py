"""Properties of the replay core over random runs of completed steps.

For any sequence of steps that completed, the log the runtime would have written for them must
serve every step back with its recorded result, execute the step after the end, and refuse a
changed step at exactly the position where it changed (and nowhere before).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from durabl import codec, replay
from durabl.errors import NonDeterminismError
from durabl.steps import CtxValue, ModelCall, Sleep, Step, ToolCall

from .histories import RUN_ID, Log, recorded_result
from .strategies import PROPERTY_SETTINGS, json_values, steps, tool_args

completed_runs = st.lists(st.tuples(steps, json_values, st.booleans()), min_size=1, max_size=8)
"""(step, its result, whether a new process picked the run up right after it)."""


def log_of(run: list[tuple[Step, Any, bool]]) -> Log:
    log = Log()
    for position, (step, result, boundary) in enumerate(run, start=1):
        log.step_done(position, step, result)
        if boundary:
            log.resumed()
    return log


def mutated(step: Step, draw: st.DrawFn) -> Step:
    """The same kind of step with other arguments."""
    if isinstance(step, ToolCall):
        args = draw(tool_args.filter(lambda a: codec.encode(a) != step.args_text))
        return ToolCall(step.name, args, idempotency_key=step.idempotency_key)
    if isinstance(step, ModelCall):
        return ModelCall(step.prompt, **{**step.params, "__mutated__": draw(json_values)})
    if isinstance(step, Sleep):
        seconds = draw(st.floats(min_value=0, max_value=86400.0))
        assume(seconds != step.seconds)
        return Sleep(seconds)
    assert isinstance(step, CtxValue)
    return CtxValue(
        draw(st.sampled_from(["now", "random", "uuid"]).filter(lambda w: w != step.what))
    )


@PROPERTY_SETTINGS
@given(run=completed_runs, next_step=steps)
def test_every_completed_step_is_served_and_the_next_one_executes(
    run: list[tuple[Step, Any, bool]], next_step: Step
) -> None:
    history = log_of(run).history()
    for position, (step, result, _) in enumerate(run, start=1):
        action, rec = replay.decide(history, position, step)
        assert action == replay.SERVE
        assert rec is not None
        assert codec.decode(rec.result_text or "null") == recorded_result(step, result)
    assert replay.decide(history, len(run) + 1, next_step) == (replay.EXECUTE, None)
    replay.check_end(history, len(run))


@PROPERTY_SETTINGS
@given(run=completed_runs, data=st.data())
def test_a_changed_step_is_refused_at_exactly_its_position(
    run: list[tuple[Step, Any, bool]], data: st.DataObject
) -> None:
    history = log_of(run).history()
    changed_at = data.draw(st.integers(min_value=1, max_value=len(run)), label="changed_at")
    original = run[changed_at - 1][0]
    changed = mutated(original, data.draw)
    assert changed.fingerprint != original.fingerprint

    for position in range(1, changed_at):
        step = run[position - 1][0]
        assert replay.decide(history, position, step)[0] == replay.SERVE
    with pytest.raises(NonDeterminismError) as caught:
        replay.decide(history, changed_at, changed)
    err = caught.value
    assert (err.run_id, err.position, err.seq) == (
        RUN_ID,
        changed_at,
        history.steps[changed_at].first_seq,
    )
    assert changed.describe() in str(err)


@PROPERTY_SETTINGS
@given(run=completed_runs, returned_after=st.integers(min_value=0, max_value=7))
def test_returning_early_is_refused_naming_the_first_unclaimed_step(
    run: list[tuple[Step, Any, bool]], returned_after: int
) -> None:
    assume(returned_after < len(run))
    history = log_of(run).history()
    with pytest.raises(NonDeterminismError) as caught:
        replay.check_end(history, returned_after)
    assert caught.value.position == returned_after + 1
    assert "the end of the workflow" in str(caught.value)


@PROPERTY_SETTINGS
@given(run=completed_runs)
def test_folding_the_same_log_twice_gives_the_same_history(
    run: list[tuple[Step, Any, bool]],
) -> None:
    log = log_of(run)
    assert log.history() == log.history()
    assert log.history().completed_positions() == len(run)
