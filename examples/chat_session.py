"""A chat session without end: each turn is a run of its own, so no log grows with the talk.

The session is a loop: wait for the user's message (``yield WaitSignal("msg")``), have the model
(a deterministic stub) write the answer, send it (a tool), then ``yield ContinueAsNew({...})``
with a bounded summary: the turn number and the last two messages. The run ends CONTINUED and
names the next, which starts with a fresh log; a message sent before its turn reached the wait
is handed on to the next run in the same transaction, and taken by the next turn's wait. The
session ends, COMPLETED, on "bye".

    python examples/chat_session.py              # files in a fresh temporary folder
    python examples/chat_session.py --dir DIR    # the database and the files the tools write

What happens, stage by stage, each stage in processes of its own:

1. The agent (this script again, with ``--agent``) starts session chat-7, which parks WAITING for
   its first message; the agent exits.
2. The user types four messages before anything answers: ``durabl signal chat-7 msg '"..."'``,
   one process per message. The first makes the session due; the other three are kept.
3. A ``durabl worker`` (``--import chat_session``: this module registers the workflow and
   defines ``DURABL_TOOLS`` and ``DURABL_LLM``; the tools find their files through
   ``CHAT_EXAMPLE_DIR``) answers the four, one turn per run: each turn takes the oldest message
   it was handed, answers it and continues; the fifth turn parks on its wait.
4. A live exchange: one message, answered, then "bye", answered, and the session COMPLETED.
   Each is sent to chat-7, the session's first run: a signal goes to the run its chain has got
   to.
5. The outcome is read back from the database and the files.

Exit status 0 when all of that held: the chain from chat-7 is CONTINUED, ..., CONTINUED,
COMPLETED, each run naming the one it continued from; no run's log holds more than a dozen
events, whatever its turn; each message was taken once, by a turn's wait, in the order sent, the
early ones handed on from run to run until then; each was answered once, in order. 1 otherwise.
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

from durabl import (
    ContinueAsNew,
    ModelCall,
    Runtime,
    ToolCall,
    ToolMode,
    WaitSignal,
    events,
    tool,
    workflow,
)
from durabl.store import open_store

WORKFLOW = "chat_session"
SESSION = "chat-7"
EARLY = [
    "hi, where is my order 1042?",
    "it is a blue kettle",
    "can it come before friday?",
    "to my office address, please",
]
"""Typed before anything answers: three of them are handed on from run to run."""
LIVE = ["thanks, that is all", "bye"]
"""Typed one at a time, each once the previous one is answered."""
MESSAGES = EARLY + LIVE
GOODBYE = "bye"
RECENT = 2
"""How many earlier messages the summary a turn hands on keeps: the bound on its input."""
MAX_EVENTS_PER_RUN = 12
"""The most events any one run's log holds, whatever its turn."""
DIR_ENV = "CHAT_EXAMPLE_DIR"
DB_NAME = "chat.db"


# -- the workflow, its model and its tool (imported by the worker too) -----------------------------


@workflow(name=WORKFLOW)
def chat_session(ctx: Any, session: str, turn: int, recent: list[str]) -> Any:
    message = yield WaitSignal("msg")
    answer = yield ModelCall({"turn": turn, "recent": recent, "message": message})
    yield ToolCall(
        "send_reply", {"session": session, "turn": turn, "message": message, "text": answer["text"]}
    )
    if message == GOODBYE:
        return {"session": session, "turns": turn}
    summary = {"session": session, "turn": turn + 1, "recent": [*recent, message][-RECENT:]}
    yield ContinueAsNew(summary)


def _folder() -> Path:
    return Path(os.environ[DIR_ENV])


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def append_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def stub_model(prompt: dict[str, Any], **params: Any) -> dict[str, Any]:
    """A deterministic stand-in for an LLM: it answers the message and recalls the last one."""
    append_line(_folder() / "model_calls.jsonl", {"prompt": prompt, "pid": os.getpid()})
    if prompt["message"] == GOODBYE:
        return {"text": "Goodbye!"}
    recalled = f" (after {prompt['recent'][-1]!r})" if prompt["recent"] else ""
    return {"text": f"Noted {prompt['message']!r}{recalled}."}


def send_reply(
    session: str, turn: int, message: str, text: str, *, idempotency_key: str
) -> dict[str, Any]:
    """Post the answer to the chat: a line in replies.jsonl on every call."""
    record = {"session": session, "turn": turn, "message": message, "text": text}
    append_line(_folder() / "replies.jsonl", {**record, "key": idempotency_key, "pid": os.getpid()})
    return {"posted": True}


