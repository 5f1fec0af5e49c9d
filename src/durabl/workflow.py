"""``@workflow``: the registry of workflows and how a run's input binds to parameters.

A workflow is a generator function, or an async one (``async def`` with ``yield``): the drive
runs the second through an adapter that advances it on an event loop (``durabl.aio``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncGenerator, Callable, Generator, Iterable
from typing import Any, cast

from durabl.errors import UnknownWorkflowError

_REGISTRY: dict[str, Workflow] = {}


class Workflow:
    """A generator function (or an async generator function) registered under a stable name
    (the name is what the log records)."""

    def __init__(
        self,
        fn: Callable[..., Generator[Any, Any, Any] | AsyncGenerator[Any, Any]],
        name: str,
    ) -> None:
        self.is_async = inspect.isasyncgenfunction(fn)
        """An ``async def`` that yields its steps, and ``yield Return(value)`` its result."""
        if inspect.iscoroutinefunction(fn):
            raise TypeError(
                f"@workflow {name!r} is an async function that yields nothing: an async workflow "
                f"yields its steps (plan = yield ModelCall(...)) and its result "
                f"(yield Return(value), from durabl.aio)"
            )
        if not (self.is_async or inspect.isgeneratorfunction(fn)):
            raise TypeError(
                f"@workflow {name!r} must be a generator function: it yields steps "
                f"(ModelCall, ToolCall, Sleep) and returns its result"
            )
        params = list(inspect.signature(fn).parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise TypeError(f"@workflow {name!r} must take ctx as its first positional parameter")
        positional_only = [
            p.name for p in params[1:] if p.kind is inspect.Parameter.POSITIONAL_ONLY
        ]
        if positional_only:
            raise TypeError(
                f"@workflow {name!r}: parameters {positional_only} are positional-only, but input "
                f"binds to parameters by name; remove the '/'"
            )
        self.fn = fn
        self.name = name
        self._params = params[1:]
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(
        self, ctx: Any, *args: Any, **kwargs: Any
    ) -> Generator[Any, Any, Any] | AsyncGenerator[Any, Any]:
        return self.fn(ctx, *args, **kwargs)

    def steps(self, ctx: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        """The generator of steps the drive runs: the workflow's own, or for an async workflow
        the adapter that advances it on an event loop (``durabl.aio.AsyncSteps``, which hands
        the body an async ``ctx``). The drive closes the adapter when its pass ends."""
        if self.is_async:
            from durabl.aio import AsyncSteps  # only async workflows need the loop bridge

            return AsyncSteps(self.fn, ctx, kwargs)
        return cast("Generator[Any, Any, Any]", self.fn(ctx, **kwargs))

    def __repr__(self) -> str:
        return f"<workflow {self.name}>"

    def bind(self, run_input: Any) -> dict[str, Any]:
        """Keyword arguments for the parameters after ctx, taken from the input dict by name.

        Keys that match no parameter stay available as ``ctx.input``. Raises TypeError naming a
        missing key.
        """
        if not self._params:
            return {}
        if run_input is None:
            run_input = {}
        if not isinstance(run_input, dict):
            raise TypeError(
                f"workflow {self.name!r} takes parameters, so its input must be a dict of them, "
                f"got {type(run_input).__name__}"
            )
        kwargs: dict[str, Any] = {}
        for param in self._params:
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                taken = {p.name for p in self._params}
                kwargs.update({k: v for k, v in run_input.items() if k not in taken})
            elif param.kind is inspect.Parameter.VAR_POSITIONAL:
                continue
            elif param.name in run_input:
                kwargs[param.name] = run_input[param.name]
            elif param.default is inspect.Parameter.empty:
                raise TypeError(
                    f"workflow {self.name!r} needs input key {param.name!r}; "
                    f"the input has {sorted(run_input) or 'no keys'}"
                )
        return kwargs


def workflow(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
    """Register a generator function (or an async one) as a workflow: ``@workflow`` or
    ``@workflow(name="...")``."""

    def register(target: Callable[..., Any]) -> Workflow:
        wf = Workflow(target, name or target.__name__)
        _REGISTRY[wf.name] = wf
        return wf

    return register if fn is None else register(fn)


def build_registry(extra: Iterable[Any] | dict[str, Any] | None) -> dict[str, Workflow]:
    """The workflows a runtime knows: ``workflows=`` first, then everything ``@workflow`` saw."""
    found: dict[str, Workflow] = {}
    items = extra.items() if isinstance(extra, dict) else ((None, wf) for wf in extra or ())
    for key, value in items:
        if isinstance(value, Workflow):
            wf = value
        elif callable(value):
            wf = Workflow(value, key or value.__name__)
        else:
            raise TypeError(
                f"workflows must be generator functions (or async generator functions), "
                f"got {value!r}"
            )
        found[key or wf.name] = wf
    return found


def resolve(target: Any, registry: dict[str, Workflow]) -> Workflow:
    """A Workflow from a Workflow, a registered name, or a (sync or async) generator function."""
    if isinstance(target, Workflow):
        return target
    if isinstance(target, str):
        found = registry.get(target) or _REGISTRY.get(target)
        if found is None:
            raise UnknownWorkflowError(name=target, known=set(registry) | set(_REGISTRY))
        return found
    if callable(target):
        return Workflow(target, target.__name__)
    raise TypeError(f"expected a workflow, got {type(target).__name__}")
