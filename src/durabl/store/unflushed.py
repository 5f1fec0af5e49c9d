"""The PostgreSQL store's writes that were acknowledged but may not be on disk yet.

Under ``durability="full"`` the bookkeeping commits (a step's STEP_STARTED before an IDEMPOTENT
call, lease renewals, claims, status changes) do not wait for the server's WAL flush; the next
durable commit flushes them with itself. A server that crashes in between (a restart in
immediate mode, an OOM kill, a failover) comes back without them, though this process was told
they committed and goes on as if they had: its next commit would then be refused for a gap in
the log, and the run would be driven again from before a call that was already made.

So the store keeps each such write here until it is known to be on disk, and when it finds the
server restarted it writes again whichever of them did not survive, before anything else goes
through. A write is known to be on disk once a durable commit that began after it has
committed (a WAL flush covers everything before it), or once the server's WAL writer has had
time to flush it by itself (three times ``wal_writer_delay``, PostgreSQL's own bound) and the
server is seen still up after that: a later write acknowledged with no restart in between.
Time alone proves nothing, as a crash stops the WAL writer too.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple


class Write(NamedTuple):
    """One acknowledged bookkeeping write: how to tell if it survived, and how to redo it."""

    at_s: float
    """When it was acknowledged (``time.monotonic``)."""
    work: Callable[[Any], Any]
    landed: Callable[[Any], tuple[bool, Any]] | None


class Unflushed:
    """The writes of one store that a server crash could still take back, oldest first.
    Thread-safe."""

    def __init__(self, flushed_within_s: float) -> None:
        self.flushed_within_s = flushed_within_s
        self._writes: deque[Write] = deque()
        self._lock = threading.Lock()

    def remember(
        self,
        work: Callable[[Any], Any],
        landed: Callable[[Any], tuple[bool, Any]] | None,
        *,
        server_up: bool = True,
    ) -> None:
        """Keep a write just acknowledged. ``server_up``: no restart of the server has been
        seen since the writes kept, so those the WAL writer has had time for are on disk."""
        now_s = time.monotonic()
        with self._lock:
            if server_up:
                self._drop_before(now_s - self.flushed_within_s)
            self._writes.append(Write(now_s, work, landed))

    def flushed(self, before_s: float) -> None:
        """A durable commit that began at ``before_s`` (``time.monotonic``) has committed."""
        with self._lock:
            self._drop_before(before_s)

    def pending(self) -> list[Write]:
        """The writes that may have died with the server, oldest first."""
        with self._lock:
            return list(self._writes)

    def done(self, redone: list[Write]) -> None:
        """``redone`` are on the server again: forget them (later writes stay)."""
        gone = {id(write) for write in redone}
        with self._lock:
            self._writes = deque(w for w in self._writes if id(w) not in gone)

    def _drop_before(self, at_s: float) -> None:
        writes = self._writes
        while writes and writes[0].at_s < at_s:
            writes.popleft()


__all__ = ["Unflushed", "Write"]
