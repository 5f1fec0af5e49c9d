"""``Runtime.stop()`` must work from a signal handler wherever the handler lands.

A Python signal handler runs in the main thread between two of its bytecodes, also while that
thread is inside a lock it holds: a ``stop()`` that took any lock the serving loop takes could
deadlock the worker, so that SIGTERM never stops it. The test makes the handler land at every
line the serving loop executes: a trace function calls ``stop()`` at the k-th line event, for
every k up to three times round the loop, and the loop must return each time.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

from durabl import Runtime

ROUNDS = 3  # times round the serving loop that the injection points cover


def serve_stopping_at(db: Path, k: int | None) -> int:
    """Serve with a trace that calls ``stop()`` at the k-th line event of the serving thread
    (or, for ``None``, on entering the loop's idle computation for the ROUNDS-th time).
    Returns the number of line events seen; fails if the serve does not return."""
    rt = Runtime(db)
    seen = 0
    rounds = 0

    def trace(frame: FrameType, event: str, _arg: Any) -> Any:
        nonlocal seen, rounds
        if event == "call" and frame.f_code.co_name == "_idle_s":
            rounds += 1
            if k is None and rounds == ROUNDS:
                rt.stop()
        if event == "line":
            seen += 1
            if seen == k:
                rt.stop()
        return trace

    def serve() -> None:
        sys.settrace(trace)
        try:
            rt.serve(poll_s=0.001)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    thread.join(10.0)
    assert not thread.is_alive(), f"stop() at line event {k} left the worker hanging"
    rt.close()
    return seen


def test_stop_returns_wherever_a_signal_handler_lands(tmp_path: Path) -> None:
    db = tmp_path / "stop.db"
    total = serve_stopping_at(db, None)
    assert total > 100  # the loop and the store calls under it were traced
    for k in range(1, total + 1):
        serve_stopping_at(db, k)


def test_stop_before_serve_returns_at_once(tmp_path: Path) -> None:
    with Runtime(tmp_path / "early.db") as rt:
        rt.stop()
        stats = rt.serve(poll_s=60.0)
    assert stats.drives == 0
