"""One measurement of one durabl, in a process of its own, printed as one JSON object.

``bench/compare.py`` runs this script under two interpreters, this checkout's ``.venv`` and
durabl 0.1.0's virtualenv, so it imports only the standard library and whichever ``durabl`` the
interpreter has, and finds out which API that is. Both spell the workload the same way
(``Runtime(db, llm=, tools=)``, ``@workflow(name=)``, ``ModelCall``, ``ToolCall``,
``tool(fn, name=, mode=)``, ``run``, ``resume``, ``replay(run_id, dry=True)``); only the
durability setting differs: this checkout takes ``durability="full"|"process"``, 0.1.0 takes
``synchronous="FULL"|"NORMAL"``, the same two settings ("full" fsyncs the WAL on commit,
"process" leaves a commit to the OS, which survives the death of the process).

The workload is W40: one ``ModelCall`` to a stub model that answers at once, then 40
``ToolCall``s to a tool that appends a line to a file and returns a ~200-byte dict, registered
IDEMPOTENT. ``plain_loop`` makes the same calls with no runtime.

Kinds (``python bench/probe.py KIND --help``):

- ``info``: the interpreter, SQLite and durabl this process runs with.
- ``w40``: a fresh runtime on a fresh database: the plain loop then one W40 run, again and again,
  each timed; the first pair is cold (first of its kind in the process). Then the commit floors
  on a database of their own: single commits, pairs of commits and commits of one step's rows,
  while its WAL still grows (cold) and once SQLite has started it over (warm).
- ``build``: start one run of 1 + N steps. ``--kill-at-call K`` makes the tool SIGKILL its own
  process on entry to tool call K, leaving the run unfinished with K steps completed.
- ``replay``: dry replays of a completed run on a fresh runtime: the first (cold), the rest (warm).
- ``resume``: ``Runtime()`` then ``resume`` of a killed run, timed to the moment the first new
  tool call begins; then a raw ``sqlite3`` open and read of the run's events from a copy of the
  same files.
- ``callgrind``: W40 runs and plain loops called from inside libc's ``qsort`` (through ctypes;
  glibc's ``qsort`` runs ``qsort_r``), so that ``valgrind --tool=callgrind --collect-atstart=no
  --toggle-collect=qsort_r --dump-after=qsort_r`` counts exactly them: sections of N and of 2N
  runs of each, one dump per section.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import signal
import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any

import durabl
from durabl import ModelCall, Runtime, ToolCall, tool, workflow

# The raw read of a run's log (bench/raw_read.py), and the W40 workload without any runtime,
# standard library only, shared with the throughput probes (bench/throughput.py checks it
# against bench/workload.py); run as a script, this file's folder (bench/) is on the path.
from raw_read import RAW_READ
from throughput_peers.kit import STEPS, TOOL_CALLS, TOPIC, result_of
from throughput_peers.kit import stub_model as stub_llm

TOOL_NAME = "append_line"
WORKFLOW_NAME = "bench.probe.wn"
FLOOR_SCHEMA = """CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    seq    INTEGER NOT NULL,
    kind   TEXT NOT NULL,
    step   INTEGER NOT NULL,
    data   TEXT,
    at_s   REAL NOT NULL,
    crc    INTEGER NOT NULL,
    PRIMARY KEY (run_id, seq)
)"""
"""The floor's table: an events table's columns and its (run_id, seq) index."""
FLOOR_INSERT = (
    "INSERT INTO events (run_id, seq, kind, step, data, at_s, crc) "
    "VALUES (:run_id, :seq, 'STEP_COMPLETED', :seq, :data, :at_s, 0)"
)
STEP_ROWS_SCHEMA = """CREATE TABLE IF NOT EXISTS effects (
    key    TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    step   INTEGER NOT NULL,
    result TEXT,
    at_s   REAL NOT NULL
) WITHOUT ROWID"""
"""The second table a step's rows go to: one row per effect, keyed."""
STEP_ROWS_INSERT = (
    "INSERT INTO events (run_id, seq, kind, step, data, at_s, crc) VALUES "
    "(:run_id, :seq, 'TOOL_COMPLETED', :step, '[' || :canonical || ',' || :data || ']', :at_s, 0)"
)
STEP_EFFECT_INSERT = "INSERT INTO effects (key, run_id, step, result, at_s) VALUES (:key, :run_id, :step, :data, :at_s)"


# -- which durabl -----------------------------------------------------------------------------


