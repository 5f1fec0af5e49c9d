"""Fetching sources in parallel: an agent reads six pages at once, is killed half-way, and
finishes in a new process without fetching again what it already had.

The agent answers a question from six web pages. ``yield Parallel([ToolCall("fetch", ...) for
each url], max_concurrency=3)`` fetches them three at a time and returns the pages in the order
of the urls, whatever order they arrived in; then one model call (a deterministic stub)
summarises them. Each fetch is a step of its own: its result is committed as soon as it
arrives, so a crash loses only the fetches still out.

    python examples/parallel.py              # files in a fresh temporary folder
    python examples/parallel.py --dir DIR    # the database and the files the tools write, in DIR

What happens, stage by stage, each stage in a process of its own:

1. The agent (this script again, with ``--agent``) starts the run. In that process the first
   source's server never answers, so the Parallel cannot finish there. Once two fetches are
   recorded in the database, the script kills the agent with SIGKILL.
2. A fresh process (``--resume``) calls ``Runtime(...).resume_all()``: the Parallel is reached
   again, the fetches the log holds are served from it, only the others are made, and the
   summary is written.
3. The outcome is read back from the database and from the files the tools append to.

Exit status 0 when all of that held: the agent was killed with some fetches recorded and some
not; each fetch recorded before the kill was made once, by the killed process, and never
again; each other source was fetched once by the fresh process; no more than three fetches
were out at once in either process; the pages arrived out of order and came back in the order
given; the model was called once, with the pages in that order, and the run completed. 1
otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durabl import ModelCall, Parallel, Runtime, ToolCall, ToolMode, events, tool, workflow
from durabl.store import open_store

WORKFLOW = "answer_from_sources"
RUN_ID = "otters-and-kelp"
QUESTION = "Why do kelp forests need sea otters?"
SOURCES: dict[str, dict[str, Any]] = {
    "https://example.org/kelp-decline": {"title": "Where the kelp went", "delay_s": 0.9},
    "https://example.org/urchin-barrens": {"title": "Urchin barrens", "delay_s": 0.3},
    "https://example.org/otter-diet": {"title": "What otters eat", "delay_s": 0.6},
    "https://example.org/trophic-cascade": {"title": "A trophic cascade", "delay_s": 0.2},
    "https://example.org/carbon-storage": {"title": "Kelp stores carbon", "delay_s": 0.5},
    "https://example.org/otter-return": {"title": "The otters come back", "delay_s": 0.4},
}
"""The pages, in the order the agent asks for them, and how long each server takes to answer."""
URLS = list(SOURCES)
STALLED = URLS[0]
"""The source whose server never answers the agent's first process (a hung connection)."""
MAX_CONCURRENCY = 3
KILL_AFTER = 2
"""The agent is killed once this many fetches are recorded in the database."""
PARALLEL_STEP = 1
BRANCHES = {PARALLEL_STEP + 1 + index: url for index, url in enumerate(URLS)}
"""The log position of each fetch: the Parallel's branches follow its own position."""
DB_NAME = "sources.db"
CALL_FILES = ("fetches", "model_calls")
"""The files the fetch tool and the model append a line to, one per call."""


# -- the workflow ----------------------------------------------------------------------------------


@workflow(name=WORKFLOW)
def answer_from_sources(ctx: Any, question: str, urls: list[str]) -> Any:
    fetches = [ToolCall("fetch", {"url": url}) for url in urls]
    pages = yield Parallel(fetches, max_concurrency=MAX_CONCURRENCY)
    summary = yield ModelCall(
        {"question": question, "pages": [[page["url"], page["title"]] for page in pages]}
    )
    return {"question": question, "sources": [page["url"] for page in pages], **summary}


