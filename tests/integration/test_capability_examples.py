"""The capability examples, run as real processes: each must exit 0 and leave the world (its
files in ``--dir``) in the state it claims.

- ``at_most_once.py``: SIGKILLed inside an AT_MOST_ONCE charge, the run is dead-lettered,
  resolved with the recorded charge, and completes; the ledger holds exactly one charge.
- ``retries.py``: a flaky tool succeeds on its fourth attempt after backoffs that grow (read
  from the delays durabl scheduled, not from how long anything took), and a tool that never
  recovers ends in the workflow's fallback.
- ``workers.py``: twelve runs on three worker processes, one SIGKILLed; every run completes and
  every (run, step) effect is in the effects file exactly once.
- ``upgrade.py``: a run recorded by deploy v1 finishes under deploy v2 on v1's branch with no
  patch marker, a run started under v2 takes the new branch and records its marker, one reply is
  sent per ticket, and ``durabl check`` run here against the finished database agrees: nothing
  is held, and each version's code differs only from the runs recorded on the other branch.
- ``approval.py``: the agent process exits with its runs WAITING; the answers sent by ``durabl
  signal`` are each taken once, by the wait they answer; a worker process finishes every run
  without drafting again; only the approved replies are sent; the unanswered run times out, no
  earlier than its deadline, and is escalated; the answer sent before its run reached the wait
  is taken in the commit that begins the wait, which never parks.
- ``fork.py``: a completed run is forked at the seq that ended its search and resumed by a deploy
  with a new prompt; the search is called once, ever, the model and the send once per run (the
  fork's with the new prompt and its own key), the fork's log starts with a RUN_STARTED naming
  the run and seq it came from and holds the original's events up to it, nothing is written to
  the original after the fork, and a fork inside a step is refused with exit 2 and no run made.
- ``parallel.py``: SIGKILLed with some of a Parallel's fetches recorded, the run is resumed by
  ``resume_all`` in a fresh process; each fetch recorded before the kill is never made again,
  each other is made once by the fresh process, no more than ``max_concurrency`` are out at
  once, and the pages, which arrived out of order, come back and are summarised in the order
  given.
- ``subagents.py``: SIGKILLed while its second child run searches, the lead is resumed by
  ``resume_all``; there is one child run per ChildRun, each naming the lead and its step, each
  child files its note once, and the lead's log and result hold each child's result.
- ``chat_session.py``: six messages make a chain of six runs, CONTINUED to COMPLETED, none of
  more than a dozen events; the messages sent before their turn are handed from run to run,
  each is taken by one wait, in the order sent, and answered once.
- ``function_calling.py``: a function-calling agent on ``durabl.llm.openai`` (the real OpenAI
  SDK, against a scripted OpenAI-compatible server on 127.0.0.1) is SIGKILLed inside its second
  tool call and resumed by ``resume_all``; the model server gets three requests, two from the
  killed process and one from the fresh one, so no answer the log held was asked for again;
  the forecast the kill cut off is fetched again, the other never; each answer is recorded
  once, normalized and priced, and the run's result is the model's final answer.

The examples check themselves too; these tests check the files and the database independently
of the examples' own verdicts.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from durabl import Runtime, events
from logical_rows import logical

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TIMEOUT_S = 120


def run_example(name: str, folder: Path) -> str:
    """Run ``examples/NAME --dir FOLDER`` from the repository root; its stdout on exit 0."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), "--dir", str(folder)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def log_rows(conn: sqlite3.Connection, run_id: str) -> list[tuple[Any, ...]]:
    """(seq, kind, step, data) of a run's events, read with sqlite3 alone, a TOOL_COMPLETED as
    the events it stands for."""
    rows = conn.execute(
        "SELECT seq, kind, step, data FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
    ).fetchall()
    return logical(rows, kind=1, data=3, fp=None)


