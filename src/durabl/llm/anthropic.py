"""``durabl.llm.anthropic``: a ``Runtime(llm=...)`` made of an ``anthropic.Anthropic`` or
``anthropic.AsyncAnthropic`` client, over the Messages API.

Anthropic counts the input read from its prompt cache (``cache_read_input_tokens``) and written
to it (``cache_creation_input_tokens``) apart from ``input_tokens``; the answer's
``input_tokens`` adds them up, so that it counts every input token, as OpenAI's does. The SDK is
imported when an adapter is made, never at ``import durabl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabl.llm import schemas
from durabl.llm.schemas import field

PROVIDER = "anthropic"
CHOICES = {
    "auto": {"type": "auto"},
    "any": {"type": "any"},
    "required": {"type": "any"},
    "none": {"type": "none"},
}
"""``tool_choice`` words, as Anthropic spells them; any other str names the tool to call."""


def anthropic(
    client: Any, *, model: str, max_tokens: int = 1024, **defaults: Any
) -> Callable[..., Any]:
    """``llm(prompt, **params)`` answering through ``client``; an ``AsyncAnthropic`` client's
    returns a coroutine. ``defaults`` are params sent with every call (a call's own override
    them, ``max_tokens`` too). See ``durabl.llm.schemas`` for the params and the answer."""
    sdk = _sdk()
    if not isinstance(model, str) or not model:
        raise TypeError(f"durabl.llm.anthropic model must be a model name, got {model!r}")
    defaults = {"max_tokens": max_tokens, **defaults}
    if isinstance(client, sdk.AsyncAnthropic):

        async def llm_async(prompt: Any, **params: Any) -> dict[str, Any]:
            sent = messages_request(model, defaults, prompt, params)
            answered = await client.messages.create(**sent)
            if not sent.get("stream"):
                return messages_answer(answered)
            return await schemas.streamed_async(answered, MessagesReader())

        return llm_async

    def llm(prompt: Any, **params: Any) -> dict[str, Any]:
        sent = messages_request(model, defaults, prompt, params)
        answered = client.messages.create(**sent)
        if not sent.get("stream"):
            return messages_answer(answered)
        return schemas.streamed(answered, MessagesReader())

    return llm


def _sdk() -> Any:
    try:
        import anthropic as sdk
    except ImportError:
        raise ImportError(
            "durabl.llm.anthropic needs the anthropic package: pip install 'durabl[anthropic]'"
        ) from None
    return sdk


def messages_request(
    model: str, defaults: dict[str, Any], prompt: Any, params: dict[str, Any]
) -> dict[str, Any]:
    """The keyword arguments of a Messages request."""
    call = schemas.request(model, defaults, prompt, params)
    sent: dict[str, Any] = {"model": call.model, "messages": call.messages, **call.extra}
    if call.system is not None:
        sent["system"] = call.system
    if call.tools:
        sent["tools"] = schemas.offered(call.tools, schemas.anthropic_tool)
    choice = call.tool_choice
    if isinstance(choice, str):
        choice = CHOICES.get(choice, {"type": "tool", "name": choice})
    if choice is not None:
        sent["tool_choice"] = choice
    if call.stream:
        sent["stream"] = True
    return sent


def messages_answer(message: Any) -> dict[str, Any]:
    """The normalized answer of a Messages response (an SDK object or a dict)."""
    text: list[str] = []
    calls = []
    for block in field(message, "content", []):
        kind = field(block, "type")
        if kind == "text":
            text.append(field(block, "text", ""))
        elif kind == "tool_use":
            calls.append(
                schemas.tool_call(field(block, "id"), field(block, "name"), field(block, "input"))
            )
    return schemas.answer(
        provider=PROVIDER,
        model=field(message, "model"),
        text="".join(text),
        tool_calls=calls,
        finish_reason=field(message, "stop_reason"),
        usage=messages_usage(field(message, "usage")),
    )


def messages_usage(usage: Any) -> dict[str, int]:
    read = field(usage, "cache_read_input_tokens", 0)
    written = field(usage, "cache_creation_input_tokens", 0)
    return schemas.usage(
        field(usage, "input_tokens", 0) + read + written, field(usage, "output_tokens"), read
    )


class MessagesReader:
    """A streamed message, event by event: ``message_start`` names the model and the input's
    usage, each content block grows by its deltas, ``message_delta`` says why it stopped and
    how many tokens it wrote, ``message_stop`` ends it."""

    USAGE = (
        "input_tokens",
        "output_tokens",
        "cache_read_input_tokens",
        "cache_creation_input_tokens",
    )

    def __init__(self) -> None:
        self.model: Any = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self.stop_reason: Any = None
        self.usage: dict[str, Any] = {}
        self.stopped = False

    def add(self, event: Any) -> str:
        kind = field(event, "type")
        if kind == "message_start":
            message = field(event, "message")
            self.model = field(message, "model")
            self._count(field(message, "usage"))
        elif kind == "content_block_start":
            block = field(event, "content_block")
            self.blocks[field(event, "index", 0)] = {
                "type": field(block, "type"),
                "id": field(block, "id"),
                "name": field(block, "name"),
                "parts": [field(block, "text", "")],
            }
        elif kind == "content_block_delta":
            return self._grow(self.blocks[field(event, "index", 0)], field(event, "delta"))
        elif kind == "message_delta":
            self.stop_reason = field(field(event, "delta"), "stop_reason") or self.stop_reason
            self._count(field(event, "usage"))
        elif kind == "message_stop":
            self.stopped = True
        return ""

    def _grow(self, block: dict[str, Any], delta: Any) -> str:
        kind = field(delta, "type")
        if kind == "text_delta":
            text = str(field(delta, "text", ""))
            block["parts"].append(text)
            return text
        if kind == "input_json_delta":
            block["parts"].append(field(delta, "partial_json", ""))
        return ""

    def _count(self, usage: Any) -> None:
        for name in self.USAGE:
            value = field(usage, name)
            if value is not None:
                self.usage[name] = value  # message_delta's counts are the totals so far

    def answer(self) -> dict[str, Any]:
        if not self.stopped:
            raise schemas.unfinished(PROVIDER, "no message_stop event")
        content = []
        for _index, block in sorted(self.blocks.items()):
            joined = "".join(block["parts"])
            if block["type"] == "text":
                content.append({"type": "text", "text": joined})
            elif block["type"] == "tool_use":
                content.append({**block, "input": joined})
        return messages_answer(
            {
                "model": self.model,
                "content": content,
                "stop_reason": self.stop_reason,
                "usage": self.usage,
            }
        )
