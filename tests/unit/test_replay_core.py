"""The pure replay core against hand-built histories: fold a log, decide what a step needs.

Every test builds the log a run would have written, folds it with ``History.from_events`` and
asks ``replay.decide`` (or ``replay.check_end``) about the step the workflow yields next. No
database, no clock, no runtime.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from durabl import codec, events, replay
from durabl.errors import NonDeterminismError, StepFailed, ToolFailed
from durabl.replay import History
from durabl.steps import CtxValue, ModelCall, Sleep, Step, ToolCall

from .histories import EMAIL, NAP, PLAN, RUN_ID, SEARCH, T0_S, WORKFLOW, Log


def action_of(history: History, position: int, step: Step) -> str:
    action, _ = replay.decide(history, position, step)
    return action


def result_served(history: History, position: int, step: Step) -> object:
    action, rec = replay.decide(history, position, step)
    assert action == replay.SERVE
    assert rec is not None
    return codec.decode(rec.result_text or "null")


def assert_names_the_divergence(
    err: NonDeterminismError, *, seq: int, position: int, expected: str, actual: str
) -> None:
    text = str(err)
    assert (err.run_id, err.seq, err.position) == (RUN_ID, seq, position)
    assert RUN_ID in text
    assert f"seq {seq}" in text
    assert f"step {position}" in text
    assert expected in text
    assert actual in text
    assert "not deterministic" in text
    assert "code changed" in text


# -- folding ---------------------------------------------------------------------------------


class TestFold:
    def test_run_started_records_the_workflow_and_its_input(self) -> None:
        history = Log({"topic": "sea otters"}).history()
        assert history.run_id == RUN_ID
        assert history.workflow == WORKFLOW
        assert codec.decode(history.input_text or "") == {"topic": "sea otters"}
        assert history.steps == {}
        assert history.last_seq == 1
        assert history.terminal is None

    def test_a_completed_tool_step_is_one_record_with_its_result(self) -> None:
        history = Log().step_done(1, SEARCH, ["otter facts"]).history()
        rec = history.steps[1]
        assert rec.fp == SEARCH.fingerprint
        assert rec.canonical == SEARCH.canonical
        assert rec.first_seq == 2
        assert rec.last_seq == rec.done_seq == 4
        assert (rec.attempts, rec.dispatched, rec.done) == (1, True, True)
        assert codec.decode(rec.result_text or "") == ["otter facts"]
        assert history.last_seq == 4
        assert history.last_position == 1
        assert history.completed_positions() == 1

    def test_attempts_and_retries_are_counted_and_the_first_canonical_kept(self) -> None:
        log = Log().started(1, SEARCH).dispatched(1).retry(1, T0_S + 60)
        history = log.started(1, SEARCH).dispatched(1).history()
        rec = history.steps[1]
        assert (rec.attempts, rec.retries) == (2, 1)
        assert rec.dispatched is True
        assert rec.wake_at_s is None
        assert rec.canonical == SEARCH.canonical
        assert rec.first_seq == 2

    def test_a_retry_clears_the_dispatch_and_sets_the_wake_time(self) -> None:
        rec = Log().started(1, SEARCH).dispatched(1).retry(1, T0_S + 30).history().steps[1]
        assert rec.dispatched is False
        assert rec.wake_at_s == T0_S + 30

    def test_process_boundaries_are_remembered_by_seq(self) -> None:
        log = Log().step_done(1, SEARCH, 1).resumed().step_done(2, PLAN, 2).resumed()
        history = log.history()
        assert history.resumed_at == [5, 8]
        assert sorted(history.steps) == [1, 2]

    def test_a_terminal_event_is_recorded_with_its_data(self) -> None:
        history = Log().step_done(1, SEARCH, 1).run_completed({"ok": True}).history()
        assert history.terminal == events.RUN_COMPLETED
        assert codec.decode(history.terminal_data or "") == {"ok": True}
        failed = Log().run_failed("ValueError", "bad").history()
        assert failed.terminal == events.RUN_FAILED

    def test_the_watermark_is_where_a_compacted_log_resumes_numbering(self) -> None:
        log = Log().step_done(1, PLAN, {"queries": ["a"]}).step_done(2, SEARCH, "x").compacted()
        assert log.events == []
        assert log.history().last_seq == log.watermark
        history = log.step_done(3, SEARCH, "y").history()
        assert history.steps[3].first_seq == log.watermark + 1
        assert history.last_seq == log.watermark + 3
        assert [history.steps[p].done for p in (1, 2, 3)] == [True, True, True]

    def test_a_compacted_prefix_decides_exactly_as_its_log_did(self) -> None:
        log = Log().step_done(1, PLAN, {"queries": ["a"]}).step_done(2, SEARCH, [1, 2])
        log = log.started(3, SEARCH).dispatched(3)
        whole, folded = log.history(), log.compacted().history()
        for position, step in ((1, PLAN), (2, SEARCH), (3, SEARCH)):
            action, rec = replay.decide(whole, position, step)
            assert rec is not None
            assert replay.decide(folded, position, step)[0] == action
            assert folded.steps[position].result_text == rec.result_text
        with pytest.raises(NonDeterminismError) as whole_error:
            replay.decide(whole, 2, PLAN)
        with pytest.raises(NonDeterminismError) as folded_error:
            replay.decide(folded, 2, PLAN)
        assert folded_error.value.position == whole_error.value.position == 2

    def test_folding_is_deterministic(self) -> None:
        log = Log().step_done(1, SEARCH, [1, 2]).started(2, NAP).armed(2, T0_S + 3600)
        assert log.history() == log.history()

    def test_folding_one_event_at_a_time_equals_folding_the_log(self) -> None:
        log = Log().step_done(1, PLAN, {"queries": ["a"]}).started(2, SEARCH).dispatched(2)
        incremental = History(RUN_ID)
        for event in log.events:
            incremental.apply(event)
        assert incremental == log.history()


# -- deciding --------------------------------------------------------------------------------


class TestDecide:
    def test_an_empty_log_executes_the_first_step(self) -> None:
        assert replay.decide(Log().history(), 1, SEARCH) == (replay.EXECUTE, None)

    def test_the_step_after_the_end_of_the_log_executes(self) -> None:
        history = Log().step_done(1, SEARCH, "r").history()
        assert replay.decide(history, 2, PLAN) == (replay.EXECUTE, None)

    @pytest.mark.parametrize(
        ("step", "result"),
        [
            (SEARCH, {"hits": ["otters hold hands"]}),
            (EMAIL, "sent"),
            (PLAN, {"queries": ["a", "b"], "tokens": 12}),
            (ToolCall("noop"), None),
        ],
        ids=["tool", "tool-with-key", "model", "null-result"],
    )
    def test_a_completed_step_is_served_with_its_recorded_result(
        self, step: Step, result: object
    ) -> None:
        history = Log().step_done(1, step, result).history()
        assert result_served(history, 1, step) == result

    def test_step_started_alone_restarts_a_tool(self) -> None:
        history = Log().started(1, SEARCH).history()
        action, rec = replay.decide(history, 1, SEARCH)
        assert action == replay.RESTART
        assert rec is history.steps[1]

    def test_step_started_alone_restarts_a_model_call(self) -> None:
        assert action_of(Log().started(1, PLAN).history(), 1, PLAN) == replay.RESTART

    def test_dispatched_without_an_outcome_is_ambiguous(self) -> None:
        history = Log().started(1, SEARCH).dispatched(1).history()
        assert action_of(history, 1, SEARCH) == replay.AMBIGUOUS

    def test_dispatched_with_an_explicit_key_is_ambiguous_too(self) -> None:
        history = Log().started(1, EMAIL).dispatched(1, "summary-1").history()
        assert action_of(history, 1, EMAIL) == replay.AMBIGUOUS

    def test_a_retry_with_a_retry_time_waits_until_then(self) -> None:
        history = Log().started(1, SEARCH).dispatched(1).retry(1, T0_S + 90).history()
        action, rec = replay.decide(history, 1, SEARCH)
        assert action == replay.WAIT
        assert rec is not None and rec.wake_at_s == T0_S + 90

    def test_the_attempt_after_a_retry_restarts_then_becomes_ambiguous(self) -> None:
        log = Log().started(1, SEARCH).dispatched(1).retry(1, T0_S + 90).started(1, SEARCH)
        assert action_of(log.history(), 1, SEARCH) == replay.RESTART
        assert action_of(log.dispatched(1).history(), 1, SEARCH) == replay.AMBIGUOUS

    def test_a_dead_lettered_step_is_dead(self) -> None:
        history = Log().started(1, EMAIL).dispatched(1).dead_lettered(1).history()
        assert action_of(history, 1, EMAIL) == replay.DEAD

    def test_a_redriven_dead_letter_restarts(self) -> None:
        log = Log().started(1, EMAIL).dispatched(1).dead_lettered(1).redriven(1)
        assert action_of(log.history(), 1, EMAIL) == replay.RESTART

    def test_a_redriven_step_that_is_dispatched_again_is_ambiguous_again(self) -> None:
        log = Log().started(1, EMAIL).dispatched(1).dead_lettered(1).redriven(1)
        log.started(1, EMAIL).dispatched(1)
        assert action_of(log.history(), 1, EMAIL) == replay.AMBIGUOUS

    def test_a_resolved_dead_letter_serves_the_operators_result(self) -> None:
        log = Log().started(1, EMAIL).dispatched(1).dead_lettered(1).resolved(1, "checked: sent")
        assert result_served(log.history(), 1, EMAIL) == "checked: sent"

    def test_an_armed_timer_waits_for_its_deadline(self) -> None:
        history = Log().started(1, NAP).armed(1, T0_S + 3600).history()
        action, rec = replay.decide(history, 1, NAP)
        assert action == replay.WAIT
        assert rec is not None and rec.wake_at_s == T0_S + 3600

    def test_a_fired_timer_serves_none(self) -> None:
        log = Log().started(1, NAP).armed(1, T0_S + 3600).fired(1, T0_S + 3600)
        action, rec = replay.decide(log.history(), 1, NAP)
        assert action == replay.SERVE
        assert rec is not None and rec.result_text == "null"
        assert rec.wake_at_s is None

    def test_a_step_failed_for_good_is_thrown_with_its_recorded_failure(self) -> None:
        failure = ToolFailed("search", "TimeoutError", "no answer in 30 s", attempts=3)
        history = Log().started(1, SEARCH).dispatched(1).failed(1, failure).history()
        action, rec = replay.decide(history, 1, SEARCH)
        assert action == replay.THROW
        assert rec is not None and rec.failure is not None
        rebuilt = StepFailed.from_record(rec.failure)
        assert isinstance(rebuilt, ToolFailed)
        assert (rebuilt.tool, rebuilt.error_type, rebuilt.message, rebuilt.attempts) == (
            "search",
            "TimeoutError",
            "no answer in 30 s",
            3,
        )

    def test_a_recorded_ctx_value_is_served(self) -> None:
        history = Log().ctx(1, "now", T0_S).ctx(2, "uuid", "4a0c").history()
        assert result_served(history, 1, CtxValue("now")) == T0_S
        assert result_served(history, 2, CtxValue("uuid")) == "4a0c"

    def test_the_same_tool_args_in_another_dict_order_are_the_same_step(self) -> None:
        recorded = ToolCall("search", {"q": "otters", "limit": 5})
        history = Log().step_done(1, recorded, "hits").history()
        assert result_served(history, 1, ToolCall("search", {"limit": 5, "q": "otters"})) == "hits"

    def test_process_boundaries_do_not_change_what_is_served(self) -> None:
        log = Log().step_done(1, SEARCH, "a").resumed().step_done(2, PLAN, "b").resumed()
        history = log.history()
        assert result_served(history, 1, SEARCH) == "a"
        assert result_served(history, 2, PLAN) == "b"
        assert action_of(history, 3, NAP) == replay.EXECUTE

    def test_deciding_changes_nothing(self) -> None:
        history = Log().step_done(1, SEARCH, "a").started(2, EMAIL).dispatched(2).history()
        before = repr(history)
        for _ in range(2):
            assert action_of(history, 1, SEARCH) == replay.SERVE
            assert action_of(history, 2, EMAIL) == replay.AMBIGUOUS
            assert action_of(history, 3, NAP) == replay.EXECUTE
        assert repr(history) == before

    def test_a_tool_completed_pair_is_served_and_reads_as_its_two_halves(self) -> None:
        # The pair is split by whichever comes first: the step replay meets, or a reader.
        hits = {"hits": ["a", "b"], "note": '],"x":[1'}
        served = Log().tool_completed(1, SEARCH, hits).history()
        assert result_served(served, 1, SEARCH) == hits
        read = Log().tool_completed(1, SEARCH, hits).history()
        rec = read.steps[1]
        assert rec.canonical == SEARCH.canonical
        assert codec.decode(rec.result_text or "") == hits
        assert (rec.attempts, rec.dispatched, rec.done) == (1, False, True)
        assert result_served(read, 1, SEARCH) == hits

    def test_a_step_whose_text_begins_the_recorded_one_is_not_taken_for_it(self) -> None:
        # ["tool","search",{"q":"sea"},null] is no prefix of the recorded text, but a step
        # could begin like a longer one: only a whole canonical text and its comma match.
        recorded = ToolCall("search", {"q": "sea otters"})
        history = Log().tool_completed(1, recorded, "hits").history()
        for drifted in (ToolCall("search", {"q": "sea"}), ToolCall("search")):
            with pytest.raises(NonDeterminismError) as caught:
                replay.decide(history, 1, drifted)
            assert recorded.describe() in str(caught.value)
            assert drifted.describe() in str(caught.value)
        assert history.steps[1].canonical == recorded.canonical

    def test_a_completed_step_inside_a_terminal_log_is_still_served(self) -> None:
        history = Log().step_done(1, SEARCH, "a").run_completed("done").history()
        assert result_served(history, 1, SEARCH) == "a"


# -- non-determinism -------------------------------------------------------------------------


class TestNonDeterminism:
    def test_other_tool_arguments_at_a_position_name_run_seq_expected_and_actual(self) -> None:
        history = Log().step_done(1, PLAN, "plan").step_done(2, SEARCH, "hits").history()
        drifted = ToolCall("search", {"q": "sea lions"})
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 2, drifted)
        assert_names_the_divergence(
            caught.value,
            seq=history.steps[2].first_seq,
            position=2,
            expected='ToolCall(\'search\', {"q":"sea otters"})',
            actual='ToolCall(\'search\', {"q":"sea lions"})',
        )

    def test_another_kind_of_step_at_a_position_is_refused(self) -> None:
        history = Log().step_done(1, SEARCH, "hits").history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, Sleep(5))
        assert_names_the_divergence(
            caught.value, seq=2, position=1, expected="ToolCall('search'", actual="Sleep(5 s)"
        )

    def test_another_model_prompt_is_refused(self) -> None:
        history = Log().step_done(1, PLAN, "plan").history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, ModelCall("Make a research plan for sea lions"))
        assert "sea otters" in str(caught.value)
        assert "sea lions" in str(caught.value)

    def test_another_model_parameter_is_refused(self) -> None:
        history = Log().step_done(1, PLAN, "plan").history()
        with pytest.raises(NonDeterminismError):
            replay.decide(history, 1, ModelCall("Make a research plan for sea otters"))

    def test_another_idempotency_key_is_refused(self) -> None:
        history = Log().step_done(1, EMAIL, "sent").history()
        rekeyed = ToolCall("send_email", {"to": "a@b.c", "body": "hi"}, idempotency_key="other")
        with pytest.raises(NonDeterminismError):
            replay.decide(history, 1, rekeyed)

    def test_another_sleep_duration_is_refused(self) -> None:
        history = Log().step_done(1, NAP).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, Sleep(hours=2))
        assert "Sleep(3600 s)" in str(caught.value)
        assert "Sleep(7200 s)" in str(caught.value)

    def test_two_long_sleeps_that_differ_are_told_apart_in_the_message(self) -> None:
        recorded, yielded = Sleep(days=14), Sleep(days=14, seconds=1)
        history = Log().step_done(1, recorded).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, yielded)
        assert caught.value.expected != caught.value.actual

    def test_a_step_where_a_ctx_value_was_recorded_names_the_ctx_call(self) -> None:
        history = Log().ctx(1, "now", T0_S).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, SEARCH)
        assert_names_the_divergence(
            caught.value, seq=2, position=1, expected="ctx.now()", actual="ToolCall('search'"
        )

    def test_a_different_ctx_read_is_refused(self) -> None:
        history = Log().ctx(1, "random", 0.25).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, CtxValue("uuid"))
        assert "ctx.random()" in str(caught.value)
        assert "ctx.uuid()" in str(caught.value)

    @pytest.mark.parametrize(
        "build",
        [
            lambda log: log.started(1, SEARCH),
            lambda log: log.started(1, SEARCH).dispatched(1),
            lambda log: log.started(1, SEARCH).dispatched(1).retry(1, T0_S + 5),
            lambda log: log.started(1, SEARCH).dispatched(1).dead_lettered(1),
            lambda log: (
                log.started(1, SEARCH)
                .dispatched(1)
                .failed(1, ToolFailed("search", "KeyError", "q"))
            ),
        ],
        ids=["started", "dispatched", "retrying", "dead", "failed"],
    )
    def test_a_fingerprint_mismatch_wins_over_the_recorded_state(
        self, build: Callable[[Log], Log]
    ) -> None:
        history = build(Log()).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 1, ToolCall("search", {"q": "sea lions"}))
        assert caught.value.position == 1
        assert caught.value.seq == 2

    def test_the_steps_before_the_divergence_are_still_served(self) -> None:
        history = Log().step_done(1, PLAN, "p").step_done(2, SEARCH, "s").history()
        assert result_served(history, 1, PLAN) == "p"
        with pytest.raises(NonDeterminismError):
            replay.decide(history, 2, EMAIL)


class TestEndOfWorkflow:
    def test_a_workflow_that_returns_after_every_recorded_step_is_fine(self) -> None:
        history = Log().step_done(1, PLAN, "p").step_done(2, SEARCH, "s").history()
        replay.check_end(history, 2)
        replay.check_end(Log().history(), 0)

    def test_a_log_holding_more_steps_than_the_workflow_yielded_raises(self) -> None:
        log = Log().step_done(1, PLAN, "p").step_done(2, SEARCH, "s").step_done(3, NAP)
        history = log.history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.check_end(history, 1)
        assert_names_the_divergence(
            caught.value,
            seq=history.steps[2].first_seq,
            position=2,
            expected="ToolCall('search'",
            actual="the end of the workflow",
        )

    def test_an_unfinished_step_past_the_return_also_counts(self) -> None:
        history = Log().step_done(1, PLAN, "p").started(2, SEARCH).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.check_end(history, 1)
        assert caught.value.position == 2

    @pytest.mark.parametrize(
        "finish",
        [lambda log: log.run_completed("done"), lambda log: log.run_failed("KeyError", "q")],
        ids=["completed", "failed"],
    )
    def test_a_step_past_the_end_of_a_terminal_log_raises(
        self, finish: Callable[[Log], Log]
    ) -> None:
        history = finish(Log().step_done(1, SEARCH, "s")).history()
        with pytest.raises(NonDeterminismError) as caught:
            replay.decide(history, 2, PLAN)
        err = caught.value
        assert err.run_id == RUN_ID
        assert err.position == 2
        assert err.seq == history.last_seq + 1
        assert "the end of the workflow" in str(err)
        assert PLAN.describe() in str(err)
        assert "not deterministic" in str(err)
