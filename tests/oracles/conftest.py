"""Shared fixtures for the correctness oracles: a database file, an injected clock, the world."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from durabl import Runtime

from .support import Clock, World


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "durabl.db"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


@pytest.fixture
def runtime(db: Path, clock: Clock, world: World) -> Iterator[Callable[..., Runtime]]:
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
