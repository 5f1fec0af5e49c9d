"""Oracle: transparent compaction (SPEC §8).

``Runtime.compact`` folds the resolved prefix of a run's log into a checksummed snapshot and
deletes the events it stands in for. Nothing anyone can observe may change because of it.

Each twin test keeps two copies of one database, taken between processes (the files copied, or the
server's rows into a database of their own) when a run has reached some state: asleep, in a retry's
backoff, interrupted in the middle of a step, dead-lettered, held on changed code, failed, finished.
One copy is compacted, with several ``keep_last`` values, at the split and again after every later
operation; the other never is. Both are then driven by the same script of resumes, ticks, deaths at
crash points and operator actions, each copy with its own world (the model and the tools) and its
own clock set to the same time. After every operation the two must agree on what the operation
returned, the run's state, a dry replay, the metrics, the run's row, every event after the compacted
copy's watermark (byte for byte, process identities aside), the side_effects table, the key claims,
the world's outbox and every call the world received. A changed workflow must raise the same
``NonDeterminismError`` on both, also at a step folded into the snapshot.

Then: the database's own guards still hold after compaction, a run another live runtime drives
is not compacted, a death anywhere inside a compaction leaves the old state or the new one and
never a mix, compaction gives the space back (and, on SQLite only, a long run's file shrinks,
in a new file and in one made without auto_vacuum), and a damaged snapshot is a loud
``StorageError``. Every test runs on SQLite and on PostgreSQL, but for the one about SQLite's
file layout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest

from durabl import (
    ModelCall,
    NonDeterminismError,
    ProcessDeath,
    RunNotFoundError,
    Runtime,
    Sleep,
    StorageError,
    ToolCall,
    ToolFailed,
    codec,
    crashpoints,
    leases,
    operator,
)
from durabl.errors import RunLeased
from durabl.events import Event
from durabl.metrics import MetricsFold
from durabl.replay import History
from durabl.steps import CtxValue, describe_canonical
from durabl.store import SQLiteStore, open_store
from durabl.store.base import Lease
from durabl.store.postgres import PostgresStore
from durabl.upkeep import RunCompaction

from .support import (
    START_S,
    Clock,
    Database,
    Databases,
    World,
    assert_effects_match_log,
    assert_gapless_after_watermark,
    claim_rows,
    connect,
    copy_database,
    crash,
    event_rows,
    fork_world,
    logical,
    refusal,
    run_row,
    side_effect_rows,
    snapshot_row,
    watermark,
)

RUN = "errand-1"
NAME = "oracle_compaction.errand"
INPUT = {"topic": "otters"}
OUTCOMES = ("STEP_COMPLETED", "TOOL_COMPLETED", "STEP_FAILED", "TIMER_FIRED", "CTX_RECORDED")
"""The event that finishes a step, whatever its kind."""
CTX_FPS = {CtxValue(what).fingerprint for what in ("now", "random", "uuid")}


# -- the workflows ----------------------------------------------------------------------------


def errand(ctx: Any, topic: str) -> Any:
    """Every kind of step: model calls, IDEMPOTENT and AT_MOST_ONCE tools, derived and explicit
    keys, ctx values, a Sleep, a retry after a durable backoff, a failure thrown into the
    workflow and caught. The result is computed from the step results by local code, so a
    replay that skipped the generator or served a wrong step could not reproduce it. (The
    random ctx values come first: every script records them before its copies part, so that
    the two copies hold the same ones; ``ctx.now()`` reads each copy's clock, set alike.)"""
    tag = ctx.uuid()  # 1
    draw = ctx.random()  # 2
    plan = yield ModelCall(f"plan {topic}", temperature=0)  # 3
    hits: list[str] = []
    for q in (topic, topic.upper()):
        hits.extend((yield ToolCall("search", {"q": q})))  # 4, 5
    stamp = ctx.now()  # 6
    yield Sleep(seconds=60)  # 7
    woke = ctx.now()  # 8
    value = yield ToolCall("flaky", {"n": plan["tokens"]})  # 9: backs off 5 s once
    try:
        yield ToolCall("broken", {"why": topic})  # 10: two attempts, then thrown in
        fallback = "none"
    except ToolFailed as failed:
        fallback = f"{failed.tool}/{failed.error_type}/{failed.attempts}"
    paid = yield ToolCall("charge", {"amount": value})  # 11: AT_MOST_ONCE, derived key
    receipt = yield ToolCall(
        "send", {"to": "boss", "body": f"{tag}/{fallback}"}, idempotency_key=f"mail-{ctx.run_id}"
    )  # 12
    summary = yield ModelCall({"summarise": sorted(hits), "paid": paid["charged"]})  # 13
    return {
        "hits": sorted(hits, reverse=True),
        "value": value * 2,
        "fallback": fallback,
        "paid": paid,
        "receipt": receipt["sent"].upper(),
        "summary": summary["text"][:30],
        "slept": woke - stamp,
        "tag": tag,
        "draw": draw,
    }


STEPS = 13
CHARGE = 11
"""The position of the AT_MOST_ONCE charge."""


def doomed(ctx: Any, topic: str) -> Any:
    """Fails: the failure of its last step is not caught, so the run ends FAILED."""
    plan = yield ModelCall(f"doom {topic}")
    ctx.now()
    yield ToolCall("search", {"q": plan["text"]})
    yield ToolCall("broken", {"why": plan["text"]})
    return "unreachable"


def _opening(ctx: Any, topic: str, params: dict[str, Any], q: str) -> Any:
    """``errand`` up to its Sleep, with the model's parameters and the first query given."""
    ctx.uuid()
    ctx.random()
    plan = yield ModelCall(f"plan {topic}", **params)
    for query in (q, topic.upper()):
        yield ToolCall("search", {"q": query})
    ctx.now()
    return plan


def _changed_search(ctx: Any, topic: str) -> Any:
    return (yield from _opening(ctx, topic, {"temperature": 0}, topic.title()))


def _changed_model(ctx: Any, topic: str) -> Any:
    return (yield from _opening(ctx, topic, {"temperature": 1}, topic))


def _returns_early(ctx: Any, topic: str) -> Any:
    ctx.uuid()
    ctx.random()
    yield ModelCall(f"plan {topic}", temperature=0)
    return (yield ToolCall("search", {"q": topic}))


def _raises_early(ctx: Any, topic: str) -> Any:
    ctx.uuid()
    ctx.random()
    plan = yield ModelCall(f"plan {topic}", temperature=0)
    raise KeyError(f"no such field in {plan['text']}")


def _random_for_uuid(ctx: Any, topic: str) -> Any:
    return ctx.random()
    yield


def _longer_sleep(ctx: Any, topic: str) -> Any:
    yield from _opening(ctx, topic, {"temperature": 0}, topic)
    yield Sleep(seconds=61)


def _other_flaky(ctx: Any, topic: str) -> Any:
    plan = yield from _opening(ctx, topic, {"temperature": 0}, topic)
    yield Sleep(seconds=60)
    ctx.now()
    return (yield ToolCall("flaky", {"n": plan["tokens"] + 1}))


CHANGED: dict[str, tuple[Callable[..., Any], int]] = {
    "random-for-uuid": (_random_for_uuid, 1),
    "model-params": (_changed_model, 3),
    "search-args": (_changed_search, 4),
    "raises-early": (_raises_early, 4),
    "returns-early": (_returns_early, 5),
    "longer-sleep": (_longer_sleep, 7),
    "other-flaky": (_other_flaky, 9),
}
"""Versions of ``errand`` changed at one position: the name, and the position."""


# -- two copies of one database ---------------------------------------------------------------


class Copy:
    """One copy of the database, with its own world and clock. A (re)started process is a new
    Runtime on it. ``shared`` holds the runtimes that wrote to the database before it was
    copied: both copies' logs name them."""

    def __init__(
        self,
        root: Path,
        db: Database,
        workflows: dict[str, Any],
        *,
        world: World | None = None,
        clock_s: float = START_S,
        shared: frozenset[str] = frozenset(),
    ) -> None:
        root.mkdir(exist_ok=True)
        self.root = root
        self.db = db
        self.world = world if world is not None else World(root)
        self.clock = Clock(clock_s)
        self.workflows = workflows
        self.shared = shared
        self.made: list[Runtime] = []
        self.rt = self.boot()

    def boot(self, **overrides: Any) -> Runtime:
        options: dict[str, Any] = {
            "llm": self.world.llm,
            "tools": self.world.tools(),
            "clock": self.clock,
            "workflows": self.workflows,
        }
        options.update(overrides)
        rt = Runtime(self.db, **options)
        self.made.append(rt)
        return rt

    def restart(self, **overrides: Any) -> None:
        """The process exits (or died: its connections go) and a new one opens the database."""
        self.rt.close()
        self.rt = self.boot(**overrides)

    def fork(self, root: Path, databases: Databases) -> Copy:
        """Stop this copy's process, copy its database, and start a process on each copy."""
        self.rt.close()
        root.mkdir()
        twin = Copy(
            root,
            databases.copy(self.db, f"{root.name}/durabl"),
            self.workflows,
            world=fork_world(self.world, root),
            clock_s=self.clock.now_s,
            shared=frozenset(rt.instance_id for rt in self.made) | self.shared,
        )
        self.shared = twin.shared
        self.world.calls.clear()
        self.world.keys_seen.clear()
        self.rt = self.boot()
        return twin

    def close(self) -> None:
        for rt in self.made:
            rt.close()


@dataclasses.dataclass
class Copies:
    """The copies a test made, on its backend's databases; all closed at the end."""

    root: Path
    databases: Databases
    made: list[Copy] = dataclasses.field(default_factory=list)


@pytest.fixture
def copies(tmp_path: Path, databases: Databases) -> Iterator[Copies]:
    made = Copies(tmp_path, databases)
    yield made
    for copy in made.made:
        copy.close()


def origin(copies: Copies) -> Copy:
    db = copies.databases.new("plain/durabl")
    copy = Copy(copies.root / "plain", db, {NAME: errand, "doomed": doomed})
    copies.made.append(copy)
    return copy


def split(plain: Copy, copies: Copies) -> Copy:
    compacted = plain.fork(copies.root / "compacted", copies.databases)
    copies.made.append(compacted)
    return compacted


# -- what the two copies must agree on ---------------------------------------------------------


def live_events(copy: Copy, after_seq: int = 0) -> list[tuple[Any, ...]]:
    """The run's events after ``after_seq``, with each process that wrote to this copy alone
    (after it was split off) named by the order it first appears, not by its random id."""
    names: dict[str, str] = {}
    found = []
    for _, seq, kind, step, fp, data, at_s, _ in event_rows(copy.db, RUN):
        if seq <= after_seq:
            continue
        if data is not None and kind in ("RUN_STARTED", "RUN_RESUMED"):
            fields = codec.decode(data)
            owner = fields["owner"]
            if owner not in copy.shared:
                fields["owner"] = names.setdefault(owner, f"process {len(names) + 1}")
            data = codec.encode(fields)
        found.append((seq, kind, step, fp, data, at_s))
    return found


def outcome(action: Callable[..., Any], *args: Any) -> Any:
    """What ``action(*args)`` returned, or the error it raised, as something comparable."""
    try:
        return action(*args)
    except Exception as exc:
        return (type(exc).__name__, str(exc))


def unleased(db: Database) -> dict[str, Any]:
    """The run's row, less the lease: who holds a run is not its state."""
    return {k: v for k, v in run_row(db, RUN).items() if not k.startswith("lease_")}


def row_state(copy: Copy) -> dict[str, Any]:
    row = run_row(copy.db, RUN)
    skip = ("watermark", "lease_token")
    return {k: v for k, v in row.items() if k not in skip and not k.startswith("lease_")}


def observed(copy: Copy, after_seq: int, same_error: bool = True) -> dict[str, Any]:
    """Everything about the run that compaction must leave as it is (with ``same_error``
    False, the text of the error a held run records is left out)."""
    before = event_rows(copy.db)
    calls = dict(copy.world.calls)
    replayed = outcome(copy.rt.replay, RUN)
    assert event_rows(copy.db) == before, "a dry replay wrote"
    assert dict(copy.world.calls) == calls, "a dry replay called the world"
    state, row = copy.rt.state(RUN), row_state(copy)
    if not same_error:
        state, row["error"] = dataclasses.replace(state, error=None), None
        replayed = replayed[0] if isinstance(replayed, tuple) else replayed
    return {
        "state": state,
        "replay": replayed,
        "metrics": copy.rt.metrics(RUN),
        "row": row,
        "events": live_events(copy, after_seq),
        "side_effects": side_effect_rows(copy.db),
        "claims": claim_rows(copy.db),
        "outbox": copy.world.outbox.records(),
        "calls": sorted(copy.world.calls.items()),
        "keys": list(copy.world.keys_seen),
    }


def assert_agree(plain: Copy, compacted: Copy, *, same_error: bool = True) -> None:
    mark = watermark(compacted.db, RUN)
    seqs = [row[1] for row in event_rows(compacted.db, RUN)]
    assert seqs == list(range(mark + 1, mark + 1 + len(seqs))), f"watermark {mark}, seqs {seqs}"
    assert_gapless_after_watermark(compacted.db)
    mine = observed(compacted, mark, same_error)
    theirs = observed(plain, mark, same_error)
    for key in mine:
        assert mine[key] == theirs[key], f"the copies disagree on {key}"
    assert watermark(plain.db, RUN) == 0, "the plain copy must never be compacted"
    assert_effects_match_log(plain.db)


def fold_point(events: list[tuple[Any, ...]], keep_last: int) -> tuple[int, int]:
    """(position, seq) that compaction must fold up to, worked out from the whole log alone:
    the longest run of finished positions 1..P, less ``keep_last``, and the seq of the event
    that finished the last of them."""
    finished_at: dict[int, int] = {}
    for _, seq, kind, step, *_ in events:
        if kind in OUTCOMES:
            finished_at[step] = seq
    finished = 0
    while finished + 1 in finished_at:
        finished += 1
    position = finished - keep_last
    return (position, finished_at[position]) if position > 0 else (0, 0)


def history_of(db: Database) -> History:
    with contextlib.closing(open_store(db, read_only=True)) as store:
        mark, snapshot, log = store.load_history(RUN)
    return History.from_events(RUN, log, watermark=mark, snapshot=snapshot)


def assert_same_history(whole: History, folded: History, mark: int) -> None:
    """The fold of snapshot + log is the fold of the whole log, but for what a finished step
    no longer needs: its canonical text (a short description stands in) and its dispatch."""
    for name in ("run_id", "last_seq", "workflow", "input_text", "terminal", "terminal_data"):
        assert getattr(folded, name) == getattr(whole, name), name
    assert folded.resumed_at == whole.resumed_at
    assert sorted(folded.steps) == sorted(whole.steps)
    for position, rec in whole.steps.items():
        mine = folded.steps[position]
        if mine.done_seq and mine.done_seq <= mark:
            kept = ("fp", "first_seq", "done", "done_seq", "last_seq", "attempts", "retries")
            for name in (*kept, "result_text", "failure", "wake_at_s", "dead"):
                assert getattr(mine, name) == getattr(rec, name), (position, name)
            assert mine.canonical is None
            about = None if rec.fp in CTX_FPS else describe_canonical(rec.canonical or "")
            assert mine.description == about, position
        else:
            assert mine == rec, position


def compact(plain: Copy, compacted: Copy, keep_last: int) -> RunCompaction | None:
    """Compact the run on one copy only, and check what compaction did against the other."""
    old_mark = watermark(compacted.db, RUN)
    before = event_rows(compacted.db, RUN)
    position, seq = fold_point(event_rows(plain.db, RUN), keep_last)
    report = compacted.rt.compact(RUN, keep_last=keep_last)
    after = event_rows(compacted.db, RUN)
    if seq <= old_mark:
        assert report.runs == [], report
        assert after == before
        return None
    [folded] = report.runs
    assert folded == RunCompaction(
        run_id=RUN,
        steps_folded=position,
        events_deleted=sum(1 for row in before if row[1] <= seq),
        watermark=seq,
        events_kept=len(after),
    )
    assert watermark(compacted.db, RUN) == seq
    assert after == [row for row in before if row[1] > seq], "compaction touched the kept events"
    assert report.busy == []
    assert report.bytes_before is not None and report.bytes_after is not None
    assert_same_history(history_of(plain.db), history_of(compacted.db), seq)
    return folded


# -- the scripts ------------------------------------------------------------------------------

Op = Callable[[Copy], Any]


def resume(copy: Copy) -> Any:
    return copy.rt.resume(RUN)


def resume_all(copy: Copy) -> Any:
    return copy.rt.resume_all()


def start(copy: Copy) -> Any:
    return copy.rt.start(NAME, INPUT, run_id=RUN)


def restart(copy: Copy) -> Any:
    copy.restart()


def later(seconds: float) -> Op:
    def tick(copy: Copy) -> Any:
        copy.clock.advance(seconds)
        return copy.rt.tick()

    return tick


def dying(point: str, occurrence: int, op: Op) -> Op:
    """``op``, in a process that dies the ``occurrence``-th time it reaches ``point``."""

    def die(copy: Copy) -> Any:
        assert crash(point, occurrence, lambda: op(copy)), f"no death at {point} #{occurrence}"
        copy.restart()

    return die


def status_is(expected: str) -> Op:
    def check(copy: Copy) -> Any:
        assert run_row(copy.db, RUN)["status"] == expected, (expected, copy.rt.state(RUN))

    return check


def redrive(copy: Copy) -> Any:
    return copy.rt.redrive(RUN)


def resolve_from_ledger(copy: Copy) -> Any:
    """The operator looks in the world's ledger for the dead-lettered charge and supplies it."""
    [letter] = copy.rt.dead_letters()
    seen = copy.world.outbox.find(f"durabl:{RUN}:{letter.step}")
    assert seen is not None, "this script kills the charge after it ran"
    return copy.rt.resolve(RUN, {"charged": seen["amount"]})


def changed_code(name: str) -> Op:
    def deploy(copy: Copy) -> Any:
        copy.restart(workflows={NAME: CHANGED[name][0]})
        return outcome(copy.rt.resume, RUN)

    return deploy


def original_code(copy: Copy) -> Any:
    copy.restart(workflows={NAME: errand})
    return copy.rt.resume(RUN)


SCRIPTS: dict[str, list[Op]] = {
    "sleep-retry-finish": [
        start,
        status_is("SLEEPING"),
        restart,
        later(60),
        status_is("SLEEPING"),
        resume,
        later(5),
        status_is("COMPLETED"),
    ],
    "deaths-dead-letter-redriven": [
        start,
        dying(crashpoints.AFTER_RETRY_SCHEDULED, 1, later(60)),
        resume,
        dying(crashpoints.AFTER_TOOL_DISPATCHED, 4, later(5)),
        resume,
        status_is("DEAD_LETTERED"),
        dying(crashpoints.AFTER_MODEL_RETURNED, 1, redrive),
        status_is("RUNNING"),
        resume_all,
        status_is("COMPLETED"),
    ],
    "deaths-dead-letter-resolved": [
        dying(crashpoints.AFTER_STEP_COMMITTED, 2, start),
        resume_all,
        dying(crashpoints.BEFORE_TIMER_FIRED, 1, later(60)),
        dying(crashpoints.AFTER_STEP_STARTED, 1, resume),
        resume,
        status_is("SLEEPING"),
        dying(crashpoints.AFTER_TOOL_RETURNED, 4, later(5)),
        resume,
        status_is("DEAD_LETTERED"),
        resolve_from_ledger,
        status_is("COMPLETED"),
    ],
    "held-then-fixed": [
        start,
        later(60),
        changed_code("search-args"),
        status_is("HELD"),
        changed_code("other-flaky"),
        original_code,
        status_is("SLEEPING"),
        later(5),
        status_is("COMPLETED"),
    ],
}


def play(copies: Copies, script: list[Op], at: int) -> tuple[Copy, Copy]:
    """Play ``script`` on one copy up to operation ``at``, split, then on both copies,
    compacting one at the split and after every operation, keeping the last 0, 1 or 2 steps
    in turn out of the snapshot."""
    plain = origin(copies)
    for op in script[:at]:
        op(plain)
    compacted = split(plain, copies)
    compact(plain, compacted, at % 3)
    assert_agree(plain, compacted)
    for n, op in enumerate(script[at:], start=at + 1):
        assert outcome(op, compacted) == outcome(op, plain)
        assert_agree(plain, compacted)
        if compact(plain, compacted, n % 3) is not None:
            assert_agree(plain, compacted)
    return plain, compacted


CASES = [
    (name, at)
    for name, script in SCRIPTS.items()
    for at in range(1, len(script) + 1)
    if getattr(script[at - 1], "__qualname__", "") != "status_is.<locals>.check"
]
"""Every script split after every operation (but a status check, which changes nothing)."""


@pytest.mark.parametrize(("script", "at"), CASES, ids=[f"{n}@{a}" for n, a in CASES])
def test_a_compacted_copy_goes_on_exactly_like_the_uncompacted_one(
    copies: Copies, script: str, at: int
) -> None:
    plain, compacted = play(copies, SCRIPTS[script], at)

    assert run_row(plain.db, RUN)["status"] == "COMPLETED"
    assert watermark(compacted.db, RUN) > 0, "the script never compacted anything"
    # No effect twice: the charge once in all (AT_MOST_ONCE), each outbox key once.
    for copy in (plain, compacted):
        keys = Counter(record["key"] for record in copy.world.outbox.records())
        assert set(keys.values()) == {1}, keys
        assert sorted(keys) == [f"durabl:{RUN}:{CHARGE}", f"mail-{RUN}"]
    result = plain.rt.result(RUN)
    assert compacted.rt.result(RUN) == result
    assert result["fallback"] == "broken/ValueError/2"
    assert result["value"] == 2 * 10 * len("plan otters")
    assert result["slept"] >= 60


def test_repeated_compaction_with_every_keep_last_moves_the_watermark_only_forward(
    copies: Copies,
) -> None:
    plain = origin(copies)
    start(plain)
    later(60)(plain)
    later(5)(plain)
    compacted = split(plain, copies)
    marks = []
    for keep_last in range(STEPS + 2, -1, -1):
        folded = compact(plain, compacted, keep_last)
        marks.append(watermark(compacted.db, RUN))
        assert (folded is None) == (keep_last >= STEPS)
        assert folded is None or folded.steps_folded == STEPS - keep_last
        assert_agree(plain, compacted)
    assert marks == sorted(marks) and len(set(marks)) == STEPS + 1
    # Folding less than has been folded does nothing.
    assert compact(plain, compacted, 5) is None
    assert [row[2] for row in event_rows(compacted.db, RUN)] == ["RUN_COMPLETED"]
    assert_agree(plain, compacted)


def test_a_run_compacted_up_to_its_last_event_goes_on_at_the_next_seq(copies: Copies) -> None:
    plain = origin(copies)
    assert crash(crashpoints.AFTER_STEP_COMMITTED, 3, lambda: start(plain))
    plain.restart()
    compacted = split(plain, copies)
    folded = compact(plain, compacted, 0)
    assert folded is not None and folded.events_kept == 0
    assert event_rows(compacted.db, RUN) == []
    assert_agree(plain, compacted)

    assert compacted.rt.resume(RUN) == plain.rt.resume(RUN)
    first = event_rows(compacted.db, RUN)[0]
    assert (first[1], first[2]) == (folded.watermark + 1, "RUN_RESUMED")
    assert_agree(plain, compacted)


def test_a_failed_run_compacts_and_replays_to_the_same_failure(copies: Copies) -> None:
    plain = origin(copies)
    plain.rt.start("doomed", INPUT, run_id=RUN)
    assert run_row(plain.db, RUN)["status"] == "FAILED"
    compacted = split(plain, copies)
    for keep_last in (2, 0):
        assert compact(plain, compacted, keep_last) is not None
        assert_agree(plain, compacted)
    replayed = compacted.rt.replay(RUN)
    assert replayed.status == "FAILED"
    assert replayed.steps_replayed == 4
    assert [row[2] for row in event_rows(compacted.db, RUN)] == ["RUN_FAILED"]


# -- non-determinism --------------------------------------------------------------------------


def at_the_retry(copies: Copies, keep_last: int) -> tuple[Copy, Copy]:
    """The errand waiting for its retry (steps 1-8 finished, 9 open), in two copies, one of
    them compacted keeping the last ``keep_last`` finished steps out of the snapshot."""
    plain = origin(copies)
    start(plain)
    later(60)(plain)
    assert run_row(plain.db, RUN)["status"] == "SLEEPING"
    compacted = split(plain, copies)
    folded = compact(plain, compacted, keep_last)
    assert folded is not None and folded.steps_folded == 8 - keep_last
    return plain, compacted


READ_THE_SAME = {"model-params"}
"""Changes whose two steps read the same in short (a model's parameters are not shown). For a
step still in the log the error then shows both canonical texts in full; a snapshot keeps only
the recorded step's short description, so for a folded step the error shows both fingerprints
instead, and the two messages differ there (the run, seq and position do not)."""


@pytest.mark.parametrize("keep_last", [0, 3])
@pytest.mark.parametrize("variant", list(CHANGED))
def test_a_changed_workflow_is_refused_at_the_same_position_on_both_copies(
    copies: Copies, variant: str, keep_last: int
) -> None:
    code, position = CHANGED[variant]
    plain, compacted = at_the_retry(copies, keep_last)
    errors = []
    for copy in (plain, compacted):
        changed = copy.boot(workflows={NAME: code})
        with pytest.raises(NonDeterminismError) as raised:
            changed.replay(RUN)
        errors.append(raised.value)
    recorded, folded = errors
    assert (folded.run_id, folded.position) == (RUN, position)
    first_seq = min(row[1] for row in event_rows(plain.db, RUN) if row[3] == position)
    assert folded.seq == recorded.seq == first_seq
    in_snapshot = position <= 8 - keep_last
    assert in_snapshot == (first_seq <= watermark(compacted.db, RUN))
    same_text = not (in_snapshot and variant in READ_THE_SAME)
    if same_text:
        assert (folded.expected, folded.actual) == (recorded.expected, recorded.actual)
        assert str(folded) == str(recorded)
    else:
        short = "ModelCall('plan otters')"
        assert folded.expected.startswith(f"{short} (fingerprint ")
        assert folded.actual.startswith(f"{short} (fingerprint ")
        assert folded.expected != folded.actual
        assert recorded.expected.startswith(f"{short} = ")

    # Resumed with the changed code, both runs are held with their logs untouched ...
    for copy in (plain, compacted):
        copy.restart(workflows={NAME: code})
    held = [outcome(resume, copy) for copy in (plain, compacted)]
    assert [h[0] for h in held] == ["NonDeterminismError"] * 2
    assert held[0] == held[1] or not same_text
    assert run_row(compacted.db, RUN)["status"] == "HELD"
    assert_agree(plain, compacted, same_error=same_text)
    # ... and go on alike once the code they started with is back.
    for op in (original_code, later(5)):
        assert outcome(op, compacted) == outcome(op, plain)
        assert_agree(plain, compacted)
    assert run_row(compacted.db, RUN)["status"] == "COMPLETED"


# -- the database's own guards after compaction -----------------------------------------------


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        (
            "INSERT INTO events VALUES (:run, :last + 2, 'STEP_STARTED', 9, NULL, NULL, 0, 0, NULL)",
            "exactly one",
        ),
        (
            "INSERT INTO events VALUES (:run, :mark, 'STEP_STARTED', 9, NULL, NULL, 0, 0, NULL)",
            "exactly one",
        ),
        (
            "INSERT INTO events VALUES (:run, 1, 'RUN_STARTED', 0, NULL, NULL, 0, 0, NULL)",
            "exactly one",
        ),
        ("UPDATE runs SET watermark = :mark - 1 WHERE run_id = :run", "only moves forward"),
        ("UPDATE runs SET watermark = 0 WHERE run_id = :run", "only moves forward"),
        ("DELETE FROM events WHERE run_id = :run AND seq = :mark + 1", "compacted prefix"),
        ("DELETE FROM events WHERE run_id = :run", "compacted prefix"),
        ("UPDATE events SET data = 'null' WHERE run_id = :run AND seq = :last", "append-only"),
    ],
    ids=[
        "gap",
        "seq-at-watermark",
        "seq-1-again",
        "watermark-back-one",
        "watermark-to-zero",
        "delete-above-watermark",
        "delete-the-rest",
        "update-above-watermark",
    ],
)
def test_the_database_still_guards_a_compacted_log(
    copies: Copies, statement: str, message: str
) -> None:
    plain, compacted = at_the_retry(copies, 1)
    compacted.rt.close()
    mark = watermark(compacted.db, RUN)
    last = event_rows(compacted.db, RUN)[-1][1]
    assert mark > 1 and last > mark + 1
    before = (event_rows(compacted.db), run_row(compacted.db, RUN))
    with (
        connect(compacted.db) as conn,
        pytest.raises(refusal(compacted.db), match=message),
    ):
        conn.execute(statement, {"run": RUN, "mark": mark, "last": last})
    assert (event_rows(compacted.db), run_row(compacted.db, RUN)) == before
    # The seq right after the log's end is what the database lets in.
    with connect(compacted.db) as conn:
        conn.execute("BEGIN")
        conn.execute(
            "INSERT INTO events VALUES (?, ?, 'STEP_STARTED', 7, NULL, NULL, 0, 0, NULL)",
            (RUN, last + 1),
        )
        conn.execute("ROLLBACK")
    compacted.rt = compacted.boot()
    later(5)(plain)
    later(5)(compacted)
    assert_agree(plain, compacted)


