"""Forking a run from a step: re-running an agent after its search, with a better prompt.

The research agent searches the web (a tool), asks a (stub) model to summarise what it found,
and sends the summary (a tool). Its run completes; then the user sees the summary cites no
sources: the prompt was wrong. Running the agent again would search again, paying for what
was already found. A fork instead copies the run's log up to the seq that ended the search,
and a deploy with the new prompt runs it on from there: the search comes back from the log,
the model and the send run again.

    python examples/fork.py              # files in a fresh temporary folder
    python examples/fork.py --dir DIR    # the database and the files the tools write, in DIR

What happens, stage by stage, each in a process of its own:

1. Deploy v1 (this script again, with ``--deploy v1``) runs the agent on sea otters to the
   end: one search, a summary written with the v1 prompt, the summary sent.
2. ``durabl show RUN`` lists the run's log; the seq of step 1's STEP_COMPLETED is where the
   search ended.
3. ``durabl fork RUN --at SEQ --run-id NEW`` makes the fork: a new run, RUNNING, whose log is
   the original's up to SEQ, after a RUN_STARTED that names the run and seq it came from.
4. ``durabl fork`` one seq later, where the model call has begun and not ended, is refused with
   one line naming the run, the seq and the step, exit status 2, and nothing written.
5. Deploy v2 (``--deploy v2``: the summary prompt asks for bullets that cite each source)
   resumes the fork: step 1 is served from the copied log, steps 2 and 3 run.
6. The outcome is read back from the database and from the files the tools append to.

Exit status 0 when all of that held: the search was called once, ever, by deploy v1; the model
and the send were each called once per run, the fork's with the v2 prompt and its own
idempotency key; the fork's RUN_STARTED names the original and the seq, and its log holds the
original's events up to it; the original's log and row are as they were before the fork; the
refused fork exited 2 with one line and wrote nothing. 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durabl import ModelCall, Runtime, ToolCall, ToolMode, events, tool, workflow
from durabl.store import RunRow, open_store

WORKFLOW = "research_summary"
ORIGINAL, FORK = "otters-brief", "otters-brief-v2"
RUN_INPUT = {"topic": "sea otters", "email": "editor@example.com"}
DB_NAME = "research.db"
CALL_FILES = ("searches", "model_calls", "outbox")
"""The files the search, the model and the send append a line to, one per call."""
PROMPTS = {
    "v1": "Summarise these results about {topic}: {titles}",
    "v2": "Summarise these results about {topic} in three bullets, citing each source: {titles}",
}
"""The one thing the two deploys change: v1's summary cites no sources, the reason to fork."""
HITS = [
    {"title": "Otters use rocks as tools", "url": "https://example.org/otter-tools"},
    {"title": "Kelp forests need otters", "url": "https://example.org/kelp"},
    {"title": "Counting otters from the air", "url": "https://example.org/survey"},
]


# -- the workflow, as each deploy writes it --------------------------------------------------------


def summary_prompt(version: str, topic: str, hits: list[dict[str, str]]) -> str:
    titles = "; ".join(hit["title"] for hit in hits)
    return PROMPTS[version].format(topic=topic, titles=titles)


def deploy(version: str) -> Any:
    """Register ``version`` of the agent under the workflow's one name (the name is what a
    run's log records, so the version a process registers drives every run of it)."""

    def research_summary(ctx: Any, topic: str, email: str) -> Any:
        found = yield ToolCall("search", {"q": topic})
        summary = yield ModelCall(summary_prompt(version, topic, found["hits"]))
        sent = yield ToolCall("send_summary", {"to": email, "body": summary["text"]})
        return {"prompt": version, "summary": summary["text"], "sent": sent}

    return workflow(research_summary, name=WORKFLOW)


# -- the outside world: a search engine, a stub model, an outbox; each call leaves a line ----------


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def append_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, sort_keys=True) + "\n")


