"""What the adapters' tests share: workflows that ask a model, and readers of a run's log."""

from __future__ import annotations

import inspect
import json
from typing import Any, Literal

from durabl import ModelCall, Runtime, ToolMode, events, tool, workflow
from durabl.llm import Chunk


@workflow(name="llm_ask")
def ask(ctx: Any, prompt: Any, params: dict[str, Any]) -> Any:
    """One model call, its answer the run's result."""
    answer = yield ModelCall(prompt, **params)
    return answer


FORECASTS = {"Lisbon": {"sky": "sun", "high_c": 24}, "Oslo": {"sky": "rain", "high_c": 9}}


def get_forecast(
    city: str,
    day: Literal["today", "tomorrow"] = "tomorrow",
    units: str | None = None,
    *,
    idempotency_key: str,
) -> dict[str, Any]:
    """The weather forecast for a city.

    Reads the national weather service's forecast.

    Args:
        city: The city, in English.
        day: Which day's forecast.
        units: "metric" or "imperial";
            metric when not given.
    """
    return {"city": city, "day": day, **FORECASTS[city]}


FORECAST_SCHEMA = {
    "name": "get_forecast",
    "description": "The weather forecast for a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, in English."},
            "day": {
                "type": "string",
                "enum": ["today", "tomorrow"],
                "description": "Which day's forecast.",
                "default": "tomorrow",
            },
            "units": {
                "type": ["string", "null"],
                "description": '"metric" or "imperial"; metric when not given.',
                "default": None,
            },
        },
        "required": ["city"],
        "additionalProperties": False,
    },
}
"""What ``get_forecast``'s signature and docstring say, as the model is told it."""

TOOLS = {"get_forecast": tool(get_forecast, mode=ToolMode.IDEMPOTENT)}


class Chunks(list[Chunk]):
    """An ``on_chunk`` that keeps every chunk."""

    def __call__(self, chunk: Chunk) -> None:
        self.append(chunk)


def recorded(rt: Runtime, run_id: str, kind: str) -> list[tuple[int, Any]]:
    """Each event of ``kind`` in the run's log: its step, and its data decoded. A
    TOOL_COMPLETED counts as the STEP_STARTED and STEP_COMPLETED it stands for."""
    return [
        (event.step, json.loads(event.data) if event.data else None)
        for logged in rt.store.load_log(run_id)
        for event in events.expanded(logged)
        if event.kind == kind
    ]


def completed(rt: Runtime, run_id: str) -> list[Any]:
    """The results the run's log records, step by step."""
    return [data for _step, data in recorded(rt, run_id, events.STEP_COMPLETED)]


def check_against_signature(parameters: dict[str, Any], fn: Any) -> None:
    """The parameters a model was offered are the function's, less the key durabl fills in;
    those without a default are required."""
    signature = inspect.signature(fn)
    offered = [name for name in signature.parameters if name != "idempotency_key"]
    assert list(parameters["properties"]) == offered
    assert parameters["required"] == [
        name for name in offered if signature.parameters[name].default is inspect.Parameter.empty
    ]
