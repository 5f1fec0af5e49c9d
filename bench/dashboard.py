"""The dashboard's poll: what one request for a run's new events costs on a 10-step run and on a
10,000-step run, side by side, through the real HTTP server.

Each run is built once with a real ``Runtime`` (tool steps of a stub tool). The server is
``durabl.ui.server`` on a free loopback port, in this process, on its own thread; every request
is a real HTTP request. Measured, interleaved between the two runs so that the machine's drift
touches both alike:

- ``poll``: ``GET /api/runs/<id>?after=<last seq>``, the request a watching page makes twice a
  second when nothing happened: the run row and no event;
- ``poll_one``: ``after=<last seq - 1>``, one new event, as when a step has just completed;
- ``list``: ``GET /api/runs``, the run list (both runs, with their step counts).

The figure that matters is the ratio long/short of the poll medians: the page asks only for the
events after the last seq it holds, so it should stay near 1 however long the log grows. The
first load of the long run (every event, in pages of 5,000) is reported too; it is paid once.
"""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import harness
from durabl import Runtime, ToolCall, tool, workflow
from durabl.ui import server

SCHEMA = 1
SHORT, LONG = 10, 10_000


@workflow(name="bench.dashboard")
def many_steps(ctx: Any, steps: int) -> Any:
    for i in range(steps):
        yield ToolCall("note", {"i": i})
    return {"steps": steps}


def build(db: Path, runs: dict[str, int]) -> None:
    notes = tool(lambda i: {"i": i, "text": "x" * 200}, name="note", mode="IDEMPOTENT")
    with Runtime(db, tools={"note": notes}, workflows=[many_steps], durability="process") as rt:
        for run_id, steps in runs.items():
            state = rt.run(many_steps, {"steps": steps}, run_id=run_id)
            assert state.status == "COMPLETED", state


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as answer:
        body: dict[str, Any] = json.loads(answer.read())
        return body


def timed_ms(url: str) -> float:
    started = time.perf_counter()
    get(url)
    return (time.perf_counter() - started) * 1000


def first_load_ms(base: str, run_id: str) -> tuple[float, int]:
    started = time.perf_counter()
    after, count = 0, 0
    while True:
        page = get(f"{base}api/runs/{run_id}?after={after}")
        count += len(page["events"])
        if not page["more"]:
            break
        after = page["events"][-1]["seq"]
    return (time.perf_counter() - started) * 1000, count


def measure(work: Path, quick: bool) -> dict[str, Any]:
    samples = 60 if quick else 400
    db = work / "dashboard.db"
    runs = {"short": SHORT, "long": LONG}
    harness.say(f"building a {SHORT}-step and a {LONG}-step run")
    build(db, runs)
    httpd = server.serve(str(db), port=0, out=io.StringIO())
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_port}/"
    try:
        load = {r: first_load_ms(base, r) for r in runs}
        last = {r: load[r][1] for r in runs}  # seqs are 1..count
        urls = {
            r: {
                "poll": f"{base}api/runs/{r}?after={last[r]}",
                "poll_one": f"{base}api/runs/{r}?after={last[r] - 1}",
            }
            for r in runs
        }
        for r in runs:  # warm up
            for url in urls[r].values():
                timed_ms(url)
        times: dict[str, dict[str, list[float]]] = {r: {"poll": [], "poll_one": []} for r in runs}
        listing: list[float] = []
        for _ in range(samples):
            for r in runs:
                for kind, url in urls[r].items():
                    times[r][kind].append(timed_ms(url))
            listing.append(timed_ms(f"{base}api/runs"))
    finally:
        httpd.shutdown()
        httpd.server_close()
        httpd.reader.drop()
    per_run = {
        r: {
            "steps": runs[r],
            "events": last[r],
            "first_load_ms": round(load[r][0], 2),
            "poll_ms": harness.summary(times[r]["poll"], 3),
            "poll_one_ms": harness.summary(times[r]["poll_one"], 3),
        }
        for r in runs
    }
    ratio = per_run["long"]["poll_ms"]["median"] / per_run["short"]["poll_ms"]["median"]
    ratio_one = per_run["long"]["poll_one_ms"]["median"] / per_run["short"]["poll_one_ms"]["median"]
    return {
        **harness.header("dashboard", SCHEMA, quick, work, 50),
        "samples": samples,
        "runs": per_run,
        "list_ms": harness.summary(listing, 3),
        "poll_long_over_short": round(ratio, 3),
        "poll_one_long_over_short": round(ratio_one, 3),
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"dashboard poll, {report['samples']} requests each, medians{harness.quick_mark(report)}"
    ]
    for name, r in report["runs"].items():
        lines.append(
            f"  {name:<5} {r['steps']:>6} steps ({r['events']} events): poll "
            f"{r['poll_ms']['median']} ms, with one new event {r['poll_one_ms']['median']} ms, "
            f"first load {r['first_load_ms']} ms"
        )
    lines.append(
        f"  long/short: poll {report['poll_long_over_short']}, with one new event "
        f"{report['poll_one_long_over_short']}; run list {report['list_ms']['median']} ms"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return harness.main(
        argv,
        name="dashboard",
        doc=__doc__,
        quick_help="fewer requests",
        measure=measure,
        render=render,
    )


if __name__ == "__main__":
    raise SystemExit(main())
