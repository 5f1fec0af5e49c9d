"""A function-calling agent on ``durabl.llm.openai``: killed in the middle of its tool calls, it
resumes in a fresh process, and the model is not asked again for the answers already recorded.

The agent (``plan_day`` below: a loop of a few lines) asks the model whether to pack an umbrella
for Lisbon and Oslo. The model asks for the forecast of each city in turn, one tool call per
answer, and then answers. Each model answer and each forecast is a step of the run's log. The
model is the real OpenAI SDK talking to a small scripted OpenAI-compatible server on 127.0.0.1
(``examples/_loopback.py``, started by this script), so the example runs offline; with
``openai.OpenAI()`` for the client, the same workflow asks the real gpt-4o-mini.

    python examples/function_calling.py              # files in a fresh temporary folder
    python examples/function_calling.py --dir DIR    # the database and the files, in DIR

What happens, stage by stage, each stage in a process of its own:

1. The agent (this script again, with ``--agent``) starts the run. In that process the forecast
   service hangs on Oslo; once the model's two answers and Lisbon's forecast are recorded and
   Oslo's is under way, the script kills the agent with SIGKILL.
2. A fresh process (``--resume``) calls ``Runtime(...).resume_all()``: the two answers and
   Lisbon's forecast come back from the log; Oslo's forecast is fetched again (the tool is
   IDEMPOTENT), and the model is asked once more, for its final answer.
3. The outcome is read back from the database, from the file the forecast tool appends to, and
   from the file the model server appends each request it got to.

Exit status 0 when all of that held: the agent was killed with the model's first two answers
recorded and not the third; the model server got three requests, the first two from the killed
process and the last from the fresh one, which sent both forecasts; Lisbon's forecast was fetched
once, Oslo's once by each process; each answer was recorded once, priced; and the run completed
with the model's final answer. 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import durabl.llm
from _loopback import ScriptedModel
from durabl import ModelCall, Runtime, ToolCall, ToolMode, events, tool, workflow
from durabl.store import open_store

WORKFLOW = "plan_day"
RUN_ID = "umbrella-check"
QUESTION = "I fly to Lisbon, then on to Oslo. Do I pack an umbrella?"
FORECASTS = {
    "Lisbon": {"sky": "sunny", "rain_mm": 0, "high_c": 24},
    "Oslo": {"sky": "showers", "rain_mm": 6, "high_c": 11},
}
STALLED = "Oslo"
"""The city whose forecast never comes back to the agent's first process."""
MODEL_STEPS = (1, 3, 5)
"""The log positions of the model's answers: a forecast step follows each of the first two."""
DB_NAME = "agent.db"
CALL_FILES = ("forecasts", "model_requests")


# -- the agent -------------------------------------------------------------------------------------


@workflow(name=WORKFLOW)
def plan_day(ctx: Any, question: str) -> Any:
    """Ask; run the tools the model asks for and send it their results; until it answers."""
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        answer = yield ModelCall(messages, tools=["get_forecast"], system="Be brief.")
        if not answer["tool_calls"]:
            return {"answer": answer["text"]}
        messages.append(
            {
                "role": "assistant",
                "content": answer["text"],
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"]),
                        },
                    }
                    for call in answer["tool_calls"]
                ],
            }
        )
        for call in answer["tool_calls"]:
            forecast = yield ToolCall(call["name"], call["arguments"])
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(forecast)}
            )


# -- the outside world: a forecast service, and a scripted model ------------------------------------


