"""How the SQLite store's records and its named parameters and rows map onto each other.

A record's field becomes the parameter named after the column that stores it (``_COLUMN_OF``
where the two names differ), and a selected row, its columns named after the record's fields,
becomes the record again. Kept apart from the store's transactions because it is the one place
that knows both the records' field names and the schema's column names.
"""

from __future__ import annotations

import dataclasses
import operator
import sqlite3
from typing import Any

from durabl import codec
from durabl.events import Event
from durabl.store.base import Lease, RunRow, SideEffect

Statement = tuple[str, dict[str, Any]]
"""A statement to run: its name in ``Q`` and its named parameters."""

_COLUMN_OF = {
    "key": "idempotency_key",
    "input_text": "input",
    "result_text": "result",
    "owner": "lease_owner",
    "pid": "lease_pid",
    "host": "lease_host",
    "started": "lease_started",
    "expires_s": "lease_expires_s",
}
"""The column that stores a record's field, where the two names differ."""

_LEASE_FIELDS = ("owner", "pid", "host", "started", "expires_s")
NO_LEASE = {_COLUMN_OF[name]: None for name in _LEASE_FIELDS}


_PARAMETERS_OF: dict[type, tuple[tuple[str, ...], Any]] = {}
"""Per record type: its parameters' names (its columns) and a getter of its fields' values,
worked out once, not on every commit."""


def parameters_of(record: Any, **extra: Any) -> dict[str, Any]:
    """A record's fields as named parameters (named after their columns), and ``extra``.
    Shallow, where ``dataclasses.asdict`` would copy every value on the hot path. Keys a
    statement does not name are ignored."""
    known = _PARAMETERS_OF.get(type(record))
    if known is None:
        names = [f.name for f in dataclasses.fields(record)]
        columns = tuple(_COLUMN_OF.get(name, name) for name in names)
        known = _PARAMETERS_OF[type(record)] = (columns, operator.attrgetter(*names))
    columns, values_of = known
    params = dict(zip(columns, values_of(record), strict=True))
    params.update(extra)
    return params


def run_row(row: sqlite3.Row) -> RunRow:
    """A runs row, selected with its columns named after the fields of RunRow and Lease."""
    fields = dict(row)
    lease = {name: fields.pop(name) for name in _LEASE_FIELDS}
    held = None if lease["owner"] is None else Lease(**lease, token=fields["lease_token"])
    return RunRow(**fields, lease=held)


def event_insert(run_id: str, e: Event, fence: int | None) -> Statement:
    seq, kind, step, fp, data, at_s = e
    crc = codec.checksum(seq, kind, step, fp, data, at_s)
    params = {
        "run_id": run_id,
        "seq": seq,
        "kind": kind,
        "step": step,
        "fp": fp,
        "data": data,
        "at_s": at_s,
        "crc": crc,
        "fence": fence,
    }
    return "insert_event", params


def event_with_effect_insert(
    run_id: str, e: Event, fence: int | None, effect: SideEffect
) -> Statement:
    """The statement appending ``e`` and recording ``effect`` together: a finished tool
    call's commit in one statement instead of a transaction of two (for an effect without an
    error, one that binds no None for it)."""
    _, params = event_insert(run_id, e, fence)
    params.update(
        idempotency_key=effect.key,
        effect_run_id=effect.run_id,
        effect_step=effect.step,
        tool=effect.tool,
        args_fp=effect.args_fp,
        result=effect.result_text,
        error=effect.error,
        effect_at_s=effect.at_s,
    )
    if effect.error is None:
        return "insert_event_with_result", params
    return "insert_event_with_effect", params


def events_insert(run_id: str, appended: list[Event], fence: int | None) -> Statement:
    """The statement appending ``appended``, in order. Several events become one multi-row
    insert (``insert_events``): one statement instead of one per event on every step."""
    if len(appended) == 1:
        return event_insert(run_id, appended[0], fence)
    values: list[Any] = []
    for seq, kind, step, fp, data, at_s in appended:
        crc = codec.checksum(seq, kind, step, fp, data, at_s)
        values += (run_id, seq, kind, step, fp, data, at_s, crc, fence)
    return "insert_events", {"rows": len(appended), "values": values}
