"""What the model client adapters share: the tool schemas a request offers, derived from the
tools' Python signatures and docstrings; the request a ModelCall's prompt and params make; how a
streamed answer reaches the step it answers; and the one plain-JSON answer every adapter returns.

A tool's schema is the provider-neutral ``{"name", "description", "parameters"}``: the
description is the docstring's first paragraph, the parameters a JSON Schema object built from
the signature (a parameter without a default is required; its description comes from an
"Args:" or NumPy "Parameters" section). ``idempotency_key``, which durabl fills in, is never
offered to the model. ``chat_tool``, ``responses_tool`` and ``anthropic_tool`` put it in each
provider's shape.

Every adapter answers with::

    {"provider": str, "model": str | None, "text": str | None,
     "tool_calls": [{"id": str, "name": str, "arguments": dict}],
     "finish_reason": str | None,
     "usage": {"input_tokens", "output_tokens", "cached_tokens", "total_tokens"}}

``input_tokens`` counts every input token, those read from the prompt cache (``cached_tokens``)
included; ``finish_reason`` is the provider's own word for why the answer ended.
"""

from __future__ import annotations

import collections.abc
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from durabl.errors import UnknownToolError
from durabl.modelcall import current

# -- the tool schema of a Python function ---------------------------------------------------------

FILLED_BY_DURABL = frozenset({"idempotency_key"})
"""Parameters durabl passes itself: never offered to the model."""

_SCALARS: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}
_ARRAYS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable)
_OBJECTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)
_GOOGLE_ARGS = re.compile(r"^(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments):$")
_NUMPY_ARGS = ("Parameters", "Other Parameters")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_ENTRY = re.compile(r"^(\w+)\s*(?::.*)?$")
_SECTION = re.compile(r"^[A-Z][A-Za-z ]*:$")


