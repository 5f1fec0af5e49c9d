"""SPEC §16 for the PostgreSQL backend: a server or a database durabl must refuse, or survive.

Every refusal is one ``StorageError`` (never a raw psycopg exception) whose single line names the
server as durabl names it (the URL without its password) and what is wrong, through the API and
through the command line (exit 2, one line on stderr): a server that is not there, a role it
does not know, a database it does not have, a database no durabl has used, another
application's tables in the ``durabl`` schema, a schema from a newer durabl, and an interpreter
without psycopg. Nothing is created and nothing changes on the server. A connection cut in the
middle of a run is not a refusal: the store reconnects and the run finishes with every step done
exactly once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

import pg_support
from durabl import (
    ModelCall,
    RetryPolicy,
    Runtime,
    SchemaVersionError,
    StorageError,
    ToolCall,
    tool,
)
from durabl.errors import ForeignSchemaError, ServerUnreachableError, UninitialisedError
from durabl.store import open_store
from durabl.store.postgres import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]

# -- what the server holds, read behind durabl's back ----------------------------------------


def server_state(url: str) -> list[tuple[Any, ...]]:
    """Every schema, table, column and row of the database at ``url`` outside the catalogs."""
    with pg_support.connect(url) as conn:
        found: list[tuple[Any, ...]] = conn.execute(
            "SELECT table_schema, table_name, column_name, data_type "
            "FROM information_schema.columns "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') "
            "ORDER BY 1, 2, 3"
        ).fetchall()
        found += conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname NOT LIKE 'pg\\_%' "
            "AND nspname <> 'information_schema' ORDER BY 1"
        ).fetchall()
        tables = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables "
            "WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2"
        ).fetchall()
        for schema, table in tables:
            found += conn.execute(f'SELECT * FROM "{schema}"."{table}" ORDER BY 1').fetchall()
    return found


def database_exists(name: str) -> bool:
    found = pg_support.admin().execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
    return found.fetchone() is not None


def free_port() -> int:
    """A local TCP port nothing listens on (the kernel just handed it out and took it back)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- the bad databases ---------------------------------------------------------------------


def pg_echo(ctx: Any, n: int) -> Any:
    notes = []
    for i in range(n):
        notes.append((yield ToolCall("echo", {"i": i})))
    return notes


def echo(i: int) -> dict[str, int]:
    return {"i": i}


def durabl_database(url: str) -> None:
    """A database holding one finished durabl run, ``r0``."""
    with Runtime(url, workflows=[pg_echo], tools={"echo": tool(echo, mode="IDEMPOTENT")}) as rt:
        assert rt.run(pg_echo, {"n": 3}, run_id="r0").status == "COMPLETED"


def foreign_database(url: str) -> None:
    """A database whose ``durabl`` schema is another application's."""
    with pg_support.connect(url) as conn:
        conn.execute("CREATE SCHEMA durabl")
        conn.execute("CREATE TABLE durabl.invoices (id SERIAL PRIMARY KEY, total NUMERIC)")
        conn.execute("INSERT INTO durabl.invoices (total) VALUES (12.5)")


def newer_database(url: str) -> None:
    durabl_database(url)
    with pg_support.connect(url) as conn:
        conn.execute("UPDATE durabl.meta SET schema_version = %s", (SCHEMA_VERSION + 1,))


BAD_DATABASES: dict[str, tuple[Callable[[str], None], tuple[str, ...], type[StorageError]]] = {
    "foreign-schema": (foreign_database, ("not durabl's", "invoices"), ForeignSchemaError),
    "newer-schema": (newer_database, ("newer", f"v{SCHEMA_VERSION + 1}"), SchemaVersionError),
}
"""How to spoil a database, what its refusal must say, and what it raises."""


@pytest.fixture
def bad(request: pytest.FixtureRequest, postgres_db: Callable[[], str]) -> tuple[str, Any]:
    make, words, error = BAD_DATABASES[request.param]
    url = postgres_db()
    make(url)
    return url, (words, error)


# -- checking one refusal --------------------------------------------------------------------


def assert_one_clear_error(err: BaseException, server: str, *what: str) -> None:
    assert isinstance(err, StorageError), f"{type(err).__name__}: {err}"
    assert not isinstance(err, psycopg.Error)
    message = str(err)
    assert "\n" not in message, f"more than one line: {message!r}"
    assert server in message, f"the message does not name {server}: {message!r}"
    assert all(word in message for word in what), (
        f"the message does not say what is wrong ({' / '.join(what)}): {message!r}"
    )


