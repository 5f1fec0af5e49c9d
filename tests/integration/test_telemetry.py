"""OpenTelemetry spans from the log (docs/DECISIONS.md, "Telemetry"): real runs on a SQLite
file, the real OpenTelemetry SDK (an in-memory exporter behind a simple span processor); the
model and the tools are the only doubles.

- The spans emitted live are the spans ``durabl export-traces`` builds offline from the
  database: ids, names, parents, times, attributes and statuses.
- A run killed after its second step commit and resumed by a new runtime has each span once,
  over both runtimes; a dry replay emits none, of a finished run or of an interrupted one.
- A Parallel's branches are children of the Parallel's span; a child run's span is a child of
  the parent's ChildRun step, in the root run's trace.
- A tool that fails for good gives an ERROR span, and its run an ERROR run span.
- ``export-traces`` of an unknown run is one line and exit 2; ``import durabl`` imports no
  OpenTelemetry, and without it ``instrument`` says in one line what to install.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from durabl import (
    ChildRun,
    ModelCall,
    Parallel,
    RetryPolicy,
    Runtime,
    Sleep,
    ToolCall,
    ToolMode,
    events,
    tool,
    workflow,
)
from durabl.cli import main
from durabl.crashpoints import AFTER_STEP_COMMITTED, CrashAt, ProcessDeath, install
from durabl.prices import Price
from durabl.telemetry import instrument, span_id_of

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
T0_S = 1_800_000_000.0

Span = tuple[str, str, str | None, str, int, int, tuple[tuple[str, Any], ...], str, str | None]
"""A span compared: trace id, span id, parent span id, name, start and end (unix ns),
attributes, status code and description."""


class Clock:
    """Moves on a millisecond at every reading, so that every event has a time of its own."""

    def __init__(self) -> None:
        self.now_s = T0_S

    def __call__(self) -> float:
        self.now_s += 0.001
        return self.now_s


class Tools:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def search(self, q: str) -> str:
        self.calls.append(q)
        if q == "down":
            raise ConnectionError("search is down")
        return f"found {q}"

    def registry(self) -> dict[str, Any]:
        return {"search": tool(self.search, mode=ToolMode.IDEMPOTENT)}  # retried on failure


def llm(prompt: str, **params: Any) -> dict[str, Any]:
    usage = {"input_tokens": 12, "output_tokens": 5}
    return {"text": f"answer to {prompt}", "model": params.get("model"), "usage": usage}


@workflow(name="otel_kid")
def kid(ctx: Any, topic: str) -> Any:
    return (yield ToolCall("search", {"q": topic}))


@workflow(name="otel_agent")
def agent(ctx: Any, topic: str) -> Any:
    plan = yield ModelCall(f"plan {topic}", model="gpt-test")  # 1
    ctx.now()  # 2
    pages = yield Parallel([ToolCall("search", {"q": "a"}), ToolCall("search", {"q": "b"})])  # 3-5
    yield Sleep(0)  # 6
    found = yield ChildRun(kid, {"topic": topic})  # 7
    return {"plan": plan["text"], "pages": pages, "found": found}


@workflow(name="otel_serial")
def serial(ctx: Any, qs: list[str]) -> Any:
    found = []
    for q in qs:
        found.append((yield ToolCall("search", {"q": q})))
    return found


class Otel:
    """A tracer provider of the SDK with an in-memory exporter."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    def spans(self) -> list[Span]:
        return [_live(span) for span in self.exporter.get_finished_spans()]


@pytest.fixture
def otel() -> Otel:
    return Otel()


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "telemetry.db")


def runtime(db: str, tools: Tools, otel: Otel) -> Runtime:
    rt = Runtime(
        db,
        llm=llm,
        tools=tools.registry(),
        clock=Clock(),
        retry=RetryPolicy(max_attempts=2, base_delay=0.0),
        prices={"gpt-test": Price(input=1.0, output=4.0)},
    )
    instrument(rt, otel.provider)
    return rt


def _live(span: ReadableSpan) -> Span:
    assert span.context is not None and span.start_time is not None
    assert span.end_time is not None
    status = span.status
    return (
        format(span.context.trace_id, "032x"),
        format(span.context.span_id, "016x"),
        None if span.parent is None else format(span.parent.span_id, "016x"),
        span.name,
        span.start_time,
        span.end_time,
        tuple(sorted(dict(span.attributes or {}).items())),
        status.status_code.name,
        status.description if status.status_code == StatusCode.ERROR else None,
    )


