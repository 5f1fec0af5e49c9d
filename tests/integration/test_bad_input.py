"""SPEC §16, the cases that reach the core: every user error gets one clear message naming the
thing at fault, and nothing in the database is lost or half-written.

Each test reads the database with plain sqlite3 before and after the mistake. A refused start
leaves no trace at all; a run that fails or is held keeps every event it had, with a gapless log.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from durabl import (
    DeadLetteredError,
    DurablError,
    EncodingError,
    ModelCall,
    ModelCallFailed,
    NoModelError,
    RetryPolicy,
    RunConflictError,
    RunFailedError,
    RunNotFinishedError,
    RunNotFoundError,
    Runtime,
    Sleep,
    ToolCall,
    ToolFailed,
    UnknownToolError,
    UnknownWorkflowError,
    tool,
)
from durabl.crashpoints import AFTER_STEP_COMMITTED, AFTER_TOOL_DISPATCHED, CrashAt, ProcessDeath
from logical_rows import logical

TABLES = ("runs", "events", "side_effects", "key_claims")


# -- reading the database behind durabl's back --------------------------------------------


def snapshot(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every durabl table, read with plain sqlite3 (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in TABLES}
    finally:
        conn.close()


def log_of(db: Path, run_id: str) -> list[tuple[Any, ...]]:
    """(seq, kind, step, data) of a run's events, in order, a TOOL_COMPLETED as the events it
    stands for."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute(
            "SELECT seq, kind, step, data FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
        return logical(rows, kind=1, data=3, fp=None)
    finally:
        conn.close()


def run_row(db: Path, run_id: str) -> tuple[Any, ...] | None:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    finally:
        conn.close()


def assert_gapless(db: Path, run_id: str) -> None:
    seqs = sorted({seq for seq, *_ in log_of(db, run_id)})  # expanded events share a seq
    assert seqs == list(range(1, len(seqs) + 1)), f"log of {run_id} has holes: {seqs}"


def assert_kept(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> None:
    """Nothing recorded before is gone or changed: events and side effects only grow."""
    for table in ("events", "side_effects"):
        missing = set(before[table]) - set(after[table])
        assert not missing, f"{table} rows lost or rewritten: {sorted(missing)}"
    assert {r[0] for r in before["runs"]} <= {r[0] for r in after["runs"]}


# -- the outside world: tools and a model that count their calls ---------------------------


class Calls:
    def __init__(self) -> None:
        self.log: list[tuple[str, dict[str, Any]]] = []

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.log if n == name)


@pytest.fixture()
def calls() -> Calls:
    return Calls()


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    return tmp_path / "agent.db"


class TickingClock:
    """A clock that moves one second per reading, so creation order is well defined."""

    def __init__(self, start_s: float = 1_700_000_000.0) -> None:
        self.now_s = start_s

    def __call__(self) -> float:
        self.now_s += 1.0
        return self.now_s


def search_tool(calls: Calls) -> Any:
    def search(q: str) -> dict[str, Any]:
        calls.log.append(("search", {"q": q}))
        return {"hits": [f"{q}-1", f"{q}-2"]}

    return tool(search, mode="IDEMPOTENT")


def translate_tool(calls: Calls) -> Any:
    def translate(text: str) -> str:
        calls.log.append(("translate", {"text": text}))
        return text.upper()

    return tool(translate, mode="IDEMPOTENT")


def pay_tool(calls: Calls) -> Any:
    def pay(amount: int, *, idempotency_key: str) -> dict[str, Any]:
        calls.log.append(("pay", {"amount": amount, "key": idempotency_key}))
        return {"paid": amount, "ref": idempotency_key}

    return tool(pay, mode="IDEMPOTENT")


# -- workflows (plain generator functions, registered per Runtime only) ---------------------


def badin_search_translate(ctx: Any, q: str) -> Any:
    found = yield ToolCall("search", {"q": q})
    shout = yield ToolCall("translate", {"text": q})
    return {"found": found, "shout": shout}


def badin_search_only(ctx: Any, q: str) -> Any:
    found = yield ToolCall("search", {"q": q})
    return found


def badin_ghost(ctx: Any, q: str) -> Any:
    found = yield ToolCall("search", {"q": q})
    again = yield ToolCall("search", {"q": q + "!"})
    return [found, again]


def badin_pay(ctx: Any, amount: int, key: str) -> Any:
    receipt = yield ToolCall("pay", {"amount": amount}, idempotency_key=key)
    return receipt


