"""This checkout's durabl against durabl 0.1.0, side by side on W40, in one invocation.

Both versions run the same probe script (``bench/probe.py``), each under its own interpreter:
this checkout's under the running one, 0.1.0's under ``.bench-venvs/durabl010`` (built by
``make bench-peers``). Every figure is measured in fresh processes, one side then the other
(A B A B ...), the side that goes first rotating from one round to the next, so that slow spells
of the shared machine fall on both alike. A ratio is ours / 0.1.0's, computed from the two
medians written beside it. W40 is one ``ModelCall`` to a stub model and 40 ``ToolCall``s to a
tool that appends a line to a file and returns a ~200-byte dict, registered IDEMPOTENT.
Databases live in a scratch folder on a real disk (never tmpfs: fsync must be real).

1. Per-step overhead: ``(W40 run - plain loop) / 41`` from pairs timed in one probe process
   (the plain loop, then a W40 run, again and again) on a fresh runtime and database, with
   ``durability="full"`` (0.1.0: ``synchronous="FULL"``) and ``"process"`` (``"NORMAL"``).
   Cold is each probe's first pair; warm is every pair after a few warm-up pairs, pooled over
   the probes.
2. Floors, measured inside the same probes after their runs, on a database of their own: one
   WAL commit (BEGIN IMMEDIATE, INSERT of one ~250-byte step-sized row into an events-like table
   with a (run_id, seq) index, COMMIT), synchronous=FULL in the full probes and NORMAL in the
   process probes; two such commits back to back (the AT_MOST_ONCE floor); and one commit of
   the rows one IDEMPOTENT step writes (its one event and an effect row, raw, no triggers),
   alone and just after a line appended to another file, as W40's tool appends one before
   each step's commit (on ext4 that makes the next sync dearer; no target uses it).
   Each floor is measured twice, in the two states a WAL is in, and each figure is set against
   the floor of its own state: ``cold`` on the fresh file, while every commit appends to its
   WAL (on ext4 a sync that also writes a file's new size costs about twice one that
   overwrites), the state a fresh runtime's first run commits in; ``warm`` once SQLite's
   automatic checkpoint has let the WAL start over and commits overwrite it in place, as a
   warm runtime's do. Pooled over both sides' probes: it is the same disk.
3. Dry replay: ``rt.replay(run_id, dry=True)`` (both versions have it) of a completed 1,000-step
   run built once per side, per served step; cold is the first replay in a fresh process, warm
   the later ones. And a 10,000-step run, killed by SIGKILL on entry to its 10,001st step (built
   once per side, its files copied afresh for each resume), resumed in a fresh process:
   ``Runtime()`` + ``resume`` until it returns.
4. Resume after a real SIGKILL: a fresh process runs W40 and its tool SIGKILLs the process on
   entry to tool call 21 (20 tool calls committed); the files are copied three times; a new
   process times ``Runtime(...)`` to the moment tool call 21 begins (the tool reads
   ``perf_counter`` on entry); then the floor: another new process (``bench/raw_read.py``,
   standard library only) times a raw ``sqlite3.connect`` + ``SELECT * FROM events WHERE
   run_id=? ORDER BY seq`` (``events`` is both versions' log table) fetching every row of the
   second copy, so that it pays for a first connection in a new process as the resume does.
   The resume's probe also reads the third copy raw after resuming, in its own process, where
   SQLite has been used already: reported beside the floor, not used by any target.
   Process durability on both sides, here and in 3.
5. Import: ``python -X importtime -c "import durabl"``: the cumulative microseconds on the
   ``durabl`` line, after both sides' packages are compiled to bytecode (as pip does on
   install; an editable checkout under PYTHONDONTWRITEBYTECODE would compile on every import).
6. Instructions per step, process durability, counted by ``valgrind --tool=callgrind
   --collect-atstart=no --toggle-collect=qsort_r --dump-after=qsort_r``: after warm-up runs the
   probe calls sections of N and 2N W40 runs (and of plain loops) from inside libc's qsort, and
   says which dump each section left; (2N section - N section) / (N * 41) cancels the cost of
   entering a section. A count does not depend on timing, so the two sides run at once.
7. The peers (``--peers``, default DBOS and LangGraph, in the durability benchmark's
   virtualenvs under ``.bench-venvs/``): W40 run one at a time by each runtime's throughput
   probe (``bench/throughput_peers/``), durable the way it configures itself, interleaved with
   this durabl's in full mode; per step is the wall time over the steps, the work included.

    python -m bench.compare --out bench/results/compare.json     # make bench-compare
    python -m bench.compare --quick --out /tmp/compare.json      # seconds: every path, noise
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import (
    REPO,
    filesystem_of,
    git_commit,
    peer_argv,
    peer_env,
    peer_interpreter,
    percentile,
    release_scratch,
    rotations,
    say,
    scratch_dir,
    write_json,
)

SCHEMA = 1
"""Version of the layout of the JSON this script writes."""
PROBE = Path(__file__).resolve().parent / "probe.py"
RAW_READ = Path(__file__).resolve().parent / "raw_read.py"
DEFAULT_BASELINE_VENV = ".bench-venvs/durabl010"
SIDES = ("ours", "baseline")
MODES = ("full", "process")
STEPS = 41
TOOL_CALLS = 40
KILL_AT_CALL = 21
"""W40's tool SIGKILLs its process on entry to this tool call: 20 tool calls are committed."""
PROBE_TIMEOUT_S = 900
HIDDEN_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
"""Never passed to a probe: they could point one version's interpreter at the other's code."""


