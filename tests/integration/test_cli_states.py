"""The command line against a database holding a run in every state, compacted ones included.

One module-wide database is prepared once (``cli_agents.py`` in one process, then ``durabl
compact`` on two runs) and every read command is run against every run of it, side by side;
the tests below check the answers. Databases that get damaged or written are copies or their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_agents import ANSWER_TOKENS
from test_cli import AGENTS, ROOT, Cli, _env, one_line_error

# run id: the state cli_agents puts it in
STATES = {
    "running": "interrupted",
    "sleeping": "sleeping",
    "dead": "dead_lettered",
    "held": "held",
    "completed": "completed",
    "failed": "failed",
    "costly": "costly",
    "reasked": "reasked",
    "c-completed": "completed",
    "c-reasked": "reasked",
    "c-running": "interrupted",
    "last": "interrupted",
}
COMPACTED = ("c-completed", "c-running", "c-reasked")
STATUS = {
    "running": "RUNNING",
    "sleeping": "SLEEPING",
    "dead": "DEAD_LETTERED",
    "held": "HELD",
    "completed": "COMPLETED",
    "failed": "FAILED",
    "costly": "COMPLETED",
    "reasked": "COMPLETED",
    "c-completed": "COMPLETED",
    "c-reasked": "COMPLETED",
    "c-running": "RUNNING",
    "last": "RUNNING",
}
HOW = {  # per step of show --trace: replayed from the log or executed by the last process
    "running": ["executed"] * 2,
    "sleeping": ["pending"],
    "dead": ["dead-lettered"],
    "held": ["executed"],
    "completed": ["executed"] * 4,
    "failed": ["executed"] * 2,
    "costly": ["executed"] * 4,
    "reasked": ["replayed"] * 3 + ["executed"],
    "c-completed": ["executed"] * 4,
    "c-reasked": ["replayed"] * 3 + ["executed"],
    "c-running": ["executed"] * 2,
    "last": ["executed"] * 2,
}
REPLAYED = {  # steps a dry replay serves from the log
    "running": 2,
    "sleeping": 0,
    "dead": 0,
    "held": 1,
    "completed": 4,
    "failed": 2,
    "costly": 4,
    "reasked": 4,
    "c-completed": 4,
    "c-reasked": 4,
    "c-running": 2,
    "last": 2,
}
READ_ONLY = ("show", "trace", "metrics", "replay")


def _read(run_id: str) -> dict[str, list[str]]:
    return {
        "show": ["show", run_id],
        "trace": ["--json", "show", run_id, "--trace"],
        "metrics": ["--json", "metrics", run_id],
        "replay": ["--json", "--import", "cli_agents", "replay", run_id, "--dry"],
    }


def _files(db: Path) -> list[tuple[bytes, int] | None]:
    """The bytes and mtime of the database and its -wal."""
    found = []
    for path in (db, Path(f"{db}-wal")):
        found.append((path.read_bytes(), path.stat().st_mtime_ns) if path.exists() else None)
    return found


@pytest.fixture(scope="module")
def states(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The database, left as a crashed process leaves it: its last writes still in the WAL."""
    cli = Cli(tmp_path_factory.mktemp("states"))
    first, *more = (f"{state}:{run_id}" for run_id, state in STATES.items() if run_id != "last")
    cli.prepare(*first.split(":"), *more)
    for run_id in COMPACTED:
        done = cli("compact", run_id)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[1].split()[0] == run_id
    cli.prepare(STATES["last"], "last")
    assert Path(f"{cli.db}-wal").stat().st_size > 0
    return cli


@pytest.fixture(scope="module")
def answers(states: Cli) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """Every read command on every run, and the database-wide ones, side by side."""
    before = _files(states.db)
    keys = [(run_id, what) for run_id in STATES for what in READ_ONLY]
    keys += [("*", what) for what in ("runs", "dlq", "metrics", "doctor", "doctor-json")]
    whole = {
        "runs": ["runs"],
        "dlq": ["dlq"],
        "metrics": ["--json", "metrics"],
        "doctor": ["doctor"],
        "doctor-json": ["--json", "doctor"],
    }
    commands = [_read(r)[what] if r != "*" else whole[what] for r, what in keys]
    done = dict(zip(keys, states.many(commands), strict=True))
    done["*", "files"] = subprocess.CompletedProcess([], 0, repr(before == _files(states.db)))
    return done