def durability_kwargs(mode: str) -> dict[str, Any]:
    """``Runtime`` keyword arguments for ``mode`` ("full" or "process") in this durabl's API."""
    params = inspect.signature(Runtime.__init__).parameters
    if "durability" in params:
        return {"durability": mode}
    if "synchronous" in params:
        return {"synchronous": "FULL" if mode == "full" else "NORMAL"}
    raise SystemExit(
        f"probe: durabl {durabl.__version__} takes neither durability= nor synchronous="
    )


DURABILITY_KWARGS = {mode: durability_kwargs(mode) for mode in ("full", "process")}
"""Worked out once, at import: reading ``Runtime``'s signature is the probe's work, so it is
kept out of every timed ``Runtime()``."""


def info() -> dict[str, Any]:
    params = inspect.signature(Runtime.__init__).parameters
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "sqlite_version": sqlite3.sqlite_version,
        "durabl_version": durabl.__version__,
        "durabl_file": durabl.__file__,
        "durability_option": "durability" if "durability" in params else "synchronous",
        "has_dry_replay": "dry" in inspect.signature(Runtime.replay).parameters,
    }


# -- the workload -----------------------------------------------------------------------------


class Outbox:
    """The tool: appends one line to a file and returns a ~200-byte dict. Call ``i`` is tool
    call number ``i + 1`` of its run. It remembers when the first call of this process began,
    and can SIGKILL its own process on entry to one call number."""

    def __init__(self, path: str, kill_at_call: int = 0) -> None:
        self.path = path
        self.kill_at_call = kill_at_call
        self.first_entry_s: float | None = None
        self.first_call: int | None = None
        open(path, "a").close()

    def __call__(self, i: int, topic: str) -> dict[str, Any]:
        if self.first_entry_s is None:
            self.first_entry_s = time.perf_counter()
            self.first_call = i + 1
        if i + 1 == self.kill_at_call:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(f"{i}\t{topic}\n")
        return result_of(i, topic)


@workflow(name=WORKFLOW_NAME)
def wn(ctx: Any, topic: str, n: int) -> Any:
    """W40's shape with ``n`` tool calls (W40 is ``n=40``)."""
    plan = yield ModelCall(f"Plan a search about {topic}")
    found = 0
    for i in range(n):
        hit = yield ToolCall(TOOL_NAME, {"i": i, "topic": topic})
        found += hit["i"] == i
    return {"plan": plan["plan"], "hits": found}


def plain_loop(append: Callable[..., Any], n: int = TOOL_CALLS) -> Any:
    """The baseline: the same calls with the same arguments, and nothing else."""
    plan = stub_llm(f"Plan a search about {TOPIC}")
    found = 0
    for i in range(n):
        hit = append(i=i, topic=TOPIC)
        found += hit["i"] == i
    return {"plan": plan["plan"], "hits": found}


def make_runtime(db: str, mode: str, outbox: Outbox) -> Any:
    registered = tool(outbox, name=TOOL_NAME, mode="IDEMPOTENT")
    return Runtime(db, llm=stub_llm, tools={TOOL_NAME: registered}, **DURABILITY_KWARGS[mode])


def check_completed(state: Any, n: int, what: str) -> None:
    if state.status != "COMPLETED" or state.result["hits"] != n:
        raise SystemExit(f"probe: {what} ended {state.status} with {state.result!r}")


def elapsed_us(t0_ns: int) -> float:
    return (time.perf_counter_ns() - t0_ns) / 1e3


# -- kinds ------------------------------------------------------------------------------------


def measure_w40(args: argparse.Namespace) -> dict[str, Any]:
    """Pairs of (plain loop, W40 run), each timed; the first pair is the cold one."""
    outbox = Outbox(args.outbox)
    t0 = time.perf_counter_ns()
    rt = make_runtime(args.db, args.mode, outbox)
    construct_us = elapsed_us(t0)
    plain_us: list[float] = []
    run_us: list[float] = []
    try:
        for _ in range(args.runs):
            t0 = time.perf_counter_ns()
            plain = plain_loop(outbox)
            plain_us.append(elapsed_us(t0))
            t0 = time.perf_counter_ns()
            state = rt.run(wn, {"topic": TOPIC, "n": TOOL_CALLS})
            run_us.append(elapsed_us(t0))
            if plain["hits"] != TOOL_CALLS:
                raise SystemExit(f"probe: the plain loop returned {plain!r}")
            check_completed(state, TOOL_CALLS, "a W40 run")
    finally:
        rt.close()
    return {
        "mode": args.mode,
        "construct_us": construct_us,
        "plain_us": plain_us,
        "run_us": run_us,
        "floors": commit_floors(args.floor_db, args.mode, args.floor_commits),
    }


