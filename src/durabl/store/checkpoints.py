"""WAL checkpoints in a thread of their own, off the path of the step that happens to cross the
threshold.

SQLite copies the WAL back into the database file (a checkpoint) from inside the commit that
takes the WAL past ``wal_autocheckpoint`` pages, so one step in every few hundred commits paid
for the copy and for the fsync of the database file that ends it: W40's mean per-step cost in
``"process"`` ran about 20% over its median, its p95 about twice the median, and more so on a
large file, where the pages copied lie further apart. The writer's connection now checkpoints
only as a backstop (``BACKSTOP_PAGES``, four times SQLite's default) and a ``Checkpointer``
runs a ``PASSIVE`` checkpoint every ``EVERY_COMMITS`` transactions, on a connection of its own,
in a daemon thread started by the first checkpoint it is asked for. A ``PASSIVE`` checkpoint
never waits for the writer and never blocks it, so it only ever costs the writer a core the
machine had spare.

A checkpoint is not part of any guarantee: the WAL holds every commit until one copies it, a
checkpoint cut short by a death is redone by the next, and one that finds the file busy leaves
the pages for the next one or for the backstop.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import weakref

EVERY_COMMITS = 200
"""Transactions between background checkpoints: W40 writes about five WAL pages a commit, so
this is about SQLite's own 1,000-page threshold."""
BACKSTOP_PAGES = 4000
"""The writer's own ``wal_autocheckpoint``, for when the thread cannot keep up (a long read
transaction elsewhere, a commit of many pages): the WAL never grows much past 16 MB."""


class Checkpointer:
    """Checkpoints ``path``'s WAL from a background thread, once every ``every`` transactions
    the owning store reports through ``committed``."""

    def __init__(self, path: str, every: int = EVERY_COMMITS) -> None:
        self.path = path
        self.every = every
        self._since = 0
        self._state = _Shared()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        # A store dropped without close() (a simulated death in the chaos harness) must not
        # leave its thread behind: the thread holds the shared state, never the checkpointer.
        self._finalizer = weakref.finalize(self, self._state.stop)

    def committed(self) -> None:
        """One more transaction committed; every ``every``-th wakes the thread."""
        self._since += 1
        if self._since < self.every:
            return
        self._since = 0
        if self._thread is None or self._pid != os.getpid():  # none yet, or forked
            self._pid = os.getpid()
            self._thread = threading.Thread(
                target=_run, args=(self.path, self._state), name="durabl-checkpoint", daemon=True
            )
            self._thread.start()
        self._state.wake.set()

    @property
    def completed(self) -> int:
        """Background checkpoints that ran to the end (whatever they found to copy)."""
        return self._state.completed

    def close(self) -> None:
        """Stop the thread and wait for a checkpoint in progress to end, so that the writer's
        close, which checkpoints a last time and deletes the WAL, is the last word."""
        self._state.stop()
        if self._thread is not None and self._pid == os.getpid():
            self._thread.join()
        self._finalizer.detach()


class _Shared:
    """What the thread and its checkpointer share."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.stopping = False
        self.completed = 0

    def stop(self) -> None:
        self.stopping = True
        self.wake.set()


def _run(path: str, state: _Shared) -> None:
    conn: sqlite3.Connection | None = None
    try:
        while True:
            state.wake.wait()
            state.wake.clear()
            if state.stopping:
                return
            try:
                if conn is None:
                    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
                busy = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0]
            except sqlite3.Error:
                continue  # the file is busy or gone: the next checkpoint, or the backstop
            if not busy:
                state.completed += 1
    finally:
        if conn is not None:
            conn.close()
