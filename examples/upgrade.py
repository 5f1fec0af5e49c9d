"""Changing code under running runs: two deploys of one agent, ``durabl check`` between them.

The support agent fetches a ticket, asks a (stub) model to draft a reply, waits for a human to
review the draft (a durable timer), and sends it. Version 2 of the agent changes the prompt: the
reply must point to the docs. A run that v1 left waiting for its review already holds v1's model
call in its log; replayed against code that yields v2's call at that position, it would be held
(``NonDeterminismError``), so the change goes behind ``ctx.patched("reply-cites-docs")``.

    python examples/upgrade.py              # files in a fresh temporary folder
    python examples/upgrade.py --dir DIR    # the database and the outbox in DIR

What happens, stage by stage, each deploy in a process of its own (this script, run again with
``--deploy VERSION``):

1. Deploy v1 starts ticket-101. It drafts its reply with the v1 prompt and parks SLEEPING on
   its review; the process exits, as a process does when it is replaced.
2. Before deploying v2, ``durabl --import upgrade check`` replays every stored run against the
   new code, dry. With the prompt simply replaced it lists ticket-101 as WOULD HOLD, with the
   first step where its log and the code differ, and exits 1. With the change behind
   ``ctx.patched`` it finds nothing that would be held, and exits 0.
3. Deploy v2 (the patched code) starts ticket-102 and fires the review timers as they come due.
   ticket-101 replays its v1 draft from the log (``ctx.patched`` is False there: the log holds
   another step at that point) and sends it; ticket-102 meets the change for the first time,
   records that it took the new branch, and drafts with the v2 prompt.
4. The outcome is read back from the database and the outbox.

Exit status 0 when all of that held: the unguarded code would have held ticket-101 and the
patched code nothing, ticket-101 finished on the old branch without a patch marker, ticket-102
took the new one with its marker, and the outbox holds one reply per ticket. 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

from durabl import ModelCall, Runtime, Sleep, ToolCall, ToolMode, events, tool, workflow

WORKFLOW = "answer_ticket"
PATCH_ID = "reply-cites-docs"
OLD_RUN, NEW_RUN = "ticket-101", "ticket-102"
TICKETS = {
    OLD_RUN: {"subject": "CSV export times out"},
    NEW_RUN: {"subject": "login link expired"},
}
V1_PROMPT = "Draft a reply about {subject}"
V2_PROMPT = "Draft a reply about {subject}, with a link to the docs"
REVIEW_S = 1.0
"""How long a draft waits for its human review: a durable timer, fired by whichever process
ticks once it is due."""
DEPLOY_VAR = "UPGRADE_DEPLOY"
"""Names the version ``durabl --import upgrade`` loads (the command imports the module, so it
cannot take an option of ours)."""


# -- the workflow, in each version that is deployed ----------------------------------------------


def _review_and_send(
    ticket_id: str, draft: dict[str, Any], prompt: str
) -> Generator[Any, Any, Any]:
    """What every version does after drafting: wait for the review, send, report."""
    yield Sleep(seconds=REVIEW_S)
    sent = yield ToolCall("send_reply", {"ticket_id": ticket_id, "body": draft["text"]})
    return {"ticket_id": ticket_id, "prompt": prompt, "sent": sent}


def answer_ticket_v1(ctx: Any, ticket_id: str) -> Any:
    ticket = yield ToolCall("fetch_ticket", {"ticket_id": ticket_id})
    draft = yield ModelCall(V1_PROMPT.format(**ticket))
    return (yield from _review_and_send(ticket_id, draft, "v1"))


def answer_ticket_v2_unguarded(ctx: Any, ticket_id: str) -> Any:
    """The new prompt, simply in place of the old one: what ``durabl check`` refuses."""
    ticket = yield ToolCall("fetch_ticket", {"ticket_id": ticket_id})
    draft = yield ModelCall(V2_PROMPT.format(**ticket))
    return (yield from _review_and_send(ticket_id, draft, "v2"))


def answer_ticket_v2(ctx: Any, ticket_id: str) -> Any:
    """The new prompt behind ``ctx.patched``: both versions in one function."""
    ticket = yield ToolCall("fetch_ticket", {"ticket_id": ticket_id})
    if ctx.patched(PATCH_ID):  # new runs, and runs that reach this point from now on
        draft = yield ModelCall(V2_PROMPT.format(**ticket))
        prompt = "v2"
    else:  # runs whose log already holds v1's model call here
        draft = yield ModelCall(V1_PROMPT.format(**ticket))
        prompt = "v1"
    return (yield from _review_and_send(ticket_id, draft, prompt))


VERSIONS: dict[str, Callable[..., Any]] = {
    "v1": answer_ticket_v1,
    "v2-unguarded": answer_ticket_v2_unguarded,
    "v2": answer_ticket_v2,
}


def deploy(version: str) -> Any:
    """Register ``version`` under the workflow's one name: the name is what a run's log records,
    so whichever version a process registers is the code that drives every run of it."""
    return workflow(VERSIONS[version], name=WORKFLOW)


if os.environ.get(DEPLOY_VAR) in VERSIONS:
    deploy(os.environ[DEPLOY_VAR])  # imported by `durabl --import upgrade check`


# -- the outside world: a ticket desk, a stub model and an outbox --------------------------------


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """A deterministic stand-in for an LLM: it follows the prompt's one instruction it knows."""
    subject = prompt.removeprefix("Draft a reply about ").split(",")[0]
    text = f"Thanks for reporting '{subject}': we are on it."
    if "docs" in prompt:
        text += " The docs: https://docs.example.com/" + subject.replace(" ", "-")
    return {"text": text}


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def make_tools(folder: Path, say: Callable[[str], None]) -> dict[str, Any]:
    outbox = folder / "outbox.jsonl"

    def fetch_ticket(ticket_id: str) -> dict[str, Any]:
        return TICKETS[ticket_id]

    def send_reply(ticket_id: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
        if not any(line["key"] == idempotency_key for line in read_lines(outbox)):
            with outbox.open("a", encoding="utf-8") as handle:
                record = {"key": idempotency_key, "ticket_id": ticket_id, "body": body}
                handle.write(json.dumps(record, sort_keys=True) + "\n")
        say(f"send_reply({ticket_id}): {body}")
        return {"sent": True, "ticket_id": ticket_id}

    return {
        "fetch_ticket": tool(fetch_ticket, mode=ToolMode.IDEMPOTENT),
        "send_reply": tool(send_reply, mode=ToolMode.IDEMPOTENT),
    }


# -- one deploy: a process that drives the runs with one version of the code ---------------------


def serve(folder: Path, version: str) -> int:
    """What a deployed process does: resume what is interrupted, start its new ticket, then
    fire the review timers as they come due. v1 stops while its run waits (it is replaced by
    the v2 deploy); v2 goes on until no run is waiting for a timer."""
    answer_ticket = deploy(version)

    def say(line: str) -> None:
        print(f"    [{version} pid {os.getpid()}] {line}", flush=True)

    new_run = OLD_RUN if version == "v1" else NEW_RUN
    with Runtime(
        folder / "tickets.db",
        llm=stub_model,
        tools=make_tools(folder, say),
        workflows=[answer_ticket],
    ) as rt:
        rt.resume_all()
        state = rt.run(answer_ticket, {"ticket_id": new_run}, run_id=new_run)
        say(f"rt.run({new_run!r}) -> {state.status}")
        if version == "v1":
            return 0
        while True:
            states = [rt.state(run_id) for run_id in TICKETS]
            due = [s.wake_at_s for s in states if s.status == events.SLEEPING and s.wake_at_s]
            if not due:
                return 0  # every run has finished, or one is stuck: the outcome says which
            time.sleep(max(0.0, min(due) - time.time()))
            for woke in rt.tick():
                say(f"rt.tick(): {woke.run_id} -> {woke.status}")


def run_deploy(folder: Path, version: str) -> None:
    """This script again, in a process of its own, with ``version`` of the code."""
    sys.stdout.flush()
    script = str(Path(__file__).resolve())
    argv = [sys.executable, script, "--dir", str(folder), "--deploy", version]
    subprocess.run(argv, check=True, timeout=120)


def durabl(
    folder: Path, *args: str, version: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database; ``version``: the code it imports."""
    env = dict(os.environ)
    if version is not None:
        env[DEPLOY_VAR] = version
        here = str(Path(__file__).resolve().parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
        args = ("--import", Path(__file__).stem, *args)
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / "tickets.db"), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)


def indented(text: str, by: str = "      ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


def check_before_deploy(folder: Path) -> tuple[bool, bool]:
    """``durabl check`` with each candidate v2: (the unguarded one would hold ticket-101 and
    names the first difference, the patched one would hold nothing)."""
    print("\n[2] before deploying v2, `durabl --import upgrade check` with each candidate")
    unguarded = durabl(folder, "check", version="v2-unguarded")
    print(f"    the prompt simply replaced (exit {unguarded.returncode}):")
    print(indented(unguarded.stdout or unguarded.stderr))
    difference = f"recorded ModelCall('{V1_PROMPT.format(**TICKETS[OLD_RUN])}')"
    refused = (
        unguarded.returncode == 1
        and OLD_RUN in unguarded.stdout
        and "WOULD HOLD" in unguarded.stdout
        and difference in unguarded.stdout
    )
    patched = durabl(folder, "check", version="v2")
    print(f'    the change behind ctx.patched("{PATCH_ID}") (exit {patched.returncode}):')
    print(indented(patched.stdout or patched.stderr))
    passed = patched.returncode == 0 and "none would be held" in patched.stdout
    return refused, passed


def outcome(folder: Path) -> bool:
    """Read the runs back from the database and the outbox; True when each took its branch."""
    with Runtime(folder / "tickets.db") as rt:
        states = {run_id: rt.state(run_id) for run_id in TICKETS}
        results = {
            run_id: rt.result(run_id) if state.status == events.COMPLETED else {}
            for run_id, state in states.items()
        }
        markers = {
            run_id: [
                (e.step, e.data) for e in rt.store.load_log(run_id) if e.kind == events.CTX_RECORDED
            ]
            for run_id in TICKETS
        }
    replies = {line["ticket_id"]: line["body"] for line in read_lines(folder / "outbox.jsonl")}
    for run_id in TICKETS:
        shown = ", ".join(f"ctx.patched({json.loads(d)!r}) at step {s}" for s, d in markers[run_id])
        prompt = results[run_id].get("prompt")
        print(
            f"    {run_id}: {states[run_id].status}, drafted with the {prompt} prompt; "
            f"patch markers in its log: {shown or 'none'}"
        )
        print(f"      reply sent: {replies.get(run_id)}")
    print("    `durabl show --trace` for each (which steps came from the log, which ran):")
    for run_id in TICKETS:
        print(indented(durabl(folder, "show", run_id, "--trace").stdout))
    return (
        all(s.status == events.COMPLETED for s in states.values())
        and results[OLD_RUN].get("prompt") == "v1"
        and results[NEW_RUN].get("prompt") == "v2"
        and markers == {OLD_RUN: [], NEW_RUN: [(2, json.dumps(PATCH_ID))]}
        and len(read_lines(folder / "outbox.jsonl")) == len(replies) == 2
        and "docs.example.com" not in replies.get(OLD_RUN, "docs.example.com")
        and "docs.example.com" in replies.get(NEW_RUN, "")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--deploy", choices=sorted(VERSIONS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="durabl-upgrade-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.deploy:
        return serve(folder, args.deploy)
    db = folder / "tickets.db"
    for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), folder / "outbox.jsonl"):
        stale.unlink(missing_ok=True)
    print(f"files in {folder}")

    print("\n[1] deploy v1: a process starts ticket-101 and exits while the run waits for review")
    run_deploy(folder, "v1")
    print(indented(durabl(folder, "show", OLD_RUN, "--trace").stdout, "    "))

    refused, passed = check_before_deploy(folder)

    print("\n[3] deploy v2 (the patched code): a new process starts ticket-102, fires the timers")
    run_deploy(folder, "v2")

    print("\n[4] the outcome")
    branches = outcome(folder)
    ok = refused and passed and branches
    if ok:
        print(
            "OK: check named the run an unguarded deploy would hold; under the patched code the "
            "old run kept to the old branch and the new run took the new one"
        )
    else:
        print(f"FAILED: unguarded refused={refused}, patched passed={passed}, branches={branches}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