# -- leases -----------------------------------------------------------------------------------


def test_a_run_another_runtime_is_driving_is_not_compacted(copies: Copies) -> None:
    """While one runtime is inside a step of the run (here: its tool is running), a second
    runtime on the same database cannot compact it: RunLeased for that run, ``busy`` for all runs;
    the other runs are compacted as usual."""
    plain = origin(copies)
    plain.rt.start("doomed", INPUT, run_id="other")
    other_before = event_rows(plain.db, "other")
    start(plain)
    later(60)(plain)
    second = plain.boot()
    seen: dict[str, Any] = {}

    def spy(**args: Any) -> Any:
        log = event_rows(plain.db, RUN)
        with pytest.raises(RunLeased):
            second.compact(RUN)
        seen["busy"] = second.compact(keep_last=0)
        assert event_rows(plain.db, RUN) == log
        seen["watermark"] = watermark(plain.db, RUN)
        return plain.world.flaky(**args)

    tools = plain.world.tools()
    tools["flaky"] = dataclasses.replace(tools["flaky"], fn=spy)
    plain.restart(tools=tools)
    later(5)(plain)
    assert run_row(plain.db, RUN)["status"] == "COMPLETED"
    report = seen["busy"]
    assert report.busy == [RUN]
    assert [r.run_id for r in report.runs] == ["other"]
    assert seen["watermark"] == 0
    assert watermark(plain.db, "other") == other_before[-2][1]
    # Once the run is let go, the second runtime compacts it.
    assert [r.run_id for r in second.compact(RUN).runs] == [RUN]