@dataclass(frozen=True)
class Plan:
    """How many of everything one invocation measures."""

    rounds: int
    warmup_pairs: int
    warm_pairs: dict[str, int]
    floor_commits: int
    replay_steps: int
    replay_rounds: int
    replay_reps: int
    kill_rounds: int
    long_steps: int
    long_rounds: int
    import_reps: int
    callgrind_runs: int
    callgrind_warmup: int
    peer_rounds: int
    peer_runs: int


FULL = Plan(
    rounds=8,
    warmup_pairs=2,
    warm_pairs={"full": 20, "process": 40},
    floor_commits=150,
    replay_steps=1_000,
    replay_rounds=6,
    replay_reps=11,
    kill_rounds=8,
    long_steps=10_000,
    long_rounds=5,
    import_reps=15,
    callgrind_runs=3,
    callgrind_warmup=2,
    peer_rounds=5,
    peer_runs=20,
)
QUICK = Plan(
    rounds=1,
    warmup_pairs=1,
    warm_pairs={"full": 2, "process": 2},
    floor_commits=10,
    replay_steps=200,
    replay_rounds=1,
    replay_reps=3,
    kill_rounds=1,
    long_steps=500,
    long_rounds=1,
    import_reps=2,
    callgrind_runs=1,
    callgrind_warmup=1,
    peer_rounds=1,
    peer_runs=2,
)


@dataclass
class Session:
    """One invocation: its scratch folder, its plan, the interpreter of each side, and every
    raw sample taken so far."""

    work: Path
    plan: Plan
    pythons: dict[str, str]
    peers: Sequence[str] = ()
    samples: dict[str, Any] = field(default_factory=dict)

    def command(self, side: str, kind: str, options: dict[str, Any]) -> list[str]:
        flags = [item for k, v in options.items() for item in (f"--{k.replace('_', '-')}", str(v))]
        return [self.pythons[side], str(PROBE), kind, *flags]

    def probe(self, side: str, kind: str, *, killed: bool = False, **options: Any) -> Any:
        """Run ``probe.py KIND --OPTION VALUE ...`` under ``side``'s interpreter; its JSON.
        With ``killed``, the probe must die by SIGKILL instead (and print nothing)."""
        done = subprocess.run(
            self.command(side, kind, options),
            cwd=self.work,
            env=probe_env(),
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
        )
        expected = -signal.SIGKILL if killed else 0
        if done.returncode != expected:
            raise SystemExit(
                f"compare: the {side} probe {kind} exited {done.returncode}, expected "
                f"{expected}:\n{done.stderr}"
            )
        return None if killed else json.loads(done.stdout.strip().splitlines()[-1])

    def path(self, name: str) -> Path:
        return self.work / name


def probe_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in HIDDEN_ENV}


def alternated(rounds: int) -> Iterator[tuple[int, str]]:
    """(round, side) in the order probes run: both sides each round, the first one rotating."""
    for r, order in enumerate(rotations(SIDES, rounds)):
        for side in order:
            yield r, side


def copy_database(src: Path, dst: Path) -> None:
    """Copy a database whose writer was killed: the file, its WAL and its shared-memory index."""
    for suffix in ("", "-wal", "-shm"):
        if Path(f"{src}{suffix}").exists():
            shutil.copyfile(f"{src}{suffix}", f"{dst}{suffix}")


# -- figures from samples ---------------------------------------------------------------------


