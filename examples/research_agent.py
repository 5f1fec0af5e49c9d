"""A research agent that survives Ctrl-C: run it, interrupt it, run it again.

The agent asks a model for a research plan, runs one search per query, waits on a durable
timer, asks the model for a summary, and emails it. The model is a deterministic stub and the
"email" is a line appended to an outbox file, so the example needs no API key and no network.

    python examples/research_agent.py            # Ctrl-C it at any point...
    python examples/research_agent.py            # ...and it picks the run up where it was
    python examples/research_agent.py --fresh    # forget the run and start over

The run id is fixed ("demo-run"), so every invocation drives the same run. Whatever you
interrupt, the outbox ends up with exactly one line: the email tool is IDEMPOTENT and dedupes
on the idempotency key durabl hands it, which is what makes a repeated call after an
interrupted one harmless. (An AT_MOST_ONCE email tool interrupted while it was running would be
dead-lettered instead: durabl cannot know whether the mail went out, so it would not guess.)

Everything printed about steps being "executed" or "from the log" is read back from the run's
event log through durabl's store, not tracked by this script.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from durabl import DurablError, ModelCall, Runtime, Sleep, ToolCall, events, tool, workflow

HERE = Path(__file__).resolve().parent
RUN_ID = "demo-run"
RUN_INPUT = {"topic": "sea otters", "email": "reader@example.com"}
TIMER_S = 2.0
"""The durable timer. It is part of the workflow's code, so it is fixed: changing it under a
recorded run would be a different step at that position, which durabl reports and holds."""

STEP_DELAY_S = 0.3
"""Default pause inside each tool call, long enough for a human to press Ctrl-C mid-step."""


# -- the workflow ----------------------------------------------------------------------------


@workflow(name="research_agent")
def research_agent(ctx: Any, topic: str, email: str) -> Any:
    plan = yield ModelCall(f"Make a research plan for {topic}")
    findings = []
    for query in plan["queries"]:
        findings.append((yield ToolCall("search", {"q": query})))
    yield Sleep(seconds=TIMER_S)
    summary = yield ModelCall(f"Summarize the findings about {topic}", findings=findings)
    written_at = ctx.now()
    receipt = yield ToolCall(
        "send_email",
        {
            "to": email,
            "subject": f"Research summary: {topic}",
            "body": summary["text"],
            "written_at": written_at,
        },
        idempotency_key=f"summary-{ctx.run_id}",
    )
    return {"summary": summary["text"], "receipt": receipt}


# -- the outside world: a stub model and two tools -------------------------------------------


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """A deterministic stand-in for an LLM: the same prompt always gets the same answer."""
    print(f"    model  answering {prompt!r}")
    if prompt.startswith("Make a research plan for "):
        topic = prompt.removeprefix("Make a research plan for ")
        return {"queries": [f"{topic} habitat", f"{topic} diet", f"{topic} tool use"]}
    findings = params.get("findings", [])
    sources = sum(len(found["results"]) for found in findings)
    lines = "; ".join(found["results"][0] for found in findings)
    return {"text": f"{len(findings)} searches, {sources} sources. Highlights: {lines}."}


class Outbox:
    """The mail server's side of the world: one JSON line per delivered email."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        if not self.path.exists():
            return []
        return [line for line in self.path.read_text(encoding="utf-8").splitlines() if line]

    def has(self, key: str) -> bool:
        return any(json.loads(line)["idempotency_key"] == key for line in self.lines())

    def append(self, record: dict[str, Any]) -> None:
        data = (json.dumps(record, sort_keys=True) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)


def make_tools(outbox: Outbox, step_delay_s: float, email_delay_s: float) -> dict[str, Any]:
    def search(q: str) -> dict[str, Any]:
        print(f"    search running {q!r}")
        time.sleep(step_delay_s)
        return {"query": q, "results": [f"{q}: source {n}" for n in (1, 2)]}

    def send_email(
        to: str, subject: str, body: str, written_at: float, *, idempotency_key: str
    ) -> Any:
        # durabl passes idempotency_key because this parameter is keyword-only. A real mail API
        # would take it as a client-side dedupe key; this outbox plays that part.
        if outbox.has(idempotency_key):
            print(f"    email  key {idempotency_key!r} is already in the outbox: not sent again")
        else:
            outbox.append(
                {"idempotency_key": idempotency_key, "to": to, "subject": subject, "body": body}
            )
            print(f"    email  sent to {to} (outbox line written)")
        time.sleep(email_delay_s)  # waiting for the server's answer: the ambiguous window
        return {"message_id": f"<{idempotency_key}@outbox>", "to": to}

    return {
        "search": tool(search, mode="IDEMPOTENT"),
        "send_email": tool(send_email, mode="IDEMPOTENT"),
    }


# -- reading the log back ---------------------------------------------------------------------


def describe(canonical: str) -> str:
    """A short label for a step from the canonical text its STEP_STARTED event records."""
    kind, *rest = json.loads(canonical)
    if kind == "model":
        return f"ModelCall {rest[0][:32]!r}"
    if kind == "tool":
        name, args = rest[0], rest[1]
        shown = args.get("q") or args.get("to") or ""
        return f"ToolCall {name} {shown!r}"
    if kind == "sleep":
        return f"Sleep {rest[0]:g} s"
    return canonical