def append_line(path: Path, record: dict[str, Any]) -> None:
    """One JSON line in one write, fsynced: it must survive the SIGKILL that follows."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def forecast_tool(folder: Path, *, stall: bool) -> dict[str, Any]:
    def get_forecast(city: str, *, idempotency_key: str) -> dict[str, Any]:
        """Tomorrow's weather forecast for a city.

        Args:
            city: The city, in English.
        """
        append_line(folder / "forecasts.jsonl", {"city": city, "pid": os.getpid()})
        if stall and city == STALLED:
            time.sleep(60)  # the forecast service hangs; the agent is killed in here
        return {"city": city, **FORECASTS[city]}

    return {"get_forecast": tool(get_forecast, mode=ToolMode.IDEMPOTENT)}


def model_reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted model: a function of the conversation so far, as a model is. It asks for
    each city's forecast that it has not been given yet, then answers from them."""
    given = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
    known = {forecast["city"]: forecast for forecast in given}
    for city in FORECASTS:
        if city not in known:
            call = {
                "id": f"call_{city.lower()}",
                "name": "get_forecast",
                "arguments": {"city": city},
            }
            return {"tool_calls": [call]}
    wet = [city for city, forecast in known.items() if forecast["rain_mm"] > 0]
    return {"text": f"Yes, pack one: expect showers in {', '.join(wet)}; Lisbon stays dry."}


# -- the two processes that drive the run ----------------------------------------------------------


def runtime(folder: Path, base_url: str, *, stall: bool) -> Runtime:
    """The agent's runtime: the real OpenAI SDK, pointed at the scripted model. The pid header
    only lets the model server tell the two processes apart."""
    import openai

    client = openai.OpenAI(
        base_url=base_url,
        api_key="sk-loopback",
        max_retries=0,
        default_headers={"x-agent-pid": str(os.getpid())},
    )
    llm = durabl.llm.openai(client, model="gpt-4o-mini")
    tools = forecast_tool(folder, stall=stall)
    return Runtime(folder / DB_NAME, llm=llm, tools=tools, workflows=[plan_day])


def agent(folder: Path, base_url: str) -> int:
    """Stage 1's victim: start the run; the stalled forecast keeps it busy until it is killed."""
    with runtime(folder, base_url, stall=True) as rt:
        rt.run(plan_day, {"question": QUESTION}, run_id=RUN_ID)
    return 0


def resume(folder: Path, base_url: str) -> int:
    """Stage 2: a process that knows nothing of the first one resumes every interrupted run."""
    with runtime(folder, base_url, stall=False) as rt:
        for state in rt.resume_all():
            print(
                f"    [pid {os.getpid()}] resumed {state.run_id}: {state.status}, "
                f"{state.steps_replayed} step(s) from the log, {state.steps_executed} executed",
                flush=True,
            )
    return 0


def this_script(folder: Path, base_url: str, flag: str) -> list[str]:
    script = str(Path(__file__).resolve())
    return [sys.executable, script, "--dir", str(folder), "--base-url", base_url, flag]


# -- reading the database, as another process does -------------------------------------------------


def read_log(folder: Path) -> list[events.Event]:
    store = open_store(str(folder / DB_NAME), read_only=True)
    try:
        return store.load_log(RUN_ID)
    finally:
        store.close()


def answers_recorded(log: list[events.Event]) -> dict[int, dict[str, Any]]:
    """The model's answers the log holds, by step."""
    return {
        e.step: json.loads(e.data or "{}")
        for e in log
        if e.kind == events.STEP_COMPLETED and e.step in MODEL_STEPS
    }


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline_s:
            print(f"    timed out waiting for {what}")
            return False
        time.sleep(0.02)
    return True


# -- the stages ------------------------------------------------------------------------------------


def kill_mid_tools(folder: Path, base_url: str) -> tuple[int, dict[int, Any]] | None:
    """Start the agent, SIGKILL it inside Oslo's forecast; its pid and the answers it left."""
    print(f"\n[1] the agent asks: {QUESTION!r}")
    sys.stdout.flush()
    proc = subprocess.Popen(this_script(folder, base_url, "--agent"))

    def stalled() -> bool:
        calls = read_lines(folder / "forecasts.jsonl")
        return any(c["city"] == STALLED for c in calls) or proc.poll() is not None

    reached = wait_for(f"the forecast for {STALLED}", stalled)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if not reached or proc.returncode != -signal.SIGKILL:
        print(f"    FAILED: the agent was not killed mid-run (exit {proc.returncode})")
        return None
    answers = answers_recorded(read_log(folder))
    print(f"    killed the agent (pid {proc.pid}) with SIGKILL inside the forecast for {STALLED}")
    for step, answer in sorted(answers.items()):
        asked = ", ".join(f"{c['name']}({c['arguments']})" for c in answer["tool_calls"])
        print(f"      step {step}: the model's answer, recorded: {asked or answer['text']}")
    return proc.pid, answers


