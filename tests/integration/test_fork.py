"""Forking a run from a step (SPEC §18): ``Runtime.fork`` and ``durabl fork``, on both backends.

A fork is a new run whose log is the old one's up to a seq that ends a step. Run on, it takes
those steps from the copied log without calling anything, and goes on with the code deployed
now: the way to re-run an agent from step N with a new prompt or model without paying for the
steps before. It records where it came from; the original is left as it was. A seq the log
does not hold, one inside a step, the run's end, a compacted run and a taken id are refused
with one error naming the run, the seq and the step, and nothing is written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durabl import ModelCall, Runtime, ToolCall, events, workflow
from durabl.errors import ForkRefusedError, RunNotFoundError

calls: list[str] = []
STYLE = {"prompt": "summarise {}"}


@workflow(name="fork_agent")
def agent(ctx: Any, topic: str) -> Any:
    found = yield ToolCall("search", {"q": topic})
    summary = yield ModelCall(STYLE["prompt"].format(topic))
    sent = yield ToolCall("send", {"text": summary["text"], "hits": found["hits"]})
    return sent


def search(q: str) -> dict[str, Any]:
    calls.append(f"search {q}")
    return {"hits": 3}


def send(text: str, hits: int) -> dict[str, Any]:
    calls.append(f"send {text}")
    return {"sent": text}


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    calls.append(f"model {prompt}")
    return {"text": f"<{prompt}>"}


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "fork.db")
    postgres_db: Callable[[], str] = request.getfixturevalue("postgres_db")
    return postgres_db()


@pytest.fixture
def rt(db: str) -> Iterator[Runtime]:
    calls.clear()
    STYLE["prompt"] = "summarise {}"
    with Runtime(db, llm=llm, tools={"search": search, "send": send}, workflows=[agent]) as opened:
        yield opened


def ends_of_steps(rt: Runtime, run_id: str) -> dict[int, int]:
    """Each step's position and the seq that ended it."""
    return {
        e.step: e.seq
        for e in rt.store.load_log(run_id)
        if e.kind in (events.STEP_COMPLETED, events.STEP_FAILED)
    }


def test_a_fork_reruns_from_the_step_after_its_seq_with_todays_code(rt: Runtime) -> None:
    original = rt.run(agent, {"topic": "otters"})
    assert original.status == "COMPLETED"
    search_done = ends_of_steps(rt, original.run_id)[1]
    calls.clear()

    STYLE["prompt"] = "summarise {} in three bullets"  # the change the fork is made for
    fork_id = rt.fork(original.run_id, search_done, new_run_id="otters-v2")
    assert fork_id == "otters-v2"
    waiting = rt.state(fork_id)
    assert (waiting.status, calls) == ("RUNNING", [])

    finished = rt.resume(fork_id)
    assert finished.status == "COMPLETED"
    assert calls == [
        "model summarise otters in three bullets",
        "send <summarise otters in three bullets>",
    ]  # the search was served from the copied log
    assert (finished.steps_replayed, finished.steps_executed) == (1, 2)
    log = rt.store.load_log(fork_id)
    started = json.loads(log[0].data or "{}")
    assert started["forked_from"] == {"run_id": original.run_id, "seq": search_done}
    assert (started["workflow"], started["input"]) == ("fork_agent", {"topic": "otters"})
    copied = rt.store.load_log(original.run_id)[1:search_done]
    assert [(e.seq, e.kind, e.data) for e in log[1:search_done]] == [
        (e.seq, e.kind, e.data) for e in copied
    ]
    assert rt.state(original.run_id).status == "COMPLETED"  # the original is untouched
    assert rt.result(original.run_id) == {"sent": "<summarise otters>"}


def test_a_fork_at_the_first_seq_runs_everything_again(rt: Runtime) -> None:
    original = rt.run(agent, {"topic": "seals"})
    calls.clear()
    fork_id = rt.fork(original.run_id, 1)
    assert rt.resume(fork_id).status == "COMPLETED"
    assert calls == ["search seals", "model summarise seals", "send <summarise seals>"]


