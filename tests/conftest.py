"""Fixtures every suite may use: fresh PostgreSQL databases (``pg_support``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

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
