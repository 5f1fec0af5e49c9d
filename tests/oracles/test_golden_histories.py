"""Oracle: checked-in event histories still replay against today's code.

Each file in ``golden/`` is the log of a real run, exported by ``scripts/export_golden.py``
(fixed clock, fixed run ids, process identities normalised). The test loads a history into a
fresh database through durabl's own store, so checksums are computed the way durabl computes
them, then replays it dry against the workflow code below: the workflow must recompute the
recorded result byte for byte while nothing is called. A deliberately changed workflow must
raise ``NonDeterminismError`` on the same history. Two histories record one change behind
``ctx.patched``: a run that met it and took the new branch (its log holds the marker), and a run
recorded by the old code and finished by the new on the old branch; the old code and the change
without its guard must each be refused by the history of the other branch, and the code with the
guard taken out must replay the new-branch one (stepping over its marker). One history waits for
signals three ways: answered while it waits, answered before the run reached the wait, and not
answered in time; it replays from its log alone (the signals table is not installed), and a
wait with another timeout is refused. Both run on each backend, and the scenarios that export
the histories record byte-identical logs (and signals) on SQLite and on PostgreSQL: every text
and every float reads back as it was written.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from durabl import (
    TIMED_OUT,
    ChildRun,
    ContinueAsNew,
    ModelCall,
    NonDeterminismError,
    Parallel,
    RetryPolicy,
    Runtime,
    Sleep,
    ToolCall,
    ToolFailed,
    WaitSignal,
    codec,
    tool,
)
from durabl.events import Event
from durabl.store import Commit, RunRow, Store, open_store

from .support import Database, Databases, event_rows, open_connection

GOLDEN = Path(__file__).parent / "golden"
SCRIPT = Path(__file__).parents[2] / "scripts" / "export_golden.py"

COMPUTED: list[Any] = []
"""What each replayed workflow computed as its result, appended just before it returns."""


def research(ctx: Any, topic: str, email: str) -> Any:
    plan = yield ModelCall(f"Make a research plan for {topic}", temperature=0)
    hits = []
    for q in plan["queries"]:
        hits.append((yield ToolCall("search", {"q": q})))
    started_s = ctx.now()
    yield Sleep(hours=1)
    summary = yield ModelCall(f"Summarize: {hits}")
    receipt = yield ToolCall(
        "send_email",
        {"to": email, "body": summary["text"]},
        idempotency_key=f"summary-{ctx.run_id}",
    )
    result = {
        "hits": sum(len(h) for h in hits),
        "receipt": receipt,
        "summary": summary["text"].upper(),
        "started_s": started_s,
    }
    COMPUTED.append(result)
    return result


def retry_and_fallback(ctx: Any, n: int) -> Any:
    value = yield ToolCall("flaky", {"n": n})
    try:
        yield ToolCall("broken", {"why": "golden"})
        fallback = None
    except ToolFailed as failed:
        fallback = f"{failed.tool}:{failed.error_type}:{failed.attempts}"
    result = {"value": value * 3, "fallback": fallback}
    COMPUTED.append(result)
    return result


def crash_resumed(ctx: Any, to: str) -> Any:
    draft = yield ModelCall(f"Draft a note to {to}")
    receipt = yield ToolCall("send_email", {"to": to, "body": draft["text"]})
    result = [receipt, len(draft["text"])]
    COMPUTED.append(result)
    return result


def failing(ctx: Any, why: str) -> Any:
    plan = yield ModelCall(f"What to do about {why}")
    yield ToolCall("broken", {"why": plan["text"]})
    COMPUTED.append("unreachable")
    return "unreachable"


PATCH_ID = "golden-summary-v2"
V1_PROMPT = "Summarize {}: {}"
V2_PROMPT = "Summarize {} in three bullets: {}"


def patched(ctx: Any, topic: str) -> Any:
    """A prompt changed behind ``ctx.patched``: ``patched.json`` was recorded by this code from
    the start (it holds the marker), ``patched_old_branch.json`` by ``patched_before`` until its
    timer, then finished by this code on the old branch."""
    found = yield ToolCall("search", {"q": topic})
    if ctx.patched(PATCH_ID):
        summary = yield ModelCall(V2_PROMPT.format(topic, found))
        version = "v2"
    else:
        summary = yield ModelCall(V1_PROMPT.format(topic, found))
        version = "v1"
    yield Sleep(minutes=10)
    receipt = yield ToolCall("send_email", {"to": "e@f.g", "body": summary["text"]})
    result = {"version": version, "summary": summary["text"], "receipt": receipt}
    COMPUTED.append(result)
    return result


def patched_before(ctx: Any, topic: str) -> Any:
    """The code before the change: what recorded the old branch's first steps."""
    found = yield ToolCall("search", {"q": topic})
    summary = yield ModelCall(V1_PROMPT.format(topic, found))
    yield Sleep(minutes=10)
    receipt = yield ToolCall("send_email", {"to": "e@f.g", "body": summary["text"]})
    return {"version": "v1", "summary": summary["text"], "receipt": receipt}


