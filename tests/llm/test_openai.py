"""``durabl.llm.openai`` with the real OpenAI SDK against a loopback server, in real runs: the
answer and its cost recorded, a function-calling agent loop, streaming into ``on_chunk``, a
stream that breaks off, and errors retried by durabl's RetryPolicy (the SDK's own retries off)."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai as sdk
import pytest

import durabl.llm
from durabl import ModelCall, ProcessDeath, RetryPolicy, Runtime, ToolCall, events, workflow
from durabl.llm import Chunk

from .servers import OPENAI_MODEL, Call, Fail, ModelServer, Say
from .support import (
    FORECAST_SCHEMA,
    FORECASTS,
    TOOLS,
    Chunks,
    ask,
    check_against_signature,
    completed,
    get_forecast,
    recorded,
)

NO_WAIT = RetryPolicy(max_attempts=3, base_delay=0)
STORY = "Sea otters eat the urchins that would otherwise eat the kelp."


@pytest.fixture
def client(server: ModelServer) -> Iterator[sdk.OpenAI]:
    with sdk.OpenAI(
        base_url=server.base_url, api_key="sk-loopback", max_retries=0, timeout=10
    ) as made:
        yield made


def runtime(db: Path, client: sdk.OpenAI, api: str = "chat", **options: Any) -> Runtime:
    llm = durabl.llm.openai(client, model="gpt-4o-mini", api=api)
    return Runtime(db, llm=llm, tools=TOOLS, retry=options.pop("retry", NO_WAIT), **options)


# -- Chat Completions: the answer -----------------------------------------------------------------


def test_a_plain_answer_is_recorded_with_its_usage_and_cost(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(Say(STORY, input_tokens=1000, output_tokens=500, cached_tokens=200))
    llm = durabl.llm.openai(client, model="gpt-4o-mini", temperature=0.2)
    params = {"system": "Answer in one sentence.", "max_tokens": 60}
    with Runtime(db, llm=llm) as rt:
        state = rt.run(ask, {"prompt": "Why do kelp forests need otters?", "params": params})
        logged = completed(rt, state.run_id)
    # gpt-4o-mini: $0.15 per million input tokens, $0.075 cached, $0.60 output
    dollars = (800 * 0.15 + 200 * 0.075 + 500 * 0.60) / 1_000_000
    expected = {
        "provider": "openai",
        "model": OPENAI_MODEL,
        "text": STORY,
        "tool_calls": [],
        "finish_reason": "stop",
        "usage": {
            "input_tokens": 1000,
            "output_tokens": 500,
            "cached_tokens": 200,
            "total_tokens": 1500,
        },
        "cost_usd": pytest.approx(dollars, abs=1e-12),
    }
    assert state.status == events.COMPLETED
    assert logged == [expected]
    assert state.result == expected
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-loopback"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Answer in one sentence."},
            {"role": "user", "content": "Why do kelp forests need otters?"},
        ],
        "temperature": 0.2,
        "max_tokens": 60,
    }


@pytest.mark.parametrize(
    ("model", "dollars"),
    [
        ("gpt-4o-mini-2024-07-18", (80 * 0.15 + 20 * 0.075 + 50 * 0.60) / 1_000_000),
        ("gpt-4o-2024-08-06", (80 * 2.50 + 20 * 1.25 + 50 * 10.00) / 1_000_000),
        ("acme-frontier-1", None),
    ],
)
def test_the_cost_is_priced_by_the_model_that_answered(
    server: ModelServer, client: sdk.OpenAI, db: Path, model: str, dollars: float | None
) -> None:
    server.script(Say("Yes.", model=model, input_tokens=100, output_tokens=50, cached_tokens=20))
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Is kelp a plant?", "params": {}})
        (logged,) = completed(rt, state.run_id)
    assert logged["model"] == model
    assert "cost_usd" in logged
    assert logged["cost_usd"] == (None if dollars is None else pytest.approx(dollars, abs=1e-12))


def test_a_call_s_params_override_the_defaults_and_pass_through(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(Say(calls=(Call("get_forecast", {"city": "Oslo"}),)))
    llm = durabl.llm.openai(client, model="gpt-4o-mini", temperature=0.2, seed=7)
    params = {"model": "gpt-4o", "temperature": 0.9, "tools": ["get_forecast"]}
    params["tool_choice"] = "get_forecast"
    with Runtime(db, llm=llm, tools=TOOLS) as rt:
        rt.run(ask, {"prompt": "Weather in Oslo?", "params": params})
    body = server.requests[0].body
    assert (body["model"], body["temperature"], body["seed"]) == ("gpt-4o", 0.9, 7)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_forecast"}}


# -- Chat Completions: a function-calling agent ---------------------------------------------------


@workflow(name="llm_openai_chat_agent")
def chat_agent(ctx: Any, question: str, stream: bool) -> Any:
    """Ask, call the tools the model asks for, send their results back, until it answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    for _turn in range(4):
        answer = yield ModelCall(messages, tools=["get_forecast"], stream=stream)
        if not answer["tool_calls"]:
            return answer["text"]
        messages.append(
            {
                "role": "assistant",
                "content": answer["text"],
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"]),
                        },
                    }
                    for call in answer["tool_calls"]
                ],
            }
        )
        for call in answer["tool_calls"]:
            result = yield ToolCall(call["name"], call["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
    raise RuntimeError("the model kept asking for tools")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_calling_agent_loop(
    server: ModelServer, client: sdk.OpenAI, db: Path, stream: bool
) -> None:
    asks = (
        Call("get_forecast", {"city": "Lisbon"}, "call_lisbon"),
        Call("get_forecast", {"city": "Oslo", "day": "today"}, "call_oslo"),
    )
    reply = "Sun in Lisbon; take an umbrella to Oslo."
    server.script(Say(calls=asks), Say(reply))
    with runtime(db, client) as rt:
        state = rt.run(chat_agent, {"question": "Umbrella for Lisbon or Oslo?", "stream": stream})
        steps = [data[0] for _step, data in recorded(rt, state.run_id, events.STEP_STARTED)]
        results = completed(rt, state.run_id)
    assert (state.status, state.result) == (events.COMPLETED, reply)
    assert steps == ["model", "tool", "tool", "model"]
    assert results[0]["tool_calls"] == [
        {"id": "call_lisbon", "name": "get_forecast", "arguments": {"city": "Lisbon"}},
        {"id": "call_oslo", "name": "get_forecast", "arguments": {"city": "Oslo", "day": "today"}},
    ]
    assert results[1:3] == [
        {"city": "Lisbon", "day": "tomorrow", **FORECASTS["Lisbon"]},
        {"city": "Oslo", "day": "today", **FORECASTS["Oslo"]},
    ]

    first, second = server.bodies()
    assert first["tools"] == [{"type": "function", "function": FORECAST_SCHEMA}]
    check_against_signature(first["tools"][0]["function"]["parameters"], get_forecast)
    assert second["tools"] == first["tools"]
    assistant, *tool_messages = second["messages"][1:]
    assert assistant["tool_calls"][1]["function"] == {
        "name": "get_forecast",
        "arguments": '{"city": "Oslo", "day": "today"}',
    }
    assert [(m["role"], m["tool_call_id"]) for m in tool_messages] == [
        ("tool", "call_lisbon"),
        ("tool", "call_oslo"),
    ]
    assert json.loads(tool_messages[1]["content"]) == results[2]


# -- streaming ------------------------------------------------------------------------------------


def test_streamed_text_reaches_on_chunk_in_order(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    said = Say(STORY, input_tokens=300, output_tokens=12)
    server.script(said)
    chunks = Chunks()
    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
        partials = recorded(rt, state.run_id, events.STEP_PARTIAL)
    assert [chunk.text for chunk in chunks] == said.deltas()
    assert len(chunks) > 5
    assert [chunk.first for chunk in chunks] == [True] + [False] * (len(chunks) - 1)
    assert {(c.run_id, c.step, c.attempt) for c in chunks} == {(state.run_id, 1, 1)}
    assert state.result["text"] == STORY
    assert state.result["usage"]["input_tokens"] == 300
    assert state.result["cost_usd"] == pytest.approx((300 * 0.15 + 12 * 0.60) / 1e6, abs=1e-12)
    assert server.requests[0].body["stream_options"] == {"include_usage": True}
    assert partials[0] == (1, {"attempt": 1, "text": said.deltas()[0]})
    assert all(STORY.startswith(data["text"]) for _step, data in partials)


def by_attempt(chunks: list[Chunk]) -> dict[int, list[tuple[str, bool]]]:
    seen: dict[int, list[tuple[str, bool]]] = {}
    for chunk in chunks:
        seen.setdefault(chunk.attempt, []).append((chunk.text, chunk.first))
    return seen


def test_a_stream_cut_off_keeps_its_text_and_the_retry_streams_anew(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    said = Say(STORY)
    deltas = said.deltas()
    server.script(Say(STORY, cut_after=3), said)
    chunks = Chunks()
    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
        log = [(e.kind, json.loads(e.data or "null")) for e in rt.store.load_log(state.run_id)]
    assert state.status == events.COMPLETED
    assert state.result["text"] == STORY
    kinds = [kind for kind, _data in log]
    broke = kinds.index(events.STEP_RETRY)
    partial_before = [data for kind, data in log[:broke] if kind == events.STEP_PARTIAL]
    assert partial_before[-1] == {"attempt": 1, "text": "".join(deltas[:3])}
    assert log[broke][1]["error_type"] == "APIConnectionError"
    assert kinds[broke + 1 :].count(events.STEP_COMPLETED) == 1
    assert by_attempt(chunks) == {
        1: [(text, index == 0) for index, text in enumerate(deltas[:3])],
        2: [(text, index == 0) for index, text in enumerate(deltas)],
    }


def test_a_process_dying_mid_stream_leaves_the_text_and_the_next_process_asks_again(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    said = Say(STORY)
    deltas = said.deltas()
    server.script(said, said)
    chunks = Chunks()

    def dies_at_the_fourth(chunk: Chunk) -> None:
        chunks(chunk)
        if len(chunks) == 4:
            raise ProcessDeath("mid-stream")

    with runtime(db, client, on_chunk=dies_at_the_fourth) as rt, pytest.raises(ProcessDeath):
        rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}}, run_id="dies")
    with runtime(db, client) as rt:
        left = recorded(rt, "dies", events.STEP_PARTIAL)
    assert left[-1] == (1, {"attempt": 1, "text": "".join(deltas[:4])})

    with runtime(db, client, on_chunk=chunks) as rt:
        state = rt.resume("dies")
    assert (state.status, state.result["text"]) == (events.COMPLETED, STORY)
    assert by_attempt(chunks) == {
        1: [(text, index == 0) for index, text in enumerate(deltas[:4])],
        2: [(text, index == 0) for index, text in enumerate(deltas)],
    }
    assert len(server.requests) == 2


# -- errors, retried by durabl --------------------------------------------------------------------


def test_a_server_error_is_retried_by_durabl_s_policy(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(Fail(500), Say("Recovered."))
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Hello?", "params": {}})
        retries = recorded(rt, state.run_id, events.STEP_RETRY)
    assert (state.status, state.result["text"]) == (events.COMPLETED, "Recovered.")
    assert [(step, data["error_type"], data["attempt"]) for step, data in retries] == [
        (1, "InternalServerError", 1)
    ]
    assert "Error code: 500" in retries[0][1]["message"]
    assert len(server.requests) == 2  # the SDK made no retry of its own


def test_a_server_that_keeps_failing_fails_the_step_after_the_policy_s_attempts(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(Fail(500), Fail(502), Fail(503))
    with runtime(db, client) as rt:
        state = rt.run(ask, {"prompt": "Hello?", "params": {}})
    assert state.status == events.FAILED
    assert "ModelCall failed after 3 attempts: InternalServerError" in (state.error or "")
    assert len(server.requests) == 3


def test_a_rate_limit_parks_the_run_for_the_longer_of_retry_after_and_the_backoff(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(
        Fail(429, "Rate limit reached for gpt-4o-mini.", retry_after="20"),  # shorter: backoff
        Fail(429, "Rate limit reached for gpt-4o-mini.", retry_after="90"),  # longer: it
        Say("Later."),
    )
    now = [1_000.0]
    policy = RetryPolicy(max_attempts=3, base_delay=30, multiplier=1)
    with runtime(db, client, retry=policy, clock=lambda: now[0]) as rt:
        parked = rt.run(ask, {"prompt": "Hello?", "params": {}}, run_id="limited")
        assert rt.tick(now[0] + 29) == []
        now[0] += 30
        (again,) = rt.tick()
        assert (again.status, again.wake_at_s) == (events.SLEEPING, 1_120.0)
        assert rt.tick(now[0] + 89) == []
        now[0] += 90
        (done,) = rt.tick()
        retries = [data for _step, data in recorded(rt, "limited", events.STEP_RETRY)]
    assert (parked.status, parked.wake_at_s) == (events.SLEEPING, 1_030.0)
    assert [(r["error_type"], r["retry_at_s"]) for r in retries] == [
        ("RateLimitError", 1_030.0),
        ("RateLimitError", 1_120.0),
    ]
    assert "Rate limit reached" in retries[0]["message"]
    assert (done.status, done.result["text"]) == (events.COMPLETED, "Later.")
    assert len(server.requests) == 3


# -- the Responses API ----------------------------------------------------------------------------


def test_the_responses_api_answers_with_usage_and_cost(
    server: ModelServer, client: sdk.OpenAI, db: Path
) -> None:
    server.script(Say(STORY, input_tokens=1000, output_tokens=500, cached_tokens=200))
    params = {"system": "Answer in one sentence.", "max_tokens": 60}
    with runtime(db, client, api="responses") as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": params})
    assert state.result == {
        "provider": "openai",
        "model": OPENAI_MODEL,
        "text": STORY,
        "tool_calls": [],
        "finish_reason": "completed",
        "usage": {
            "input_tokens": 1000,
            "output_tokens": 500,
            "cached_tokens": 200,
            "total_tokens": 1500,
        },
        "cost_usd": pytest.approx((800 * 0.15 + 200 * 0.075 + 500 * 0.60) / 1e6, abs=1e-12),
    }
    (sent,) = server.requests
    assert sent.path == "/v1/responses"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "input": [{"role": "user", "content": "Why otters?"}],
        "instructions": "Answer in one sentence.",
        "max_output_tokens": 60,
    }


@workflow(name="llm_openai_responses_agent")
def responses_agent(ctx: Any, question: str, stream: bool) -> Any:
    items: list[Any] = [{"role": "user", "content": question}]
    for _turn in range(4):
        answer = yield ModelCall(items, tools=["get_forecast"], stream=stream)
        if not answer["tool_calls"]:
            return answer["text"]
        for call in answer["tool_calls"]:
            arguments = json.dumps(call["arguments"])
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": call["name"],
                    "arguments": arguments,
                }
            )
            result = yield ToolCall(call["name"], call["arguments"])
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": call["id"],
                    "output": json.dumps(result),
                }
            )
    raise RuntimeError("the model kept asking for tools")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_calling_agent_loop_over_the_responses_api(
    server: ModelServer, client: sdk.OpenAI, db: Path, stream: bool
) -> None:
    server.script(
        Say("Let me look.", calls=(Call("get_forecast", {"city": "Oslo"}, "call_oslo"),)),
        Say("Take an umbrella."),
    )
    chunks = Chunks()
    with runtime(db, client, api="responses", on_chunk=chunks) as rt:
        state = rt.run(responses_agent, {"question": "Umbrella in Oslo?", "stream": stream})
        (asked, _result, _answer) = completed(rt, state.run_id)
    assert (state.status, state.result) == (events.COMPLETED, "Take an umbrella.")
    assert asked["text"] == "Let me look."
    assert asked["tool_calls"] == [
        {"id": "call_oslo", "name": "get_forecast", "arguments": {"city": "Oslo"}}
    ]
    first, second = server.bodies()
    assert first["tools"] == [{"type": "function", **FORECAST_SCHEMA}]
    assert [item.get("type") for item in second["input"]] == [
        None,
        "function_call",
        "function_call_output",
    ]
    assert json.loads(second["input"][2]["output"])["sky"] == "rain"
    streamed = "".join(chunk.text for chunk in chunks)
    assert streamed == ("Let me look.Take an umbrella." if stream else "")


