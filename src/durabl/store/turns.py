"""Writers' turns: processes that write one SQLite file with fsync'd commits take turns in the
kernel, not in SQLite's busy handler.

SQLite lets one connection write at a time. A writer that finds the lock taken sleeps in its
busy handler (1, 2, 5, 10 ms and longer) and tries again, so with several worker processes on
one file most of the time goes to sleeping while the lock is free. A store opened with
``durability="full"`` holds an exclusive ``flock(2)`` on the database's ``-wal`` file around
each write transaction instead: the next writer in line sleeps in the kernel and is woken as
soon as the lock is given back.

- **Which file.** The ``-wal``, never created here: SQLite takes no locks on it (its WAL locks
  are on ``-shm``, its database locks on the file itself), so a turn can never stand in the way
  of SQLite's own locking, even where ``flock`` is emulated with byte-range locks. The ``-wal``
  is not deleted while a connection is open, and a store holds one for as long as it takes
  turns.
- **Who takes them.** Only stores with ``durability="full"``: there a write waits for its fsync
  (hundreds of microseconds) and two lock calls cost a few. A store with ``"process"`` writes
  in tens of microseconds, where the calls would cost one thread alone some 5% (measured; see
  DECISIONS.md). Processes that do not take turns (a ``"process"`` store, the CLI, another
  program) still meet at SQLite's lock, as before: a turn is taken before a transaction
  begins and given back after it ends, so nobody holds SQLite's lock while waiting for a turn,
  and the two can never wait for each other.
- **Death.** The kernel gives back the lock of a process that dies, SIGKILL included: there is
  nothing to clean up and no stale lock to break.
- **fork.** A lock taken through an inherited descriptor is the parent's lock, so a child
  opens the file again before its first turn.
- **No flock.** On a file system that refuses ``flock`` the store takes no turns and its writes
  meet at SQLite's lock, as a ``"process"`` store's do.
"""

from __future__ import annotations

import fcntl
import os


class Turns:
    """Turns at writing the SQLite database at ``path``, for one store (which calls ``take``
    and ``give`` around each write transaction, with its connection's lock held: one thread at
    a time, and never a write inside another)."""

    __slots__ = ("_fd", "_held", "_pid", "_wal")

    def __init__(self, path: str) -> None:
        self._wal = path + "-wal"
        self._fd = -1
        self._pid = 0
        """The process ``_fd`` was opened in: another one (a forked child) opens its own."""
        self._held = False
        """Whether ``take`` locked the file (it does not without a ``-wal``, or without flock)."""

    def take(self) -> None:
        """Wait for this process's turn to write. Without the ``-wal`` (before the database's
        first transaction in WAL mode made it) there is no turn to take, and the write goes on
        as if the store took none: SQLite's own lock still orders it."""
        if self._pid != os.getpid():
            self._open()
        if self._fd >= 0:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            except OSError:  # a file system without flock (ENOLCK, EOPNOTSUPP): no turns
                os.close(self._fd)
                self._fd = -1
                return
            self._held = True

    def give(self) -> None:
        """Give the turn back (after the transaction has committed or rolled back)."""
        if self._held:
            self._held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file, which gives back a turn still held."""
        fd, self._fd, self._held = self._fd, -1, False
        if fd >= 0:  # in a forked child, its copy: the parent's lock stays the parent's
            os.close(fd)

    def _open(self) -> None:
        if self._fd >= 0:  # inherited across fork: the parent's descriptor and lock
            os.close(self._fd)
            self._fd, self._held = -1, False
        try:
            self._fd = os.open(self._wal, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # tried again at the next write
        self._pid = os.getpid()
