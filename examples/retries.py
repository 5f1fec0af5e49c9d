"""Retries are durable timers: a flaky tool, its backoff, and a tool that never recovers.

The agent fetches a forecast from a flaky weather API, tries to fetch a quote from an API that
is down for good, and asks a (stub) model to write a line from what it got.

- ``fetch_forecast`` fails its first three calls with ConnectionError, then succeeds. It has a
  ``RetryPolicy(max_attempts=5, base_delay=0.2, multiplier=2)``: after each failure durabl
  records the error and the time of the next attempt (0.2 s, then 0.4 s, then 0.8 s later) and
  parks the run SLEEPING. No thread waits: ``rt.run`` / ``rt.tick`` return, and whichever
  process calls ``tick()`` once the deadline has passed makes the next attempt.
- ``fetch_quote`` always fails. After its third attempt the policy gives up and durabl throws
  ``ToolFailed`` into the workflow, which catches it and falls back to a canned quote.

    python examples/retries.py              # files in a fresh temporary folder
    python examples/retries.py --dir DIR    # the database and the attempts log in DIR

Every attempt prints its time since the start; at the end the backoffs durabl scheduled are
read back from the run's log, and the run's metrics are printed (``rt.metrics``; from a shell,
``durabl --db DIR/retries.db metrics RUN``). Exit status 0 when the run completed with the
forecast after 4 attempts and the fallback quote after 3, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

from durabl import (
    ModelCall,
    RetryPolicy,
    Runtime,
    ToolCall,
    ToolFailed,
    ToolMode,
    events,
    tool,
    workflow,
)

RUN_ID = "weather-report"
RUN_INPUT = {"city": "Lisbon"}
FLAKY_FAILURES = 3
"""How many calls ``fetch_forecast`` fails before the API recovers."""

FORECAST_POLICY = RetryPolicy(max_attempts=5, base_delay=0.2, multiplier=2.0)
QUOTE_POLICY = RetryPolicy(max_attempts=3, base_delay=0.2, multiplier=2.0)
FALLBACK_QUOTE = "No quote today: the quote service is down."


# -- the workflow ----------------------------------------------------------------------------


@workflow(name="weather_report")
def weather_report(ctx: Any, city: str) -> Any:
    forecast = yield ToolCall("fetch_forecast", {"city": city})
    try:
        quote = yield ToolCall("fetch_quote", {"topic": "weather"})
    except ToolFailed as failed:
        # Raised once the policy gave up; on replay the same failure is thrown here again, so
        # the workflow takes the same branch without calling the tool.
        quote = {"text": FALLBACK_QUOTE, "gave_up_after": failed.attempts}
    line = yield ModelCall(f"Write one line about {city}", forecast=forecast, quote=quote)
    return {"forecast": forecast, "quote": quote, "line": line["text"]}


# -- the outside world: two APIs and a stub model --------------------------------------------


class Attempts:
    """The APIs' side of the world: one JSON line per call they received."""

    def __init__(self, path: Path, t0: float) -> None:
        self.path, self.t0 = path, t0

    def record(self, api: str, outcome: str) -> int:
        """Log a call; returns its number among this API's calls (1-based)."""
        n = sum(1 for line in self.lines() if line["api"] == api) + 1
        at = time.time() - self.t0
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({"api": api, "n": n, "t": round(at, 3), "outcome": outcome}))
            handle.write("\n")
        print(f"  t=+{at:5.2f} s  {api} attempt {n}: {outcome}", flush=True)
        return n

    def lines(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]

    def calls(self, api: str) -> int:
        return sum(1 for line in self.lines() if line["api"] == api)


def make_tools(attempts: Attempts) -> dict[str, Any]:
    def fetch_forecast(city: str) -> dict[str, Any]:
        if attempts.calls("fetch_forecast") < FLAKY_FAILURES:
            attempts.record("fetch_forecast", "ConnectionError")
            raise ConnectionError("weather API answered 503")
        attempts.record("fetch_forecast", "ok")
        return {"city": city, "sky": "sunny", "high_c": 24}

    def fetch_quote(topic: str) -> dict[str, Any]:
        attempts.record("fetch_quote", "TimeoutError")
        raise TimeoutError("quote API did not answer")

    return {
        "fetch_forecast": tool(fetch_forecast, mode=ToolMode.IDEMPOTENT, retry=FORECAST_POLICY),
        "fetch_quote": tool(fetch_quote, mode=ToolMode.IDEMPOTENT, retry=QUOTE_POLICY),
    }


