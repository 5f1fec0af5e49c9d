"""Storage behind one narrow interface: ``Store`` (base.py), with SQLite as the embedded default."""

from durabl.store.base import Commit, KeyClaim, Lease, RunRow, SideEffect, Store
from durabl.store.sqlite import SQLiteStore

__all__ = ["Commit", "KeyClaim", "Lease", "RunRow", "SQLiteStore", "SideEffect", "Store"]
