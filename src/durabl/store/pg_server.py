"""PostgreSQL sessions for the store: a pool of connections, each call one transaction retried
across a lost connection, and what a restarted server took back written again.

A lost connection. Every call is retried on a new connection until ``reconnect_s`` has passed,
with one log line when the connection is lost and one when it is back. A write whose COMMIT was
sent but not answered may or may not have landed; before trying it again, the caller's
``landed`` looks (``durabl.store.postgres`` says how for each write). So a retry neither loses an
acknowledged write nor makes a second one.

A server that crashes can come back without the bookkeeping commits it had acknowledged but
not yet flushed (``durability="full"``): each new connection asks when the server started, and
on finding it restarted the kept commits are written again before anything else
(``durabl.store.unflushed``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool

from durabl.errors import (
    DurablError,
    HistoryRewriteError,
    LeaseLost,
    LogGapError,
    PostgresError,
    ServerUnreachableError,
    StoreClosedError,
)
from durabl.store.schema import load_queries
from durabl.store.sqlite import check_durability
from durabl.store.unflushed import Unflushed

__all__ = ["POOL_SIZE", "PQ", "RECONNECT_S", "Server", "server_name", "session_name"]

logger = logging.getLogger("durabl.store")

PQ = load_queries("postgres_queries.sql")

RECONNECT_S = 60.0
"""How long a call keeps trying to reach a lost server before it gives up."""

IDLE_IN_TRANSACTION_MS = 30_000
"""A session of this store that sits inside a transaction this long is ended by the server,
which releases its locks: no commit of durabl's waits on anything between its statements, so
only a frozen or cut-off process gets there, and its locks would otherwise keep other workers
off its runs until TCP noticed (hours)."""

POOL_SIZE = 16
CONNECT_TIMEOUT_S = 10

_REFUSALS: dict[str, Callable[..., DurablError]] = {
    "DB001": lambda *, path, rule, sqlite_message: LeaseLost(path=path),
    "DB002": LogGapError,
    "DB003": HistoryRewriteError,
    "DB004": HistoryRewriteError,
}
"""What each of the schema's own SQLSTATEs raises (see the module docstring)."""

_CONNECTION_LOST = {"57P01", "57P02", "57P03"}
"""SQLSTATEs that mean the session is gone (the server terminated it, or is shutting down);
class 08 is connection exceptions, and no SQLSTATE at all means libpq lost the socket."""

T = TypeVar("T")


def server_name(url: str) -> str:
    """The URL as durabl names it in messages and logs: without its password."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return url.split("@")[-1] if "@" in url else url
    user = f"{info['user']}@" if info.get("user") else ""
    host = info.get("host") or "localhost"
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{user}{host}{port}/{info.get('dbname') or ''}"


def session_name(host: str, pid: int) -> str:
    """The application_name of the sessions of process ``pid`` on ``host``."""
    return f"durabl:{host}:{pid}"[:63]  # the server keeps 63 bytes of it


def _lost(exc: BaseException) -> bool:
    """Whether ``exc`` says the connection is gone (as opposed to a statement refused)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _CONNECTION_LOST


def _why_unreachable(message: str) -> str:
    """What a failed connection attempt means, from libpq's words: a failed connection has no
    SQLSTATE to go by. The server's own message is always kept beside it."""
    text = message.lower()
    if "password authentication failed" in text or ("role" in text and "does not exist" in text):
        return "the server refused these credentials"
    if "database" in text and "does not exist" in text:
        return "no such database on the server (create it first: createdb)"
    if "connection refused" in text or "no such file or directory" in text:
        return "cannot connect to PostgreSQL: is the server running and listening there?"
    if "timeout" in text or "timed out" in text:
        return "cannot connect to PostgreSQL: the server did not answer in time"
    if "could not translate host name" in text:
        return "cannot connect to PostgreSQL: unknown host"
    return "cannot connect to PostgreSQL"


class _Attempt:
    """What one try of a call got as far as: whether its COMMIT was sent."""

    __slots__ = ("sent_commit",)

    def __init__(self) -> None:
        self.sent_commit = False


