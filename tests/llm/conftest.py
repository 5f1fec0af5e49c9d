"""Fixtures of the model client adapters' tests: a loopback model server, a fresh database, and
what a run recorded."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import ModelServer

# LiteLLM fetches its model price list from the network when it is imported, unless told not to.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer() as running:
        yield running
    assert running.errors == [], "the loopback server broke"
    assert running.unscripted == 0, "the model was asked more often than the test scripted"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "runs.db"
