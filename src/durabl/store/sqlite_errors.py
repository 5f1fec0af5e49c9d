"""What a ``sqlite3.Error`` means to durabl: the typed ``DurablError`` the store raises instead.

SQLite's own conditions are told apart by their result codes (``sqlite_errorcode``), never by
their words. A refusal by one of durabl's triggers carries only its message; that message names
the trigger (``schema.TRIGGERS_BY_MESSAGE``), and the trigger's name picks the class below.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from durabl.errors import (
    DurablError,
    HistoryRewriteError,
    InvariantError,
    LeaseLost,
    LogGapError,
    SQLiteCantOpenError,
    SQLiteCorruptError,
    SQLiteError,
    SQLiteFullError,
    SQLiteReadOnlyError,
)
from durabl.store.schema import TRIGGER_MARKER, TRIGGERS_BY_MESSAGE

_BY_PRIMARY_CODE: dict[int, type[SQLiteError]] = {
    sqlite3.SQLITE_READONLY: SQLiteReadOnlyError,
    sqlite3.SQLITE_FULL: SQLiteFullError,
    sqlite3.SQLITE_CORRUPT: SQLiteCorruptError,
    sqlite3.SQLITE_NOTADB: SQLiteCorruptError,
    sqlite3.SQLITE_CANTOPEN: SQLiteCantOpenError,
}


def _lease_lost(*, path: str, rule: str, sqlite_message: str) -> DurablError:
    return LeaseLost(path=path)  # the trigger cannot say which run, nor which token was stale


TRIGGER_ERRORS: dict[str, Callable[..., DurablError]] = {
    "events_fenced": _lease_lost,
    "events_gapless": LogGapError,
    "events_append_only": HistoryRewriteError,
    "events_delete_only_compacted": HistoryRewriteError,
    "side_effects_never_overwritten": HistoryRewriteError,
    "side_effects_never_deleted": HistoryRewriteError,
    "runs_watermark_only_grows": HistoryRewriteError,
    "signals_delivered_once": HistoryRewriteError,
    "signals_never_deleted": HistoryRewriteError,
}
"""Every trigger of the shipped migrations, and what its refusal raises."""

_DUPLICATE_KEY = (sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY, sqlite3.SQLITE_CONSTRAINT_UNIQUE)


def duplicate_key(exc: sqlite3.Error) -> bool:
    """True when ``exc`` is an insert refused because its key is already in the table."""
    return getattr(exc, "sqlite_errorcode", None) in _DUPLICATE_KEY


def storage_error(path: str, exc: sqlite3.Error) -> DurablError:
    """The error to raise for ``exc``, which SQLite raised on the database at ``path``."""
    message = str(exc)
    code = getattr(exc, "sqlite_errorcode", None)  # absent on errors raised by sqlite3 itself
    if code == sqlite3.SQLITE_CONSTRAINT_TRIGGER and message.startswith(TRIGGER_MARKER):
        make = TRIGGER_ERRORS.get(TRIGGERS_BY_MESSAGE.get(message, ""), InvariantError)
        rule = message.removeprefix(TRIGGER_MARKER).strip()
        return make(path=path, rule=rule, sqlite_message=message)
    error = SQLiteError if code is None else _BY_PRIMARY_CODE.get(code & 0xFF, SQLiteError)
    errorname = getattr(exc, "sqlite_errorname", None)
    return error(path=path, sqlite_message=message, sqlite_errorname=errorname)
