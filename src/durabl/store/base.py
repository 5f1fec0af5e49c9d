"""The ``Store`` protocol: everything the runtime asks of a database, and nothing more.

The runtime never issues SQL. Each method's docstring states what it does atomically. A backend
(SQLite today, PostgreSQL later) passes the contract suite in ``tests/contract`` unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import NamedTuple, Protocol

from durabl.errors import RunNotFoundError
from durabl.events import Event

UNCHANGED: float = float("-inf")
"""Sentinel for ``Commit.wake_at_s``: leave the run's timer as it is."""


@dataclass(slots=True, frozen=True, kw_only=True)
class Lease:
    """Who drives a run: a runtime instance in one process, until ``expires_s`` (wall clock).

    ``token`` is the fencing token: it grows by one with every change of owner, and every
    write the owner makes carries it, so a stale owner's writes are refused.
    """

    owner: str
    pid: int
    host: str
    started: str | None
    expires_s: float
    token: int = 0


@dataclass(slots=True, frozen=True, kw_only=True)
class RunRow:
    """One run's row: its identity and the state the runtime keeps beside the log."""

    run_id: str
    workflow: str
    input_text: str
    status: str
    result_text: str | None
    error: str | None
    created_s: float
    updated_s: float
    wake_at_s: float | None
    watermark: int
    lease: Lease | None = None
    lease_token: int = 0


@dataclass(slots=True, kw_only=True)
class SideEffect:
    """The one record an idempotency key may ever have: the effect happened, with this outcome.
    Not frozen: every tool step builds one, and a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__``."""

    key: str
    run_id: str
    step: int
    tool: str
    args_fp: str
    result_text: str | None
    error: str | None
    at_s: float


@dataclass(slots=True, frozen=True, kw_only=True)
class KeyClaim:
    """An explicit idempotency key whose tool call was dispatched and has no outcome yet."""

    key: str
    run_id: str
    step: int
    tool: str
    args_fp: str


@dataclass(slots=True, frozen=True, kw_only=True)
class ParentNote:
    """An event for another run's log, written by the commit that ends a child run: the
    parent's record of the child's outcome, at the parent's step that started the child."""

    run_id: str
    step: int
    kind: str
    data: str | None


@dataclass(slots=True)
class Commit:
    """Everything one transaction writes for one run. All of it lands, or none of it."""

    run_id: str
    events: list[Event] = field(default_factory=list)
    _: KW_ONLY
    status: str | None = None
    result_text: str | None = None
    error: str | None = None
    clear_error: bool = False
    wake_at_s: float | None = UNCHANGED
    side_effect: SideEffect | None = None
    claim: KeyClaim | None = None
    release_claim: str | None = None
    durable: bool = False
    at_s: float = 0.0
    fence: int | None = None
    deliver_signal: int | None = None
    """The id of the run's signal this commit delivers (to the step it completes), once."""
    wake_on_signal: str | None = None
    """A wait being parked for signals of this name: if one is pending when the commit lands,
    the run's timer is set to ``at_s`` (due now) instead."""
    new_run: tuple[RunRow, Event] | None = None
    """A run to create in the same transaction (a child run, the next run of a chain): its row
    (leased with token 1 if ``row.lease`` is set) and its RUN_STARTED. A run of that id that
    exists already refuses the whole commit with ``RunExistsError``."""
    carry_signals: str | None = None
    """A run (created by this commit) that takes over this run's signals no wait has taken:
    each is copied to it, in the order sent, and marked delivered here, at the step the
    commit's events are for."""
    parent_note: ParentNote | None = None
    """An event to append, in the same transaction, to the end of another run's log (its seq
    is that log's next; the event carries no fence: the parent waits on this child and writes
    nothing at that step), which also makes that run due at ``at_s``. Nothing is written to a
    run that has ended, or does not exist."""


class ToolResult(NamedTuple):
    """The commit nearly every step makes, in parts: ``event``, a tool call's completion whose
    fp is the step's fingerprint, appended to ``run_id``'s log under the lease token ``fence``,
    and the side_effects row of its effect, which succeeded: ``key``, ``tool`` and
    ``result_text``, recorded at ``effect_at_s``. A tuple, where a ``Commit`` is a dataclass of
    eighteen fields: it is made once per step."""

    run_id: str
    fence: int
    event: Event
    key: str
    tool: str
    result_text: str
    effect_at_s: float

    def commit(self) -> Commit:
        """The ``Commit`` these parts stand for, durable and fenced."""
        run_id, fence, event, key, tool, result_text, effect_at_s = self
        effect = SideEffect(
            key=key,
            run_id=run_id,
            step=event.step,
            tool=tool,
            args_fp=event.fp or "",
            result_text=result_text,
            error=None,
            at_s=effect_at_s,
        )
        return Commit(
            run_id, [event], side_effect=effect, durable=True, at_s=event.at_s, fence=fence
        )


@dataclass(slots=True, frozen=True, kw_only=True)
class Signal:
    """An answer from outside, sent to a run for the waits of one name."""

    id: int
    name: str
    payload_text: str
    sent_s: float
    delivered_step: int | None = None