def patched_without_guard(ctx: Any, topic: str) -> Any:
    """The change without its guard: the new prompt in place of the old one. Deployed before
    the old runs are finished, it holds them; once they are, it is how the guard comes out."""
    found = yield ToolCall("search", {"q": topic})
    summary = yield ModelCall(V2_PROMPT.format(topic, found))
    yield Sleep(minutes=10)
    receipt = yield ToolCall("send_email", {"to": "e@f.g", "body": summary["text"]})
    result = {"version": "v2", "summary": summary["text"], "receipt": receipt}
    COMPUTED.append(result)
    return result


APPROVAL_TIMEOUT_S = 3600.0
NUDGE_TIMEOUT_S = 600.0


def approval(ctx: Any, topic: str) -> Any:
    """Three waits: ``approve`` parks and is answered while the run waits; ``budget`` was
    answered before the run reached it, and takes its signal at once; ``nudge`` is never
    answered and times out (``signalled.json``)."""
    found = yield ToolCall("search", {"q": topic})
    verdict = yield WaitSignal("approve", timeout=APPROVAL_TIMEOUT_S)
    receipt = yield ToolCall("send_email", {"to": verdict["by"], "body": f"{topic}: {found}"})
    budget = yield WaitSignal("budget")
    nudge = yield WaitSignal("nudge", timeout=NUDGE_TIMEOUT_S)
    result = {
        "approved_by": verdict["by"],
        "budget": budget,
        "nudged": nudge is not TIMED_OUT,
        "receipt": receipt,
    }
    COMPUTED.append(result)
    return result


def approval_other_timeout(ctx: Any, topic: str) -> Any:
    """The approval wait given two hours instead of one: a wait's timeout is part of its
    fingerprint, so a run recorded with the other is refused."""
    found = yield ToolCall("search", {"q": topic})
    verdict = yield WaitSignal("approve", timeout=2 * APPROVAL_TIMEOUT_S)
    return (verdict, found)


def fan_out(ctx: Any, topic: str) -> Any:
    """A ``Parallel`` of a flaky tool (first: its first attempt fails and backs off), an
    AT_MOST_ONCE charge and a model call, one at a time (so that the log is the same at every
    export): the flaky branch ends last, after its backoff, and the Parallel records the three
    results in the order given (``parallel.json``)."""
    value, paid, summary = yield Parallel(
        [
            ToolCall("flaky", {"n": len(topic)}),
            ToolCall("charge", {"amount": 3}),
            ModelCall(f"Summarize {topic} for the fan-out"),
        ],
        max_concurrency=1,
    )
    receipt = yield ToolCall("send_email", {"to": "p@q.r", "body": summary["text"]})
    result = {"value": value, "paid": paid, "summary": summary["text"], "receipt": receipt}
    COMPUTED.append(result)
    return result


def fan_out_swapped(ctx: Any, topic: str) -> Any:
    """The same branches in another order: a Parallel's branches, in order, are part of its
    fingerprint."""
    return (
        yield Parallel(
            [
                ToolCall("charge", {"amount": 3}),
                ToolCall("flaky", {"n": len(topic)}),
                ModelCall(f"Summarize {topic} for the fan-out"),
            ],
            max_concurrency=1,
        )
    )


SHIPPING = "golden.shipping"


def ship(ctx: Any, order: int, note: str) -> Any:
    """The child of ``golden.parent``: a lookup and a timer (the child sleeps while its parent
    waits on it)."""
    label = yield ToolCall("search", {"q": f"label {order}"})
    yield Sleep(minutes=5)
    result = {"label": label[0], "note": note}
    COMPUTED.append(result)
    return result


