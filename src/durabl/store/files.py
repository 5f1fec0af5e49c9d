"""The database as a file: what durabl checks before SQLite may touch it, and its size on disk.

SQLite opens almost anything, and opening for writing can change a file (a checkpoint, a deleted
-wal): so a directory, a missing parent, a read-only path, a file that is not SQLite, and a file
shorter than its own header says are all refused here, by looking, before any connection exists.
"""

from __future__ import annotations

import os

from durabl.errors import (
    DirectoryNotFileError,
    EmptyFileError,
    MissingFileError,
    NotSQLiteError,
    ReadOnlyPathError,
    TruncatedFileError,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
HEADER_BYTES = 100


def check_file(path: str, *, read_only: bool) -> None:
    """Refuse foreign, truncated or newer files before SQLite gets a chance to touch them."""
    if os.path.isdir(path):
        raise DirectoryNotFileError(path=path)
    if not os.path.exists(path):
        if read_only:
            raise MissingFileError(path=path)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise MissingFileError(path=path, directory=parent)
        _check_writable_dir(path)
        return
    if not read_only:
        _check_writable_dir(path)
        if not os.access(path, os.W_OK):
            raise ReadOnlyPathError(path=path)
    size = os.path.getsize(path)
    if size == 0:
        if read_only:
            raise EmptyFileError(path=path)
        return
    with open(path, "rb") as handle:
        header = handle.read(HEADER_BYTES)
    if len(header) < HEADER_BYTES or not header.startswith(SQLITE_MAGIC):
        raise NotSQLiteError(path=path)
    promised = _promised_bytes(header)
    # With a live WAL, another process may be checkpointing into the file right now, which
    # writes the header before the pages that extend the file: the sizes only agree at rest.
    if promised is not None and not _wal_in_use(path) and size < promised:
        raise TruncatedFileError(path=path, promised_bytes=promised, found_bytes=size)


def _promised_bytes(header: bytes) -> int | None:
    """The file size a SQLite header vouches for, or None when its page count is not valid."""
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    change_counter = int.from_bytes(header[24:28], "big")
    pages = int.from_bytes(header[28:32], "big")
    valid_for = int.from_bytes(header[92:96], "big")
    if valid_for != change_counter or not pages:
        return None
    return pages * page_size


def _wal_in_use(path: str) -> bool:
    wal = f"{path}-wal"
    return os.path.exists(wal) and os.path.getsize(wal) > 0


def _check_writable_dir(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.access(parent, os.W_OK):
        raise ReadOnlyPathError(path=path, directory=parent)


def file_bytes(path: str) -> int:
    """The database's size on disk, its WAL included."""
    wal = f"{path}-wal"
    return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)