class Store(Protocol):
    """What durabl needs from a database."""

    path: str
    durability: str

    def create_run(self, row: RunRow, first: Event, history: Sequence[Event] = ()) -> RunRow | None:
        """Insert the run row (with its lease, if ``row.lease`` is set: token 1) and its
        RUN_STARTED event, and after it ``history`` (a fork's copied prefix, seq 2 on), in one
        transaction, durably.

        Returns None when created; when a run with this id already exists, changes nothing and
        returns the existing row.
        """

    def get_run(self, run_id: str) -> RunRow | None:
        """The run's row, or None."""

    def list_runs(
        self,
        statuses: tuple[str, ...] | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> list[RunRow]:
        """Runs, newest first, optionally filtered. A consistent snapshot."""

    def load_log(self, run_id: str, after_seq: int = 0) -> list[Event]:
        """The run's events with seq > after_seq, in order; every checksum verified.

        A row whose checksum does not match raises ``StorageError``; damaged history is never
        handed back.
        """

    def last_step(self, run_id: str) -> int:
        """The position of the run's newest step event (0 if none is left in the log), read
        from the end of the log: its cost does not grow with the log."""

    def commit(self, commit: Commit) -> None:
        """Apply ``commit`` in ONE transaction: append its events (seq must continue the log
        with no gap, enforced by the database), update the run row, insert the side_effects row
        (refusing to overwrite an existing key), set or release the key claim, and set the timer.
        With ``durable`` and durability "full", the commit is on stable storage when this
        returns. With a ``fence``, the whole commit is refused with ``LeaseLost`` unless the
        run's lease token is still ``fence``.
        """

    def commit_tool_result(self, result: ToolResult) -> None:
        """``commit(result.commit())``, with the same refusals: the event appended and its
        side_effects row inserted, in ONE durable transaction fenced by ``result.fence``, the
        run row left as it is. The store need not build the ``Commit`` to tell it apart."""

    def send_signal(self, run_id: str, name: str, payload_text: str, sent_s: float) -> int:
        """Keep a signal for the run, durably, in ONE transaction with its wake-up: a run
        waiting (status WAITING) is made due at ``sent_s``. Returns the signal's id (1, 2, ...
        per run). ``RunNotFoundError`` if there is no such run, ``RunEndedError`` if it has
        ended; nothing is written then."""

    def pending_signal(self, run_id: str, name: str) -> Signal | None:
        """The run's oldest signal of this name not yet delivered, or None."""

    def signals(self, run_id: str) -> list[Signal]:
        """Every signal sent to the run, in the order sent."""

    def side_effect(self, key: str) -> SideEffect | None:
        """The recorded side effect for an idempotency key, or None."""

    def key_claim(self, key: str) -> KeyClaim | None:
        """The open dispatch claim on an explicit idempotency key, or None."""

    def due_runs(self, now_s: float) -> list[str]:
        """Ids of runs whose timer is due at ``now_s`` (wake_at_s <= now_s), earliest first."""

    def next_wake_s(self) -> float | None:
        """The earliest armed timer over all runs, or None."""

    def take_lease(self, run_id: str, seen_token: int, lease: Lease) -> int | None:
        """Make ``lease`` the run's lease if its token is still ``seen_token`` (compare and
        swap, one transaction). Returns the new token (seen_token + 1), or None if another
        process changed the lease first."""

    def renew_lease(self, run_id: str, token: int, owner: str, expires_s: float) -> bool:
        """Extend a lease still held with ``token`` by ``owner``. No fsync: a renewal lost to a
        power cut only makes the lease expire sooner. False if the lease is gone."""

    def release_lease(self, run_id: str, token: int) -> None:
        """Give up the lease held with ``token`` (nothing happens if it was already taken)."""

    def compact(self, run_id: str, watermark: int, snapshot: str, fence: int) -> int:
        """Fold the run's log up to seq ``watermark`` into ``snapshot``, in ONE transaction,
        durably: store the snapshot (checksummed) and the new watermark, and delete the events
        with seq <= watermark. Refused with ``LeaseLost`` unless the run's lease token is
        ``fence``; a watermark that does not move forward, or passes the last event, is a
        ``ValueError``. Returns the number of events deleted. Side effects are never touched.
        """

    def load_history(self, run_id: str) -> tuple[int, str | None, list[Event]]:
        """The run's watermark, its compaction snapshot (None if never compacted) and its
        events after the watermark, read in one transaction; checksums verified as in
        ``load_log`` (a snapshot that fails its own raises ``StorageError``).

        A log that still holds seq 1 was never compacted (a compaction deletes every event up
        to its watermark in the transaction that sets it), so its watermark is 0 and it has no
        snapshot, and the backends do not read them."""

    def reclaim(self) -> tuple[int, int]:
        """Hand the space freed by compaction back to the file system. Returns the database's
        size in bytes (its WAL included) before and after."""

    def close(self) -> None:
        """Release the database. Idempotent."""


def require_run(store: Store, run_id: str) -> RunRow:
    """The run's row; ``RunNotFoundError`` naming the run and the database when there is none.
    (Here, beside the protocol, so that the runtime finds it without ``store.reads``.)"""
    row = store.get_run(run_id)
    if row is None:
        raise RunNotFoundError(run_id=run_id, path=store.path)
    return row
