"""SPEC §6 and §16: database files durabl must refuse, or report, without touching them.

Every case expects one ``durabl.StorageError`` (never a raw ``sqlite3`` exception) whose single
line names the path and what is wrong, and compares the bytes of the database file and of its
``-wal`` file before and after: a refused open deletes nothing and rewrites nothing, also once
the caller has dropped every reference to the failed runtime (``gc.collect()``).

Read-only and full-disk conditions are produced for real: as root, with ``chattr +i`` and a
small tmpfs of the test's own; as another user, with permission bits and (for the full disk)
SQLite's own page limit on the store's connection.
"""

from __future__ import annotations

import contextlib
import gc
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durabl
from durabl import Runtime, SchemaVersionError, Sleep, StorageError, ToolCall, tool
from durabl.store import SQLiteStore
from durabl.store.sqlite import SCHEMA_VERSION

# -- a real durabl database to damage -------------------------------------------------------


def storage_echo(ctx: Any, n: int, tag: str) -> Any:
    notes = []
    for i in range(n):
        notes.append((yield ToolCall("echo", {"i": i, "note": f"{tag}-STEP-{i:03d}"})))
    return notes


def echo(i: int, note: str) -> dict[str, Any]:
    return {"i": i, "pad": "." * 200}


def runtime(path: Path | str, **kwargs: Any) -> Runtime:
    kwargs.setdefault("tools", {"echo": tool(echo, mode="IDEMPOTENT")})
    kwargs.setdefault("workflows", [storage_echo])
    return Runtime(path, **kwargs)


RUN_IDS = ("r0", "r1", "r2", "r3")


def build_db(path: Path, steps: int = 15) -> dict[str, Any]:
    """A closed durabl database holding a few finished runs; returns their results."""
    results = {}
    with runtime(path) as rt:
        for run_id in RUN_IDS:
            state = rt.run(storage_echo, {"n": steps, "tag": run_id}, run_id=run_id)
            assert state.status == "COMPLETED"
            results[run_id] = state.result
    assert not Path(f"{path}-wal").exists()
    return results


def read_everything(path: Path) -> None:
    """Open the database and read every run through the public API."""
    rt = runtime(path)
    try:
        for run_id in RUN_IDS:
            rt.state(run_id)
            rt.result(run_id)
        rt.resume_all()
    finally:
        rt.close()


# -- checking the refusal -------------------------------------------------------------------


def files(path: Path) -> dict[str, bytes | None]:
    """The bytes of the database and of its -wal, None where there is no such file."""
    found: dict[str, bytes | None] = {}
    for name in (str(path), f"{path}-wal"):
        found[name] = Path(name).read_bytes() if Path(name).is_file() else None
    return found


def assert_one_clear_error(err: BaseException, path: Path, *what: str) -> None:
    assert isinstance(err, StorageError), f"{type(err).__name__}: {err}"
    assert not isinstance(err, sqlite3.Error)
    message = str(err)
    assert "\n" not in message, f"more than one line: {message!r}"
    assert str(path) in message, f"the message does not name {path}: {message!r}"
    assert any(word in message.lower() for word in what), (
        f"the message does not say what is wrong ({' / '.join(what)}): {message!r}"
    )


def refuse(path: Path, attempt: Callable[[], Any], *what: str) -> StorageError:
    """Run ``attempt``, expect one clear StorageError, and check that no byte changed.

    The error's traceback is dropped before the bytes are compared, so that whatever the failed
    open left behind (a half-built runtime, a connection) is collected first.
    """
    before = files(path)
    with pytest.raises(StorageError) as info:
        attempt()
    err = info.value
    del info
    err.__traceback__ = None
    gc.collect()
    assert_one_clear_error(err, path, *what)
    after = files(path)
    touched = []
    for name, content in before.items():
        if content is None:
            # A new, empty -wal is neither a deletion nor a rewrite.
            if after[name]:
                touched.append(f"{name} appeared with content")
        elif after[name] is None:
            touched.append(f"{name} was deleted")
        elif after[name] != content:
            pairs = zip(content, after[name], strict=False)
            at = next(
                (i for i, (a, b) in enumerate(pairs) if a != b), min(len(content), len(after[name]))
            )
            touched.append(f"{name} was rewritten (first changed byte at offset {at})")
    assert not touched, "; ".join(touched)
    return err


