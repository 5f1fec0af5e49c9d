"""``durabl show`` and ``durabl runs`` name the runs a run is linked to (SPEC §9): a child run's
parent, the children a run started with their statuses, the runs before and after it in a chain
of ContinueAsNew, the child a parent waits for; ``show --trace`` puts a Parallel's branches
under it.

The runs are made in this process by a real ``Runtime`` on the test's SQLite file (the tool is
the only double); every command is a real ``python -m durabl`` process (``Cli``), read-only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli import Cli

from durabl import ChildRun, ContinueAsNew, Parallel, Runtime, ToolCall, WaitSignal, tool, workflow
from durabl.cli.render import when

T0_S = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


class Clock:
    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        return self.now_s


def echo(x: Any) -> Any:
    return x


@workflow(name="links.kid")
def kid(ctx: Any, n: int) -> Any:
    yield ToolCall("echo", {"x": n})
    return n * 2


@workflow(name="links.waiting_kid")
def waiting_kid(ctx: Any) -> Any:
    return (yield WaitSignal("go"))


@workflow(name="links.parent")
def parent(ctx: Any) -> Any:
    derived = yield ChildRun(kid, {"n": 1})
    named = yield ChildRun("links.kid", {"n": 2}, run_id="named-kid")
    answer = yield ChildRun(waiting_kid)
    return [derived, named, answer]


@workflow(name="links.looping")
def looping(ctx: Any, turn: int) -> Any:
    yield ToolCall("echo", {"x": turn})
    if turn < 2:
        yield ContinueAsNew({"turn": turn + 1})
    return turn


@workflow(name="links.chained_child")
def chained_child(ctx: Any) -> Any:
    return (yield ChildRun(looping, {"turn": 1}))


@workflow(name="links.fanning")
def fanning(ctx: Any) -> Any:
    first = yield ToolCall("echo", {"x": "first"})
    both = yield Parallel([ToolCall("echo", {"x": "a"}), ToolCall("echo", {"x": "b"})])
    last = yield ToolCall("echo", {"x": "last"})
    return [first, both, last]


@workflow(name="links.one_child")
def one_child(ctx: Any) -> Any:
    got = yield ChildRun(kid, {"n": 3})
    yield ToolCall("echo", {"x": "after"})
    return got


WORKFLOWS = [kid, waiting_kid, parent, looping, chained_child, fanning, one_child]


@pytest.fixture
def rt(cli: Cli) -> Any:
    with Runtime(
        cli.db, tools={"echo": tool(echo, mode="IDEMPOTENT")}, clock=Clock(), workflows=WORKFLOWS
    ) as runtime:
        yield runtime


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def text(cli: Cli, *args: str) -> list[str]:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def chain(rt: Runtime, first: str) -> list[str]:
    """The run ids of a ContinueAsNew chain from ``first``, in order."""
    ids = [first]
    while (row := rt.store.get_run(ids[-1])) is not None and row.status == "CONTINUED":
        ids.append(json.loads(row.result_text or "{}")["continued_as"])
    return ids


def test_show_names_children_and_parent_and_what_the_parent_waits_for(
    cli: Cli, rt: Runtime
) -> None:
    assert rt.run(parent, run_id="p").status == "WAITING"
    since = when(T0_S)

    shown = text(cli, "show", "p")
    assert shown[:5] == [
        "run p (links.parent): WAITING",
        f"waiting for child run p-3 since {since}",
        "child run p-1 (step 1): COMPLETED",
        "child run named-kid (step 2): COMPLETED",
        "child run p-3 (step 3): WAITING",
    ]
    assert shown[5].split()[:2] == ["SEQ", "TIME"]
    assert text(cli, "show", "p-3")[:3] == [
        "run p-3 (links.waiting_kid): WAITING",
        f"waiting for signal 'go' since {since}",
        "parent: run p, step 3",
    ]
    assert text(cli, "show", "named-kid")[:2] == [
        "run named-kid (links.kid): COMPLETED",
        "parent: run p, step 2",
    ]

    payload = cli.json("show", "p")
    assert payload["waiting_for"] == {"child": "p-3", "since_s": T0_S}
    assert payload["links"] == {
        "parent": None,
        "continued_from": None,
        "continued_as": None,
        "children": [
            {"run_id": "p-1", "step": 1, "status": "COMPLETED"},
            {"run_id": "named-kid", "step": 2, "status": "COMPLETED"},
            {"run_id": "p-3", "step": 3, "status": "WAITING"},
        ],
        "children_count": 3,
    }
    assert cli.json("show", "p-3", "--trace")["links"]["parent"] == {
        "run_id": "p",
        "step": 3,
        "status": "WAITING",
    }

    # the run list says what each waiting run waits for: a signal, or a child run
    rows = {line.split()[0]: line for line in text(cli, "runs")[1:]}
    assert f"WAITING for child run p-3 since {since}" in rows["p"]
    assert f"WAITING for 'go' since {since}" in rows["p-3"]
    waits = {r["run_id"]: r.get("waiting_for") for r in cli.json("runs")}
    assert waits["p"] == {"child": "p-3", "since_s": T0_S}
    assert waits["p-3"] == {"signal": "go", "since_s": T0_S, "timeout_at_s": None}

    # the child's answer ends it, its end wakes the parent: nothing is waited for any more
    rt.signal("p-3", "go", "yes")
    rt.tick()
    rt.tick()
    assert rt.state("p").status == "COMPLETED"
    shown = text(cli, "show", "p")
    assert shown[0] == "run p (links.parent): COMPLETED"
    assert shown[3] == "child run p-3 (step 3): COMPLETED"
    assert not any(line.startswith("waiting for") for line in shown)
    assert "waiting_for" not in cli.json("runs")[0]


def test_show_follows_a_chain_of_continue_as_new(cli: Cli, rt: Runtime) -> None:
    assert rt.run(looping, {"turn": 0}, run_id="loop").status == "COMPLETED"
    first, second, third = chain(rt, "loop")
    assert text(cli, "show", first)[:2] == [
        f"run {first} (links.looping): CONTINUED",
        f"continued as: run {second}",
    ]
    assert text(cli, "show", second)[:3] == [
        f"run {second} (links.looping): CONTINUED",
        f"continued from: run {first}",
        f"continued as: run {third}",
    ]
    assert text(cli, "show", third, "--trace")[:2] == [
        f"run {third} (links.looping): COMPLETED; one process",
        f"continued from: run {second}",
    ]
    links = cli.json("show", second)["links"]
    assert links["continued_from"] == {"run_id": first, "status": "CONTINUED"}
    assert links["continued_as"] == {"run_id": third, "status": "COMPLETED"}
    assert links["parent"] is None and links["children"] == []
    statuses = {r["run_id"]: r["status"] for r in cli.json("runs", "--workflow", "links.looping")}
    assert statuses == {first: "CONTINUED", second: "CONTINUED", third: "COMPLETED"}
    assert {r["run_id"] for r in cli.json("runs", "--status", "continued")} == {first, second}


def test_a_child_that_continues_keeps_its_parent(cli: Cli, rt: Runtime) -> None:
    assert rt.run(chained_child, run_id="cp").status == "COMPLETED"
    child, after = chain(rt, "cp-1")
    assert text(cli, "show", "cp")[1] == "child run cp-1 (step 1): CONTINUED"
    assert text(cli, "show", child)[1:3] == ["parent: run cp, step 1", f"continued as: run {after}"]
    assert text(cli, "show", after)[1:3] == [
        "parent: run cp, step 1",
        f"continued from: run {child}",
    ]


def test_trace_puts_a_parallels_branches_under_it(cli: Cli, rt: Runtime) -> None:
    assert rt.run(fanning, run_id="fan").status == "COMPLETED"
    lines = text(cli, "show", "fan", "--trace")
    assert lines[1].split() == ["STEP", "HOW", "PROCESS", "DESCRIPTION"]
    cells = [line.split(None, 3)[3] for line in lines[2:]]
    assert cells[0] == 'ToolCall(\'echo\', {"x":"first"})'
    assert cells[1].startswith("Parallel(2 steps: ")
    branches = [line[line.index("  branch") :] for line in lines[4:6]]
    assert branches == [
        '  branch 1 of 2 (step 2): ToolCall(\'echo\', {"x":"a"})',
        '  branch 2 of 2 (step 2): ToolCall(\'echo\', {"x":"b"})',
    ]
    assert cells[4] == 'ToolCall(\'echo\', {"x":"last"})'
    steps = cli.json("show", "fan", "--trace")["steps"]
    assert [s["branch_of"] for s in steps] == [
        None,
        None,
        {"step": 2, "branch": 1, "of": 2},
        {"step": 2, "branch": 2, "of": 2},
        None,
    ]


def test_links_survive_compaction_and_a_fork_names_no_child_of_its_own(
    cli: Cli, rt: Runtime
) -> None:
    assert rt.run(one_child, run_id="oc").status == "COMPLETED"
    folded = rt.compact()
    assert {c.run_id for c in folded.runs} == {"oc", "oc-1"} and not folded.errors
    # the parent's snapshot keeps the ChildRun's description, the child's keeps its parent
    shown = text(cli, "show", "oc")
    assert shown[1] == "child run oc-1 (step 1): COMPLETED"
    assert shown[2].startswith("seqs 1..")
    assert text(cli, "show", "oc-1")[1] == "parent: run oc, step 1"

    assert rt.run(one_child, run_id="src").status == "COMPLETED"
    step_one_ends = next(e.seq for e in rt.store.load_log("src") if e.kind == "STEP_COMPLETED")
    rt.fork("src", step_one_ends, new_run_id="forked")
    # the fork's copied ChildRun step was the other run's: its child is src-1, not forked-1
    assert cli.json("show", "forked")["links"]["children"] == []
    assert cli.json("show", "src")["links"]["children"] == [
        {"run_id": "src-1", "step": 1, "status": "COMPLETED"}
    ]


@workflow(name="links.chatting")
def chatting(ctx: Any, turn: int) -> Any:
    said = yield WaitSignal("msg")
    if said == "bye":
        return turn
    yield ContinueAsNew({"turn": turn + 1})


def test_a_signal_to_a_run_that_continued_goes_to_where_its_chain_has_got(
    cli: Cli, rt: Runtime
) -> None:
    first = rt.start(chatting, {"turn": 0}, run_id="chat")
    assert text(cli, "signal", "chat", "msg", '"hi"') == ["signal 'msg' #1 sent to run chat"]
    rt.tick(T0_S)
    [first, second] = chain(rt, first)
    assert text(cli, "signal", "chat", "msg", '"bye"') == [
        f"signal 'msg' #1 sent to run {second} (chat continued as it)"
    ]
    sent = json.loads("\n".join(text(cli, "--json", "signal", "chat", "msg", '"late"')))
    assert sent == {"run_id": second, "name": "msg", "signal": 2, "sent_to": "chat"}
    [done] = rt.tick(T0_S)
    assert (done.run_id, done.status, done.result) == (second, "COMPLETED", 1)
    assert [s.payload_text for s in rt.store.signals(second)] == ['"bye"', '"late"']