def refuse(server: str, attempt: Callable[[], Any], *what: str) -> StorageError:
    with pytest.raises(StorageError) as caught:
        attempt()
    assert_one_clear_error(caught.value, server, *what)
    return caught.value


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "durabl", "--db", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def assert_cli_refuses(url: str, server: str, *what: str) -> None:
    """``runs`` and ``show`` both end in exit code 2 and one line on stderr naming the server
    and what is wrong (run side by side: each is a process start)."""
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda args: cli(url, *args), [("runs",), ("show", "r0")]))
    for result in done:
        assert result.returncode == 2, (result.args, result.stdout, result.stderr)
        assert result.stdout == "", result.stdout
        assert result.stderr.count("\n") == 1, result.stderr
        assert "Traceback" not in result.stderr, result.stderr
        assert result.stderr.startswith("durabl: ")
        assert server in result.stderr and all(w in result.stderr for w in what), result.stderr


# -- servers and databases that are not there -------------------------------------------------


UNREACHABLE = ("cannot connect to PostgreSQL", "is the server running")


@pytest.mark.parametrize("port", [1, None], ids=["port-1", "a-free-port"])
def test_a_server_that_is_not_there_is_one_clear_line(port: int | None) -> None:
    server = f"postgresql://127.0.0.1:{port or free_port()}/durabl"
    err = refuse(server, lambda: Runtime(server), *UNREACHABLE)
    assert isinstance(err, ServerUnreachableError)
    refuse(server, lambda: open_store(server, read_only=True), *UNREACHABLE)
    assert_cli_refuses(server, server, *UNREACHABLE)


def test_a_role_the_server_does_not_know_is_one_clear_line_without_the_password() -> None:
    url = f"postgresql://no_such_role:s3cret-pw@{pg_support.HOST}:{pg_support.PORT}/postgres"
    server = f"postgresql://no_such_role@{pg_support.HOST}:{pg_support.PORT}/postgres"
    what = ("refused these credentials", '"no_such_role" does not exist')
    err = refuse(server, lambda: Runtime(url), *what)
    assert "s3cret-pw" not in str(err)
    assert_cli_refuses(url, server, *what)


def test_a_database_the_server_does_not_have_is_one_clear_line_and_is_not_created() -> None:
    name = f"durabl_t_{os.getpid()}_missing"
    url = pg_support.url_of(name)
    what = ("no such database", "createdb")
    refuse(url, lambda: Runtime(url), *what)
    refuse(url, lambda: open_store(url, read_only=True), *what)
    assert_cli_refuses(url, url, *what)
    assert not database_exists(name)


def test_a_database_no_durabl_has_used_is_refused_by_a_reader_and_left_empty(
    postgres_db: Callable[[], str],
) -> None:
    url = postgres_db()
    before = server_state(url)
    err = refuse(url, lambda: open_store(url, read_only=True), "not an initialised durabl")
    assert isinstance(err, UninitialisedError)
    assert_cli_refuses(url, url, "not an initialised durabl database")
    assert server_state(url) == before


@pytest.mark.parametrize("bad", list(BAD_DATABASES), indirect=True)
def test_a_database_durabl_must_not_touch_is_refused_untouched(bad: tuple[str, Any]) -> None:
    url, (what, error) = bad
    before = server_state(url)
    for attempt in (
        lambda: Runtime(url),
        lambda: open_store(url),
        lambda: open_store(url, read_only=True),
    ):
        assert isinstance(refuse(url, attempt, *what), error)
    assert_cli_refuses(url, url, *what)
    assert server_state(url) == before


# -- an interpreter without psycopg -----------------------------------------------------------

WITHOUT_PSYCOPG = textwrap.dedent(
    """
    import sys
    sys.modules["psycopg"] = None  # what an interpreter without the extra looks like
    from durabl import Runtime
    from durabl.errors import PostgresDriverMissingError
    from durabl.cli import main
    try:
        Runtime(sys.argv[1])
    except PostgresDriverMissingError as exc:
        print(exc)
    else:
        print("opened without psycopg")
    sys.stdout.flush()
    sys.exit(main(["--db", sys.argv[1], "runs"]))
    """
)


def test_an_interpreter_without_psycopg_names_the_extra_to_install(
    postgres_db: Callable[[], str],
) -> None:
    url = postgres_db()
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PSYCOPG, url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    install = "pip install 'durabl[postgres]'"
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stdout.count("\n") == 1 and install in done.stdout, done.stdout
    assert "psycopg" in done.stdout and url in done.stdout
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("durabl: "), done.stderr
    assert install in done.stderr and url in done.stderr
    assert server_state(url) == [("public",)], "durabl touched the database without a driver"


# -- a connection cut in the middle of a run ---------------------------------------------------

STEPS = 8
CUT_AT = (2, 5)
"""The tool steps inside which every session on the database is terminated."""


def cut_agent(ctx: Any, n: int) -> Any:
    results = []
    for i in range(n):
        results.append((yield ToolCall("step", {"i": i}, idempotency_key=f"step-{i}")))
        if i == n // 2:
            results.append((yield ModelCall(f"halfway after {i}")))
    return results