def parent(ctx: Any, order: int) -> Any:
    """A ``ChildRun`` between a model call and a send of what the child returned
    (``child_run.json``, which holds the child's history too)."""
    note = yield ModelCall(f"Brief for order {order}")
    shipped = yield ChildRun(SHIPPING, {"order": order, "note": note["text"]})
    receipt = yield ToolCall("send_email", {"to": "s@t.u", "body": shipped["label"]})
    result = {"shipped": shipped, "receipt": receipt}
    COMPUTED.append(result)
    return result


def parent_other_child(ctx: Any, order: int) -> Any:
    """The child given another input: a ChildRun's workflow and input are its fingerprint."""
    note = yield ModelCall(f"Brief for order {order}")
    return (yield ChildRun(SHIPPING, {"order": order + 1, "note": note["text"]}))


CHAT_TURNS = 3


def chat(ctx: Any, topic: str, turn: int = 1, heard: tuple[Any, ...] = ()) -> Any:
    """Three turns, each a run of its own by ``ContinueAsNew`` (``continued.json``, which holds
    the chain's three histories): the first waits for ``hello``, and ``wrap``, sent to it with
    ``hello``, is handed on by its ContinueAsNew to the second, whose wait takes it at once."""
    if turn == 1:
        heard = ((yield WaitSignal("hello")),)
    elif turn == 2:
        heard = (*heard, (yield WaitSignal("wrap")))
    found = yield ToolCall("search", {"q": f"{topic} {turn}"})
    if turn < CHAT_TURNS:
        yield ContinueAsNew({"topic": topic, "turn": turn + 1, "heard": list(heard)})
    result = {"turns": turn, "heard": list(heard), "found": found}
    COMPUTED.append(result)
    return result


def chat_other_next(ctx: Any, topic: str, turn: int = 1, heard: tuple[Any, ...] = ()) -> Any:
    """The next turn given another input: a ContinueAsNew's input is its fingerprint."""
    heard = ((yield WaitSignal("hello")),)
    yield ToolCall("search", {"q": f"{topic} {turn}"})
    yield ContinueAsNew({"topic": topic, "turn": turn + 2, "heard": list(heard)})


WORKFLOWS: dict[str, Callable[..., Any]] = {
    "golden.research": research,
    "golden.retry_and_fallback": retry_and_fallback,
    "golden.crash_resumed": crash_resumed,
    "golden.failing": failing,
    "golden.patched": patched,
    "golden.approval": approval,
    "golden.fan_out": fan_out,
    "golden.parent": parent,
    SHIPPING: ship,
    "golden.chat": chat,
}
BEFORE_PATCH: dict[str, Callable[..., Any]] = {"golden.patched": patched_before}
"""The code deployed before ``golden.patched`` changed (used by scripts/export_golden.py)."""


# -- the world the histories were recorded against (used by scripts/export_golden.py) --------


def golden_llm(prompt: Any, **params: Any) -> dict[str, Any]:
    text = str(prompt)
    if text.startswith("Make a research plan"):
        return {"queries": ["otter diet", "otter tools"], "params": params}
    return {"text": f"ok: {text[:48]}"}


def golden_tools() -> dict[str, Any]:
    failed_once: set[str] = set()

    def search(*, q: str) -> list[str]:
        return [f"{q} #1", f"{q} #2", f"{q} #3"][: 2 + len(q) % 2]

    def send_email(*, to: str, body: str, idempotency_key: str) -> dict[str, str]:
        return {"id": f"msg-{idempotency_key}", "to": to}

    def flaky(*, n: int, idempotency_key: str) -> int:
        if idempotency_key not in failed_once:
            failed_once.add(idempotency_key)
            raise TimeoutError("upstream timed out")
        return n + 1

    def broken(*, why: str) -> None:
        raise ValueError(f"cannot {why}")

    def charge(*, amount: int, idempotency_key: str) -> dict[str, Any]:
        return {"charged": amount, "id": f"ch-{idempotency_key}"}

    return {
        "charge": tool(charge, mode="AT_MOST_ONCE"),
        "search": tool(search, mode="IDEMPOTENT"),
        "send_email": tool(send_email, mode="IDEMPOTENT"),
        "flaky": tool(flaky, mode="IDEMPOTENT", retry=RetryPolicy(max_attempts=3, base_delay=30)),
        "broken": tool(broken, mode="IDEMPOTENT", retry=RetryPolicy(max_attempts=2, base_delay=0)),
    }