def badin_pay_twice(ctx: Any) -> Any:
    first = yield ToolCall("pay", {"amount": 5}, idempotency_key="order-7")
    try:
        second = yield ToolCall("pay", {"amount": 6}, idempotency_key="order-7")
    except ToolFailed as failed:
        return {
            "first": first,
            "type": type(failed).__name__,
            "error_type": failed.error_type,
            "message": failed.message,
        }
    return {"first": first, "second": second}


def badin_ask(ctx: Any, q: str) -> Any:
    found = yield ToolCall("search", {"q": q})
    answer = yield ModelCall(f"Summarise {found['hits']}")
    return answer


def badin_napper(ctx: Any) -> Any:
    found = yield ToolCall("search", {"q": "nap"})
    yield Sleep(hours=1)
    return found


WORKFLOWS = [
    badin_search_translate,
    badin_search_only,
    badin_pay,
    badin_pay_twice,
    badin_ask,
    badin_napper,
]


def runtime(db: Path, calls: Calls, **kwargs: Any) -> Runtime:
    kwargs.setdefault("tools", {"search": search_tool(calls), "translate": translate_tool(calls)})
    kwargs.setdefault("workflows", WORKFLOWS)
    kwargs.setdefault("clock", TickingClock())
    return Runtime(db, **kwargs)


