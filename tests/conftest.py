"""Fixtures every suite may use: fresh PostgreSQL databases (``pg_support``), and ``either_db``,
a fresh database on each backend in turn."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pg_support


@pytest.fixture
def postgres_db() -> Iterator[Callable[[], str]]:
    """Make a fresh PostgreSQL database: ``postgres_db()`` returns its URL. Every database
    made is dropped when the test ends, after the fixtures that use it have closed their
    stores."""
    made = pg_support.Databases()
    yield made.new
    made.drop()


@pytest.fixture(params=["sqlite", "postgres"])
def either_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database for the test, once on each backend: a SQLite file in the test's folder,
    then a new PostgreSQL database (dropped when the test ends)."""
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    new_postgres_db: Callable[[], str] = request.getfixturevalue("postgres_db")
    return new_postgres_db()