def test_at_most_once_charges_once_and_resolves(tmp_path: Path) -> None:
    out = run_example("at_most_once.py", tmp_path)
    assert "killed with SIGKILL" in out
    assert "rt.run() -> DEAD_LETTERED" in out
    assert "checkout-1042  checkout  2" in out  # the `durabl dlq` listing
    assert "rt.resolve() -> COMPLETED" in out

    charges = jsonl(tmp_path / "ledger.jsonl")
    assert len(charges) == 1
    assert charges[0]["key"] == "charge-1042"
    assert len(jsonl(tmp_path / "outbox.jsonl")) == 1

    with Runtime(tmp_path / "checkout.db") as rt:
        assert rt.state("checkout-1042").status == events.COMPLETED
        assert rt.result("checkout-1042")["charge"]["charge_id"] == charges[0]["charge_id"]
        kinds = [x.kind for e in rt.store.load_log("checkout-1042") for x in events.expanded(e)]
        assert rt.metrics("checkout-1042").dead_letters == 1
    assert kinds.count(events.DEAD_LETTERED) == 1
    assert kinds.count(events.DLQ_RESOLVED) == 1
    assert kinds.count(events.TOOL_DISPATCHED) == 2  # the charge once, the receipt once


def test_retries_back_off_durably_and_fall_back(tmp_path: Path) -> None:
    out = run_example("retries.py", tmp_path)
    assert out.count("run parked SLEEPING") == 5

    attempts = jsonl(tmp_path / "attempts.jsonl")
    forecast = [a["outcome"] for a in attempts if a["api"] == "fetch_forecast"]
    quote = [a["outcome"] for a in attempts if a["api"] == "fetch_quote"]
    assert forecast == ["ConnectionError"] * 3 + ["ok"]
    assert quote == ["TimeoutError"] * 3

    backoffs = [
        float(delay)
        for delay in re.findall(r"fetch_forecast\s+after attempt \d: next attempt ([\d.]+) s", out)
    ]
    assert len(backoffs) == 3
    assert backoffs[0] < backoffs[1] < backoffs[2]

    assert "retries=5 failed_steps=1" in out
    with Runtime(tmp_path / "retries.db") as rt:
        result = rt.result("weather-report")
        retries = [e for e in rt.store.load_log("weather-report") if e.kind == events.STEP_RETRY]
    assert result["forecast"]["sky"] == "sunny"
    assert result["quote"]["gave_up_after"] == 3
    assert "quote service is down" in result["quote"]["text"]
    assert len(retries) == 5


def test_workers_complete_every_run_once_despite_a_kill(tmp_path: Path) -> None:
    out = run_example("workers.py", tmp_path)
    killed = re.search(r"killed (w\d) \(pid (\d+)\) with SIGKILL", out)
    assert killed is not None
    assert "every run COMPLETED" in out
    assert out.count("exited 0: worker stopped") == 2
    assert "taken over after the kill" in out

    effects = [line.split("\t") for line in (tmp_path / "effects.tsv").read_text().splitlines()]
    per_step = Counter((run_id, item) for _key, run_id, item, _pid in effects)
    assert len(per_step) == 12 * 4
    assert set(per_step.values()) == {1}
    pids = {pid for *_rest, pid in effects}
    assert killed.group(2) in pids  # the killed worker did some of the work
    assert len(pids) >= 2

    with Runtime(tmp_path / "jobs.db") as rt:
        statuses = {f"job-{n:02d}": rt.state(f"job-{n:02d}").status for n in range(1, 13)}
    assert set(statuses.values()) == {events.COMPLETED}


