"""Subagents as child runs: a lead agent delegates one topic to each of three researchers, is
killed while the second works, and finishes in a new process with no researcher lost or doubled.

The lead agent yields ``ChildRun(research_topic, {"topic": ...})`` once per topic and combines
what the three return into one brief (a model call). Each researcher is a workflow of its own
(``@workflow(name="research_topic")``), run as a run of its own with its own log: it searches
(an IDEMPOTENT tool), writes a note with the model (a deterministic stub) and files the note (an
AT_MOST_ONCE tool that appends a line to a file every time it is called). A child is created in
the transaction that records the lead's step, and its result is written into the lead's log in
the transaction that ends it, so a crash can leave neither an orphan nor a second child.

    python examples/subagents.py              # files in a fresh temporary folder
    python examples/subagents.py --dir DIR    # the database and the files the tools write, in DIR

What happens, stage by stage, each stage in a process of its own:

1. The lead (this script again, with ``--agent``) starts its run. The first researcher finishes
   and files its note; the second searches, and in that process its search never answers. The
   script kills the process with SIGKILL while that child run is in its search.
2. ``durabl runs`` lists what the kill left: the lead and the second child RUNNING, the first
   child COMPLETED, no third child.
3. A fresh process (``--resume``) calls ``Runtime(...).resume_all()``: the second child searches
   again and finishes, its result goes into the lead's log, the third child is created and run,
   and the lead writes its brief.
4. The outcome is read back from the database and from the files the tools append to.

Exit status 0 when all of that held: there is one child run per ChildRun and no other, each
naming the lead and its step in its RUN_STARTED; each child filed its note exactly once (the
first in the killed process, the others in the fresh one) and the first child's search was not
made again; the lead's log records each child's result as its step's result, and the lead's
result combines the three. 1 otherwise.
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

from durabl import ChildRun, ModelCall, Runtime, ToolCall, ToolMode, events, tool, workflow
from durabl.store import open_store

LEAD = "kelp-brief"
QUESTION = "What keeps a kelp forest alive?"
TOPICS = ["sea otters", "sea urchins", "kelp"]
STALLED = TOPICS[1]
"""The topic whose search never answers in the lead's first process: killed there."""
CHILDREN = {f"{LEAD}-{step}": topic for step, topic in enumerate(TOPICS, 1)}
"""Each child's run id, derived by durabl from the lead's id and the step, and its topic."""
HITS = {
    "sea otters": ["otters eat urchins", "otters returned to the coast in the 1990s"],
    "sea urchins": ["urchins graze kelp holdfasts", "urchin barrens spread without predators"],
    "kelp": ["kelp grows half a metre a day", "kelp forests shelter 800 species"],
}
DB_NAME = "brief.db"
CALL_FILES = ("searches", "model_calls", "notes")
"""The files the search, the model and the note filing append a line to, one per call."""


# -- the workflows ---------------------------------------------------------------------------------


@workflow(name="research_topic")
def research_topic(ctx: Any, topic: str) -> Any:
    found = yield ToolCall("search", {"topic": topic})
    note = yield ModelCall({"topic": topic, "hits": found["hits"]})
    filed = yield ToolCall("file_note", {"topic": topic, "text": note["text"]})
    return {"run_id": ctx.run_id, "topic": topic, "note": note["text"], "filed": filed["line"]}


@workflow(name="research_lead")
def research_lead(ctx: Any, question: str, topics: list[str]) -> Any:
    reports = []
    for topic in topics:
        reports.append((yield ChildRun(research_topic, {"topic": topic})))
    brief = yield ModelCall({"question": question, "notes": [r["note"] for r in reports]})
    return {
        "question": question,
        "brief": brief["text"],
        "children": [r["run_id"] for r in reports],
        "notes": [r["note"] for r in reports],
    }