def tool_schema(tool: Any) -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` of a ``durabl.Tool`` (or a plain function):
    what a model is told about it."""
    fn = getattr(tool, "fn", tool)
    name = getattr(tool, "name", None) or getattr(fn, "__name__", None) or repr(fn)
    summary, documented = _read_docstring(inspect.getdoc(fn) or "")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a callable object or partial, or annotations that do not resolve
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    open_ended = False
    for param in inspect.signature(fn).parameters.values():
        if param.name in FILLED_BY_DURABL or param.kind is param.VAR_POSITIONAL:
            continue
        if param.kind is param.VAR_KEYWORD:
            open_ended = True
            continue
        if param.kind is param.POSITIONAL_ONLY:
            raise TypeError(
                f"tool {name!r} has the positional-only parameter {param.name!r}, which a "
                f"ToolCall (keyword arguments) cannot pass; make it an ordinary parameter"
            )
        where = f"tool {name!r} parameter {param.name!r}"
        schema = _type_schema(hints.get(param.name, param.annotation), where)
        if param.name in documented:
            schema = {**schema, "description": documented[param.name]}
        if param.default is param.empty:
            required.append(param.name)
        elif _is_json(param.default):
            schema = {**schema, "default": param.default}
        properties[param.name] = schema
    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not open_ended:
        parameters["additionalProperties"] = False
    return {"name": name, "description": summary, "parameters": parameters}


def _type_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON Schema of one annotation."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = _type_schema(args[0], where)
        notes = [note for note in args[1:] if isinstance(note, str)]
        return {**inner, "description": notes[0]} if notes else inner
    if isinstance(annotation, type) and annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}
    if origin is typing.Literal:
        return _enum_schema(list(args), where)
    if origin is typing.Union or origin is types.UnionType:
        return _union_schema([_type_schema(arg, where) for arg in args])
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return _enum_schema([member.value for member in annotation], where)
    if annotation in _ARRAYS or origin in _ARRAYS:
        return _array_schema(origin, args, where)
    if annotation in _OBJECTS or origin in _OBJECTS:
        values = _type_schema(args[1], where) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": values} if values else {"type": "object"}
    raise TypeError(
        f"{where} is annotated {annotation!r}, which has no JSON Schema here; use str, int, "
        f"float, bool, list[...], dict[str, ...], Literal[...], an Enum or X | None"
    )


def _array_schema(origin: Any, args: tuple[Any, ...], where: str) -> dict[str, Any]:
    if origin is tuple and args and args[-1] is not Ellipsis:
        items = [_type_schema(arg, where) for arg in args]
        return {
            "type": "array",
            "prefixItems": items,
            "minItems": len(items),
            "maxItems": len(items),
        }
    items_schema = _type_schema(args[0], where) if args else {}
    return {"type": "array", "items": items_schema} if items_schema else {"type": "array"}


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    kinds = set()
    for value in values:
        if not _is_json(value) or isinstance(value, list | dict):
            raise TypeError(f"{where} allows the value {value!r}, which is not a JSON scalar")
        kinds.add(_SCALARS[type(value)])
    return {"type": kinds.pop(), "enum": values} if len(kinds) == 1 else {"enum": values}


def _union_schema(members: list[dict[str, Any]]) -> dict[str, Any]:
    """``X | Y``: one ``type`` list when every member is a bare type, else ``anyOf``."""
    if any(not member for member in members):
        return {}
    if all(set(member) == {"type"} for member in members):
        names = [member["type"] for member in members]
        return {"type": names[0] if len(names) == 1 else names}
    return {"anyOf": members}


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _read_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph, and each parameter's description from a Google "Args:" or a NumPy
    "Parameters" section."""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _GOOGLE_ARGS.match(line.strip()) or _SECTION.match(line.strip()):
            break
        summary.append(line.strip())
    documented: dict[str, str] = {}
    for at, line in enumerate(lines):
        header = line.strip()
        if _GOOGLE_ARGS.match(header):
            documented.update(_google_args(lines[at + 1 :], _indent(line)))
        elif header in _NUMPY_ARGS and at + 1 < len(lines) and set(lines[at + 1].strip()) == {"-"}:
            documented.update(_numpy_args(lines[at + 2 :], _indent(line)))
    return " ".join(summary), documented


def _google_args(lines: list[str], header_indent: int) -> dict[str, str]:
    entries: dict[str, list[str]] = {}
    entry_indent: int | None = None
    name = ""
    for line in lines:
        if not line.strip():
            continue
        indent = _indent(line)
        if indent <= header_indent:
            break
        entry_indent = indent if entry_indent is None else entry_indent
        found = _GOOGLE_ENTRY.match(line.strip()) if indent == entry_indent else None
        if found:
            name = found.group(1)
            entries[name] = [found.group(2)]
        elif name:
            entries[name].append(line.strip())
    return {key: " ".join(part for part in parts if part) for key, parts in entries.items()}


def _numpy_args(lines: list[str], header_indent: int) -> dict[str, str]:
    entries: dict[str, list[str]] = {}
    name = ""
    for at, line in enumerate(lines):
        if not line.strip():
            continue
        following = lines[at + 1].strip() if at + 1 < len(lines) else ""
        if _indent(line) <= header_indent and following and set(following) == {"-"}:
            break  # the next section's header
        found = _NUMPY_ENTRY.match(line.strip()) if _indent(line) <= header_indent else None
        if found:
            name = found.group(1)
            entries[name] = []
        elif name:
            entries[name].append(line.strip())
    return {key: " ".join(parts) for key, parts in entries.items()}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def chat_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool as OpenAI Chat Completions (and LiteLLM) take it."""
    return {"type": "function", "function": schema}


def responses_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool as the OpenAI Responses API takes it."""
    return {"type": "function", **schema}


def anthropic_tool(schema: dict[str, Any]) -> dict[str, Any]:
    """A tool as the Anthropic Messages API takes it."""
    return {
        "name": schema["name"],
        "description": schema["description"],
        "input_schema": schema["parameters"],
    }


def offered(tools: Any, shape: Callable[[dict[str, Any]], dict[str, Any]]) -> list[dict[str, Any]]:
    """The schemas of ``tools=[...]`` in a provider's ``shape``. Each entry is the name of a tool
    registered with the runtime, a ``durabl.Tool`` or function (for a client called outside a
    durabl step), or a dict: a schema already in the provider's shape, sent as it is."""
    if not isinstance(tools, list | tuple):
        raise TypeError(f"tools= must be a list of tool names, got {type(tools).__name__}")
    context = current()
    registered: Mapping[str, Any] = context.tools if context is not None else {}
    schemas = []
    for entry in tools:
        if isinstance(entry, dict):
            schemas.append(entry)
        elif callable(entry):
            schemas.append(shape(tool_schema(entry)))
        elif not isinstance(entry, str):
            raise TypeError(f"tools= entries must be tool names, got {entry!r}")
        elif entry in registered:
            schemas.append(shape(tool_schema(registered[entry])))
        elif context is not None:
            raise UnknownToolError(
                run_id=context.run_id, position=context.step, tool=entry, registered=registered
            )
        else:
            raise LookupError(
                f"tools=[{entry!r}] names a registered tool, but this model call is not inside "
                f"a durabl step, so no tools are registered; pass the function itself"
            )
    return schemas


# -- the request a ModelCall makes ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """A ModelCall's prompt and params, sorted into what the adapters treat themselves and
    what they pass through to the provider (``extra``: temperature, max_tokens, ...)."""

    model: str
    messages: list[Any]
    system: str | list[Any] | None
    tools: Any
    tool_choice: Any
    stream: bool
    extra: dict[str, Any]


def request(
    model: str, defaults: Mapping[str, Any], prompt: Any, params: Mapping[str, Any]
) -> Request:
    """Sort a call: the per-call ``params`` override the adapter's ``defaults`` (``model=``
    included); a str prompt is one user message, a list is the messages."""
    extra = {**defaults, **params}
    system = extra.pop("system", None)
    if system is not None and not isinstance(system, str | list):
        raise TypeError(
            f"system= must be a str (or a list of content blocks), got {type(system).__name__}"
        )
    return Request(
        model=extra.pop("model", model),
        messages=_messages(prompt),
        system=system,
        tools=extra.pop("tools", None),
        tool_choice=extra.pop("tool_choice", None),
        stream=bool(extra.pop("stream", False)),
        extra=extra,
    )


def _messages(prompt: Any) -> list[Any]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, list):
        return list(prompt)
    raise TypeError(
        f"a model prompt must be a str (one user message) or a list of messages, "
        f"got {type(prompt).__name__}"
    )


# -- streaming ------------------------------------------------------------------------------------


class Reader(Protocol):
    """Builds one answer from the events of a provider's stream."""

    def add(self, event: Any) -> str:
        """Take one event; the text it adds to the answer ("" for none)."""
        ...

    def answer(self) -> dict[str, Any]:
        """The whole answer; raises if the stream ended before the answer did."""
        ...


def streamed(events: Iterable[Any], reader: Reader) -> dict[str, Any]:
    """Read a stream to its end, handing each piece of text to the step it answers."""
    with _keeping_partial():
        try:
            for event in events:
                _relay(reader.add(event))
        finally:
            _close(events)
        return reader.answer()


async def streamed_async(events: AsyncIterable[Any], reader: Reader) -> dict[str, Any]:
    """``streamed``, for an async client's stream."""
    with _keeping_partial():
        try:
            async for event in events:
                _relay(reader.add(event))
        finally:
            closed = _close(events)
            if inspect.isawaitable(closed):
                await closed
        return reader.answer()


def _relay(text: str) -> None:
    context = current()
    if context is not None and text:
        context.chunk(text)


@contextmanager
def _keeping_partial() -> Iterator[None]:
    """A stream that breaks off records the text it had got (STEP_PARTIAL) before it raises."""
    try:
        yield
    except BaseException:
        context = current()
        if context is not None:
            context.flush()
        raise


def _close(events: Any) -> Any:
    close = getattr(events, "close", None)
    return close() if callable(close) else None


def unfinished(provider: str, got: str) -> ConnectionError:
    """What a stream that ended without its last event raises (the connection closed early)."""
    return ConnectionError(
        f"the {provider} stream ended before the answer did ({got}); the answer is incomplete"
    )


# -- the answer -----------------------------------------------------------------------------------


def field(value: Any, name: str, default: Any = None) -> Any:
    """``value.name`` or ``value[name]``: the SDKs answer with objects, or dicts when asked to;
    None for a missing field or a missing value."""
    if value is None:
        return default
    found = value.get(name) if isinstance(value, dict) else getattr(value, name, None)
    return default if found is None else found


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """One tool call, its arguments parsed from the JSON text the model wrote (or taken as the
    dict a provider parsed already)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            raise ValueError(
                f"the model called tool {name!r} with arguments that are not JSON: {exc}: "
                f"{arguments[:200]!r}"
            ) from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ValueError(
            f"the model called tool {name!r} with arguments that are not a JSON object: "
            f"{arguments!r}"
        )
    return {"id": str(call_id), "name": str(name), "arguments": arguments}


def usage(
    input_tokens: Any, output_tokens: Any, cached_tokens: Any = 0, total_tokens: Any = None
) -> dict[str, int]:
    tokens_in, tokens_out = _count(input_tokens), _count(output_tokens)
    total = _count(total_tokens) or tokens_in + tokens_out
    return {
        "input_tokens": tokens_in,
        "output_tokens": tokens_out,
        "cached_tokens": _count(cached_tokens),
        "total_tokens": total,
    }


def _count(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def answer(
    *,
    provider: str,
    model: Any,
    text: Any,
    tool_calls: list[dict[str, Any]],
    finish_reason: Any,
    usage: dict[str, int],
) -> dict[str, Any]:
    """The one answer every adapter returns (see the module docstring)."""
    return {
        "provider": provider,
        "model": None if model is None else str(model),
        "text": str(text) if text else None,
        "tool_calls": tool_calls,
        "finish_reason": None if finish_reason is None else str(finish_reason),
        "usage": usage,
    }
