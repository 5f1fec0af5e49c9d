"""Executing a ``ModelCall``: call the runtime's llm, with the runtime's retry policy.

The client runs inside a ``durabl.modelcall.ModelCallContext`` naming the run, the step, the
attempt and the runtime's tools; a streaming client hands it its text as it arrives, and the
text so far is recorded (STEP_PARTIAL) now and then. An answer that reports its usage and model
gets its cost from the runtime's price table, recorded with it (``cost_usd``; None for a model
the table does not have, never 0).
"""

from __future__ import annotations

from typing import Any

from durabl import codec, crashpoints, events
from durabl.errors import (
    BadStepError,
    BudgetExceeded,
    ModelCallFailed,
    NoModelError,
    UnknownToolError,
)
from durabl.execute.attempts import AttemptSpec, Opening, attempt, record_failure
from durabl.execute.base import StepCall
from durabl.flow import Hold
from durabl.modelcall import ModelCallContext, answering
from durabl.prices import cost_usd, find_price
from durabl.steps import ModelCall


def execute(call: StepCall) -> Any:
    step = call.step
    assert isinstance(step, ModelCall)
    services = call.services
    llm = services.llm
    if llm is None:
        raise Hold(NoModelError(run_id=call.run_id, position=call.position, step=step.describe()))
    if call.journal.history.budget is not None:
        _keep_to_budget(call, step, call.journal.history.budget)
    attempts = [call.rec.attempts if call.rec is not None else 0]

    def ask() -> Any:
        attempts[0] += 1
        context = ModelCallContext(
            run_id=call.run_id,
            step=call.position,
            attempt=attempts[0],
            tools=services.tools,
            record_partial=lambda text: _record_partial(call, attempts[0], text),
            on_chunk=services.on_chunk,
        )
        with answering(context):
            try:
                answer = services.call_model(llm, step.prompt, step.params)
            except UnknownToolError as missing:
                known = ", ".join(missing.registered) or "none"
                problem = (
                    f"the ModelCall offers the model tool {missing.tool!r}, which is not "
                    f"registered (registered: {known})"
                )
                raise Hold(BadStepError(problem).where(call.run_id, call.position)) from None
        return _priced(call, step, answer)

    spec = AttemptSpec(
        name="ModelCall",
        call=ask,
        policy=services.retry,
        returned=crashpoints.AFTER_MODEL_RETURNED,
        failure=ModelCallFailed,
    )
    return attempt(call, spec)


def _keep_to_budget(call: StepCall, step: ModelCall, budget: dict[str, Any]) -> None:
    """Refuse the call, recorded as the step's failure, if it would go past the run's budget."""
    from durabl.ledger import spend  # only runs with a budget need it

    root = budget["root"]
    spent = spend(call.journal.store, root)
    problem = _over(call, step, budget, spent.tokens, spent.cost_usd, spent.unpriced_calls)
    if problem is None:
        return
    err = BudgetExceeded(
        f"run {call.run_id} step {call.position}: {problem} (the budget of run {root})"
    )
    record_failure(
        call, err, None, Opening(call.journal.started(step), disarm=False), effect_happened=False
    )
    raise err


def _over(
    call: StepCall, step: ModelCall, budget: dict[str, Any], tokens: int, cost: float, unpriced: int
) -> str | None:
    max_tokens, max_cost = budget.get("max_tokens"), budget.get("max_cost")
    if max_tokens is not None:
        if tokens >= max_tokens:
            return f"{tokens} of its {max_tokens} tokens are spent"
        bound = step.params.get("max_tokens", step.params.get("max_output_tokens"))
        if isinstance(bound, int) and tokens + bound > max_tokens:
            return f"the call may use {bound} more tokens, and {tokens} of {max_tokens} are spent"
    if max_cost is not None:
        if unpriced:
            return f"{unpriced} model answers have no price, so the spend of ${max_cost} cannot be kept"
        if cost >= max_cost:
            return f"${cost:.6f} of its ${max_cost} are spent"
        model = step.params.get("model", getattr(call.services.llm, "model", None))
        if isinstance(model, str) and find_price(call.services.prices, model) is None:
            return f"model {model!r} has no price, so its cost could not be counted against ${max_cost}"
    return None


def _record_partial(call: StepCall, attempt: int, text: str) -> None:
    data = codec.encode({"attempt": attempt, "text": text})
    call.journal.append([(events.STEP_PARTIAL, None, data)])


def _priced(call: StepCall, step: ModelCall, answer: Any) -> Any:
    """An answer that reports its usage, with its cost added (``cost_usd``)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("usage"), dict):
        return answer
    if "cost_usd" in answer:
        return answer
    model = answer.get("model") or step.params.get("model")
    priced = cost_usd(
        call.services.prices, model if isinstance(model, str) else None, answer["usage"]
    )
    return {**answer, "cost_usd": priced}
