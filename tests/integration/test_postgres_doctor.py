"""``durabl doctor`` on a PostgreSQL database: the same checks as on a file, read in one
REPEATABLE READ snapshot, and what only a server can get wrong (a trigger switched off)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import psycopg
import pytest

from durabl import Runtime, ToolCall, workflow


@workflow(name="doctor_chain")
def chain(ctx: object, steps: int) -> object:
    total = 0
    for i in range(steps):
        total += yield ToolCall("add", {"i": i})
    return total


@pytest.fixture
def url(postgres_db: Callable[[], str]) -> str:
    return postgres_db()


def doctor(url: str) -> tuple[int, dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "durabl", "--db", url, "--json", "doctor"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, json.loads(done.stdout)


def failed(report: dict[str, object]) -> list[tuple[str, str]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return [(f["check"], f["message"]) for f in findings if not f["ok"]]


def seeded(url: str) -> str:
    with Runtime(url, tools={"add": lambda i: i}) as rt:
        return rt.run(chain, {"steps": 3}).run_id


def test_a_healthy_database_passes_every_check(url: str) -> None:
    seeded(url)
    code, report = doctor(url)
    assert (code, report["healthy"], failed(report)) == (0, True, [])
    checks = [f["check"] for f in report["findings"]]  # type: ignore[union-attr]
    assert checks == ["open", "integrity", "schema", "checksums", "logs", "status", "orphans"]


def test_a_damaged_event_is_found_by_run_and_seq(url: str) -> None:
    run_id = seeded(url)
    with psycopg.connect(url, autocommit=True) as conn:  # behind the store's back
        conn.execute("ALTER TABLE durabl.events DISABLE TRIGGER USER")
        conn.execute(
            "UPDATE durabl.events SET data = '{\"forged\": 1}' WHERE run_id = %s AND seq = 3",
            (run_id,),
        )
        conn.execute("ALTER TABLE durabl.events ENABLE TRIGGER USER")
    code, report = doctor(url)
    assert code == 1
    assert failed(report) == [
        ("checksums", f"run {run_id} seq 3: the event (TOOL_DISPATCHED) fails its checksum")
    ]


def test_a_switched_off_trigger_is_a_missing_guard(url: str) -> None:
    seeded(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE durabl.events DISABLE TRIGGER events_guard")
    code, report = doctor(url)
    assert code == 1
    assert failed(report) == [
        (
            "schema",
            "trigger events_guard is missing: the database no longer enforces the invariant "
            "it guards",
        )
    ]


def test_an_unreachable_server_is_one_finding(url: str) -> None:
    code, report = doctor("postgresql://127.0.0.1:1/nothing")
    assert code == 1
    ((check, message),) = failed(report)
    assert check == "open"
    assert message.startswith("postgresql://127.0.0.1:1/nothing: cannot connect to PostgreSQL")


def test_a_database_of_an_older_schema_is_migrated_by_a_writer_and_named_to_a_reader(
    url: str,
) -> None:
    """A database left at schema v1 (before signals), as an older durabl made it: a read-only
    command says what to do instead of failing on a missing table, and a runtime migrates it."""
    from durabl.errors import OlderSchemaError
    from durabl.store import open_store
    from durabl.store.postgres import MIGRATIONS, SCHEMA_VERSION

    first = dict(MIGRATIONS)[1]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA durabl")
        conn.execute(first.encode())
        conn.execute("INSERT INTO durabl.meta (application, schema_version) VALUES ('durabl', 1)")
    older = f"schema v1, older than this durabl's v{SCHEMA_VERSION}"
    with pytest.raises(OlderSchemaError, match=older):
        open_store(url, read_only=True)
    run_id = seeded(url)  # a runtime opens it: migrated, then used
    with Runtime(url) as rt:
        assert rt.state(run_id).status == "COMPLETED"
        assert rt.store.signals(run_id) == []
    code, report = doctor(url)
    assert (code, failed(report)) == (0, [])
