"""What a model client sees of the step it answers: the run, the step, the attempt, the tools
the runtime has, and where a streamed answer's text goes as it arrives.

The model executor sets the context around each call of the runtime's ``llm``; a client reads it
with ``current()`` (None outside a durabl step). A streaming client hands each piece of text to
``ModelCallContext.chunk``: the runtime's ``on_chunk`` callback gets it at once, and the text so
far is recorded in the log now and then (``STEP_PARTIAL``, no fsync), so that an answer cut off by
a crash is kept and shown, and counted as spent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

PARTIAL_EVERY_S = 0.25
"""How often, at most, a streamed answer's text so far is recorded while it streams."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """A piece of a streamed answer, as ``Runtime(on_chunk=...)`` gets it. ``attempt`` grows
    when the call is made again (a retry, or a new process after a crash): a consumer showing
    the text drops what it has of an earlier attempt when a chunk with ``first`` set comes."""

    run_id: str
    step: int
    attempt: int
    text: str
    first: bool


@dataclass(slots=True)
class ModelCallContext:
    """One attempt at one ModelCall, while the model client runs."""

    run_id: str
    step: int
    attempt: int
    tools: Mapping[str, Any]
    """The runtime's registered tools (``durabl.Tool``), by name: a client derives the tool
    schemas a ModelCall names from them."""
    record_partial: Callable[[str], None]
    on_chunk: Callable[[Chunk], None] | None = None
    text: list[str] = field(default_factory=list)
    _recorded_s: float = 0.0
    _recorded_len: int = 0

    def chunk(self, text: str) -> None:
        """A piece of the answer's text arrived: hand it on, and record the text so far if the
        last record is old enough."""
        if not text:
            return
        first = not self.text
        self.text.append(text)
        if self.on_chunk is not None:
            self.on_chunk(Chunk(self.run_id, self.step, self.attempt, text, first))
        now_s = time.monotonic()
        if now_s - self._recorded_s >= PARTIAL_EVERY_S:
            self._record(now_s)

    def flush(self) -> None:
        """Record the text so far, if any arrived since the last record (a stream that broke
        off calls this before it raises)."""
        self._record(time.monotonic())

    @property
    def streamed(self) -> str:
        return "".join(self.text)

    def _record(self, now_s: float) -> None:
        so_far = self.streamed
        if len(so_far) == self._recorded_len:
            return
        self._recorded_s, self._recorded_len = now_s, len(so_far)
        self.record_partial(so_far)


_current: ContextVar[ModelCallContext | None] = ContextVar("durabl_model_call", default=None)


def current() -> ModelCallContext | None:
    """The model call being answered in this thread (or task), or None outside a durabl step."""
    return _current.get()


@contextmanager
def answering(context: ModelCallContext) -> Iterator[ModelCallContext]:
    """Make ``context`` current while the model client runs."""
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)
