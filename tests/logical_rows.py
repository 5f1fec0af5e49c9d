"""Event rows read straight from a database, as the events they stand for.

A finished attempt at an ``IDEMPOTENT`` tool with a derived key is one TOOL_COMPLETED row whose
data is ``[canonical text, result]``. Tests that follow a step through its STEP_STARTED and
STEP_COMPLETED read it as those events (and TOOL_DISPATCHED between them), all at its seq. The
split is worked out here from the JSON alone, not with durabl's own code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def split_pair(data: str) -> tuple[str, str]:
    """The two JSON texts of ``[first,second]``."""
    end = json.JSONDecoder().raw_decode(data, 1)[1]
    first, second = data[1:end], data[end + 1 : -1]
    assert data == f"[{first},{second}]", data
    return first, second


def logical(
    rows: Iterable[tuple[Any, ...]], *, kind: int = 2, data: int = 5, fp: int | None = 4
) -> list[tuple[Any, ...]]:
    """``rows`` with each TOOL_COMPLETED row replaced by STEP_STARTED (data: the canonical
    text), TOOL_DISPATCHED (no fp, no data) and STEP_COMPLETED (data: the result). ``kind``,
    ``data`` and ``fp`` are the columns' indexes in a row (``fp`` None: the rows have none)."""
    found: list[tuple[Any, ...]] = []
    for row in rows:
        if row[kind] != "TOOL_COMPLETED":
            found.append(tuple(row))
            continue
        canonical, result = split_pair(row[data])
        for name, text, keeps_fp in (
            ("STEP_STARTED", canonical, True),
            ("TOOL_DISPATCHED", None, False),
            ("STEP_COMPLETED", result, False),
        ):
            each = list(row)
            each[kind], each[data] = name, text
            if fp is not None and not keeps_fp:
                each[fp] = None
            found.append(tuple(each))
    return found
