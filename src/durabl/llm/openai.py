"""``durabl.llm.openai``: a ``Runtime(llm=...)`` made of an ``openai.OpenAI`` or
``openai.AsyncOpenAI`` client, over Chat Completions (``api="chat"``) or the Responses API
(``api="responses"``).

The Chat Completions format is also what LiteLLM speaks: ``durabl.llm.litellm`` uses this
module's ``chat_request``, ``chat_answer`` and ``ChatReader``. The SDK is imported when an
adapter is made, never at ``import durabl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabl.llm import schemas
from durabl.llm.schemas import field

PROVIDER = "openai"
APIS = ("chat", "responses")
PLAIN_CHOICES = ("auto", "none", "required")
"""``tool_choice`` words OpenAI takes as they are; any other str names the tool to call."""


def openai(client: Any, *, model: str, api: str = "chat", **defaults: Any) -> Callable[..., Any]:
    """``llm(prompt, **params)`` answering through ``client``; an ``AsyncOpenAI`` client's
    returns a coroutine. ``defaults`` are params sent with every call (a call's own override
    them). See ``durabl.llm.schemas`` for the params the adapter reads and the answer."""
    sdk = _sdk()
    if api not in APIS:
        raise ValueError(f"durabl.llm.openai api must be one of {', '.join(APIS)}, got {api!r}")
    if not isinstance(model, str) or not model:
        raise TypeError(f"durabl.llm.openai model must be a model name, got {model!r}")
    is_async = isinstance(client, sdk.AsyncOpenAI)
    if api == "chat":
        return _chat(client, model, defaults, is_async)
    return _responses(client, model, defaults, is_async)


def _sdk() -> Any:
    try:
        import openai as sdk
    except ImportError:
        raise ImportError(
            "durabl.llm.openai needs the openai package: pip install 'durabl[openai]'"
        ) from None
    return sdk


# -- Chat Completions -----------------------------------------------------------------------------


def _chat(client: Any, model: str, defaults: dict[str, Any], is_async: bool) -> Callable[..., Any]:
    if is_async:

        async def llm_async(prompt: Any, **params: Any) -> dict[str, Any]:
            sent = chat_request(model, defaults, prompt, params)
            answered = await client.chat.completions.create(**sent)
            if not sent.get("stream"):
                return chat_answer(answered)
            return await schemas.streamed_async(answered, ChatReader())

        return llm_async

    def llm(prompt: Any, **params: Any) -> dict[str, Any]:
        sent = chat_request(model, defaults, prompt, params)
        answered = client.chat.completions.create(**sent)
        if not sent.get("stream"):
            return chat_answer(answered)
        return schemas.streamed(answered, ChatReader())

    return llm


def chat_request(
    model: str, defaults: dict[str, Any], prompt: Any, params: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of a Chat Completions request (the system prompt as the first
    message; with ``stream``, usage asked for in the stream)."""
    call = schemas.request(model, defaults, prompt, params)
    messages = call.messages
    if call.system is not None:
        messages = [{"role": "system", "content": call.system}, *messages]
    sent: dict[str, Any] = {"model": call.model, "messages": messages, **call.extra}
    if call.tools:
        sent["tools"] = schemas.offered(call.tools, schemas.chat_tool)
    if call.tool_choice is not None:
        sent["tool_choice"] = _choice(call.tool_choice, lambda name: {"function": {"name": name}})
    if call.stream:
        sent["stream"] = True
        sent["stream_options"] = {"include_usage": True, **(call.extra.get("stream_options") or {})}
    return sent


def _choice(choice: Any, naming: Callable[[str], dict[str, Any]]) -> Any:
    if isinstance(choice, str) and choice not in PLAIN_CHOICES:
        return {"type": "function", **naming(choice)}
    return choice


def chat_answer(response: Any, provider: str = PROVIDER) -> dict[str, Any]:
    """The normalized answer of a Chat Completions response (an SDK object or a dict)."""
    choices = field(response, "choices", [])
    choice = choices[0] if choices else None
    message = field(choice, "message")
    calls = [
        schemas.tool_call(
            field(call, "id"),
            field(field(call, "function"), "name"),
            field(field(call, "function"), "arguments"),
        )
        for call in field(message, "tool_calls", [])
    ]
    return schemas.answer(
        provider=provider,
        model=field(response, "model"),
        text=field(message, "content"),
        tool_calls=calls,
        finish_reason=field(choice, "finish_reason"),
        usage=chat_usage(field(response, "usage")),
    )


def chat_usage(usage: Any) -> dict[str, int]:
    return schemas.usage(
        field(usage, "prompt_tokens"),
        field(usage, "completion_tokens"),
        field(field(usage, "prompt_tokens_details"), "cached_tokens"),
        field(usage, "total_tokens"),
    )


