"""Regenerate the golden event histories in tests/oracles/golden/.

Each scenario runs a workflow from tests/oracles/test_golden_histories.py for real, against the
deterministic model and tools defined there, with a fixed clock and a fixed run id, then exports
the run's events table rows (seq, kind, step, fp, data, at_s), its final row and the signals sent
to it (if any: id, name, payload, sent_s, delivered_step) as JSON. A run that made others (the
child a ChildRun started, the run a ContinueAsNew went on as, theirs in turn) carries their
histories, in the order they were made, under ``linked``. Process identities (pid, host,
runtime instance id) are normalised so that two exports are byte-identical, and so are the ids
a ContinueAsNew draws for the runs it makes: the n-th run of a chain is ``<first run>.<n>``.

    python scripts/export_golden.py                     # rewrite tests/oracles/golden/*.json
    python scripts/export_golden.py OUT_DIR             # write somewhere else
    python scripts/export_golden.py --only STEM [STEM]  # write only these scenarios' files

Some of the checked-in files were recorded by earlier versions of durabl (derived keys without
their ``durabl:`` prefix, an IDEMPOTENT tool's dispatch committed before its call), and replaying
them shows that logs written then still replay now: write a new scenario with ``--only``, which
leaves the other files as they are.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "tests") not in sys.path:
    sys.path.insert(0, str(ROOT / "tests"))

from durabl import Runtime  # noqa: E402
from durabl.crashpoints import AFTER_TOOL_RETURNED, CrashAt, ProcessDeath  # noqa: E402
from oracles import test_golden_histories as golden  # noqa: E402

START_S = 1_700_000_000.0
DEFAULT_OUT = ROOT / "tests" / "oracles" / "golden"


class FixedClock:
    """Time stands still until a scenario moves it."""

    def __init__(self) -> None:
        self.now_s = START_S

    def __call__(self) -> float:
        return self.now_s


def _runtime(
    db: Path, clock: FixedClock, workflows: dict[str, Callable[..., Any]] | None = None
) -> Runtime:
    return Runtime(
        db,
        llm=golden.golden_llm,
        tools=golden.golden_tools(),
        clock=clock,
        workflows=workflows or golden.WORKFLOWS,
    )


def research(db: Path, clock: FixedClock, run_id: str = "golden-research") -> str:
    with _runtime(db, clock) as rt:
        rt.start("golden.research", {"topic": "sea otters", "email": "a@b.c"}, run_id=run_id)
        clock.now_s += 3600
        rt.tick()
    return run_id


def research_one_event(db: Path, clock: FixedClock) -> str:
    """``research`` again, recorded since a finished IDEMPOTENT tool call is one TOOL_COMPLETED
    event (``research.json`` keeps the three events an earlier durabl wrote for it)."""
    return research(db, clock, run_id="golden-research-2")


def retry_and_fallback(db: Path, clock: FixedClock) -> str:
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.retry_and_fallback", {"n": 4}, run_id="golden-retry")
        clock.now_s += 30
        rt.tick()
    return run_id


def crash_resumed(db: Path, clock: FixedClock) -> str:
    run_id = "golden-crash-resumed"
    with _runtime(db, clock) as first, CrashAt(AFTER_TOOL_RETURNED, 1) as death:
        try:
            first.start("golden.crash_resumed", {"to": "c@d.e"}, run_id=run_id)
        except ProcessDeath:
            assert death.fired
    clock.now_s += 5
    with _runtime(db, clock) as second:
        second.resume(run_id)
    return run_id


def failing(db: Path, clock: FixedClock) -> str:
    with _runtime(db, clock) as rt:
        return rt.start("golden.failing", {"why": "the disk"}, run_id="golden-failing")


def patched(db: Path, clock: FixedClock) -> str:
    """A run that starts under the patched code: it records the marker and takes the new branch."""
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.patched", {"topic": "kelp"}, run_id="golden-patched")
        clock.now_s += 600
        rt.tick()
    return run_id


def patched_old_branch(db: Path, clock: FixedClock) -> str:
    """A run the old code leaves on its timer, finished by a process with the patched code: it
    keeps to the old branch, with no marker."""
    run_id = "golden-patched-old"
    with _runtime(db, clock, {**golden.WORKFLOWS, **golden.BEFORE_PATCH}) as before:
        before.start("golden.patched", {"topic": "kelp"}, run_id=run_id)
    clock.now_s += 600
    with _runtime(db, clock) as after:
        after.tick()
    return run_id


def signalled(db: Path, clock: FixedClock) -> str:
    """A run that parks on its approval; the answer to its second wait comes first, before
    the run reaches that wait, then the approval; its third wait is never answered."""
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.approval", {"topic": "kelp"}, run_id="golden-signalled")
        clock.now_s += 30
        rt.signal(run_id, "budget", {"amount": 30})
        clock.now_s += 30
        rt.signal(run_id, "approve", {"by": "ana"})
        rt.tick()
        clock.now_s += 600
        rt.tick()
    return run_id


def parallel(db: Path, clock: FixedClock) -> str:
    """A Parallel whose first branch fails its first attempt and backs off while the others
    finish; the retry, due after the backoff, ends it."""
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.fan_out", {"topic": "kelp"}, run_id="golden-parallel")
        clock.now_s += 30
        rt.tick()
    return run_id


def child_run(db: Path, clock: FixedClock) -> str:
    """A parent whose child sleeps: the tick that fires the child's timer ends the child,
    which makes the parent due; the next tick drives the parent on."""
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.parent", {"order": 7}, run_id="golden-child")
        clock.now_s += 300
        rt.tick()
        clock.now_s += 1
        rt.tick()
    return run_id


def continued(db: Path, clock: FixedClock) -> str:
    """Three turns by ContinueAsNew: the first parks on ``hello``; ``wrap`` is sent first,
    while no wait is for it, then ``hello``; the first turn goes on as the second, which takes
    the ``wrap`` it was handed, and on as the third."""
    with _runtime(db, clock) as rt:
        run_id = rt.start("golden.chat", {"topic": "kelp"}, run_id="golden-continued")
        clock.now_s += 30
        rt.signal(run_id, "wrap", "bye")
        clock.now_s += 30
        rt.signal(run_id, "hello", "hi")
        rt.tick()
    return run_id


SCENARIOS: dict[str, Callable[[Path, FixedClock], str]] = {
    "research": research,
    "research_one_event": research_one_event,
    "retry_and_fallback": retry_and_fallback,
    "crash_resumed": crash_resumed,
    "failing": failing,
    "patched": patched,
    "patched_old_branch": patched_old_branch,
    "signalled": signalled,
    "parallel": parallel,
    "child_run": child_run,
    "continued": continued,
}


def _normalise(data: str | None, owners: dict[str, str]) -> str | None:
    """Replace the identity of the process that wrote a boundary event with a stable name."""
    if data is None:
        return None
    value = json.loads(data)
    if isinstance(value, dict) and "owner" in value:
        value["owner"] = owners.setdefault(value["owner"], f"process-{len(owners) + 1}")
        value["pid"] = 0
        value["host"] = "golden-host"
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return data


def _history(db: Path, run_id: str) -> dict[str, Any]:
    """The run's history, and under ``linked`` those of the runs it made, with the ids a
    ContinueAsNew drew replaced by stable names."""
    with closing(sqlite3.connect(db)) as conn:
        made = _made(conn, run_id)
        histories = [_one_history(conn, one) for one in [run_id, *made]]
    names = _chain_names(histories)
    text = json.dumps(histories, sort_keys=True, ensure_ascii=False)
    for drawn, name in names.items():
        text = text.replace(drawn, name)
    history, *linked = json.loads(text)
    if linked:  # only a run that made others has the key: older files stay as recorded
        history["linked"] = linked
    return history


def _made(conn: Any, run_id: str) -> list[str]:
    """The runs ``run_id`` made, theirs in turn, in the order they were made (by the seq of
    the step that made each): its ChildRuns' children and the run its ContinueAsNew made."""
    found = []
    for (other,) in conn.execute("SELECT run_id FROM runs ORDER BY created_s, run_id").fetchall():
        (data,) = conn.execute(
            "SELECT data FROM events WHERE run_id = ? AND seq = 1", (other,)
        ).fetchone()
        started = json.loads(data)
        parent = started.get("parent")
        if started.get("continued_from") == run_id or (
            parent is not None and parent["run_id"] == run_id and "continued_from" not in started
        ):
            found.append(other)
    return [one for other in found for one in (other, *_made(conn, other))]


