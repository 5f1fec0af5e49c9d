"""What a workflow yields: ModelCall, ToolCall, Sleep, WaitSignal and Parallel, and their
fingerprints.

A step is a description of work, never the work itself. Each step has a canonical text (the JSON
of its type and arguments) and a fingerprint of that text; replay compares fingerprints to tell
"the same step as last time" from "the workflow drifted".
"""

from __future__ import annotations

import json
import math
from typing import Any, ClassVar, Protocol, runtime_checkable

from durabl import codec
from durabl.checks import check_text
from durabl.errors import BadStepError, EncodingError

DERIVED_KEY_PREFIX = "durabl:"
"""Derived idempotency keys start with this; explicit keys may not, so the two never collide."""

_json_str = json.encoder.encode_basestring_ascii
"""``json.dumps`` of a str (the same text, byte for byte) without its Python-level overhead:
a ToolCall is built at every yield, replayed or not, and its canonical text is fingerprinted."""


def derived_key(run_id: str, position: int) -> str:
    """The idempotency key of a tool step that was given none: unique to the run and position."""
    return f"{DERIVED_KEY_PREFIX}{run_id}:{position}"


MAX_SLEEP_S = 100 * 365 * 86400.0
"""Longest accepted Sleep: a century. Anything longer is a unit mistake, not a plan."""


class Step:
    """Base class of everything a workflow may yield."""

    __slots__ = ("_fp", "canonical")
    kind: ClassVar[str] = ""
    width: ClassVar[int] = 1
    """How many positions of the run's log the step takes (a Parallel: one per branch, more)."""
    canonical: str
    _fp: str | None
    """The fingerprint, once read: each kind's ``__init__`` sets it to None beside
    ``canonical`` (an unset slot would raise AttributeError on the first read)."""

    @property
    def fingerprint(self) -> str:
        fp = self._fp
        if fp is None:
            fp = self._fp = codec.fingerprint(self.canonical)
        return fp

    def describe(self) -> str:
        raise NotImplementedError

    def served(self, recorded: Any) -> Any:
        """What the workflow gets for the result the log records (the same, but for a wait
        whose record says how it ended)."""
        return recorded

    def __repr__(self) -> str:
        return self.describe()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Step) and other.canonical == self.canonical

    def __hash__(self) -> int:
        return hash(self.canonical)


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ModelCall(Step):
    """Ask the runtime's model: ``llm(prompt, **params)``. Re-executed after an ambiguous crash."""

    __slots__ = ("params_text", "prompt_text")
    kind = "model"

    def __init__(self, prompt: Any, **params: Any) -> None:
        self.prompt_text = codec.encode(prompt, what="ModelCall prompt")
        self.params_text = codec.encode(params, what="ModelCall params")
        self._fp = None
        self.canonical = f'["model",{self.prompt_text},{self.params_text}]'

    @property
    def prompt(self) -> Any:
        """The prompt as the model will see it (after the canonical JSON round trip)."""
        return codec.decode(self.prompt_text)

    @property
    def params(self) -> dict[str, Any]:
        return codec.decode(self.params_text)

    def describe(self) -> str:
        shown = self.prompt if isinstance(self.prompt, str) else self.prompt_text
        return f"ModelCall({_short(repr(shown))})"


