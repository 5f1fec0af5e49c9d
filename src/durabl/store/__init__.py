"""Storage behind one narrow interface: ``Store`` (base.py), with SQLite as the embedded default
and PostgreSQL (``postgres.py``, the optional extra ``durabl[postgres]``) for databases that
several hosts share. ``open_store`` picks one from what it is given."""

from __future__ import annotations

import os

from durabl.store.base import Commit, KeyClaim, Lease, RunRow, SideEffect, Store
from durabl.store.sqlite import SQLiteStore

__all__ = [
    "Commit",
    "KeyClaim",
    "Lease",
    "RunRow",
    "SQLiteStore",
    "SideEffect",
    "Store",
    "is_postgres_url",
    "open_store",
]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(db: object) -> bool:
    """Whether ``db`` names a PostgreSQL database rather than a SQLite file."""
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


def open_store(
    db: str | os.PathLike[str], *, durability: str = "full", read_only: bool = False
) -> Store:
    """The store for ``db``: a ``postgresql://`` URL opens PostgreSQL (psycopg is imported only
    then), anything else is a SQLite file's path."""
    if not is_postgres_url(db):
        return SQLiteStore(db, durability=durability, read_only=read_only)
    url = str(db)
    try:
        from durabl.store.postgres import PostgresStore
    except ImportError as exc:
        from durabl.errors import PostgresDriverMissingError

        raise PostgresDriverMissingError(
            path=url.split("@")[-1], missing=exc.name or "psycopg"
        ) from None
    return PostgresStore(url, durability=durability, read_only=read_only)