# -- async clients --------------------------------------------------------------------------------


def test_an_async_client_s_adapter_returns_a_coroutine_of_the_same_answer(
    server: ModelServer,
) -> None:
    server.script(
        Say("One.", input_tokens=10, output_tokens=2),
        Say("Two, streamed.", calls=(Call("get_forecast", {"city": "Oslo"}),)),
        Say("Three."),
    )
    client = sdk.AsyncOpenAI(base_url=server.base_url, api_key="sk-loopback", max_retries=0)
    chat = durabl.llm.openai(client, model="gpt-4o-mini")
    responses = durabl.llm.openai(client, model="gpt-4o-mini", api="responses")
    pending = [
        chat("one"),
        chat("two", stream=True, tools=[get_forecast]),
        responses("three", stream=True),
    ]
    assert all(inspect.iscoroutine(each) for each in pending)

    async def answer_all() -> list[Any]:
        try:
            return [await each for each in pending]
        finally:
            await client.close()

    one, two, three = asyncio.run(answer_all())
    assert one == {
        "provider": "openai",
        "model": OPENAI_MODEL,
        "text": "One.",
        "tool_calls": [],
        "finish_reason": "stop",
        "usage": {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 0, "total_tokens": 12},
    }
    assert (two["text"], two["tool_calls"][0]["arguments"]) == ("Two, streamed.", {"city": "Oslo"})
    assert three["text"] == "Three."
    assert server.bodies()[1]["tools"] == [{"type": "function", "function": FORECAST_SCHEMA}]