def page_size_of(data: bytes) -> int:
    size = int.from_bytes(data[16:18], "big")
    return 65536 if size == 1 else size


# -- files that are not durabl databases at all ---------------------------------------------


@pytest.mark.parametrize(
    "content",
    [
        random.Random(11).randbytes(64 * 1024),
        b"not a database\n",
        b"SQLite format 3\x00",
        b"SQLite format 3\x00" + random.Random(12).randbytes(64 * 1024),
    ],
    ids=["random-bytes", "text", "bare-magic", "magic-then-garbage"],
)
def test_a_file_that_is_not_a_database_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "agent.db"
    path.write_bytes(content)
    refuse(path, lambda: runtime(path), "not a durabl database", "not a sqlite", "corrupt")


def test_a_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "contacts.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE contacts (id INTEGER PRIMARY KEY, name TEXT)")
    conn.executemany("INSERT INTO contacts (name) VALUES (?)", [("Ada",), ("Grace",)])
    conn.commit()
    conn.close()

    refuse(path, lambda: runtime(path), "not a durabl database")

    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT name FROM contacts ORDER BY id").fetchall() == [
            ("Ada",),
            ("Grace",),
        ]
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        conn.close()


# -- damaged durabl databases -----------------------------------------------------------------


def events_leaf_pages(path: Path) -> list[int]:
    """Page numbers of the event log's leaf pages, where SQLite can tell (dbstat).

    A plain connection: closing it removes the -wal and -shm it opened, and writes nothing.
    """
    conn = sqlite3.connect(path)
    try:
        rows = conn.execute(
            "SELECT pageno FROM dbstat WHERE name = 'events' AND pagetype = 'leaf'"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return sorted(r[0] for r in rows)


def test_a_durabl_database_with_garbage_in_the_middle_is_reported_untouched(
    tmp_path: Path,
) -> None:
    path = tmp_path / "agent.db"
    build_db(path)
    leaves = events_leaf_pages(path)
    assert not Path(f"{path}-wal").exists()
    data = path.read_bytes()
    page = page_size_of(data)
    if leaves:
        # One page of the event log, in the middle of the file: the subtle case.
        start = (leaves[len(leaves) // 2] - 1) * page
        end = start + page
    else:
        start, end = len(data) // 3, 2 * len(data) // 3
    assert start >= page, "the damage must not touch the header page"
    path.write_bytes(data[:start] + random.Random(7).randbytes(end - start) + data[end:])

    refuse(path, lambda: read_everything(path), "corrupt", "damaged", "malformed")


def test_an_event_edited_in_place_is_caught_by_its_checksum_untouched(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    build_db(path)
    data = path.read_bytes()
    assert b"r1-STEP-004" in data
    # Same length, still valid text: SQLite cannot tell; the row checksum can. (Stale copies of
    # the row in free space change too; they are never read.)
    path.write_bytes(data.replace(b"r1-STEP-004", b"r1-STEP-904"))

    err = refuse(path, lambda: read_everything(path), "checksum", "damaged", "corrupt")
    assert "r1" in str(err)


def test_a_truncated_durabl_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    build_db(path)
    data = path.read_bytes()
    assert len(data) >= 8 * page_size_of(data)
    path.write_bytes(data[: len(data) // 2])

    refuse(path, lambda: runtime(path), "truncated")


def test_a_database_from_a_newer_durabl_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    results = build_db(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()

    err = refuse(path, lambda: runtime(path), "newer")
    assert isinstance(err, SchemaVersionError)
    assert "99" in str(err)

    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    conn.commit()
    conn.close()
    with runtime(path) as rt:
        assert {run_id: rt.result(run_id) for run_id in RUN_IDS} == results


LEAVE_A_WAL = textwrap.dedent(
    """
    import os, sqlite3, sys
    from durabl import Runtime, ToolCall, tool

    def storage_echo(ctx, n, tag):
        notes = []
        for i in range(n):
            notes.append((yield ToolCall("echo", {"i": i, "note": f"{tag}-STEP-{i:03d}"})))
        return notes

    def echo(i, note):
        return {"i": i, "echo": note}

    rt = Runtime(sys.argv[1], tools={"echo": tool(echo, mode="IDEMPOTENT")},
                 workflows=[storage_echo])
    for run_id in ("r0", "r1"):
        assert rt.run(storage_echo, {"n": 10, "tag": run_id}, run_id=run_id).status == "COMPLETED"
    conn = sqlite3.connect(sys.argv[1])
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    os._exit(0)  # a process that ends without closing: its -wal stays behind
    """
)


def test_a_newer_database_with_a_live_wal_keeps_its_wal(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    done = subprocess.run(
        [sys.executable, "-c", LEAVE_A_WAL, str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    wal = Path(f"{path}-wal")
    assert wal.is_file() and wal.stat().st_size > 0

    err = refuse(path, lambda: runtime(path), "newer")
    assert isinstance(err, SchemaVersionError)
    assert wal.is_file(), "the -wal of a refused database was deleted"


# -- paths that cannot hold a database ------------------------------------------------------------


def test_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    path.mkdir()
    (path / "notes.txt").write_text("keep me")
    before = sorted(p.name for p in tmp_path.rglob("*"))

    with pytest.raises(StorageError) as info:
        runtime(path)
    assert_one_clear_error(info.value, path, "directory")
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_missing_parent_directory_is_refused_and_not_created(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "agent.db"
    with pytest.raises(StorageError) as info:
        runtime(path)
    assert_one_clear_error(info.value, path, "does not exist", "no such")
    assert not (tmp_path / "no").exists()


# -- read-only files and directories ------------------------------------------------------------


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """Make ``path`` really read-only for this process: immutable as root, else mode bits."""
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(path)], check=True)

        def undo() -> None:
            subprocess.run(["chattr", "-i", str(path)], check=True)

    else:
        mode = path.stat().st_mode
        path.chmod(mode & ~0o222)

        def undo() -> None:
            path.chmod(mode)

    try:
        with pytest.raises(OSError):
            if path.is_dir():
                (path / "probe").write_bytes(b"")
            else:
                os.close(os.open(path, os.O_WRONLY))
        yield
    finally:
        undo()


READ_ONLY_WORDS = ("read-only", "read only", "not writable", "permission denied")


def test_a_read_only_database_file_is_reported_untouched(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    results = build_db(path)
    with read_only(path):
        refuse(path, lambda: runtime(path), *READ_ONLY_WORDS)
    with runtime(path) as rt:
        assert {run_id: rt.result(run_id) for run_id in RUN_IDS} == results


def test_a_database_in_a_read_only_directory_is_reported_untouched(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "agent.db"
    results = build_db(path)
    with read_only(folder):
        refuse(path, lambda: runtime(path), *READ_ONLY_WORDS)
    with runtime(path) as rt:
        assert {run_id: rt.result(run_id) for run_id in RUN_IDS} == results


def test_a_new_database_in_a_read_only_directory_is_reported(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    path = folder / "agent.db"
    with read_only(folder):
        with pytest.raises(StorageError) as info:
            runtime(path)
        assert_one_clear_error(info.value, path, *READ_ONLY_WORDS)
        assert list(folder.iterdir()) == []


def test_a_read_only_store_reports_read_only_on_the_first_write(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    results = build_db(path)
    rt = Runtime(
        store=SQLiteStore(path, read_only=True),
        tools={"echo": tool(echo, mode="IDEMPOTENT")},
        workflows=[storage_echo],
    )
    try:
        assert rt.result("r0") == results["r0"]
        refuse(
            path,
            lambda: rt.start(storage_echo, {"n": 2, "tag": "new"}, run_id="r-new"),
            *READ_ONLY_WORDS,
        )
    finally:
        rt.close()
    with runtime(path) as rt2, pytest.raises(durabl.RunNotFoundError):
        rt2.state("r-new")


# -- a full disk ----------------------------------------------------------------------------------


class SmallDisk:
    """Somewhere a database can run out of space, and get it back.

    As root: a tmpfs of the test's own, filled with a filler file. Otherwise: SQLite's
    ``max_page_count`` on the store's own connection, so SQLite itself reports SQLITE_FULL.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.folder = tmp_path / "small"
        self.folder.mkdir()
        self.mounted = False
        if os.geteuid() == 0:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(self.folder)],
                capture_output=True,
            )
            self.mounted = done.returncode == 0
        self.filler = self.folder / "filler"

    def fill(self, rt: Runtime, leave_bytes: int = 48 * 1024) -> None:
        if self.mounted:
            stat = os.statvfs(self.folder)
            free = stat.f_bavail * stat.f_frsize
            with open(self.filler, "wb") as handle:
                handle.write(b"\0" * (free - leave_bytes))
                handle.flush()
                os.fsync(handle.fileno())
        else:
            conn = rt.store._conn  # type: ignore[attr-defined]
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages + 2}")

    def free(self, rt: Runtime) -> None:
        if self.mounted:
            self.filler.unlink()
        else:
            conn = rt.store._conn  # type: ignore[attr-defined]
            conn.execute("PRAGMA max_page_count = 1073741823")

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.folder)], check=True)


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    disk = SmallDisk(tmp_path)
    try:
        yield disk
    finally:
        disk.close()


class Outbox:
    """A far end that dedupes on the idempotency key, and a log of every call it received."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls = 0

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def tool(self) -> Any:
        def post(i: int, *, idempotency_key: str) -> dict[str, Any]:
            self.calls += 1
            if not any(line.startswith(f"{idempotency_key}\t") for line in self.lines()):
                with open(self.path, "a") as handle:
                    handle.write(f"{idempotency_key}\t{i}\n")
            return {"i": i, "key": idempotency_key, "body": f"note {i} " + "x" * 2000}

        return tool(post, mode="IDEMPOTENT")


def storage_fill(ctx: Any, n: int) -> Any:
    keys = []
    for i in range(3):
        keys.append((yield ToolCall("post", {"i": i}))["key"])
    yield Sleep(minutes=1)
    for i in range(3, n):
        keys.append((yield ToolCall("post", {"i": i}))["key"])
    return keys


def table_rows(path: Path) -> dict[str, set[tuple[Any, ...]]]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {
            t: set(conn.execute(f"SELECT * FROM {t}").fetchall())
            for t in ("events", "side_effects")
        }
    finally:
        conn.close()


def assert_log_and_effects_agree(path: Path, run_id: str) -> None:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        log = conn.execute(
            "SELECT seq, kind, step FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        ).fetchall()
        effects = {
            r[0] for r in conn.execute("SELECT step FROM side_effects WHERE run_id = ?", (run_id,))
        }
    finally:
        conn.close()
    assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))
    completed = {step for _, kind, step in log if kind == "STEP_COMPLETED"}
    dispatched = {step for _, kind, step in log if kind == "TOOL_DISPATCHED"}
    whole = {step for _, kind, step in log if kind == "TOOL_COMPLETED"}  # both, in one event
    assert effects == (completed & dispatched) | whole, "side effects and completions disagree"


def test_a_full_disk_mid_run_loses_nothing_and_the_run_resumes_once_space_is_freed(
    tmp_path: Path, small_disk: SmallDisk
) -> None:
    steps = 40
    now = [1_700_000_000.0]

    reference = Outbox(tmp_path / "reference-outbox.txt")
    with Runtime(
        tmp_path / "reference.db",
        tools={"post": reference.tool()},
        workflows=[storage_fill],
        clock=lambda: now[0],
    ) as ref:
        assert ref.run(storage_fill, {"n": steps}, run_id="r-full").status == "SLEEPING"
        expected = ref.tick(now=now[0] + 120)[0]
        assert expected.status == "COMPLETED"

    path = small_disk.folder / "agent.db"
    outbox = Outbox(tmp_path / "outbox.txt")
    rt = Runtime(
        path, tools={"post": outbox.tool()}, workflows=[storage_fill], clock=lambda: now[0]
    )
    try:
        assert rt.run(storage_fill, {"n": steps}, run_id="r-full").status == "SLEEPING"
        committed = table_rows(path)
        small_disk.fill(rt)
        now[0] += 120

        with pytest.raises(StorageError) as info:
            rt.resume("r-full")
        assert_one_clear_error(info.value, path, "full")

        after = table_rows(path)
        for table, rows in committed.items():
            assert rows <= after[table], f"{table} lost committed rows"
        assert_log_and_effects_agree(path, "r-full")
        assert rt.state("r-full").status in ("RUNNING", "SLEEPING")

        small_disk.free(rt)
        state = rt.resume("r-full")
        assert state.status == "COMPLETED", state
        assert state.result == expected.result
    finally:
        rt.close()

    assert_log_and_effects_agree(path, "r-full")
    keys = [line.split("\t")[0] for line in outbox.lines()]
    assert len(keys) == steps and len(set(keys)) == steps, "an effect was lost or repeated"
    assert sorted(outbox.lines()) == sorted(reference.lines())
    with Runtime(path, workflows=[storage_fill]) as again:
        assert again.result("r-full") == expected.result