class Server:
    """The connections of one store to one PostgreSQL database. Thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        durability: str,
        read_only: bool,
        reconnect_s: float = RECONNECT_S,
        pool_size: int = POOL_SIZE,
        prepare: Callable[[psycopg.Connection[Any]], None],
    ) -> None:
        check_durability(durability)
        self.url = url
        self.path = server_name(url)
        self.durability = durability
        self.read_only = read_only
        self.reconnect_s = reconnect_s
        self._closed = False
        self.session_name = session_name(os.uname().nodename, os.getpid())
        """What this process's sessions are called on the server: how another host tells that
        the process holding a lease is gone (``owner_alive``)."""
        self._options = " ".join(
            option
            for option, wanted in (
                ("-c default_transaction_read_only=on", read_only),
                ("-c synchronous_commit=off", durability == "process"),
                (f"-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS}", True),
            )
            if wanted
        )
        self._clock_offset_s = 0.0
        with self._connection_once() as conn:
            prepare(conn)
            self._clock_offset_s, self._server_started, flush_ms = self._meet(conn)
        self._unflushed = Unflushed(flushed_within_s=3 * flush_ms / 1000 + 1.0)
        self._restarted = False
        """Set when a new connection finds the server started since the last one did."""
        self._redo_lock = threading.Lock()
        self._pool = ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs=self._connect_kwargs(),
            configure=self._on_connect,
            open=False,
            name=f"durabl {self.path}",
        )
        self._pool.open(wait=False)

    def _connect_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": CONNECT_TIMEOUT_S,
            "application_name": self.session_name,
        }
        if self._options:
            kwargs["options"] = self._options
        return kwargs

    @contextmanager
    def _connection_once(self) -> Iterator[psycopg.Connection[Any]]:
        """One connection of its own, for opening: a failure here is the user's to fix, so it
        is reported at once, not retried."""
        try:
            conn = psycopg.connect(self.url, **self._connect_kwargs())
        except psycopg.ProgrammingError as exc:  # the URL itself does not parse
            raise ServerUnreachableError(
                path=self.path, why="not a valid PostgreSQL URL", server_message=str(exc)
            ) from None
        except psycopg.OperationalError as exc:
            message = " ".join(str(exc).split())
            raise ServerUnreachableError(
                path=self.path, why=_why_unreachable(message), server_message=message
            ) from None
        try:
            yield conn
        finally:
            conn.close()

    def _meet(self, conn: psycopg.Connection[Any]) -> tuple[float, Any, int]:
        """The server's clock's offset from this host's, when the server started, and how
        often its WAL writer flushes by itself (ms)."""
        before = time.time()
        found = conn.execute(PQ["clock"]).fetchone()
        after = time.time()
        assert found is not None
        return float(found[0]) - (before + after) / 2, found[1], int(found[2])

    def _on_connect(self, conn: psycopg.Connection[Any]) -> None:
        """Each new pooled connection: has the server restarted since the last one?"""
        found = conn.execute(PQ["server_started"]).fetchone()
        started = found[0] if found else None
        if started != self._server_started:
            self._server_started = started
            self._restarted = True

    def _redo_lost(self, conn: psycopg.Connection[Any]) -> None:
        """After a restart of the server, before anything else: write again what it had
        acknowledged but may not have flushed, in the order it was written. A write refused
        now (another owner took the run meanwhile) stays undone; its owner learns of it at
        its next write, as after any takeover."""
        with self._redo_lock:
            if not self._restarted:
                return
            pending = self._unflushed.pending()
            refused = 0
            for write in pending:
                try:
                    self._once(conn, write.work, _Attempt(), True, True, False, False, write.landed)
                except psycopg.Error as exc:
                    if _lost(exc):
                        raise  # down again: the next try starts over
                    refused += 1
                except DurablError:
                    refused += 1
            self._unflushed.done(pending)
            self._restarted = False
        logger.warning(
            "durabl: %s restarted; wrote again the %d commit(s) it may have lost (%d refused)",
            self.path,
            len(pending) - refused,
            refused,
        )

    def clock(self) -> float:
        """The database server's clock, epoch seconds: this host's clock corrected by the
        offset measured when the store opened. Timers are armed and fired by it, so that
        workers on hosts whose clocks disagree agree on when a timer is due."""
        return time.time() + self._clock_offset_s

    def _error(self, exc: psycopg.Error) -> DurablError:
        """The ``DurablError`` for what the server said."""
        if _lost(exc):
            message = " ".join(str(exc).split())
            return ServerUnreachableError(
                path=self.path, why="lost the connection to PostgreSQL", server_message=message
            )
        state = exc.sqlstate
        message = exc.diag.message_primary or str(exc)
        make = _REFUSALS.get(state or "")
        if make is not None:
            rule = message.removeprefix("durabl:").strip()
            return make(path=self.path, rule=rule, sqlite_message=f"SQLSTATE {state}")
        error = PostgresError(path=self.path, server_message=message, sqlstate=state)
        error.constraint = exc.diag.constraint_name
        return error

    def _do(
        self,
        work: Callable[[psycopg.Connection[Any]], T],
        *,
        write: bool = False,
        durable: bool = False,
        landed: Callable[[psycopg.Connection[Any]], tuple[bool, T]] | None = None,
        snapshot: bool = False,
        pipelined: bool = False,
        remember: bool = True,
    ) -> T:
        """Run ``work`` in one transaction, on a pooled connection, retried across lost
        connections (see the module docstring). ``landed`` tells, after a write's COMMIT went
        unanswered, whether it committed, and its answer if it did. ``pipelined``: ``work``
        only sends statements and needs none of their answers, so BEGIN, its statements and
        COMMIT go to the server together, in one round trip; the first refusal among them is
        raised, and the transaction is rolled back. A write that does not wait for the WAL
        flush is kept to be written again if the server crashes before it is flushed, unless
        ``remember`` is False (its caller keeps what to redo itself)."""
        lost_at: float | None = None
        unsure = False
        delay_s = 0.05
        while True:
            if self._closed:
                raise StoreClosedError(path=self.path)
            attempt = _Attempt()
            begun_s = time.monotonic()
            try:
                with self._pool.connection(timeout=max(1.0, self.reconnect_s)) as conn:
                    if self._restarted:
                        self._redo_lost(conn)
                    value = self._once(
                        conn,
                        work,
                        attempt,
                        write,
                        durable,
                        snapshot,
                        pipelined,
                        landed if unsure else None,
                    )
            except psycopg.Error as exc:
                if not _lost(exc) or self._closed:
                    raise self._error(exc) from None
                now = time.monotonic()
                if lost_at is None:
                    lost_at = now
                    logger.warning(
                        "durabl: lost the connection to %s (%s); reconnecting",
                        self.path,
                        " ".join(str(exc).split()) or type(exc).__name__,
                    )
                    self._pool.check()  # the outage killed the idle connections too: drop them
                elif now - lost_at > self.reconnect_s:
                    raise ServerUnreachableError(
                        path=self.path,
                        why=f"lost the connection to PostgreSQL and could not reconnect in "
                        f"{self.reconnect_s:g} s",
                        server_message=" ".join(str(exc).split()),
                    ) from None
                unsure = unsure or (write and attempt.sent_commit)
                time.sleep(delay_s)
                delay_s = min(1.0, delay_s * 2)
                continue
            if lost_at is not None:  # said only once a call has gone through again
                logger.warning(
                    "durabl: reconnected to %s after %.1f s", self.path, time.monotonic() - lost_at
                )
            if write and self.durability == "full" and remember:
                if durable:
                    self._unflushed.flushed(before_s=begun_s)
                else:
                    self._unflushed.remember(work, landed, server_up=not self._restarted)
            return value

    def _once(
        self,
        conn: psycopg.Connection[Any],
        work: Callable[[psycopg.Connection[Any]], T],
        attempt: _Attempt,
        write: bool,
        durable: bool,
        snapshot: bool,
        pipelined: bool,
        landed: Callable[[psycopg.Connection[Any]], tuple[bool, T]] | None,
    ) -> T:
        """One try of ``_do`` on ``conn``; ``landed`` is given when an earlier try's COMMIT
        went unanswered."""
        if landed is not None:
            done, answer = landed(conn)
            if done:
                return answer
        if not (write or snapshot):  # one statement: its own transaction
            return work(conn)
        quiet = write and durable is False and self.durability == "full"
        if pipelined:
            attempt.sent_commit = True  # it goes out with the rest: from here, unsure
            with conn.pipeline():
                conn.execute("BEGIN")
                if quiet:
                    conn.execute("SET LOCAL synchronous_commit TO off")
                value = work(conn)
                conn.execute("COMMIT")
            return value
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if snapshot else "BEGIN")
        try:
            if quiet:
                conn.execute("SET LOCAL synchronous_commit TO off")
            value = work(conn)
        except BaseException:
            if not conn.broken:
                with suppress(psycopg.Error):  # the error in hand is the one to tell
                    conn.execute("ROLLBACK")
            raise
        attempt.sent_commit = True
        conn.execute("COMMIT")
        return value

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._pool.close()
