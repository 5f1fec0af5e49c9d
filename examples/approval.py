"""Waiting for a human: an agent drafts a reply, waits for a person to approve it, and sends it
only when approved.

Each run drafts its reply (a tool), then ``yield WaitSignal("approve", timeout=...)``. A run
that reaches the wait parks WAITING: no thread and no process waits for the answer. The answer
is a signal, sent from anywhere (here ``durabl signal RUN approve '{...}'``, a process of its
own that needs neither the agent's code nor its tools); it is kept durably and makes the run due,
and a worker drives the run on: the draft comes back from the log, the yield returns the answer.

    python examples/approval.py              # files in a fresh temporary folder
    python examples/approval.py --dir DIR    # the database, the files the tools write, in DIR

What happens, stage by stage, each stage in processes of its own:

1. The agent (this script again, with ``--agent``) starts ticket-201, ticket-202 and ticket-204:
   each drafts its reply and parks WAITING for its approval. It submits ticket-203 without
   driving it. Then it exits.
2. ``durabl signal``, one process per answer: ticket-201 approved and ticket-204 rejected while
   they wait, which makes each due at once (nothing drives them yet); ticket-203 approved
   before it has even reached its wait. Nobody answers ticket-202.
3. A ``durabl worker`` (``--import approval``: this module registers the workflow and defines
   ``DURABL_TOOLS``; the tools find their files through ``APPROVAL_EXAMPLE_DIR``) finishes
   them: ticket-201 gets its draft back from the log and sends it; ticket-203 drafts, and its
   wait takes the answer already there without parking; ticket-204 sends nothing; ticket-202
   times out after ``NO_ANSWER_S`` and takes the fallback: the ticket is escalated.
4. The outcome is read back from the database and the files.

Exit status 0 when all of that held: the agent exited while its runs waited; each signal made its
waiting run due without driving it; the worker finished every run; each draft was made once
(ticket-201's by the agent process, never again); the outbox holds the two approved replies and
nothing else; ticket-202 timed out, no earlier than its deadline, and was escalated; ticket-203's
wait took its signal in the commit that began it. 1 otherwise.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durabl import TIMED_OUT, Runtime, ToolCall, ToolMode, WaitSignal, events, tool, workflow
from durabl.store import RunRow, open_store
from durabl.store.base import Signal

WORKFLOW = "reply_with_approval"
HOUR_S = 3600.0
NO_ANSWER_S = 2.0
"""How long ticket-202's reviewer has: nobody answers, so the wait times out after this."""
TICKETS: dict[str, dict[str, Any]] = {
    "ticket-201": {"subject": "CSV export times out", "review_s": HOUR_S},
    "ticket-202": {"subject": "login link expired", "review_s": NO_ANSWER_S},
    "ticket-203": {"subject": "invoice in the wrong currency", "review_s": HOUR_S},
    "ticket-204": {"subject": "refund for a duplicate charge", "review_s": HOUR_S},
}
STARTED = ("ticket-201", "ticket-202", "ticket-204")
"""Started by the agent, so that each drafts and parks on its wait."""
SUBMITTED = "ticket-203"
"""Submitted by the agent and not driven: its answer comes before it reaches its wait."""
ANSWERS: dict[str, dict[str, Any]] = {
    SUBMITTED: {"approved": True, "by": "ben"},
    "ticket-201": {"approved": True, "by": "ana"},
    "ticket-204": {"approved": False, "by": "ana", "why": "refunds go through billing"},
}
"""What each reviewer says, in the order they say it. Nobody answers ticket-202."""
OUTCOMES = {
    "ticket-201": "sent",
    "ticket-202": "escalated",
    SUBMITTED: "sent",
    "ticket-204": "rejected",
}
DIR_ENV = "APPROVAL_EXAMPLE_DIR"
DB_NAME = "approvals.db"


# -- the workflow and its tools (imported by the worker too) ---------------------------------------


