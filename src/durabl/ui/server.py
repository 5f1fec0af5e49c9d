"""``durabl ui``: a local, read-only web page that watches runs as they happen.

The server answers three kinds of request: the page itself (three static files shipped in the
package, no external asset), the run list (``/api/runs``, paged), and one run's events after a
seq (``/api/runs/<id>?after=N``). The page folds the events it receives into step cards itself,
so a poll costs one indexed read of the new events, however long the run's log is. A run's
answer also names the runs it is linked to (parent, children, continued from and as), with one
read of each linked run's status, and gives the run's figures (``metrics``: its tokens, its
cost, what a crash made it spend again) and, for a run that started others, the spend of them
all (``with_runs_started``): both from folds the server keeps per run and folds the new events
into (``folds``), so they cost no read of a whole log after the first. The run list reads no
run's log.

The database is opened read-only (``mode=ro``, ``query_only``): nothing is migrated or written.
SQLite may still create empty ``-wal``/``-shm`` companion files beside a WAL database it reads,
as every reader does; the database file's bytes never change. When the file is locked, gone or
damaged, the API answers 503 with the reason and the page says "database unavailable" until it
is back; the store is reopened on the next request.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import sys
import threading
import time
from dataclasses import asdict
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, TextIO
from urllib.parse import parse_qs, unquote, urlsplit

from durabl import events, leases
from durabl.errors import DurablError
from durabl.store import Store, is_postgres_url, open_store
from durabl.store.reads import continued_as, links, waiting_for
from durabl.ui.folds import RunFolds, TreeSpend

STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/style.css": ("style.css", "text/css; charset=utf-8"),
}
PAGE_SIZE = 25
MAX_PAGE = 200
MAX_EVENTS = 5000
"""Events per answer: a page catching up on a long run asks again from the last seq it got."""
MAX_CHILDREN = 100
"""Child runs listed per answer, each with its status (one read each); the count says the rest."""
STATUSES = (
    events.RUNNING, events.SLEEPING, events.WAITING, events.HELD, events.COMPLETED,
    events.FAILED, events.DEAD_LETTERED, events.CANCELLED, events.CONTINUED,
)  # fmt: skip
_RUN_PATH = re.compile(r"^/api/runs/([^/]+)$")


class BadRequest(Exception):
    """A malformed query: 400 with this message."""


class NotFound(Exception):
    """An unknown path or run: 404 with this message."""


class Unavailable(Exception):
    """The database cannot be read right now: 503 with this message."""


class Reader:
    """The read-only store behind the API. It is reopened when the file at the path is another
    one (replaced or restored), and a path with no file is unavailable, not served from the old
    file's open handle."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._store: Store | None = None
        self._identity: tuple[int, int] | None = None
        self.folds = RunFolds()

    def open(self) -> Store:
        """The store of the file now at the path. A user error (not a durabl database, a newer
        schema, a missing file) surfaces as the store's own error or FileNotFoundError."""
        with self._lock:
            if is_postgres_url(self.path):  # a server: no file to be replaced under it
                identity = (0, 0)
            else:
                st = os.stat(self.path)
                identity = (st.st_dev, st.st_ino)
            if self._store is not None and identity != self._identity:
                self._close()
            if self._store is None:
                self._store = open_store(self.path, read_only=True)
                self._identity = identity
            return self._store

    def read(self, work: Any) -> Any:
        """``work(store)``, or Unavailable with the reason when the file cannot be read."""
        try:
            return work(self.open())
        except FileNotFoundError:
            self.drop()
            raise Unavailable(f"database unavailable: {self.path} is gone") from None
        except (DurablError, OSError) as exc:
            self.drop()
            raise Unavailable(f"database unavailable: {exc}") from None

    def drop(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._store is not None:
            try:
                self._store.close()
            finally:
                self._store = None
                self._identity = None
                self.folds.clear()


def _int(query: dict[str, list[str]], name: str, default: int, low: int, high: int) -> int:
    values = query.get(name)
    if not values:
        return default
    text = values[-1]
    if not re.fullmatch(r"\d+", text):
        raise BadRequest(f"{name} must be a whole number, got {text!r}")
    value = int(text)
    if not low <= value <= high:
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def _run_json(row: Any, now_s: float) -> dict[str, Any]:
    lease = row.lease
    # a SIGKILLed owner leaves its lease until it expires: a dead pid on this host ends it now
    live = (
        lease is not None and lease.expires_s > now_s and not leases.owner_gone(row.run_id, lease)
    )
    return {
        "run_id": row.run_id,
        "workflow": row.workflow,
        "status": row.status,
        "error": row.error,
        "created_s": row.created_s,
        "updated_s": row.updated_s,
        "wake_at_s": row.wake_at_s,
        "watermark": row.watermark,
        "owner": asdict(lease) if lease is not None else None,
        "live": live,
    }


def list_runs(reader: Reader, query: dict[str, list[str]], now_s: float) -> dict[str, Any]:
    status = (query.get("status") or [""])[-1].upper()
    if status and status not in STATUSES:
        raise BadRequest(f"unknown status {status!r}; one of {', '.join(STATUSES)}")
    limit = _int(query, "limit", PAGE_SIZE, 1, MAX_PAGE)
    offset = _int(query, "offset", 0, 0, 10**9)

    def work(store: Store) -> dict[str, Any]:
        rows = store.list_runs(statuses=(status,) if status else None, limit=offset + limit + 1)
        page = rows[offset : offset + limit]
        runs = [
            {
                **_run_json(r, now_s),
                "steps": store.last_step(r.run_id),
                "waiting_for": waiting_for(store, r),
            }
            for r in page
        ]
        more = len(rows) > offset + limit
        return {"runs": runs, "offset": offset, "next_offset": offset + limit if more else None}

    result: dict[str, Any] = reader.read(work)
    return result


def run_events(
    reader: Reader, run_id: str, query: dict[str, list[str]], now_s: float
) -> dict[str, Any]:
    after = _int(query, "after", 0, 0, 2**62)

    def work(store: Store) -> dict[str, Any]:
        row = store.get_run(run_id)
        if row is None:
            raise NotFound(f"no run {run_id!r} in {reader.path}")
        log, found = reader.folds.read(store, row, max(after, row.watermark))
        log = log[:MAX_EVENTS]
        figures = found.metrics
        started = found.lineage.children or continued_as(row) is not None
        return {
            "run": {
                **_run_json(row, now_s),
                "waiting_for": waiting_for(store, row),
                "links": links(store, row, found.lineage, most_children=MAX_CHILDREN),
            },
            "metrics": None if figures is None else figures.as_dict(),
            "with_runs_started": (
                _tree_json(reader.folds.spend(store, row, found)) if started else None
            ),
            "compacted": row.watermark if after < row.watermark else 0,
            "events": [
                {
                    "seq": e.seq,
                    "kind": e.kind,
                    "step": e.step,
                    "at_s": e.at_s,
                    "data": None if e.data is None else json.loads(e.data),
                }
                for e in log
            ],
            "more": len(log) == MAX_EVENTS,
        }

    result: dict[str, Any] = reader.read(work)
    return result


def _tree_json(tree: TreeSpend) -> dict[str, Any]:
    return {**asdict(tree.spend), "complete": tree.complete}


class Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        try:
            if url.path in STATIC:
                name, kind = STATIC[url.path]
                body = (resources.files("durabl.ui") / "static" / name).read_bytes()
                self._send(HTTPStatus.OK, body, kind)
                return
            query = parse_qs(url.query, keep_blank_values=True)
            now_s = self.server.clock()
            if url.path == "/api/runs":
                self._json(HTTPStatus.OK, list_runs(self.server.reader, query, now_s))
                return
            match = _RUN_PATH.match(url.path)
            if match:
                run_id = unquote(match.group(1))
                self._json(HTTPStatus.OK, run_events(self.server.reader, run_id, query, now_s))
                return
            raise NotFound(f"nothing at {url.path}")
        except BadRequest as exc:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except NotFound as exc:
            self._json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except Unavailable as exc:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})

    def _json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        # the page loads nothing from anywhere but this server
        self.send_header(
            "Content-Security-Policy",
            "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'",
        )
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a poll twice a second would drown the terminal."""


class DashboardServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], reader: Reader, clock: Any) -> None:
        super().__init__(address, Handler)
        self.reader = reader
        self.clock = clock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(
    db: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    out: TextIO = sys.stdout,
    clock: Any = None,
) -> DashboardServer:
    """Bind the dashboard for ``db`` and return the server (call ``serve_forever``). Raises
    the store's error for a database it cannot open, and OSError for a port in use."""
    if not is_postgres_url(db) and not os.path.exists(db):
        raise FileNotFoundError(db)
    reader = Reader(db)
    shown = reader.open().path  # a database that is not durabl's is refused now, not on the page
    server = DashboardServer((host, port), reader, clock or time.time)
    if not is_loopback(host):
        print(
            f"warning: serving on {host}, not loopback: anyone who can reach this machine can "
            "read every run",
            file=out,
        )
    print(
        f"durabl ui: http://{host}:{server.server_port}/ (database {shown}, read-only)",
        file=out,
        flush=True,
    )
    return server
