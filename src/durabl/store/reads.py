"""Reads that more than one caller of a ``Store`` needs, written once on top of the protocol.

The runtime and the command line both look runs up here, so a missing run is reported in the
same words wherever it is asked for.
"""

from __future__ import annotations

from durabl.errors import RunNotFoundError
from durabl.store.base import RunRow, Store


def require_run(store: Store, run_id: str) -> RunRow:
    """The run's row; ``RunNotFoundError`` naming the run and the database when there is none."""
    row = store.get_run(run_id)
    if row is None:
        raise RunNotFoundError(run_id=run_id, path=store.path)
    return row
