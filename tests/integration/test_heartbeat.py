"""A lease outlives the steps run under it (SPEC §7): the heartbeat renews it while the holder
works, however long that takes, on both backends.

- A tool call that takes several leases' length, the first step of a new run or the first new
  step of a resumed one: the run's row shows its lease unexpired at every look from outside,
  with the same token (nobody took it over), and its expiry moving on; the run completes.
- Runs a worker claimed and has not driven yet stay leased while they wait.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from durabl import Runtime, ToolCall, tool, workflow
from durabl.crashpoints import ProcessDeath
from durabl.store import open_store

LEASE_S = 0.6
"""Short, so that a renewal is due every 0.2 s."""

CALL_S = 3 * LEASE_S
"""The slow call's length: three leases."""

LOOK_EVERY_S = 0.05


@workflow(name="hb_two_calls")
def two_calls(ctx: Any) -> Any:
    first = yield ToolCall("quick", {})
    second = yield ToolCall("slow", {})
    return [first, second]


class Watcher:
    """The tools. ``slow`` watches its run's lease through a store of its own while it takes
    ``CALL_S``; ``quick`` kills its process (a simulated death) the first time, if told to."""

    def __init__(self, db: str, run_id: str, *, die_once: bool = False) -> None:
        self.db = db
        self.run_id = run_id
        self.die_once = die_once
        self.looks: list[tuple[float, float, int]] = []
        """(when, the lease's expiry, its token), as seen from outside during the slow call."""

    def quick(self) -> str:
        if self.die_once:
            self.die_once = False
            raise ProcessDeath("died in the first call")
        return "quick"

    def slow(self) -> str:
        outside = open_store(self.db, durability="process")
        try:
            ends_s = time.time() + CALL_S
            while (now_s := time.time()) < ends_s:
                row = outside.get_run(self.run_id)
                assert row is not None and row.lease is not None
                self.looks.append((now_s, row.lease.expires_s, row.lease_token))
                time.sleep(LOOK_EVERY_S)
        finally:
            outside.close()
        return "slow"

    def tools(self) -> dict[str, Any]:
        return {
            "quick": tool(self.quick, name="quick", mode="IDEMPOTENT"),
            "slow": tool(self.slow, name="slow", mode="IDEMPOTENT"),
        }


def assert_renewed(looks: list[tuple[float, float, int]]) -> None:
    assert len(looks) >= CALL_S / LOOK_EVERY_S / 2, f"too few looks: {looks}"
    expired = [(now_s, expires_s) for now_s, expires_s, _ in looks if expires_s <= now_s]
    assert not expired, (
        f"the lease ran out during the call, at {len(expired)} of {len(looks)} looks"
    )
    tokens = {token for _, _, token in looks}
    assert len(tokens) == 1, f"the run changed hands during the call: tokens {sorted(tokens)}"
    first_expiry, last_expiry = looks[0][1], looks[-1][1]
    assert last_expiry - first_expiry >= 2 * LEASE_S, (
        f"the lease was not renewed: its expiry moved {last_expiry - first_expiry:.2f} s"
    )


def test_a_new_run_keeps_its_lease_through_a_call_longer_than_it(either_db: str) -> None:
    watcher = Watcher(either_db, "hb-new")
    with Runtime(either_db, tools=watcher.tools(), lease_s=LEASE_S) as rt:
        state = rt.run(two_calls, run_id="hb-new")
    assert state.status == "COMPLETED" and state.result == ["quick", "slow"]
    assert_renewed(watcher.looks)


def test_a_resumed_run_keeps_its_lease_through_its_first_new_step(either_db: str) -> None:
    watcher = Watcher(either_db, "hb-resumed", die_once=True)
    with (
        Runtime(either_db, tools=watcher.tools(), lease_s=LEASE_S) as rt,
        pytest.raises(ProcessDeath),
    ):
        rt.run(two_calls, run_id="hb-resumed")
    # A new runtime resumes it: its first new step is the slow call, after the quick one again.
    with Runtime(either_db, tools=watcher.tools(), workflows=[two_calls], lease_s=LEASE_S) as rt:
        state = rt.resume("hb-resumed")
    assert state.status == "COMPLETED" and state.result == ["quick", "slow"]
    assert_renewed(watcher.looks)


def test_claimed_runs_stay_leased_until_they_are_driven(postgres_db: Any) -> None:
    url = postgres_db()
    with Runtime(url, workflows=[two_calls], lease_s=LEASE_S) as rt:
        run_ids = [rt.submit("hb_two_calls", {}) for _ in range(3)]
        claimed = rt._engine.claim_runs(len(run_ids))
        assert sorted(claimed) == sorted(run_ids)
        taken = {run_id: rt.store.get_run(run_id) for run_id in run_ids}
        time.sleep(CALL_S)
        for run_id, before in taken.items():
            row = rt.store.get_run(run_id)
            assert before is not None and before.lease is not None
            assert row is not None and row.lease is not None, f"{run_id} lost its lease"
            assert row.lease_token == before.lease_token, f"{run_id} changed hands"
            assert row.lease.expires_s > time.time(), f"{run_id}'s lease ran out while it waited"
            assert row.lease.expires_s - before.lease.expires_s >= 2 * LEASE_S, (
                f"{run_id}'s lease was not renewed while it waited"
            )