def check_with(db: Path, version: str) -> tuple[int, dict[str, str]]:
    """``durabl --json check`` with ``version`` of the upgrade example's code: the exit status,
    and each run's verdict."""
    env = {**os.environ, "UPGRADE_DEPLOY": version, "PYTHONPATH": str(EXAMPLES)}
    done = subprocess.run(
        [sys.executable, "-m", "durabl", "--db", str(db), "--import", "upgrade", "--json", "check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    report = json.loads(done.stdout)
    verdicts = {
        r["run_id"]: "ok" if r["ok"] else ("holds" if r["breaks"] else "differs")
        for r in report["runs"]
    }
    return done.returncode, verdicts


def test_upgrade_keeps_the_old_run_on_the_old_branch_and_checks_before_deploying(
    tmp_path: Path,
) -> None:
    out = run_example("upgrade.py", tmp_path)
    assert "the prompt simply replaced (exit 1)" in out
    assert re.search(r"ticket-101\s+answer_ticket\s+SLEEPING\s+WOULD HOLD\s+seq 3: recorded", out)
    assert 'behind ctx.patched("reply-cites-docs") (exit 0)' in out
    assert "1 run checked: none would be held" in out

    replies = {line["ticket_id"]: line["body"] for line in jsonl(tmp_path / "outbox.jsonl")}
    assert len(jsonl(tmp_path / "outbox.jsonl")) == 2
    assert "docs" not in str(replies["ticket-101"]) and "docs" in str(replies["ticket-102"])

    db = tmp_path / "tickets.db"
    with Runtime(db) as rt:
        logs = {run: rt.store.load_log(run) for run in ("ticket-101", "ticket-102")}
        assert {rt.state(run).status for run in logs} == {events.COMPLETED}
        assert rt.result("ticket-101")["prompt"] == "v1"
        assert rt.result("ticket-102")["prompt"] == "v2"

    def prompts(run: str) -> list[str]:
        return [
            json.loads(e.data or "")[1]
            for e in logs[run]
            if e.kind == events.STEP_STARTED and (e.data or "").startswith('["model"')
        ]

    def pids(run: str) -> list[int]:
        boundaries = (events.RUN_STARTED, events.RUN_RESUMED)
        return [json.loads(e.data or "")["pid"] for e in logs[run] if e.kind in boundaries]

    assert prompts("ticket-101") == ["Draft a reply about CSV export times out"]
    assert prompts("ticket-102") == [
        "Draft a reply about login link expired, with a link to the docs"
    ]
    assert len(set(pids("ticket-101"))) == 2  # recorded by the v1 process, finished by v2's
    assert len(pids("ticket-102")) == 1
    markers = {
        run: [(e.step, e.data) for e in log if e.kind == events.CTX_RECORDED]
        for run, log in logs.items()
    }
    assert markers == {"ticket-101": [], "ticket-102": [(2, '"reply-cites-docs"')]}

    # Every run has finished, so no version's code would hold one. v1 differs from the run that
    # took the new branch, the unguarded v2 from the run that took the old one (the other's
    # marker is stepped over), the patched code from none.
    assert check_with(db, "v2") == (0, {"ticket-101": "ok", "ticket-102": "ok"})
    assert check_with(db, "v2-unguarded") == (0, {"ticket-101": "differs", "ticket-102": "ok"})
    assert check_with(db, "v1") == (0, {"ticket-101": "ok", "ticket-102": "differs"})


def test_approval_waits_in_no_process_and_takes_each_answer_once(tmp_path: Path) -> None:
    out = run_example("approval.py", tmp_path)
    assert "the agent process exited 0" in out
    assert re.search(r"ticket-201\s+reply_with_approval\s+WAITING for 'approve' since", out)
    assert out.count("signal 'approve' #1 sent to run ticket-") == 3
    assert "the worker exited 0" in out

    tickets = ["ticket-201", "ticket-202", "ticket-203", "ticket-204"]
    drafts = jsonl(tmp_path / "drafts.jsonl")
    assert sorted(d["ticket_id"] for d in drafts) == tickets  # each drafted once, ever
    replies = jsonl(tmp_path / "outbox.jsonl")
    assert sorted((r["ticket_id"], r["by"]) for r in replies) == [
        ("ticket-201", "ana"),
        ("ticket-203", "ben"),
    ]
    assert [r["ticket_id"] for r in jsonl(tmp_path / "escalations.jsonl")] == ["ticket-202"]

    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "approvals.db")) as conn:
        runs = dict(conn.execute("SELECT run_id, status FROM runs").fetchall())
        results = dict(conn.execute("SELECT run_id, result FROM runs").fetchall())
        signals = conn.execute(
            "SELECT run_id, id, name, payload, sent_s, delivered_step FROM signals ORDER BY run_id"
        ).fetchall()
        log = {
            run: logical(
                conn.execute(
                    "SELECT seq, kind, step, data, at_s FROM events WHERE run_id = ? ORDER BY seq",
                    (run,),
                ).fetchall(),
                kind=1,
                data=3,
                fp=None,
            )
            for run in tickets
        }
    assert runs == dict.fromkeys(tickets, "COMPLETED")
    outcomes = {run: json.loads(text)["outcome"] for run, text in results.items()}
    assert outcomes == {
        "ticket-201": "sent",
        "ticket-202": "escalated",
        "ticket-203": "sent",
        "ticket-204": "rejected",
    }
    assert [(run, n, name, step) for run, n, name, _p, _s, step in signals] == [
        ("ticket-201", 1, "approve", 2),
        ("ticket-203", 1, "approve", 2),
        ("ticket-204", 1, "approve", 2),
    ]
    sent_s = {run: at for run, _n, _name, _p, at, _step in signals}

    def at_step(run: str, step: int) -> list[tuple[str, dict, float]]:
        return [(k, json.loads(d or "null"), at) for _q, k, s, d, at in log[run] if s == step]

    def pids(run: str) -> list[int]:
        return [json.loads(d)["pid"] for _q, k, _s, d, _a in log[run] if k.startswith("RUN_RES")]

    started_pid = {run: json.loads(log[run][0][3])["pid"] for run in tickets}
    for run in ("ticket-201", "ticket-202", "ticket-204"):
        # drafted and parked by the agent, finished by another process: the worker
        assert [d["pid"] for d in drafts if d["ticket_id"] == run] == [started_pid[run]]
        assert [k for k, _d, _a in at_step(run, 1)].count("STEP_STARTED") == 1
        assert [k for k, _d, _a in at_step(run, 2)] == [
            "STEP_STARTED",
            "TIMER_ARMED",
            "STEP_COMPLETED",
        ]
        resumed = next(q for q, k, *_ in log[run] if k == "RUN_RESUMED")
        armed = next(q for q, k, s, *_ in log[run] if k == "TIMER_ARMED" and s == 2)
        assert armed < resumed  # the process that parked the wait is not the one that ended it
        assert len(pids(run)) == 1 and pids(run) != [started_pid[run]]
    (_, approved, answered_s) = at_step("ticket-201", 2)[-1]
    assert approved == {
        "payload": {"approved": True, "by": "ana"},
        "signal": 1,
        "sent_s": sent_s["ticket-201"],
    }
    assert answered_s >= sent_s["ticket-201"]
    (_, _, began_s), (_, armed_at, _), (_, timed_out, ended_s) = at_step("ticket-202", 2)
    assert timed_out == {"timed_out": True}
    assert ended_s >= armed_at["fire_at_s"]
    assert armed_at["fire_at_s"] - began_s == pytest.approx(2.0, abs=0.1)  # NO_ANSWER_S
    # The early answer: its wait took it in the commit that began it, and never parked.
    (started, _, began_s), (completed, took, ended_s) = at_step("ticket-203", 2)
    assert (started, completed) == ("STEP_STARTED", "STEP_COMPLETED")
    assert began_s == ended_s > sent_s["ticket-203"]
    assert took["signal"] == 1 and took["payload"]["by"] == "ben"
    assert "TIMER_ARMED" not in [k for _q, k, *_ in log["ticket-203"]]
    assert [d["pid"] for d in drafts if d["ticket_id"] == "ticket-203"] == pids("ticket-203")