def stub_model(prompt: str, **params: Any) -> dict[str, Any]:
    """A deterministic stand-in for an LLM."""
    sky = params["forecast"]["sky"]
    return {
        "text": f"{prompt.removeprefix('Write one line about ')}: {sky}. {params['quote']['text']}"
    }


# -- driving the run and reading it back -----------------------------------------------------


def drive(rt: Runtime, t0: float) -> str:
    """Start the run, then keep firing its retry timers as they come due. Between attempts
    the run is SLEEPING in the database; this loop only waits for the deadline and ticks."""
    state = rt.run(weather_report, RUN_INPUT, run_id=RUN_ID)
    while state.status == events.SLEEPING and state.wake_at_s is not None:
        print(
            f"  t=+{time.time() - t0:5.2f} s  run parked {state.status}, "
            f"next attempt due at t=+{state.wake_at_s - t0:.2f} s"
        )
        time.sleep(max(0.0, state.wake_at_s - time.time()))
        rt.tick()  # fires the due retry timer and drives the run on to its next park or end
        state = rt.state(RUN_ID)
    return state.status


def scheduled_backoffs(rt: Runtime) -> list[tuple[str, int, float]]:
    """(tool, failed attempt, seconds until the next attempt) for each STEP_RETRY in the log:
    the delays durabl recorded, not how long this script happened to sleep."""
    names: dict[int, str] = {}
    found = []
    for event in rt.store.load_log(RUN_ID):
        if event.kind == events.STEP_STARTED:
            names[event.step] = json.loads(event.data or "[]")[1]
        elif event.kind == events.STEP_RETRY:
            data = json.loads(event.data or "{}")
            delay = data["retry_at_s"] - event.at_s
            found.append((names[event.step], data["attempt"], delay))
    return found


def growing(delays: list[float]) -> bool:
    """True when there are delays and each is longer than the one before."""
    return bool(delays) and all(a < b for a, b in pairwise(delays))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, help="folder for the files (default: a temp folder)")
    args = parser.parse_args(argv)
    folder = args.dir or Path(tempfile.mkdtemp(prefix="durabl-retries-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "retries.db"
    for stale in (db, Path(f"{db}-wal"), Path(f"{db}-shm"), folder / "attempts.jsonl"):
        stale.unlink(missing_ok=True)
    print(f"files in {folder}\n")

    t0 = time.time()
    attempts = Attempts(folder / "attempts.jsonl", t0)
    with Runtime(db, llm=stub_model, tools=make_tools(attempts)) as rt:
        status = drive(rt, t0)
        result = rt.result(RUN_ID) if status == events.COMPLETED else None
        print(f"\nrun {RUN_ID}: {status}")
        print(f"  result: {json.dumps(result, sort_keys=True)}")

        print("\nbackoffs durabl scheduled (from the run's log):")
        for name, failed, delay in scheduled_backoffs(rt):
            print(f"  {name:<15} after attempt {failed}: next attempt {delay:.2f} s later")

        m = rt.metrics(RUN_ID)
        print("\nmetrics (rt.metrics):")
        print(
            f"  steps={m.steps} tool_calls={m.tool_calls} model_calls={m.model_calls} "
            f"attempts={m.attempts} retries={m.retries} failed_steps={m.failed_steps}"
        )
        print(f"  wall_s={m.wall_s:.2f} step_s={m.step_s:.2f}")
        backoffs = scheduled_backoffs(rt)

    ok = (
        status == events.COMPLETED
        and attempts.calls("fetch_forecast") == FLAKY_FAILURES + 1
        and attempts.calls("fetch_quote") == QUOTE_POLICY.max_attempts
        and result is not None
        and result["quote"]["text"] == FALLBACK_QUOTE
        and growing([d for name, _, d in backoffs if name == "fetch_forecast"])
    )
    print("\nOK: retried durably, fell back once the policy gave up" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
