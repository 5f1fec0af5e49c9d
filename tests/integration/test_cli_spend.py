"""``durabl show`` and ``show --trace`` say what a run's model answers spent: each answer's
tokens and cost (a model with no price as unknown, never $0), a line that sums the run's spend
with what a crash made it spend again, and the text a stream had got, marked as cut off when its
attempt ended without an answer (a crash, a failed attempt, a process that is gone).

The runs are made in this process by a real ``Runtime`` on the test's SQLite file (the model is
the only double); every command is a real ``python -m durabl`` process (``Cli``), read-only.
"""

from __future__ import annotations

import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from test_cli import Cli

from durabl import ChildRun, ModelCall, RetryPolicy, Runtime, ToolCall, llm, tool, workflow
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.store import open_store

USAGE = {"input_tokens": 1000, "output_tokens": 500, "cached_tokens": 200, "total_tokens": 1500}
ANSWER_USD = (800 * 0.15 + 200 * 0.075 + 500 * 0.60) / 1e6  # gpt-4o-mini's list price
CUT = "The plan is "


def answer(prompt: Any, **params: Any) -> dict[str, Any]:
    """The model: answers with its name and its usage."""
    model = params.get("model", "gpt-4o-mini")
    return {"text": f"answer to {prompt}", "model": model, "usage": dict(USAGE)}


def dies_mid_stream(prompt: Any, **params: Any) -> dict[str, Any]:
    """The model, whose process dies while it streams an answer, after 12 characters."""
    if not params.get("stream"):
        return answer(prompt, **params)
    answering = llm.current()
    assert answering is not None
    for piece in ("The ", "plan ", "is "):
        answering.chunk(piece)
    answering.flush()
    raise ProcessDeath("mid-stream")


@workflow(name="spend.checker")
def checker(ctx: Any) -> Any:
    return (yield ModelCall("check the plan"))["text"]


@workflow(name="spend.spender")
def spender(ctx: Any) -> Any:
    plan = yield ModelCall("plan")
    draft = yield ModelCall("draft", stream=True)
    house = yield ModelCall("house", model="house-model-7")  # a model with no price
    checked = yield ChildRun(checker)
    return [plan["text"], draft["text"], house["text"], checked]


@workflow(name="spend.unpriced")
def unpriced(ctx: Any) -> Any:
    first = yield ModelCall("one", model="house-model-7")
    second = yield ModelCall("two", model="house-model-7")
    return [first["text"], second["text"]]


@workflow(name="spend.streamer")
def streamer(ctx: Any) -> Any:
    return (yield ModelCall("stream it", stream=True))["text"]


def echo(x: Any) -> Any:
    return x


@workflow(name="spend.no_model")
def no_model(ctx: Any) -> Any:
    return (yield ToolCall("echo", {"x": 1}))


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


def text(cli: Cli, *args: str) -> list[str]:
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def rows(lines: list[str]) -> list[list[str]]:
    """The timeline's rows after its header: SEQ, DATE, TIME, KIND, then STEP and DATA."""
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["SEQ", "TIME"])
    return [line.split(None, 4) for line in lines[start + 1 :]]


def trace_rows(lines: list[str]) -> list[str]:
    """The trace's rows after its header."""
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["STEP", "HOW"])
    return lines[start + 1 :]


def data_of(lines: list[str], kind: str, step: int) -> list[str]:
    """The DATA cells of the timeline's ``kind`` events at ``step``."""
    return [
        r[4].split(None, 1)[1] for r in rows(lines) if r[3] == kind and r[4].split()[0] == str(step)
    ]


def assert_cut_off(partials: list[str]) -> None:
    """The STEP_PARTIALs of the attempt that died: the last is where it was cut off. (The first
    chunk is recorded at once, the rest at the flush, or sooner on a slow machine.)"""
    assert partials[0] == 'attempt 1 so far (cut off later): "The"'
    assert all(p.startswith("attempt 1 so far (cut off later): ") for p in partials[:-1])
    assert partials[-1] == 'cut off, attempt 1 (12 characters): "The plan is"'
    assert len(partials) >= 2


def crash_mid_stream(db: Path) -> None:
    """Run ``spender`` until its process dies streaming step 2; wait out its lease, so that no
    live process holds the run, as after a real crash."""
    with Runtime(db, llm=dies_mid_stream, lease_s=1.0) as rt, pytest.raises(ProcessDeath):
        rt.run(spender, run_id="s")
    with closing(open_store(str(db), read_only=True)) as store:
        row = store.get_run("s")
        assert row is not None and row.lease is not None
        time.sleep(max(0.0, row.lease.expires_s - time.time()) + 0.1)


