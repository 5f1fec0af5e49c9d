"""One process lifetime of a chaos scenario, and the two ways it dies.

Every process boots the way an agent script does: ``resume_all``, start its runs (idempotently,
by run id), then drive them to rest with the injected clock moving on in jumps, acting as a
correct operator on dead letters, and as the people who answer a run's waits: each signal of the
spec's ``answers`` is sent once its moment has come, by whichever process looks first. It ends
when its runs have finished, or at its planned death:

- ``in-process`` (mode a): the planned reach raises ``ProcessDeath`` through ``CrashAt``; the
  Runtime is dropped and the next process builds a fresh one on the same file;
- ``sigkill`` (mode b): the process is a forked child; at the planned reach it writes a line on a
  pipe and blocks, and the parent SIGKILLs it.

Both modes install the same counting hook, so a process that lives to the end reports how often
it reached each point: that is how the grid knows which occurrences exist.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from mmap import mmap
from pathlib import Path
from typing import Any

from chaos.corpus import MODEL_RETRY, WORKFLOWS, Answer, Spec, World
from durabl import Runtime, crashpoints
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.errors import InvalidStateError
from durabl.runtime import DeadLetter
from durabl.steps import derived_key
from durabl.store.reads import waiting_for
from oracles.support import START_S, Clock, Database, chain_of

MODES = ("in-process", "sigkill")
JUMPS_S = (7.0, 45.0, 600.0, 3600.0)
"""How far the clock moves between ticks, in turn: some ticks come before a deadline (and must
fire nothing), some after it."""
DRIVE_LIMIT = 120
ARRIVAL_WAIT_S = 120.0
"""A child that reached its point waits this long to be killed, then gives up on its parent."""
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "CONTINUED")
"""The statuses a run never leaves (a CONTINUED run's work goes on in the run it names)."""


@dataclass(frozen=True, order=True)
class Death:
    """Die the ``occurrence``-th time this process reaches ``point``."""

    point: str
    occurrence: int

    def __str__(self) -> str:
        return f"{self.point}#{self.occurrence}"


class SharedClock(Clock):
    """The injected clock, kept in an anonymous shared mapping: a forked child that moves it and is
    then SIGKILLed leaves the time where it was, as a wall clock would."""

    def __init__(self, now_s: float = START_S) -> None:
        self._cell = mmap(-1, 8)
        super().__init__(now_s)

    @property  # type: ignore[override]
    def now_s(self) -> float:
        return float(struct.unpack("d", self._cell[:8])[0])

    @now_s.setter
    def now_s(self, value: float) -> None:
        self._cell[:8] = struct.pack("d", value)

    def close(self) -> None:
        self._cell.close()


# -- what every process does -------------------------------------------------------------------


def boot(db: Database, root: Path, spec: Spec, clock: Clock) -> None:
    """What an agent process does when it starts, until its runs are at rest (or it dies)."""
    world = World(root)
    rt = Runtime(
        db,
        llm=world.llm,
        tools=world.tools(),
        clock=clock,
        retry=MODEL_RETRY,
        workflows=WORKFLOWS,
        durability="process",
    )
    try:
        rt.resume_all()
        for run_id, run_input in spec.runs:
            rt.start(spec.name, run_input, run_id=run_id)
        answer(rt, spec.answers)
        drive(rt, clock, world, [run_id for run_id, _ in spec.runs], spec.answers)
    finally:
        rt.close()


def drive(
    rt: Runtime,
    clock: Clock,
    world: World,
    run_ids: Sequence[str],
    answers: Sequence[Answer] = (),
) -> None:
    """resume_all + tick with the clock jumping on until every run has finished: the runs of
    ``run_ids`` and every run they made (the children of a ChildRun, the next runs of a
    ContinueAsNew), which are all the database holds. The operator comes only when nothing
    else can move: the other runs go on meanwhile, so a run that reaches a key whose first
    holder is dead-lettered finds the key in the same ambiguous state; a parent waiting on a
    child that is dead-lettered cannot move either. The answers due are sent at every turn,
    before the clock moves on."""
    for turn in range(DRIVE_LIMIT):
        rows = rt.store.list_runs()
        statuses = {row.status for row in rows}
        if statuses <= set(FINISHED):
            return
        if "DEAD_LETTERED" in statuses and all(
            row.status in (*FINISHED, "DEAD_LETTERED") or row.run_id in blocked(rt, rows)
            for row in rows
        ):
            operate(rt, world, rt.dead_letters()[0])
            continue
        answer(rt, answers)
        rt.resume_all()
        clock.advance(JUMPS_S[turn % len(JUMPS_S)])
        rt.tick()
    runs = [rt.state(run_id) for run_id in run_ids]
    raise AssertionError(f"runs did not come to rest: {runs} (all: {rt.store.list_runs()})")


def parent_of(rt: Runtime, run_id: str) -> str | None:
    """The run whose ChildRun started ``run_id`` (from its RUN_STARTED), or None."""
    started = json.loads(rt.store.load_log(run_id)[0].data or "{}")
    parent = started.get("parent")
    return None if parent is None else parent["run_id"]


def blocked(rt: Runtime, rows: Sequence[Any]) -> set[str]:
    """The runs that wait on a dead-lettered child (or on a child that waits on one)."""
    stuck = {row.run_id for row in rows if row.status == "DEAD_LETTERED"}
    parents = {row.run_id: parent_of(rt, row.run_id) for row in rows}
    found: set[str] = set()
    for run_id in stuck:
        above = parents.get(run_id)
        while above is not None and above not in found:
            found.add(above)
            above = parents.get(above)
    return found


def answer(rt: Runtime, answers: Sequence[Answer]) -> None:
    """Send every answer whose run (the run its chain of ContinueAsNew has got to) now waits
    for what the answer waits for, unless a process sent it already: the signals tables of
    the chain say which were sent, so a death (a send is one transaction, with no crash point
    in it) never makes one go twice or never."""
    for due in answers:
        chain = chain_of(rt.store, due.run_id)
        row = rt.store.get_run(chain[-1]) if chain else None
        waiting = None if row is None else waiting_for(rt.store, row)
        if waiting is None or waiting["signal"] != due.once_waiting_for:
            continue
        sent = [signal.name for run_id in chain for signal in rt.store.signals(run_id)]
        if due.name not in sent:
            rt.signal(due.run_id, due.name, due.payload)


def operate(rt: Runtime, world: World, letter: DeadLetter) -> None:
    """A correct operator: look at the world; resolve with the result it saw, or redrive when the
    effect did not happen (or when durabl already holds the key's effect from another run)."""
    key = letter.idempotency_key or derived_key(letter.run_id, letter.step)
    seen = world.effect(key)
    if seen is None:
        rt.redrive(letter.run_id)
        return
    try:
        rt.resolve(letter.run_id, seen["result"])
    except InvalidStateError:
        rt.redrive(letter.run_id)


class Reaches:
    """A hook that never kills: it counts how often each point is reached."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def __call__(self, point: str) -> None:
        self.counts[point] += 1


@dataclass
class Life:
    """What one process did: whether it took its planned death, the reaches it counted when it
    lived to the end, and the exception that ended it otherwise (booting never raises)."""

    died: bool
    reaches: dict[str, int]
    error: str | None = None


def _error(exc: BaseException) -> str:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}"


Live = Callable[[Database, Path, Spec, Clock, "Death | None"], Life]


# -- mode (a): in-process ----------------------------------------------------------------------


def live_in_process(
    db: Database, root: Path, spec: Spec, clock: Clock, death: Death | None
) -> Life:
    """The death is a ``ProcessDeath`` raised at the planned reach."""
    reaches = Reaches()
    remove = crashpoints.install(reaches)
    try:
        if death is None:
            boot(db, root, spec, clock)
            return Life(False, dict(reaches.counts))
        with CrashAt(death.point, death.occurrence) as hook:
            try:
                boot(db, root, spec, clock)
            except ProcessDeath as exc:
                assert exc.point == death.point
        return Life(True, {}) if hook.fired else Life(False, dict(reaches.counts))
    except Exception as exc:
        return Life(False, {}, _error(exc))
    finally:
        remove()


# -- mode (b): a forked child, SIGKILLed by its parent ----------------------------------------------


class Arrival:
    """The child's hook: at the planned reach, tell the parent and wait to be killed."""

    def __init__(self, death: Death, pipe: Any) -> None:
        self.death = death
        self.pipe = pipe
        self.seen = 0

    def __call__(self, point: str) -> None:
        if point != self.death.point:
            return
        self.seen += 1
        if self.seen == self.death.occurrence:
            self.pipe.write(json.dumps({"arrived": point}) + "\n")
            self.pipe.flush()
            deadline_s = time.monotonic() + ARRIVAL_WAIT_S
            while time.monotonic() < deadline_s:
                time.sleep(1.0)
            os._exit(3)


def live_in_child(db: Database, root: Path, spec: Spec, clock: Clock, death: Death | None) -> Life:
    """The process is a forked child; the death is the parent's SIGKILL."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_fd)
        _child(write_fd, db, root, spec, clock, death)
    os.close(write_fd)
    with os.fdopen(read_fd, encoding="utf-8") as pipe:
        line = pipe.readline()
        message = json.loads(line) if line else {"error": "the child exited without a word"}
        if "arrived" in message:
            os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if "arrived" in message:
        if not killed:
            return Life(False, {}, f"the child was not killed by SIGKILL (status {status})")
        return Life(True, {})
    if killed or status != 0:
        return Life(False, {}, message.get("error") or f"the child ended with status {status}")
    if "error" in message:
        return Life(False, {}, message["error"])
    return Life(False, message["reaches"])


def _child(
    write_fd: int, db: Database, root: Path, spec: Spec, clock: Clock, death: Death | None
) -> None:
    code = 0
    try:
        pipe = os.fdopen(write_fd, "w", encoding="utf-8")
        reaches = Reaches()
        crashpoints.install(reaches)
        if death is not None:
            crashpoints.install(Arrival(death, pipe))
        try:
            boot(db, root, spec, clock)
            message: dict[str, Any] = {"reaches": dict(reaches.counts)}
        except Exception as exc:
            message = {"error": _error(exc)}
        pipe.write(json.dumps(message) + "\n")
        pipe.flush()
    except BaseException:
        code = 1
    finally:
        os._exit(code)


LIVES: dict[str, Live] = {"in-process": live_in_process, "sigkill": live_in_child}
