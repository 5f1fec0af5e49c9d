"""The long-running mode: drive every run of a database that has work, as the work comes due.

A worker resumes interrupted runs, fires timers when they are due (it sleeps until the earliest
deadline, waking sooner only to look for runs other processes started), claims each run through
its lease, and on ``stop()`` lets the step in progress finish and parks its runs. Several workers,
in several processes, may share one database: the leases keep each run to one of them.

On a database that can tell (PostgreSQL: LISTEN/NOTIFY), a worker is woken when a run nobody
holds appears or a timer is armed, and claims runs with a statement the other workers skip, so
that workers on several hosts divide the runs instead of racing for them. Its look every
``poll_s`` is then only how it finds runs whose owner died.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from durabl import events
from durabl.checks import check_int, check_seconds
from durabl.errors import RunLeased, described

logger = logging.getLogger("durabl.worker")

POLL_S = 1.0
"""How often an idle worker looks for runs started by other processes."""


@dataclass
class WorkerStats:
    """What a worker did, for its caller and its log."""

    drives: int = 0
    completed: int = 0
    errors: list[str] = field(default_factory=list)


class Drives(Protocol):
    """What a worker asks of the runtime it serves (``durabl.engine.Engine`` answers)."""

    def drive_run(self, run_id: str) -> str | None:
        """Drive the run on if it has work, under its lease (RunLeased if a live process holds
        it). The run's status after, or None when this call did no work on it."""

    def interrupted_runs(self, *, include_held: bool) -> list[str]:
        """Runs a process was driving when it stopped (and held runs, if asked), oldest first."""

    def claim_runs(self, limit: int) -> list[str]:
        """Up to ``limit`` RUNNING runs nobody holds, leased to this runtime by a claim other
        workers skip; empty where the store cannot claim (the scan finds them instead)."""

    def watch(self, on_work: Callable[[], None]) -> Callable[[], None] | None:
        """Have ``on_work`` called whenever a run may have work; what stops it, or None when
        the store cannot tell (the worker then looks every ``poll_s``)."""

    def due_runs(self, now_s: float) -> list[str]:
        """Runs whose timer is due at ``now_s``, earliest first."""

    def next_wake_s(self) -> float | None:
        """The earliest armed timer over all runs, or None."""

    def now(self) -> float:
        """The runtime's clock, epoch seconds."""

    def halt(self) -> None:
        """Let the steps in progress finish and park their runs. Takes no lock: it is called
        from signal handlers."""