# -- loading a golden file -------------------------------------------------------------------


def golden_files() -> list[Path]:
    return sorted(GOLDEN.glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def runs_of(history: dict[str, Any]) -> list[dict[str, Any]]:
    """The file's run and the runs it made (``linked``: a child, the runs a chain went on as)."""
    return [history, *history.get("linked", [])]


def install(history: dict[str, Any], db: Database) -> Store:
    """Write the history, and those of the runs it made, into a fresh database through
    durabl's own store."""
    store = open_store(db)
    for one in runs_of(history):
        install_run(one, store)
    return store


def install_run(history: dict[str, Any], store: Store) -> None:
    log = [Event(**e) for e in history["events"]]
    first = log[0]
    row = RunRow(
        run_id=history["run_id"],
        workflow=history["workflow"],
        input_text=codec.encode(history["input"]),
        status="RUNNING",
        result_text=None,
        error=None,
        created_s=first.at_s,
        updated_s=first.at_s,
        wake_at_s=None,
        watermark=0,
    )
    assert store.create_run(row, first) is None
    store.commit(
        Commit(
            history["run_id"],
            log[1:],
            status=history["status"],
            result_text=history["result_text"],
            error=history["error"],
            durable=True,
            at_s=log[-1].at_s,
        )
    )


@pytest.fixture(autouse=True)
def _fresh_computed() -> None:
    COMPUTED.clear()


def test_the_golden_histories_are_there() -> None:
    names = {one["workflow"] for p in golden_files() for one in runs_of(load(p))}
    assert names == set(WORKFLOWS)
    for path in golden_files():
        for history in runs_of(load(path)):
            seqs = [e["seq"] for e in history["events"]]
            assert seqs == list(range(1, len(history["events"]) + 1))


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_a_golden_history_replays_to_its_recorded_result(databases: Databases, path: Path) -> None:
    """Every run of the file (with the runs it made) replays dry, calling nothing: a run that
    completed recomputes its result, a CONTINUED one ends again where it went on as the next,
    a failed one fails again."""
    history = load(path)
    db = databases.new("golden")
    store = install(history, db)
    went_on_as = {
        json.loads(one["events"][0]["data"]).get("continued_from"): one["run_id"]
        for one in runs_of(history)
    }
    with Runtime(store=store, workflows=WORKFLOWS, llm=None, tools={}) as rt:
        for one in runs_of(history):
            assert [tuple(e) for e in store.load_log(one["run_id"])] == [
                tuple(Event(**e)) for e in one["events"]
            ]
            stored = [row[1:] for row in event_rows(db, one["run_id"])]
            assert stored == [(*Event(**e), codec.checksum(*Event(**e))) for e in one["events"]], (
                "the database does not hold the history as written"
            )
            COMPUTED.clear()
            state = rt.replay(one["run_id"])

            assert state.status == one["status"]
            assert state.steps_executed == 0
            if one["status"] == "COMPLETED":
                [recomputed] = COMPUTED
                assert codec.encode(recomputed) == one["result_text"]
                assert codec.encode(state.result) == one["result_text"]
            elif one["status"] == "CONTINUED":  # nothing after its ContinueAsNew runs
                assert COMPUTED == []
                next_run = codec.decode(one["result_text"])["continued_as"]
                assert next_run == went_on_as[one["run_id"]]
            else:
                assert COMPUTED == []
                assert one["error"] is not None and "ValueError" in one["error"]


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.stem)
def test_a_golden_history_replays_every_step_it_records(databases: Databases, path: Path) -> None:
    """A dry replay counts every step position the log records as replayed: a Parallel's
    branches included, as executing one counts each branch as well as the Parallel."""
    history = load(path)
    store = install(history, databases.new("golden"))
    with Runtime(store=store, workflows=WORKFLOWS, llm=None, tools={}) as rt:
        for one in runs_of(history):
            positions = {e["step"] for e in one["events"] if e["step"] > 0}
            assert rt.replay(one["run_id"]).steps_replayed == len(positions), one["run_id"]


