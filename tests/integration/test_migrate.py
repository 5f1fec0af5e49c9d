"""``durabl migrate``: a SQLite database copied to a real PostgreSQL server, whole and verified.

One SQLite file holds a run in each state (completed, sleeping on a timer, failed,
dead-lettered, held, compacted, waiting for a signal with one signal taken and one sent but not
yet taken, and one interrupted inside an ambiguous window with its lease and key claim still in
the file); each test migrates it into a database of its own, created on the test server and
dropped afterwards. The server must be up: without it these tests fail, they are
never skipped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from durabl import ModelCall, Runtime, Sleep, ToolCall, WaitSignal, codec, tool, workflow
from durabl.crashpoints import CrashAt, ProcessDeath
from durabl.errors import (
    CopyMismatchError,
    EventChecksumError,
    MigrationRefusedError,
    NonDeterminismError,
    NotADatabaseError,
    StorageError,
    TargetBusyError,
    TargetNotEmptyError,
)
from durabl.store import SQLiteStore, Store, open_store, transfer
from durabl.store.base import Signal
from durabl.store.doctor import examine
from durabl.store.transfer import CHECKING, COPYING, VERIFYING, copy_database

SERVER = "postgresql://127.0.0.1:5432"
ADMIN_URL = f"{SERVER}/postgres"
START_S = 1_700_000_000.0
ROOT = Path(__file__).resolve().parent.parent.parent


@contextlib.contextmanager
def postgres_databases() -> Iterator[Callable[[], str]]:
    """A maker of empty databases on the test server (``durabl_test_<hex>``), each dropped WITH
    (FORCE) when the block ends. An unreachable server raises: the test fails."""
    made: list[str] = []

    def create() -> str:
        name = f"durabl_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        made.append(name)
        return f"{SERVER}/{name}"

    try:
        yield create
    finally:
        if made:
            with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
                for name in made:
                    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                    conn.execute(drop.format(sql.Identifier(name)))


@pytest.fixture
def database() -> Iterator[Callable[[], str]]:
    with postgres_databases() as create:
        yield create


# -- the workflows and the world they touch ---------------------------------------------------

CALLS: Counter[str] = Counter()
VERSION = {"first": 1}


def effect(n: int) -> dict[str, int]:
    CALLS[f"effect {n}"] += 1
    return {"n": n}


def notify(to: str, *, idempotency_key: str) -> dict[str, str]:
    CALLS[f"notify {to}"] += 1
    return {"sent": to, "key": idempotency_key}


def broken(n: int) -> None:
    CALLS["broken"] += 1
    raise RuntimeError("the far end said no")


def llm(prompt: str, **params: Any) -> dict[str, str]:
    CALLS["llm"] += 1
    return {"text": f"plan: {prompt}"}


TOOLS = {
    "effect": tool(effect, mode="IDEMPOTENT"),
    "notify": tool(notify, mode="AT_MOST_ONCE"),
    "broken": tool(broken, mode="IDEMPOTENT", max_attempts=1),
}


@workflow(name="migrate_chain")
def chain(ctx: Any, steps: int = 3) -> Any:
    plan = yield ModelCall(f"plan for {ctx.run_id}")
    for i in range(steps):
        yield ToolCall("effect", {"n": i})
    return plan["text"]


@workflow(name="migrate_sleeper")
def sleeper(ctx: Any) -> Any:
    yield ToolCall("effect", {"n": 100})
    yield Sleep(hours=1)
    return (yield ToolCall("effect", {"n": 101}))


@workflow(name="migrate_failing")
def failing(ctx: Any) -> Any:
    yield ToolCall("effect", {"n": 0})
    return (yield ToolCall("broken", {"n": 1}))


@workflow(name="migrate_notify")
def notify_then_effect(ctx: Any) -> Any:
    sent = yield ToolCall("notify", {"to": ctx.run_id}, idempotency_key=f"notify-{ctx.run_id}")
    yield ToolCall("effect", {"n": 0})
    return sent


@workflow(name="migrate_drifting")
def drifting(ctx: Any) -> Any:
    yield ToolCall("effect", {"n": VERSION["first"]})
    yield ToolCall("effect", {"n": 200})
    return "done"


@workflow(name="migrate_waiter")
def waiter(ctx: Any) -> Any:
    answers = []
    for _ in range(3):
        answers.append((yield WaitSignal("answer")))
    return answers


WORKFLOWS = [chain, sleeper, failing, notify_then_effect, drifting, waiter]


def _runtime(db: str | Path) -> Runtime:
    return Runtime(db, llm=llm, tools=TOOLS, workflows=WORKFLOWS, clock=lambda: START_S)


def _crashed(db: Path, wf: Any, run_id: str, point: str) -> Runtime:
    """A process that died at ``point``: its runtime abandoned, its lease left in the file."""
    rt = _runtime(db)
    with CrashAt(point) as crash, contextlib.suppress(ProcessDeath):
        rt.start(wf, run_id=run_id)
    assert crash.fired, point
    return rt


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite file every test migrates: one run in each state."""
    db = tmp_path_factory.mktemp("migrate") / "agent.db"
    abandoned = []
    with _runtime(db) as rt:
        assert rt.run(chain, run_id="completed").status == "COMPLETED"
        assert rt.run(sleeper, run_id="sleeping").status == "SLEEPING"
        assert rt.run(failing, run_id="failed").status == "FAILED"
        assert rt.run(chain, {"steps": 5}, run_id="compacted").status == "COMPLETED"
        assert rt.compact("compacted", keep_last=1).runs[0].watermark > 0
        assert rt.run(waiter, run_id="waiting").status == "WAITING"
        assert rt.signal("waiting", "answer", "first") == 1
        assert [s.run_id for s in rt.tick()] == ["waiting"]  # taken by the first wait
        assert rt.signal("waiting", "answer", "second") == 2  # sent, due, not yet taken
    abandoned.append(_crashed(db, notify_then_effect, "dead", "after_tool_dispatched"))
    with _runtime(db) as rt:
        assert rt.resume("dead").status == "DEAD_LETTERED"
    abandoned.append(_crashed(db, drifting, "held", "after_step_committed"))
    VERSION["first"] = 2  # a deploy that changed the workflow's first step
    with _runtime(db) as rt, contextlib.suppress(NonDeterminismError):
        rt.resume("held")
    VERSION["first"] = 1
    # interrupted inside the ambiguous window: its lease and its key claim stay in the file
    abandoned.append(_crashed(db, notify_then_effect, "interrupted", "after_tool_dispatched"))
    for rt in abandoned:
        rt.close()
    return db


