"""``Runtime.submit``: a run created for a worker to claim, not driven by its creator.

On SQLite the worker finds a submitted run in its look for runs nobody drives; on PostgreSQL it
is woken (``test_postgres_workers.py``). Submitting is idempotent on the run id, like ``start``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from durabl import Runtime, ToolCall, workflow
from durabl.errors import RunConflictError

calls: list[str] = []


@workflow(name="submitted_chain")
def chain(ctx: object, steps: int) -> object:
    done = []
    for i in range(steps):
        done.append((yield ToolCall("note", {"text": f"{i}"})))
    return done


def note(text: str) -> str:
    calls.append(text)
    return text


def test_a_submitted_run_waits_for_a_worker_which_drives_it(tmp_path: Path) -> None:
    calls.clear()
    db = tmp_path / "s.db"
    with Runtime(db, workflows=[chain]) as client:
        run_id = client.submit(chain, {"steps": 3}, run_id="job-1")
        waiting = client.state(run_id)
        assert (waiting.status, waiting.steps_executed, calls) == ("RUNNING", 0, [])

        with Runtime(db, tools={"note": note}, workflows=[chain]) as worker:
            serving = threading.Thread(target=lambda: worker.serve(poll_s=0.05))
            serving.start()
            try:
                for _ in range(200):
                    if client.state(run_id).status == "COMPLETED":
                        break
                    threading.Event().wait(0.05)
            finally:
                worker.stop()
                serving.join()

        assert (client.state(run_id).status, client.result(run_id)) == ("COMPLETED", calls)
        assert calls == ["0", "1", "2"]


def test_submitting_again_is_the_same_submission_unless_it_differs(tmp_path: Path) -> None:
    with Runtime(tmp_path / "s.db", workflows=[chain]) as rt:
        first = rt.submit(chain, {"steps": 2}, run_id="job-2")
        assert rt.submit(chain, {"steps": 2}, run_id="job-2") == first
        assert [r.run_id for r in rt.store.list_runs()] == ["job-2"]
        with pytest.raises(RunConflictError, match="job-2"):
            rt.submit(chain, {"steps": 5}, run_id="job-2")
        assert len(rt.store.load_log(first)) == 1  # RUN_STARTED, and nothing more