def _ok(done: subprocess.CompletedProcess[str], code: int = 0) -> str:
    assert done.returncode == code, (done.args, done.stdout, done.stderr)
    assert done.stderr == "", done.stderr
    return done.stdout


def test_read_commands_change_nothing(answers: dict[Any, Any]) -> None:
    assert answers["*", "files"].stdout == "True"


def test_show_in_every_state(states: Cli, answers: dict[Any, Any]) -> None:
    for run_id, status in STATUS.items():
        text = _ok(answers[run_id, "show"], 1 if status == "FAILED" else 0)
        lines = text.splitlines()
        assert lines[0].startswith(f"run {run_id} (") and lines[0].endswith(f": {status}")
        compacted = [line for line in lines if "were compacted" in line]
        assert bool(compacted) == (run_id in COMPACTED), text
    assert "error: NonDeterminismError" in answers["held", "show"].stdout
    assert "DEAD_LETTERED" in answers["dead", "show"].stdout.splitlines()[-1]
    # a compacted run: its spend (its model reports usage and names no model, so no price),
    # one line for the folded prefix, then the events after it
    lines = answers["c-completed", "show"].stdout.splitlines()
    assert lines[1].startswith("spend: unknown (1 answer of a model with no price), 25 tokens")
    assert lines[2].startswith("no price, cost unknown: step ")
    assert lines[3] == "seqs 1..6 were compacted into a snapshot of 4 steps"
    assert lines[4].split() == ["SEQ", "TIME", "(UTC)", "KIND", "STEP", "DATA"]
    assert [line.split()[0] for line in lines[5:]] == ["7"]
    assert "RUN_COMPLETED" in lines[5]
    shown = states.json("show", "c-running")
    assert (shown["watermark"], shown["snapshot_steps"], shown["events"]) == (4, 2, [])
    whole = states.json("show", "completed")
    assert (whole["watermark"], whole["snapshot_steps"]) == (0, 0)
    assert [e["seq"] for e in whole["events"]] == list(range(1, 8))


def test_show_trace_in_every_state(answers: dict[Any, Any]) -> None:
    for run_id, how in HOW.items():
        trace = json.loads(_ok(answers[run_id, "trace"], 1 if run_id == "failed" else 0))
        assert [s["how"] for s in trace["steps"]] == how, run_id
        assert trace["processes"] == (2 if run_id in ("reasked", "c-reasked", "dead") else 1)
    plain = json.loads(answers["completed", "trace"].stdout)
    folded = json.loads(answers["c-completed", "trace"].stdout)
    assert folded["watermark"] == 6 and {s["step"] for s in folded["steps"]} == {None}
    described = [s["description"].replace("c-completed", "completed") for s in folded["steps"]]
    assert described == [s["description"] for s in plain["steps"]]
    assert described[0] == "ModelCall('plan for completed')"


def test_replay_dry_in_every_state(answers: dict[Any, Any]) -> None:
    for run_id, replayed in REPLAYED.items():
        state = json.loads(_ok(answers[run_id, "replay"], 1 if run_id == "failed" else 0))
        assert (state["steps_replayed"], state["steps_executed"]) == (replayed, 0), run_id
        assert state["status"] == STATUS[run_id]
    assert json.loads(answers["c-running", "replay"].stdout)["next_step"] == (
        "ToolCall('effect', {\"n\":1})"
    )


