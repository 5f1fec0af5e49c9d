"""Run independent jobs on every core: forked workers, each handed the next job when it is free.

Jobs and the work function reach the workers by fork (nothing is pickled on the way in); each
result comes back pickled on one line of a pipe. A job that raises is an error in the parent,
with the worker's traceback.
"""

from __future__ import annotations

import base64
import os
import pickle
import selectors
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar


class Job(Protocol):
    cost: int


J = TypeVar("J", bound=Job)
R = TypeVar("R")


def workers_available() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0))))


def fan_out(
    jobs: Sequence[J],
    work: Callable[[J], R],
    workers: int,
    progress: Callable[[R], None] | None = None,
) -> list[R]:
    """``[work(job) for job in jobs]``, on ``workers`` processes; the costliest jobs go first so
    that the workers finish together."""
    if workers <= 1 or len(jobs) <= 1:
        results = []
        for job in jobs:
            results.append(work(job))
            if progress:
                progress(results[-1])
        return results
    pending = iter(sorted(range(len(jobs)), key=lambda i: -jobs[i].cost))
    done: dict[int, R] = {}
    with selectors.DefaultSelector() as sel:
        pids = [_start(sel, jobs, work) for _ in range(min(workers, len(jobs)))]
        for key in list(sel.get_map().values()):
            _hand_out(key.data, pending)
        while sel.get_map():
            for key, _ in sel.select():
                worker = key.data
                line = worker["out"].readline()
                if not line:
                    sel.unregister(key.fileobj)
                    worker["out"].close()
                    worker["in"].close()
                    continue
                index, result = pickle.loads(base64.b64decode(line))
                if isinstance(result, _Failed):
                    raise RuntimeError(f"a worker failed on {jobs[index]}:\n{result.text}")
                done[index] = result
                if progress:
                    progress(result)
                _hand_out(worker, pending)
    for pid in pids:
        os.waitpid(pid, 0)
    missing = [jobs[i] for i in range(len(jobs)) if i not in done]
    if missing:
        raise RuntimeError(f"workers ended without finishing {len(missing)} jobs: {missing[:3]}")
    return [done[i] for i in range(len(jobs))]


class _Failed:
    def __init__(self, text: str) -> None:
        self.text = text


def _hand_out(worker: dict[str, Any], pending: Iterator[int]) -> None:
    index = next(pending, None)
    worker["in"].write(f"{'' if index is None else index}\n")
    worker["in"].flush()


def _start(sel: selectors.BaseSelector, jobs: Sequence[Any], work: Callable[[Any], Any]) -> int:
    orders_r, orders_w = os.pipe()
    results_r, results_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: never returns
        os.close(orders_w)
        os.close(results_r)
        _worker(orders_r, results_w, jobs, work)
    os.close(orders_r)
    os.close(results_w)
    worker = {
        "in": os.fdopen(orders_w, "w", encoding="utf-8"),
        "out": os.fdopen(results_r, encoding="utf-8"),
    }
    sel.register(worker["out"], selectors.EVENT_READ, worker)
    return pid


def _worker(
    orders_fd: int, results_fd: int, jobs: Sequence[Any], work: Callable[[Any], Any]
) -> None:
    code = 0
    try:
        with os.fdopen(orders_fd, encoding="utf-8") as orders, os.fdopen(results_fd, "wb") as out:
            for line in orders:
                if not line.strip():
                    break
                index = int(line)
                try:
                    result = work(jobs[index])
                except BaseException:
                    result = _Failed(traceback.format_exc())
                out.write(base64.b64encode(pickle.dumps((index, result))) + b"\n")
                out.flush()
    except BaseException:
        code = 1
    finally:
        os._exit(code)