def test_fork_reruns_after_the_search_with_the_new_prompt(tmp_path: Path) -> None:
    out = run_example("fork.py", tmp_path)
    ended = re.search(r"the search ended at seq (\d+)", out)
    assert ended is not None
    seq = int(ended.group(1))
    assert f"run otters-brief-v2 forked from run otters-brief at seq {seq}" in out
    refusal = f"durabl: cannot fork run otters-brief at seq {seq + 1}: it is inside step 2 ("
    assert re.search(rf"^\s+{re.escape(refusal)}.*a step\n\s+exit status 2$", out, re.MULTILINE)

    searches = jsonl(tmp_path / "searches.jsonl")
    model_calls = jsonl(tmp_path / "model_calls.jsonl")
    outbox = jsonl(tmp_path / "outbox.jsonl")
    assert len(searches) == 1
    assert len(model_calls) == 2
    assert "citing each source" not in str(model_calls[0]["prompt"])
    assert "in three bullets, citing each source" in str(model_calls[1]["prompt"])
    assert [line["key"] for line in outbox] == [
        "durabl:otters-brief:3",
        "durabl:otters-brief-v2:3",
    ]
    assert "https://" not in str(outbox[0]["body"])
    assert str(outbox[1]["body"]).count("https://example.org/") == 3

    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "research.db")) as conn:
        runs = {
            run: (status, created, updated)
            for run, status, created, updated in conn.execute(
                "SELECT run_id, status, created_s, updated_s FROM runs"
            )
        }
        log = {
            run: conn.execute(
                "SELECT seq, kind, step, fp, data, at_s FROM events WHERE run_id = ? ORDER BY seq",
                (run,),
            ).fetchall()
            for run in runs
        }
        keys = sorted(k for (k,) in conn.execute("SELECT idempotency_key FROM side_effects"))
    assert sorted(runs) == ["otters-brief", "otters-brief-v2"]  # the refused fork made none
    assert {status for status, _c, _u in runs.values()} == {"COMPLETED"}
    original, fork = log["otters-brief"], log["otters-brief-v2"]
    # the search, an IDEMPOTENT tool: its attempt and result are one event
    assert (original[seq - 1][1], original[seq - 1][2]) == ("TOOL_COMPLETED", 1)
    assert (original[seq][1], original[seq][2]) == ("STEP_STARTED", 2)  # the refused seq

    started = json.loads(fork[0][4])
    assert fork[0][1] == "RUN_STARTED"
    assert started["forked_from"] == {"run_id": "otters-brief", "seq": seq}
    assert started["workflow"] == "research_summary"
    assert fork[1:seq] == original[1:seq]  # the prefix, copied as it was
    after = [(kind, step) for _q, kind, step, *_rest in fork[seq:]]
    assert after[0] == ("RUN_RESUMED", 0)
    assert [step for kind, step in after if kind in ("STEP_COMPLETED", "TOOL_COMPLETED")] == [2, 3]
    # The fork's search came from the log: no effect was recorded under its key for step 1.
    assert keys == ["durabl:otters-brief-v2:3", "durabl:otters-brief:1", "durabl:otters-brief:3"]

    # Nothing was written to the original after the fork.
    assert [kind for _q, kind, *_rest in original].count("RUN_RESUMED") == 0
    assert original[-1][1] == "RUN_COMPLETED"
    assert max(at for *_rest, at in original) <= fork[0][5]
    assert runs["otters-brief"][2] <= runs["otters-brief-v2"][1]

    def pid(event: tuple) -> int:
        return json.loads(event[4])["pid"]

    v1_pid, fork_pid, v2_pid = pid(original[0]), pid(fork[0]), pid(fork[seq])
    assert len({v1_pid, fork_pid, v2_pid}) == 3  # deploy v1, `durabl fork`, deploy v2
    assert [line["pid"] for line in searches] == [v1_pid]
    assert [line["pid"] for line in model_calls] == [v1_pid, v2_pid]
    assert [line["pid"] for line in outbox] == [v1_pid, v2_pid]