def test_show_says_what_each_answer_cost_and_what_was_spent_again(cli: Cli) -> None:
    crash_mid_stream(cli.db)
    before = text(cli, "show", "s")
    assert before[0] == "run s (spend.spender): RUNNING"
    assert before[1] == (
        f"spend: ${ANSWER_USD:.6f}, 1500 tokens (1000 in, 500 out) over 1 model call; "
        "re-executed (estimated): none"
    )
    # no process drives the run: the stream it had begun is cut off where it stopped
    assert_cut_off(data_of(before, "STEP_PARTIAL", 2))
    assert trace_rows(text(cli, "show", "s", "--trace")) == [
        f"1     executed  1        ModelCall('plan'); 1500 tokens, ${ANSWER_USD:.6f}",
        "2     pending   -        ModelCall('draft')",
        '                           cut off, attempt 1 (12 characters): "The plan is"',
    ]

    with Runtime(cli.db, llm=answer, workflows=[spender, checker]) as rt:
        assert rt.resume("s").status == "COMPLETED"
    shown = text(cli, "show", "s")
    assert shown[:4] == [
        "run s (spend.spender): COMPLETED",
        "child run s-4 (step 4): COMPLETED",
        f"spend: ${2 * ANSWER_USD:.6f} + 1 answer of a model with no price, 4500 tokens "
        "(3000 in, 1500 out) over 3 model calls; re-executed (estimated): "
        f"${ANSWER_USD:.6f}, 1500 tokens for 1 model call made again; cut-off streamed text: "
        "12 characters",
        "no price, cost unknown: step 3 (house-model-7)",
    ]
    assert data_of(shown, "STEP_COMPLETED", 1) == [
        f'gpt-4o-mini, 1500 tokens, ${ANSWER_USD:.6f}: "answer to plan"'
    ]
    assert data_of(shown, "STEP_COMPLETED", 3) == [
        'house-model-7, 1500 tokens, cost unknown (no price for house-model-7): "answer to house"'
    ]
    assert_cut_off(data_of(shown, "STEP_PARTIAL", 2))

    payload = cli.json("show", "s")
    spend = payload["spend"]
    assert spend["cost_usd"] == pytest.approx(2 * ANSWER_USD)
    assert (spend["unpriced_model_calls"], spend["total_tokens"], spend["partial_chars"]) == (
        1,
        4500,
        len(CUT),
    )
    assert spend["unpriced_steps"] == [{"step": 3, "model": "house-model-7"}]
    assert spend["reexecuted_cost_usd"] == pytest.approx(ANSWER_USD)
    partials = [e for e in payload["events"] if e["kind"] == "STEP_PARTIAL"]
    assert partials[0]["data"] == {"attempt": 1, "text": "The "}
    assert partials[-1]["data"] == {"attempt": 1, "text": CUT}
    assert {e["outcome"] for e in partials} == {"cut off"}

    assert trace_rows(text(cli, "show", "s", "--trace"))[:4] == [
        f"1     replayed  1        ModelCall('plan'); 1500 tokens, ${ANSWER_USD:.6f}",
        f"2     executed  2        ModelCall('draft'); 1500 tokens, ${ANSWER_USD:.6f}",
        '                           cut off, attempt 1 (12 characters): "The plan is"',
        "3     executed  2        ModelCall('house'); 1500 tokens, cost unknown (no price for "
        "house-model-7)",
    ]
    steps = cli.json("show", "s", "--trace")["steps"]
    assert steps[1]["spend"] == {
        "tokens": 1500,
        "cost_usd": pytest.approx(ANSWER_USD),
        "model": "gpt-4o-mini",
    }
    assert steps[1]["partials"] == [{"attempt": 1, "text": CUT, "outcome": "cut off"}]
    assert steps[2]["spend"]["cost_usd"] is None and steps[3]["spend"] is None
    # the child's answer is its own
    assert text(cli, "show", "s-4")[2] == (
        f"spend: ${ANSWER_USD:.6f}, 1500 tokens (1000 in, 500 out) over 1 model call; "
        "re-executed (estimated): none"
    )


