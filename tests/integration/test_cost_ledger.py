"""The cost ledger and budgets (SPEC §19), on both backends.

- A model answer that reports its usage and model is recorded with its cost from the price
  table (``cost_usd``); a model the table does not have is recorded as unknown (None), never 0;
  ``Runtime(prices=...)`` adds to the table or overrides it.
- ``rt.spend`` and ``durabl metrics`` sum a run's spend with the runs it started; a replay
  counts nothing again, and a call a crash lost is counted apart as re-executed spend.
- A streamed answer's text reaches ``on_chunk`` as it arrives, and what a crash cut off is kept
  in the log (STEP_PARTIAL) and counted; the next attempt's chunks say they start again.
- ``Budget`` stops a run before a model call that would go past it, over the run and its
  child runs: ``BudgetExceeded`` is thrown into the workflow (catchable), recorded, and thrown
  again by a replay; no call is made. A budget spent before the first call is refused where it
  is made, and a cost budget refuses a model with no price.
"""

from __future__ import annotations

from typing import Any

import pytest

from durabl import (
    Budget,
    BudgetExceeded,
    ChildRun,
    ModelCall,
    Runtime,
    events,
    llm,
    workflow,
)
from durabl.crashpoints import ProcessDeath
from durabl.llm import Chunk, Price

USAGE = {"input_tokens": 1000, "output_tokens": 500, "cached_tokens": 200}


class Model:
    """A model that answers with its name and usage, and counts what it was asked."""

    def __init__(self, model: str = "gpt-4o-mini", usage: dict[str, int] | None = None) -> None:
        self.model = model
        self.usage = usage or USAGE
        self.asked: list[Any] = []

    def __call__(self, prompt: Any, **params: Any) -> dict[str, Any]:
        self.asked.append(prompt)
        name = params.get("model", self.model)
        return {"text": f"answer to {prompt}", "model": name, "usage": dict(self.usage)}


@workflow(name="ledger_two_calls")
def two_calls(ctx: Any, model: str | None = None) -> Any:
    params = {} if model is None else {"model": model}
    first = yield ModelCall("first", **params)
    second = yield ModelCall("second", **params)
    return [first["cost_usd"], second["cost_usd"]]


@workflow(name="ledger_careful")
def careful(ctx: Any, calls: int, max_tokens: int | None = None) -> Any:
    """Asks up to ``calls`` times; stops, and says so, when the budget refuses a call."""
    answers = []
    params = {} if max_tokens is None else {"max_tokens": max_tokens}
    for n in range(calls):
        try:
            answers.append((yield ModelCall(f"q{n}", **params))["text"])
        except BudgetExceeded as refused:
            return {"answers": answers, "refused": refused.message}
    return {"answers": answers, "refused": None}


@workflow(name="ledger_delegates")
def delegates(ctx: Any) -> Any:
    mine = yield ModelCall("plan")
    theirs = yield ChildRun(careful, {"calls": 1})
    try:
        yield ModelCall("wrap up")
    except BudgetExceeded as refused:
        return {"mine": mine["text"], "theirs": theirs, "refused": refused.message}
    return "not refused"


@pytest.fixture
def db(either_db: str) -> str:
    return either_db


def dollars(model: str, usage: dict[str, int] = USAGE) -> float:
    price = llm.PRICES[model]
    assert price.cached_input is not None
    fresh = usage["input_tokens"] - usage["cached_tokens"]
    cost = fresh * price.input + usage["cached_tokens"] * price.cached_input
    return (cost + usage["output_tokens"] * price.output) / 1_000_000


def test_each_answer_is_recorded_with_its_cost_and_an_unknown_model_as_unknown(db: str) -> None:
    with Runtime(db, llm=Model()) as rt:
        priced = rt.run(two_calls)
        assert priced.result == [pytest.approx(dollars("gpt-4o-mini"))] * 2
        dated = rt.run(two_calls, {"model": "gpt-4o-mini-2024-07-18"})  # priced as gpt-4o-mini
        assert dated.result == priced.result
        unknown = rt.run(two_calls, {"model": "house-model-7"})
        assert unknown.result == [None, None]
        figures = rt.metrics(unknown.run_id)
        assert (figures.cost_usd, figures.unpriced_model_calls, figures.total_tokens) == (
            0.0,
            2,
            3000,
        )
    house = {"house-model-7": Price(input=1.0, output=2.0)}
    with Runtime(db, llm=Model(), prices=house) as rt:
        again = rt.run(two_calls, {"model": "house-model-7"}, run_id="house")
        assert again.result == [pytest.approx((1000 * 1.0 + 500 * 2.0) / 1e6)] * 2


def test_spend_adds_up_the_runs_a_run_started_and_a_replay_counts_nothing(db: str) -> None:
    model = Model()
    with Runtime(db, llm=model) as rt:
        state = rt.run(delegates, budget=Budget(max_tokens=100_000))
        assert state.status == events.COMPLETED
        spent = rt.spend(state.run_id)
        assert (spent.runs, spent.tokens) == (2, 3 * 1500)
        assert spent.cost_usd == pytest.approx(3 * dollars("gpt-4o-mini"))
        rt.replay(state.run_id)
        assert rt.spend(state.run_id) == spent
    assert len(model.asked) == 3