def _value(value: dict[str, Any]) -> Any:
    ((kind, found),) = value.items()
    return int(found) if kind == "intValue" else found


def _offline(span: dict[str, Any]) -> Span:
    status = span.get("status", {})
    return (
        span["traceId"],
        span["spanId"],
        span.get("parentSpanId"),
        span["name"],
        int(span["startTimeUnixNano"]),
        int(span["endTimeUnixNano"]),
        tuple(sorted((a["key"], _value(a["value"])) for a in span["attributes"])),
        "ERROR" if status.get("code") == 2 else "UNSET",
        status.get("message"),
    )


def exported(db: str, run_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """``durabl export-traces RUN --out FILE``: the OTLP/JSON document."""
    out = tmp_path / f"{run_id}.json"
    assert main(["--db", db, "export-traces", run_id, "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"written to {out}")
    return json.loads(out.read_text())


def offline(db: str, run_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[Span]:
    document = exported(db, run_id, tmp_path, capsys)
    ((resource,),) = [document["resourceSpans"]]
    ((scope,),) = [resource["scopeSpans"]]
    assert scope["scope"]["name"] == "durabl"
    return [_offline(span) for span in scope["spans"]]


def by_name(spans: list[Span]) -> dict[str, list[Span]]:
    found: dict[str, list[Span]] = {}
    for span in spans:
        found.setdefault(span[3], []).append(span)
    return found


def test_spans_emitted_live_are_the_spans_export_traces_builds(
    db: str, otel: Otel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with runtime(db, Tools(), otel) as rt:
        state = rt.run(agent, {"topic": "otel"})
        assert state.status == events.COMPLETED, state.error
    live = otel.spans()
    assert sorted(live, key=repr) == sorted(offline(db, state.run_id, tmp_path, capsys), key=repr)
    assert Counter(span[3] for span in live) == {
        "model": 1,
        "ctx now": 1,
        "parallel": 1,
        "tool search": 3,  # the two branches, and the child's
        "sleep": 1,
        "child otel_kid": 1,
        "run otel_kid": 1,
        "run otel_agent": 1,
    }
    assert len({span[1] for span in live}) == len(live)
    (model,) = by_name(live)["model"]
    attributes = dict(model[6])
    assert attributes["durabl.run_id"] == state.run_id
    assert (attributes["durabl.step"], attributes["durabl.attempts"]) == (1, 1)
    assert attributes["gen_ai.request.model"] == attributes["gen_ai.response.model"] == "gpt-test"
    assert attributes["gen_ai.usage.input_tokens"] == 12
    assert attributes["gen_ai.usage.output_tokens"] == 5
    assert attributes["durabl.cost_usd"] == pytest.approx((12 * 1.0 + 5 * 4.0) / 1_000_000)
    (ctx_now,) = by_name(live)["ctx now"]
    assert ctx_now[4] == ctx_now[5]  # a ctx value has no start of its own
    # Every step starts at its first STEP_STARTED and ends at the event that ends it.
    assert all(span[4] <= span[5] for span in live)
    assert all(span[7] == "UNSET" for span in live)


def test_parallel_branches_and_a_child_run_nest_under_their_steps_in_one_trace(
    db: str, otel: Otel
) -> None:
    with runtime(db, Tools(), otel) as rt:
        state = rt.run(agent, {"topic": "nest"}, run_id="a" * 32)
        assert state.status == events.COMPLETED, state.error
    live = otel.spans()
    run_id, child_id = state.run_id, f"{state.run_id}-7"
    assert {span[0] for span in live} == {run_id}  # the root's id is the trace id, children's too
    spans = {span[1]: span for span in live}
    parent_of = {span[1]: span[2] for span in live}
    root = span_id_of(run_id, 0)
    assert spans[root][3] == "run otel_agent" and parent_of[root] is None
    for position in (1, 2, 3, 6, 7):
        assert parent_of[span_id_of(run_id, position)] == root
    for branch in (4, 5):
        assert parent_of[span_id_of(run_id, branch)] == span_id_of(run_id, 3)
    assert spans[span_id_of(run_id, 7)][3] == "child otel_kid"
    assert parent_of[span_id_of(child_id, 0)] == span_id_of(run_id, 7)
    assert parent_of[span_id_of(child_id, 1)] == span_id_of(child_id, 0)
    # The Parallel's span holds its branches'; the ChildRun step's ends as its child's does (the
    # same commit), and starts with it (the child is stamped as it is made, a tick before the
    # commit that records the step and the child).
    parallel, branch = spans[span_id_of(run_id, 3)], spans[span_id_of(run_id, 4)]
    assert parallel[4] <= branch[4] and branch[5] <= parallel[5]
    step, child = spans[span_id_of(run_id, 7)], spans[span_id_of(child_id, 0)]
    assert step[5] == child[5]
    assert abs(step[4] - child[4]) <= 1_000_000


def test_a_run_killed_and_resumed_emits_each_span_once_and_a_dry_replay_none(
    db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tools, first, second = Tools(), Otel(), Otel()
    qs = ["one", "two", "three", "four"]
    remove = install(CrashAt(AFTER_STEP_COMMITTED, occurrence=2))
    try:
        with runtime(db, tools, first) as rt, pytest.raises(ProcessDeath):
            rt.run(serial, {"qs": qs}, run_id="killed")
    finally:
        remove()
    assert [span[3] for span in first.spans()] == ["tool search"] * 2  # the steps it ended
    with runtime(db, tools, second) as rt:
        interrupted = rt.replay("killed")  # dry, mid-run: serves two steps, writes nothing
        assert interrupted.status == events.RUNNING
        assert second.spans() == []
        state = rt.resume("killed")
        assert state.status == events.COMPLETED, state.error
        emitted = len(second.spans())
        assert rt.replay("killed").status == events.COMPLETED  # dry, finished
    assert len(second.spans()) == emitted == 3  # steps three and four, and the run
    assert tools.calls == qs
    both = first.spans() + second.spans()
    assert Counter(span[1] for span in both) == {
        span_id_of("killed", position): 1 for position in range(5)
    }
    assert sorted(both, key=repr) == sorted(offline(db, "killed", tmp_path, capsys), key=repr)
    (run,) = by_name(both)["run otel_serial"]
    assert dict(run[6])["durabl.resumes"] == 1
    # The run span starts with the run, in the first process, though the second one ended it.
    assert run[4] == min(span[4] for span in both)


def test_a_tool_that_fails_for_good_gives_an_error_span(
    db: str, otel: Otel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with runtime(db, Tools(), otel) as rt:
        state = rt.run(serial, {"qs": ["up", "down"]}, run_id="failing")
        if state.status != events.FAILED:  # the retry's backoff parked it; it is due now
            (state,) = rt.tick()
        assert state.status == events.FAILED
    live = otel.spans()
    assert sorted(live, key=repr) == sorted(offline(db, "failing", tmp_path, capsys), key=repr)
    ok, failed = by_name(live)["tool search"]
    assert ok[7] == "UNSET"
    assert failed[7] == "ERROR" and failed[8] is not None and "search is down" in failed[8]
    attributes = dict(failed[6])
    assert (attributes["durabl.attempts"], attributes["durabl.retries"]) == (2, 1)
    assert attributes["error.type"] == "ConnectionError"
    (run,) = by_name(live)["run otel_serial"]
    assert run[7] == "ERROR" and dict(run[6])["durabl.outcome"] == "failed"


def _durabl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durabl", *args], capture_output=True, text=True, timeout=60
    )


def test_export_traces_prints_otlp_json_and_refuses_an_unknown_run(db: str, otel: Otel) -> None:
    with runtime(db, Tools(), otel) as rt:
        rt.run(serial, {"qs": ["one"]}, run_id="printed")
    printed = _durabl("--db", db, "export-traces", "printed")
    assert printed.returncode == 0, printed.stderr
    (resource,) = json.loads(printed.stdout)["resourceSpans"]
    (scope,) = resource["scopeSpans"]
    assert [span["name"] for span in scope["spans"]] == ["tool search", "run otel_serial"]
    unknown = _durabl("--db", db, "export-traces", "nope")
    assert unknown.returncode == 2
    assert unknown.stdout == ""
    assert len(unknown.stderr.splitlines()) == 1
    assert unknown.stderr.startswith("durabl: ") and "nope" in unknown.stderr


def test_import_durabl_imports_no_opentelemetry() -> None:
    probe = (
        "import sys, durabl, durabl.telemetry, durabl.cli; "
        "print(' '.join(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.split() == []


def test_without_the_extra_instrument_names_what_to_install(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if it were not installed
    with Runtime(db) as rt, pytest.raises(ImportError) as raised:
        instrument(rt)
    message = str(raised.value)
    assert "pip install 'durabl[otel]'" in message and "\n" not in message
