"""What every benchmark shares: its command line and main loop, a scratch folder on a real disk,
the machine it ran on, summaries of its samples, and writing its results to one JSON file,
replaced atomically.

A benchmark module defines ``measure(work, quick)``, which returns the report, and
``render(report)``, which returns its printed summary, and hands both to ``main``. Benchmarks
import this module and ``bench.workload``, never each other.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, TypeVar

import durabl
from durabl.events import Event
from durabl.store import RunRow, open_store

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
RAM_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "devtmpfs", "hugetlbfs"})
"""fsync on these returns at once: a benchmark of durability there would measure nothing."""

Report = dict[str, Any]
T = TypeVar("T")


# -- the main loop --------------------------------------------------------------------------


def main(
    argv: Sequence[str] | None,
    *,
    name: str,
    doc: str | None,
    quick_help: str,
    measure: Callable[[Path, bool], Report],
    render: Callable[[Report], str],
    summary_to: TextIO | None = None,
) -> int:
    """Run the benchmark ``bench.NAME``: measure in a fresh scratch folder (removed afterwards
    unless --keep), write the report to --out, print its summary (to stdout unless
    ``summary_to`` says otherwise). The report's last figure, ``elapsed_s``, is added here."""
    args = parse_args(name, doc, quick_help, argv)
    started = time.perf_counter()
    work = scratch_dir(args.tmp_dir, prefix=f"{name}-")
    try:
        report = measure(work, bool(args.quick))
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
    finally:
        release_scratch(work, args.keep)
    out = write_json(args.out, report)
    stream = summary_to or sys.stdout
    print(render(report), file=stream)
    print(f"\nwrote {out} in {report['elapsed_s']} s", file=stream, flush=True)
    return 0


def parse_args(name: str, doc: str | None, quick_help: str, argv: Sequence[str] | None) -> Any:
    """The options every benchmark takes: --out (default bench/results/NAME.json), --quick
    (described by ``quick_help``), --tmp-dir and --keep."""
    parser = argparse.ArgumentParser(
        prog=f"python -m bench.{name}", description=(doc or "").split("\n")[0]
    )
    parser.add_argument(
        "--out", default=str(RESULTS / f"{name}.json"), help="where to write the JSON figures"
    )
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--tmp-dir", help="directory (on a real disk) for the scratch databases")
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    return parser.parse_args(argv)


def header(benchmark: str, schema: int, quick: bool, work: Path, fsync_samples: int) -> Report:
    """The first figures of every report: which benchmark, the version of its JSON layout, when
    it ran, whether in quick mode, and on what machine."""
    return {
        "benchmark": benchmark,
        "schema": schema,
        "timestamp": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "quick": quick,
        "machine": machine_info(work, fsync_samples),
    }


def say(message: str) -> None:
    """Progress goes to stderr, so that it never mixes with a summary printed to stdout."""
    print(message, file=sys.stderr, flush=True)