def test_a_budget_stops_the_run_before_the_call_that_would_pass_it(db: str) -> None:
    model = Model()
    with Runtime(db, llm=model) as rt:
        state = rt.run(careful, {"calls": 5}, run_id="b", budget=Budget(max_tokens=3000))
        # Two answers of 1,500 tokens spend the budget; the third call is refused, not made.
        assert state.result["answers"] == ["answer to q0", "answer to q1"]
        assert state.result["refused"] == (
            "run b step 3: 3000 of its 3000 tokens are spent (the budget of run b)"
        )
        assert len(model.asked) == 2
        [failed] = [e for e in rt.store.load_log("b") if e.kind == events.STEP_FAILED]
        assert failed.step == 3 and '"class":"BudgetExceeded"' in (failed.data or "")
        assert rt.replay("b").result == state.result
    assert len(model.asked) == 2


def test_a_call_whose_own_bound_would_pass_the_budget_is_refused(db: str) -> None:
    with Runtime(db, llm=Model(), budget=Budget(max_tokens=2000)) as rt:
        state = rt.run(careful, {"calls": 2, "max_tokens": 600}, run_id="bound")
        assert state.result["answers"] == ["answer to q0"]
        assert (
            "the call may use 600 more tokens, and 1500 of 2000 are spent"
            in (state.result["refused"])
        )


def test_a_budget_holds_over_the_child_runs_a_run_starts(db: str) -> None:
    model = Model()
    with Runtime(db, llm=model) as rt:
        state = rt.run(delegates, run_id="p", budget=Budget(max_tokens=3000))
        # The plan (1,500) and the child's one answer (1,500) spend it: "wrap up" is refused.
        assert state.result["theirs"] == {"answers": ["answer to q0"], "refused": None}
        assert state.result["refused"].startswith("run p step 3: 3000 of its 3000 tokens")
        child_started = rt.store.load_log("p-2")[0].data or ""
        assert '"budget":{"max_cost":null,"max_tokens":3000,"root":"p"}' in child_started
    assert model.asked == ["plan", "q0"]


def test_a_cost_budget_refuses_a_model_it_cannot_price(db: str) -> None:
    model = Model("house-model-7")
    with Runtime(db, llm=model, budget=Budget(max_cost=1.0)) as rt:
        state = rt.run(careful, {"calls": 1}, run_id="nopr")
        assert "model 'house-model-7' has no price" in state.result["refused"]
    assert model.asked == []


@pytest.mark.parametrize(
    ("budget", "problem"),
    [
        ({"max_tokens": 0}, "max_tokens must be a whole number of 1 or more"),
        ({"max_cost": 0.0}, "max_cost must be more than 0 dollars"),
        ({}, "Budget needs max_tokens, max_cost or both"),
    ],
)
def test_a_budget_spent_before_the_first_call_is_refused_where_it_is_made(
    budget: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        Budget(**budget)


def test_a_stream_cut_off_by_a_crash_is_kept_in_the_log_and_counted(db: str) -> None:
    chunks: list[Chunk] = []
    dying = [True]

    def streaming(prompt: Any, **params: Any) -> dict[str, Any]:
        answering = llm.current()
        assert answering is not None
        for piece in ("The ", "plan ", "is ", "simple."):
            answering.chunk(piece)
            if dying[0] and piece == "is ":
                answering.flush()
                raise ProcessDeath("mid-stream")  # the process dies with the answer half read
        return {"text": answering.streamed, "model": "gpt-4o-mini", "usage": dict(USAGE)}

    @workflow(name="ledger_streams")
    def streams(ctx: Any) -> Any:
        return (yield ModelCall("plan", stream=True))["text"]

    with (
        Runtime(db, llm=streaming, on_chunk=chunks.append) as rt,
        pytest.raises(ProcessDeath),
    ):
        rt.run(streams, run_id="s")
    dying[0] = False
    with Runtime(db, llm=streaming, on_chunk=chunks.append) as rt:
        log = rt.store.load_log("s")
        partials = [e.data for e in log if e.kind == events.STEP_PARTIAL]
        assert partials[-1] == '{"attempt":1,"text":"The plan is "}'
        assert rt.resume("s").result == "The plan is simple."
        figures = rt.metrics("s")
        assert figures.partial_chars == len("The plan is ")
        assert figures.reexecuted_model_calls == 1
        assert figures.reexecuted_cost_usd == pytest.approx(dollars("gpt-4o-mini"))
    first = [c for c in chunks if c.first]
    assert [(c.attempt, c.text) for c in first] == [(1, "The "), (2, "The ")]
    assert "".join(c.text for c in chunks if c.attempt == 2) == "The plan is simple."