def seeded(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Give the database some history, so that "nothing changed" means something."""
    with runtime(db, Calls()) as rt:
        assert rt.run(badin_search_translate, {"q": "kelp"}, run_id="seed").status == "COMPLETED"
    return snapshot(db)


# -- unknown tool ----------------------------------------------------------------------------


def test_unknown_tool_holds_the_run_before_its_step_starts_and_registering_it_resumes(
    db: Path, calls: Calls
) -> None:
    rt = runtime(db, calls, tools={"search": search_tool(calls)})
    with pytest.raises(UnknownToolError) as info:
        rt.start(badin_search_translate, {"q": "otters"}, run_id="r-tool")
    message = str(info.value)
    assert "'translate'" in message and "r-tool" in message and "search" in message

    state = rt.state("r-tool")
    assert state.status == "HELD"
    assert state.error is not None
    assert "UnknownToolError" in state.error and "'translate'" in state.error
    log = log_of(db, "r-tool")
    assert [kind for _, kind, step, _ in log if step == 2] == [], "the unknown step was started"
    assert "STEP_COMPLETED" in [kind for _, kind, step, _ in log if step == 1]
    with pytest.raises(RunNotFinishedError):
        rt.result("r-tool")
    rt.close()
    held = snapshot(db)

    with runtime(db, calls) as rt2:
        state = rt2.resume("r-tool")
        assert state.status == "COMPLETED", state
        assert state.error is None
        assert rt2.result("r-tool") == {
            "found": {"hits": ["otters-1", "otters-2"]},
            "shout": "OTTERS",
        }
    assert calls.count("search") == 1, "the finished step was executed again"
    assert calls.count("translate") == 1
    assert_kept(held, snapshot(db))
    assert_gapless(db, "r-tool")


# -- unknown workflow ------------------------------------------------------------------------


def test_start_with_a_workflow_name_nobody_registered_writes_nothing(
    db: Path, calls: Calls
) -> None:
    before = seeded(db)
    with runtime(db, calls) as rt:
        with pytest.raises(UnknownWorkflowError) as info:
            rt.start("badin_nobody_registered_this", {"q": "x"}, run_id="r-nobody")
        assert "badin_nobody_registered_this" in str(info.value)
        with pytest.raises(RunNotFoundError):
            rt.state("r-nobody")
    assert snapshot(db) == before


def interrupted(db: Path, calls: Calls, wf: Any, run_id: str, **kwargs: Any) -> None:
    """Start a run and kill the runtime right after its first step commits."""
    rt = runtime(db, calls, **kwargs)
    try:
        with CrashAt(AFTER_STEP_COMMITTED), pytest.raises(ProcessDeath):
            rt.start(wf, {"q": run_id}, run_id=run_id)
    finally:
        rt.close()


def test_resume_of_a_run_whose_workflow_is_not_importable_changes_nothing(
    db: Path, calls: Calls
) -> None:
    interrupted(db, calls, badin_ghost, "r-ghost", workflows={"badin_ghost": badin_ghost})
    before = snapshot(db)
    assert run_row(db, "r-ghost")[3] == "RUNNING"

    with runtime(db, calls) as rt:
        with pytest.raises(UnknownWorkflowError) as info:
            rt.resume("r-ghost")
        assert "badin_ghost" in str(info.value)
        assert rt.state("r-ghost").status == "RUNNING"
    assert snapshot(db) == before
    assert calls.count("search") == 1


def test_resume_all_reports_the_unknown_workflow_and_still_finishes_the_other_runs(
    db: Path, calls: Calls
) -> None:
    clock = TickingClock()
    # The broken run is the older one, so resume_all reaches it first.
    interrupted(
        db, calls, badin_ghost, "r-ghost", workflows={"badin_ghost": badin_ghost}, clock=clock
    )
    interrupted(db, calls, badin_search_translate, "r-fine", clock=clock)
    ghost_log = log_of(db, "r-ghost")
    ghost_row = run_row(db, "r-ghost")
    before = snapshot(db)

    with runtime(db, calls, clock=clock) as rt:
        states = {s.run_id: s for s in rt.resume_all()}
        assert set(states) == {"r-ghost", "r-fine"}
        assert states["r-ghost"].status == "RUNNING"
        assert states["r-ghost"].error is not None and "badin_ghost" in states["r-ghost"].error
        assert states["r-fine"].status == "COMPLETED"
        assert rt.result("r-fine") == {
            "found": {"hits": ["r-fine-1", "r-fine-2"]},
            "shout": "R-FINE",
        }
    assert log_of(db, "r-ghost") == ghost_log
    assert run_row(db, "r-ghost") == ghost_row
    assert_kept(before, snapshot(db))
    assert_gapless(db, "r-fine")


def sleeping(db: Path, calls: Calls, wf: Any, run_id: str, clock: Any, **kwargs: Any) -> None:
    with runtime(db, calls, clock=clock, **kwargs) as rt:
        assert rt.run(wf, run_id=run_id).status == "SLEEPING"


def badin_ghost_napper(ctx: Any) -> Any:
    yield Sleep(minutes=5)
    return "ghost woke"


def test_tick_reports_the_unknown_workflow_and_still_fires_the_other_timers(
    db: Path, calls: Calls
) -> None:
    clock = TickingClock()
    sleeping(
        db,
        calls,
        badin_ghost_napper,
        "r-ghost",
        clock,
        workflows={"badin_ghost_napper": badin_ghost_napper},
    )
    sleeping(db, calls, badin_napper, "r-fine", clock)
    ghost_log = log_of(db, "r-ghost")
    ghost_row = run_row(db, "r-ghost")

    with runtime(db, calls, clock=clock) as rt:
        states = {s.run_id: s for s in rt.tick(now=clock.now_s + 2 * 3600)}
        assert set(states) == {"r-ghost", "r-fine"}
        assert states["r-ghost"].error is not None
        assert "badin_ghost_napper" in states["r-ghost"].error
        assert states["r-fine"].status == "COMPLETED"
        assert rt.result("r-fine") == {"hits": ["nap-1", "nap-2"]}
    assert log_of(db, "r-ghost") == ghost_log
    assert run_row(db, "r-ghost") == ghost_row


# -- non-JSON input and results ----------------------------------------------------------------


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


@pytest.mark.parametrize(
    "bad_input",
    [
        {"q": {"otters", "seals"}},
        {"q": Opaque()},
        {"q": math.nan},
        {"q": "fine", "extra": [1, math.inf]},
        {"otters", "seals"},
    ],
    ids=["set", "object", "nan", "infinity", "top-level-set"],
)
def test_non_json_input_is_refused_and_writes_no_run_row(
    db: Path, calls: Calls, bad_input: Any
) -> None:
    before = seeded(db)
    with runtime(db, calls) as rt:
        with pytest.raises(EncodingError) as info:
            rt.start(badin_search_only, bad_input, run_id="r-bad-input")
        message = str(info.value)
        assert "input" in message and "badin_search_only" in message
        assert isinstance(info.value, DurablError)
        with pytest.raises(RunNotFoundError):
            rt.state("r-bad-input")
    assert snapshot(db) == before
    assert calls.count("search") == 0


def test_a_step_built_from_non_json_arguments_fails_the_run_naming_the_step(
    db: Path, calls: Calls
) -> None:
    before = seeded(db)

    def badin_bad_args(ctx: Any) -> Any:
        found = yield ToolCall("search", {"q": "otters"})
        more = yield ToolCall("search", {"q": {"otters", "seals"}})
        return [found, more]

    with runtime(db, calls, workflows=[badin_bad_args]) as rt:
        state = rt.run(badin_bad_args, run_id="r-args")
    assert state.status == "FAILED"
    assert state.error is not None
    assert state.error.startswith("EncodingError") and "ToolCall('search') args" in state.error
    assert [kind for _, kind, step, _ in log_of(db, "r-args") if step == 2] == []
    assert calls.count("search") == 1
    assert_gapless(db, "r-args")
    assert_kept(before, snapshot(db))


def badin_grab(ctx: Any) -> Any:
    try:
        value = yield ToolCall("grab", {"what": "thing"})
    except ToolFailed as failed:
        return {
            "type": type(failed).__name__,
            "error_type": failed.error_type,
            "message": failed.message,
            "attempts": failed.attempts,
        }
    return {"value": value}


@pytest.mark.parametrize(
    "result",
    [{"tags": {"a", "b"}}, Opaque(), {"score": math.nan}, b"raw bytes"],
    ids=["set", "object", "nan", "bytes"],
)
def test_a_non_json_tool_result_fails_the_step_once_without_retrying(
    db: Path, calls: Calls, result: Any
) -> None:
    before = seeded(db)

    def grab(what: str) -> Any:
        calls.log.append(("grab", {"what": what}))
        return result

    tools = {"grab": tool(grab, mode="IDEMPOTENT", retry=RetryPolicy(5, base_delay=0.0))}
    with runtime(db, calls, tools=tools, workflows=[badin_grab]) as rt:
        state = rt.run(badin_grab, run_id="r-grab")
    assert calls.count("grab") == 1, "a result that cannot be recorded was retried"
    assert state.status == "COMPLETED", state
    caught = state.result
    assert caught["type"] == "ToolFailed"
    assert caught["error_type"] == "EncodingError"
    assert "ToolCall('grab'" in caught["message"] and "r-grab" in caught["message"]
    kinds = [kind for _, kind, step, _ in log_of(db, "r-grab") if step == 1]
    assert kinds == ["STEP_STARTED", "TOOL_DISPATCHED", "STEP_FAILED"]
    assert_gapless(db, "r-grab")
    assert_kept(before, snapshot(db))


def badin_grab_uncaught(ctx: Any) -> Any:
    value = yield ToolCall("grab", {"what": "thing"})
    return value


def test_an_uncaught_non_json_tool_result_fails_the_run_naming_the_step(
    db: Path, calls: Calls
) -> None:
    before = seeded(db)

    def grab(what: str) -> Any:
        calls.log.append(("grab", {"what": what}))
        return {"when": Opaque()}

    tools = {"grab": tool(grab, mode="IDEMPOTENT", retry=RetryPolicy(5, base_delay=0.0))}
    with runtime(db, calls, tools=tools, workflows=[badin_grab_uncaught]) as rt:
        state = rt.run(badin_grab_uncaught, run_id="r-grab")
        assert state.status == "FAILED"
        assert state.error is not None
        assert "ToolFailed" in state.error and "EncodingError" in state.error
        assert "ToolCall('grab'" in state.error and "r-grab" in state.error
        with pytest.raises(RunFailedError) as info:
            rt.result("r-grab")
        assert "r-grab" in str(info.value)
    assert calls.count("grab") == 1
    assert_gapless(db, "r-grab")
    assert_kept(before, snapshot(db))


def badin_think(ctx: Any) -> Any:
    try:
        answer = yield ModelCall("Plan the trip", temperature=0)
    except ModelCallFailed as failed:
        return {
            "type": type(failed).__name__,
            "error_type": failed.error_type,
            "message": failed.message,
        }
    return {"answer": answer}


@pytest.mark.parametrize(
    "answer", [{"tokens": {1, 2}}, Opaque(), [math.inf]], ids=["set", "object", "infinity"]
)
def test_a_non_json_model_result_fails_the_step_once_without_retrying(
    db: Path, calls: Calls, answer: Any
) -> None:
    before = seeded(db)

    def llm(prompt: str, **params: Any) -> Any:
        calls.log.append(("llm", {"prompt": prompt, **params}))
        return answer

    with runtime(
        db, calls, llm=llm, retry=RetryPolicy(5, base_delay=0.0), workflows=[badin_think]
    ) as rt:
        state = rt.run(badin_think, run_id="r-think")
    assert calls.count("llm") == 1, "a model answer that cannot be recorded was asked again"
    assert state.status == "COMPLETED", state
    caught = state.result
    assert caught["type"] == "ModelCallFailed"
    assert caught["error_type"] == "EncodingError"
    assert "ModelCall('Plan the trip')" in caught["message"] and "r-think" in caught["message"]
    kinds = [kind for _, kind, step, _ in log_of(db, "r-think") if step == 1]
    assert kinds == ["STEP_STARTED", "STEP_FAILED"]
    assert_gapless(db, "r-think")
    assert_kept(before, snapshot(db))


# -- a workflow yielding something that is not a step ------------------------------------------

NON_STEPS = ["search the web for otters", {"tool": "search", "q": "otters"}, None]


def make_yielder(bad: Any, catch: bool) -> Any:
    def badin_yielder(ctx: Any) -> Any:
        found = yield ToolCall("search", {"q": "otters"})
        if not catch:
            yield bad
            return "unreachable"
        try:
            yield bad
        except TypeError as exc:
            return {"found": found, "message": str(exc)}
        return "no error was thrown"

    return badin_yielder


@pytest.mark.parametrize("bad", NON_STEPS, ids=["str", "dict", "None"])
def test_yielding_a_non_step_throws_a_type_error_naming_it_into_the_workflow(
    db: Path, calls: Calls, bad: Any
) -> None:
    before = seeded(db)
    wf = make_yielder(bad, catch=True)
    with runtime(db, calls, workflows=[wf]) as rt:
        state = rt.run(wf, run_id="r-yield")
    assert state.status == "COMPLETED", state
    assert state.result["found"] == {"hits": ["otters-1", "otters-2"]}
    assert repr(bad) in state.result["message"]
    assert "badin_yielder" in state.result["message"]
    assert calls.count("search") == 1
    assert_kept(before, snapshot(db))


@pytest.mark.parametrize("bad", NON_STEPS, ids=["str", "dict", "None"])
def test_an_uncaught_non_step_fails_the_run_with_that_message(
    db: Path, calls: Calls, bad: Any
) -> None:
    before = seeded(db)
    wf = make_yielder(bad, catch=False)
    with runtime(db, calls, workflows=[wf]) as rt:
        state = rt.run(wf, run_id="r-yield")
        assert state.status == "FAILED"
        assert state.error is not None
        assert state.error.startswith("TypeError")
        assert repr(bad) in state.error and "badin_yielder" in state.error
        with pytest.raises(RunFailedError) as info:
            rt.result("r-yield")
        assert repr(bad) in str(info.value)
    kinds = [kind for _, kind, _, _ in log_of(db, "r-yield")]
    assert kinds[-1] == "RUN_FAILED"
    assert "STEP_COMPLETED" in kinds
    assert_gapless(db, "r-yield")
    assert_kept(before, snapshot(db))


# -- a workflow returning something that cannot be recorded ----------------------------------


@pytest.mark.parametrize(
    "value", [{"tags": {"a"}}, Opaque(), math.nan], ids=["set", "object", "nan"]
)
def test_a_workflow_returning_a_non_json_value_fails_naming_the_workflow(
    db: Path, calls: Calls, value: Any
) -> None:
    before = seeded(db)

    def badin_returner(ctx: Any) -> Any:
        yield ToolCall("search", {"q": "otters"})
        return value

    with runtime(db, calls, workflows=[badin_returner]) as rt:
        state = rt.run(badin_returner, run_id="r-return")
        assert state.status == "FAILED"
        assert state.error is not None
        assert "EncodingError" in state.error
        assert "badin_returner" in state.error and "r-return" in state.error
        with pytest.raises(RunFailedError):
            rt.result("r-return")
    kinds = [kind for _, kind, _, _ in log_of(db, "r-return")]
    assert kinds[-1] == "RUN_FAILED" and "RUN_COMPLETED" not in kinds
    assert "STEP_COMPLETED" in kinds
    assert_gapless(db, "r-return")
    assert calls.count("search") == 1
    assert_kept(before, snapshot(db))


# -- absurd sleeps -----------------------------------------------------------------------------

ABSURD_SLEEPS = [
    {"seconds": -1},
    {"hours": -0.5},
    {"seconds": 30, "minutes": -1},
    {"seconds": math.nan},
    {"minutes": math.inf, "seconds": -math.inf},
    {"days": 36_501},
    {"hours": math.inf},
    {"seconds": 10**400},
]


SLEEP_IDS = [
    "negative",
    "negative-hours",
    "negative-sum",
    "nan",
    "inf-minus-inf",
    "over-a-century",
    "infinite",
    "huge-int",
]


@pytest.mark.parametrize("kwargs", ABSURD_SLEEPS, ids=SLEEP_IDS)
def test_an_absurd_sleep_is_a_clear_value_error(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError) as info:
        Sleep(**kwargs)
    assert "Sleep" in str(info.value)


@pytest.mark.parametrize(
    "kwargs", ABSURD_SLEEPS[:1] + ABSURD_SLEEPS[3:6], ids=SLEEP_IDS[:1] + SLEEP_IDS[3:6]
)
def test_an_absurd_sleep_inside_a_workflow_fails_the_run_and_keeps_its_log(
    db: Path, calls: Calls, kwargs: dict[str, Any]
) -> None:
    before = seeded(db)

    def badin_sleeper(ctx: Any) -> Any:
        yield ToolCall("search", {"q": "otters"})
        yield Sleep(**kwargs)
        return "woke"

    with runtime(db, calls, workflows=[badin_sleeper]) as rt:
        state = rt.run(badin_sleeper, run_id="r-sleep")
    assert state.status == "FAILED"
    assert state.error is not None
    assert state.error.startswith("ValueError") and "Sleep" in state.error
    kinds = [kind for _, kind, _, _ in log_of(db, "r-sleep")]
    assert "TIMER_ARMED" not in kinds and "STEP_COMPLETED" in kinds
    assert_gapless(db, "r-sleep")
    assert_kept(before, snapshot(db))


def test_a_sleep_given_a_non_number_is_a_type_error_naming_the_unit() -> None:
    with pytest.raises(TypeError) as info:
        Sleep(hours="2")  # type: ignore[arg-type]
    assert "hours" in str(info.value)


# -- idempotency keys reused with other arguments ----------------------------------------------


def test_a_key_reused_by_another_run_with_other_arguments_is_a_clear_conflict(
    db: Path, calls: Calls
) -> None:
    tools = {"pay": pay_tool(calls)}
    with runtime(db, calls, tools=tools) as rt:
        first = rt.run(badin_pay, {"amount": 10, "key": "invoice-42"}, run_id="r-first")
        assert first.result == {"paid": 10, "ref": "invoice-42"}
        before = snapshot(db)

        second = rt.run(badin_pay, {"amount": 99, "key": "invoice-42"}, run_id="r-second")
        assert second.status == "FAILED"
        assert second.error is not None
        assert "IdempotencyKeyConflict" in second.error and "'invoice-42'" in second.error
        assert rt.result("r-first") == {"paid": 10, "ref": "invoice-42"}
    assert calls.count("pay") == 1, "the conflicting call reached the tool"
    after = snapshot(db)
    assert_kept(before, after)
    assert [row for row in after["side_effects"] if row[0] == "invoice-42"] == [
        row for row in before["side_effects"] if row[0] == "invoice-42"
    ]
    failed = [data for _, kind, _, data in log_of(db, "r-second") if kind == "STEP_FAILED"]
    assert len(failed) == 1 and '"error_type":"IdempotencyKeyConflict"' in failed[0]
    assert_gapless(db, "r-second")


def test_a_key_reused_inside_one_run_raises_tool_failed_naming_the_key(
    db: Path, calls: Calls
) -> None:
    with runtime(db, calls, tools={"pay": pay_tool(calls)}) as rt:
        state = rt.run(badin_pay_twice, run_id="r-twice")
    assert state.status == "COMPLETED", state
    assert state.result["first"] == {"paid": 5, "ref": "order-7"}
    assert state.result["type"] == "ToolFailed"
    assert state.result["error_type"] == "IdempotencyKeyConflict"
    assert "'order-7'" in state.result["message"]
    assert calls.count("pay") == 1


def test_a_key_claimed_by_a_run_that_died_in_its_window_conflicts_with_other_arguments(
    db: Path, calls: Calls
) -> None:
    rt = runtime(db, calls, tools={"pay": pay_tool(calls)})
    try:
        with CrashAt(AFTER_TOOL_DISPATCHED), pytest.raises(ProcessDeath):
            rt.start(badin_pay, {"amount": 10, "key": "invoice-77"}, run_id="r-died")
    finally:
        rt.close()
    before = snapshot(db)
    assert [row[0] for row in before["key_claims"]] == ["invoice-77"]

    with runtime(db, calls, tools={"pay": pay_tool(calls)}) as rt2:
        state = rt2.run(badin_pay, {"amount": 11, "key": "invoice-77"}, run_id="r-other")
        assert state.status == "FAILED"
        assert state.error is not None
        assert "IdempotencyKeyConflict" in state.error and "'invoice-77'" in state.error
    assert calls.count("pay") == 0
    assert_kept(before, snapshot(db))


# -- starting a run id that already exists -------------------------------------------------------


def test_start_with_an_existing_run_id_and_other_input_is_a_conflict_naming_both(
    db: Path, calls: Calls
) -> None:
    with runtime(db, calls) as rt:
        rt.start(badin_search_only, {"q": "otters"}, run_id="r-dup")
        before = snapshot(db)
        with pytest.raises(RunConflictError) as info:
            rt.start(badin_search_only, {"q": "seals"}, run_id="r-dup")
        message = str(info.value)
        assert "r-dup" in message and "otters" in message and "seals" in message
        with pytest.raises(RunConflictError) as info:
            rt.start(badin_search_translate, {"q": "otters"}, run_id="r-dup")
        message = str(info.value)
        assert "badin_search_only" in message and "badin_search_translate" in message
        assert rt.result("r-dup") == {"hits": ["otters-1", "otters-2"]}
    assert snapshot(db) == before
    assert calls.count("search") == 1


def test_start_with_an_existing_run_id_and_the_same_input_returns_that_run(
    db: Path, calls: Calls
) -> None:
    with runtime(db, calls) as rt:
        assert rt.start(badin_search_only, {"q": "otters"}, run_id="r-same") == "r-same"
        before = snapshot(db)
        assert rt.start(badin_search_only, {"q": "otters"}, run_id="r-same") == "r-same"
    with runtime(db, calls) as rt2:
        assert rt2.start(badin_search_only, {"q": "otters"}, run_id="r-same") == "r-same"
        assert rt2.result("r-same") == {"hits": ["otters-1", "otters-2"]}
    assert snapshot(db) == before
    assert calls.count("search") == 1


# -- a model call with no model -------------------------------------------------------------------


def test_a_model_call_without_an_llm_holds_the_run_until_one_is_given(
    db: Path, calls: Calls
) -> None:
    rt = runtime(db, calls)
    with pytest.raises(NoModelError) as info:
        rt.start(badin_ask, {"q": "otters"}, run_id="r-nollm")
    assert "r-nollm" in str(info.value) and "llm" in str(info.value)
    state = rt.state("r-nollm")
    assert state.status == "HELD"
    assert state.error is not None and "NoModelError" in state.error
    assert [kind for _, kind, step, _ in log_of(db, "r-nollm") if step == 2] == []
    rt.close()
    held = snapshot(db)

    prompts: list[str] = []

    def llm(prompt: str, **params: Any) -> dict[str, Any]:
        prompts.append(prompt)
        return {"text": f"{len(prompts)} summary"}

    with runtime(db, calls, llm=llm) as rt2:
        state = rt2.resume("r-nollm")
        assert state.status == "COMPLETED", state
        assert state.error is None
        assert rt2.result("r-nollm") == {"text": "1 summary"}
    assert prompts == ["Summarise ['otters-1', 'otters-2']"]
    assert calls.count("search") == 1
    assert_kept(held, snapshot(db))
    assert_gapless(db, "r-nollm")


# -- input that does not fit the workflow's parameters -------------------------------------------


@pytest.mark.parametrize(
    ("bad_input", "named"),
    [({"query": "otters"}, "'q'"), (None, "'q'"), (["otters"], "dict")],
    ids=["misspelt-key", "no-input", "not-a-dict"],
)
def test_input_missing_a_workflow_parameter_is_a_type_error_and_no_run_row(
    db: Path, calls: Calls, bad_input: Any, named: str
) -> None:
    before = seeded(db)
    with runtime(db, calls) as rt:
        with pytest.raises(TypeError) as info:
            rt.start(badin_search_only, bad_input, run_id="r-missing")
        assert named in str(info.value) and "badin_search_only" in str(info.value)
        with pytest.raises(RunNotFoundError):
            rt.state("r-missing")
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("make", "error", "named"),
    [
        (lambda db: Runtime(db, tools={"search": 42}), TypeError, "'search'"),
        (lambda db: Runtime(db, tools={"": print}), TypeError, "''"),
        (lambda db: Runtime(db, llm="gpt"), TypeError, "llm"),
        (lambda db: Runtime(db, retry=3), TypeError, "retry"),
        (lambda db: Runtime(db, durability="fast"), ValueError, "'fast'"),
        (lambda db: tool(print, mode="SOMETIMES"), ValueError, "'SOMETIMES'"),
        (lambda db: tool(print, max_attempts=0), ValueError, "max_attempts"),
        (lambda db: RetryPolicy(max_attempts=0), ValueError, "max_attempts"),
        (lambda db: RetryPolicy(base_delay=-1.0), ValueError, "base_delay"),
        (lambda db: ToolCall("search", ["otters"]), TypeError, "'search'"),
        (lambda db: ToolCall("", {}), TypeError, "name"),
        (lambda db: ToolCall("pay", {}, idempotency_key=7), TypeError, "idempotency_key"),
    ],
    ids=[
        "tool-not-callable",
        "tool-without-name",
        "llm-not-callable",
        "retry-not-a-policy",
        "unknown-durability",
        "unknown-tool-mode",
        "zero-attempts",
        "policy-zero-attempts",
        "negative-delay",
        "args-not-a-dict",
        "empty-tool-name",
        "key-not-a-string",
    ],
)
def test_bad_configuration_is_refused_before_any_file_is_created(
    tmp_path: Path, make: Any, error: type[Exception], named: str
) -> None:
    db = tmp_path / "never.db"
    with pytest.raises(error) as info:
        make(db)
    assert named in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("run_id", [42, "", ["r-1"]], ids=["int", "empty", "list"])
def test_a_run_id_that_is_not_a_non_empty_string_is_refused(
    db: Path, calls: Calls, run_id: Any
) -> None:
    before = seeded(db)
    with runtime(db, calls) as rt, pytest.raises(TypeError) as info:
        rt.start(badin_search_only, {"q": "otters"}, run_id=run_id)
    assert "run_id" in str(info.value)
    assert snapshot(db) == before


# -- runs that do not exist, and results that are not there -----------------------------------


def test_asking_about_an_unknown_run_raises_run_not_found(db: Path, calls: Calls) -> None:
    before = seeded(db)
    with runtime(db, calls) as rt:
        for ask in (rt.state, rt.resume, rt.result, rt.replay, rt.cancel):
            with pytest.raises(RunNotFoundError) as info:
                ask("r-never-started")
            assert isinstance(info.value, DurablError)
            assert "r-never-started" in str(info.value)
    assert snapshot(db) == before


def badin_risky(ctx: Any) -> Any:
    yield ToolCall("search", {"q": "risk"})
    raise RuntimeError("the plan fell through")


def badin_once(ctx: Any) -> Any:
    sent = yield ToolCall("send", {"to": "a@b.c"})
    return sent


def test_result_of_an_unfinished_failed_or_dead_lettered_run_raises_the_right_error(
    db: Path, calls: Calls
) -> None:
    def send(to: str) -> str:
        calls.log.append(("send", {"to": to}))
        return f"sent to {to}"

    tools = {"search": search_tool(calls), "send": send}  # a bare callable is AT_MOST_ONCE
    workflows = [*WORKFLOWS, badin_risky, badin_once]
    rt = runtime(db, calls, tools=tools, workflows=workflows)
    with pytest.raises(NoModelError):
        rt.start(badin_ask, {"q": "otters"}, run_id="r-held")
    assert rt.run(badin_napper, run_id="r-sleeping").status == "SLEEPING"
    assert rt.run(badin_risky, run_id="r-failed").status == "FAILED"
    with CrashAt(AFTER_TOOL_DISPATCHED), pytest.raises(ProcessDeath):
        rt.start(badin_once, run_id="r-dead")
    rt.close()

    with runtime(db, calls, tools=tools, workflows=workflows) as rt2:
        assert rt2.resume("r-dead").status == "DEAD_LETTERED"
        before = snapshot(db)
        for run_id in ("r-held", "r-sleeping"):
            with pytest.raises(RunNotFinishedError) as info:
                rt2.result(run_id)
            assert run_id in str(info.value)
        with pytest.raises(RunFailedError) as failed:
            rt2.result("r-failed")
        assert "r-failed" in str(failed.value) and "the plan fell through" in str(failed.value)
        with pytest.raises(DeadLetteredError) as dead:
            rt2.result("r-dead")
        assert "r-dead" in str(dead.value) and "AT_MOST_ONCE" in str(dead.value)
    assert snapshot(db) == before
    assert calls.count("send") == 0