def outcome(folder: Path, killed_pid: int, at_kill: dict[int, Any]) -> bool:
    """Read the run back from the database and the files; True when it did what it says."""
    print("\n[3] the outcome")
    log = read_log(folder)
    requests = read_lines(folder / "model_requests.jsonl")
    forecasts = read_lines(folder / "forecasts.jsonl")
    ended = [e for e in log if e.kind == events.RUN_COMPLETED]
    boundaries = [json.loads(e.data or "{}")["pid"] for e in log if e.kind == events.RUN_RESUMED]
    fresh_pid = boundaries[0] if boundaries else None
    result = json.loads(ended[0].data or "{}") if ended else {}
    print(f"    the final answer: {result.get('answer')!r}")
    who = {killed_pid: "killed", fresh_pid: "fresh"}
    for request in requests:
        given = [m for m in request["body"]["messages"] if m["role"] == "tool"]
        sender = who.get(int(request["pid"]), "?")
        print(f"    model request from the {sender} process, with {len(given)} forecast(s)")
    by_city = {
        city: [who.get(f["pid"], "?") for f in forecasts if f["city"] == city] for city in FORECASTS
    }
    for city, callers in by_city.items():
        print(f"    forecast for {city:7} fetched by: {', '.join(callers)}")
    answers = answers_recorded(log)
    completions = [e.step for e in log if e.kind in (events.STEP_COMPLETED, events.TOOL_COMPLETED)]
    checks = {
        "killed with the first two answers recorded, not the third": sorted(at_kill) == [1, 3],
        "the fresh process resumed the run and completed it": fresh_pid not in (None, killed_pid)
        and len(ended) == 1,
        "three model requests: two by the killed process, one by the fresh": [
            int(r["pid"]) for r in requests
        ]
        == [killed_pid, killed_pid, fresh_pid],
        "the last request sent both forecasts": [
            json.loads(m["content"])["city"]
            for m in requests[-1]["body"]["messages"]
            if m["role"] == "tool"
        ]
        == list(FORECASTS),
        "Lisbon fetched once, Oslo once by each process": by_city
        == {"Lisbon": ["killed"], "Oslo": ["killed", "fresh"]},
        "each answer recorded once, priced": sorted(completions) == [1, 2, 3, 4, 5]
        and all(isinstance(a.get("cost_usd"), float) for a in answers.values()),
        "the answers recorded before the kill are the ones the run went on with": all(
            answers[step] == answer for step, answer in at_kill.items()
        ),
        "the result is the model's final answer": result.get("answer") == answers[5]["text"],
    }
    for name, held in checks.items():
        print(f"    {'ok' if held else 'FAILED'}: {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-function-calling-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.agent:
        return agent(folder, args.base_url)
    if args.resume:
        return resume(folder, args.base_url)
    try:
        import openai  # noqa: F401 (only to say what is missing, before anything starts)
    except ImportError:
        print("this example needs the openai package: pip install 'durabl[openai]'")
        return 1
    db = folder / DB_NAME
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        path.unlink(missing_ok=True)
    for name in CALL_FILES:
        (folder / f"{name}.jsonl").unlink(missing_ok=True)
    print(f"files in {folder}")

    with ScriptedModel(model_reply, folder / "model_requests.jsonl") as model:
        killed = kill_mid_tools(folder, model.base_url)
        if killed is None:
            return 1
        print("\n[2] a fresh process: Runtime(...).resume_all()")
        sys.stdout.flush()
        resumed = subprocess.run(this_script(folder, model.base_url, "--resume"), timeout=60)
    if resumed.returncode == 0 and outcome(folder, *killed):
        print(
            "OK: the model's answers recorded before the kill came back from the log without "
            "asking the model again; the model was asked once more, by the fresh process, for "
            "the answer the kill had cut off"
        )
        return 0
    print("FAILED: the run did not finish as it should")
    return 1


if __name__ == "__main__":
    sys.exit(main())