def research_changed(ctx: Any, topic: str, email: str) -> Any:
    plan = yield ModelCall(f"Make a research plan for {topic}", temperature=0)
    hits = []
    for q in plan["queries"]:
        hits.append((yield ToolCall("search", {"q": q.upper()})))
    return hits


def crash_resumed_changed(ctx: Any, to: str) -> Any:
    draft = yield ModelCall(f"Draft a note to {to}")
    return (yield ToolCall("send_email", {"to": to, "body": draft["text"], "cc": "boss"}))


@pytest.mark.parametrize(
    ("stem", "changed", "position"),
    [
        ("research", research_changed, 2),
        ("research_one_event", research_changed, 2),
        ("crash_resumed", crash_resumed_changed, 2),
        # the change deployed without its guard, under a run recorded by the old code
        ("patched_old_branch", patched_without_guard, 2),
        # the old code under a run that took the new branch: the marker at 2 is stepped over,
        # and the new branch's model call at 3 differs from the old one
        ("patched", patched_before, 3),
        ("signalled", approval_other_timeout, 2),
        ("parallel", fan_out_swapped, 1),
        ("child_run", parent_other_child, 2),
        ("continued", chat_other_next, 3),
    ],
    ids=[
        "research",
        "research_one_event",
        "crash_resumed",
        "unguarded-on-old-branch",
        "old-code-on-new-branch",
        "wait-with-another-timeout",
        "parallel-branches-swapped",
        "child-with-another-input",
        "continued-with-another-input",
    ],
)
def test_a_changed_workflow_raises_on_the_golden_history(
    databases: Databases, stem: str, changed: Callable[..., Any], position: int
) -> None:
    history = load(GOLDEN / f"{stem}.json")
    store = install(history, databases.new("golden"))
    with (
        Runtime(store=store, workflows={history["workflow"]: changed}, tools={}) as rt,
        pytest.raises(NonDeterminismError) as raised,
    ):
        rt.replay(history["run_id"])
    assert raised.value.run_id == history["run_id"]
    assert raised.value.position == position
    first = next(e for e in history["events"] if e["step"] == position)
    assert raised.value.seq == first["seq"]


def test_the_guard_can_come_out_once_only_new_branch_histories_are_left(
    databases: Databases,
) -> None:
    """The code with the guard and the old branch removed replays a run that took the new
    branch to its recorded result: the drive steps over the marker."""
    history = load(GOLDEN / "patched.json")
    store = install(history, databases.new("golden"))
    markers = [e for e in history["events"] if e["kind"] == "CTX_RECORDED"]
    assert [(e["step"], e["data"]) for e in markers] == [(2, codec.encode(PATCH_ID))]
    with Runtime(store=store, workflows={"golden.patched": patched_without_guard}) as rt:
        state = rt.replay(history["run_id"])
    assert state.steps_executed == 0
    [recomputed] = COMPUTED
    assert codec.encode(recomputed) == history["result_text"]
    assert recomputed["version"] == "v2"


def test_the_patched_histories_took_one_branch_each() -> None:
    """Both patched histories belong to the same workflow; only the new-branch one holds a
    marker, and each result names the branch it took."""
    new, old = load(GOLDEN / "patched.json"), load(GOLDEN / "patched_old_branch.json")
    assert new["workflow"] == old["workflow"] == "golden.patched"
    assert [json.loads(e["data"]) for e in new["events"] if e["kind"] == "CTX_RECORDED"] == [
        PATCH_ID
    ]
    assert not [e for e in old["events"] if e["kind"] == "CTX_RECORDED"]
    assert "RUN_RESUMED" in [e["kind"] for e in old["events"]]  # finished by another process
    assert json.loads(new["result_text"])["version"] == "v2"
    assert json.loads(old["result_text"])["version"] == "v1"


