"""Shared fixtures for the correctness oracles: a database on each backend, an injected clock,
the world.

Every oracle runs twice, on SQLite and on PostgreSQL (``backend``): each test asks for the
databases it uses through ``databases`` (``db`` is its first one), never by building a path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import pg_support
from durabl import Runtime

from .support import BACKENDS, Clock, Database, Databases, World


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def databases(backend: str, tmp_path: Path) -> Iterator[Databases]:
    server = pg_support.Databases()
    yield Databases(backend, tmp_path, server)
    server.drop()


@pytest.fixture
def db(databases: Databases) -> Database:
    return databases.new("durabl")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def runtime(db: Database, clock: Clock, world: World) -> Iterator[Callable[..., Runtime]]:
    """Build a Runtime on the test's database, the way a (re)started process would.

    Keyword arguments override the defaults (the world's llm and tools, the test clock). Every
    runtime built is closed at the end of the test, including ones "killed" at a crash point.
    """
    made: list[Runtime] = []

    def build(workflows: dict[str, Any], **overrides: Any) -> Runtime:
        options: dict[str, Any] = {"llm": world.llm, "tools": world.tools(), "clock": clock}
        options.update(overrides)
        rt = Runtime(options.pop("db", db), workflows=workflows, **options)
        made.append(rt)
        return rt

    yield build
    for rt in made:
        rt.close()