def commit_floors(db: str, mode: str, commits: int) -> dict[str, Any]:
    """The commit floors in the two states a WAL is in, each the state a W40 figure is taken
    in: ``cold``, on a fresh file whose WAL is still growing (every commit appends frames past
    the file's end, and its sync also writes the file's new size: ext4 makes that the dearer
    kind), as a fresh runtime's first run is; and ``warm``, once SQLite has checkpointed and
    started the WAL again from its beginning (commits overwrite frames in place), as a warm
    runtime's runs are. Each section alternates single commits, pairs of commits and commits
    of one step's rows of a step-sized row, each timed from BEGIN to the return of COMMIT;
    synchronous=FULL for "full", NORMAL for "process". ``commits`` sets the warm section;
    the cold one takes a third as many, so that the WAL is still growing when it ends."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=" + ("FULL" if mode == "full" else "NORMAL"))
        conn.execute(FLOOR_SCHEMA)
        conn.execute(STEP_ROWS_SCHEMA)
        data = json.dumps(
            {"result": result_of(7, TOPIC), "attempt": 1, "key": "0f" * 8}, separators=(",", ":")
        )
        wal = f"{db}-wal"
        side_file = f"{db}.appended"
        seq, cold = floor_section(conn, data, 0, 0, max(1, commits // 3), side_file)
        cold_growth = os.path.getsize(wal)
        seq, filled = fill_until_the_wal_restarts(conn, data, seq, wal)
        seq, warm = floor_section(conn, data, seq, 2 * commits, commits, side_file)
    finally:
        conn.close()
    return {
        "synchronous": "FULL" if mode == "full" else "NORMAL",
        "payload_bytes": len(data),
        "cold": cold,
        "warm": warm,
        "cold_wal_bytes": cold_growth,
        "fill_commits": filled,
    }


def floor_section(
    conn: sqlite3.Connection, data: str, seq: int, first_step: int, commits: int, side_file: str
) -> tuple[int, dict[str, list[float]]]:
    """``commits`` single commits, pairs, step-rows commits and step-rows commits after an
    append to ``side_file``, alternated and each timed."""
    single_us: list[float] = []
    pair_us: list[float] = []
    step_rows_us: list[float] = []
    after_append_us: list[float] = []
    for step in range(first_step + 1, first_step + 2 * commits + 1, 2):
        t0 = time.perf_counter_ns()
        seq = commit_row(conn, seq, data)
        single_us.append(elapsed_us(t0))
        t0 = time.perf_counter_ns()
        seq = commit_row(conn, commit_row(conn, seq, data), data)
        pair_us.append(elapsed_us(t0))
        t0 = time.perf_counter_ns()
        commit_step_rows(conn, step, data)
        step_rows_us.append(elapsed_us(t0))
        # W40's tool appends a line to a file before each step's commit: on ext4 that makes
        # the next sync dearer, so this floor is the one a W40 step commits in.
        with open(side_file, "a", encoding="utf-8") as fh:
            fh.write(f"{step}\t{TOPIC}\n")
        t0 = time.perf_counter_ns()
        commit_step_rows(conn, step + 1, data)
        after_append_us.append(elapsed_us(t0))
    return seq, {
        "commit_us": single_us,
        "two_commits_us": pair_us,
        "step_rows_commit_us": step_rows_us,
        "step_rows_after_append_commit_us": after_append_us,
    }


WAL_RESTARTED_AFTER = 8
"""Commits in a row that leave the WAL file's size as it was: SQLite is writing it from its
beginning again (while it grows, every commit appends)."""
FILL_LIMIT = 50_000


def fill_until_the_wal_restarts(
    conn: sqlite3.Connection, data: str, seq: int, wal: str
) -> tuple[int, int]:
    """Untimed single commits until SQLite's automatic checkpoint has let the WAL start over:
    the next commits overwrite it in place, as every commit of a warm runtime does. Returns
    the last seq and the commits it took."""
    size, unchanged = os.path.getsize(wal), 0
    for filled in range(1, FILL_LIMIT + 1):
        seq = commit_row(conn, seq, data)
        now = os.path.getsize(wal)
        unchanged = unchanged + 1 if now == size else 0
        size = now
        if unchanged == WAL_RESTARTED_AFTER:
            return seq, filled
    raise SystemExit(f"probe: the floor's WAL was still growing after {FILL_LIMIT} commits")


def commit_step_rows(conn: sqlite3.Connection, step: int, data: str) -> None:
    """One commit of the rows one IDEMPOTENT tool step writes (its one event, holding the step's
    text and its result, and its effect row), with raw sqlite3 and no triggers: the floor of the
    same rows, not only one."""
    canonical = json.dumps(["tool", "append_line", {"i": step, "topic": TOPIC}])
    key = f"durabl:steps:{step}"
    params = {
        "run_id": "steps",
        "seq": step,
        "step": step,
        "canonical": canonical,
        "data": data,
        "at_s": time.time(),
    }
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(STEP_ROWS_INSERT, params)
    conn.execute(STEP_EFFECT_INSERT, {**params, "key": key})
    conn.execute("COMMIT")


def commit_row(conn: sqlite3.Connection, seq: int, data: str) -> int:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute(
        FLOOR_INSERT, {"run_id": "floor", "seq": seq + 1, "data": data, "at_s": time.time()}
    )
    conn.execute("COMMIT")
    return seq + 1


def build(args: argparse.Namespace) -> dict[str, Any]:
    """Start one run of 1 + ``--tools`` steps (killed on entry to ``--kill-at-call``, if set)."""
    outbox = Outbox(args.outbox, kill_at_call=args.kill_at_call)
    rt = make_runtime(args.db, args.mode, outbox)
    t0 = time.perf_counter_ns()
    state = rt.run(wn, {"topic": TOPIC, "n": args.tools}, run_id=args.run_id)
    build_us = elapsed_us(t0)
    rt.close()
    check_completed(state, args.tools, f"run {args.run_id}")
    return {"run_id": args.run_id, "steps": 1 + args.tools, "build_us": build_us}


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """``--reps`` dry replays of a completed run on one fresh runtime; none may execute."""
    outbox = Outbox(args.outbox)
    t0 = time.perf_counter_ns()
    rt = make_runtime(args.db, args.mode, outbox)
    construct_us = elapsed_us(t0)
    replay_us: list[float] = []
    try:
        for _ in range(args.reps):
            t0 = time.perf_counter_ns()
            state = rt.replay(args.run_id, dry=True)
            replay_us.append(elapsed_us(t0))
            check_completed(state, args.tools, f"a dry replay of {args.run_id}")
            if state.steps_replayed != 1 + args.tools or state.steps_executed:
                raise SystemExit(
                    f"probe: a dry replay served {state.steps_replayed} steps and "
                    f"executed {state.steps_executed}"
                )
    finally:
        rt.close()
    if outbox.first_call is not None:
        raise SystemExit("probe: a dry replay called the tool")
    return {"construct_us": construct_us, "replay_us": replay_us, "steps": 1 + args.tools}


def resume(args: argparse.Namespace) -> dict[str, Any]:
    """``Runtime()`` + ``resume`` of a killed run; then the raw read of the copy of its files."""
    outbox = Outbox(args.outbox)
    t0 = time.perf_counter()
    rt = make_runtime(args.db, args.mode, outbox)
    constructed = time.perf_counter()
    state = rt.resume(args.run_id)
    resumed = time.perf_counter()
    rt.close()
    check_completed(state, args.tools, f"the resume of {args.run_id}")
    if outbox.first_entry_s is None or outbox.first_call != args.expect_call:
        raise SystemExit(
            f"probe: the first tool call after resume was {outbox.first_call}, "
            f"expected {args.expect_call}"
        )
    t_raw = time.perf_counter()
    conn = sqlite3.connect(args.raw_copy)
    rows = conn.execute(RAW_READ, (args.run_id,)).fetchall()
    raw_read_s = time.perf_counter() - t_raw
    conn.close()
    return {
        "construct_us": (constructed - t0) * 1e6,
        "first_new_step_us": (outbox.first_entry_s - t0) * 1e6,
        "resume_total_us": (resumed - t0) * 1e6,
        "steps_replayed": state.steps_replayed,
        "raw_read_us": raw_read_s * 1e6,
        "raw_rows": len(rows),
    }


def callgrind(args: argparse.Namespace) -> dict[str, Any]:
    """Warm-up, then four sections inside ``qsort``: W40 x N, W40 x 2N, plain x N, plain x 2N.
    Under callgrind each section leaves a dump named ``--dump-prefix``.PID.out.K; each section
    says which (more than one would mean that something inside it sorted through libc too, and
    the parts would add up)."""
    outbox = Outbox(args.outbox)
    rt = make_runtime(args.db, args.mode, outbox)

    def w40_runs(count: int) -> Callable[[], object]:
        return lambda: [rt.run(wn, {"topic": TOPIC, "n": TOOL_CALLS}) for _ in range(count)]

    def plain_runs(count: int) -> Callable[[], object]:
        return lambda: [plain_loop(outbox) for _ in range(count)]

    prefix = f"{args.dump_prefix}.{os.getpid()}.out."
    sections = []
    try:
        w40_runs(args.warmup)()
        plain_runs(args.warmup)()
        for kind, count in (
            ("w40", args.n),
            ("w40", 2 * args.n),
            ("plain", args.n),
            ("plain", 2 * args.n),
        ):
            before = dumps_of(prefix)
            inside_qsort((w40_runs if kind == "w40" else plain_runs)(count))
            sections.append(
                {"kind": kind, "runs": count, "dumps": sorted(dumps_of(prefix) - before)}
            )
    finally:
        rt.close()
    return {"sections": sections, "steps_per_run": STEPS}


def dumps_of(prefix: str) -> set[str]:
    """The callgrind dump files written so far whose path starts with ``prefix``."""
    folder, stem = os.path.split(prefix)
    return {os.path.join(folder, name) for name in os.listdir(folder) if name.startswith(stem)}


def inside_qsort(fn: Callable[[], object]) -> None:
    """Call ``fn`` from the comparison function of a two-element ``qsort`` (which glibc runs in
    ``qsort_r``): nothing a W40 run does sorts through libc, so what runs inside ``qsort_r`` is
    ``fn`` and a few hundred instructions of ctypes around it."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    compare_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
    failures: list[BaseException] = []
    called: list[bool] = []

    def compare(_a: Any, _b: Any) -> int:
        if not called:
            called.append(True)
            try:
                fn()
            except BaseException as exc:
                failures.append(exc)
        return 0

    pair = (ctypes.c_int * 2)(1, 2)
    libc.qsort(pair, 2, ctypes.sizeof(ctypes.c_int), compare_type(compare))
    if failures:
        raise failures[0]
    if not called:
        raise SystemExit("probe: qsort never called back")


