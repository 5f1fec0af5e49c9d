"""The database as a file: what durabl checks before SQLite may touch it, and its size on disk.

SQLite opens almost anything, and opening for writing can change a file (a checkpoint, a deleted
-wal): so a directory, a missing parent, a read-only path, a file that is not SQLite, and a file
shorter than its own header says are all refused here, by looking, before any connection exists.
"""

from __future__ import annotations

import os
import stat

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


def check_file(path: str, *, read_only: bool) -> bytes | None:
    """Refuse foreign, truncated or newer files before SQLite gets a chance to touch them.
    Returns the file's 100-byte header, or None for a missing or empty file."""
    # One stat for what isdir, exists and getsize would each ask, and the header read through
    # a file descriptor: this runs on the way to every resumed run's first step.
    found = _stat(path)
    if found is not None and stat.S_ISDIR(found.st_mode):
        raise DirectoryNotFileError(path=path)
    if found is None:
        if read_only:
            raise MissingFileError(path=path)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise MissingFileError(path=path, directory=parent)
        _check_writable_dir(path)
        return None
    if not read_only:
        _check_writable_dir(path)
        if not os.access(path, os.W_OK):
            raise ReadOnlyPathError(path=path)
    size = found.st_size
    if size == 0:
        if read_only:
            raise EmptyFileError(path=path)
        return None
    fd = os.open(path, os.O_RDONLY)
    try:
        header = os.read(fd, HEADER_BYTES)
    finally:
        os.close(fd)
    if len(header) < HEADER_BYTES or not header.startswith(SQLITE_MAGIC):
        raise NotSQLiteError(path=path)
    promised = _promised_bytes(header)
    # With a live WAL, another process may be checkpointing into the file right now, which
    # writes the header before the pages that extend the file: the sizes only agree at rest.
    if promised is not None and not _wal_in_use(path) and size < promised:
        raise TruncatedFileError(path=path, promised_bytes=promised, found_bytes=size)
    return header


def is_current_durabl(header: bytes, application_id: int, version: int) -> bool:
    """Whether a header says: a durabl database of ``version``, in WAL mode. The header can
    lag behind the WAL, but never about a file's identity: durabl sets its application id in the
    file's first transaction and never changes it, and a header that says WAL is a WAL file."""
    wal = header[18] == header[19] == 2
    return (
        wal
        and int.from_bytes(header[68:72], "big") == application_id
        and int.from_bytes(header[60:64], "big") == version
    )


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


def _stat(path: str) -> os.stat_result | None:
    """``os.stat``, or None where ``os.path.exists`` would say False."""
    try:
        return os.stat(path)
    except (OSError, ValueError):
        return None


def _wal_in_use(path: str) -> bool:
    found = _stat(f"{path}-wal")
    return found is not None and found.st_size > 0


def _check_writable_dir(path: str) -> None:
    parent = os.path.dirname(os.path.abspath(path))
    if not os.access(parent, os.W_OK):
        raise ReadOnlyPathError(path=path, directory=parent)


def file_bytes(path: str) -> int:
    """The database's size on disk, its WAL included."""
    wal = f"{path}-wal"
    return os.path.getsize(path) + (os.path.getsize(wal) if os.path.exists(wal) else 0)