# -- reading both sides -------------------------------------------------------------------------


def _sqlite_rows(db: Path, query: str) -> list[tuple[Any, ...]]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return conn.execute(query).fetchall()


def _dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every durabl table on the server, for before-and-after comparisons."""
    tables = ("meta", "runs", "events", "side_effects", "key_claims", "snapshots", "signals")
    with psycopg.connect(url) as conn:
        return {
            t: conn.execute(f"SELECT * FROM durabl.{t} ORDER BY 1, 2").fetchall() for t in tables
        }


def _has_durabl_schema(url: str) -> bool:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT COUNT(*) FROM pg_namespace WHERE nspname = 'durabl'")
        return (found.fetchone() or (0,))[0] == 1


def _runs_on_server(url: str) -> int:
    with psycopg.connect(url) as conn:
        return (conn.execute("SELECT COUNT(*) FROM durabl.runs").fetchone() or (0,))[0]


# -- the tests --------------------------------------------------------------------------------


def test_every_run_arrives_whole_and_goes_on_from_where_it_was(
    source: Path, database: Callable[[], str]
) -> None:
    url = database()
    passes: list[str] = []
    report = copy_database(source, url, progress=lambda step, done, total: passes.append(step))
    assert [p for p in dict.fromkeys(passes)] == [CHECKING, COPYING, VERIFYING]
    counts = _sqlite_rows(
        source,
        "SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM events), "
        "(SELECT COUNT(*) FROM side_effects), (SELECT COUNT(*) FROM key_claims), "
        "(SELECT COUNT(*) FROM snapshots), (SELECT COUNT(*) FROM signals)",
    )[0]
    found = (
        *(report.runs, report.events, report.side_effects),
        *(report.claims, report.snapshots, report.signals),
    )
    assert found == counts
    assert (report.runs, report.claims, report.snapshots, report.signals) == (8, 2, 1, 2)
    assert report.leases_cleared == 1  # the interrupted run's
    assert report.target == url and report.seconds > 0

    before = SQLiteStore(source, read_only=True)
    after = open_store(url)
    try:
        for row in before.list_runs():
            assert after.load_history(row.run_id) == before.load_history(row.run_id), row.run_id
            copied = after.get_run(row.run_id)
            assert copied is not None and copied.lease is None  # leases are not copied...
            assert copied.lease_token == row.lease_token  # ...their tokens are
            assert dataclasses.replace(row, lease=None) == copied
            assert after.signals(row.run_id) == before.signals(row.run_id), row.run_id
        assert [(s.id, s.payload_text, s.delivered_step) for s in after.signals("waiting")] == [
            (1, '"first"', 1),
            (2, '"second"', None),
        ]
        pending = after.pending_signal("waiting", "answer")
        assert pending == Signal(id=2, name="answer", payload_text='"second"', sent_s=START_S)
        for (key,) in _sqlite_rows(source, "SELECT idempotency_key FROM side_effects"):
            assert after.side_effect(key) == before.side_effect(key) is not None
        for (key,) in _sqlite_rows(source, "SELECT idempotency_key FROM key_claims"):
            assert after.key_claim(key) == before.key_claim(key) is not None
        interrupted_token = _token(after, "interrupted")
    finally:
        before.close()
        after.close()
    with psycopg.connect(url) as conn:
        fenced = conn.execute("SELECT COUNT(*) FROM durabl.events WHERE fence IS NOT NULL")
        assert (fenced.fetchone() or (1,))[0] == 0

    CALLS.clear()
    with _runtime(url) as rt:
        # the signal sent but not taken on SQLite: the run is due, and the next wait takes it
        assert [(s.run_id, s.status) for s in rt.tick()] == [("waiting", "WAITING")]
        assert rt.signal("waiting", "answer", "third") == 3  # numbered on from the copy's
        [answered] = rt.tick()
        assert (answered.run_id, answered.status) == ("waiting", "COMPLETED")
        assert rt.result("waiting") == ["first", "second", "third"]
        assert [s.delivered_step for s in rt.store.signals("waiting")] == [1, 2, 3]
        wake_at_s = rt.state("sleeping").wake_at_s
        assert wake_at_s is not None
        [fired] = rt.tick(now=wake_at_s + 1)
        assert (fired.run_id, fired.status) == ("sleeping", "COMPLETED")
        assert fired.result == {"n": 101}
        assert rt.state("held").status == "HELD"
        assert rt.state("dead").status == "DEAD_LETTERED"
        assert [d.run_id for d in rt.dead_letters()] == ["dead"]
        assert rt.state("completed").status == "COMPLETED"
        assert rt.state("failed").status == "FAILED"
        # nobody holds the interrupted run on the server: it is taken at once, with a new token
        assert rt.resume("interrupted").status == "DEAD_LETTERED"  # its ambiguous window
        assert _token(rt.store, "interrupted") > interrupted_token
    assert dict(CALLS) == {"effect 101": 1}  # the completed step before the timer: not again


def _token(store: Store, run_id: str) -> int:
    row = store.get_run(run_id)
    assert row is not None
    return row.lease_token


def test_a_target_holding_durabl_data_is_refused_and_left_as_it_was(
    source: Path, database: Callable[[], str]
) -> None:
    url = database()
    with _runtime(url) as rt:
        rt.run(chain, {"steps": 1}, run_id="already-here")
    before = _dump(url)
    with pytest.raises(TargetNotEmptyError) as refused:
        copy_database(source, url)
    assert str(refused.value).startswith(f"{url} already holds durabl data (1 run,")
    assert refused.value.runs == 1
    assert _dump(url) == before


def test_a_target_holding_only_signals_is_refused_too(
    source: Path, database: Callable[[], str]
) -> None:
    """Any durabl row makes a target not empty, a signal too: copied beside it, a run's own
    signals would collide with it or be numbered after it."""
    url = database()
    open_store(url).close()
    with psycopg.connect(url) as conn:
        conn.execute(
            "INSERT INTO durabl.signals VALUES ('waiting', 1, 'answer', '\"early\"', 0, NULL)"
        )
    before = _dump(url)
    with pytest.raises(TargetNotEmptyError):
        copy_database(source, url)
    assert _dump(url) == before


def test_a_target_another_session_holds_is_reported_not_waited_for(
    source: Path, database: Callable[[], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = database()
    open_store(url).close()
    monkeypatch.setattr(transfer, "_LOCK_TIMEOUT_S", 0.3)
    with psycopg.connect(url) as other:  # a transaction left open, holding a table
        other.execute("LOCK TABLE durabl.key_claims IN ROW EXCLUSIVE MODE")
        with pytest.raises(TargetBusyError, match="another session held durabl's tables"):
            copy_database(source, url)
    assert _runs_on_server(url) == 0


def test_a_damaged_source_event_is_refused_before_the_target_is_touched(
    source: Path, database: Callable[[], str], tmp_path: Path
) -> None:
    damaged = tmp_path / "damaged.db"
    shutil.copyfile(source, damaged)
    with contextlib.closing(sqlite3.connect(damaged)) as conn:
        conn.execute("DROP TRIGGER events_append_only")
        changed = conn.execute(
            "UPDATE events SET data = '\"forged\"' WHERE run_id = 'sleeping' AND seq = 3"
        ).rowcount
        conn.commit()
    assert changed == 1
    url = database()
    with pytest.raises(EventChecksumError) as refused:
        copy_database(damaged, url)
    assert (refused.value.run_id, refused.value.seq) == ("sleeping", 3)
    assert "seq 3 of run sleeping" in str(refused.value)
    assert not _has_durabl_schema(url)  # not even the schema was created


@pytest.mark.parametrize(
    ("table", "tampering", "difference"),
    [
        (
            "events",
            "IF NEW.run_id = 'failed' AND NEW.seq = 2 THEN NEW.data := '\"tampered\"'; END IF;",
            "the events row of run 'failed' seq 2 differs in data",
        ),
        (
            "signals",
            "IF NEW.run_id = 'waiting' AND NEW.id = 1 THEN NEW.delivered_step := NULL; END IF;",
            "the signals row of run 'waiting' signal 1 differs in delivered_step",
        ),
    ],
    ids=["event", "signal"],
)
def test_a_copy_that_arrives_different_is_rolled_back_whole(
    source: Path, database: Callable[[], str], table: str, tampering: str, difference: str
) -> None:
    url = database()
    open_store(url).close()  # the schema, and then a trigger that alters what arrives
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION durabl.tamper() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            f"{tampering} RETURN NEW; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER tamper BEFORE INSERT ON durabl.{table} "
            "FOR EACH ROW EXECUTE FUNCTION durabl.tamper()"
        )
    with pytest.raises(CopyMismatchError) as refused:
        copy_database(source, url)
    assert difference in str(refused.value)
    assert _runs_on_server(url) == 0


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (
            "DELETE FROM signals WHERE run_id = 'waiting' AND id = 1",
            "run waiting's signals go from #0 to #2",
        ),
        (
            "INSERT INTO signals VALUES ('ghost', 1, 'answer', '\"boo\"', 0, NULL)",
            "a signal names run 'ghost', which does not exist",
        ),
    ],
    ids=["signal-missing", "signal-of-no-run"],
)
def test_damaged_signals_are_refused_before_the_target_is_touched(
    source: Path, database: Callable[[], str], tmp_path: Path, damage: str, why: str
) -> None:
    damaged = tmp_path / "damaged.db"
    shutil.copyfile(source, damaged)
    with contextlib.closing(sqlite3.connect(damaged)) as conn:
        conn.execute("DROP TRIGGER signals_never_deleted")
        assert conn.execute(damage).rowcount == 1
        conn.commit()
    url = database()
    with pytest.raises(MigrationRefusedError, match=why):
        copy_database(damaged, url)
    assert not _has_durabl_schema(url)


def test_a_file_from_before_signals_is_refused_until_a_runtime_migrates_it(
    tmp_path: Path, database: Callable[[], str]
) -> None:
    """A v3 file (no signals table) opens read-only as it is: the copy refuses it by its
    version, before reading a table it lacks or touching the target, and says how to make it
    current. Once a runtime has opened it, it is copied like any other."""
    old = tmp_path / "v3.db"
    with _runtime(old) as rt:
        assert rt.run(chain, {"steps": 1}, run_id="before-signals").status == "COMPLETED"
    with contextlib.closing(sqlite3.connect(old)) as conn:
        conn.execute("DROP VIEW events_with_effects")  # with its trigger: what v5 added
        conn.execute("DROP TABLE signals")  # with its index and triggers: what v4 added
        conn.execute("PRAGMA user_version = 3")
        conn.commit()
    url = database()
    with pytest.raises(MigrationRefusedError, match="its schema is v3, older than this durabl's"):
        copy_database(old, url)
    assert not _has_durabl_schema(url)
    assert _sqlite_rows(old, "PRAGMA user_version") == [(3,)]  # the copy never writes the file

    SQLiteStore(old).close()  # what opening it with a runtime does first
    report = copy_database(old, url)
    assert (report.runs, report.signals) == (1, 0)
    with _runtime(url) as rt:
        assert rt.result("before-signals") == "plan: plan for before-signals"
        assert rt.store.signals("before-signals") == []


def _crc_formats(db: Path | str, run_id: str) -> set[int]:
    if isinstance(db, str):
        with psycopg.connect(db) as conn:
            found = conn.execute("SELECT crc FROM durabl.events WHERE run_id = %s", (run_id,))
            return {crc >> 32 for (crc,) in found.fetchall()}
    found = _sqlite_rows(db, f"SELECT crc FROM events WHERE run_id = '{run_id}'")
    return {crc >> 32 for (crc,) in found}


def test_a_log_an_older_durabl_checksummed_is_read_extended_and_copied(
    tmp_path: Path, database: Callable[[], str]
) -> None:
    """A v5 file's events carry format 0 crcs. A runtime opens it (to v6) and replays and goes
    on with it as it is; the runs it writes then carry format 1, doctor finds the file whole,
    and both formats arrive on PostgreSQL and hold there: one run's log holds both."""
    old = tmp_path / "v5.db"
    with _runtime(old) as rt:
        assert rt.run(chain, {"steps": 2}, run_id="before").status == "COMPLETED"
        assert rt.run(sleeper, run_id="sleeping").status == "SLEEPING"
    with contextlib.closing(sqlite3.connect(old)) as conn:
        (guard,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'events_append_only'"
        ).fetchone()
        conn.execute("DROP TRIGGER events_append_only")
        rows = conn.execute("SELECT run_id, seq, kind, step, fp, data, at_s FROM events").fetchall()
        for run_id, *row in rows:
            conn.execute(
                "UPDATE events SET crc = ? WHERE run_id = ? AND seq = ?",
                (codec.checksum_format_0(*row), run_id, row[0]),
            )
        conn.execute(guard)
        conn.execute("PRAGMA user_version = 5")
        conn.commit()
    assert _crc_formats(old, "before") == _crc_formats(old, "sleeping") == {0}

    with _runtime(old) as rt:
        assert rt.replay("before").result == "plan: plan for before"
        assert rt.run(chain, {"steps": 2}, run_id="after").status == "COMPLETED"
        wake_at_s = rt.state("sleeping").wake_at_s
        assert wake_at_s is not None
        [fired] = rt.tick(now=wake_at_s + 1)
        assert (fired.run_id, fired.status) == ("sleeping", "COMPLETED")
    assert _sqlite_rows(old, "PRAGMA user_version") == [(6,)]
    assert _crc_formats(old, "after") == {1}
    assert _crc_formats(old, "sleeping") == {0, 1}
    assert [f.message for f in examine(str(old)) if not f.ok] == []

    url = database()
    assert copy_database(old, url).runs == 3
    assert _crc_formats(url, "before") == {0} and _crc_formats(url, "after") == {1}
    with _runtime(url) as rt:
        for run_id in ("before", "after"):
            assert rt.replay(run_id).result == f"plan: plan for {run_id}"
        assert rt.replay("sleeping").result == {"n": 101}