def test_metrics_match_what_the_workflows_did(states: Cli, answers: dict[Any, Any]) -> None:
    figures = {r: json.loads(_ok(answers[r, "metrics"], int(r == "failed"))) for r in STATES}
    costly = figures["costly"]
    plan, summary = len("plan for costly"), len("summarize the two effects of costly")
    assert (costly["steps"], costly["model_calls"], costly["tool_calls"]) == (4, 2, 2)
    assert (costly["attempts"], costly["retries"], costly["resumes"]) == (4, 0, 0)
    assert costly["input_tokens"] == plan + summary
    assert costly["output_tokens"] == 2 * ANSWER_TOKENS
    assert costly["total_tokens"] == plan + summary + 2 * ANSWER_TOKENS
    assert costly["reexecuted_model_calls"] == costly["reexecuted_tokens"] == 0
    assert costly["wall_s"] >= costly["step_s"] > 0

    # the second process asked the model again for the answer the first one lost
    reasked = figures["reasked"]
    summary = len("summarize the two effects of reasked")
    assert (reasked["reexecuted_model_calls"], reasked["reexecuted_tool_calls"]) == (1, 0)
    assert reasked["reexecuted_tokens"] == summary + ANSWER_TOKENS
    assert (reasked["attempts"], reasked["resumes"], reasked["replayed_steps"]) == (5, 1, 3)
    assert states.calls().count("model\tsummarize the two effects of reasked") == 2

    folded = figures["c-reasked"]
    assert (folded["reexecuted_model_calls"], folded["replayed_steps"]) == (1, 3)
    assert (
        folded["reexecuted_tokens"] == len("summarize the two effects of c-reasked") + ANSWER_TOKENS
    )
    assert (figures["failed"]["failed_steps"], figures["dead"]["dead_letters"]) == (1, 1)
    assert figures["sleeping"]["steps"] == 0 and figures["running"]["steps"] == 2
    for run_id in COMPACTED:  # the figures of the folded prefix are kept by the snapshot
        twin = figures[run_id.removeprefix("c-")]
        mine = figures[run_id]
        for name in ("steps", "model_calls", "tool_calls", "attempts", "output_tokens", "resumes"):
            assert mine[name] == twin[name], (run_id, name)

    whole = json.loads(_ok(answers["*", "metrics"]))
    assert [r["run_id"] for r in whole["runs"]] == list(reversed(STATES))
    total = whole["total"]
    assert total["runs"] == len(STATES)
    for name in ("steps", "model_calls", "tool_calls", "reexecuted_tokens", "total_tokens"):
        assert total[name] == sum(figures[r][name] for r in STATES), name

    lines = states("metrics", "reasked").stdout.splitlines()
    shown = dict(re.split(r"\s{2,}", line, maxsplit=1) for line in lines[2:])
    assert shown["re-executed model calls"] == "1"
    assert shown["re-executed tokens"] == f"{summary + ANSWER_TOKENS} (estimated)"
    assert shown["total tokens"] == str(reasked["total_tokens"])
    assert {"wall clock", "time in steps", "timer waits", "resumes"} <= set(shown)
    table = _ok(answers["*", "runs"]).splitlines()
    assert len(table) == len(STATES) + 1


def test_doctor_is_healthy_in_every_state(answers: dict[Any, Any]) -> None:
    text = _ok(answers["*", "doctor"])
    lines = text.splitlines()
    assert lines[0].split() == ["CHECK", "RESULT", "DETAIL"]
    checks = [line.split()[:2] for line in lines[1:-1]]
    assert checks == [
        [name, "ok"]
        for name in ("open", "integrity", "schema", "checksums", "logs", "status", "orphans")
    ]
    assert lines[-1] == "healthy"
    report = json.loads(_ok(answers["*", "doctor-json"]))
    assert report["healthy"] and all(f["ok"] for f in report["findings"])
    assert "3 snapshots" in text and f"{len(STATES)} runs" in text
    assert _ok(answers["*", "dlq"]).splitlines()[1].split()[0] == "dead"


def _copy(cli: Cli, name: str) -> Path:
    """A self-contained copy of the module's database (its WAL folded in)."""
    target = cli.tmp / name
    source = sqlite3.connect(f"file:{cli.db}?mode=ro", uri=True)
    copy = sqlite3.connect(target)
    source.backup(copy)
    source.close()
    copy.close()
    return target


def _damage(db: Path, *statements: str) -> None:
    """Run ``statements`` with the log's triggers dropped, then put the triggers back."""
    conn = sqlite3.connect(db)
    triggers = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger'").fetchall()
    for name, _ in triggers:
        conn.execute(f"DROP TRIGGER {name}")
    for statement in statements:
        assert conn.execute(statement).rowcount == 1, statement
    for _, sql in triggers:
        conn.execute(sql)
    conn.commit()
    conn.close()


