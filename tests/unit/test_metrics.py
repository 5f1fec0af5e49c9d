"""Metrics folded from a run's log: hand-built logs first, then real runs.

``MetricsFold`` reads nothing but the events: counts of each kind of step, attempts, retries,
process boundaries, steps served from the log, re-executions after a crash, the model's reported
token usage, and time (from the events' own timestamps). ``Log`` (``histories.py``) stamps
event ``seq`` at ``T0_S + seq``, so every time below is a difference of seqs.

A compacted log is the snapshot's counters plus the events after the watermark: its figures
must be the figures of the whole log, whichever point it was compacted at, and however often.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from durabl import (
    ChildRun,
    ContinueAsNew,
    ModelCall,
    Parallel,
    RetryPolicy,
    Runtime,
    Sleep,
    ToolCall,
    WaitSignal,
    codec,
    crashpoints,
    events,
)
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.errors import ModelCallFailed, ToolFailed
from durabl.events import Event
from durabl.metrics import Metrics, MetricsFold, of_run, of_runs
from durabl.replay import History

from .histories import NAP, PLAN, RUN_ID, SEARCH, T0_S, Log

LOOKUP = ToolCall("search", {"q": "kelp"})
CHARGE = ToolCall("charge", {"amount": 3})
SUMMARY = ModelCall("Summarise the otters")
APPROVAL = WaitSignal("approve", timeout=60)
FETCHES = Parallel([ToolCall("search", {"q": "a"}), ToolCall("search", {"q": "b"})])
DELEGATE = ChildRun("kid", {"topic": "otters"})
GO_ON = ContinueAsNew({"turn": 2})


def answer(usage: Any = None, **fields: Any) -> dict[str, Any]:
    return {"text": "ok", **fields} if usage is None else {"text": "ok", "usage": usage, **fields}


def figures(log: Log) -> Metrics:
    return MetricsFold.of(log.events).m


def at(seq: int) -> float:
    return T0_S + seq


# -- counting ---------------------------------------------------------------------------------


class TestCounts:
    def test_an_empty_run_counts_nothing_and_lasts_no_time(self) -> None:
        assert figures(Log()) == Metrics()
        assert MetricsFold.of([]).m == Metrics()

    def test_each_kind_of_step_is_counted_once_it_finishes(self) -> None:
        log = (
            Log()
            .started(1, PLAN)  # 2
            .completed(1, answer())  # 3
            .step_done(2, SEARCH, ["a"])  # 4-6
            .ctx(3, "now", T0_S)  # 7
            .ctx(4, "uuid", "u-1")  # 8
            .started(5, NAP)  # 9
            .armed(5, at(12))  # 10
            .fired(5, at(12))  # 11
            .started(6, LOOKUP)  # 12
            .dispatched(6)  # 13
            .failed(6, ToolFailed("search", "ValueError", "no", 1))  # 14
            .started(7, SUMMARY)  # 15
            .failed(7, ModelCallFailed("ModelCall", "TimeoutError", "slow", 1))  # 16
            .started(8, CHARGE)  # 17: open, not counted as a step
        )
        m = figures(log)
        assert (m.steps, m.model_calls, m.tool_calls, m.sleeps) == (5, 2, 2, 1)
        assert (m.ctx_values, m.failed_steps, m.attempts) == (2, 2, 6)
        assert (m.retries, m.resumes, m.replayed_steps, m.dead_letters) == (0, 0, 0, 0)
        assert (m.reexecuted_model_calls, m.reexecuted_tool_calls) == (0, 0)
        assert m.runs == 1

    def test_retries_are_attempts_but_not_re_executions(self) -> None:
        log = Log().started(1, SEARCH).dispatched(1).retry(1, at(10))
        log.started(1, SEARCH).dispatched(1).retry(1, at(20))
        log.started(1, SEARCH).dispatched(1).completed(1, ["a"])
        log.started(2, PLAN).retry(2, at(30)).started(2, PLAN).completed(2, answer())
        m = figures(log)
        assert (m.attempts, m.retries, m.steps, m.tool_calls, m.model_calls) == (5, 3, 2, 1, 1)
        assert (m.reexecuted_tool_calls, m.reexecuted_model_calls) == (0, 0)

    def test_resumes_count_process_boundaries_and_the_steps_they_replayed(self) -> None:
        log = Log().resumed()  # died before any step: nothing replayed
        log.step_done(1, PLAN, answer()).ctx(2, "random", 0.5).resumed()  # 2 replayed
        log.step_done(3, SEARCH, ["a"]).started(4, NAP).armed(4, at(99)).resumed()  # 3 more
        m = figures(log)
        assert (m.resumes, m.replayed_steps) == (3, 0 + 2 + 3)

    def test_a_step_started_again_without_an_outcome_was_lost_to_a_crash(self) -> None:
        log = Log().started(1, PLAN).resumed().started(1, PLAN).completed(1, answer())
        log.started(2, SEARCH).dispatched(2).resumed().started(2, SEARCH).dispatched(2)
        log.completed(2, ["a"])
        log.started(3, CHARGE).resumed().started(3, CHARGE).resumed().started(3, CHARGE)
        log.dispatched(3).completed(3, {"charged": 3})
        m = figures(log)
        assert (m.reexecuted_model_calls, m.reexecuted_tool_calls) == (1, 3)
        assert (m.attempts, m.steps, m.resumes) == (7, 3, 4)

    def test_a_dead_letter_is_counted_and_its_resolution_finishes_the_step(self) -> None:
        log = Log().started(1, CHARGE).dispatched(1).resumed().dead_lettered(1)
        log.resolved(1, {"charged": 3})
        m = figures(log)
        assert (m.dead_letters, m.steps, m.tool_calls, m.attempts) == (1, 1, 1, 1)
        assert m.reexecuted_tool_calls == 0

    def test_run_level_events_count_no_step(self) -> None:
        log = Log().step_done(1, SEARCH, ["a"]).run_completed({"ok": True})
        assert figures(log).steps == 1
        assert figures(Log().run_failed("ValueError", "bad")).steps == 0


# -- tokens -----------------------------------------------------------------------------------

USAGES = {
    "anthropic": ({"input_tokens": 70, "output_tokens": 30}, (70, 30, 100)),
    "openai": ({"prompt_tokens": 70, "completion_tokens": 30}, (70, 30, 100)),
    "openai-total": (
        {"prompt_tokens": 70, "completion_tokens": 30, "total_tokens": 105},
        (70, 30, 105),
    ),
    "total-given": ({"input_tokens": 1, "output_tokens": 2, "total_tokens": 40}, (1, 2, 40)),
    "input-only": ({"input_tokens": 12}, (12, 0, 12)),
    "total-only": ({"total_tokens": 9}, (0, 0, 9)),
    "empty": ({}, (0, 0, 0)),
    "strings": ({"input_tokens": "70", "output_tokens": "30", "total_tokens": "100"}, (0, 0, 0)),
    "negatives": ({"input_tokens": -70, "output_tokens": 30, "total_tokens": -1}, (0, 30, 30)),
    "bools": ({"input_tokens": True, "output_tokens": False, "total_tokens": True}, (0, 0, 0)),
    "nulls": ({"input_tokens": None, "completion_tokens": None}, (0, 0, 0)),
    "nested": ({"input_tokens": {"cached": 5}, "output_tokens": [5]}, (0, 0, 0)),
    "not-an-object": ("lots", (0, 0, 0)),
    "a-list": ([70, 30], (0, 0, 0)),
}


@pytest.mark.parametrize("style", list(USAGES))
def test_tokens_come_from_the_usage_the_model_reported(style: str) -> None:
    usage, (tokens_in, tokens_out, total) = USAGES[style]
    log = Log().started(1, PLAN).completed(1, answer(usage))
    m = figures(log)
    assert (m.input_tokens, m.output_tokens, m.total_tokens) == (tokens_in, tokens_out, total)
    assert m.reexecuted_tokens == 0


@pytest.mark.parametrize(
    "result",
    [
        answer(),
        "a plain string mentioning usage",
        ["usage", {"usage": {"input_tokens": 5}}],
        {"reply": {"usage": {"input_tokens": 5, "output_tokens": 5}}},
        None,
        42,
    ],
    ids=["no-usage", "string", "list", "nested-object", "null", "number"],
)
def test_an_answer_without_a_top_level_usage_object_has_no_tokens(result: Any) -> None:
    m = figures(Log().started(1, PLAN).completed(1, result))
    assert (m.input_tokens, m.output_tokens, m.total_tokens, m.model_calls) == (0, 0, 0, 1)


def test_only_model_answers_carry_tokens() -> None:
    usage = {"input_tokens": 70, "output_tokens": 30}
    log = Log().step_done(1, SEARCH, {"usage": usage}).ctx(2, "uuid", {"usage": usage})
    log.started(3, PLAN).failed(3, ModelCallFailed("ModelCall", "TimeoutError", "slow", 1))
    m = figures(log)
    assert (m.input_tokens, m.output_tokens, m.total_tokens) == (0, 0, 0)


def test_tokens_add_up_over_model_calls_in_both_naming_styles() -> None:
    log = Log().started(1, PLAN).completed(1, answer({"input_tokens": 10, "output_tokens": 4}))
    log.started(2, SUMMARY)
    log.completed(2, answer({"prompt_tokens": 20, "completion_tokens": 6, "total_tokens": 30}))
    m = figures(log)
    assert (m.input_tokens, m.output_tokens, m.total_tokens) == (30, 10, 44)


def test_a_lost_answer_is_estimated_as_the_recorded_one_for_each_lost_attempt() -> None:
    usage = {"input_tokens": 70, "output_tokens": 30}
    log = Log().started(1, PLAN).resumed().started(1, PLAN).resumed().started(1, PLAN)
    log.completed(1, answer(usage))
    log.started(2, SUMMARY).retry(2, at(20)).started(2, SUMMARY).completed(2, answer(usage))
    m = figures(log)
    assert (m.reexecuted_model_calls, m.reexecuted_tokens) == (2, 200)
    assert (m.total_tokens, m.input_tokens, m.output_tokens) == (200, 140, 60)


# -- time -------------------------------------------------------------------------------------


def test_step_time_timer_wait_and_wall_clock_come_from_event_times() -> None:
    log = (
        Log()  # 1
        .started(1, PLAN)  # 2
        .completed(1, answer())  # 3: 1 s
        .started(2, SEARCH)  # 4
        .dispatched(2)  # 5
        .retry(2, at(9))  # 6: 2 s
        .started(2, SEARCH)  # 7
        .dispatched(2)  # 8
        .completed(2, ["a"])  # 9: 2 s
        .ctx(3, "now", T0_S)  # 10
        .started(4, NAP)  # 11
        .armed(4, at(15))  # 12
        .fired(4, at(15))  # 13: 1 s waiting, no step time
        .started(5, SUMMARY)  # 14: its process dies
        .resumed()  # 15
        .started(5, SUMMARY)  # 16
        .completed(5, answer())  # 17: 1 s (the lost attempt's time is not known)
        .run_completed(None)  # 18
    )
    m = figures(log)
    assert m.step_s == 1 + 2 + 2 + 1
    assert m.timer_wait_s == 1
    assert m.wall_s == 17
    assert m.reexecuted_model_calls == 1


def test_an_attempt_that_died_with_its_process_adds_no_step_time() -> None:
    """Its end was never recorded: the time until an operator resolved it is not step time."""
    log = Log().started(1, CHARGE).dispatched(1).resumed().dead_lettered(1)
    log.resolved(1, {"charged": 3})
    log.started(2, SEARCH).dispatched(2).resumed().resumed().completed(2, ["from a key"])
    m = figures(log)
    assert (m.step_s, m.steps, m.wall_s) == (0, 2, 11)


def test_a_timer_fired_by_a_later_process_waits_the_whole_time() -> None:
    log = Log().started(1, NAP).armed(1, at(50)).resumed().resumed().fired(1, at(50))
    m = figures(log)
    assert (m.timer_wait_s, m.step_s, m.sleeps, m.resumes, m.attempts) == (3, 0, 1, 2, 1)


# -- sums -------------------------------------------------------------------------------------


def test_metrics_add_field_by_field() -> None:
    one = figures(Log().started(1, PLAN).completed(1, answer({"input_tokens": 3})))
    two = figures(Log().step_done(1, SEARCH, ["a"]).resumed().step_done(2, NAP))
    total = one + two
    assert total.runs == 2
    for name, value in total.as_dict().items():
        assert value == getattr(one, name) + getattr(two, name), name
    assert (total.steps, total.model_calls, total.tool_calls, total.sleeps) == (3, 1, 1, 1)
    assert (total.input_tokens, total.resumes, total.replayed_steps) == (3, 1, 1)


# -- compacted logs ---------------------------------------------------------------------------


def rich_log() -> Log:
    """Every event kind, crashes and resumes, retries, a dead letter redriven and one resolved."""
    usage = {"prompt_tokens": 11, "completion_tokens": 7}
    log = Log({"topic": "otters"}).ctx(1, "uuid", "u-1")
    log.started(2, PLAN).add(events.STEP_PARTIAL, 2, None, '{"attempt":1,"text":"Plan: fi"}')
    log.resumed().started(2, PLAN).completed(2, answer(usage, cost_usd=0.25))
    log.started(3, SEARCH).dispatched(3).retry(3, at(12)).started(3, SEARCH).dispatched(3)
    log.completed(3, ["a", "b"])
    log.started(4, NAP).armed(4, at(20)).resumed().fired(4, at(20))
    log.started(5, CHARGE).dispatched(5).resumed().dead_lettered(5).redriven(5)
    log.started(5, CHARGE).dispatched(5).completed(5, {"charged": 3})
    log.ctx(6, "now", T0_S + 30)
    log.started(7, LOOKUP).dispatched(7).failed(7, ToolFailed("search", "ValueError", "x", 1))
    log.started(8, CHARGE).dispatched(8).resumed().dead_lettered(8).resolved(8, {"charged": 1})
    log.started(9, SUMMARY)
    log.completed(9, answer({"input_tokens": 5, "output_tokens": 5}, cost_usd=None))
    log.started(10, APPROVAL).armed(10, at(40)).completed(10, {"payload": True, "signal": 1})
    log.started(11, FETCHES)  # a Parallel: its branches at 12 and 13, then its own end
    log.step_done(13, FETCHES.steps[1], ["b"]).step_done(12, FETCHES.steps[0], ["a"])
    log.completed(11, [["a"], ["b"]])
    log.started(14, DELEGATE).completed(14, "the child's answer")
    log.started(15, GO_ON).completed(15, {"run_id": "next"})
    log.started(16, SEARCH)  # open
    return log


def test_the_rich_log_has_something_in_every_figure() -> None:
    m = figures(rich_log())
    zero = [name for name, value in m.as_dict().items() if not value]
    assert zero == [], f"the rich log leaves {zero} at zero"


def compaction_points(events: list[Event]) -> list[tuple[int, int]]:
    """Every (prefix length, fold seq) compaction could pick on every prefix of ``events``,
    for every keep_last."""
    points = set()
    for length in range(1, len(events) + 1):
        history = History.from_events(RUN_ID, events[:length])
        for keep_last in range(0, 10):
            _, seq = history.foldable(keep_last)
            if seq:
                points.add((length, seq))
    return sorted(points)


def test_a_compacted_log_has_the_figures_of_the_whole_log_at_every_compaction_point() -> None:
    events = rich_log().events
    points = compaction_points(events)
    assert len({seq for _, seq in points}) >= 9, points
    for length, seq in points:
        prefix = events[:length]
        counters = MetricsFold.of(e for e in prefix if e.seq <= seq).counters()
        # The counters go into the snapshot as canonical JSON and come back from it.
        counters = json.loads(codec.encode(counters))
        rest = [e for e in prefix if e.seq > seq]
        assert MetricsFold.of(rest, counters).m == MetricsFold.of(prefix).m, (length, seq)


def test_compacting_again_carries_the_figures_on() -> None:
    events = rich_log().events
    seqs = sorted({seq for length, seq in compaction_points(events) if length == len(events)})
    counters: dict[str, Any] | None = None
    done = 0
    for seq in seqs:
        fold = MetricsFold.of((e for e in events if done < e.seq <= seq), counters)
        counters, done = json.loads(codec.encode(fold.counters())), seq
        rest = [e for e in events if e.seq > seq]
        assert MetricsFold.of(rest, counters).m == figures(rich_log()), seq


def test_only_a_resolved_prefix_can_be_folded_into_counters() -> None:
    with pytest.raises(ValueError, match="open"):
        MetricsFold.of(Log().started(1, PLAN).events).counters()
    with pytest.raises(ValueError, match="open"):
        MetricsFold.of(Log().started(1, NAP).armed(1, at(9)).events).counters()
    assert MetricsFold.of(Log().step_done(1, NAP).events).counters()["done_positions"] == 1


def test_the_compacted_log_builder_keeps_replay_and_metrics_apart() -> None:
    """``Log.compacted`` folds the history; the figures of its prefix travel separately."""
    log = Log().step_done(1, PLAN, answer({"input_tokens": 4})).step_done(2, SEARCH, ["a"])
    folded = log.compacted()
    assert folded.events == []
    assert json.loads(folded.snapshot or "{}")["metrics"] == {}


# -- real runs --------------------------------------------------------------------------------

USAGE = {"input_tokens": 120, "output_tokens": 80}
STEP_S = 2.5


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


def agent(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"plan {topic}")
    found = yield ToolCall("search", {"q": topic})
    ctx.uuid()
    yield Sleep(seconds=60)
    summary = yield ModelCall(f"summarise {found}")
    return [plan["text"], summary["text"]]


@pytest.fixture
def world(tmp_path: Path) -> Any:
    clock = Clock()
    calls: list[str] = []

    def llm(prompt: str, **params: Any) -> dict[str, Any]:
        calls.append(prompt)
        clock.now_s += STEP_S  # the model takes its time
        return {"text": prompt.upper(), "usage": USAGE}

    def search(*, q: str) -> list[str]:
        calls.append(q)
        clock.now_s += 1.0
        return [q]

    def build() -> Runtime:
        return Runtime(
            tmp_path / "metrics.db",
            llm=llm,
            tools={"search": search},
            clock=clock,
            workflows={"agent": agent},
            retry=RetryPolicy(max_attempts=1),
        )

    return build, clock, calls


def test_a_real_run_reports_its_steps_tokens_and_times(world: Any) -> None:
    build, clock, calls = world
    with build() as rt:
        rt.start("agent", {"topic": "otters"}, run_id="r1")
        clock.now_s += 60
        rt.tick()
        m = rt.metrics("r1")
    assert len(calls) == 3
    assert (m.steps, m.model_calls, m.tool_calls, m.sleeps, m.ctx_values) == (4, 2, 1, 1, 1)
    assert (m.attempts, m.retries, m.resumes, m.replayed_steps) == (4, 0, 0, 0)
    assert (m.input_tokens, m.output_tokens, m.total_tokens) == (240, 160, 400)
    assert (m.reexecuted_model_calls, m.reexecuted_tokens) == (0, 0)
    assert m.step_s == 2 * STEP_S + 1.0
    assert m.timer_wait_s == 60  # armed at its deadline less 60 s, fired by tick at it
    assert m.wall_s == 2 * STEP_S + 1.0 + 60


def test_a_model_answer_lost_to_a_crash_is_paid_for_again(world: Any) -> None:
    build, clock, calls = world
    rt = build()
    with CrashAt(crashpoints.AFTER_MODEL_RETURNED, 1), pytest.raises(ProcessDeath):
        rt.start("agent", {"topic": "otters"}, run_id="r1")
    rt.close()
    assert calls == ["plan otters"]
    with build() as again:
        assert again.resume("r1").status == "SLEEPING"
        m = again.metrics("r1")
        assert calls == ["plan otters", "plan otters", "otters"]
        assert (m.reexecuted_model_calls, m.reexecuted_tokens) == (1, 200)
        assert (m.model_calls, m.total_tokens, m.attempts, m.resumes) == (1, 200, 4, 1)
        assert m.replayed_steps == 0
        clock.now_s += 60
        again.tick()
        assert again.metrics("r1").replayed_steps == 0  # the same process drove it on
    with build() as third:
        clock.now_s += 1
        assert third.replay("r1").status == "COMPLETED"
        third.resume("r1")
        m = third.metrics("r1")
        assert (m.resumes, m.reexecuted_model_calls, m.total_tokens) == (1, 1, 400)


def test_a_resumed_run_counts_the_steps_its_new_process_replayed(world: Any) -> None:
    build, clock, _ = world
    with build() as rt:
        rt.start("agent", {"topic": "otters"}, run_id="r1")
    clock.now_s += 60
    with build() as again:
        again.tick()
        m = again.metrics("r1")
    assert (m.resumes, m.replayed_steps) == (1, 3)  # plan, search, uuid; the sleep fired here


def test_runtime_metrics_sum_over_runs_and_survive_compaction(world: Any) -> None:
    build, clock, _ = world
    with build() as rt:
        for run_id in ("r1", "r2", "r3"):
            rt.start("agent", {"topic": run_id}, run_id=run_id)
        clock.now_s += 60
        rt.tick()
        each = {run_id: rt.metrics(run_id) for run_id in ("r1", "r2", "r3")}
        total = rt.metrics()
        assert total == of_runs(rt.store)
        assert total.runs == 3
        assert total == each["r1"] + each["r2"] + each["r3"]
        assert of_runs(rt.store, ["r2"]) == each["r2"] == of_run(rt.store, "r2")
        assert of_runs(rt.store, []) == Metrics(runs=0)
        for keep_last in (3, 1, 0):
            rt.compact(keep_last=keep_last)
            assert rt.metrics() == total
            assert {run_id: rt.metrics(run_id) for run_id in each} == each


def test_a_wait_for_a_signal_is_counted_and_adds_no_step_time() -> None:
    log = Log().started(1, APPROVAL).armed(1, at(40)).resumed()
    log.completed(1, {"payload": "yes", "signal": 1})
    m = figures(log)
    assert (m.signals, m.steps, m.tool_calls, m.step_s, m.attempts) == (1, 1, 0, 0, 1)


def test_cost_is_summed_unknown_prices_are_counted_and_lost_streams_are_spent() -> None:
    usage = {"input_tokens": 100, "output_tokens": 50}
    log = Log().started(1, PLAN)
    log.add(events.STEP_PARTIAL, 1, None, '{"attempt":1,"text":"The pl"}')
    log.add(events.STEP_PARTIAL, 1, None, '{"attempt":1,"text":"The plan is"}')
    log.resumed().started(1, PLAN).completed(1, answer(usage, cost_usd=0.5))
    log.started(2, SUMMARY).completed(2, answer(usage, cost_usd=None))  # a model with no price
    log.started(3, SUMMARY.__class__("again"))
    log.add(events.STEP_PARTIAL, 3, None, '{"attempt":1,"text":"abc"}')
    log.retry(3, at(20)).started(3, SUMMARY.__class__("again")).completed(
        3, answer(usage, cost_usd=0.25)
    )
    log.started(4, SUMMARY.__class__("last"))
    log.add(events.STEP_PARTIAL, 4, None, '{"attempt":1,"text":"xy"}')
    log.failed(4, ModelCallFailed("ModelCall", "ConnectionError", "dropped", 1))
    m = figures(log)
    assert m.cost_usd == 0.75
    assert m.unpriced_model_calls == 1
    assert m.reexecuted_cost_usd == 0.5  # the lost first attempt of step 1, costed as its answer
    assert m.partial_chars == len("The plan is") + len("abc") + len("xy")