# -- samples --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float], digits: int = 4) -> dict[str, Any]:
    return {
        "median": round(statistics.median(values), digits),
        "p95": round(percentile(values, 95), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "mean": round(statistics.fmean(values), digits),
        "n": len(values),
    }


def median_of(values: Sequence[float], digits: int = 3) -> float:
    return round(statistics.median(values), digits)


def rotations(items: Sequence[T], rounds: int) -> list[list[T]]:
    """``rounds`` orders of ``items``, each starting one further along. Repetitions run in these
    orders so that slow spells of the machine fall on every configuration alike."""
    n = len(items)
    return [[*items[r % n :], *items[: r % n]] for r in range(rounds)]


def timed(fn: Callable[[], T]) -> tuple[int, T]:
    """``fn()``'s wall time in nanoseconds, and its value."""
    t0 = time.perf_counter_ns()
    value = fn()
    return time.perf_counter_ns() - t0, value


# -- the machine ----------------------------------------------------------------------------


def machine_info(work: Path, fsync_samples: int) -> Report:
    return {
        "cpu_count": os.cpu_count(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite_version": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "durabl_version": durabl.__version__,
        "git_commit": git_commit(),
        "scratch_dir": str(work),
        "scratch_filesystem": filesystem_of(work),
        **sync_latency(work, fsync_samples),
    }


def sync_latency(work: Path, samples: int) -> Report:
    """What one fsync / fdatasync of a 4 KiB append costs on this disk: the price of each commit
    that full durability makes durable (SQLite syncs its WAL with fdatasync on Linux)."""
    calls: list[tuple[str, Callable[[int], None]]] = [("fsync", os.fsync)]
    if hasattr(os, "fdatasync"):
        calls.append(("fdatasync", os.fdatasync))
    figures: Report = {}
    for name, sync in calls:
        times = sync_times_us(work, sync, samples)
        figures[f"{name}_us_median"] = round(statistics.median(times), 1)
        figures[f"{name}_us_p95"] = round(percentile(times, 95), 1)
    figures.setdefault("fdatasync_us_median", figures["fsync_us_median"])
    figures.setdefault("fdatasync_us_p95", figures["fsync_us_p95"])
    return figures


def sync_times_us(work: Path, sync: Callable[[int], None], samples: int) -> list[float]:
    """Microseconds each of ``samples`` calls of ``sync`` takes, each after a 4 KiB append to a
    probe file in ``work``."""
    path = work / "sync-probe"
    times: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for _ in range(samples):
            os.write(fd, b"x" * 4096)
            t0 = time.perf_counter_ns()
            sync(fd)
            times.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        os.close(fd)
        path.unlink()
    return times


def filesystem_of(path: Path) -> str:
    """The type of the filesystem holding ``path`` (from /proc/mounts), or 'unknown'."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    real = os.path.realpath(path)
    best, fstype = "", "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


PEER_PROBES = REPO / "bench" / "throughput_peers"
"""Each runtime's W40 probe, ``<runtime>_probe.py``, run by that runtime's own interpreter."""
PEER_VENVS = REPO / ".bench-venvs"
"""The peers' virtualenvs, built by ``make bench-peers``."""


def peer_interpreter(runtime: str) -> Path:
    """The interpreter that runs ``runtime``'s probe: this one for durabl, else its venv's."""
    if runtime == "durabl":
        return Path(sys.executable)
    return PEER_VENVS / runtime / "bin" / "python"


def peer_env(runtime: str) -> dict[str, str]:
    """A probe's environment: no PYTHONPATH of ours for a peer (its probe imports only itself
    and the kit); the checkout for durabl's."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if runtime == "durabl":
        env["PYTHONPATH"] = str(REPO)
    return env


def peer_argv(runtime: str, *args: Any) -> list[str]:
    """The command line of ``runtime``'s probe with ``args``."""
    probe = PEER_PROBES / f"{runtime}_probe.py"
    return [str(peer_interpreter(runtime)), str(probe), *map(str, args)]


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (Linux: SigCgt)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        pass
    return False


def git_commit() -> str | None:
    """The checkout's short commit, marked ``+dirty-src`` when src/ has uncommitted changes (the
    figures then belong to no commit)."""
    try:
        out = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--", "src")
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip() + ("+dirty-src" if dirty.strip() else "")


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout


# -- the scratch folder and the results file ------------------------------------------------


def scratch_dir(requested: str | None, prefix: str) -> Path:
    """A fresh temporary directory on a real disk."""
    candidates = [Path(requested)] if requested else [Path(tempfile.gettempdir()), REPO / "bench"]
    for base in candidates:
        base.mkdir(parents=True, exist_ok=True)
        fstype = filesystem_of(base)
        if fstype in RAM_FILESYSTEMS:
            if requested:
                raise SystemExit(f"--tmp-dir {base} is on {fstype}; fsync would not be real")
            continue
        return Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    raise SystemExit("no directory on a real disk found; pass --tmp-dir")


def release_scratch(work: Path, keep: bool) -> None:
    """Remove the scratch folder, or say where it was kept."""
    if keep:
        say(f"scratch databases kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)


def write_json(path: str | Path, report: Report) -> Path:
    """Write ``report`` to ``path``: temp file, fsync, rename, fsync the directory, so that a
    crash mid-write leaves the previous results rather than half a file."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(report, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, out)
    directory = os.open(out.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return out


# -- the printed summary --------------------------------------------------------------------


def quick_mark(report: Report) -> str:
    return "  [QUICK: smoke figures only]" if report["quick"] else ""


def machine_line(machine: Report) -> str:
    m = machine
    return (
        f"  {m['platform']}, {m['cpu_count']} CPUs, Python {m['python_version']}, "
        f"SQLite {m['sqlite_version']}, durabl {m['durabl_version']} ({m['git_commit']})"
    )


class BenchError(Exception):
    """Something a benchmark checks did not hold, or a process misbehaved."""


def run_probe(argv: list[str], runtime: str, timeout_s: float) -> str:
    """Run a probe in ``runtime``'s environment to its end; its stdout. A failure is a
    BenchError with the probe's stderr."""
    try:
        done = subprocess.run(
            argv,
            cwd=REPO,
            env=peer_env(runtime),
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{' '.join(argv[1:])} ran past {timeout_s} s") from None
    if done.returncode != 0:
        raise BenchError(f"{' '.join(argv[1:])} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.stdout


class Monitor:
    """The database while workers write to it, read through a read-only store, the way the
    command line reads it. A run's log is read on from where the last look stopped: the
    takeover case looks every few milliseconds, and a look must cost next to nothing."""

    def __init__(self, db: Path | str) -> None:
        self.store = open_store(db, read_only=True)
        self._logs: dict[str, list[Event]] = {}

    def close(self) -> None:
        self.store.close()

    def statuses(self) -> Counter[str]:
        return Counter(row.status for row in self.store.list_runs())

    def run(self, run_id: str) -> RunRow:
        row = self.store.get_run(run_id)
        if row is None:
            raise BenchError(f"no run {run_id} in {self.store.path}")
        return row

    def status(self, run_id: str) -> str:
        return self.run(run_id).status

    def log(self, run_id: str) -> list[Event]:
        seen = self._logs.setdefault(run_id, [])
        seen += self.store.load_log(run_id, seen[-1].seq if seen else 0)
        return seen

    def resumes(self, run_id: str) -> list[tuple[int, float, dict[str, Any]]]:
        return [
            (e.seq, e.at_s, json.loads(e.data or "{}"))
            for e in self.log(run_id)
            if e.kind == "RUN_RESUMED"
        ]

    def completed_steps(self, run_id: str, after_seq: int = 0) -> list[tuple[int, float]]:
        return [
            (e.seq, e.at_s)
            for e in self.log(run_id)
            if e.kind in ("STEP_COMPLETED", "TOOL_COMPLETED") and e.seq > after_seq
        ]

    def lease_expires_s(self, run_id: str) -> float | None:
        lease = self.run(run_id).lease
        return None if lease is None else lease.expires_s


def wait_for(
    what: str, check: Callable[[], Any], timeout_s: float = 60.0, every_s: float = 0.005
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)