def test_what_cannot_be_migrated_is_refused_by_name(source: Path, tmp_path: Path) -> None:
    url = f"{SERVER}/never_created"
    for source_path, target, why in (
        (str(source), str(tmp_path / "other.db"), "the target must be a PostgreSQL URL"),
        (f"{SERVER}/elsewhere", url, "the source must be a durabl SQLite file"),
        (url, url, "the source and the target are the same database"),
    ):
        with pytest.raises(MigrationRefusedError, match=why):
            copy_database(source_path, target)
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n" * 50)
    with pytest.raises(NotADatabaseError, match="not a durabl database"):
        copy_database(notes, url)
    with pytest.raises(StorageError, match="does not exist"):
        copy_database(tmp_path / "missing.db", url)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durabl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


def test_the_command_prints_what_it_copied_and_refuses_in_one_line(
    source: Path, database: Callable[[], str]
) -> None:
    url = database()
    done = _cli("--db", str(source), "migrate", "--to", url)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"migrated {source} to {url}, every row verified on arrival"
    assert "runs          8" in lines and "snapshots     1" in lines
    assert "signals       2" in lines
    assert "events/s" in done.stdout and "had a lease on" in done.stdout
    again = _cli("migrate", "--json", "--from", str(source), "--to", url)
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.count("\n") == 1 and "Traceback" not in again.stderr
    assert again.stderr.startswith(f"durabl: {url} already holds durabl data (8 runs,")

    other = database()
    done = _cli("migrate", "--json", "--from", str(source), "--to", other)
    assert done.returncode == 0, done.stderr
    copied = json.loads(done.stdout)
    assert (copied["runs"], copied["signals"]) == (8, 2)