def test_parallel_fetches_again_only_what_the_kill_lost(tmp_path: Path) -> None:
    out = run_example("parallel.py", tmp_path)
    killed = re.search(r"killed the agent \(pid (\d+)\) with SIGKILL; the run is left RUNNING", out)
    assert killed is not None
    assert "resumed otters-and-kelp: COMPLETED" in out

    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "sources.db")) as conn:
        status, result = conn.execute(
            "SELECT status, result FROM runs WHERE run_id = 'otters-and-kelp'"
        ).fetchone()
        log = conn.execute(
            "SELECT seq, kind, step, data FROM events WHERE run_id = 'otters-and-kelp' ORDER BY seq"
        ).fetchall()
        keys = sorted(k for (k,) in conn.execute("SELECT idempotency_key FROM side_effects"))
    assert status == "COMPLETED"
    started = json.loads(log[0][3])
    urls = started["input"]["urls"]
    resumed_at, resumed = next((q, json.loads(d)) for q, k, _s, d in log if k == "RUN_RESUMED")
    killed_pid, fresh_pid = started["pid"], resumed["pid"]
    assert killed_pid == int(killed.group(1)) != fresh_pid
    parallel = next(json.loads(d) for _q, k, s, d in log if k == "STEP_STARTED" and s == 1)
    assert parallel[0] == "parallel"
    assert [branch[2]["url"] for branch in parallel[1]] == urls
    branch_of = {2 + index: url for index, url in enumerate(urls)}  # after the Parallel's own
    ends = [(q, s, d) for q, k, s, d in log if k in ("STEP_COMPLETED", "TOOL_COMPLETED")]
    assert Counter(s for _q, s, _d in ends) == dict.fromkeys([1, *branch_of, 2 + len(urls)], 1)
    ended_at = {branch_of[s]: q for q, s, _d in ends if s in branch_of}
    before = {url for url, seq in ended_at.items() if seq < resumed_at}
    assert 0 < len(before) < len(urls)

    fetches = jsonl(tmp_path / "fetches.jsonl")
    calls = {url: [f["pid"] for f in fetches if f["url"] == url] for url in urls}
    for url in urls:
        if url in before:  # recorded before the kill: never fetched again
            assert calls[url] == [killed_pid]
        else:  # lost with the killed process, or not begun: fetched once by the fresh one
            assert calls[url].count(fresh_pid) == 1
            assert calls[url].count(killed_pid) <= 1
    position = {url: step for step, url in branch_of.items()}
    assert all(f["key"] == f"durabl:otters-and-kelp:{position[f['url']]}" for f in fetches)
    assert keys == sorted(f"durabl:otters-and-kelp:{step}" for step in branch_of)
    assert max(f["inside"] for f in fetches) <= 3  # max_concurrency

    # Out of order in, in order out.
    assert sorted(urls, key=ended_at.__getitem__) != urls
    parallel_result = next(json.loads(d) for _q, s, d in ends if s == 1)
    assert [page["url"] for page in parallel_result] == urls
    assert json.loads(result)["sources"] == urls
    model_calls = jsonl(tmp_path / "model_calls.jsonl")
    assert [(m["pid"], [url for url, _title in m["prompt"]["pages"]]) for m in model_calls] == [
        (fresh_pid, urls)
    ]


