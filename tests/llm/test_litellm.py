"""``durabl.llm.litellm`` with the real LiteLLM, its "openai/" provider pointed at the loopback
server, in real runs: the answer and its cost, a function-calling agent loop, streaming into
``on_chunk``, a stream that breaks off, and a server error retried by durabl's RetryPolicy
(LiteLLM's own retries off: ``max_retries=0``)."""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import durabl.llm
from durabl import ModelCall, RetryPolicy, Runtime, ToolCall, events, workflow

from .servers import OPENAI_MODEL, Call, Fail, ModelServer, Say
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

# LiteLLM makes pydantic warn as it builds its types, and leaves an event loop of its own unclosed
# after a call (the suite turns warnings into errors): the warnings are LiteLLM's, not durabl's.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning"),
    pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince211"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
    pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"),
]


@pytest.fixture(autouse=True)
def collect_litellm_s_garbage() -> Iterator[None]:
    """Collect what LiteLLM left unclosed while this module's filters are in force, so that its
    warnings are not raised in whichever test the garbage collector happens to run next."""
    yield
    gc.collect()


NO_WAIT = RetryPolicy(max_attempts=3, base_delay=0)
STORY = "Sea otters eat the urchins that would otherwise eat the kelp."


def adapter(server: ModelServer, **options: Any) -> Any:
    return durabl.llm.litellm(
        model="openai/gpt-4o-mini",
        api_base=server.base_url,
        api_key="sk-loopback",
        max_retries=0,
        timeout=10,
        **options,
    )


def runtime(db: Path, server: ModelServer, **options: Any) -> Runtime:
    return Runtime(db, llm=adapter(server), tools=TOOLS, retry=NO_WAIT, **options)


def test_a_plain_answer_is_recorded_with_its_usage_and_cost(server: ModelServer, db: Path) -> None:
    server.script(Say(STORY, input_tokens=1000, output_tokens=500, cached_tokens=200))
    params = {"system": "Answer in one sentence.", "temperature": 0.2}
    with runtime(db, server) as rt:
        state = rt.run(ask, {"prompt": "Why do kelp forests need otters?", "params": params})
        logged = completed(rt, state.run_id)
    dollars = (800 * 0.15 + 200 * 0.075 + 500 * 0.60) / 1_000_000
    expected = {
        "provider": "litellm",
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
    assert (state.status, state.result) == (events.COMPLETED, expected)
    assert logged == [expected]
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "gpt-4o-mini"  # the provider prefix is LiteLLM's, not sent
    assert sent.body["messages"] == [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "Why do kelp forests need otters?"},
    ]
    assert sent.body["temperature"] == 0.2


def test_an_unknown_model_is_priced_as_unknown(server: ModelServer, db: Path) -> None:
    server.script(Say("Yes.", model="acme-frontier-1"))
    with runtime(db, server) as rt:
        state = rt.run(ask, {"prompt": "Is kelp a plant?", "params": {}})
    assert (state.result["model"], state.result["cost_usd"]) == ("acme-frontier-1", None)


