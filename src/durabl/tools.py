"""Tools: ``tool()``, ``ToolMode``, ``RetryPolicy``, and how a tool is called."""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any

from durabl.checks import check_int, check_type


class ToolMode(enum.StrEnum):
    """What durabl may do after a crash inside a tool's ambiguous window."""

    IDEMPOTENT = "IDEMPOTENT"
    """Call the tool again: at-least-once invocation, one observable effect if it is idempotent."""
    AT_MOST_ONCE = "AT_MOST_ONCE"
    """Never guess: dead-letter the step and stop the run for an operator."""

    @classmethod
    def parse(cls, value: ToolMode | str) -> ToolMode:
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"unknown tool mode {value!r}; use ToolMode.IDEMPOTENT or ToolMode.AT_MOST_ONCE "
                f"(or the strings 'IDEMPOTENT' / 'AT_MOST_ONCE')"
            ) from None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often a failing step is attempted, and how long to wait between attempts.

    The wait is a durable timer: the run parks and the process may exit in between.
    """

    max_attempts: int = 3
    base_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 60.0

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise TypeError(f"RetryPolicy max_attempts must be an int, got {self.max_attempts!r}")
        if self.max_attempts < 1:
            raise ValueError(
                f"RetryPolicy max_attempts must be at least 1, got {self.max_attempts}"
            )
        for name in ("base_delay", "multiplier", "max_delay"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise ValueError(f"RetryPolicy {name} must be a finite number >= 0, got {value!r}")

    def delay_s(self, failed_attempt: int) -> float:
        """Seconds to wait after attempt number ``failed_attempt`` (1-based) failed."""
        try:
            grown = self.base_delay * self.multiplier ** (failed_attempt - 1)
        except OverflowError:
            return float(self.max_delay)
        return float(min(self.max_delay, grown))


def _accepts_key(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes ``idempotency_key`` as a keyword-only parameter."""
    code = _plain_code(fn)
    if code is not None:
        first = code.co_argcount
        return "idempotency_key" in code.co_varnames[first : first + code.co_kwonlyargcount]
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    param = params.get("idempotency_key")
    return param is not None and param.kind is inspect.Parameter.KEYWORD_ONLY


def _plain_code(fn: Any) -> CodeType | None:
    """The code whose parameters are ``fn``'s own, for a plain function or an instance of a
    class whose ``__call__`` is one: read straight off it, where ``inspect.signature`` costs
    tens of microseconds per tool in every ``Runtime()``. None for anything else (a class, a partial, a
    builtin, a decorated function that names its ``__wrapped__``, an explicit
    ``__signature__``), which ``inspect.signature`` reads."""
    target = fn if type(fn) is FunctionType else _own_call(type(fn))
    if type(target) is not FunctionType or isinstance(fn, type):
        return None
    if hasattr(fn, "__wrapped__") or hasattr(fn, "__signature__"):
        return None
    if target is not fn and (hasattr(target, "__wrapped__") or hasattr(target, "__signature__")):
        return None
    return target.__code__


def _own_call(cls: type) -> Any:
    """The ``__call__`` that instances of ``cls`` run: the first class in its MRO to define it."""
    for klass in cls.__mro__:
        if "__call__" in vars(klass):
            return vars(klass)["__call__"]
    return None


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable the runtime may invoke, with its crash semantics."""

    fn: Callable[..., Any]
    name: str
    mode: ToolMode = ToolMode.AT_MOST_ONCE
    max_attempts: int | None = None
    retry: RetryPolicy | None = None
    wants_key: bool = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def policy(self, default: RetryPolicy) -> RetryPolicy:
        """The retry policy in force: the tool's own, else the runtime's, capped by max_attempts.

        An AT_MOST_ONCE tool that says nothing about retries is attempted once: an exception
        from it does not prove the effect did not happen.
        """
        base = self.retry or default
        attempts = self.max_attempts
        if attempts is None and self.retry is None and self.mode is ToolMode.AT_MOST_ONCE:
            attempts = 1
        if attempts is None:
            return base
        return RetryPolicy(attempts, base.base_delay, base.multiplier, base.max_delay)


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    mode: ToolMode | str = ToolMode.AT_MOST_ONCE,
    max_attempts: int | None = None,
    retry: RetryPolicy | None = None,
) -> Any:
    """Wrap ``fn`` as a tool; usable as ``tool(fn, mode=...)`` or as a decorator ``@tool(...)``."""
    parsed = ToolMode.parse(mode)
    if max_attempts is not None:
        check_int("tool max_attempts", max_attempts, at_least=1)
    if retry is not None:
        check_type("tool retry", retry, RetryPolicy)

    def wrap(target: Callable[..., Any]) -> Tool:
        if not callable(target):
            raise TypeError(f"tool() needs a callable, got {target!r}")
        tool_name = name or getattr(target, "__name__", None) or repr(target)
        return Tool(target, tool_name, parsed, max_attempts, retry, _accepts_key(target))

    return wrap if fn is None else wrap(fn)


def build_registry(tools: Mapping[str, Any] | None) -> dict[str, Tool]:
    """Normalise the ``tools=`` argument: names map to Tool; a bare callable is AT_MOST_ONCE."""
    registry: dict[str, Tool] = {}
    for key, value in (tools or {}).items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"tool names must be non-empty strings, got {key!r}")
        if isinstance(value, Tool):
            registry[key] = (
                value
                if value.name == key
                else Tool(
                    value.fn, key, value.mode, value.max_attempts, value.retry, value.wants_key
                )
            )
        elif callable(value):
            registry[key] = Tool(value, key, ToolMode.AT_MOST_ONCE, None, None, _accepts_key(value))
        else:
            raise TypeError(
                f"tool {key!r} must be a callable or a Tool, got {type(value).__name__}"
            )
    return registry
