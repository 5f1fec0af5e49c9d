"""``durabl.llm.anthropic`` with the real Anthropic SDK against a loopback server, in real runs:
the answer and its cost (prompt-cache reads included), a tool-use agent loop, streaming into
``on_chunk``, a stream that breaks off, and errors retried by durabl's RetryPolicy."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic as sdk
import pytest

import durabl.llm
from durabl import ModelCall, RetryPolicy, Runtime, ToolCall, events, workflow

from .servers import ANTHROPIC_MODEL, Call, Fail, ModelServer, Say
from .support import (
    FORECAST_SCHEMA,
    TOOLS,
    Chunks,
    ask,
    check_against_signature,
    completed,
    get_forecast,
    recorded,
)

MODEL = "claude-sonnet-4-20250514"
NO_WAIT = RetryPolicy(max_attempts=3, base_delay=0)
STORY = "Sea otters eat the urchins that would otherwise eat the kelp."


@pytest.fixture
def client(server: ModelServer) -> Iterator[sdk.Anthropic]:
    with sdk.Anthropic(
        base_url=server.root, api_key="sk-ant-loopback", max_retries=0, timeout=10
    ) as made:
        yield made


def runtime(db: Path, client: sdk.Anthropic, **options: Any) -> Runtime:
    llm = durabl.llm.anthropic(client, model=MODEL)
    return Runtime(db, llm=llm, tools=TOOLS, retry=options.pop("retry", NO_WAIT), **options)


def test_a_plain_answer_is_recorded_with_its_usage_and_cost(
    server: ModelServer, client: sdk.Anthropic, db: Path
) -> None:
    server.script(Say(STORY, input_tokens=1000, output_tokens=500, cached_tokens=200))
    params = {"system": "Answer in one sentence.", "stop_sequences": ["END"]}
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Why do kelp forests need otters?", "params": params})
        logged = completed(rt, state.run_id)
    # claude-sonnet-4: $3 per million input tokens, $0.30 read from the cache, $15 output
    dollars = (800 * 3.00 + 200 * 0.30 + 500 * 15.00) / 1_000_000
    expected = {
        "provider": "anthropic",
        "model": ANTHROPIC_MODEL,
        "text": STORY,
        "tool_calls": [],
        "finish_reason": "end_turn",
        "usage": {
            "input_tokens": 1000,
            "output_tokens": 500,
            "cached_tokens": 200,
            "total_tokens": 1500,
        },
        "cost_usd": pytest.approx(dollars, abs=1e-12),
    }
    assert (state.status, state.result) == (events.COMPLETED, expected)
    assert logged == [expected]
    (sent,) = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["authorization"] == "Bearer sk-ant-loopback"
    assert "anthropic-version" in sent.headers
    assert sent.body == {
        "model": MODEL,
        "max_tokens": 1024,
        "messages": [{"role": "user", "content": "Why do kelp forests need otters?"}],
        "system": "Answer in one sentence.",
        "stop_sequences": ["END"],
    }


def test_an_unknown_model_is_priced_as_unknown(
    server: ModelServer, client: sdk.Anthropic, db: Path
) -> None:
    server.script(Say("Yes.", model="claude-next-preview"))
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Is kelp a plant?", "params": {"max_tokens": 16}})
    assert (state.result["model"], state.result["cost_usd"]) == ("claude-next-preview", None)
    assert server.requests[0].body["max_tokens"] == 16  # the call's own, over the adapter's


@workflow(name="llm_anthropic_agent")
def messages_agent(ctx: Any, question: str, stream: bool) -> Any:
    """Ask, run the tools the model asks for, send their results back, until it answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for _turn in range(4):
        answer = yield ModelCall(messages, tools=["get_forecast"], stream=stream)
        if not answer["tool_calls"]:
            return answer["text"]
        blocks = [{"type": "text", "text": answer["text"]}] if answer["text"] else []
        blocks += [
            {"type": "tool_use", "id": call["id"], "name": call["name"], "input": call["arguments"]}
            for call in answer["tool_calls"]
        ]
        messages.append({"role": "assistant", "content": blocks})
        results = []
        for call in answer["tool_calls"]:
            result = yield ToolCall(call["name"], call["arguments"])
            results.append(
                {"type": "tool_result", "tool_use_id": call["id"], "content": json.dumps(result)}
            )
        messages.append({"role": "user", "content": results})
    raise RuntimeError("the model kept asking for tools")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_use_agent_loop(
    server: ModelServer, client: sdk.Anthropic, db: Path, stream: bool
) -> None:
    asks = (
        Call("get_forecast", {"city": "Lisbon"}, "toolu_lisbon"),
        Call("get_forecast", {"city": "Oslo", "units": "metric"}, "toolu_oslo"),
    )
    server.script(Say("I will check both.", calls=asks), Say("Only Oslo needs an umbrella."))
    chunks = Chunks()
    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.run(messages_agent, {"question": "Umbrella?", "stream": stream})
        asked = completed(rt, state.run_id)[0]
    assert (state.status, state.result) == (events.COMPLETED, "Only Oslo needs an umbrella.")
    assert asked["text"] == "I will check both."
    assert asked["finish_reason"] == "tool_use"
    assert asked["tool_calls"] == [
        {"id": "toolu_lisbon", "name": "get_forecast", "arguments": {"city": "Lisbon"}},
        {
            "id": "toolu_oslo",
            "name": "get_forecast",
            "arguments": {"city": "Oslo", "units": "metric"},
        },
    ]
    first, second = server.bodies()
    assert first["tools"] == [
        {
            "name": "get_forecast",
            "description": FORECAST_SCHEMA["description"],
            "input_schema": FORECAST_SCHEMA["parameters"],
        }
    ]
    check_against_signature(first["tools"][0]["input_schema"], get_forecast)
    results = second["messages"][-1]["content"]
    assert [block["tool_use_id"] for block in results] == ["toolu_lisbon", "toolu_oslo"]
    assert json.loads(results[1]["content"])["sky"] == "rain"
    streamed = "".join(chunk.text for chunk in chunks)
    assert streamed == ("I will check both.Only Oslo needs an umbrella." if stream else "")