def test_the_signalled_history_took_each_signal_once_and_timed_out_on_time() -> None:
    """The history's waits, read from the file: ``approve`` parked with its timer and took the
    signal sent while it waited; ``budget`` took, in the one commit that started it, the signal
    sent before the run reached it; ``nudge`` took none, no earlier than its deadline. The
    signals the file records name the waits that took them."""
    history = load(GOLDEN / "signalled.json")
    at_step: dict[int, list[dict[str, Any]]] = {}
    for e in history["events"]:
        at_step.setdefault(e["step"], []).append(e)
    kinds = {step: [e["kind"] for e in found] for step, found in at_step.items()}
    assert kinds[2] == ["STEP_STARTED", "TIMER_ARMED", "STEP_COMPLETED"]
    assert kinds[4] == ["STEP_STARTED", "STEP_COMPLETED"]
    assert kinds[5] == ["STEP_STARTED", "TIMER_ARMED", "STEP_COMPLETED"]
    approve, budget, nudge = (codec.decode(at_step[s][-1]["data"]) for s in (2, 4, 5))
    sent = {s["name"]: s for s in history["signals"]}
    assert [s["name"] for s in history["signals"]] == ["budget", "approve"]  # in the order sent
    assert approve == {
        "payload": codec.decode(sent["approve"]["payload"]),
        "signal": sent["approve"]["id"],
        "sent_s": sent["approve"]["sent_s"],
    }
    assert sent["approve"]["sent_s"] > at_step[2][0]["at_s"]  # answered while it waited
    assert budget["signal"] == sent["budget"]["id"]
    assert sent["budget"]["sent_s"] < at_step[4][0]["at_s"] == at_step[4][1]["at_s"]
    assert {s["name"]: s["delivered_step"] for s in history["signals"]} == {
        "approve": 2,
        "budget": 4,
    }
    deadline_s = codec.decode(at_step[5][1]["data"])["fire_at_s"]
    assert nudge == {"timed_out": True}
    assert at_step[5][-1]["at_s"] >= deadline_s == at_step[5][0]["at_s"] + NUDGE_TIMEOUT_S
    assert json.loads(history["result_text"])["nudged"] is False


def test_the_parallel_history_records_its_branches_in_the_order_given() -> None:
    """``parallel.json``, read from the file: the Parallel at step 1 began before its branches,
    which took steps 2-4 in the order given; the flaky one (first) backed off and finished
    last, after its backoff, yet the Parallel's result, its last record and committed after
    every branch's, lists the three in the order given."""
    history = load(GOLDEN / "parallel.json")
    events = history["events"]
    started = {e["step"]: e for e in events if e["kind"] == "STEP_STARTED"}
    done = {e["step"]: e for e in events if e["kind"] == "STEP_COMPLETED"}
    branches = codec.decode(started[1]["data"])[1]
    assert [codec.decode(started[p]["data"]) for p in (2, 3, 4)] == branches
    assert started[1]["seq"] < min(e["seq"] for e in events if e["step"] in (2, 3, 4))
    finished = sorted((2, 3, 4), key=lambda p: done[p]["seq"])
    assert finished == [3, 4, 2], "the first branch is the last to finish"
    retry = next(e for e in events if e["kind"] == "STEP_RETRY")
    assert retry["step"] == 2
    assert done[2]["at_s"] >= codec.decode(retry["data"])["retry_at_s"] > done[3]["at_s"]
    assert done[1]["seq"] > max(done[p]["seq"] for p in (2, 3, 4))
    assert done[1]["data"] == "[" + ",".join(done[p]["data"] for p in (2, 3, 4)) + "]"
    assert json.loads(history["result_text"])["value"] == codec.decode(done[2]["data"])


def test_the_child_history_holds_the_child_and_its_end_in_the_parent() -> None:
    """``child_run.json``, read from the file: the parent's step 2 started the child, whose id
    is derived from the parent's and the step, whose RUN_STARTED names that step and whose
    input is the step's; the child's end and the parent's record of it are one commit (the
    same instant, the same result), and the parent goes on only after it."""
    history = load(GOLDEN / "child_run.json")
    [child] = history["linked"]
    events = history["events"]
    [opened] = [e for e in events if e["kind"] == "STEP_STARTED" and e["step"] == 2]
    _kind, workflow, child_input, explicit = codec.decode(opened["data"])
    assert (workflow, explicit) == (SHIPPING, None) == (child["workflow"], None)
    assert child["run_id"] == f"{history['run_id']}-2"
    began = codec.decode(child["events"][0]["data"])
    assert began["parent"] == {"run_id": history["run_id"], "step": 2}
    assert began["input"] == child_input == child["input"]
    assert child["events"][0]["at_s"] == opened["at_s"]  # created by the commit of the step
    [noted] = [e for e in events if e["kind"] == "STEP_COMPLETED" and e["step"] == 2]
    ended = child["events"][-1]
    assert ended["kind"] == "RUN_COMPLETED" and child["status"] == "COMPLETED"
    assert (noted["data"], noted["at_s"]) == (ended["data"], ended["at_s"])
    assert noted["fp"] is None
    later = [e for e in events if e["seq"] > noted["seq"]]
    assert later and all(e["at_s"] > noted["at_s"] for e in later)