def make_world(folder: Path, say: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """The model and the tools; each appends a line per call to its file, with its process."""

    def search(q: str) -> dict[str, Any]:
        append_line(folder / "searches.jsonl", {"q": q, "pid": os.getpid()})
        say(f"search({q!r}): {len(HITS)} hits")
        return {"hits": HITS}

    def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
        """A deterministic stand-in for an LLM: it cites its sources only when asked to."""
        append_line(folder / "model_calls.jsonl", {"prompt": prompt, "pid": os.getpid()})
        if "citing each source" in prompt:
            text = "\n".join(f"- {hit['title']} ({hit['url']})" for hit in HITS)
        else:
            text = "Sea otters: " + "; ".join(hit["title"].lower() for hit in HITS) + "."
        say(f"model({prompt[:48]!r}...)")
        return {"text": text}

    def send_summary(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
        outbox = folder / "outbox.jsonl"
        if all(line["key"] != idempotency_key for line in read_lines(outbox)):
            append_line(
                outbox, {"key": idempotency_key, "to": to, "body": body, "pid": os.getpid()}
            )
        say(f"send_summary({to!r}) under key {idempotency_key}")
        return {"sent": True, "key": idempotency_key}

    tools = {
        "search": tool(search, mode=ToolMode.IDEMPOTENT),
        "send_summary": tool(send_summary, mode=ToolMode.IDEMPOTENT),
    }
    return stub_model, tools


# -- one deploy: a process that drives a run with one version of the code --------------------------


def serve(folder: Path, version: str) -> int:
    """Deploy v1 runs the original to its end; deploy v2 resumes the fork."""
    research_summary = deploy(version)

    def say(line: str) -> None:
        print(f"    [{version} pid {os.getpid()}] {line}", flush=True)

    llm, tools = make_world(folder, say)
    with Runtime(folder / DB_NAME, llm=llm, tools=tools, workflows=[research_summary]) as rt:
        if version == "v1":
            state = rt.run(research_summary, RUN_INPUT, run_id=ORIGINAL)
        else:
            state = rt.resume(FORK)
        say(
            f"{state.run_id}: {state.status}, {state.steps_replayed} step(s) from the log, "
            f"{state.steps_executed} executed"
        )
    return 0 if state.status == events.COMPLETED else 1


def run_deploy(folder: Path, version: str) -> bool:
    """This script again, in a process of its own, with ``version`` of the code."""
    sys.stdout.flush()
    argv = [sys.executable, str(Path(__file__).resolve()), "--dir", str(folder)]
    return subprocess.run([*argv, "--deploy", version], timeout=60).returncode == 0


def durabl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database, in a process of its own."""
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def indented(text: str, by: str = "    ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


Snapshot = tuple[RunRow | None, list[events.Event]]
"""A run's row and log, as read at one moment."""


def boundary_pids(log: list[events.Event]) -> list[int]:
    """The process of each boundary in a run's log: who started it, who resumed it."""
    boundaries = (events.RUN_STARTED, events.RUN_RESUMED)
    return [json.loads(e.data or "{}")["pid"] for e in log if e.kind in boundaries]


class Reader:
    """The database as another process reads it: read-only, nothing of the agent's code."""

    def __init__(self, folder: Path) -> None:
        self.store = open_store(str(folder / DB_NAME), read_only=True)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.store.close()

    def snapshot(self, run_id: str) -> Snapshot:
        return self.store.get_run(run_id), self.store.load_log(run_id)

    def run_ids(self) -> list[str]:
        return sorted(row.run_id for row in self.store.list_runs())


# -- the stages ------------------------------------------------------------------------------------


def find_end_of_search(folder: Path) -> int | None:
    """Read ``durabl show RUN`` as the user does: the seq of step 1's STEP_COMPLETED."""
    print(f"\n[2] `durabl show {ORIGINAL}`: which seq ended the search (step 1)?")
    shown = durabl(folder, "show", ORIGINAL)
    print(indented(shown.stdout or shown.stderr, "      "))
    found = re.search(r"^(\d+)\s.*\b(?:STEP|TOOL)_COMPLETED\s+1\s", shown.stdout, re.MULTILINE)
    if found is None:
        print("    FAILED: no STEP_COMPLETED for step 1 in the listing")
        return None
    print(f"    the search ended at seq {found.group(1)}")
    return int(found.group(1))


def make_fork(folder: Path, seq: int) -> bool:
    print(f"\n[3] `durabl fork {ORIGINAL} --at {seq} --run-id {FORK}`")
    made = durabl(folder, "fork", ORIGINAL, "--at", str(seq), "--run-id", FORK)
    print(indented(made.stdout or made.stderr, "      "))
    with Reader(folder) as reader:
        row = reader.store.get_run(FORK)
    print(f"    {FORK}: {row.status if row else 'missing'}, waiting for a deploy to resume it")
    return made.returncode == 0 and row is not None and row.status == events.RUNNING


def refuse_fork_inside_a_step(folder: Path, seq: int) -> bool:
    """One seq past the search's end is the model call's STEP_STARTED: inside step 2."""
    print(f"\n[4] `durabl fork {ORIGINAL} --at {seq}`: the model call has begun there, not ended")
    with Reader(folder) as reader:
        before = reader.run_ids()
    refused = durabl(folder, "fork", ORIGINAL, "--at", str(seq))
    print(indented(refused.stderr or refused.stdout, "      "))
    print(f"    exit status {refused.returncode}")
    with Reader(folder) as reader:
        after = reader.run_ids()
    print(f"    runs before: {before}; after: {after}")
    one_line = len(refused.stderr.splitlines()) == 1 and not refused.stdout
    named = refused.stderr.startswith(
        f"durabl: cannot fork run {ORIGINAL} at seq {seq}: it is inside step 2 (ModelCall("
    )
    return refused.returncode == 2 and one_line and named and before == after


def show_calls(calls: dict[str, list[dict[str, Any]]]) -> None:
    """What the outside world saw: each search, model call and summary sent, with its process."""
    searches = [line["pid"] for line in calls["searches"]]
    print(f"    search calls, ever: {len(searches)}, by pid {searches}")
    for call in calls["model_calls"]:
        print(f"    model call by pid {call['pid']}: {call['prompt']!r}")
    for sent in calls["outbox"]:
        print(f"    sent by pid {sent['pid']} under {sent['key']}:")
        print(indented(sent["body"], "      | "))


def outcome(folder: Path, seq: int, original_before: Snapshot) -> bool:
    """Read the runs back from the database and the files; True when the fork did what it says."""
    print("\n[6] the outcome")
    with Reader(folder) as reader:
        original, fork = reader.snapshot(ORIGINAL), reader.snapshot(FORK)
    calls = {name: read_lines(folder / f"{name}.jsonl") for name in CALL_FILES}
    show_calls(calls)
    for run_id in (ORIGINAL, FORK):
        print(f"    `durabl show {run_id} --trace`:")
        print(indented(durabl(folder, "show", run_id, "--trace").stdout, "      "))
    (original_row, original_log), (fork_row, fork_log) = original, fork
    if original_row is None or fork_row is None or not original_log or not fork_log:
        print("    FAILED: a run or its log is missing")
        return False
    started = json.loads(fork_log[0].data or "{}")
    print(f"    {FORK}'s RUN_STARTED: forked_from {started.get('forked_from')}")
    v1_pid = boundary_pids(original_log)[0]
    v2_pid = boundary_pids(fork_log)[-1]  # the RUN_RESUMED of the deploy that ran it on
    searches, model_calls, outbox = calls["searches"], calls["model_calls"], calls["outbox"]
    v1_prompt, v2_prompt = (summary_prompt(v, RUN_INPUT["topic"], HITS) for v in ("v1", "v2"))
    checks = {
        "both runs completed": {original_row.status, fork_row.status} == {events.COMPLETED},
        "the search was called once, by deploy v1": [s["pid"] for s in searches] == [v1_pid],
        "the model ran again, in deploy v2, with the v2 prompt": v1_pid != v2_pid
        and [(c["prompt"], c["pid"]) for c in model_calls]
        == [(v1_prompt, v1_pid), (v2_prompt, v2_pid)]
        and json.loads(fork_row.result_text or "{}").get("prompt") == "v2",
        "the send ran again, under the fork's own key": [(s["key"], s["pid"]) for s in outbox]
        == [(f"durabl:{ORIGINAL}:3", v1_pid), (f"durabl:{FORK}:3", v2_pid)]
        and all(hit["url"] in outbox[1]["body"] for hit in HITS)
        and "https://" not in outbox[0]["body"],
        "the fork's RUN_STARTED names where it came from": started.get("forked_from")
        == {"run_id": ORIGINAL, "seq": seq}
        and (started.get("workflow"), started.get("input")) == (WORKFLOW, RUN_INPUT),
        "the fork's log holds the original's up to the seq": fork_log[1:seq] == original_log[1:seq],
        "the original is unchanged": original == original_before,
    }
    for name, held in checks.items():
        print(f"    {'ok' if held else 'FAILED'}: {name}")
    return all(checks.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    parser.add_argument("--deploy", choices=sorted(PROMPTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-fork-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.deploy:
        return serve(folder, args.deploy)
    db = folder / DB_NAME
    stale = [folder / f"{name}.jsonl" for name in CALL_FILES]
    for stale_file in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), *stale):
        stale_file.unlink(missing_ok=True)
    print(f"files in {folder}")

    print(f"\n[1] deploy v1 runs {ORIGINAL} to its end")
    stages = {"deploy v1 ran the agent": run_deploy(folder, "v1")}
    with Reader(folder) as reader:
        original_before = reader.snapshot(ORIGINAL)
    seq = find_end_of_search(folder)
    if seq is None:
        print("FAILED: no seq to fork at")
        return 1
    stages["the fork was made"] = make_fork(folder, seq)
    stages["the fork inside a step was refused"] = refuse_fork_inside_a_step(folder, seq + 1)
    print(f"\n[5] deploy v2 (the prompt asks for sources) resumes {FORK}")
    stages["deploy v2 ran the fork on"] = run_deploy(folder, "v2")
    stages["the fork did what it says"] = outcome(folder, seq, original_before)
    if all(stages.values()):
        print(
            f"OK: {FORK} took the search from {ORIGINAL}'s log without calling it, wrote its "
            "summary with the new prompt and sent it; it names where it came from, the original "
            "is as it was, and a fork inside a step was refused with nothing written"
        )
        return 0
    print("FAILED: " + ", ".join(name for name, held in stages.items() if not held))
    return 1


if __name__ == "__main__":
    sys.exit(main())
