"""Oracle: the transaction boundary of a tool call (SPEC §3).

A tool call is STEP_STARTED, then TOOL_DISPATCHED, then the side_effects row and STEP_COMPLETED
in ONE transaction. The first two are committed before the call when a crash during the call
must find them: for an AT_MOST_ONCE tool (the ambiguous window) and for an explicit key (its
claim); for an IDEMPOTENT tool with a derived key they are committed with the outcome, since a
crash during the call re-runs it either way. After a death at each named point, the database
is inspected with its own driver (``sqlite3``, psycopg) BEFORE anything resumes, and must hold
exactly what the tables below say. At no crash point may the side_effects table and the log
disagree: if any named point sat between recording the effect and recording the completion, the
sweep below would find it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durabl import ModelCall, Sleep, ToolCall, ToolFailed, codec, crashpoints, tool

from .support import (
    Clock,
    Database,
    Databases,
    World,
    assert_effects_match_log,
    claim_rows,
    crash,
    drive_to_rest,
    event_rows,
    logical,
    side_effect_rows,
)

ONE_TOOL = "oracle_boundary.one_tool"
MANY = "oracle_boundary.many"

OPENED = ["RUN_STARTED", "STEP_STARTED", "TOOL_DISPATCHED"]
DONE = [*OPENED, "STEP_COMPLETED"]

# What the log of a one-tool run holds after a death at each point, and whether the tool ran:
# when the opening is committed before the call...
COMMITTED_BEFORE = {
    crashpoints.BEFORE_STEP_STARTED: (["RUN_STARTED"], 0),
    crashpoints.AFTER_STEP_STARTED: (["RUN_STARTED"], 0),
    crashpoints.AFTER_TOOL_DISPATCHED: (OPENED, 0),
    crashpoints.AFTER_TOOL_RETURNED: (OPENED, 1),
    crashpoints.AFTER_STEP_COMMITTED: (DONE, 1),
}
# ... and when it is committed with the outcome, as one TOOL_COMPLETED event.
COMMITTED_WITH_OUTCOME = {
    crashpoints.BEFORE_STEP_STARTED: (["RUN_STARTED"], 0),
    crashpoints.AFTER_STEP_STARTED: (["RUN_STARTED"], 0),
    crashpoints.AFTER_TOOL_DISPATCHED: (["RUN_STARTED"], 0),
    crashpoints.AFTER_TOOL_RETURNED: (["RUN_STARTED"], 1),
    crashpoints.AFTER_STEP_COMMITTED: (["RUN_STARTED", "TOOL_COMPLETED"], 1),
}


def one_tool(ctx: Any, name: str, key: str | None) -> Any:
    args = {"amount": 3} if name == "charge" else {"to": "b", "body": "boundary"}
    return (yield ToolCall(name, args, idempotency_key=key))


def many(ctx: Any) -> Any:
    plan = yield ModelCall("plan")
    a = yield ToolCall("send", {"to": "m", "body": plan["text"]})
    b = yield ToolCall("charge", {"amount": 9}, idempotency_key=f"pay-{ctx.run_id}")
    c = yield ToolCall("flaky", {"n": 2})
    try:
        e = yield ToolCall("broken", {"why": "boundary"})
    except ToolFailed as failed:
        e = failed.error_type
    yield Sleep(seconds=5)
    d = yield ToolCall("send", {"to": "m", "body": "last"}, idempotency_key=f"last-{ctx.run_id}")
    return [a, b, c, d, e]


WORKFLOWS = {ONE_TOOL: one_tool, MANY: many}


@pytest.mark.parametrize("point", list(COMMITTED_BEFORE))
@pytest.mark.parametrize(
    ("name", "key"),
    [("send", None), ("send", "k-send"), ("charge", None), ("charge", "k-charge")],
    ids=[
        "idempotent-derived",
        "idempotent-explicit",
        "at_most_once-derived",
        "at_most_once-explicit",
    ],
)
def test_the_database_holds_what_the_table_says_at_each_point(
    db: Database, world: World, runtime: Any, point: str, name: str, key: str | None
) -> None:
    rt = runtime(WORKFLOWS)
    assert crash(point, 1, lambda: rt.start(ONE_TOOL, {"name": name, "key": key}, run_id="R"))
    deferred = name == "send" and key is None
    expected_kinds, calls = (COMMITTED_WITH_OUTCOME if deferred else COMMITTED_BEFORE)[point]
    effective_key = key or "durabl:R:1"

    rows = event_rows(db, "R")
    assert [r[2] for r in rows] == expected_kinds
    assert world.calls[name] == calls
    assert world.outbox.count(key=effective_key) == calls
    effects = side_effect_rows(db)
    if point == crashpoints.AFTER_STEP_COMMITTED:
        [effect] = effects
        assert effect[:4] == (effective_key, "R", 1, name)
        assert effect[4] == rows[1][4], "the effect must carry the step's fingerprint"
        assert effect[5] == logical(rows)[-1][5], "the effect and the completion disagree"
        assert claim_rows(db) == []
    else:
        assert effects == [], "an effect was recorded before its completion"
    if (
        key is not None
        and "TOOL_DISPATCHED" in expected_kinds
        and "STEP_COMPLETED" not in expected_kinds
    ):
        assert claim_rows(db) == [(key, "R", 1)]
    if len(rows) > 2:
        assert codec.decode(rows[2][5]) == {"key": effective_key}
    assert_effects_match_log(db)


def test_a_failed_attempt_records_nothing_until_its_outcome_commits(
    db: Database, clock: Clock, world: World, runtime: Any
) -> None:
    rt = runtime(WORKFLOWS)

    def first_process() -> None:
        drive_to_rest(rt, clock, rt.start(MANY, None, run_id="F"))

    assert crash(crashpoints.AFTER_TOOL_RETURNED, 5, first_process)
    assert world.calls["broken"] == 1
    rows = event_rows(db, "F")
    # ``broken`` is IDEMPOTENT with a derived key (step 5): its attempt opens and closes in one
    # commit, so the death leaves nothing of it, and the log ends with step 4's completion
    # (``flaky``, IDEMPOTENT too: its last attempt and its result are one event).
    assert [r[2:4] for r in rows[-1:]] == [("TOOL_COMPLETED", 4)]
    assert not [r for r in rows if r[3] == 5]
    assert_effects_match_log(db)


def test_no_crash_point_sits_between_the_effect_and_its_completion(
    tmp_path: Path, databases: Databases, runtime: Any
) -> None:
    reached: dict[str, int] = {}
    for point in crashpoints.ALL:
        occurrence = 0
        while True:
            occurrence += 1
            folder = tmp_path / f"{point}-{occurrence}"
            folder.mkdir()
            world, clock = World(folder), Clock()
            db = databases.new(f"{point}-{occurrence}/durabl")
            rt = runtime(WORKFLOWS, db=db, llm=world.llm, tools=world.tools(), clock=clock)
            if not crash(
                point,
                occurrence,
                lambda rt=rt, clock=clock: drive_to_rest(
                    rt, clock, rt.start(MANY, None, run_id="M")
                ),
            ):
                break
            reached[point] = occurrence
            assert_effects_match_log(db)
            assert len(side_effect_rows(db)) == sum(
                1
                for r in event_rows(db, "M")
                if r[2] in ("STEP_COMPLETED", "TOOL_COMPLETED") and r[3] not in (1,)
            ), f"{point} #{occurrence}"
            rt.close()  # gone before the next case: a server counts connections
    expected_unreached = {crashpoints.BEFORE_CTX_RECORDED, crashpoints.AFTER_DEAD_LETTERED}
    assert set(crashpoints.ALL) - set(reached) == expected_unreached
    assert reached[crashpoints.AFTER_STEP_COMMITTED] == 5
    assert reached[crashpoints.AFTER_TOOL_RETURNED] == 7


def test_a_result_that_cannot_be_recorded_spends_its_key_in_one_transaction(
    db: Database, world: World, runtime: Any
) -> None:
    calls: list[str] = []

    def unrecordable(*, idempotency_key: str) -> set[int]:
        calls.append(idempotency_key)
        return {1, 2}

    def wf(ctx: Any) -> Any:
        try:
            return (yield ToolCall("unrecordable"))
        except ToolFailed as failed:
            return failed.error_type

    tools = {**world.tools(), "unrecordable": tool(unrecordable, mode="IDEMPOTENT")}
    name = "oracle_boundary.unrecordable"
    rt = runtime({name: wf}, tools=tools)
    assert crash(crashpoints.AFTER_TOOL_RETURNED, 1, lambda: rt.start(name, None, run_id="U"))
    assert side_effect_rows(db) == []

    state = runtime({name: wf}, tools=tools).resume("U")

    assert (state.status, state.result) == ("COMPLETED", "EncodingError")
    assert calls == ["durabl:U:1", "durabl:U:1"], "an unrecordable result must not be retried"
    [effect] = side_effect_rows(db)
    assert effect[:4] == ("durabl:U:1", "U", 1, "unrecordable")
    assert effect[5] is None and effect[6] is not None and "EncodingError" in effect[6]
    failed = [r for r in event_rows(db, "U") if r[2] == "STEP_FAILED"]
    assert len(failed) == 1 and failed[0][3] == 1
    assert_effects_match_log(db)
