"""The signals by which a step ends a pass through a run early.

An executor or the drive raises one of these; the drive's loop catches it and ends the pass.
None of them is an error a caller sees: a parked run is waiting, a held run keeps its log.
"""

from __future__ import annotations

from durabl.errors import DurablError


class Park(Exception):
    """The run cannot go further now (a timer is pending, it is dead-lettered, the process is
    stopping, or a dry replay reached the log's end); its state is already recorded."""


class Hold(Exception):
    """The run must stop without failing: hold it with ``error`` and re-raise it to the caller."""

    def __init__(self, error: DurablError) -> None:
        super().__init__(str(error))
        self.error = error


class Unwind(BaseException):
    """Stop the workflow from inside a ctx call (a dry replay reached the log's end, the log
    disagrees, or recording the value failed: then ``fatal`` is that failure, which the caller
    sees once the workflow is unwound); a BaseException so that no ``except Exception`` in
    workflow code can swallow it."""

    def __init__(self, fatal: Exception | None = None) -> None:
        super().__init__()
        self.fatal = fatal


__all__ = ["Hold", "Park", "Unwind"]
