"""A small OpenAI-compatible model server on 127.0.0.1, so that the examples run offline with the
real OpenAI SDK: it answers ``POST /v1/chat/completions`` (not streamed) with what a Python
function of the messages says, and appends each request it gets to a JSON-lines file.

``reply(messages)`` returns ``{"text": ...}`` or ``{"tool_calls": [{"id", "name",
"arguments"}]}``; the server wraps it in a Chat Completion as OpenAI sends one.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "gpt-4o-mini-2024-07-18"
Reply = Callable[[list[dict[str, Any]]], dict[str, Any]]


class ScriptedModel:
    """The server, in a thread of this process until ``close``."""

    def __init__(self, reply: Reply, requests_file: Path) -> None:
        self.reply, self.requests_file = reply, requests_file
        self.lock = threading.Lock()
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.http.daemon_threads = True
        self.http.scripted = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def answer(self, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """Log the request, then answer it."""
        record = {"pid": headers.get("x-agent-pid"), "body": body}
        with self.lock:
            fd = os.open(self.requests_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
            finally:
                os.close(fd)
        return completion(self.reply(body["messages"]), body["messages"])

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()

    def __enter__(self) -> ScriptedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def completion(said: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
    """A Chat Completion of what the script said, with a rough but steady token count."""
    calls = [
        {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
        for call in said.get("tool_calls", [])
    ]
    message: dict[str, Any] = {"role": "assistant", "content": said.get("text"), "refusal": None}
    if calls:
        message["tool_calls"] = calls
    tokens_in = len(json.dumps(messages)) // 4
    tokens_out = len(json.dumps(message)) // 4
    return {
        "id": f"chatcmpl-loopback{len(messages)}",
        "object": "chat.completion",
        "created": 1767225600,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": "tool_calls" if calls else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": tokens_in,
            "completion_tokens": tokens_out,
            "total_tokens": tokens_in + tokens_out,
            "prompt_tokens_details": {"cached_tokens": 0},
        },
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 30

    def do_POST(self) -> None:
        scripted: ScriptedModel = self.server.scripted  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
        if not self.path.endswith("/chat/completions") or body.get("stream"):
            self._send(404, {"error": {"message": "only plain chat completions here"}})
            return
        headers = {key.lower(): value for key, value in self.headers.items()}
        self._send(200, scripted.answer(headers, body))

    def _send(self, status: int, data: dict[str, Any]) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        pass