# -- the outside world: six web servers and a stub model; each call leaves a line ------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def append_line(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line in one write and fsync it: the fetches of one process run on several
    threads, and what a fetch wrote must survive the SIGKILL that follows."""
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def make_world(folder: Path, *, stall: bool) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The model and the fetch tool. Each fetch logs its url, its key, its process and how many
    fetches of that process were out when it began; with ``stall``, the stalled source's fetch
    never returns."""
    lock = threading.Lock()
    out = [0]

    def fetch(url: str, *, idempotency_key: str) -> dict[str, Any]:
        with lock:
            out[0] += 1
            inside = out[0]
        record = {"url": url, "key": idempotency_key, "pid": os.getpid(), "inside": inside}
        append_line(folder / "fetches.jsonl", record)
        try:
            time.sleep(60 if stall and url == STALLED else SOURCES[url]["delay_s"])
        finally:
            with lock:
                out[0] -= 1
        return {"url": url, "title": SOURCES[url]["title"]}

    def stub_model(prompt: dict[str, Any], **params: Any) -> dict[str, Any]:
        """A deterministic stand-in for an LLM: one sentence naming the pages in the order given."""
        append_line(folder / "model_calls.jsonl", {"prompt": prompt, "pid": os.getpid()})
        titles = "; ".join(title for _url, title in prompt["pages"])
        return {"summary": f"{len(prompt['pages'])} sources agree: {titles}."}

    return stub_model, {"fetch": tool(fetch, mode=ToolMode.IDEMPOTENT)}


# -- the two processes that drive the run ----------------------------------------------------------


def agent(folder: Path) -> int:
    """Stage 1's victim: start the run; its stalled fetch keeps it busy until it is killed."""
    llm, tools = make_world(folder, stall=True)
    with Runtime(folder / DB_NAME, llm=llm, tools=tools, workflows=[answer_from_sources]) as rt:
        rt.run(answer_from_sources, {"question": QUESTION, "urls": URLS}, run_id=RUN_ID)
    return 0


def resume(folder: Path) -> int:
    """Stage 2: a process that knows nothing of the first one resumes every interrupted run."""
    llm, tools = make_world(folder, stall=False)
    with Runtime(folder / DB_NAME, llm=llm, tools=tools, workflows=[answer_from_sources]) as rt:
        for state in rt.resume_all():
            print(
                f"    [pid {os.getpid()}] resumed {state.run_id}: {state.status}, "
                f"{state.steps_replayed} step(s) from the log, {state.steps_executed} executed",
                flush=True,
            )
    return 0