def test_doctor_names_the_damage(states: Cli, tmp_path: Path) -> None:
    flipped = _copy(states, "flipped.db")
    _damage(
        flipped,
        "UPDATE events SET data = replace(data, '\"n\":1', '\"n\":7') "
        "WHERE run_id = 'completed' AND seq = 5",
    )
    snapshot = _copy(states, "snapshot.db")
    _damage(
        snapshot,
        "UPDATE snapshots SET body = replace(body, 'plan for', 'plan For') "
        "WHERE run_id = 'c-completed'",
    )
    hole = _copy(states, "hole.db")
    _damage(hole, "DELETE FROM events WHERE run_id = 'costly' AND seq = 5")
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    newer = _copy(states, "newer.db")
    with sqlite3.connect(newer) as conn:
        conn.execute("PRAGMA user_version = 99")
    conn.close()
    text = tmp_path / "notes.txt"
    text.write_text("hello\n" * 50)
    writer = _copy(states, "writer.db")
    with sqlite3.connect(writer) as conn:
        conn.execute("DROP TRIGGER events_with_effects_insert")
    conn.close()
    damaged = [flipped, snapshot, hole, foreign, newer, text, writer]
    before = [p.read_bytes() for p in damaged]

    reports = states.many([["doctor", "--db", str(p)] for p in damaged])
    findings = []
    for report in reports:
        assert report.returncode == 1, (report.args, report.stdout, report.stderr)
        assert report.stdout.splitlines()[-1].startswith("damaged: 1 problem")
        lines = [" ".join(line.split()) for line in report.stdout.splitlines()]
        [found] = [line for line in lines if " DAMAGED " in line]
        findings.append(found)
    assert (
        findings[0]
        == "checksums DAMAGED run completed seq 5: the event (TOOL_COMPLETED) fails its checksum"
    )
    assert findings[1].startswith("checksums DAMAGED run c-completed: the snapshot (its log up")
    assert findings[2] == "logs DAMAGED run completed: seq 5 is missing from the log".replace(
        "completed", "costly"
    )
    assert (
        findings[3].startswith("open DAMAGED") and "not a durabl database; refusing" in findings[3]
    )
    assert "schema v99" in findings[4] and "newer durabl" in findings[4]
    assert "not a SQLite file" in findings[5]
    assert findings[6].endswith(
        "trigger events_with_effects_insert is missing: a finished tool call can no longer be "
        "recorded (its commit inserts through the trigger's view)"
    )
    assert [p.read_bytes() for p in damaged] == before

    refused = states("show", "completed", db=flipped)
    one_line_error(refused, "seq 5", "checksum")


def test_compact_folds_the_other_runs_when_one_log_is_damaged(states: Cli) -> None:
    damaged = _copy(states, "compact-damaged.db")
    _damage(
        damaged,
        "UPDATE events SET data = replace(data, '\"n\":1', '\"n\":7') "
        "WHERE run_id = 'completed' AND seq = 5",
    )
    done = states("--json", "compact", db=damaged)
    assert done.returncode == 1, (done.stdout, done.stderr)
    report = json.loads(done.stdout)
    assert list(report["errors"]) == ["completed"]
    assert "seq 5" in report["errors"]["completed"]
    assert "checksum" in report["errors"]["completed"]
    folded = {r["run_id"] for r in report["runs"]}
    assert "costly" in folded and "completed" not in folded
    assert report["bytes_before"] > 0 and report["bytes_after"] > 0
    text = states("compact", db=damaged)  # everything foldable is folded now
    assert text.returncode == 1
    assert text.stdout.splitlines()[0] == "nothing to fold"
    assert any(
        line.startswith("not compacted: completed: StorageError")
        for line in text.stdout.splitlines()
    )


