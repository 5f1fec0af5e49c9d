"""``ctx``: what a workflow may know about its run, with every non-deterministic input recorded."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

from durabl.errors import BadStepError


def _entropy() -> float:
    """A float in [0, 1) from the OS's randomness, with 53 random bits: what
    ``random.SystemRandom().random()`` returns, without importing ``random``."""
    return (int.from_bytes(os.urandom(7), "big") >> 3) / (1 << 53)


def _new_uuid() -> str:
    import uuid  # here: only a workflow that asks for one needs the module (it imports platform)

    return str(uuid.uuid4())


class _ValueSource(Protocol):
    def ctx_value(self, what: str, draw: Callable[[], Any]) -> Any: ...

    def patched(self, patch_id: str) -> bool: ...

    @property
    def replaying(self) -> bool: ...


class Context:
    """Handed to a workflow as its first argument.

    ``now()``, ``random()`` and ``uuid()`` are recorded in the log the first time they are called
    and served from it on replay, so a workflow that uses them (and never ``time.time()`` or the
    ``random`` module directly) replays to the same state.
    """

    __slots__ = ("_clock", "_source", "input", "run_id", "workflow")

    def __init__(
        self,
        run_id: str,
        workflow: str,
        run_input: Any,
        source: _ValueSource,
        clock: Callable[[], float],
    ) -> None:
        self.run_id = run_id
        self.workflow = workflow
        self.input = run_input
        self._source = source
        self._clock = clock

    @property
    def is_replaying(self) -> bool:
        """True while the workflow is being fed recorded results (no step has run for real yet)."""
        return self._source.replaying

    def now(self) -> float:
        """Epoch seconds from the runtime's clock, recorded on first call."""
        return float(self._source.ctx_value("now", self._clock))

    def random(self) -> float:
        """A float in [0, 1), recorded on first call."""
        return float(self._source.ctx_value("random", _entropy))

    def uuid(self) -> str:
        """A random UUID4 string, recorded on first call."""
        return str(self._source.ctx_value("uuid", _new_uuid))

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes the new branch of a code change named ``patch_id``::

            if ctx.patched("summary-v2"):
                summary = yield ModelCall(new_prompt)
            else:
                summary = yield ModelCall(old_prompt)

        A run that reaches this point for the first time records that it took the new branch
        and gets True, on every replay too. A run whose log already holds another step here
        was recorded by the old code, and gets False: it replays the old branch to the step,
        and keeps to it. Keep the call (and the old branch) while runs recorded before the
        change may still be resumed; ``durabl check`` lists them.
        """
        if not isinstance(patch_id, str) or not patch_id:
            raise BadStepError(
                f"ctx.patched takes a non-empty string id, got {type(patch_id).__name__} "
                f"{patch_id!r}"
            )
        return self._source.patched(patch_id)

    def log(self, message: str) -> None:
        """Log a line from the workflow; silent while replaying, so each line appears once."""
        if not self._source.replaying:
            import logging  # here, not at import: most workflows never log

            logging.getLogger("durabl.workflow").info(
                "[%s %s] %s", self.workflow, self.run_id, message
            )