def test_tool_choice_is_spelled_as_anthropic_spells_it(
    server: ModelServer, client: sdk.Anthropic, db: Path
) -> None:
    server.script(*[Say("ok")] * 3)
    with runtime(db, client) as rt:
        for choice in ("get_forecast", "required", "auto"):
            params = {"tools": ["get_forecast"], "tool_choice": choice}
            rt.run(ask, {"prompt": "Weather?", "params": params})
    assert [body["tool_choice"] for body in server.bodies()] == [
        {"type": "tool", "name": "get_forecast"},
        {"type": "any"},
        {"type": "auto"},
    ]


def test_streamed_text_reaches_on_chunk_in_order(
    server: ModelServer, client: sdk.Anthropic, db: Path
) -> None:
    said = Say(STORY, input_tokens=400, output_tokens=14, cached_tokens=100)
    server.script(said)
    chunks = Chunks()
    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
    assert [chunk.text for chunk in chunks] == said.deltas()
    assert [chunk.first for chunk in chunks] == [True] + [False] * (len(chunks) - 1)
    assert {(c.step, c.attempt) for c in chunks} == {(1, 1)}
    assert state.result["text"] == STORY
    assert state.result["usage"] == {
        "input_tokens": 400,
        "output_tokens": 14,
        "cached_tokens": 100,
        "total_tokens": 414,
    }
    assert server.requests[0].body["stream"] is True


def test_a_stream_cut_off_keeps_its_text_and_the_retry_streams_anew(
    server: ModelServer, client: sdk.Anthropic, db: Path
) -> None:
    deltas = Say(STORY).deltas()
    server.script(Say(STORY, cut_after=2), Say(STORY))
    chunks = Chunks()
    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
        partials = recorded(rt, state.run_id, events.STEP_PARTIAL)
        ((_step, retry),) = recorded(rt, state.run_id, events.STEP_RETRY)
    assert (state.status, state.result["text"]) == (events.COMPLETED, STORY)
    attempt_one = [data for _step, data in partials if data["attempt"] == 1]
    assert attempt_one[-1] == {"attempt": 1, "text": "".join(deltas[:2])}
    assert retry["attempt"] == 1
    assert [(c.attempt, c.first) for c in chunks if c.first] == [(1, True), (2, True)]
    assert [c.text for c in chunks if c.attempt == 2] == deltas


@pytest.mark.parametrize(
    ("fail", "error_type"),
    [
        (Fail(500, "Internal server error"), "InternalServerError"),
        (Fail(529, "Overloaded"), "OverloadedError"),
        (
            Fail(429, "Number of request tokens has exceeded your rate limit", "15"),
            "RateLimitError",
        ),
    ],
    ids=["500", "529", "429"],
)
def test_an_error_is_retried_by_durabl_s_policy(
    server: ModelServer, client: sdk.Anthropic, db: Path, fail: Fail, error_type: str
) -> None:
    server.script(fail, Say("Recovered."))
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Hello?", "params": {}})
        if fail.retry_after is not None:
            # The server asked for 15 s, longer than the policy's backoff: the run waits for it.
            assert state.status == events.SLEEPING
            [retried] = recorded(rt, state.run_id, events.STEP_RETRY)
            started = rt.store.load_log(state.run_id)[-1].at_s
            assert retried[1]["retry_at_s"] - started == pytest.approx(15.0, abs=0.5)
            [state] = rt.tick(retried[1]["retry_at_s"])
        retries = recorded(rt, state.run_id, events.STEP_RETRY)
    assert (state.status, state.result["text"]) == (events.COMPLETED, "Recovered.")
    assert [data["error_type"] for _step, data in retries] == [error_type]
    assert fail.message in retries[0][1]["message"]
    assert len(server.requests) == 2  # the SDK made no retry of its own


def test_an_async_client_s_adapter_returns_a_coroutine_of_the_same_answer(
    server: ModelServer,
) -> None:
    server.script(
        Say("One.", input_tokens=10, output_tokens=2, cached_tokens=4),
        Say("Two.", calls=(Call("get_forecast", {"city": "Oslo"}, "toolu_1"),)),
    )
    client = sdk.AsyncAnthropic(base_url=server.root, api_key="sk-ant-loopback", max_retries=0)
    llm = durabl.llm.anthropic(client, model=MODEL, max_tokens=256)
    pending = [llm("one"), llm("two", stream=True, tools=[get_forecast])]
    assert all(inspect.iscoroutine(each) for each in pending)

    async def answer_all() -> list[Any]:
        try:
            return [await each for each in pending]
        finally:
            await client.close()

    one, two = asyncio.run(answer_all())
    assert one == {
        "provider": "anthropic",
        "model": ANTHROPIC_MODEL,
        "text": "One.",
        "tool_calls": [],
        "finish_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 4, "total_tokens": 12},
    }
    assert two["tool_calls"] == [
        {"id": "toolu_1", "name": "get_forecast", "arguments": {"city": "Oslo"}}
    ]
    assert [body["max_tokens"] for body in server.bodies()] == [256, 256]
