"""A bench run: calibrate every runtime with clean runs, spread the kills over the matrix, run
the trials one after another, and seal a receipt for each.

Calibration comes first and is measured in the same run as the trials: each runtime does a few
clean runs (no kill), which give its per-step time, its import and set-up time, and how many
times a run arrives at each window. The plain loop is always calibrated, because per-step
overhead is measured against it. The kills are then spread evenly over the (runtime, window)
cells that have arrivals, and inside a cell over its arrivals, starting at an offset drawn from
the seed: the same seed gives the same kill points.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durabl.bench import adapters as registry
from durabl.bench import seal, trial
from durabl.bench.adapters import Adapter
from durabl.bench.kit import agent
from durabl.bench.seal import BenchInputError, Key, ReceiptWriter

SERVICE_START_S = 90.0


@dataclass
class Options:
    adapters: list[Adapter]
    windows: list[str]
    kills: int
    seed: int
    out: Path
    calibration: int = 5
    venvs: Path | None = None
    key_file: Path | None = None
    keep_trials: bool = False
    quiet: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "runtimes": [a.id for a in self.adapters],
            "windows": self.windows,
            "kills": self.kills,
            "seed": self.seed,
            "calibration": self.calibration,
        }


def parse_windows(text: str | None) -> list[str]:
    if not text:
        return list(agent.WINDOWS)
    names = [name.strip().upper() for name in text.split(",") if name.strip()]
    for name in names:
        if name not in agent.WINDOWS:
            raise BenchInputError(f"unknown window {name!r}; known: {', '.join(agent.WINDOWS)}")
    if not names:
        raise BenchInputError("--windows is empty; known: " + ", ".join(agent.WINDOWS))
    return list(dict.fromkeys(names))


def refuse_used_folder(out: Path) -> None:
    """An output folder that already holds receipts belongs to another bench run."""
    folder = out / "receipts"
    if folder.exists() and any(folder.iterdir()):
        count = sum(1 for _ in seal.receipt_files(folder))
        raise BenchInputError(
            f"{out} already holds {count} receipts of another bench run: choose a new --out "
            f"(nothing was overwritten)"
        )
    if out.exists() and not out.is_dir():
        raise BenchInputError(f"--out {out} is a file, not a folder")


def environment() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "machine": platform.machine(),
        "system": f"{platform.system()} {platform.release()}",
        "cpus": os.cpu_count(),
        "hostname_hash": hashlib.sha256(platform.node().encode()).hexdigest()[:12],
    }


def workload() -> dict[str, Any]:
    source = Path(agent.__file__).read_bytes()
    return {
        "name": agent.WORKLOAD,
        "kit_sha256": hashlib.sha256(source).hexdigest(),
        "steps": [[s.name, s.kind, s.effect] for s in agent.STEPS],
        "expected_result": agent.expected_result(),
        "expected_tokens": agent.expected_tokens(),
    }


def _adapter_info(adapter: Adapter, python: str | None) -> dict[str, Any]:
    return {
        "id": adapter.id,
        "label": adapter.label,
        "mechanism": adapter.mechanism,
        "script": adapter.script,
        "args": list(adapter.args),
        "kit_script_sha256": hashlib.sha256(adapter.path.read_bytes()).hexdigest()
        if adapter.path.exists()
        else None,
        "python": python,
    }


@contextlib.contextmanager
def service(adapter: Adapter, python: str, work: Path) -> Iterator[str]:
    """Start the server a runtime keeps its state in (once per bench run) and stop it after."""
    folder = work / f"service-{adapter.id}"
    folder.mkdir(parents=True, exist_ok=True)
    portfile = folder / "address"
    log = open(folder / "service.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [python, str(adapter.path), "--serve", str(portfile)],
        env={**os.environ, "DURABL_BENCH_SERVICE_DIR": str(folder)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + SERVICE_START_S
        while not (portfile.exists() and portfile.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{adapter.id} service did not start (see {folder / 'service.log'})"
                )
            time.sleep(0.1)
        yield portfile.read_text().strip()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def plan_kills(
    arrivals: dict[str, dict[str, int]],
    adapters: list[Adapter],
    windows: list[str],
    kills: int,
    seed: int,
) -> list[tuple[Adapter, str, int]]:
    """(adapter, window, arrival) for every kill: cells in a fixed order, kills dealt to them in
    turn, arrivals inside a cell spaced evenly from a seeded offset."""
    cells = [
        (adapter, window)
        for adapter in adapters
        if adapter.id in arrivals
        for window in windows
        if arrivals[adapter.id].get(window, 0) > 0
    ]
    if not cells:
        return []
    counts = [kills // len(cells) + (1 if i < kills % len(cells) else 0) for i in range(len(cells))]
    rng = random.Random(seed)
    per_cell = []
    for (adapter, window), count in zip(cells, counts, strict=True):
        n = arrivals[adapter.id][window]
        offset = rng.randrange(n)
        # spaced evenly over the cell's arrivals: fewer kills than arrivals still reach every
        # part of the run, more kills than arrivals reach each arrival about equally often
        per_cell.append(
            [(adapter, window, 1 + (offset + i * n // count) % n) for i in range(count)]
        )
    # dealt round-robin, so that a slow drift of the machine touches every runtime alike
    return [kill for round_ in itertools.zip_longest(*per_cell) for kill in round_ if kill]


def _arrivals_of(result: dict[str, Any]) -> dict[str, int] | None:
    for process in result["processes"]:
        for event in process["events"]:
            if event["event"] == "verified":
                return {k: int(v) for k, v in event["arrivals"].items()}
    return None


class Progress:
    """A rich progress bar on a terminal; plain lines otherwise (and nothing when quiet)."""

    def __init__(self, total: int, quiet: bool) -> None:
        self.quiet = quiet
        self.bar: Any = None
        if not quiet and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                TextColumn,
                TimeRemainingColumn,
            )
            from rich.progress import (
                Progress as Bar,
            )

            self.bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
            )
            self.bar.start()
            self.task = self.bar.add_task("bench", total=total)
        self.done = 0
        self.total = total

    def step(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=text)
        elif not self.quiet and (self.done % 25 == 0 or self.done == self.total):
            print(f"  {self.done}/{self.total} {text}", file=sys.stderr, flush=True)

    def grow(self, more: int) -> None:
        self.total += more
        if self.bar is not None:
            self.bar.update(self.task, total=self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def run(options: Options, key: Key) -> str:
    """Run the bench; returns its id. Receipts land in ``options.out/receipts``."""
    bench = _Bench(options, key)
    try:
        bench.report_unavailable()
        with contextlib.ExitStack() as services:
            launches = bench.launches(services)
            arrivals = bench.calibrate(launches)
            bench.kill(launches, arrivals)
    finally:
        bench.progress.close()
        if not options.keep_trials:
            shutil.rmtree(bench.work, ignore_errors=True)
    return bench.id


class _Bench:
    """One bench run's state: its receipts, the runtimes that can run, and its progress."""

    def __init__(self, options: Options, key: Key) -> None:
        self.options = options
        self.key = key
        self.id = uuid.uuid4().hex[:12]
        self.writer = ReceiptWriter(options.out / "receipts", key, self.id, options.describe())
        self.work = options.out / "trials"
        self.common = {"workload": workload(), "environment": environment(), "seed": options.seed}
        # the plain loop is always calibrated: per-step overhead is measured against it
        self.calibrated = list(options.adapters)
        if registry.BY_ID["plain"] not in self.calibrated:
            self.calibrated.append(registry.BY_ID["plain"])
        root = registry.venvs_root(options.venvs)
        self.pythons: dict[str, str] = {}
        self.unavailable: dict[str, str] = {}
        for adapter in self.calibrated:
            python, reason = registry.python_of(adapter, root)
            if python is None:
                self.unavailable[adapter.id] = reason or "unavailable"
            else:
                self.pythons[adapter.id] = python
        total = len(self.pythons) * options.calibration + options.kills
        self.progress = Progress(total, options.quiet)

    def _receipt(self, kind: str, adapter: Adapter, **body: Any) -> dict[str, Any]:
        python = self.pythons.get(adapter.id)
        return self.writer.write(
            {"kind": kind, "adapter": _adapter_info(adapter, python), **body, **self.common}
        )

    def report_unavailable(self) -> None:
        for adapter_id, reason in self.unavailable.items():
            self._receipt("unavailable", registry.BY_ID[adapter_id], reason=reason)

    def launches(self, services: contextlib.ExitStack) -> dict[str, trial.Launch]:
        """How to start each runtime that can run, its service started if it needs one."""
        launches: dict[str, trial.Launch] = {}
        for adapter in self.calibrated:
            python = self.pythons.get(adapter.id)
            if python is None:
                continue
            address = None
            if adapter.service:
                try:
                    address = services.enter_context(service(adapter, python, self.work))
                except RuntimeError as exc:
                    self._receipt("unavailable", adapter, reason=str(exc))
                    continue
            launches[adapter.id] = trial.Launch(adapter, python, address)
        return launches

    def calibrate(self, launches: dict[str, trial.Launch]) -> dict[str, dict[str, int]]:
        """Clean runs of every runtime; returns how often a clean run arrives at each window."""
        arrivals: dict[str, dict[str, int]] = {}
        for adapter_id, launch in launches.items():
            for i in range(self.options.calibration):
                result = _one(
                    launch, self.work, None, self.options.keep_trials, f"cal-{adapter_id}-{i}"
                )
                self._receipt(
                    "calibration", launch.adapter, window=None, kill_at=None, number=i, **result
                )
                counted = _arrivals_of(result)
                if counted is not None:
                    arrivals.setdefault(adapter_id, counted)
                self.progress.step(f"calibrating {adapter_id}")
        return arrivals

    def kill(self, launches: dict[str, trial.Launch], arrivals: dict[str, dict[str, int]]) -> None:
        """The trials: one SIGKILL each, at the planned arrival."""
        options = self.options
        measured = [a for a in options.adapters if a.id in launches]
        planned = plan_kills(arrivals, measured, options.windows, options.kills, options.seed)
        self.progress.grow(len(planned) - options.kills)
        for number, (adapter, window, n) in enumerate(planned):
            target = f"{window}:{n}"
            result = _one(
                launches[adapter.id], self.work, target, options.keep_trials, f"kill-{number:05d}"
            )
            body = {
                "window": window,
                "kill_at": n,
                "arrivals": arrivals[adapter.id][window],
                "number": number,
                **result,
            }
            if window == "VERIFY":
                probe = {"kind": "trial", "adapter": _adapter_info(adapter, None), **body}
                body["tamper_rejected"] = seal.tamper_rejected(self.key, probe)
            self._receipt("trial", adapter, **body)
            self.progress.step(f"{adapter.id} {target}")


def _one(
    launch: trial.Launch, work: Path, kill: str | None, keep: bool, name: str
) -> dict[str, Any]:
    folder = work / name
    started = time.monotonic()
    result = trial.run_trial(launch, folder, kill)
    result["wall_s"] = round(time.monotonic() - started, 4)
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
    return result