def test_subagents_make_one_child_per_step_and_each_effect_once(tmp_path: Path) -> None:
    out = run_example("subagents.py", tmp_path)
    killed = re.search(
        r"killed the lead's process \(pid (\d+)\) with SIGKILL in the search for 'sea urchins'",
        out,
    )
    assert killed is not None
    assert re.search(r"kelp-brief-2\s+research_topic\s+RUNNING", out)  # `durabl runs`, killed
    assert not re.search(r"kelp-brief-3\s+research_topic", out.split("[3]")[0])  # not yet made

    lead = "kelp-brief"
    children = [f"{lead}-1", f"{lead}-2", f"{lead}-3"]
    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "brief.db")) as conn:
        runs = dict(conn.execute("SELECT run_id, status FROM runs").fetchall())
        results = {r: json.loads(t) for r, t in conn.execute("SELECT run_id, result FROM runs")}
        logs = {run: log_rows(conn, run) for run in runs}
    assert runs == dict.fromkeys([lead, *children], "COMPLETED")  # no second child, no other

    lead_log = logs[lead]
    delegated = [
        (step, json.loads(data))
        for _q, kind, step, data in lead_log
        if kind == "STEP_STARTED" and data.startswith('["child"')
    ]
    assert [step for step, _canonical in delegated] == [1, 2, 3]
    for (step, canonical), child in zip(delegated, children, strict=True):
        kind, first_step, data = logs[child][0][1], logs[child][0][2], json.loads(logs[child][0][3])
        assert (kind, first_step) == ("RUN_STARTED", 0)
        assert data["parent"] == {"run_id": lead, "step": step}
        assert (data["workflow"], data["input"]) == (canonical[1], canonical[2])
        # the child's end, written into the lead's log as its step's result
        ends = [json.loads(d) for _q, k, s, d in lead_log if k == "STEP_COMPLETED" and s == step]
        assert ends == [results[child]]
    assert "parent" not in json.loads(lead_log[0][3])

    def pids(run: str) -> list[int]:
        boundaries = ("RUN_STARTED", "RUN_RESUMED")
        return [json.loads(d)["pid"] for _q, k, _s, d in logs[run] if k in boundaries]

    killed_pid = int(killed.group(1))
    fresh_pid = pids(lead)[-1]
    assert pids(lead) == [killed_pid, fresh_pid]
    assert [pids(child) for child in children] == [
        [killed_pid],
        [killed_pid, fresh_pid],
        [fresh_pid],
    ]

    notes = jsonl(tmp_path / "notes.jsonl")
    assert [(n["key"], n["pid"]) for n in notes] == [
        (f"durabl:{children[0]}:3", killed_pid),
        (f"durabl:{children[1]}:3", fresh_pid),
        (f"durabl:{children[2]}:3", fresh_pid),
    ]
    assert [n["text"] for n in notes] == [results[child]["note"] for child in children]
    searches = jsonl(tmp_path / "searches.jsonl")
    assert [(s["topic"], s["pid"]) for s in searches] == [
        ("sea otters", killed_pid),
        ("sea urchins", killed_pid),  # killed inside it: IDEMPOTENT, so called again
        ("sea urchins", fresh_pid),
        ("kelp", fresh_pid),
    ]

    combined = results[lead]
    assert combined["children"] == children
    assert combined["notes"] == [results[child]["note"] for child in children]
    assert all(results[child]["note"] in combined["brief"] for child in children)