def test_compact_shrinks_a_long_run_and_changes_no_answer(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    cli.prepare("long", "long", "completed:short")
    questions = [_read("long")[what] for what in ("trace", "metrics", "replay")]
    before = [json.loads(_ok(done)) for done in cli.many(questions)]
    size = _on_disk(cli.db)

    partial = cli("--json", "compact", "long", "--keep-last", "5")
    shrunk = json.loads(_ok(partial))
    row = shrunk["runs"][0]
    # 151 steps: RUN_STARTED, the model call's 2 events, then one TOOL_COMPLETED per tool call
    assert (row["run_id"], row["steps_folded"], row["events_deleted"]) == ("long", 146, 148)
    assert (row["watermark"], row["events_kept"]) == (148, 6)
    # The snapshot keeps every folded step's result: what goes is the rest of each event (its
    # step's canonical text, its seq, time and checksum) and the index entries.
    assert shrunk["bytes_after"] < shrunk["bytes_before"] * 0.95
    text = cli("compact", "long")  # the table on stdout, then the sizes
    lines = _ok(text).splitlines()
    assert lines[1].split() == ["long", "151", "5", "153", "1"]
    assert re.fullmatch(r"file: \d+ bytes before, \d+ bytes after", lines[-1])
    folded = cli.json("compact")
    assert [(r["run_id"], r["steps_folded"]) for r in folded["runs"]] == [("short", 4)]
    assert folded["busy"] == []
    assert _on_disk(cli.db) < size * 0.95
    again = cli("compact")
    assert _ok(again).splitlines()[0] == "nothing to fold"

    after = [json.loads(_ok(done)) for done in cli.many(questions)]
    trace_before, trace_after = before[0], after[0]
    assert [(s["how"], s["description"]) for s in trace_after["steps"]] == [
        (s["how"], s["description"]) for s in trace_before["steps"]
    ]
    assert trace_after["watermark"] == 153 and trace_before["watermark"] == 0
    assert after[1:] == before[1:]  # metrics and the dry replay
    _ok(cli("doctor"))


def _on_disk(db: Path) -> int:
    wal = Path(f"{db}-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def test_compact_skips_a_run_a_live_process_drives(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    cli.prepare("completed", "done")
    command = [sys.executable, str(AGENTS), str(cli.db), "live:busy"]
    env = _env(tmp_path)
    with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as live:
        try:
            deadline = time.monotonic() + 20
            while not any(line.startswith("hold\t") for line in cli.calls()):
                assert live.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            one_line_error(cli("compact", "busy"), "busy", "being driven by process")
            report = cli.json("compact")
            assert report["busy"] == ["busy"]
            assert [r["run_id"] for r in report["runs"]] == ["done"]
        finally:
            Path(f"{cli.db}.busy.gate").touch()
            _, errors = live.communicate(timeout=20)
        assert live.returncode == 0, errors
    done = cli("compact", "busy")
    assert _ok(done).splitlines()[1].split()[:2] == ["busy", "2"]


def test_user_errors_are_one_line(states: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nothing.db"
    commands = [
        ["metrics", "nope"],
        ["compact", "nope"],
        ["compact", "--keep-last", "-1"],
        ["compact", "--keep-last", "many"],
        ["runs", "--status", "DONE"],
        ["--db", str(missing), "metrics"],
        ["--db", str(missing), "compact"],
        ["--db", str(missing), "doctor"],
    ]
    needles = [
        ["nope"],
        ["nope"],
        ["--keep-last", "0 or more"],
        ["--keep-last", "'many'"],
        ["DONE"],
        *[[str(missing), "does not exist"]] * 3,
    ]
    for done, wanted in zip(states.many(commands), needles, strict=True):
        one_line_error(done, *wanted)
    assert not missing.exists() and not Path(f"{missing}-wal").exists()


def _on_a_terminal(cli: Cli, *args: str) -> str:
    """Run a command with its stdout on a pseudo-terminal; what it drew there."""
    reader, writer = pty.openpty()
    command = [sys.executable, "-m", "durabl", "--db", str(cli.db), *args]
    env = _env(cli.tmp, COLUMNS="160")
    with subprocess.Popen(command, env=env, stdout=writer, stderr=subprocess.PIPE) as proc:
        os.close(writer)
        drawn = b""
        with contextlib.suppress(OSError):  # EIO once the command has exited
            while chunk := os.read(reader, 4096):
                drawn += chunk
        os.close(reader)
        _, errors = proc.communicate(timeout=30)
    assert proc.returncode in (0, 1), errors
    return drawn.decode()


def test_tables_on_a_terminal_and_no_rich_on_import(states: Cli) -> None:
    for args, needles in (
        (["runs"], ["c-completed", "HELD"]),
        (["show", "c-completed"], ["were compacted", "RUN_COMPLETED"]),
        (["show", "reasked", "--trace"], ["replayed", "executed"]),
        (["metrics"], ["re-executed tokens", "reasked"]),
        (["doctor"], ["integrity", "healthy"]),
    ):
        drawn = _on_a_terminal(states, *args)
        assert "─" in drawn or "━" in drawn, (args, drawn)
        for needle in needles:
            assert needle in drawn, (args, needle)
    imported = subprocess.run(
        [sys.executable, "-c", "import durabl, durabl.cli, sys; print('rich' in sys.modules)"],
        env=_env(states.tmp),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert imported.stdout.strip() == "False", imported.stderr