class ToolCall(Step):
    """Call the registered tool ``name`` with ``args`` as keyword arguments."""

    __slots__ = ("args_text", "idempotency_key", "name")
    kind = "tool"

    def __init__(
        self,
        name: str,
        args: dict[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> None:
        if type(name) is not str or not name:  # check_text's rule, without its call per yield
            check_text("ToolCall name", name)
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise TypeError(
                f"ToolCall({name!r}) args must be a dict of keyword arguments, "
                f"got {type(args).__name__}"
            )
        if idempotency_key is None:
            key_text = "null"
        else:
            check_text(f"ToolCall({name!r}) idempotency_key", idempotency_key)
            if idempotency_key.startswith(DERIVED_KEY_PREFIX):
                raise ValueError(
                    f"ToolCall({name!r}) idempotency_key {idempotency_key!r} starts with "
                    f"{DERIVED_KEY_PREFIX!r}, which durabl reserves for the keys it derives "
                    "itself"
                )
            key_text = _json_str(idempotency_key)
        self.name = name
        try:
            self.args_text = args_text = codec.encode(args)
        except EncodingError as exc:  # named here, not by a function made at every yield
            raise EncodingError(what=f"ToolCall({name!r}) args", reason=exc.reason) from None
        self.idempotency_key = idempotency_key
        self._fp = None
        self.canonical = f'["tool",{_json_str(name)},{args_text},{key_text}]'

    @property
    def args(self) -> dict[str, Any]:
        """The arguments as the tool will see them (after the canonical JSON round trip).

        Decoded on demand: a replayed step never needs them.
        """
        return codec.decode(self.args_text)

    def describe(self) -> str:
        return f"ToolCall({self.name!r}, {_short(self.args_text)})"


class Sleep(Step):
    """A durable timer: the deadline is recorded when armed and survives restarts."""

    __slots__ = ("seconds",)
    kind = "sleep"

    def __init__(
        self,
        seconds: float = 0.0,
        *,
        minutes: float = 0.0,
        hours: float = 0.0,
        days: float = 0.0,
    ) -> None:
        parts = {"seconds": seconds, "minutes": minutes, "hours": hours, "days": days}
        for label, value in parts.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Sleep {label} must be a number, got {value!r}")
        try:
            total = float(seconds) + minutes * 60.0 + hours * 3600.0 + days * 86400.0
        except OverflowError:
            total = math.inf
        if math.isnan(total) or total < 0:
            raise ValueError(f"Sleep duration must be zero or more seconds, got {total!r}")
        if total > MAX_SLEEP_S:
            raise ValueError(
                f"Sleep duration of {total!r} s is longer than a century; check the unit"
            )
        self.seconds = total
        self._fp = None
        self.canonical = f'["sleep",{json.dumps(total)}]'

    def describe(self) -> str:
        return f"Sleep({self.seconds:.15g} s)"


class _TimedOut:
    """What a ``WaitSignal`` returns when its timeout passes first: test it with ``is``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "TIMED_OUT"

    def __reduce__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT = _TimedOut()
"""What ``yield WaitSignal(name, timeout=...)`` returns when no signal came in time."""


class WaitSignal(Step):
    """Wait, durably, for a signal sent to the run (``Runtime.signal``, ``durabl signal``):
    the yield returns its payload, or ``TIMED_OUT`` once ``timeout`` (seconds or a
    ``timedelta``; None waits for ever) has passed without one. A signal sent before the wait
    is kept and taken by the first wait for its name; each is taken once."""

    __slots__ = ("name", "timeout_s")
    kind = "signal"

    def __init__(self, name: str, *, timeout: Any = None) -> None:
        if not isinstance(name, str) or not name:
            raise TypeError(f"WaitSignal name must be a non-empty string, got {name!r}")
        seconds = None
        if timeout is not None:
            total = getattr(timeout, "total_seconds", None)
            seconds = total() if callable(total) else timeout
            if isinstance(seconds, bool) or not isinstance(seconds, int | float):
                raise TypeError(
                    f"WaitSignal timeout must be seconds or a timedelta, got {timeout!r}"
                )
            if math.isnan(seconds) or seconds < 0 or seconds > MAX_SLEEP_S:
                raise ValueError(
                    f"WaitSignal timeout must be between 0 s and a century, got {seconds!r}"
                )
            seconds = float(seconds)
        self.name = name
        self.timeout_s = seconds
        self._fp = None
        self.canonical = f'["signal",{codec.encode_str(name)},{json.dumps(seconds)}]'

    def describe(self) -> str:
        timeout = "" if self.timeout_s is None else f", timeout={self.timeout_s:.15g} s"
        return f"WaitSignal({self.name!r}{timeout})"

    def served(self, recorded: Any) -> Any:
        if isinstance(recorded, dict) and recorded.get("timed_out") is True:
            return TIMED_OUT
        return recorded["payload"] if isinstance(recorded, dict) else recorded


class Parallel(Step):
    """Run model and tool calls concurrently: ``results = yield Parallel([ToolCall(...),
    ModelCall(...)])`` returns their results in the order given, whatever order they finished
    in. Each branch is a step of its own (its own transaction, tool mode and retries), at the
    positions after the Parallel's own, so after a crash only the unfinished ones run again.

    When a branch fails for good, the others settle first (``fail_fast``: branches not yet
    begun are not begun), then the failure of the first failed branch in the order given is
    thrown into the workflow. ``max_concurrency`` bounds this call's branches running at
    once, within the runtime's own bound (``Runtime(parallelism=...)``); it is not part of the
    step's identity, so it can be tuned under running runs."""

    __slots__ = ("fail_fast", "max_concurrency", "steps")
    kind = "parallel"

    def __init__(
        self,
        steps: Any,
        *,
        max_concurrency: int | None = None,
        fail_fast: bool = False,
    ) -> None:
        if isinstance(steps, Step) or not hasattr(steps, "__iter__"):
            raise BadStepError(
                f"Parallel takes a list of steps, got {type(steps).__name__} {steps!r}"
            )
        branches = list(steps)
        if not branches:
            raise BadStepError("Parallel([]) has no steps to run; give it at least one")
        for index, branch in enumerate(branches):
            if isinstance(branch, Parallel):
                raise BadStepError(
                    f"Parallel step {index} is itself a Parallel; nesting is not supported: "
                    f"put its steps in the outer list"
                )
            if not isinstance(branch, ModelCall | ToolCall):
                raise BadStepError(
                    f"Parallel step {index} is {branch!r} ({type(branch).__name__}); a Parallel "
                    f"runs ModelCall and ToolCall steps"
                )
        if max_concurrency is not None and (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise BadStepError(
                f"Parallel max_concurrency must be a whole number of 1 or more, "
                f"got {max_concurrency!r}"
            )
        if not isinstance(fail_fast, bool):
            raise BadStepError(f"Parallel fail_fast must be True or False, got {fail_fast!r}")
        self.steps: tuple[ModelCall | ToolCall, ...] = tuple(branches)
        self.max_concurrency = max_concurrency
        self.fail_fast = fail_fast
        inner = ",".join(branch.canonical for branch in branches)
        self._fp = None
        self.canonical = f'["parallel",[{inner}],{json.dumps(fail_fast)}]'

    @property
    def width(self) -> int:  # type: ignore[override]
        return 1 + len(self.steps)

    def describe(self) -> str:
        return _describe_parallel(len(self.steps), [b.describe() for b in self.steps])


def _describe_parallel(count: int, branches: list[str]) -> str:
    shown = ", ".join(branches[:2]) + (", …" if count > 2 else "")
    steps = "step" if count == 1 else "steps"
    return _short(f"Parallel({count} {steps}: {shown})", 120)


def child_run_id(parent_id: str, position: int, explicit: str | None) -> str:
    """The run id of the child a ChildRun at ``position`` of run ``parent_id`` starts: its own
    ``run_id``, or one derived from the parent's and the position (so a replay names the same
    child, and no two children of one run share an id)."""
    return explicit if explicit is not None else f"{parent_id}-{position}"


@runtime_checkable
class Registered(Protocol):
    """What ``@workflow`` returns, as a ChildRun sees it: a name, and input binding."""

    name: str

    def bind(self, run_input: Any) -> dict[str, Any]: ...


class ChildRun(Step):
    """Run a workflow as a run of its own and wait for its result: ``result = yield
    ChildRun(summarise, {"text": text})``. The child has its own log, is listed and driven
    like any run, and names its parent; it is created in the same transaction that records
    this step, and its end is recorded in this run's log in the transaction that ends it, so a
    crash anywhere leaves neither an orphan nor a second child. A child that fails or is
    cancelled throws ``ChildRunFailed`` here; cancelling this run cancels the child.

    ``workflow``: a ``@workflow`` or its registered name (a worker that drives the child must
    know it). ``run_id``: the child's id (default: derived from this run's id and the step)."""

    __slots__ = ("input_text", "run_id", "workflow")
    kind = "child"

    def __init__(self, workflow: Any, input: Any = None, *, run_id: str | None = None) -> None:
        name = workflow if isinstance(workflow, str) else getattr(workflow, "name", None)
        if not isinstance(name, str) or not name or not isinstance(workflow, str | Registered):
            raise BadStepError(
                f"ChildRun takes a @workflow or its registered name, got "
                f"{type(workflow).__name__} {workflow!r}; decorate the function with @workflow"
            )
        try:
            self.input_text = codec.encode(input, what=f"the input of ChildRun({name!r})")
            if run_id is not None:
                check_text(f"ChildRun({name!r}) run_id", run_id)
        except (TypeError, ValueError) as exc:
            raise BadStepError(str(exc)) from None
        self.workflow = name
        self.run_id = run_id
        self._fp = None
        self.canonical = (
            f'["child",{codec.encode_str(name)},{self.input_text},{json.dumps(run_id)}]'
        )

    def describe(self) -> str:
        return f"ChildRun({self.workflow!r}, {_short(self.input_text)})"


class ContinueAsNew(Step):
    """End this run and go on as a new run of the same workflow with ``input`` and a fresh
    log: ``yield ContinueAsNew({"turn": n + 1, "summary": summary})``. For loops without end
    (a chat session, a monitor), so that no run's history grows without bound. This run ends
    CONTINUED, naming the next; the next is created in the same transaction, names this one,
    keeps its parent if it has one, and takes over the signals sent here and not yet taken.
    Nothing after the yield runs."""

    __slots__ = ("input_text",)
    kind = "continue"

    def __init__(self, input: Any = None) -> None:
        try:
            self.input_text = codec.encode(input, what="the input of ContinueAsNew")
        except TypeError as exc:
            raise BadStepError(str(exc)) from None
        self._fp = None
        self.canonical = f'["continue",{self.input_text}]'

    def describe(self) -> str:
        return f"ContinueAsNew({_short(self.input_text)})"


class CtxValue(Step):
    """A non-deterministic value read through ctx (now, random, uuid), recorded once."""

    __slots__ = ("what",)
    kind = "ctx"

    def __init__(self, what: str) -> None:
        self.what = what
        self._fp = None
        self.canonical = f'["ctx","{what}"]'

    def describe(self) -> str:
        return f"ctx.{self.what}()"


class PatchMarker(CtxValue):
    """The record that a run took the new branch of ``ctx.patched(patch_id)``: a ctx value
    whose recorded value is always true. Its absence where the log holds another step is what
    tells an older run to keep to the old branch."""

    __slots__ = ("patch_id",)
    kind = "patch"

    def __init__(self, patch_id: str) -> None:
        self.what = "patched"
        self.patch_id = patch_id
        self._fp = None
        self.canonical = f'["patch",{codec.encode_str(patch_id)}]'

    def describe(self) -> str:
        return f"ctx.patched({self.patch_id!r})"


def describe_canonical(canonical: str) -> str:
    """Rebuild a readable description from a recorded canonical text (for errors and the CLI)."""
    try:
        parsed = json.loads(canonical)
        kind = parsed[0]
        if kind == "tool":
            return f"ToolCall({parsed[1]!r}, {_short(codec.encode(parsed[2]))})"
        if kind == "model":
            shown = parsed[1] if isinstance(parsed[1], str) else codec.encode(parsed[1])
            return f"ModelCall({_short(repr(shown))})"
        if kind == "sleep":
            return f"Sleep({float(parsed[1]):.15g} s)"
        if kind == "ctx":
            return f"ctx.{parsed[1]}()"
        if kind == "signal":
            timeout = "" if parsed[2] is None else f", timeout={float(parsed[2]):.15g} s"
            return f"WaitSignal({parsed[1]!r}{timeout})"
        if kind == "patch":
            return f"ctx.patched({parsed[1]!r})"
        if kind == "continue":
            return f"ContinueAsNew({_short(codec.encode(parsed[1]))})"
        if kind == "child":
            return f"ChildRun({parsed[1]!r}, {_short(codec.encode(parsed[2]))})"
        if kind == "parallel":
            inner = [describe_canonical(json.dumps(branch)) for branch in parsed[1]]
            return _describe_parallel(len(inner), inner)
    except (ValueError, IndexError, TypeError, KeyError):
        pass
    return canonical