# -- the outside world: a search engine, a stub model, a notebook; each call leaves a line ---------


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def append_line(path: Path, record: dict[str, Any]) -> int:
    """Append one JSON line and fsync it, so that it survives the SIGKILL that follows; returns
    how many lines the file holds."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return len(read_lines(path))


def make_world(folder: Path, *, stall: bool) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The model and the two tools; each call appends a line to its file, with its process.
    With ``stall``, the stalled topic's search never returns."""

    def search(topic: str, *, idempotency_key: str) -> dict[str, Any]:
        record = {"topic": topic, "key": idempotency_key, "pid": os.getpid()}
        append_line(folder / "searches.jsonl", record)
        if stall and topic == STALLED:
            time.sleep(60)  # the search engine never answers; killed here
        return {"hits": HITS[topic]}

    def file_note(topic: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Files the note: a line in notes.jsonl on every call, like a notebook API that keeps
        whatever it is sent (hence AT_MOST_ONCE)."""
        record = {"topic": topic, "text": text, "key": idempotency_key, "pid": os.getpid()}
        return {"line": append_line(folder / "notes.jsonl", record)}

    def stub_model(prompt: dict[str, Any], **params: Any) -> dict[str, Any]:
        """A deterministic stand-in for an LLM: a note from a topic's hits, or a brief from
        the notes."""
        append_line(folder / "model_calls.jsonl", {"prompt": prompt, "pid": os.getpid()})
        if "topic" in prompt:
            return {"text": f"{prompt['topic']}: " + "; ".join(prompt["hits"])}
        return {"text": f"{prompt['question']} " + " / ".join(prompt["notes"])}

    tools = {
        "search": tool(search, mode=ToolMode.IDEMPOTENT),
        "file_note": tool(file_note, mode=ToolMode.AT_MOST_ONCE),
    }
    return stub_model, tools


def runtime(folder: Path, *, stall: bool) -> Runtime:
    llm, tools = make_world(folder, stall=stall)
    workflows = [research_lead, research_topic]
    return Runtime(folder / DB_NAME, llm=llm, tools=tools, workflows=workflows)


# -- the two processes that drive the runs ---------------------------------------------------------


def agent(folder: Path) -> int:
    """Stage 1's victim: run the lead until the stalled search holds it (it is killed there)."""
    with runtime(folder, stall=True) as rt:
        rt.run(research_lead, {"question": QUESTION, "topics": TOPICS}, run_id=LEAD)
    return 0


def resume(folder: Path) -> int:
    """Stage 3: a process that knows nothing of the first one resumes every interrupted run."""
    with runtime(folder, stall=False) as rt:
        for state in rt.resume_all():
            print(f"    [pid {os.getpid()}] resumed {state.run_id}: {state.status}", flush=True)
    return 0


def this_script(folder: Path, flag: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--dir", str(folder), flag]


def durabl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database, in a process of its own."""
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def indented(text: str, by: str = "    ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline_s:
            print(f"    timed out waiting for {what}")
            return False
        time.sleep(0.01)
    return True


# -- reading the database, as another process does -------------------------------------------------


class Reader:
    """The database as another process reads it: read-only, nothing of the agents' code."""

    def __init__(self, folder: Path) -> None:
        self.store = open_store(str(folder / DB_NAME), read_only=True)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.store.close()

    def statuses(self) -> dict[str, str]:
        return {row.run_id: row.status for row in self.store.list_runs()}

    def logs(self) -> dict[str, list[events.Event]]:
        return {row.run_id: self.store.load_log(row.run_id) for row in self.store.list_runs()}

    def result(self, run_id: str) -> Any:
        row = self.store.get_run(run_id)
        return None if row is None else json.loads(row.result_text or "null")


def started(log: list[events.Event]) -> dict[str, Any]:
    return json.loads(log[0].data or "{}") if log and log[0].kind == events.RUN_STARTED else {}


def boundary_pids(log: list[events.Event]) -> list[int]:
    """The process of each boundary in a run's log: who started it, who resumed it."""
    boundaries = (events.RUN_STARTED, events.RUN_RESUMED)
    return [json.loads(e.data or "{}")["pid"] for e in log if e.kind in boundaries]


# -- the stages ------------------------------------------------------------------------------------


def kill_inside_a_child(folder: Path) -> int | None:
    """Start the lead, SIGKILL it while the second child searches; the killed pid."""
    print("\n[1] the lead agent delegates each topic to a child run")
    sys.stdout.flush()
    proc = subprocess.Popen(this_script(folder, "--agent"))
    reached = wait_for(
        f"the search for {STALLED!r}",
        lambda: (
            any(s["topic"] == STALLED for s in read_lines(folder / "searches.jsonl"))
            or proc.poll() is not None
        ),
    )
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if not reached or proc.returncode != -signal.SIGKILL:
        print(f"    FAILED: the lead was not killed inside the child (exit {proc.returncode})")
        return None
    print(
        f"    killed the lead's process (pid {proc.pid}) with SIGKILL in the search for {STALLED!r}"
    )
    return proc.pid


def after_the_kill(folder: Path) -> bool:
    """``durabl runs``, and the state the kill left: one child done, one in its search."""
    print("\n[2] `durabl runs`: what the kill left")
    print(indented(durabl(folder, "runs").stdout, "      "))
    with Reader(folder) as reader:
        statuses = reader.statuses()
    first, second, third = CHILDREN
    left = {LEAD: events.RUNNING, first: events.COMPLETED, second: events.RUNNING}
    print(f"    {third} does not exist yet: its ChildRun was never reached")
    return statuses == left


def outcome(folder: Path, killed_pid: int) -> bool:
    """Read the runs back from the database and the files; True when they did what they say."""
    print("\n[4] the outcome")
    with Reader(folder) as reader:
        statuses, logs = reader.statuses(), reader.logs()
        results = {run_id: reader.result(run_id) for run_id in statuses}
    searches, notes = read_lines(folder / "searches.jsonl"), read_lines(folder / "notes.jsonl")
    for run_id in statuses:
        parent = started(logs[run_id]).get("parent")
        named = f", parent {parent['run_id']} step {parent['step']}" if parent else ""
        print(f"    {run_id}: {statuses[run_id]}{named}; processes {boundary_pids(logs[run_id])}")
    for line in notes:
        print(f"    note filed by pid {line['pid']} under {line['key']}: {line['text']!r}")
    print(f"    every run completed: {all(s == events.COMPLETED for s in statuses.values())}")
    if statuses != dict.fromkeys([LEAD, *CHILDREN], events.COMPLETED):
        print("    FAILED: the runs are not the lead and one completed child per topic")
        return False
    lead = results[LEAD]
    print(f"    the lead's brief: {lead['brief']!r}")
    fresh_pid = boundary_pids(logs[LEAD])[-1]
    child_ends = {
        e.step: json.loads(e.data or "null")
        for e in logs.get(LEAD, [])
        if e.kind == events.STEP_COMPLETED and e.step <= len(TOPICS)
    }
    first, second, third = CHILDREN
    checks = {
        "one child run per ChildRun, each naming the lead and its step": all(
            started(logs[run_id]).get("parent") == {"run_id": LEAD, "step": step}
            and started(logs[run_id]).get("input") == {"topic": topic}
            for step, (run_id, topic) in enumerate(CHILDREN.items(), 1)
        )
        and [e.step for e in logs[LEAD] if e.kind == events.STEP_STARTED]
        == [*range(1, len(TOPICS) + 2)],  # one per ChildRun, then the brief
        "each child filed its note once": sorted(line["key"] for line in notes)
        == sorted(f"durabl:{run_id}:3" for run_id in CHILDREN),
        "the first child finished before the kill and ran no step again": boundary_pids(logs[first])
        == [killed_pid]
        and [s["pid"] for s in searches if s["topic"] == TOPICS[0]] == [killed_pid]
        and [n["pid"] for n in notes if n["topic"] == TOPICS[0]] == [killed_pid],
        "the second child, begun by the killed process, finished in the fresh one": boundary_pids(
            logs[second]
        )
        == [killed_pid, fresh_pid]
        and [s["pid"] for s in searches if s["topic"] == STALLED] == [killed_pid, fresh_pid],
        "the third child was begun by the fresh process": boundary_pids(logs[third]) == [fresh_pid]
        and killed_pid != fresh_pid,
        "the lead's log holds each child's result as its step's": child_ends
        == {step: results[run_id] for step, run_id in enumerate(CHILDREN, 1)},
        "the lead's result combines the children's": lead["children"] == list(CHILDREN)
        and lead["notes"] == [results[run_id]["note"] for run_id in CHILDREN]
        and all(topic in lead["brief"] for topic in TOPICS),
    }
    for name, held in checks.items():
        print(f"    {'ok' if held else 'FAILED'}: {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--agent", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-subagents-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.agent:
        return agent(folder)
    if args.resume:
        return resume(folder)
    db = folder / DB_NAME
    stale = [folder / f"{name}.jsonl" for name in CALL_FILES]
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), *stale):
        path.unlink(missing_ok=True)
    print(f"files in {folder}")

    killed_pid = kill_inside_a_child(folder)
    if killed_pid is None:
        print("FAILED: the lead was not killed inside a child")
        return 1
    stages = {"the kill left one child done, one in its search": after_the_kill(folder)}
    print("\n[3] a fresh process: Runtime(...).resume_all()")
    sys.stdout.flush()
    resumed = subprocess.run(this_script(folder, "--resume"), timeout=60).returncode == 0
    stages["the fresh process resumed the runs"] = resumed
    stages["the runs did what they say"] = outcome(folder, killed_pid)
    if all(stages.values()):
        print(
            "OK: one child run per ChildRun, each naming the lead; the child killed mid-search "
            "finished in the fresh process, each filed its note once, and the lead's brief "
            "combines the three"
        )
        return 0
    print("FAILED: " + ", ".join(name for name, held in stages.items() if not held))
    return 1


if __name__ == "__main__":
    sys.exit(main())
