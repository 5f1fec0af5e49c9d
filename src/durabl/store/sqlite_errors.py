"""What a ``sqlite3.Error`` means to durabl: the ``DurablError`` the store raises instead."""

from __future__ import annotations

import sqlite3

from durabl.errors import DurablError, LeaseLost, StorageError


def storage_error(path: str, exc: sqlite3.Error) -> DurablError:
    """The error to raise for ``exc``, which SQLite raised on the database at ``path``."""
    text = str(exc)
    lowered = text.lower()
    if "readonly" in lowered or "read-only" in lowered:
        why = "the database or its directory is read-only"
    elif "disk is full" in lowered or "database or disk is full" in lowered:
        why = "the disk is full; nothing of this write was kept"
    elif "malformed" in lowered or "not a database" in lowered or "corrupt" in lowered:
        why = "the file is corrupt; restore it from a backup"
    elif "unable to open" in lowered:
        why = "the file cannot be opened (check the path and permissions)"
    elif "unique constraint failed: side_effects" in lowered:
        why = "refusing to record a second side effect for one idempotency key: one key, one effect, ever"
    elif "lease lost" in lowered:
        return LeaseLost(path=path)
    elif "durabl:" in lowered:
        why = text[text.index("durabl:") + len("durabl:") :].strip()
    else:
        why = text
    return StorageError(f"{path}: {why} ({text})" if why != text else f"{path}: {text}")