def this_script(folder: Path, flag: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--dir", str(folder), flag]


def durabl(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The ``durabl`` command on this example's database, in a process of its own."""
    argv = [sys.executable, "-m", "durabl", "--db", str(folder / DB_NAME), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def indented(text: str, by: str = "    ") -> str:
    return by + text.rstrip().replace("\n", "\n" + by)


# -- reading the database, as another process does -------------------------------------------------


class Reader:
    """The database as another process reads it: read-only, nothing of the agent's code."""

    def __init__(self, folder: Path) -> None:
        self.store = open_store(str(folder / DB_NAME), read_only=True)

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.store.close()

    def log(self) -> list[events.Event]:
        return self.store.load_log(RUN_ID)


def recorded(log: list[events.Event]) -> dict[str, int]:
    """Each fetch whose result the log holds: its url, and the seq that recorded it."""
    return {
        BRANCHES[e.step]: e.seq
        for e in log
        if e.kind in (events.STEP_COMPLETED, events.TOOL_COMPLETED) and e.step in BRANCHES
    }


def boundary_pids(log: list[events.Event]) -> list[int]:
    """The process of each boundary in the run's log: who started it, who resumed it."""
    boundaries = (events.RUN_STARTED, events.RUN_RESUMED)
    return [json.loads(e.data or "{}")["pid"] for e in log if e.kind in boundaries]


def wait_for(what: str, done: Callable[[], bool], timeout_s: float = 60.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline_s:
            print(f"    timed out waiting for {what}")
            return False
        time.sleep(0.01)
    return True


# -- the stages ------------------------------------------------------------------------------------


@dataclass
class AtKill:
    """What the killed process left behind."""

    pid: int
    recorded: dict[str, int]
    called: list[str]


def kill_mid_parallel(folder: Path) -> AtKill | None:
    """Start the agent, SIGKILL it once ``KILL_AFTER`` fetches are recorded; what it left."""
    print(f"\n[1] the agent fetches {len(URLS)} sources, {MAX_CONCURRENCY} at a time")
    sys.stdout.flush()
    proc = subprocess.Popen(this_script(folder, "--agent"))
    started = wait_for("the first fetch", (folder / "fetches.jsonl").exists)
    with Reader(folder) as reader:
        enough = wait_for(
            f"{KILL_AFTER} fetches to be recorded",
            lambda: len(recorded(reader.log())) >= KILL_AFTER or proc.poll() is not None,
        )
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        log = reader.log()
        row = reader.store.get_run(RUN_ID)
    if not (started and enough) or proc.returncode != -signal.SIGKILL:
        print(f"    FAILED: the agent was not killed mid-run (exit {proc.returncode})")
        return None
    found = AtKill(
        pid=proc.pid,
        recorded=recorded(log),
        called=[line["url"] for line in read_lines(folder / "fetches.jsonl")],
    )
    left = row.status if row is not None else "missing"
    print(f"    killed the agent (pid {proc.pid}) with SIGKILL; the run is left {left}")
    for url in URLS:
        if url in found.recorded:
            note = f"recorded at seq {found.recorded[url]}"
        elif url in found.called:
            note = "called, not recorded: lost with the process"
        else:
            note = "not begun"
        print(f"      {url:40} {note}")
    return found


def outcome(folder: Path, at_kill: AtKill) -> bool:
    """Read the run back from the database and the files; True when it did what it says."""
    print("\n[3] the outcome")
    with Reader(folder) as reader:
        log = reader.log()
        row = reader.store.get_run(RUN_ID)
    fetches = read_lines(folder / "fetches.jsonl")
    model_calls = read_lines(folder / "model_calls.jsonl")
    if row is None or len(boundary_pids(log)) != 2:
        print("    FAILED: the run, or its resumption, is missing from the database")
        return False
    result = json.loads(row.result_text or "{}")
    killed_pid, resumed_pid = boundary_pids(log)
    by_url = {url: [f["pid"] for f in fetches if f["url"] == url] for url in URLS}
    for url, pids in by_url.items():
        who = ["killed" if pid == killed_pid else "fresh" for pid in pids]
        print(f"    fetch {url:40} called by: {', '.join(who)}")
    seqs = recorded(log)
    arrived = sorted(seqs, key=seqs.__getitem__)
    print(f"    the pages arrived in the order {[URLS.index(url) for url in arrived]}")
    print(f"    the result lists them in the order {[URLS.index(u) for u in result['sources']]}")
    print(f"    summary: {result.get('summary')}")
    print(f"    `durabl show {RUN_ID} --trace`:")
    print(indented(durabl(folder, "show", RUN_ID, "--trace").stdout, "      "))
    recorded_before = set(at_kill.recorded)
    checks = {
        "some fetches recorded before the kill, some not": 0 < len(recorded_before) < len(URLS),
        "the run, begun by the killed process, completed in the fresh one": killed_pid
        == at_kill.pid
        and row.status == events.COMPLETED,
        "each fetch recorded before the kill was never made again": all(
            by_url[url] == [killed_pid] for url in recorded_before
        ),
        "each other source fetched once by the fresh process": all(
            [pid for pid in by_url[url] if pid == resumed_pid] == [resumed_pid]
            for url in URLS
            if url not in recorded_before
        ),
        "one result recorded per source": sorted(
            e.step
            for e in log
            if e.kind in (events.STEP_COMPLETED, events.TOOL_COMPLETED) and e.step in BRANCHES
        )
        == sorted(BRANCHES),
        f"no more than {MAX_CONCURRENCY} fetches out at once": max(f["inside"] for f in fetches)
        <= MAX_CONCURRENCY,
        "the pages arrived out of order, came back in order": arrived != URLS
        and result["sources"] == URLS,
        "the model summarised once, with the pages in order": [
            (call["pid"], [url for url, _title in call["prompt"]["pages"]]) for call in model_calls
        ]
        == [(resumed_pid, URLS)],
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
    folder = (args.dir or Path(tempfile.mkdtemp(prefix="durabl-parallel-"))).resolve()
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

    at_kill = kill_mid_parallel(folder)
    if at_kill is None:
        print("FAILED: the agent was not killed mid-run")
        return 1
    print("\n[2] a fresh process: Runtime(...).resume_all()")
    sys.stdout.flush()
    resumed = subprocess.run(this_script(folder, "--resume"), timeout=60).returncode == 0
    if resumed and outcome(folder, at_kill):
        print(
            "OK: the fetches recorded before the kill came back from the log without being "
            "made again, the others were made once by the fresh process, and the pages, which "
            "arrived out of order, were summarised in the order given"
        )
        return 0
    print("FAILED: the run did not finish as it should")
    return 1


if __name__ == "__main__":
    sys.exit(main())