def test_answers_of_a_model_with_no_price_cost_unknown_never_nothing(cli: Cli) -> None:
    with Runtime(cli.db, llm=answer, tools={"echo": tool(echo, mode="IDEMPOTENT")}) as rt:
        assert rt.run(unpriced, run_id="u").status == "COMPLETED"
        assert rt.run(no_model, run_id="t").status == "COMPLETED"
    shown = text(cli, "show", "u")
    assert shown[1:3] == [
        "spend: unknown (2 answers of a model with no price), 3000 tokens (2000 in, 1000 out) "
        "over 2 model calls; re-executed (estimated): none",
        "no price, cost unknown: step 1 (house-model-7), step 2 (house-model-7)",
    ]
    assert "$0.000000" not in "\n".join(shown)
    # an answer of that model lost to a crash and asked again: its spend again is unknown too
    with (
        Runtime(cli.db, llm=answer) as rt,
        CrashAt("after_model_returned", 2),  # the second answer, returned and never recorded
        pytest.raises(ProcessDeath),
    ):
        rt.run(unpriced, run_id="again")
    with Runtime(cli.db, llm=answer, workflows=[unpriced]) as rt:
        assert rt.resume("again").status == "COMPLETED"
    assert text(cli, "show", "again")[1].endswith(
        "; re-executed (estimated): unknown, 1500 tokens for 1 model call made again"
    )
    # no answer reports usage: no spend to sum
    plain = text(cli, "show", "t")
    assert not any(line.startswith(("spend:", "no price")) for line in plain)
    assert cli.json("show", "t")["spend"] is None


def test_a_stream_that_a_live_process_drives_is_not_cut_off(cli: Cli) -> None:
    streamed, release = threading.Event(), threading.Event()

    def slow_stream(prompt: Any, **params: Any) -> dict[str, Any]:
        answering = llm.current()
        assert answering is not None
        answering.chunk("Half an ")
        answering.flush()
        streamed.set()
        assert release.wait(60)
        answering.chunk("answer.")
        return {"text": answering.streamed, "model": "gpt-4o-mini", "usage": dict(USAGE)}

    def drive() -> None:
        with Runtime(cli.db, llm=slow_stream) as rt:
            rt.run(streamer, run_id="live")

    driver = threading.Thread(target=drive)
    driver.start()
    try:
        assert streamed.wait(30)
        assert data_of(text(cli, "show", "live"), "STEP_PARTIAL", 1) == [
            'attempt 1 so far (streaming): "Half an"'
        ]
        assert trace_rows(text(cli, "show", "live", "--trace")) == [
            "1     pending  -        ModelCall('stream it')",
            '                          attempt 1 so far (streaming): "Half an"',
        ]
    finally:
        release.set()
        driver.join(60)
    shown = text(cli, "show", "live")
    # (the rest of the answer may have been recorded too, as the stream went on)
    partials = data_of(shown, "STEP_PARTIAL", 1)
    assert partials[0] == 'attempt 1 so far (finished): "Half an"'
    assert all(cell.startswith("attempt 1 so far (finished): ") for cell in partials)
    assert data_of(shown, "STEP_COMPLETED", 1) == [
        f'gpt-4o-mini, 1500 tokens, ${ANSWER_USD:.6f}: "Half an answer."'
    ]
    assert "cut-off streamed text" not in shown[1]
    assert trace_rows(text(cli, "show", "live", "--trace")) == [
        f"1     executed  1        ModelCall('stream it'); 1500 tokens, ${ANSWER_USD:.6f}"
    ]  # the finished attempt's text is its answer


def test_a_stream_cut_off_by_a_failed_attempt_is_marked(cli: Cli) -> None:
    attempts = []

    def flaky_stream(prompt: Any, **params: Any) -> dict[str, Any]:
        answering = llm.current()
        assert answering is not None
        attempts.append(answering.attempt)
        answering.chunk("Almost there" if len(attempts) == 1 else "Done.")
        answering.flush()
        if len(attempts) == 1:
            raise ConnectionError("the stream broke")
        return {"text": answering.streamed, "model": "gpt-4o-mini", "usage": dict(USAGE)}

    with Runtime(cli.db, llm=flaky_stream, retry=RetryPolicy(max_attempts=2, base_delay=0)) as rt:
        state = rt.run(streamer, run_id="flaky")
        while state.status != "COMPLETED":
            assert state.status == "SLEEPING", state
            [state] = rt.tick()
    assert attempts == [1, 2]
    shown = text(cli, "show", "flaky")
    assert data_of(shown, "STEP_PARTIAL", 1) == [
        'cut off, attempt 1 (12 characters): "Almost there"',
        'attempt 2 so far (finished): "Done."',
    ]
    assert shown[1].endswith("; cut-off streamed text: 12 characters")
    assert trace_rows(text(cli, "show", "flaky", "--trace"))[1] == (
        '                           cut off, attempt 1 (12 characters): "Almost there"'
    )