@workflow(name="llm_litellm_agent")
def chat_agent(ctx: Any, question: str, stream: bool) -> Any:
    messages: list[Any] = [{"role": "user", "content": question}]
    for _turn in range(4):
        answer = yield ModelCall(messages, tools=["get_forecast"], stream=stream)
        if not answer["tool_calls"]:
            return answer["text"]
        calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
            }
            for call in answer["tool_calls"]
        ]
        messages.append({"role": "assistant", "content": answer["text"], "tool_calls": calls})
        for call in answer["tool_calls"]:
            result = yield ToolCall(call["name"], call["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}
            )
    raise RuntimeError("the model kept asking for tools")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_calling_agent_loop(server: ModelServer, db: Path, stream: bool) -> None:
    server.script(
        Say(calls=(Call("get_forecast", {"city": "Oslo", "day": "today"}, "call_oslo"),)),
        Say("Take an umbrella."),
    )
    with runtime(db, server) as rt:
        state = rt.run(chat_agent, {"question": "Umbrella in Oslo?", "stream": stream})
        asked, forecast, _answer = completed(rt, state.run_id)
    assert (state.status, state.result) == (events.COMPLETED, "Take an umbrella.")
    assert asked["tool_calls"] == [
        {"id": "call_oslo", "name": "get_forecast", "arguments": {"city": "Oslo", "day": "today"}}
    ]
    first, second = server.bodies()
    assert first["tools"] == [{"type": "function", "function": FORECAST_SCHEMA}]
    check_against_signature(first["tools"][0]["function"]["parameters"], get_forecast)
    tool_message = second["messages"][-1]
    assert (tool_message["role"], tool_message["tool_call_id"]) == ("tool", "call_oslo")
    assert json.loads(tool_message["content"]) == forecast


def test_streamed_text_reaches_on_chunk_in_order(server: ModelServer, db: Path) -> None:
    said = Say(STORY, input_tokens=300, output_tokens=12)
    server.script(said)
    chunks = Chunks()
    with runtime(db, server, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
    assert "".join(chunk.text for chunk in chunks) == STORY
    assert [chunk.text for chunk in chunks] == said.deltas()
    assert [chunk.first for chunk in chunks] == [True] + [False] * (len(chunks) - 1)
    assert state.result["text"] == STORY
    assert state.result["usage"]["input_tokens"] == 300
    assert server.requests[0].body["stream_options"] == {"include_usage": True}


def test_a_stream_cut_off_keeps_its_text_and_the_retry_streams_anew(
    server: ModelServer, db: Path
) -> None:
    deltas = Say(STORY).deltas()
    server.script(Say(STORY, cut_after=3), Say(STORY))
    chunks = Chunks()
    with runtime(db, server, on_chunk=chunks) as rt:
        state = rt.run(ask, {"prompt": "Why otters?", "params": {"stream": True}})
        partials = recorded(rt, state.run_id, events.STEP_PARTIAL)
        retries = recorded(rt, state.run_id, events.STEP_RETRY)
    assert (state.status, state.result["text"]) == (events.COMPLETED, STORY)
    attempt_one = [data for _step, data in partials if data["attempt"] == 1]
    assert attempt_one[-1] == {"attempt": 1, "text": "".join(deltas[:3])}
    assert [data["attempt"] for _step, data in retries] == [1]
    assert [(c.attempt, c.first) for c in chunks if c.first] == [(1, True), (2, True)]
    assert [c.text for c in chunks if c.attempt == 2] == deltas


def test_a_server_error_is_retried_by_durabl_s_policy(server: ModelServer, db: Path) -> None:
    server.script(Fail(500), Say("Recovered."))
    with runtime(db, server) as rt:
        state = rt.run(ask, {"prompt": "Hello?", "params": {}})
        retries = recorded(rt, state.run_id, events.STEP_RETRY)
    assert (state.status, state.result["text"]) == (events.COMPLETED, "Recovered.")
    assert [data["error_type"] for _step, data in retries] == ["InternalServerError"]
    assert len(server.requests) == 2  # LiteLLM made no retry of its own


def test_use_async_returns_a_coroutine_of_the_same_answer(server: ModelServer) -> None:
    server.script(Say("One.", input_tokens=10, output_tokens=2), Say("Two, streamed."))
    llm = adapter(server, use_async=True)
    pending = [llm("one"), llm("two", stream=True)]
    assert all(inspect.iscoroutine(each) for each in pending)

    async def answer_all() -> list[Any]:
        return [await each for each in pending]

    one, two = asyncio.run(answer_all())
    assert one == {
        "provider": "litellm",
        "model": OPENAI_MODEL,
        "text": "One.",
        "tool_calls": [],
        "finish_reason": "stop",
        "usage": {"input_tokens": 10, "output_tokens": 2, "cached_tokens": 0, "total_tokens": 12},
    }
    assert two["text"] == "Two, streamed."