# -- the command line -------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/probe.py", description=__doc__.split("\n")[0])
    kinds = parser.add_subparsers(dest="kind", required=True)
    kinds.add_parser("info", help="the interpreter, SQLite and durabl of this process")
    w40 = kinds.add_parser("w40", help="cold and warm W40 runs, then the commit floors")
    w40.add_argument("--runs", type=int, required=True, help="pairs of (plain loop, W40 run)")
    w40.add_argument("--floor-db", required=True)
    w40.add_argument(
        "--floor-commits",
        type=int,
        required=True,
        help="single commits, and as many pairs of commits",
    )
    built = kinds.add_parser("build", help="start one run of 1 + TOOLS steps")
    built.add_argument(
        "--kill-at-call",
        type=int,
        default=0,
        help="SIGKILL this process on entry to this tool call (1-based)",
    )
    replayed = kinds.add_parser("replay", help="dry replays of a completed run")
    replayed.add_argument("--reps", type=int, required=True)
    resumed = kinds.add_parser("resume", help="Runtime() + resume of a killed run, then a raw read")
    resumed.add_argument("--raw-copy", required=True, help="a copy of the database files")
    resumed.add_argument(
        "--expect-call", type=int, required=True, help="the tool call the resume must execute first"
    )
    counted = kinds.add_parser("callgrind", help="W40 and plain sections inside qsort")
    counted.add_argument("--n", type=int, required=True)
    counted.add_argument("--warmup", type=int, required=True)
    counted.add_argument(
        "--dump-prefix", required=True, help="callgrind's --callgrind-out-file without its .%%p.out"
    )
    for sub in (w40, built, replayed, resumed, counted):
        sub.add_argument("--db", required=True)
        sub.add_argument("--outbox", required=True, help="the file the tool appends to")
        sub.add_argument("--mode", choices=("full", "process"), default="process")
    for sub in (built, replayed, resumed):
        sub.add_argument("--run-id", required=True)
        sub.add_argument("--tools", type=int, default=TOOL_CALLS, help="tool calls in the run")
    return parser.parse_args(argv)


KINDS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "info": lambda _args: info(),
    "w40": measure_w40,
    "build": build,
    "replay": replay,
    "resume": resume,
    "callgrind": callgrind,
}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print(json.dumps(KINDS[args.kind](args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