@workflow(name=WORKFLOW)
def reply_with_approval(ctx: Any, ticket_id: str, review_s: float) -> Any:
    draft = yield ToolCall("draft_reply", {"ticket_id": ticket_id})
    verdict = yield WaitSignal("approve", timeout=review_s)
    if verdict is TIMED_OUT:  # nobody answered in time: a person must look at the ticket
        yield ToolCall("escalate", {"ticket_id": ticket_id, "draft": draft["text"]})
        return {"ticket_id": ticket_id, "outcome": "escalated"}
    if not verdict.get("approved"):
        return {"ticket_id": ticket_id, "outcome": "rejected", "by": verdict.get("by")}
    sent = yield ToolCall(
        "send_reply", {"ticket_id": ticket_id, "body": draft["text"], "approved_by": verdict["by"]}
    )
    return {"ticket_id": ticket_id, "outcome": "sent", "by": verdict["by"], "sent": sent}


def _folder() -> Path:
    return Path(os.environ[DIR_ENV])


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _append(name: str, record: dict[str, Any], *, unless_key: str | None = None) -> None:
    """Append ``record`` to a file of the folder under a lock (the agent and the worker are two
    processes); with ``unless_key``, only if no record has that key, like an API that honours
    the client's idempotency key."""
    with (_folder() / name).open("a+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            handle.seek(0)
            seen = [json.loads(line) for line in handle.read().splitlines() if line]
            if unless_key is None or all(r.get("key") != unless_key for r in seen):
                handle.write(json.dumps(record, sort_keys=True) + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def draft_reply(ticket_id: str) -> dict[str, Any]:
    """A stand-in for the model that writes the draft; every call is logged, with its process."""
    _append("drafts.jsonl", {"ticket_id": ticket_id, "pid": os.getpid()})
    subject = TICKETS[ticket_id]["subject"]
    return {"text": f"Thanks for reporting '{subject}': a fix is on its way."}


def send_reply(ticket_id: str, body: str, approved_by: str, *, idempotency_key: str) -> bool:
    record = {"key": idempotency_key, "ticket_id": ticket_id, "body": body, "by": approved_by}
    _append("outbox.jsonl", record, unless_key=idempotency_key)
    return True


def escalate(ticket_id: str, draft: str, *, idempotency_key: str) -> bool:
    record = {"key": idempotency_key, "ticket_id": ticket_id, "draft": draft}
    _append("escalations.jsonl", record, unless_key=idempotency_key)
    return True


DURABL_TOOLS = {
    "draft_reply": tool(draft_reply, mode=ToolMode.IDEMPOTENT),
    "send_reply": tool(send_reply, mode=ToolMode.IDEMPOTENT),
    "escalate": tool(escalate, mode=ToolMode.IDEMPOTENT),
}


# -- stage 1: the agent process --------------------------------------------------------------------


def agent(folder: Path) -> int:
    """Start the runs that draft and wait, submit the one that is answered early, and exit."""
    os.environ[DIR_ENV] = str(folder)
    with Runtime(folder / DB_NAME, tools=DURABL_TOOLS, workflows=[reply_with_approval]) as rt:
        for run_id in STARTED:
            run_input = {"ticket_id": run_id, "review_s": TICKETS[run_id]["review_s"]}
            state = rt.run(reply_with_approval, run_input, run_id=run_id)
            print(f"    [agent pid {os.getpid()}] rt.run({run_id!r}) -> {state.status}", flush=True)
        run_input = {"ticket_id": SUBMITTED, "review_s": TICKETS[SUBMITTED]["review_s"]}
        rt.submit(reply_with_approval, run_input, run_id=SUBMITTED)
        print(f"    [agent pid {os.getpid()}] rt.submit({SUBMITTED!r}): not driven", flush=True)
    return 0


# -- the other processes, and reading the outcome --------------------------------------------------


def durabl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database, in a process of its own."""
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def start_worker(folder: Path) -> subprocess.Popen[bytes]:
    """``durabl worker --import approval``, with this folder on the import path."""
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, DIR_ENV: str(folder)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME)]
    argv += ["--import", Path(__file__).stem, "worker", "--poll", "0.2"]
    with (folder / "worker.out").open("wb") as out, (folder / "worker.err").open("wb") as err:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err)


def indented(text: str, by: str = "    ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


class Reader:
    """The database as another process reads it: read-only, nothing of the agent's code."""

    def __init__(self, folder: Path) -> None:
        self.store = open_store(str(folder / DB_NAME), read_only=True)

    def close(self) -> None:
        self.store.close()

    def row(self, run_id: str) -> RunRow:
        found = self.store.get_run(run_id)
        assert found is not None, run_id
        return found

    def at_step(self, run_id: str, step: int) -> list[events.Event]:
        return [e for e in self.store.load_log(run_id) if e.step == step]

    def pids(self, run_id: str) -> list[int]:
        """The process of each boundary in the run's log: who started it, who resumed it."""
        boundaries = (events.RUN_STARTED, events.RUN_RESUMED)
        log = self.store.load_log(run_id)
        return [json.loads(e.data or "{}")["pid"] for e in log if e.kind in boundaries]


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline_s:
            print(f"    timed out waiting for {what}")
            return False
        time.sleep(0.05)
    return True


def stage_agent(folder: Path) -> bool:
    print("\n[1] the agent process drafts, parks its runs on their waits, and exits")
    started_s = time.monotonic()
    script = str(Path(__file__).resolve())
    argv = [sys.executable, script, "--dir", str(folder), "--agent"]
    done = subprocess.run(argv, env={**os.environ, DIR_ENV: str(folder)}, timeout=60)
    took_s = time.monotonic() - started_s
    print(f"    the agent process exited {done.returncode} after {took_s:.1f} s")
    print(indented(durabl(folder, "runs").stdout))
    reader = Reader(folder)
    try:
        waiting = all(reader.row(r).status == events.WAITING for r in STARTED)
        untouched = [e.kind for e in reader.store.load_log(SUBMITTED)] == [events.RUN_STARTED]
    finally:
        reader.close()
    return done.returncode == 0 and waiting and untouched


def stage_signals(folder: Path) -> bool:
    print("\n[2] the answers, each `durabl signal RUN approve '{...}'` in a process of its own")
    sent = True
    for run_id, answer in ANSWERS.items():
        done = durabl(folder, "signal", run_id, "approve", json.dumps(answer))
        print(f"    $ durabl signal {run_id} approve '{json.dumps(answer)}'")
        print(indented(done.stdout or done.stderr, "      "))
        sent = sent and done.returncode == 0
    reader = Reader(folder)
    try:
        now_s = time.time()
        due = sorted(reader.store.due_runs(now_s))
        rows = {run_id: reader.row(run_id) for run_id in TICKETS}
        for run_id, row in rows.items():
            when = "due now" if run_id in due else "not due"
            sent_to = len(reader.store.signals(run_id))
            print(f"    {run_id}: {row.status}, {when}; signals sent to it: {sent_to}")
        answered_waits = [r for r in STARTED if r in ANSWERS]
        made_due = set(answered_waits) <= set(due) and all(
            rows[r].status == events.WAITING for r in answered_waits
        )
        early = [e.kind for e in reader.store.load_log(SUBMITTED)] == [events.RUN_STARTED]
    finally:
        reader.close()
    return sent and made_due and early


def stage_worker(folder: Path) -> bool:
    print("\n[3] `durabl --import approval worker` finishes the runs")
    worker = start_worker(folder)
    reader = Reader(folder)
    try:
        finished = wait_for(
            "the worker to finish every run",
            lambda: all(reader.row(r).status == events.COMPLETED for r in TICKETS),
        )
    finally:
        reader.close()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=30)
    print(indented((folder / "worker.out").read_text() + (folder / "worker.err").read_text()))
    print(f"    the worker exited {code}")
    return finished and code == 0


@dataclass
class Outcome:
    """What the runs left behind: in the database, and in the files the tools wrote."""

    results: dict[str, dict[str, Any]]
    signals: dict[str, list[Signal]]
    waits: dict[str, list[events.Event]]
    """Each run's events at the wait's position (step 2)."""
    pids: dict[str, list[int]]
    drafts: list[dict[str, Any]]
    replies: list[dict[str, Any]]
    escalated: list[dict[str, Any]]

    @classmethod
    def read(cls, folder: Path) -> Outcome:
        reader = Reader(folder)
        try:
            return cls(
                results={r: json.loads(reader.row(r).result_text or "{}") for r in TICKETS},
                signals={r: reader.store.signals(r) for r in TICKETS},
                waits={r: reader.at_step(r, 2) for r in TICKETS},
                pids={r: reader.pids(r) for r in TICKETS},
                drafts=read_lines(folder / "drafts.jsonl"),
                replies=read_lines(folder / "outbox.jsonl"),
                escalated=read_lines(folder / "escalations.jsonl"),
            )
        finally:
            reader.close()

    def show(self) -> None:
        for run_id in TICKETS:
            made = [d["pid"] for d in self.drafts if d["ticket_id"] == run_id]
            took = [f"#{s.id} at step {s.delivered_step}" for s in self.signals[run_id]]
            print(
                f"    {run_id}: {self.results[run_id].get('outcome')}; drafted by pid {made}; "
                f"signals taken: {', '.join(took) or 'none'}"
            )
        print(f"    replies sent: {[r['ticket_id'] for r in self.replies]}")
        print(f"    escalated: {[r['ticket_id'] for r in self.escalated]}")

    def checks(self) -> dict[str, bool]:
        agent_pid, worker_pid = self.pids["ticket-201"][0], self.pids["ticket-201"][-1]
        timed_out, early = self.waits["ticket-202"], self.waits[SUBMITTED]
        deadline_s = json.loads(timed_out[1].data or "{}")["fire_at_s"]
        return {
            "outcomes": {r: self.results[r].get("outcome") for r in TICKETS} == OUTCOMES,
            "one draft each": sorted(d["ticket_id"] for d in self.drafts) == sorted(TICKETS),
            "drafted before the wait, by the agent": all(
                d["pid"] == agent_pid for d in self.drafts if d["ticket_id"] in STARTED
            ),
            "finished by the worker": agent_pid != worker_pid
            and all(self.pids[r][-1] == worker_pid for r in TICKETS),
            "sent only when approved": sorted(r["ticket_id"] for r in self.replies)
            == sorted(r for r, answer in ANSWERS.items() if answer["approved"]),
            "timed out and escalated": [r["ticket_id"] for r in self.escalated] == ["ticket-202"]
            and json.loads(timed_out[-1].data or "{}") == {"timed_out": True}
            and timed_out[-1].at_s >= deadline_s
            and self.signals["ticket-202"] == [],
            "each answer taken once, by its wait": all(
                [s.delivered_step for s in self.signals[r]] == [2] for r in ANSWERS
            ),
            "the early answer taken at once": [e.kind for e in early]
            == [events.STEP_STARTED, events.STEP_COMPLETED]
            and early[0].at_s == early[1].at_s > self.signals[SUBMITTED][0].sent_s,
        }


def outcome(folder: Path) -> bool:
    """Read the runs back from the database and the files; True when each went its way."""
    print("\n[4] the outcome")
    found = Outcome.read(folder)
    found.show()
    for run_id in ("ticket-201", "ticket-202", SUBMITTED):
        print(f"    `durabl show {run_id} --trace`:")
        print(indented(durabl(folder, "show", run_id, "--trace").stdout, "      "))
    try:
        checks = found.checks()
    except (IndexError, KeyError) as missing:  # a run that did not get as far as its wait
        print(f"    FAILED: a run's log lacks what it should hold ({missing!r})")
        return False
    for name, held in checks.items():
        print(f"    {'ok' if held else 'FAILED'}: {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-approval-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.agent:
        return agent(folder)
    db = folder / DB_NAME
    stale = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *folder.glob("*.jsonl")]
    for path in [*stale, folder / "worker.out", folder / "worker.err"]:
        path.unlink(missing_ok=True)
    print(f"files in {folder}")
    stages = {
        "the agent exited while its runs waited": stage_agent(folder),
        "the signals made the waiting runs due": stage_signals(folder),
        "the worker finished every run": stage_worker(folder),
    }
    stages["each run went its way"] = outcome(folder)
    if all(stages.values()):
        print(
            "OK: the agent exited while its runs waited; the answers, sent from the command line, "
            "made them due; a worker finished them, without drafting again; the approved replies "
            "were sent, the rejected one was not, the unanswered run timed out and escalated, and "
            "the answer sent early was taken at once"
        )
        return 0
    print("FAILED: " + ", ".join(name for name, held in stages.items() if not held))
    return 1


if __name__ == "__main__":
    sys.exit(main())