def test_forks_that_cannot_be_are_refused_naming_the_run_the_seq_and_the_step(
    rt: Runtime,
) -> None:
    original = rt.run(agent, {"topic": "otters"})
    log = rt.store.load_log(original.run_id)
    last = log[-1].seq
    model_started = next(
        e.seq
        for e in log
        if e.kind == events.STEP_STARTED and (e.data or "").startswith('["model"')
    )
    before = [r.run_id for r in rt.store.list_runs()]

    cases = [
        (last + 1, f"its log holds seqs 1..{last}"),
        (0, f"its log holds seqs 1..{last}"),
        (last, "is the run's end (RUN_COMPLETED)"),
        (model_started, "it is inside step 2 (ModelCall('summarise otters'))"),
    ]
    for seq, words in cases:
        with pytest.raises(ForkRefusedError) as refused:
            rt.fork(original.run_id, seq)
        assert str(refused.value).startswith(f"cannot fork run {original.run_id} at seq {seq}: ")
        assert words in str(refused.value)
    assert [r.run_id for r in rt.store.list_runs()] == before  # none of them wrote
    rt.fork(original.run_id, 1, new_run_id="taken")
    with pytest.raises(ForkRefusedError, match="a run with id taken exists already"):
        rt.fork(original.run_id, 1, new_run_id="taken")
    assert [r.run_id for r in rt.store.list_runs()] == ["taken", *before]
    with pytest.raises(RunNotFoundError, match="no run 'nope'"):
        rt.fork("nope", 1)
    with pytest.raises(TypeError, match="at_seq"):
        rt.fork(original.run_id, "3")  # type: ignore[arg-type]


def test_a_compacted_run_is_refused(rt: Runtime) -> None:
    original = rt.run(agent, {"topic": "otters"})
    rt.compact(original.run_id, keep_last=0)
    with pytest.raises(ForkRefusedError, match="compacted up to seq"):
        rt.fork(original.run_id, 2)


def test_the_fork_command(rt: Runtime, db: str) -> None:
    original = rt.run(agent, {"topic": "terns"})
    seq = ends_of_steps(rt, original.run_id)[1]

    def durabl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "durabl", "--db", db, *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    made = durabl("fork", original.run_id, "--at", str(seq), "--run-id", "terns-2")
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == f"run terns-2 forked from run {original.run_id} at seq {seq}"
    inside = durabl("--json", "fork", original.run_id, "--at", str(seq + 1))
    assert inside.returncode == 2
    assert inside.stderr.startswith(f"durabl: cannot fork run {original.run_id} at seq {seq + 1}")
    assert rt.state("terns-2").status == "RUNNING"


def test_a_forks_metrics_count_only_its_own_work(rt: Runtime) -> None:
    """The copied steps were the original's work: the fork is charged for the model call and
    the send it made, and counts the copied search as a step it replayed."""
    original = rt.run(agent, {"topic": "otters"})
    fork_id = rt.fork(original.run_id, ends_of_steps(rt, original.run_id)[1])
    rt.resume(fork_id)
    mine, theirs = rt.metrics(fork_id), rt.metrics(original.run_id)
    assert (theirs.steps, theirs.tool_calls, theirs.model_calls) == (3, 2, 1)
    assert (mine.steps, mine.tool_calls, mine.model_calls, mine.attempts) == (2, 1, 1, 2)
    assert (mine.resumes, mine.replayed_steps) == (1, 1)


def test_show_trace_says_which_steps_a_fork_copied(rt: Runtime, db: str) -> None:
    original = rt.run(agent, {"topic": "otters"})
    seq = ends_of_steps(rt, original.run_id)[1]
    fork_id = rt.fork(original.run_id, seq, new_run_id="otters-fork")
    rt.resume(fork_id)
    shown = subprocess.run(
        [sys.executable, "-m", "durabl", "--db", db, "--json", "show", fork_id, "--trace"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    trace = json.loads(shown.stdout)
    assert [(s["position"], s["process"]) for s in trace["steps"]] == [
        (1, "copied"),
        (2, 2),
        (3, 2),
    ]
    assert trace["processes"] == 2  # the one that made the fork, and the one that resumed it
