"""letitloop, used as its README recommends: one ``@durable(goal_id=..., wal_dir=...)`` function
calling ``step(step_id, fn, *args)`` once per workload step, with ``atomic_marker`` around the
steps whose effect must not happen twice (``ledger`` and ``send``, the README's "protect
external API mutations against duplicate execution"). letitloop has no model-call construct:
model steps are steps too. Restarting is the harness's job here, as ``lil watch`` or
``@supervise`` would do it: both only re-run the same script.

How it persists: ``step`` runs the function, then ``State.patch_data`` appends one event (a
``DATA_PATCH`` holding every step output so far) to ``state.wal.jsonl`` as a CRC-framed
``LILWAL02`` line, written, flushed and fsync'd, then to an audit journal. On start,
``@durable`` replays the WAL (the snapshot ``state.json`` is written only when the function
returns, and the WAL wins over it) and ``step`` returns the stored output of every step
already recorded without calling it. ``atomic_marker`` writes ``markers/<id>.pending.<pid>``
before the block and renames it to ``<id>.committed`` after: a committed marker skips the
block; a pending one left by a killed process is ignored, so the block runs again.

No idempotency key is passed to ``send``: letitloop gives a step no identity meant to be
handed to the outside world (its own guard is ``atomic_marker``). The shell tool runs with
``subprocess.run``: letitloop's ``ProcessGuard`` is for its own worker processes and its docs
do not offer it for a step's commands.

Windows: PROMPT and EXEC inside the step bodies; WRITE inside letitloop's WAL append
(``State._append_wal``), when half of the frame is written and flushed to the file and the
rest, the flush and the fsync are not done yet (``orchestrator.state`` is given an ``open``
that splits its WAL writes in two): one INIT frame on the first start, then one frame per
step, 8 in a clean run. A kill after the whole frame reached the file but before its fsync
would lose nothing to SIGKILL (the page cache outlives the process), so the torn frame is the
instant that tests the WAL. VERIFY inside ``Trial.finish``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import shutil
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import agent

GOAL_ID = "bench-run"
WAL_DIR = "wal"
GUARDED = ("once", "keyed")
"""Effects the README says to guard with ``atomic_marker``: a second run is a duplicate."""


def watch_wal_appends(trial: agent.Trial, state_module: types.ModuleType) -> None:
    """Give ``orchestrator.state`` an ``open`` whose WAL appends arrive at WRITE halfway through
    the frame: its first half is written and flushed to the file, the rest and the fsync are
    still to come. A kill there leaves a torn frame at the WAL's tail."""
    real_open = open

    class _HalfFrame:
        def __init__(self, file) -> None:  # type: ignore[no-untyped-def]
            self._file = file

        def write(self, text: str) -> int:
            half = len(text) // 2
            self._file.write(text[:half])
            self._file.flush()
            trial.arrive("WRITE")
            return self._file.write(text[half:]) + half

        def __getattr__(self, name: str) -> object:
            return getattr(self._file, name)

        def __enter__(self) -> _HalfFrame:
            self._file.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self._file.__exit__(*exc)

    def watched_open(path, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        file = real_open(path, mode, *args, **kwargs)
        if "a" in mode and str(path).endswith(state_module.WAL_FILENAME):
            return _HalfFrame(file)
        return file

    state_module.open = watched_open  # type: ignore[attr-defined]


def main() -> None:
    trial = agent.Trial.from_env()
    started = time.perf_counter()
    from letitloop import atomic_marker, durable, step
    from orchestrator import state as lil_state
    from orchestrator.exceptions import StateError

    imported = time.perf_counter()
    watch_wal_appends(trial, lil_state)

    def recorded_only(name: str):  # type: ignore[no-untyped-def]
        def refuse() -> dict:
            raise RuntimeError(f"marker {name!r} is committed but the WAL holds no output")

        return refuse

    @durable(goal_id=GOAL_ID, wal_dir=str(trial.store / WAL_DIR))
    def bench_agent() -> dict:
        outputs: dict = {}
        for spec in agent.STEPS:
            body = functools.partial(
                trial.run_step, spec.name, agent.step_input(spec.name, outputs)
            )
            if spec.effect in GUARDED:
                with atomic_marker(spec.name) as should_execute:
                    fn = body if should_execute else recorded_only(spec.name)
                    outputs[spec.name] = step(spec.name, fn)
            else:
                outputs[spec.name] = step(spec.name, body)
        return agent.final_result(outputs)

    trial.ready(
        runtime="letitloop",
        version=importlib.metadata.version("letitloop"),
        import_s=imported - started,
        init_s=time.perf_counter() - imported,
    )
    try:
        result = bench_agent()
    except StateError as exc:  # letitloop refuses to replay a WAL it finds corrupt
        trial.failed(f"StateError: {exc}")
    trial.finish(result)


def check(trial: agent.Trial) -> tuple[bool, str]:
    """Replay a copy of the WAL with letitloop's own loader (it truncates a torn tail in place,
    so the trial's files are left alone)."""
    from orchestrator.exceptions import StateError
    from orchestrator.state import load_state

    wal_dir = trial.store / WAL_DIR
    if not (wal_dir / "state.json").exists() and not (wal_dir / "state.wal.jsonl").exists():
        return True, "no WAL yet"
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / WAL_DIR
        shutil.copytree(wal_dir, copy)
        try:
            state = load_state(str(copy / "state.json"), journal_dir=str(copy))
        except (StateError, ValueError) as exc:
            return False, f"load_state: {exc}"[:300]
    outputs = state.data.get("step_outputs", {})
    torn = " (torn tail cut)" if state.data.get("wal_torn_tail_recovered") else ""
    return True, f"WAL replays: seq {state._seq}, {len(outputs)} step outputs{torn}"


if __name__ == "__main__":
    if "--check" in sys.argv:
        agent.check_main(check)
    else:
        main()