class ChatReader:
    """A streamed Chat Completion, chunk by chunk: the text, each tool call's pieces (by index),
    why it finished, and the usage of the last chunk."""

    def __init__(self, provider: str = PROVIDER) -> None:
        self.provider = provider
        self.model: Any = None
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: Any = None
        self.usage: Any = None

    def add(self, chunk: Any) -> str:
        self.model = self.model or field(chunk, "model")
        self.usage = field(chunk, "usage") or self.usage
        added = ""
        for choice in field(chunk, "choices", []):
            if field(choice, "index", 0) != 0:
                continue  # n > 1: the answer is the first choice, as without a stream
            delta = field(choice, "delta")
            added += field(delta, "content", "")
            for piece in field(delta, "tool_calls", []):
                self._add_call(piece)
            self.finish_reason = field(choice, "finish_reason") or self.finish_reason
        self.text.append(added)
        return added

    def _add_call(self, piece: Any) -> None:
        call = self.calls.setdefault(field(piece, "index", 0), {"id": "", "name": "", "args": []})
        call["id"] = call["id"] or field(piece, "id", "")
        function = field(piece, "function")
        call["name"] = call["name"] or field(function, "name", "")
        call["args"].append(field(function, "arguments", ""))

    def answer(self) -> dict[str, Any]:
        if self.finish_reason is None:
            raise schemas.unfinished(self.provider, "no chunk gave a finish_reason")
        calls = [
            schemas.tool_call(call["id"], call["name"], "".join(call["args"]))
            for _index, call in sorted(self.calls.items())
        ]
        return schemas.answer(
            provider=self.provider,
            model=self.model,
            text="".join(self.text),
            tool_calls=calls,
            finish_reason=self.finish_reason,
            usage=chat_usage(self.usage),
        )


# -- the Responses API ----------------------------------------------------------------------------


def _responses(
    client: Any, model: str, defaults: dict[str, Any], is_async: bool
) -> Callable[..., Any]:
    if is_async:

        async def llm_async(prompt: Any, **params: Any) -> dict[str, Any]:
            sent = responses_request(model, defaults, prompt, params)
            answered = await client.responses.create(**sent)
            if not sent.get("stream"):
                return responses_answer(answered)
            return await schemas.streamed_async(answered, ResponsesReader())

        return llm_async

    def llm(prompt: Any, **params: Any) -> dict[str, Any]:
        sent = responses_request(model, defaults, prompt, params)
        answered = client.responses.create(**sent)
        if not sent.get("stream"):
            return responses_answer(answered)
        return schemas.streamed(answered, ResponsesReader())

    return llm


def responses_request(
    model: str, defaults: dict[str, Any], prompt: Any, params: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of a Responses request: the messages as ``input``, the system
    prompt as ``instructions``, ``max_tokens`` as ``max_output_tokens``."""
    call = schemas.request(model, defaults, prompt, params)
    extra = dict(call.extra)
    if "max_tokens" in extra:
        extra.setdefault("max_output_tokens", extra.pop("max_tokens"))
    sent: dict[str, Any] = {"model": call.model, "input": call.messages, **extra}
    if call.system is not None:
        sent["instructions"] = call.system
    if call.tools:
        sent["tools"] = schemas.offered(call.tools, schemas.responses_tool)
    if call.tool_choice is not None:
        sent["tool_choice"] = _choice(call.tool_choice, lambda name: {"name": name})
    if call.stream:
        sent["stream"] = True
    return sent


def responses_answer(response: Any) -> dict[str, Any]:
    """The normalized answer of a Responses API response."""
    text: list[str] = []
    calls = []
    for item in field(response, "output", []):
        kind = field(item, "type")
        if kind == "message":
            parts = field(item, "content", [])
            text += [
                field(part, "text", "") for part in parts if field(part, "type") == "output_text"
            ]
        elif kind == "function_call":
            calls.append(
                schemas.tool_call(
                    field(item, "call_id"), field(item, "name"), field(item, "arguments")
                )
            )
    used = field(response, "usage")
    return schemas.answer(
        provider=PROVIDER,
        model=field(response, "model"),
        text="".join(text),
        tool_calls=calls,
        finish_reason=field(field(response, "incomplete_details"), "reason")
        or field(response, "status"),
        usage=schemas.usage(
            field(used, "input_tokens"),
            field(used, "output_tokens"),
            field(field(used, "input_tokens_details"), "cached_tokens"),
            field(used, "total_tokens"),
        ),
    )


class ResponsesReader:
    """A streamed response: the text deltas as they come, and the whole response from the
    ``response.completed`` (or ``response.incomplete``) event that ends the stream."""

    ENDS = ("response.completed", "response.incomplete")

    def __init__(self) -> None:
        self.final: Any = None

    def add(self, event: Any) -> str:
        kind = field(event, "type")
        if kind == "response.output_text.delta":
            return str(field(event, "delta", ""))
        if kind in self.ENDS:
            self.final = field(event, "response")
        elif kind in ("response.failed", "error"):
            error = field(field(event, "response"), "error") or event
            raise RuntimeError(
                f"the openai response failed: {field(error, 'code')}: {field(error, 'message')}"
            )
        return ""

    def answer(self) -> dict[str, Any]:
        if self.final is None:
            raise schemas.unfinished(PROVIDER, "no response.completed event")
        return responses_answer(self.final)