def test_chat_session_continues_as_new_and_answers_each_message_once(tmp_path: Path) -> None:
    out = run_example("chat_session.py", tmp_path)
    assert out.count("$ durabl signal chat-7 msg ") == 6
    assert "the worker exited 0" in out

    messages = [
        "hi, where is my order 1042?",
        "it is a blue kettle",
        "can it come before friday?",
        "to my office address, please",
        "thanks, that is all",
        "bye",
    ]
    early = 4  # typed before anything answered
    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "chat.db")) as conn:
        runs = {
            run: (status, result, created)
            for run, status, result, created in conn.execute(
                "SELECT run_id, status, result, created_s FROM runs"
            )
        }
        logs = {run: log_rows(conn, run) for run in runs}
        signals = {
            run: conn.execute(
                "SELECT id, payload, sent_s, delivered_step FROM signals WHERE run_id = ? "
                "ORDER BY id",
                (run,),
            ).fetchall()
            for run in runs
        }

    chain = ["chat-7"]
    while runs[chain[-1]][0] == "CONTINUED":
        chain.append(json.loads(runs[chain[-1]][1])["continued_as"])
    assert sorted(chain) == sorted(runs)  # every run of the database is one turn of the chain
    assert [runs[run][0] for run in chain] == ["CONTINUED"] * 5 + ["COMPLETED"]
    for before, after in itertools.pairwise(chain):
        _seq, kind, _step, data = logs[before][-1]
        assert (kind, json.loads(data)) == ("RUN_CONTINUED", {"run_id": after})
        assert json.loads(logs[after][0][3])["continued_from"] == before
    assert json.loads(runs[chain[-1]][1]) == {"session": "chat-7", "turns": 6}

    # Each run's log is one turn, of a dozen events at most, whatever the turn.
    for turn, run in enumerate(chain, 1):
        steps = [json.loads(d)[0] for _q, k, _s, d in logs[run] if k == "STEP_STARTED"]
        assert steps == ["signal", "model", "tool"] + (["continue"] if turn < 6 else [])
        assert len(logs[run]) <= 12
        given = json.loads(logs[run][0][3])["input"]
        assert given["turn"] == turn
        assert given["recent"] == messages[max(0, turn - 3) : turn - 1]  # bounded: two at most

    # Each message was taken once, by a turn's wait, in the order sent; the early ones were
    # handed on from run to run, keeping when they were sent, and none is left pending.
    waits = [
        json.loads(d)
        for run in chain
        for _q, k, s, d in logs[run]
        if k == "STEP_COMPLETED" and s == 1
    ]
    assert [w["payload"] for w in waits] == messages
    sent_s = {json.loads(p): at for _id, p, at, _step in signals["chat-7"]}
    assert [json.loads(p) for _id, p, _at, _step in signals["chat-7"]] == messages[:early]
    assert [w["sent_s"] for w in waits[:early]] == [sent_s[m] for m in messages[:early]]
    for turn in range(2, early + 1):  # sent before the run of this turn existed
        assert waits[turn - 1]["sent_s"] < runs[chain[turn - 1]][2]
    assert [len(signals[run]) for run in chain] == [4, 3, 2, 1, 1, 1]
    taken = [json.loads(p) for run in chain for _i, p, _a, step in signals[run] if step == 1]
    assert taken == messages
    assert all(step is not None for run in chain for *_rest, step in signals[run])

    replies = jsonl(tmp_path / "replies.jsonl")
    assert [(r["turn"], r["message"]) for r in replies] == list(enumerate(messages, 1))
    assert [r["key"] for r in replies] == [f"durabl:{run}:3" for run in chain]
    assert len({r["pid"] for r in replies}) == 1  # the worker's
    prompts = [m["prompt"] for m in jsonl(tmp_path / "model_calls.jsonl")]
    assert [(p["turn"], p["message"]) for p in prompts] == list(enumerate(messages, 1))


