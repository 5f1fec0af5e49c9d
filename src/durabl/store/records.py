"""How the SQLite store's records and its named parameters and rows map onto each other.

A record's field becomes the parameter named after the column that stores it (``_COLUMN_OF``
where the two names differ), and a selected row, its columns named after the record's fields,
becomes the record again. Kept apart from the store's transactions because it is the one place
that knows both the records' field names and the schema's column names.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Sequence
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


def run_row(row: Sequence[Any]) -> RunRow:
    """A runs row, selected as every query of the runs selects it (both backends): RunRow's
    fields in order, the lease's five (owner, pid, host, started, expires_s) where its
    ``lease`` is, and ``lease_token`` last. Taken by position: reading each column by its
    name cost a fifth of a resumed run's first read of its row."""
    (
        run_id, workflow, input_text, status, result_text, error, created_s, updated_s,
        wake_at_s, watermark, owner, pid, host, started, expires_s, lease_token,
    ) = row  # fmt: skip
    lease = (
        None
        if owner is None
        else Lease(
            owner=owner, pid=pid, host=host, started=started, expires_s=expires_s,
            token=lease_token,
        )
    )  # fmt: skip
    return RunRow(
        run_id=run_id, workflow=workflow, input_text=input_text, status=status,
        result_text=result_text, error=error, created_s=created_s, updated_s=updated_s,
        wake_at_s=wake_at_s, watermark=watermark, lease=lease, lease_token=lease_token,
    )  # fmt: skip


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