def test_the_continued_history_is_one_chain_that_hands_on_its_signals() -> None:
    """``continued.json``, read from the file: three runs, each naming the run it continued
    and named by it (its ContinueAsNew's result, its RUN_CONTINUED, its final row), each
    started with the input its ContinueAsNew gave; ``wrap``, which no wait of the first run
    took, is marked delivered to its ContinueAsNew and handed to the second, whose wait took
    it; the last run's result holds what every turn heard."""
    history = load(GOLDEN / "continued.json")
    chain = runs_of(history)
    assert [one["status"] for one in chain] == ["CONTINUED", "CONTINUED", "COMPLETED"]
    assert [one["workflow"] for one in chain] == ["golden.chat"] * CHAT_TURNS
    for before, after in itertools.pairwise(chain):
        link = {"run_id": after["run_id"]}
        steps = {e["step"]: e for e in before["events"] if e["kind"] == "STEP_STARTED"}
        [(position, opened)] = [(p, e) for p, e in steps.items() if '"continue"' in e["data"]]
        last, end = before["events"][-2:]
        assert (last["kind"], last["step"]) == ("STEP_COMPLETED", position)
        assert codec.decode(last["data"]) == link == codec.decode(end["data"])
        assert end["kind"] == "RUN_CONTINUED"
        assert codec.decode(before["result_text"]) == {"continued_as": after["run_id"]}
        began = codec.decode(after["events"][0]["data"])
        assert began["continued_from"] == before["run_id"]
        assert began["input"] == codec.decode(opened["data"])[1] == after["input"]
    first, second, _third = chain
    sent = {s["name"]: s for s in first["signals"]}
    assert [s["name"] for s in first["signals"]] == ["wrap", "hello"]  # in the order sent
    assert sent["hello"]["delivered_step"] == 1
    assert sent["wrap"]["delivered_step"] == 3  # its ContinueAsNew: handed on
    [handed] = second["signals"]
    assert {k: handed[k] for k in ("name", "payload", "sent_s")} == {
        k: sent["wrap"][k] for k in ("name", "payload", "sent_s")
    }
    took = codec.decode(second["events"][2]["data"])
    assert handed["delivered_step"] == 1 and took["signal"] == handed["id"]
    assert json.loads(chain[-1]["result_text"])["heard"] == ["hi", "bye"]


def export_script() -> Any:
    spec = importlib.util.spec_from_file_location("export_golden", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_export_is_deterministic(tmp_path: Path) -> None:
    script = export_script()
    script.export(tmp_path / "a")
    script.export(tmp_path / "b")
    exported = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert exported == sorted(p.name for p in golden_files())
    for name in exported:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def exported(script: Any, db: Database, stem: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The export script's JSON for one scenario, run against ``db``: the script reads the
    database back with ``sqlite3.connect``, which here opens whichever backend ``db`` is."""
    monkeypatch.setattr(script, "sqlite3", types.SimpleNamespace(connect=open_connection))
    run_id = script.SCENARIOS[stem](db, script.FixedClock())
    history = script._history(db, run_id)
    return json.dumps(history, indent=2, sort_keys=True, ensure_ascii=False)


@pytest.mark.parametrize("stem", [p.stem for p in golden_files()])
def test_a_scenario_records_the_same_history_byte_for_byte_on_both_backends(
    tmp_path: Path, postgres_db: Callable[[], str], monkeypatch: pytest.MonkeyPatch, stem: str
) -> None:
    script = export_script()
    on_sqlite = exported(script, tmp_path / f"{stem}.db", stem, monkeypatch)
    on_postgres = exported(script, postgres_db(), stem, monkeypatch)
    assert on_postgres == on_sqlite
    assert json.loads(on_sqlite)["events"], "the scenario recorded nothing"
