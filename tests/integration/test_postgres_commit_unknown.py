"""A COMMIT whose answer never arrives (SPEC §6; the PostgreSQL backend).

Between durabl and the server sits a TCP relay that can cut a connection at the worst moment:
right after relaying a COMMIT to the server, so that the server commits and the client never
hears it ("landed"), or instead of relaying it, so that the server rolls the transaction back
("lost"). The store cannot tell the two apart from the error; it has to look. A store that
assumed the commit failed would write the step again, which the log's triggers refuse (the seq
is taken); one that assumed it landed would leave a hole, which the next append would hit. Here
every run must complete with each step in its log once and each tool called once.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable

import pytest

import pg_support
from durabl import Runtime, ToolCall, workflow

SERVER_HOST, SERVER_PORT = "127.0.0.1", 5432


def _close(ends: tuple[socket.socket, ...]) -> None:
    for end in ends:
        with contextlib.suppress(OSError):
            end.shutdown(socket.SHUT_RDWR)
        end.close()


class CuttingRelay:
    """Relays TCP to the server; while ``cuts`` is above 0, the next chunk from a client that
    holds a COMMIT ends that connection: relayed first (``landed``) or not at all (``lost``)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.cuts = 0
        self.made = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection((SERVER_HOST, SERVER_PORT))
            muted = threading.Event()  # the server's answers stop here: the client hears nothing
            ends = (client, server)
            threading.Thread(
                target=self._up, args=(client, server, muted, ends), daemon=True
            ).start()
            threading.Thread(
                target=self._down, args=(server, client, muted, ends), daemon=True
            ).start()

    def _cut_now(self, chunk: bytes) -> bool:
        with self._lock:
            if self.cuts > 0 and b"COMMIT" in chunk:
                self.cuts -= 1
                self.made += 1
                return True
            return False

    def _up(
        self,
        client: socket.socket,
        server: socket.socket,
        muted: threading.Event,
        ends: tuple[socket.socket, ...],
    ) -> None:
        """Client to server. A cut in "landed" mode relays the COMMIT and whatever the client
        sends with it for a moment (the server commits), but none of the server's answers."""
        with contextlib.suppress(OSError):
            while chunk := client.recv(65536):
                if self._cut_now(chunk):
                    if self.mode == "landed":
                        muted.set()
                        server.sendall(chunk)
                        client.settimeout(0.3)
                        with contextlib.suppress(TimeoutError):
                            while more := client.recv(65536):
                                server.sendall(more)
                        time.sleep(0.3)
                    break
                server.sendall(chunk)
        _close(ends)

    def _down(
        self,
        server: socket.socket,
        client: socket.socket,
        muted: threading.Event,
        ends: tuple[socket.socket, ...],
    ) -> None:
        with contextlib.suppress(OSError):
            while chunk := server.recv(65536):
                if not muted.is_set():
                    client.sendall(chunk)
        _close(ends)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def database(postgres_db: Callable[[], str]) -> str:
    return pg_support.name_of(postgres_db())


calls: list[int] = []
relay_of: dict[str, CuttingRelay] = {}


def step_tool(i: int) -> int:
    calls.append(i)
    if i == 3:  # the runtime is open and working: from here on, cut COMMITs
        relay_of["relay"].cuts = 4
    return i


@workflow(name="unknown_chain")
def chain(ctx: object, steps: int) -> object:
    total = 0
    for i in range(steps):
        total += yield ToolCall("step", {"i": i})
    return total


@pytest.mark.parametrize("mode", ["landed", "lost"])
def test_a_commit_cut_off_is_neither_lost_nor_repeated(
    database: str, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    relay = relay_of["relay"] = CuttingRelay(mode)
    calls.clear()
    url = f"postgresql://{SERVER_HOST}:{relay.port}/{database}"
    try:
        with (
            caplog.at_level(logging.WARNING, logger="durabl.store"),
            Runtime(url, tools={"step": step_tool}) as rt,
        ):
            state = rt.run(chain, {"steps": 12})
            log = rt.store.load_log(state.run_id)
    finally:
        relay.close()

    assert relay.made == 4, "the relay never cut a COMMIT: the test proved nothing"
    assert (state.status, state.result) == ("COMPLETED", sum(range(12)))
    assert calls == list(range(12)), "a tool was called again: a commit was lost or repeated"
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    completed = [e.step for e in log if e.kind == "STEP_COMPLETED"]
    assert completed == list(range(1, 13))
    said = [r.getMessage() for r in caplog.records]
    assert any("lost the connection to" in line for line in said), said
    assert any("reconnected to" in line for line in said), said
