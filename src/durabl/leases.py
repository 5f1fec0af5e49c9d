"""Run ownership: who may drive a run, and how a dead or stale owner is replaced.

A run's lease names a runtime instance, its process (pid, host, process start time) and an
expiry on the wall clock. Every write the owner makes carries the lease's fencing token; taking a
lease over bumps the token, so a stale owner's next write is refused inside the database.

Takeover rules, checked in this order:
- the lease is free, expired, or already ours: take it;
- it belongs to another runtime in this very process: it is gone unless that runtime is
  driving the run right now (the in-memory table below), the in-process twin of a dead pid;
- it belongs to a process on this host that no longer exists (or whose pid was reused, told by
  the process start time): take it at once, without waiting for the expiry;
- otherwise a live process holds it: leave the run alone.
"""

from __future__ import annotations

import _thread
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from durabl.checks import check_seconds
from durabl.errors import RunDrivenElsewhere, RunDrivenHere, RunTakenOver
from durabl.store.base import Lease, RunRow, Store

LEASE_S = 15.0
"""Default lease length. A heartbeat renews held leases every third of it, or every
``RENEW_MAX_S``, whichever is sooner."""

RENEW_MAX_S = 5.0
"""The longest a heartbeat waits between renewals, however long the lease: after a restart of a
PostgreSQL server, a renewal is how an owner waiting on a long call shows it is alive again
(``durabl.store.postgres.RESTART_GRACE_S``)."""

HOST = os.uname().nodename
"""This machine's name, as gethostname(2) reports it (read without importing socket)."""