class Cutter:
    """The tools and the model of a run whose server connections are cut under it: a tool
    call (or the model call) terminates every session on the database, as a failover or a
    restart of the server would, and then answers normally."""

    def __init__(self, url: str, *, in_steps: tuple[int, ...], in_model: bool) -> None:
        self.url, self.in_steps, self.in_model = url, in_steps, in_model
        self.calls: list[str] = []
        self.cuts = 0

    def step(self, i: int, *, idempotency_key: str) -> dict[str, Any]:
        self.calls.append(idempotency_key)
        if i in self.in_steps:
            self.cut()
        return {"i": i, "key": idempotency_key}

    def llm(self, prompt: Any, **params: Any) -> dict[str, str]:
        self.calls.append(f"llm:{prompt}")
        if self.in_model:
            self.cut()
        return {"text": f"answer({prompt})"}

    def cut(self) -> None:
        assert pg_support.terminate_sessions(self.url) >= 1, "the store had no session to cut"
        self.cuts += 1


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="durabl.store"):
        yield caplog


def test_a_connection_cut_mid_run_is_reconnected_and_every_step_runs_once(
    postgres_db: Callable[[], str], store_log: pytest.LogCaptureFixture
) -> None:
    url = postgres_db()
    cutter = Cutter(url, in_steps=CUT_AT, in_model=True)
    with Runtime(
        url,
        llm=cutter.llm,
        tools={"step": tool(cutter.step, mode="AT_MOST_ONCE")},
        workflows=[cut_agent],
    ) as rt:
        state = rt.run(cut_agent, {"n": STEPS}, run_id="cut")
        assert state.status == "COMPLETED", state
        assert rt.dead_letters() == []
    assert cutter.cuts == len(CUT_AT) + 1
    expected_calls = [f"step-{i}" for i in range(STEPS)]
    expected_calls.insert(STEPS // 2 + 1, f"llm:halfway after {STEPS // 2}")
    assert cutter.calls == expected_calls, "a step ran twice, or not at all"

    with contextlib.closing(open_store(url, read_only=True)) as store:
        log = store.load_log("cut")
        assert [e.seq for e in log] == list(range(1, len(log) + 1))
        completed = [e.step for e in log if e.kind == "STEP_COMPLETED"]
        assert sorted(completed) == list(range(1, STEPS + 2)), completed
        assert [store.side_effect(f"step-{i}") is not None for i in range(STEPS)] == [True] * STEPS
        assert [store.key_claim(f"step-{i}") for i in range(STEPS)] == [None] * STEPS

    said = [r.getMessage() for r in store_log.records if r.name == "durabl.store"]
    assert any("lost the connection" in line for line in said), said
    reconnected = [line for line in said if "reconnected" in line]
    assert reconnected, said
    assert all(url in line and "\n" not in line for line in reconnected), reconnected


def test_one_outage_is_one_lost_line_and_one_reconnected_line(
    postgres_db: Callable[[], str], store_log: pytest.LogCaptureFixture
) -> None:
    """The store promises one line when the connection is lost and one when it is back: an
    operator reading "reconnected" must be able to trust that the server answers again."""
    url = postgres_db()
    cutter = Cutter(url, in_steps=(STEPS - 1,), in_model=False)
    with Runtime(
        url,
        llm=cutter.llm,
        tools={"step": tool(cutter.step, mode="AT_MOST_ONCE")},
        workflows=[cut_agent],
    ) as rt:
        assert rt.run(cut_agent, {"n": STEPS}, run_id="once").status == "COMPLETED"
    assert cutter.cuts == 1
    said = [r.getMessage() for r in store_log.records if r.name == "durabl.store"]
    assert [line.split(" to ")[0] for line in said] == [
        "durabl: lost the connection",
        "durabl: reconnected",
    ], said


# -- text PostgreSQL cannot hold -----------------------------------------------------------------


def nul_tool(*, why: str) -> None:
    raise ValueError(f"device answered b'\x00\x01' for {why}")


def nul_agent(ctx: Any, why: str) -> Any:
    return (yield ToolCall("nul", {"why": why}))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_tool_error_holding_a_nul_character_fails_the_run_on_both_backends(
    tmp_path: Path, postgres_db: Callable[[], str], backend: str
) -> None:
    """A tool's own error text is not JSON and is kept as it was said: a NUL in it, which a
    driver's bytes easily carry, must not keep the failure from being recorded. PostgreSQL's
    text columns cannot hold NUL, where SQLite's can."""
    db = str(tmp_path / "nul.db") if backend == "sqlite" else postgres_db()
    calls = []

    def counted(*, why: str) -> None:
        calls.append(why)
        nul_tool(why=why)

    once = tool(counted, mode="IDEMPOTENT", retry=RetryPolicy(max_attempts=1))
    with Runtime(db, tools={"nul": once}, workflows=[nul_agent]) as rt:
        state = rt.run(nul_agent, {"why": "probe"}, run_id="nul")
        assert state.status == "FAILED", state
        assert state.error is not None and "ValueError: device answered" in state.error
        assert rt.resume("nul").status == "FAILED"
    assert calls == ["probe"]