def test_function_calling_asks_the_model_only_for_what_the_kill_lost(tmp_path: Path) -> None:
    out = run_example("function_calling.py", tmp_path)
    killed = re.search(r"killed the agent \(pid (\d+)\) with SIGKILL inside the forecast", out)
    assert killed is not None
    assert "resumed umbrella-check: COMPLETED, 3 step(s) from the log, 2 executed" in out

    # The database, read with sqlite3 alone.
    with closing(sqlite3.connect(tmp_path / "agent.db")) as conn:
        status, result = conn.execute(
            "SELECT status, result FROM runs WHERE run_id = 'umbrella-check'"
        ).fetchone()
        log = logical(
            conn.execute(
                "SELECT seq, kind, step, data FROM events WHERE run_id = 'umbrella-check' "
                "ORDER BY seq"
            ).fetchall(),
            kind=1,
            data=3,
            fp=None,
        )
    assert status == "COMPLETED"
    killed_pid = json.loads(log[0][3])["pid"]
    resumed_at, resumed = next((q, json.loads(d)) for q, k, _s, d in log if k == "RUN_RESUMED")
    fresh_pid = resumed["pid"]
    assert killed_pid == int(killed.group(1)) != fresh_pid
    started = [json.loads(d)[0] for _q, k, _s, d in log if k == "STEP_STARTED"]
    assert started[:4] == ["model", "tool", "model", "tool"]  # the killed process's
    ends = {s: (q, json.loads(d)) for q, k, s, d in log if k == "STEP_COMPLETED"}
    assert sorted(ends) == [1, 2, 3, 4, 5]
    assert Counter(s for _q, k, s, _d in log if k == "STEP_COMPLETED") == dict.fromkeys(ends, 1)
    assert [s for s, (q, _d) in ends.items() if q < resumed_at] == [1, 2, 3]
    answers = [ends[step][1] for step in (1, 3, 5)]
    for answer in answers:
        assert answer["provider"] == "openai"
        assert answer["model"] == "gpt-4o-mini-2024-07-18"
        assert answer["usage"]["input_tokens"] > 0
        assert answer["cost_usd"] > 0  # priced as gpt-4o-mini
    assert [[c["arguments"] for c in a["tool_calls"]] for a in answers] == [
        [{"city": "Lisbon"}],
        [{"city": "Oslo"}],
        [],
    ]
    assert json.loads(result) == {"answer": answers[2]["text"]}
    assert "showers in Oslo" in answers[2]["text"]

    # What the model server got: one request per answer, none again for a recorded one.
    requests = jsonl(tmp_path / "model_requests.jsonl")
    assert [int(r["pid"]) for r in requests] == [killed_pid, killed_pid, fresh_pid]
    tools = [r["body"]["tools"] for r in requests]
    assert all(offered == tools[0] for offered in tools)
    assert tools[0][0]["function"]["name"] == "get_forecast"
    assert tools[0][0]["function"]["parameters"]["required"] == ["city"]
    assert "idempotency_key" not in tools[0][0]["function"]["parameters"]["properties"]
    given = [[m for m in r["body"]["messages"] if m["role"] == "tool"] for r in requests]
    assert [len(results) for results in given] == [0, 1, 2]
    assert [json.loads(m["content"]) for m in given[2]] == [ends[2][1], ends[4][1]]

    forecasts = jsonl(tmp_path / "forecasts.jsonl")
    assert [(f["city"], f["pid"]) for f in forecasts] == [
        ("Lisbon", killed_pid),
        ("Oslo", killed_pid),  # killed inside it: IDEMPOTENT, so fetched again
        ("Oslo", fresh_pid),
    ]
