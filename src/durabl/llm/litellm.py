"""``durabl.llm.litellm``: a ``Runtime(llm=...)`` made of ``litellm.completion`` (or, with
``use_async=True``, ``litellm.acompletion``), which reaches a hundred providers by one model
string ("openai/gpt-4o-mini", "anthropic/claude-sonnet-4-20250514", ...).

LiteLLM answers in the Chat Completions format whatever the provider, so the request and the
answer are read as ``durabl.llm.openai`` reads them. ``api_base=``, ``api_key=``,
``num_retries=`` and the rest pass through to LiteLLM as defaults or per call. The package is
imported when an adapter is made, never at ``import durabl``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from durabl.llm import schemas
from durabl.llm.openai import ChatReader, chat_answer, chat_request

PROVIDER = "litellm"


def litellm(*, model: str, use_async: bool = False, **defaults: Any) -> Callable[..., Any]:
    """``llm(prompt, **params)`` answering through LiteLLM; with ``use_async`` it returns a
    coroutine. ``defaults`` are params sent with every call (a call's own override them). See
    ``durabl.llm.schemas`` for the params the adapter reads and the answer."""
    sdk = _sdk()
    if not isinstance(model, str) or not model:
        raise TypeError(f"durabl.llm.litellm model must be a model name, got {model!r}")
    if use_async:

        async def llm_async(prompt: Any, **params: Any) -> dict[str, Any]:
            sent = chat_request(model, defaults, prompt, params)
            answered = await sdk.acompletion(**sent)
            if not sent.get("stream"):
                return chat_answer(answered, PROVIDER)
            return await schemas.streamed_async(answered, ChatReader(PROVIDER))

        return llm_async

    def llm(prompt: Any, **params: Any) -> dict[str, Any]:
        sent = chat_request(model, defaults, prompt, params)
        answered = sdk.completion(**sent)
        if not sent.get("stream"):
            return chat_answer(answered, PROVIDER)
        return schemas.streamed(answered, ChatReader(PROVIDER))

    return llm


def _sdk() -> Any:
    try:
        import litellm as sdk
    except ImportError:
        raise ImportError(
            "durabl.llm.litellm needs the litellm package: pip install 'durabl[litellm]'"
        ) from None
    return sdk
