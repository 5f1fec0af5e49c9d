"""How the leaderboard judges a trial and reads its timings, on hand-built receipts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from durabl.bench import board
from durabl.bench.kit import agent

EXPECTED = agent.expected_result()


def receipt(**changes: Any) -> dict[str, Any]:
    """A trial killed at EXEC:3 whose restart finished cleanly."""
    base: dict[str, Any] = {
        "kind": "trial",
        "window": "EXEC",
        "workload": {"expected_result": EXPECTED, "steps": [[s.name] for s in agent.STEPS]},
        "processes": [
            {
                "killed": True,
                "stalled": False,
                "exit": -9,
                "events": [
                    {"event": "ready", "t": 0.2},
                    {"event": "step", "name": "plan", "t": 0.21},
                    {"event": "step_done", "name": "plan", "t": 0.22},
                    {"event": "step", "name": "search_habitat", "t": 0.23},
                    {"event": "kill", "window": "EXEC", "n": 1, "t": 0.24},
                ],
            },
            {
                "killed": False,
                "stalled": False,
                "exit": 0,
                "events": [
                    {"event": "ready", "t": 0.3},
                    {"event": "step", "name": "search_habitat", "t": 0.35},
                    {"event": "run_end", "t": 0.9},
                ],
            },
        ],
        "observed": {
            "ledger_lines": 1,
            "outbox_lines": 1,
            "tokens": [["plan", 21], ["draft", 58]],
            "files_ok": {"search_habitat": True, "search_diet": True, "shell": True},
            "verdict": {"result": EXPECTED, "matches": True},
            "lock_left": False,
        },
        "orphans": [],
    }
    for path, value in changes.items():
        target = base
        *parents, leaf = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[leaf] = value
    return copy.deepcopy(base)


@pytest.mark.parametrize(
    ("changes", "outcome"),
    [
        ({}, "recovered"),
        ({"observed__ledger_lines": 2}, "duplicated"),
        ({"observed__outbox_lines": 2, "processes__1__exit": 3}, "duplicated"),
        ({"processes__1__exit": 3}, "held"),
        ({"processes__1__exit": 4}, "failed"),
        ({"processes__1__exit": 1}, "failed"),
        ({"processes__1__stalled": True, "processes__1__exit": -9}, "stalled"),
        ({"observed__verdict": {"result": {**EXPECTED, "ledger_entry": 2}}}, "wrong"),
        ({"observed__verdict": None}, "wrong"),
        ({"observed__lock_left": True}, "wrong"),
        (
            {"observed__files_ok": {"search_habitat": True, "search_diet": False, "shell": True}},
            "wrong",
        ),
        ({"observed__ledger_lines": 0}, "wrong"),
    ],
)
def test_judge(changes: dict[str, Any], outcome: str) -> None:
    assert board.judge(receipt(**changes)) == outcome


def test_resume_is_measured_to_the_first_step_not_finished_before_the_kill() -> None:
    assert board.resume_s(receipt()) == 0.35
    # plan finished before the kill: re-running it first is not a new step
    redo = receipt(
        processes__1__events=[
            {"event": "step", "name": "plan", "t": 0.31},
            {"event": "step", "name": "search_habitat", "t": 0.5},
        ]
    )
    assert board.resume_s(redo) == 0.5
    # nothing left to do: the end of the run
    assert board.resume_s(receipt(processes__1__events=[{"event": "run_end", "t": 0.4}])) == 0.4


def test_token_waste_counts_each_model_step_once() -> None:
    observed = receipt(observed__tokens=[["plan", 21], ["plan", 21], ["draft", 58]])["observed"]
    assert board.token_counts(observed) == (21, 100)


def test_steps_rerun_counts_bodies_that_ran_again() -> None:
    assert board.steps_rerun(receipt()) == 1  # search_habitat, interrupted and run again