def test_a_run_leased_by_another_live_process_is_not_compacted(copies: Copies) -> None:
    plain = origin(copies)
    start(plain)
    row = plain.rt.store.get_run(RUN)
    assert row is not None
    parent = os.getppid()
    lease = Lease(
        owner="another-process",
        pid=parent,
        host=leases.HOST,
        started=leases.process_started(parent),
        expires_s=4e9,
    )
    assert plain.rt.store.take_lease(RUN, row.lease_token, lease) is not None
    before = (event_rows(plain.db), run_row(plain.db, RUN))
    with pytest.raises(RunLeased):
        plain.rt.compact(RUN)
    report = plain.rt.compact()
    assert (report.runs, report.busy) == ([], [RUN])
    assert (event_rows(plain.db), run_row(plain.db, RUN)) == before


# -- deaths during compaction -----------------------------------------------------------------


@contextlib.contextmanager
def death_at_line(codes: tuple[CodeType, ...], n: int) -> Iterator[list[str]]:
    """Kill the process (``ProcessDeath``) when the ``n``-th line of ``codes`` is about to run:
    a crash point placed from the outside, anywhere inside the code under test. Yields a list
    that names the line the death struck, if it did."""
    struck: list[str] = []
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count == n:
                struck.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                raise ProcessDeath(f"line {n}")
        return local

    def calls(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code in codes and not struck else None

    sys.settrace(calls)
    try:
        yield struck
    finally:
        sys.settrace(None)


def _nested(code: CodeType, name: str) -> CodeType:
    """The code of the function named ``name`` defined inside ``code``."""
    [found] = [c for c in code.co_consts if isinstance(c, CodeType) and c.co_name == name]
    return found


COMPACTION_CODE = {
    "sqlite": (
        operator.compact_run.__code__,
        SQLiteStore.compact.__code__,
        inspect.unwrap(SQLiteStore._write).__code__,
        SQLiteStore._set_sync.__code__,
    ),
    "postgres": (
        operator.compact_run.__code__,
        PostgresStore.compact.__code__,
        _nested(PostgresStore.compact.__code__, "work"),
        PostgresStore._do.__code__,
    ),
}
"""The code a compaction runs, per backend: the operator's, and the store's transaction."""


def state_of_database(db: Database) -> tuple[Any, ...]:
    row = run_row(db, RUN)
    kept = {k: row[k] for k in ("status", "watermark", "wake_at_s")}
    return kept, snapshot_row(db, RUN), event_rows(db), side_effect_rows(db)


def test_a_death_anywhere_inside_a_compaction_leaves_the_old_state_or_the_new(
    copies: Copies, backend: str
) -> None:
    """Die at every line compaction runs, one death per try: each time the database holds
    exactly the state before compaction or exactly the state after, and a new process goes on
    alike."""
    plain = origin(copies)
    start(plain)
    later(60)(plain)
    compacted = split(plain, copies)
    compacted.close()
    pristine = copies.databases.backup(compacted.db, "pristine")
    old = state_of_database(compacted.db)
    compacted.rt = compacted.boot()
    compacted.rt.compact(RUN, reclaim=False)
    new = state_of_database(compacted.db)
    assert old != new
    compacted.close()

    seen: Counter[str] = Counter()
    for n in range(1, 500):
        copies.databases.restore(compacted.db, pristine)
        rt = compacted.boot()
        with (
            death_at_line(COMPACTION_CODE[backend], n) as struck,
            contextlib.suppress(ProcessDeath),
        ):
            rt.compact(RUN, reclaim=False)
        rt.close()
        now = state_of_database(compacted.db)
        assert now in (old, new), f"a death at {struck} left a mix of old and new"
        if not struck:
            assert now == new
            break
        seen["old" if now == old else "new"] += 1
    else:
        raise AssertionError("compaction never ran to its end")
    assert seen["old"] > 10 and seen["new"] > 0, seen
    compacted.rt = compacted.boot()
    assert_agree(plain, compacted)
    for op in (later(5), resume):
        assert outcome(op, compacted) == outcome(op, plain)
        assert_agree(plain, compacted)


def test_a_death_at_the_lease_leaves_nothing_and_the_next_process_compacts(copies: Copies) -> None:
    plain = origin(copies)
    start(plain)
    compacted = split(plain, copies)
    before = state_of_database(compacted.db)
    assert crash(crashpoints.AFTER_LEASE_TAKEN, 1, lambda: compacted.rt.compact(RUN))
    assert state_of_database(compacted.db) == before
    compacted.restart()
    assert compact(plain, compacted, 0) is not None
    assert_agree(plain, compacted)


KILL_COMPACTION = {
    "sqlite": (
        [
            "CREATE TRIGGER kill_compaction BEFORE DELETE ON events "
            "WHEN OLD.seq = {seq} BEGIN SELECT RAISE(ABORT, 'killed'); END"
        ],
        ["DROP TRIGGER kill_compaction"],
    ),
    "postgres": (
        [
            "CREATE FUNCTION kill_compaction() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'killed'; END $$",
            "CREATE TRIGGER kill_compaction BEFORE DELETE ON events FOR EACH ROW "
            "WHEN (OLD.seq = {seq}) EXECUTE FUNCTION kill_compaction()",
        ],
        ["DROP TRIGGER kill_compaction ON events", "DROP FUNCTION kill_compaction"],
    ),
}
"""A trigger that aborts the delete of one event, in each backend's dialect, and its removal."""


def test_a_compaction_whose_transaction_is_killed_changes_nothing(
    copies: Copies, backend: str
) -> None:
    """The database aborts the compaction's transaction at its last delete, after the snapshot
    was written in it: nothing of it may remain."""
    plain = origin(copies)
    start(plain)
    compacted = split(plain, copies)
    _, seq = fold_point(event_rows(plain.db, RUN), 0)
    kill, unkill = KILL_COMPACTION[backend]
    with connect(compacted.db) as conn:
        for statement in kill:
            conn.execute(statement.format(seq=seq))
    before = state_of_database(compacted.db)
    with pytest.raises(StorageError, match="killed"):
        compacted.rt.compact(RUN)
    assert state_of_database(compacted.db) == before
    assert snapshot_row(compacted.db, RUN) is None
    assert_agree(plain, compacted)
    with connect(compacted.db) as conn:
        for statement in unkill:
            conn.execute(statement)
    assert compact(plain, compacted, 0) is not None
    assert_agree(plain, compacted)


# -- space ------------------------------------------------------------------------------------

LONG = "oracle_compaction.long"
LONG_STEPS = 2000


def long_agent(ctx: Any, n: int) -> Any:
    total = 0
    for i in range(n):
        answer = yield ModelCall(f"{i}: " + "consider the otter " * 20)
        total += answer["n"] * (i % 7)
    return total


def small_llm(prompt: Any, **params: Any) -> dict[str, int]:
    return {"n": len(prompt)}


def file_bytes(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def pragma(db: Path, name: str) -> Any:
    with connect(db) as conn:
        return conn.execute(f"PRAGMA {name}").fetchone()[0]


def without_auto_vacuum(src: Path, dst: Path) -> None:
    """A copy of ``src`` laid out as a file created before durabl switched auto_vacuum on."""
    copy_database(src, dst)
    with connect(dst) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
        conn.execute("PRAGMA auto_vacuum = NONE")
        conn.execute("VACUUM")
        conn.execute("PRAGMA journal_mode = WAL")
    assert pragma(dst, "auto_vacuum") == 0


def database_bytes(db: Database) -> int:
    """What the database takes on disk: the file and its WAL, or the ``durabl`` schema's
    tables on a server, their indexes and TOAST included."""
    if isinstance(db, Path):
        return file_bytes(db)
    with connect(db) as conn:
        (size,) = conn.execute(
            "SELECT SUM(pg_total_relation_size(format('durabl.%I', tablename))) "
            "FROM pg_tables WHERE schemaname = 'durabl'"
        ).fetchone()
    return int(size)


def test_compacting_a_long_run_shrinks_the_file_new_or_old(tmp_path: Path) -> None:
    """SQLite only: a file made before durabl switched auto_vacuum on is rewritten once."""
    plain = tmp_path / "plain.db"
    with Runtime(plain, llm=small_llm, workflows={LONG: long_agent}, durability="process") as rt:
        state = rt.run(LONG, {"n": LONG_STEPS}, run_id=RUN)
        assert state.status == "COMPLETED"
        reference = (rt.replay(RUN), rt.metrics(RUN), rt.state(RUN))
    old = tmp_path / "old.db"
    without_auto_vacuum(plain, old)
    new = tmp_path / "new.db"
    copy_database(plain, new)

    for db in (new, old):
        with Runtime(db, workflows={LONG: long_agent}, durability="process") as rt:
            size = file_bytes(db)
            report = rt.compact(RUN, reclaim=False)
            [folded] = report.runs
            assert (folded.steps_folded, folded.events_kept) == (LONG_STEPS, 1)
            assert report.bytes_before is None and report.bytes_after is None
            assert pragma(db, "freelist_count") > 0
            before, after = rt.store.reclaim()
            assert before >= size
            assert after == file_bytes(db)
            assert after < size * 0.4, f"{db.name}: {size} bytes, {after} after compaction"
            assert pragma(db, "freelist_count") == 0
            # Nothing left to give back: a second reclaim keeps the size.
            assert rt.store.reclaim()[1] == after
            assert (rt.replay(RUN), rt.metrics(RUN), rt.state(RUN)) == reference
            assert rt.replay(RUN).steps_replayed == LONG_STEPS
    assert pragma(old, "auto_vacuum") == 2, "the rewrite did not switch incremental vacuum on"


@pytest.mark.alone  # a snapshot taken by another process keeps deleted rows for VACUUM FULL
def test_compact_reclaims_by_default_and_reports_the_sizes(db: Database) -> None:
    with Runtime(db, llm=small_llm, workflows={LONG: long_agent}, durability="process") as rt:
        rt.run(LONG, {"n": 400}, run_id=RUN)
        report = rt.compact()
        assert report.bytes_before is not None and report.bytes_after is not None
        assert report.bytes_after == database_bytes(db)
        assert report.bytes_after < report.bytes_before * 0.5
        assert rt.replay(RUN).steps_replayed == 400


# -- a damaged snapshot -----------------------------------------------------------------------


def _flip_a_digit(text: str) -> str:
    at = next(i for i, ch in enumerate(text) if ch.isdigit() and i > text.index('"steps"'))
    return text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1 :]


DAMAGE = {
    "snapshot-text": ("UPDATE snapshots SET body = ? WHERE run_id = ?", _flip_a_digit),
    "snapshot-crc": ("UPDATE snapshots SET crc = crc + 1 WHERE run_id = ?", None),
    "watermark-raised": ("UPDATE runs SET watermark = watermark + 1 WHERE run_id = ?", None),
    "snapshot-lost": ("DELETE FROM snapshots WHERE run_id = ?", None),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_snapshot_is_a_loud_storage_error(copies: Copies, damage: str) -> None:
    _, compacted = at_the_retry(copies, 0)
    compacted.rt.close()
    statement, change = DAMAGE[damage]
    with connect(compacted.db) as conn:
        if change is None:
            conn.execute(statement, (RUN,))
        else:
            snapshot = snapshot_row(compacted.db, RUN)
            assert snapshot is not None
            conn.execute(statement, (change(snapshot["body"]), RUN))
    before = (event_rows(compacted.db), unleased(compacted.db))
    rt = compacted.boot()
    for read in (
        lambda: rt.replay(RUN),
        lambda: rt.resume(RUN),
        lambda: rt.state(RUN),
        lambda: rt.metrics(RUN),
        lambda: rt.compact(RUN),
    ):
        with pytest.raises(StorageError) as raised:
            read()
        assert RUN in str(raised.value)
        assert "snapshot" in str(raised.value)
    [ticked] = rt.tick(START_S + 10**6)
    assert ticked.error is not None and "snapshot" in ticked.error
    assert (event_rows(compacted.db), unleased(compacted.db)) == before
    assert compacted.world.total_calls == 0


# -- metrics ----------------------------------------------------------------------------------


def test_metrics_of_a_compacted_run_are_the_figures_of_its_whole_log(copies: Copies) -> None:
    plain, compacted = play(copies, SCRIPTS["deaths-dead-letter-redriven"], 2)
    whole = [Event(*row[1:7]) for row in event_rows(plain.db, RUN)]
    figures = MetricsFold.of(whole).m
    assert compacted.rt.metrics(RUN) == plain.rt.metrics(RUN) == figures
    assert figures.steps == 9 and figures.ctx_values == 4
    assert (figures.model_calls, figures.tool_calls, figures.sleeps) == (2, 6, 1)
    assert figures.resumes >= 3 and figures.dead_letters == 1
    assert figures.reexecuted_model_calls == 1
    assert figures.retries == 2 and figures.failed_steps == 1
    both = compacted.rt.metrics()
    assert both == dataclasses.replace(figures, runs=1)


# -- bad calls --------------------------------------------------------------------------------


@pytest.mark.parametrize("keep_last", [-1, True, 1.5, "2", None])
def test_keep_last_must_be_a_whole_number_of_steps(copies: Copies, keep_last: Any) -> None:
    plain = origin(copies)
    start(plain)
    before = event_rows(plain.db)
    with pytest.raises(ValueError, match="keep_last"):
        plain.rt.compact(RUN, keep_last=keep_last)
    assert event_rows(plain.db) == before


def test_compacting_an_unknown_run_names_it(copies: Copies) -> None:
    plain = origin(copies)
    with pytest.raises(RunNotFoundError, match="nope"):
        plain.rt.compact("nope")
    assert plain.rt.compact().runs == []


def test_a_compacted_runs_snapshot_carries_no_step_it_does_not_serve(copies: Copies) -> None:
    """The snapshot keeps each folded step's outcome, and no step past the watermark."""
    plain, compacted = at_the_retry(copies, 2)
    row = snapshot_row(compacted.db, RUN)
    assert row is not None
    snapshot = json.loads(row["body"])
    positions = [step[0] for step in snapshot["steps"]]
    assert positions == [1, 2, 3, 4, 5, 6]
    assert snapshot["workflow"] == NAME
    recorded = {row[3]: row[5] for row in logical(event_rows(plain.db, RUN)) if row[2] in OUTCOMES}
    assert [step[7] for step in snapshot["steps"]] == [recorded[p] for p in positions]