_driving: dict[str, str] = {}
_driving_lock = threading.Lock()


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (Linux): state first."""
    try:
        # A file descriptor, not a file object: the file is small, and read once on the way
        # to a process's first lease. Its bytes are decoded with the codec every interpreter
        # has loaded: naming "ascii" would import its codec module.
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            stat = os.read(fd, 4096).decode("utf-8", errors="replace")
        finally:
            os.close(fd)
    except OSError:
        return None
    return stat[stat.rfind(")") + 2 :].split()


def process_started(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (Linux), which tells a reused pid apart."""
    fields = _stat(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def _exited(pid: int, fields: list[str] | None) -> bool:
    """True when ``pid`` is a zombie: it has exited and only waits for its parent to reap it.
    Signal 0 still reaches a zombie, so without this check a killed owner whose parent has not
    called wait() yet would keep its runs until the lease expired. (A leader thread that exited
    while other threads of its process still run shows as a zombie too: not exited.)"""
    if fields is None or not fields or fields[0] not in ("Z", "X"):
        return False
    try:
        return os.listdir(f"/proc/{pid}/task") in ([], [str(pid)])
    except OSError:
        return True


_own_start: dict[int, str | None] = {}


def own_start() -> str | None:
    """This process's start time, read once per pid (a forked child has its own)."""
    pid = os.getpid()
    if pid not in _own_start:
        _own_start[pid] = process_started(pid)
    return _own_start[pid]


def owner_gone(run_id: str, lease: Lease, store: Store | None = None) -> bool:
    """True when the lease's holder can no longer be driving the run. A holder on another host
    is gone only if ``store`` can tell (a server that sees its sessions: ``owner_alive``)."""
    if lease.host != HOST:
        alive = getattr(store, "owner_alive", None)
        return alive is not None and not alive(lease.host, lease.pid)
    if lease.pid == os.getpid():
        with _driving_lock:
            return _driving.get(run_id) != lease.owner
    try:
        os.kill(lease.pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    fields = _stat(lease.pid)
    if _exited(lease.pid, fields):
        return True
    started = fields[19] if fields is not None and len(fields) > 19 else None
    return lease.started is not None and started is not None and started != lease.started


@contextmanager
def driving(run_id: str, owner: str) -> Iterator[None]:
    """Mark ``run_id`` as driven by ``owner`` in this process for the duration of the block.

    Two threads (or two runtimes) of one process never drive the same run at once.
    """
    with _driving_lock:
        current = _driving.get(run_id)
        if current is not None:
            raise RunDrivenHere(run_id=run_id)
        _driving[run_id] = owner
    try:
        yield
    finally:
        with _driving_lock:
            _driving.pop(run_id, None)


class Leaser:
    """Takes, renews and releases the leases of one runtime instance."""

    def __init__(self, store: Store, owner: str, lease_s: float = LEASE_S) -> None:
        check_seconds("lease_s", lease_s)
        self.store = store
        self.owner = owner
        self.lease_s = lease_s
        self.held: dict[str, int] = {}
        self._lock = threading.Lock()
        self._heartbeat: int | None = None
        """The heartbeat thread's identity, once it is started."""
        self._beat_ended = threading.Event()
        self._stop = threading.Event()

    @property
    def renew_every_s(self) -> float:
        """How long the heartbeat waits between two renewals of the held leases."""
        return min(self.lease_s / 3, RENEW_MAX_S)

    def lease(self) -> Lease:
        """A fresh lease for this runtime, expiring ``lease_s`` from now."""
        return Lease(
            owner=self.owner,
            pid=os.getpid(),
            host=HOST,
            started=own_start(),
            expires_s=time.time() + self.lease_s,
        )

    def free(self, row: RunRow) -> bool:
        """Whether ``row`` shows its run's lease free for this runtime to take: no lease, this
        runtime's own, an expired one, or one whose process is gone."""
        lease = row.lease
        return (
            lease is None
            or lease.owner == self.owner
            or lease.expires_s <= time.time()
            or owner_gone(row.run_id, lease, self.store)
        )

    def acquire(self, row: RunRow) -> int:
        """The fencing token to drive ``row``'s run with; raises RunLeased if a live process
        owns it."""
        lease = row.lease
        if lease is not None and not self.free(row):
            until = time.strftime("%H:%M:%S", time.localtime(lease.expires_s))
            raise RunDrivenElsewhere(run_id=row.run_id, pid=lease.pid, host=lease.host, until=until)
        token = self.try_acquire(row)
        if token is None:
            raise RunTakenOver(run_id=row.run_id)
        return token

    def try_acquire(self, row: RunRow) -> int | None:
        """Take the lease if it is still as ``row`` shows it (its token unchanged): the new
        fencing token, or None if another process changed it since."""
        token = self.store.take_lease(row.run_id, row.lease_token, self.lease())
        if token is not None:
            self.hold(row.run_id, token)
        return token

    def hold(self, run_id: str, token: int) -> None:
        """Note a lease taken; its renewals begin once ``renew`` has started the heartbeat."""
        with self._lock:
            self.held[run_id] = token

    def release(self, run_id: str) -> None:
        with self._lock:
            token = self.held.pop(run_id, None)
        if token is not None:
            self.store.release_lease(run_id, token)

    def forget(self, run_id: str) -> None:
        """Drop a lease from memory without writing: the process 'died' holding it."""
        with self._lock:
            self.held.pop(run_id, None)

    def close(self) -> None:
        self._stop.set()
        if self._heartbeat is not None and self._heartbeat != threading.get_ident():
            self._beat_ended.wait(timeout=5)

    def renew(self) -> None:
        """Keep every held lease renewed from now on: start the heartbeat, if it has not
        started. A holder calls it before it runs anything whose length it does not bound (a
        workflow and its steps, a batch of claimed runs waiting for their drives, a
        compaction); reading the run and its log under a fresh lease needs no renewal.

        The heartbeat is a bare thread: ``threading.Thread.start`` would wait for the new thread
        to run before returning. Like a daemon thread, it does not hold up the interpreter's
        exit. Started this late, its first run overlaps the holder's first step, not the reads
        before it: each of them hands the GIL over while SQLite works, and a new thread taking
        it then makes the holder wait for it back."""
        if self._heartbeat is None:
            with self._lock:  # two first holders must not start two heartbeats
                if self._heartbeat is None:
                    self._heartbeat = _thread.start_new_thread(self._beat, ())

    def _beat(self) -> None:
        """Renew every held lease each third of its length (see ``RENEW_MAX_S``). No fsync: a
        renewal lost to a power cut only makes a lease expire sooner, which costs a takeover,
        never a duplicate."""
        try:
            self._renew_until_stopped()
        finally:
            self._beat_ended.set()

    def _renew_until_stopped(self) -> None:
        while not self._stop.wait(self.renew_every_s):
            with self._lock:
                held = dict(self.held)
            for run_id, token in held.items():
                try:
                    alive = self.store.renew_lease(
                        run_id, token, self.owner, time.time() + self.lease_s
                    )
                except Exception:  # the store is closed or failing: the owner finds out itself
                    return
                if not alive:
                    self.forget(run_id)