def _chain_names(histories: list[dict[str, Any]]) -> dict[str, str]:
    """Drawn run id -> ``<first run>.<n>``, for each run a ContinueAsNew made."""
    names: dict[str, str] = {}
    for history in histories:
        before = json.loads(history["events"][0]["data"]).get("continued_from")
        if before is not None:
            first, _, n = names.get(before, before).partition(".")
            names[history["run_id"]] = f"{first}.{int(n or 1) + 1}"
    return names


def _one_history(conn: Any, run_id: str) -> dict[str, Any]:
    workflow, input_text, status, result, error = conn.execute(
        "SELECT workflow, input, status, result, error FROM runs WHERE run_id = ?", (run_id,)
    ).fetchone()
    rows = conn.execute(
        "SELECT seq, kind, step, fp, data, at_s FROM events WHERE run_id = ? ORDER BY seq",
        (run_id,),
    ).fetchall()
    sent = conn.execute(
        "SELECT id, name, payload, sent_s, delivered_step FROM signals WHERE run_id = ? "
        "ORDER BY id",
        (run_id,),
    ).fetchall()
    owners: dict[str, str] = {}
    events = [
        {
            "seq": seq,
            "kind": kind,
            "step": step,
            "fp": fp,
            "data": _normalise(data, owners) if kind in ("RUN_STARTED", "RUN_RESUMED") else data,
            "at_s": at_s,
        }
        for seq, kind, step, fp, data, at_s in rows
    ]
    history = {
        "run_id": run_id,
        "workflow": workflow,
        "input": json.loads(input_text),
        "status": status,
        "result_text": result,
        "error": error,
        "events": events,
    }
    if sent:  # only a run that was sent signals has the key: older files stay as recorded
        history["signals"] = [
            dict(zip(("id", "name", "payload", "sent_s", "delivered_step"), row, strict=True))
            for row in sent
        ]
    return history


def export(out_dir: Path, only: list[str] | None = None) -> list[Path]:
    """Run every scenario (or those named in ``only``) in a scratch database and write one JSON
    file per scenario."""
    unknown = sorted(set(only or ()) - set(SCENARIOS))
    if unknown:
        raise SystemExit(f"no such scenario: {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as scratch:
        for stem, scenario in SCENARIOS.items():
            if only and stem not in only:
                continue
            db = Path(scratch) / f"{stem}.db"
            run_id = scenario(db, FixedClock())
            text = json.dumps(_history(db, run_id), indent=2, sort_keys=True, ensure_ascii=False)
            path = out_dir / f"{stem}.json"
            path.write_text(text + "\n", encoding="utf-8")
            written.append(path)
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="+", metavar="STEM", help="write only these scenarios")
    args = parser.parse_args(argv[1:])
    for path in export(args.out_dir, args.only):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