def stats(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "p95": round(percentile(values, 95), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
    }


def ratio(a: float, b: float) -> float:
    return round(a / b, 4)


def side_by_side(samples: dict[str, list[float]], digits: int = 3) -> dict[str, Any]:
    """Each side's stats, and ``ratio``: ours' median over 0.1.0's, as written here."""
    figure: dict[str, Any] = {side: stats(samples[side], digits) for side in SIDES}
    figure["ratio"] = ratio(figure["ours"]["median"], figure["baseline"]["median"])
    return figure


def by_side(probes: list[dict[str, Any]], value: Callable[[dict[str, Any]], list[float]]) -> Any:
    """``value(probe)`` of every probe, concatenated per side."""
    return {side: [v for p in probes if p["side"] == side for v in value(p)] for side in SIDES}


# -- 1 and 2: per-step overhead and the floors ------------------------------------------------


def measure_overhead(s: Session) -> dict[str, Any]:
    """The overhead figures by mode, and (under ``floors_us``) the commit floors."""
    say(f"[1/7] W40 per-step overhead and commit floors: {s.plan.rounds} round(s)")
    probes: list[dict[str, Any]] = []
    for r, mode_order in enumerate(rotations(MODES, s.plan.rounds)):
        for mode in mode_order:
            for side in rotations(SIDES, s.plan.rounds)[r]:
                tag = f"{side}-{mode}-{r}"
                result = s.probe(
                    side,
                    "w40",
                    db=s.path(f"w40-{tag}.db"),
                    outbox=s.path(f"w40-{tag}.txt"),
                    mode=mode,
                    runs=1 + s.plan.warmup_pairs + s.plan.warm_pairs[mode],
                    floor_db=s.path(f"floor-{tag}.db"),
                    floor_commits=s.plan.floor_commits,
                )
                probes.append({"side": side, "round": r, **result})
        say(f"  round {r + 1}/{s.plan.rounds}")
    s.samples["w40_probes"] = probes
    figures = {
        mode: overhead_figures([p for p in probes if p["mode"] == mode], s.plan) for mode in MODES
    }
    return {**figures, "floors_us": floor_figures(probes)}


def overhead_figures(probes: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Per-step overhead of each run over the plain loop just before it, in us; cold and warm."""
    warm = 1 + plan.warmup_pairs

    def per_step(p: dict[str, Any]) -> list[float]:
        return [(w - b) / STEPS for w, b in zip(p["run_us"], p["plain_us"], strict=True)]

    return {
        "cold_us_per_step": side_by_side(by_side(probes, lambda p: per_step(p)[:1])),
        "warm_us_per_step": side_by_side(by_side(probes, lambda p: per_step(p)[warm:])),
        "warm_run_ms": side_by_side(
            by_side(probes, lambda p: [t / 1e3 for t in p["run_us"][warm:]])
        ),
        "plain_loop_us_per_step": side_by_side(
            by_side(probes, lambda p: [t / STEPS for t in p["plain_us"][warm:]])
        ),
        "runtime_construct_ms": side_by_side(by_side(probes, lambda p: [p["construct_us"] / 1e3])),
    }


FLOORS = {
    "fsync_commit_us": ("full", "commit_us"),
    "fsync_two_commits_us": ("full", "two_commits_us"),
    "raw_commit_us": ("process", "commit_us"),
    "raw_two_commits_us": ("process", "two_commits_us"),
    "fsync_step_rows_commit_us": ("full", "step_rows_commit_us"),
    "raw_step_rows_commit_us": ("process", "step_rows_commit_us"),
    "fsync_step_rows_after_append_us": ("full", "step_rows_after_append_commit_us"),
    "raw_step_rows_after_append_us": ("process", "step_rows_after_append_commit_us"),
}
"""Each floor: the probes that measure it (by mode) and the samples it is made of."""
PHASES = ("warm", "cold")
"""The two states of a floor's WAL, named after the W40 figures each is the floor of."""


def floor_figures(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """Commit floors in each state of the WAL (``cold``: still growing, as on a fresh file;
    ``warm``: started over, as under a warm runtime), pooled over both sides' probes, with
    each side's own median beside them."""
    figures: dict[str, Any] = {}
    for phase in PHASES:
        figures[phase] = {}
        for name, (mode, key) in FLOORS.items():
            samples = {
                side: [
                    t
                    for p in probes
                    if p["mode"] == mode and p["side"] == side
                    for t in p["floors"][phase][key]
                ]
                for side in SIDES
            }
            figures[phase][name] = {
                **stats(samples["ours"] + samples["baseline"]),
                "median_by_side": {side: stats(samples[side])["median"] for side in SIDES},
            }
    figures["row_payload_bytes"] = sorted({p["floors"]["payload_bytes"] for p in probes})
    figures["fill_commits_to_restart_the_wal"] = sorted(
        {p["floors"]["fill_commits"] for p in probes}
    )
    return figures


# -- 3: dry replay and the long resume --------------------------------------------------------


def measure_replay(s: Session) -> dict[str, Any]:
    say(f"[2/7] dry replay of a completed {s.plan.replay_steps:,}-step run")
    tools = s.plan.replay_steps - 1
    for side in SIDES:
        s.probe(
            side,
            "build",
            db=s.path(f"replay-{side}.db"),
            outbox=s.path(f"replay-{side}.txt"),
            run_id="replayed",
            tools=tools,
        )
    probes = []
    for r, side in alternated(s.plan.replay_rounds):
        result = s.probe(
            side,
            "replay",
            db=s.path(f"replay-{side}.db"),
            outbox=s.path(f"replay-{side}.txt"),
            run_id="replayed",
            tools=tools,
            reps=s.plan.replay_reps,
        )
        probes.append({"side": side, "round": r, **result})
    s.samples["replay_probes"] = probes
    return {
        "steps": s.plan.replay_steps,
        "method": "rt.replay(run_id, dry=True) on both sides",
        "cold_us_per_served_step": side_by_side(
            by_side(probes, lambda p: [t / p["steps"] for t in p["replay_us"][:1]])
        ),
        "warm_us_per_served_step": side_by_side(
            by_side(probes, lambda p: [t / p["steps"] for t in p["replay_us"][1:]])
        ),
    }


def measure_long_resume(s: Session) -> dict[str, Any]:
    steps = s.plan.long_steps
    say(f"[3/7] resume of a run killed after {steps:,} steps")
    build_s = {}
    for side in SIDES:
        t0 = time.perf_counter()
        s.probe(
            side,
            "build",
            killed=True,
            db=s.path(f"long-{side}.db"),
            outbox=s.path(f"long-{side}.txt"),
            run_id="long",
            tools=steps,
            kill_at_call=steps,
        )
        build_s[side] = round(time.perf_counter() - t0, 2)
    probes = [
        {
            "side": side,
            "round": r,
            **resume_copy(
                s, side, s.path(f"long-{side}.db"), f"long-{side}-{r}", "long", steps, steps
            ),
        }
        for r, side in alternated(s.plan.long_rounds)
    ]
    s.samples["long_resume_probes"] = probes
    return {
        "steps_completed_before_kill": steps,
        "killed_on_entry_to_tool_call": steps,
        "durability": "process",
        "build_s": build_s,
        **resume_figures(probes),
    }


def resume_copy(
    s: Session, side: str, killed_db: Path, tag: str, run_id: str, tools: int, expect_call: int
) -> Any:
    """Resume a fresh copy of a killed run's files in a new process, which then reads a second
    copy raw; then read a third copy raw in a new process of its own (the floor)."""
    db, raw_copy, floor_copy = (s.path(f"{tag}{name}.db") for name in ("", "-raw", "-floor"))
    for copy in (db, raw_copy, floor_copy):
        copy_database(killed_db, copy)
    resumed = s.probe(
        side,
        "resume",
        db=db,
        outbox=s.path(f"{tag}.txt"),
        run_id=run_id,
        tools=tools,
        raw_copy=raw_copy,
        expect_call=expect_call,
    )
    done = subprocess.run(
        [s.pythons[side], str(RAW_READ), "--db", str(floor_copy), "--run-id", run_id],
        cwd=s.work,
        env=probe_env(),
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        check=True,
    )
    floor = json.loads(done.stdout.strip().splitlines()[-1])
    if floor["raw_rows"] != resumed["raw_rows"]:
        raise SystemExit(f"compare: the raw reads of {tag} disagree: {floor} and {resumed}")
    return {
        **resumed,
        "raw_read_in_process_us": resumed["raw_read_us"],
        "raw_read_us": floor["raw_read_us"],
    }


def resume_figures(probes: list[dict[str, Any]]) -> dict[str, Any]:
    """Resume timings in ms side by side, and each side's time to the first new step over the
    raw read of its own log in a fresh process."""

    def ms(key: str) -> dict[str, Any]:
        return side_by_side(by_side(probes, lambda p: [p[key] / 1e3]))

    figures: dict[str, Any] = {
        "runtime_to_first_new_step_ms": ms("first_new_step_us"),
        "runtime_and_resume_ms": ms("resume_total_us"),
        "runtime_construct_ms": ms("construct_us"),
        "raw_open_and_read_ms": ms("raw_read_us"),
        "raw_open_and_read_after_resume_ms": ms("raw_read_in_process_us"),
        "raw_rows": {
            side: sorted(set(rows))
            for side, rows in by_side(probes, lambda p: [p["raw_rows"]]).items()
        },
    }
    figures["first_new_step_over_raw_read"] = {
        side: ratio(
            figures["runtime_to_first_new_step_ms"][side]["median"],
            figures["raw_open_and_read_ms"][side]["median"],
        )
        for side in SIDES
    }
    return figures


# -- 4: resume after a SIGKILL at step 20 -----------------------------------------------------


def measure_kill_resume(s: Session) -> dict[str, Any]:
    say(
        f"[4/7] W40 killed on entry to tool call {KILL_AT_CALL}, resumed: "
        f"{s.plan.kill_rounds} round(s)"
    )
    probes = []
    for r, side in alternated(s.plan.kill_rounds):
        tag = f"kill-{side}-{r}"
        killed_db = s.path(f"{tag}-killed.db")
        s.probe(
            side,
            "build",
            killed=True,
            db=killed_db,
            outbox=s.path(f"{tag}.txt"),
            run_id=tag,
            kill_at_call=KILL_AT_CALL,
        )
        result = resume_copy(s, side, killed_db, tag, tag, TOOL_CALLS, KILL_AT_CALL)
        probes.append({"side": side, "round": r, **result})
    s.samples["kill_resume_probes"] = probes
    return {
        "killed_on_entry_to_tool_call": KILL_AT_CALL,
        "tool_calls_committed_before_kill": KILL_AT_CALL - 1,
        "durability": "process",
        **resume_figures(probes),
    }


# -- 5: import --------------------------------------------------------------------------------


IMPORT_LINE = re.compile(r"^import time:\s*\d+\s*\|\s*(\d+)\s*\|\s*durabl\s*$")


def measure_import(s: Session) -> dict[str, Any]:
    say(f"[5/7] import durabl: {s.plan.import_reps} each")
    samples: dict[str, list[float]] = {side: [] for side in SIDES}
    for side in SIDES:
        compile_package(s.pythons[side], s.work)
    for _, side in alternated(s.plan.import_reps):
        done = subprocess.run(
            [s.pythons[side], "-X", "importtime", "-c", "import durabl"],
            cwd=s.work,
            env=probe_env(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        found = [m for m in map(IMPORT_LINE.match, done.stderr.splitlines()) if m]
        if len(found) != 1:
            raise SystemExit(f"compare: no 'durabl' line in -X importtime's output:\n{done.stderr}")
        samples[side].append(float(found[0].group(1)))
    s.samples["import_cumulative_us"] = samples
    return {"cumulative_us": side_by_side(samples, digits=1)}


def compile_package(python: str, cwd: Path) -> None:
    """Compile ``python``'s durabl to bytecode, as pip does on install, so that neither side
    pays for compiling its source (an editable checkout under PYTHONDONTWRITEBYTECODE would,
    on every import)."""
    where = subprocess.run(
        [python, "-c", "import durabl, os; print(os.path.dirname(durabl.__file__))"],
        cwd=cwd,
        env=probe_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    subprocess.run([python, "-m", "compileall", "-q", where], cwd=cwd, env=probe_env(), check=True)


# -- 7: the peers ----------------------------------------------------------------------------


PEER_MODE = "default"
"""How each peer's probe is asked to run: durable the way the peer configures itself."""


def missing_peers(peers: Sequence[str]) -> str | None:
    """One line naming the peers whose virtualenv is not there, or None."""
    missing = [p for p in peers if p and not peer_interpreter(p).exists()]
    if not missing:
        return None
    return (
        f"compare: no virtualenv for {', '.join(missing)} under .bench-venvs/: run make "
        "bench-peers (or pass --peers with the ones you have)"
    )


def measure_peers(s: Session) -> dict[str, Any]:
    """W40 on the peers next to this durabl, each the way it is made durable in the throughput
    benchmark (its own probe, its own interpreter, one run at a time), rounds interleaved with
    the side that goes first rotating. Per step: the run's wall time over its 41 steps, the
    tool and the model included (a peer has no plain-loop twin in its probe)."""
    peers = [p for p in s.peers if p]
    say(f"[7/7] peers on W40, one run at a time: {', '.join(peers) or 'none'}")
    problem = missing_peers(peers)
    if problem:
        raise SystemExit(problem)
    sides = ["durabl-full", *peers]
    samples: dict[str, list[float]] = {side: [] for side in sides}
    for r, order in enumerate(rotations(sides, s.plan.peer_rounds)):
        for side in order:
            runtime, mode = ("durabl", "full") if side == "durabl-full" else (side, PEER_MODE)
            if side == "durabl":  # the stand-in peer: this durabl in its other mode
                mode = "process"
            folder = s.path(f"peer-{side}-{r}")
            argv = peer_argv(
                runtime,
                *("--work", folder, "--concurrency", 1, "--runs", s.plan.peer_runs),
                *("--sleep-s", 0.0, "--mode", mode),
            )
            done = subprocess.run(
                argv,
                cwd=REPO,
                env=peer_env(runtime),
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
            )
            if done.returncode != 0:
                raise SystemExit(
                    f"compare: the {side} probe exited {done.returncode}:\n{done.stderr}"
                )
            out = json.loads(done.stdout.strip().splitlines()[-1])
            samples[side].append(round(1e6 / out["steps_per_s"], 1))
    s.samples["peer_us_per_step"] = samples
    ours = stats(samples["durabl-full"])
    return {
        "how": "each runtime's throughput probe, one run at a time, 1 model call + 40 tool calls; "
        "us per step = wall time / steps, the work itself included",
        "runs_per_sample": s.plan.peer_runs,
        "us_per_step": {side: stats(v) for side, v in samples.items()},
        "ratio_durabl_over": {
            peer: ratio(ours["median"], stats(samples[peer])["median"]) for peer in peers
        },
    }


# -- 6: instructions --------------------------------------------------------------------------


CALLGRIND = (
    "--tool=callgrind",
    "--collect-atstart=no",
    "--toggle-collect=qsort_r",
    "--dump-after=qsort_r",
)


def measure_instructions(s: Session) -> dict[str, Any]:
    n = s.plan.callgrind_runs
    say(
        f"[6/7] instructions per step under callgrind: sections of {n} and {2 * n} runs, "
        f"both sides at once"
    )
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("compare: valgrind not found; install it (apt-get install valgrind)")
    running = {}
    for side in SIDES:
        dumps = s.path(f"callgrind-{side}")
        probe = s.command(
            side,
            "callgrind",
            {
                "db": s.path(f"callgrind-{side}.db"),
                "outbox": s.path(f"callgrind-{side}.txt"),
                "n": n,
                "warmup": s.plan.callgrind_warmup,
                "dump_prefix": dumps,
            },
        )
        running[side] = subprocess.Popen(
            [valgrind, *CALLGRIND, f"--callgrind-out-file={dumps}.%p.out", *probe],
            cwd=s.work,
            env=probe_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    counted = {side: callgrind_sections(side, proc) for side, proc in running.items()}
    s.samples["callgrind_sections"] = counted
    figures: dict[str, Any] = {
        "method": "callgrind --toggle-collect=qsort_r; (2N-run section - N-run section) / (N*41)",
        "runs_per_section": [n, 2 * n],
        "durability": "process",
    }
    for side in SIDES:
        w40 = per_step_instructions(counted[side], "w40")
        plain = per_step_instructions(counted[side], "plain")
        figures[side] = {
            "w40_per_step": w40,
            "plain_loop_per_step": plain,
            "overhead_per_step": w40 - plain,
        }
    for key in ("w40_per_step", "overhead_per_step"):
        figures[f"ratio_{key}"] = ratio(figures["ours"][key], figures["baseline"][key])
    return figures


def callgrind_sections(side: str, proc: subprocess.Popen[str]) -> list[dict[str, Any]]:
    """Wait for a callgrind probe; its sections, each with the instructions of its dumps."""
    stdout, stderr = proc.communicate(timeout=PROBE_TIMEOUT_S)
    if proc.returncode != 0:
        raise SystemExit(f"compare: the {side} callgrind probe failed:\n{stderr}")
    sections: list[dict[str, Any]] = json.loads(stdout.strip().splitlines()[-1])["sections"]
    for section in sections:
        if not section["dumps"]:
            raise SystemExit(f"compare: the {side} callgrind probe left no dump for {section}")
        section["instructions"] = sum(instructions_in(Path(d)) for d in section["dumps"])
        section["dumps"] = [Path(d).name for d in section["dumps"]]
    return sections


def instructions_in(dump: Path) -> int:
    """The ``summary:`` line (instructions executed) of one callgrind dump."""
    for line in dump.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise SystemExit(f"compare: {dump} has no summary line")


def per_step_instructions(sections: list[dict[str, Any]], kind: str) -> int:
    """(instructions of the 2N-run section - those of the N-run one) / (N * 41)."""
    short, long = sorted((x for x in sections if x["kind"] == kind), key=lambda x: x["runs"])
    return round(
        (long["instructions"] - short["instructions"]) / ((long["runs"] - short["runs"]) * STEPS)
    )


# -- targets ----------------------------------------------------------------------------------


def assess(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """Each design target: the figure it bounds, the limit, and whether this run met it."""
    over, all_floors = figures["per_step_overhead"], figures["floors_us"]
    replay, kill, long = figures["dry_replay"], figures["resume_after_kill"], figures["long_resume"]
    targets = []
    for when in PHASES:
        full = over["full"][f"{when}_us_per_step"]["ours"]["median"]
        process = over["process"][f"{when}_us_per_step"]
        floors = all_floors[
            when
        ]  # a warm runtime's commits overwrite its WAL; a cold one's grow it
        targets += [
            target(
                f"full per-step overhead ({when}) / one fsync'd commit",
                ratio(full, floors["fsync_commit_us"]["median"]),
                1.5,
            ),
            target(f"process per-step overhead ({when}) / 0.1.0's", process["ratio"], 0.25),
            target(
                f"process per-step overhead ({when}) / one raw commit",
                ratio(process["ours"]["median"], floors["raw_commit_us"]["median"]),
                4.0,
            ),
            target(
                f"process per-step overhead ({when}) / one raw commit of the step's rows",
                ratio(process["ours"]["median"], floors["raw_step_rows_commit_us"]["median"]),
                4.0,
            ),
            target(
                f"dry replay per served step ({when}) / 0.1.0's",
                replay[f"{when}_us_per_served_step"]["ratio"],
                0.2,
            ),
        ]
    return [
        *targets,
        target(
            f"Runtime() + resume of a {long['steps_completed_before_kill']:,}-step run, s",
            round(long["runtime_and_resume_ms"]["ours"]["median"] / 1e3, 4),
            0.3,
        ),
        target(
            "after SIGKILL, Runtime() to first new step / 0.1.0's",
            kill["runtime_to_first_new_step_ms"]["ratio"],
            0.5,
        ),
        target(
            "after SIGKILL, Runtime() to first new step / raw read",
            kill["first_new_step_over_raw_read"]["ours"],
            2.0,
        ),
        target("import durabl / 0.1.0's", figures["import"]["cumulative_us"]["ratio"], 0.4),
    ]


def target(name: str, value: float, limit: float) -> dict[str, Any]:
    return {"target": name, "value": value, "limit": limit, "met": value <= limit}


# -- the machine ------------------------------------------------------------------------------


def machine(s: Session) -> dict[str, Any]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "driver_python": platform.python_version(),
        "driver_sqlite": sqlite3.sqlite_version,
        "scratch_dir": str(s.work),
        "scratch_filesystem": filesystem_of(s.work),
        "git_commit": git_commit(),
        "sides": {side: s.probe(side, "info") for side in SIDES},
    }


# -- the run ----------------------------------------------------------------------------------


PARTS: tuple[tuple[str, Callable[[Session], dict[str, Any]]], ...] = (
    ("per_step_overhead", measure_overhead),
    ("dry_replay", measure_replay),
    ("long_resume", measure_long_resume),
    ("resume_after_kill", measure_kill_resume),
    ("import", measure_import),
    ("instructions", measure_instructions),
    ("peers", measure_peers),
)


def measure(s: Session, quick: bool) -> dict[str, Any]:
    report: dict[str, Any] = {
        "benchmark": "compare",
        "schema": SCHEMA,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine(s),
        "workload": {
            "steps": STEPS,
            "model_calls": 1,
            "tool_calls": TOOL_CALLS,
            "tool_mode": "IDEMPOTENT",
        },
        "plan": asdict(s.plan),
    }
    figures: dict[str, Any] = {}
    phase_s: dict[str, float] = {}
    for name, part in PARTS:
        t0 = time.perf_counter()
        figures[name] = part(s)
        phase_s[name] = round(time.perf_counter() - t0, 1)
    figures["floors_us"] = figures["per_step_overhead"].pop("floors_us")
    report["figures"] = figures
    report["targets"] = assess(figures)
    report["phase_s"] = phase_s
    report["samples"] = s.samples
    return report


# -- the printed table ------------------------------------------------------------------------


def fmt(value: float) -> str:
    """Three significant figures or more, never an exponent."""
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def render(report: dict[str, Any]) -> str:
    f, m = report["figures"], report["machine"]
    ours, base = m["sides"]["ours"], m["sides"]["baseline"]
    lines = [
        f"durabl {ours['durabl_version']} (this checkout, {m['git_commit']}) vs durabl "
        f"{base['durabl_version']} on W40: {m['cpu_count']} CPUs, Python {ours['python_version']}, "
        f"SQLite {ours['sqlite_version']}, scratch on {m['scratch_filesystem']}"
        + ("  [QUICK: figures are noise]" if report["quick"] else ""),
        "",
        f"{'median [p95]':<44} {'ours':>22} {base['durabl_version']:>22} {'ratio':>7}",
    ]

    def row(name: str, figure: dict[str, Any], unit: str) -> None:
        cells = [f"{fmt(figure[x]['median'])} [{fmt(figure[x]['p95'])}] {unit}" for x in SIDES]
        lines.append(f"{name:<44} {cells[0]:>22} {cells[1]:>22} {figure['ratio']:>7.3f}")

    for mode in MODES:
        over = f["per_step_overhead"][mode]
        row(f"per-step overhead, {mode}, cold", over["cold_us_per_step"], "us")
        row(f"per-step overhead, {mode}, warm", over["warm_us_per_step"], "us")
    replay, long, kill = f["dry_replay"], f["long_resume"], f["resume_after_kill"]
    for when in ("cold", "warm"):
        row(
            f"dry replay per served step ({replay['steps']:,}), {when}",
            replay[f"{when}_us_per_served_step"],
            "us",
        )
    row(
        f"Runtime() + resume, {long['steps_completed_before_kill']:,}-step run",
        long["runtime_and_resume_ms"],
        "ms",
    )
    row(
        f"after SIGKILL: Runtime() to tool call {KILL_AT_CALL}",
        kill["runtime_to_first_new_step_ms"],
        "ms",
    )
    row("after SIGKILL: raw open + read, own process", kill["raw_open_and_read_ms"], "ms")
    row(
        "after SIGKILL: raw open + read, after resume",
        kill["raw_open_and_read_after_resume_ms"],
        "ms",
    )
    row("import durabl (cumulative)", f["import"]["cumulative_us"], "us")
    ins = f["instructions"]
    cells = [f"{ins[x]['w40_per_step']:,} ({ins[x]['overhead_per_step']:,})" for x in SIDES]
    lines.append(
        f"{'instructions per step, process (overhead)':<44} {cells[0]:>22} "
        f"{cells[1]:>22} {ins['ratio_w40_per_step']:>7.3f}"
    )
    peers = f["peers"]
    lines += [
        "",
        "W40 against the peers, one run at a time, us per step, median [p95] (ratio: ours / theirs)",
    ]
    for side, figure in peers["us_per_step"].items():
        versus = peers["ratio_durabl_over"].get(side)
        lines.append(
            f"  {side:<14} {fmt(figure['median']):>9} [{fmt(figure['p95'])}]"
            + ("" if versus is None else f"   {versus:.3f}")
        )
    lines.append("")
    for phase in PHASES:
        fl = f["floors_us"][phase]
        lines.append(
            f"{phase} floors (WAL {'started over' if phase == 'warm' else 'growing'}), both "
            "sides' probes pooled, median [p95]: "
            + ", ".join(
                f"{k.removesuffix('_us').replace('_', ' ')} {fmt(fl[k]['median'])} "
                f"[{fmt(fl[k]['p95'])}] us"
                for k in FLOORS
            )
        )
    lines += [
        "",
        f"{'target':<58} {'value':>8} {'limit':>6}",
    ]
    for t in report["targets"]:
        verdict = "met" if t["met"] else "missed"
        lines.append(f"{t['target']:<58} {fmt(t['value']):>8} {t['limit']:>6}  {verdict}")
    return "\n".join(lines)


# -- the command line -------------------------------------------------------------------------


def baseline_python(args: argparse.Namespace) -> str:
    """The baseline's interpreter: --baseline-python, else the venv's, which must exist."""
    if args.baseline_python:
        return os.path.abspath(args.baseline_python)
    venv = Path(args.baseline_venv)
    python = (venv if venv.is_absolute() else REPO / venv) / "bin" / "python"
    if not python.exists():
        raise SystemExit(
            f"compare: durabl 0.1.0's virtualenv {venv} is missing (no {python}); "
            f"build it with `make bench-peers`"
        )
    return str(python)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.compare", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--out",
        default=str(REPO / "bench" / "results" / "compare.json"),
        help="where to write the JSON figures",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one round of everything, a few runs each: exercises every path, figures are noise",
    )
    parser.add_argument(
        "--baseline-venv",
        default=DEFAULT_BASELINE_VENV,
        help="durabl 0.1.0's virtualenv, built by make bench-peers (default %(default)s)",
    )
    parser.add_argument(
        "--baseline-python",
        help="the baseline's interpreter instead of the venv's (whatever durabl it imports)",
    )
    parser.add_argument(
        "--ours-python",
        default=sys.executable,
        help="the interpreter that imports this checkout's durabl (default: this one)",
    )
    parser.add_argument(
        "--peers",
        default="dbos,langgraph",
        help="comma-separated peers whose virtualenvs are under .bench-venvs/ (default %(default)s)",
    )
    parser.add_argument("--tmp-dir", help="directory (on a real disk) for the scratch databases")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    pythons = {"ours": os.path.abspath(args.ours_python), "baseline": baseline_python(args)}
    problem = missing_peers(args.peers.split(","))
    if problem:
        raise SystemExit(problem)
    started = time.perf_counter()
    work = scratch_dir(args.tmp_dir, prefix="compare-")
    try:
        session = Session(work, QUICK if args.quick else FULL, pythons, peers=args.peers.split(","))
        report = measure(session, bool(args.quick))
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
    finally:
        release_scratch(work, args.keep)
    out = write_json(args.out, report)
    print(render(report))
    print(f"\nwrote {out} in {report['elapsed_s']} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