DURABL_TOOLS = {"send_reply": tool(send_reply, mode=ToolMode.IDEMPOTENT)}
DURABL_LLM = stub_model


# -- the processes ---------------------------------------------------------------------------------


def agent(folder: Path) -> int:
    """Stage 1: start the session, which parks on its first wait, and exit."""
    os.environ[DIR_ENV] = str(folder)
    with Runtime(folder / DB_NAME, llm=stub_model, tools=DURABL_TOOLS) as rt:
        state = rt.run(chat_session, {"session": SESSION, "turn": 1, "recent": []}, run_id=SESSION)
    print(f"    [agent pid {os.getpid()}] rt.run({SESSION!r}) -> {state.status}", flush=True)
    return 0


def durabl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database, in a process of its own."""
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def send(folder: Path, message: str) -> bool:
    """``durabl signal chat-7 msg '"..."'``: the user types ``message``."""
    done = durabl(folder, "signal", SESSION, "msg", json.dumps(message))
    print(f"    $ durabl signal {SESSION} msg '{json.dumps(message)}'")
    print(indented(done.stdout or done.stderr, "      "))
    return done.returncode == 0


def start_worker(folder: Path) -> subprocess.Popen[bytes]:
    """``durabl worker --import chat_session``, with this folder on the import path."""
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, DIR_ENV: str(folder)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME)]
    argv += ["--import", Path(__file__).stem, "worker", "--poll", "0.1"]
    with (folder / "worker.out").open("wb") as out, (folder / "worker.err").open("wb") as err:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err)


def indented(text: str, by: str = "    ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline_s:
            print(f"    timed out waiting for {what}")
            return False
        time.sleep(0.05)
    return True


# -- reading the database, as another process does -------------------------------------------------


class Reader:
    """The database as another process reads it: read-only, nothing of the session's code."""

    def __init__(self, folder: Path) -> None:
        self.store = open_store(str(folder / DB_NAME), read_only=True)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.store.close()

    def chain(self) -> list[str]:
        """The session's runs, from chat-7 to the one its chain has got to."""
        run_ids = [SESSION]
        row = self.store.get_run(SESSION)
        while row is not None and row.status == events.CONTINUED:
            run_ids.append(json.loads(row.result_text or "{}")["continued_as"])
            row = self.store.get_run(run_ids[-1])
        return run_ids

    def status(self, run_id: str) -> str | None:
        row = self.store.get_run(run_id)
        return None if row is None else row.status

    def waiting_at(self, turn: int) -> bool:
        """True when the chain has got to the run of ``turn`` and that run is parked on its
        wait (the run of the turn before may still show WAITING once a message has woken it)."""
        chain = self.chain()
        return len(chain) == turn and self.status(chain[-1]) == events.WAITING


def replies(folder: Path) -> list[dict[str, Any]]:
    return read_lines(folder / "replies.jsonl")


# -- the stages ------------------------------------------------------------------------------------


def stage_agent(folder: Path) -> bool:
    print(f"\n[1] the agent process starts session {SESSION} and exits")
    script = str(Path(__file__).resolve())
    argv = [sys.executable, script, "--dir", str(folder), "--agent"]
    sys.stdout.flush()
    done = subprocess.run(argv, env={**os.environ, DIR_ENV: str(folder)}, timeout=60)
    print(f"    the agent process exited {done.returncode}")
    with Reader(folder) as reader:
        return done.returncode == 0 and reader.status(SESSION) == events.WAITING


def stage_early_messages(folder: Path) -> bool:
    print(f"\n[2] {len(EARLY)} messages typed before anything answers")
    sent = all([send(folder, message) for message in EARLY])
    with Reader(folder) as reader:
        kept = [s.delivered_step for s in reader.store.signals(SESSION)]
        due = SESSION in reader.store.due_runs(time.time())
        status = reader.status(SESSION)
    print(f"    {SESSION}: {status}, {'due' if due else 'not due'}; {len(kept)} messages kept")
    return sent and due and status == events.WAITING and kept == [None] * len(EARLY)


def stage_worker(folder: Path) -> tuple[subprocess.Popen[bytes], bool]:
    print(f"\n[3] `durabl --import {Path(__file__).stem} worker` answers them, a turn per run")
    worker = start_worker(folder)
    with Reader(folder) as reader:
        answered = wait_for(
            "the early messages to be answered",
            lambda: len(replies(folder)) == len(EARLY) and reader.waiting_at(len(EARLY) + 1),
        )
        chain = reader.chain()
    for reply in replies(folder):
        print(f"    turn {reply['turn']}: {reply['message']!r} -> {reply['text']!r}")
    print(f"    {len(chain)} runs so far; the newest, {chain[-1]}, waits for turn {len(chain)}")
    return worker, answered