class Worker:
    """Drives the runs of one runtime's database with up to ``concurrency`` threads."""

    def __init__(self, runs: Drives, *, concurrency: int = 1, poll_s: float = POLL_S) -> None:
        check_int("concurrency", concurrency, at_least=1)
        check_seconds("poll_s", poll_s)
        self.runs = runs
        self.concurrency = concurrency
        self.poll_s = poll_s
        self.stats = WorkerStats()
        # Stopping must work from a signal handler, which runs in the thread that runs ``run``,
        # between any two of its bytecodes: also while that thread holds a lock. So nothing
        # ``stop`` does may take one. A threading.Event would (its set() takes the lock its
        # wait() holds), and a SIGTERM landing inside wait() would deadlock the worker. Instead
        # ``stop`` sets a plain flag and writes a byte to a socket the loop sleeps on.
        self._stopped = False
        self._wake_w: socket.socket | None = None  # open while ``run`` runs
        self._in_flight: dict[str, Future[None]] = {}
        # run id -> when its last failed drive was submitted (monotonic). The submission, not the
        # failure: the failure lands a moment after a scan, and timing the gate from it would
        # make the next scan skip the run, so that a run another process holds (or a dead
        # owner's run) was looked at only every other scan.
        self._failed: dict[str, float] = {}
        self._lock = threading.Lock()

    def stop(self) -> None:
        """Finish or park the steps in progress, then return from ``run``. Safe to call from a
        signal handler or another thread, any number of times: it takes no lock."""
        self.runs.halt()
        self._stopped = True
        self._poke()

    def run(self) -> WorkerStats:
        """Work until ``stop()``. Held runs are retried once, at start (a deploy restarts the
        worker); after that, interrupted runs and due timers are picked up."""
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._wake_w = wake_w
        try:
            with (
                ThreadPoolExecutor(self.concurrency, thread_name_prefix="durabl-worker") as pool,
                selectors.DefaultSelector() as waiter,
                contextlib.ExitStack() as stack,
            ):
                waiter.register(wake_r, selectors.EVENT_READ)
                unwatch = self.runs.watch(self._poke)
                stack.callback(lambda: unwatch is not None and unwatch())
                self._submit(pool, self.runs.interrupted_runs(include_held=True))
                last_scan_s = time.monotonic()
                while not self._stopped:
                    self._submit(pool, self.runs.claim_runs(self._free_slots()))
                    if time.monotonic() - last_scan_s >= self.poll_s:
                        self._submit(pool, self.runs.interrupted_runs(include_held=False))
                        last_scan_s = time.monotonic()
                    self._submit(pool, self.runs.due_runs(self.runs.now()))
                    if not self._stopped and waiter.select(self._idle_s(last_scan_s)):
                        _drain(wake_r)
                if self._in_flight:
                    logger.info("stopping: letting %d drive(s) park", len(self._in_flight))
        finally:
            self._wake_w = None
            wake_w.close()
            wake_r.close()
        return self.stats

    def _free_slots(self) -> int:
        """How many more runs the pool could start now."""
        with self._lock:
            return self.concurrency - len(self._in_flight)

    def _poke(self) -> None:
        """Wake ``run`` from its sleep."""
        wake_w = self._wake_w
        if wake_w is not None:
            # Full means a wake-up is pending already; closed means ``run`` has returned.
            with contextlib.suppress(OSError):
                wake_w.send(b"\0")

    def _idle_s(self, last_scan_s: float) -> float:
        """Until the earliest timer is due or the next look for new runs, whichever is first."""
        until_scan_s = max(0.0, last_scan_s + self.poll_s - time.monotonic())
        next_wake_s = self.runs.next_wake_s()
        if next_wake_s is None:
            return until_scan_s
        return max(0.0, min(until_scan_s, next_wake_s - self.runs.now()))

    def _submit(self, pool: ThreadPoolExecutor, run_ids: Iterable[str]) -> None:
        for run_id in run_ids:
            if self._stopped:
                return
            with self._lock:
                failed_at_s = self._failed.get(run_id)
                if run_id in self._in_flight or (
                    failed_at_s is not None and time.monotonic() - failed_at_s < self.poll_s
                ):
                    continue
                # In a copy of this thread's context: what the caller of ``run`` set there
                # reaches every drive (the event loop of ``aserve``: ``durabl.aio``).
                context = contextvars.copy_context()
                future = pool.submit(context.run, self._drive, run_id, time.monotonic())
                self._in_flight[run_id] = future
            future.add_done_callback(functools.partial(self._done, run_id))

    def _done(self, run_id: str, _future: Future[None]) -> None:
        with self._lock:
            self._in_flight.pop(run_id, None)
        self._poke()  # a finished drive may have left more work (a retry due now, say)

    def _note_failure(self, run_id: str, submitted_s: float) -> None:
        with self._lock:
            self._failed[run_id] = submitted_s

    def _drive(self, run_id: str, submitted_s: float) -> None:
        try:
            status = self.runs.drive_run(run_id)
        except RunLeased:
            self._note_failure(run_id, submitted_s)  # another worker has it: look again later
            return
        except Exception as exc:  # one broken run never stops the others
            logger.warning("run %s: %s", run_id, exc)
            self.stats.errors.append(f"{run_id}: {described(exc)}")
            self._note_failure(run_id, submitted_s)
            return
        if status is None:
            return
        self.stats.drives += 1
        if status == events.COMPLETED:
            self.stats.completed += 1


def _drain(sock: socket.socket) -> None:
    with contextlib.suppress(BlockingIOError):
        while sock.recv(4096):
            pass