def print_log_table(rt: Runtime, drove: bool) -> None:
    """Per step: who did it. A step whose outcome was written by this process was executed
    here; one written before this process's first write was served from the log (or, when
    this process found the run already finished and did not drive it, recorded earlier)."""
    earlier = "from the log" if drove else "recorded earlier"
    # A finished IDEMPOTENT tool call is one TOOL_COMPLETED event; expanded, it is the
    # STEP_STARTED and STEP_COMPLETED this table reads.
    log = [each for event in rt.store.load_log(RUN_ID) for each in events.expanded(event)]
    mine_from: int | None = None  # seq after which the log holds this process's writes
    labels: dict[int, str] = {}
    attempts: dict[int, int] = {}
    print(f"\n  step  {'what':<44} {'attempts':>8}  this process")
    for event in log:
        data = json.loads(event.data) if event.data else None
        if event.kind == events.RUN_STARTED and data["owner"] == rt.instance_id:
            mine_from = 0
        elif event.kind == events.RUN_RESUMED:
            if data["owner"] == rt.instance_id:
                mine_from = event.seq
            print(f"  {'-' * 22} process boundary: pid {data['pid']} took over (seq {event.seq})")
        elif event.kind == events.STEP_STARTED:
            labels.setdefault(event.step, describe(event.data or "null"))
            attempts[event.step] = attempts.get(event.step, 0) + 1
        elif event.kind in (events.STEP_COMPLETED, events.TIMER_FIRED, events.CTX_RECORDED):
            what = labels.get(event.step, f"ctx value {event.data}")
            who = "executed" if mine_from is not None and event.seq > mine_from else earlier
            tries = attempts.get(event.step, 1)
            print(f"  {event.step:>4}  {what[:44]:<44} {tries:>8}  {who}")


# -- driving the run --------------------------------------------------------------------------


def drive(rt: Runtime, wait: bool = True) -> tuple[str, bool]:
    """Start (or pick up) the run, then wait out its timer and fire it (unless ``wait`` is
    false: then a run left sleeping is left to a later process, which fires its timer once it
    is due).

    Returns the run's status and whether this process ran the workflow at all (it does not
    when it finds the run already finished, or stopped for an operator).
    """
    before = rt.store.get_run(RUN_ID)
    if before is None:
        print(f"run {RUN_ID}: new, starting it")
    else:
        print(f"run {RUN_ID}: found in the database, {before.status}")
    # run() with an existing run id and the same input does not start a second run: it drives
    # the recorded one if it was interrupted, and otherwise just reports its state.
    state = rt.run(research_agent, RUN_INPUT, run_id=RUN_ID)
    drove = before is None or before.status == events.RUNNING
    if drove:
        print(
            f"  run(): replayed {state.steps_replayed} steps from the log, "
            f"executed {state.steps_executed}; now {state.status}"
        )
    while wait and state.status == events.SLEEPING and state.wake_at_s is not None:
        wait_s = max(0.0, state.wake_at_s - time.time())
        print(f"  durable timer: due in {wait_s:.1f} s (interrupt now and the deadline is kept)")
        time.sleep(wait_s)
        for ticked in rt.tick():
            if ticked.run_id == RUN_ID:
                drove = True
                print(
                    f"  tick(): replayed {ticked.steps_replayed} steps from the log, "
                    f"executed {ticked.steps_executed}; now {ticked.status}"
                )
        state = rt.state(RUN_ID)
    return state.status, drove


def forget(db: Path, outbox: Path) -> None:
    """--fresh: remove the database (with its WAL files) and the outbox."""
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    outbox.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--db", type=Path, default=HERE / "agent.db", help="database file")
    parser.add_argument(
        "--outbox", type=Path, default=HERE / "email_outbox.log", help="the email tool's outbox"
    )
    parser.add_argument(
        "--fresh", action="store_true", help="delete the database and the outbox first"
    )
    parser.add_argument(
        "--step-delay",
        type=float,
        default=STEP_DELAY_S,
        metavar="SECONDS",
        help=f"pause inside each tool call (default {STEP_DELAY_S})",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="leave the run sleeping on its durable timer and exit; run again once it is due",
    )
    parser.add_argument(
        "--email-delay",
        type=float,
        default=None,
        metavar="SECONDS",
        help="how long the email tool waits for the server after writing the outbox line "
        "(default: the step delay); interrupt it then to land in the ambiguous window",
    )
    args = parser.parse_args(argv)
    # Ctrl-C must raise KeyboardInterrupt even when this process inherited SIGINT as ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.fresh:
        forget(args.db, args.outbox)
    outbox = Outbox(args.outbox)
    email_delay_s = args.step_delay if args.email_delay is None else args.email_delay
    tools = make_tools(outbox, args.step_delay, email_delay_s)
    try:
        with Runtime(args.db, llm=stub_model, tools=tools) as rt:
            status, drove = drive(rt, wait=not args.no_wait)
            print_log_table(rt, drove)
            state = rt.state(RUN_ID)
    except KeyboardInterrupt:
        print("\ninterrupted. Run the same command again (without --fresh) to resume the run.")
        return 130
    except DurablError as exc:
        print(f"\nthe run cannot go on: {type(exc).__name__}: {exc}")
        return 1
    print(
        f"\nrun {RUN_ID} is {status}. rt.state(), counted from the last process boundary in the "
        f"log: steps_replayed={state.steps_replayed}, steps_executed={state.steps_executed}"
    )
    if state.error:
        print(f"error: {state.error}")
    print(f"outbox {args.outbox}: {len(outbox.lines())} line(s)")
    if status == events.SLEEPING and args.no_wait and state.wake_at_s is not None:
        due = time.strftime("%H:%M:%S", time.localtime(state.wake_at_s))
        print(f"the run sleeps on its durable timer until {due}; run again after that")
        return 0
    return 0 if status == events.COMPLETED else 1


if __name__ == "__main__":
    sys.exit(main())
