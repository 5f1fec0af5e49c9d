"""A PostgreSQL server that crashes and comes back while durabl works on it (the PostgreSQL
backend; SPEC §7).

- The bookkeeping commits of ``durability="full"`` (a model call's STEP_STARTED, written before
  the call) are acknowledged before the server flushes them, so a crash can take them back while
  the process that made them lives on. The store writes them again once it finds the server
  restarted: the call is not made twice, and the log has no hole.
- A restart ends every session, so for a while a live owner has none: the claim that hands
  over the runs of a holder with no session (a dead process) waits until the server is no
  longer young; once it is, such a holder's runs are taken at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import pg_support
from durabl import ModelCall, Runtime, codec, events, workflow
from durabl.store.base import Lease, RunRow
from durabl.store.postgres import RESTART_GRACE_S, PostgresStore


@pytest.fixture
def url(postgres_db: Callable[[], str]) -> str:
    return postgres_db()


@workflow(name="restart_one_call")
def one_call(ctx: Any) -> Any:
    answer = yield ModelCall("plan")
    return answer


@pytest.mark.alone  # the restart cuts every other test's sessions on the server too
def test_a_step_start_the_crash_took_back_is_written_again(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    inside, go_on = threading.Event(), threading.Event()
    prompts: list[str] = []

    def llm(prompt: str, **params: Any) -> dict[str, Any]:
        prompts.append(prompt)
        inside.set()
        assert go_on.wait(60)
        return {"text": "done"}

    ended: dict[str, Any] = {}
    with (
        caplog.at_level(logging.WARNING, logger="durabl.store"),
        Runtime(url, llm=llm) as rt,
    ):
        thread = threading.Thread(target=lambda: ended.update(state=rt.run(one_call, {})))
        thread.start()
        assert inside.wait(30), "the model was never called"
        (row,) = rt.store.list_runs()
        pg_support.restart_server()
        # What an immediate shutdown loses of an unflushed commit: all of it. Whether this crash
        # happened to keep it depends on the WAL writer's timing; take it away either way.
        with pg_support.connect(url) as conn:
            with pg_support.guards_off(conn, "events"):
                conn.execute(
                    "DELETE FROM durabl.events WHERE run_id = %s AND kind = %s",
                    (row.run_id, events.STEP_STARTED),
                )
            kinds = conn.execute(
                "SELECT kind FROM durabl.events WHERE run_id = %s ORDER BY seq", (row.run_id,)
            ).fetchall()
        assert kinds == [(events.RUN_STARTED,)]
        go_on.set()
        thread.join(60)
        log = rt.store.load_log(row.run_id)

    state = ended["state"]
    assert (state.status, state.result) == ("COMPLETED", {"text": "done"})
    assert prompts == ["plan"], "the model was called again"
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    kinds = [e.kind for e in log]
    assert kinds[:3] == [events.RUN_STARTED, events.STEP_STARTED, events.STEP_COMPLETED], kinds
    said = [r.getMessage() for r in caplog.records]
    assert any("restarted; wrote again the 1 commit(s)" in line for line in said), said


def held_elsewhere(store: PostgresStore, run_id: str) -> None:
    """A RUNNING run whose lease, good for ten minutes, names a process on another host that has
    no session on the server."""
    now_s = time.time()
    lease = Lease(owner="far-1", pid=4242, host="far-host", started=None, expires_s=now_s + 600)
    row = RunRow(
        run_id=run_id,
        workflow="restart_one_call",
        input_text="{}",
        status=events.RUNNING,
        result_text=None,
        error=None,
        created_s=now_s,
        updated_s=now_s,
        wake_at_s=None,
        watermark=0,
        lease=lease,
    )
    first = events.Event(1, events.RUN_STARTED, 0, None, codec.encode({"run": run_id}), now_s)
    assert store.create_run(row, first) is None


def claimer_lease() -> Lease:
    return Lease(
        owner="near-1", pid=4343, host="near-host", started=None, expires_s=time.time() + 60
    )


def server_up_s(url: str) -> float:
    with pg_support.connect(url) as conn:
        (up_s,) = conn.execute(
            "SELECT EXTRACT(EPOCH FROM clock_timestamp() - pg_postmaster_start_time())"
        ).fetchone()
    return float(up_s)


def test_a_holder_with_no_session_on_the_server_loses_its_runs_at_once(url: str) -> None:
    young_for_s = RESTART_GRACE_S + 0.5 - server_up_s(url)
    if young_for_s > 0:  # `make test` may have started the server just now
        time.sleep(young_for_s)
    assert server_up_s(url) > RESTART_GRACE_S, "the server is young: this would prove nothing"
    store = PostgresStore(url)
    try:
        held_elsewhere(store, "far-run")
        assert not store.owner_alive("far-host", 4242)
        assert store.claim_runs(claimer_lease(), time.time(), limit=10) == [("far-run", 2)]
    finally:
        store.close()


@pytest.mark.alone  # the restart cuts every other test's sessions on the server too
def test_a_young_server_takes_no_holder_without_a_session_for_dead(url: str) -> None:
    store = PostgresStore(url)
    try:
        held_elsewhere(store, "far-run")
    finally:
        store.close()
    pg_support.restart_server()
    store = PostgresStore(url)
    try:
        assert store.owner_alive("far-host", 4242)
        assert store.claim_runs(claimer_lease(), time.time(), limit=10) == []
        row = store.get_run("far-run")
        assert row is not None and row.lease is not None and row.lease.owner == "far-1"
    finally:
        store.close()