def stage_live(folder: Path, worker: subprocess.Popen[bytes]) -> bool:
    print("\n[4] a live exchange, each message sent once the last one is answered")
    ok = True
    with Reader(folder) as reader:
        for turn, message in enumerate(LIVE, len(EARLY) + 1):
            ok = send(folder, message) and wait_for(
                f"the answer to {message!r}", lambda n=turn: len(replies(folder)) >= n
            )
            if not ok:
                break
            print(f"    turn {turn}: {message!r} -> {replies(folder)[-1]['text']!r}")
            if message != GOODBYE:
                ok = wait_for(f"turn {turn + 1}'s wait", lambda n=turn + 1: reader.waiting_at(n))
        ended = ok and wait_for(
            "the session to end", lambda: reader.status(reader.chain()[-1]) == events.COMPLETED
        )
    worker.send_signal(signal.SIGTERM)
    code = worker.wait(timeout=30)
    print(indented((folder / "worker.out").read_text() + (folder / "worker.err").read_text()))
    print(f"    the worker exited {code}")
    return ended and code == 0


def outcome(folder: Path) -> bool:
    """Read the session back from the database and the files; True when it went as it says."""
    print("\n[5] the outcome")
    with Reader(folder) as reader:
        chain = reader.chain()
        statuses = {run_id: reader.status(run_id) for run_id in chain}
        logs = {run_id: reader.store.load_log(run_id) for run_id in chain}
        sent = {run_id: reader.store.signals(run_id) for run_id in chain}
    answers = replies(folder)
    taken = []
    for turn, run_id in enumerate(chain, 1):
        took = [json.loads(s.payload_text) for s in sent[run_id] if s.delivered_step == 1]
        handed = [s for s in sent[run_id] if s.delivered_step not in (None, 1)]
        taken.extend(took)
        print(
            f"    turn {turn}: run {run_id} {statuses[run_id]}, {len(logs[run_id])} events; took "
            f"{took}, handed on {len(handed)}"
        )
    starts = [json.loads(log[0].data or "{}") for log in logs.values()]
    checks = {
        "the chain is CONTINUED, ..., COMPLETED": list(statuses.values())
        == [events.CONTINUED] * (len(MESSAGES) - 1) + [events.COMPLETED],
        "each run names the one it continued from": [s.get("continued_from") for s in starts]
        == [None, *chain[:-1]],
        f"no run's log holds more than {MAX_EVENTS_PER_RUN} events": max(map(len, logs.values()))
        <= MAX_EVENTS_PER_RUN,
        "each message taken once, by a turn's wait, in order": taken == MESSAGES,
        "the early ones handed on until their turn": [len(sent[r]) for r in chain[: len(EARLY)]]
        == [len(EARLY) - turn for turn in range(len(EARLY))],
        "each message answered once, in order": [(a["turn"], a["message"]) for a in answers]
        == list(enumerate(MESSAGES, 1)),
        "the summary handed on stays bounded": all(
            len(s["input"]["recent"]) <= RECENT for s in starts
        ),
    }
    for name, held in checks.items():
        print(f"    {'ok' if held else 'FAILED'}: {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-chat-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.agent:
        return agent(folder)
    db = folder / DB_NAME
    stale = [db, Path(f"{db}-wal"), Path(f"{db}-shm"), *folder.glob("*.jsonl")]
    for path in [*stale, folder / "worker.out", folder / "worker.err"]:
        path.unlink(missing_ok=True)
    print(f"files in {folder}")
    stages = {
        "the agent exited with the session waiting": stage_agent(folder),
        "the early messages were kept": stage_early_messages(folder),
    }
    worker, answered = stage_worker(folder)
    stages["the worker answered the early messages"] = answered
    stages["the live exchange ended the session"] = stage_live(folder, worker)
    stages["the session went as it says"] = outcome(folder)
    if all(stages.values()):
        print(
            f"OK: {len(MESSAGES)} turns in {len(MESSAGES)} runs of a few events each, chained "
            "CONTINUED to COMPLETED; the messages typed early were handed on until their turn, "
            "and each message was answered once, in order"
        )
        return 0
    print("FAILED: " + ", ".join(name for name, held in stages.items() if not held))
    return 1


if __name__ == "__main__":
    sys.exit(main())
