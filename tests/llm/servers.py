"""Loopback model servers: one HTTP server on 127.0.0.1 that speaks the OpenAI Chat Completions
and Responses APIs and the Anthropic Messages API, plain and streamed (server-sent events
framed as the providers frame them, over chunked HTTP/1.1), for the real SDK clients to talk to.

Each test scripts the replies (``server.script(Say(...), Fail(500), ...)``, taken in order by
whichever API is asked) and reads back the requests the server got (``server.requests``). A
``Say`` with ``cut_after`` streams that many text deltas and then drops the connection, as a
proxy or a crashed upstream does.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CREATED_S = 1767225600
OPENAI_MODEL = "gpt-4o-mini-2024-07-18"
ANTHROPIC_MODEL = "claude-sonnet-4-20250514"


@dataclass(frozen=True)
class Call:
    """A tool call the scripted model makes."""

    name: str
    arguments: dict[str, Any]
    id: str = "call_1"


@dataclass(frozen=True)
class Say:
    """One scripted answer. ``input_tokens`` counts every input token, the cached ones too."""

    text: str | None = None
    calls: tuple[Call, ...] = ()
    model: str | None = None
    """The model the answer names; by default the API's usual one."""
    input_tokens: int = 20
    output_tokens: int = 8
    cached_tokens: int = 0
    pieces: tuple[str, ...] | None = None
    """How a streamed text is cut into deltas; by default word by word."""
    cut_after: int | None = None
    """Streamed: drop the connection after this many text deltas."""

    def deltas(self) -> list[str]:
        if self.pieces is not None:
            return list(self.pieces)
        return re.findall(r"\S+\s*|\s+", self.text or "")


@dataclass(frozen=True)
class Fail:
    """One scripted error response."""

    status: int
    message: str = "The server had an error while processing your request."
    retry_after: str | None = None


@dataclass(frozen=True)
class Received:
    """A request the server got."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


Frame = tuple[bytes, bool]
"""One server-sent event, and whether it carries a piece of the answer's text."""


def _argument_pieces(arguments: dict[str, Any]) -> list[str]:
    """A tool call's JSON arguments in three pieces, as models stream them."""
    text = json.dumps(arguments)
    third = max(1, len(text) // 3)
    return [text[:third], text[third : 2 * third], text[2 * third :]]


# -- OpenAI Chat Completions ------------------------------------------------------------------------


class ChatCompletions:
    path = "/chat/completions"

    def __init__(self, say: Say, number: int, request: dict[str, Any]) -> None:
        self.say, self.request = say, request
        self.model = say.model or OPENAI_MODEL
        self.id = f"chatcmpl-loopback{number}"

    def finish_reason(self) -> str:
        return "tool_calls" if self.say.calls else "stop"

    def usage(self) -> dict[str, Any]:
        say = self.say
        return {
            "prompt_tokens": say.input_tokens,
            "completion_tokens": say.output_tokens,
            "total_tokens": say.input_tokens + say.output_tokens,
            "prompt_tokens_details": {"cached_tokens": say.cached_tokens, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    def body(self) -> dict[str, Any]:
        message: dict[str, Any] = {
            "role": "assistant",
            "content": self.say.text,
            "refusal": None,
            "annotations": [],
        }
        if self.say.calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
                }
                for call in self.say.calls
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": CREATED_S,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self.finish_reason(),
                }
            ],
            "usage": self.usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_loopback",
        }

    def frames(self) -> list[Frame]:
        with_usage = (self.request.get("stream_options") or {}).get("include_usage") is True
        frames: list[Frame] = []

        def chunk(delta: dict[str, Any], finish: str | None = None, *, text: bool = False) -> None:
            data: dict[str, Any] = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": CREATED_S,
                "model": self.model,
                "service_tier": "default",
                "system_fingerprint": "fp_loopback",
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if with_usage:
                data["usage"] = None
            frames.append((b"data: " + json.dumps(data).encode() + b"\n\n", text))

        if self.say.text is not None:
            chunk({"role": "assistant", "content": "", "refusal": None})
            for piece in self.say.deltas():
                chunk({"content": piece}, text=True)
        for index, call in enumerate(self.say.calls):
            opening: dict[str, Any] = {
                "tool_calls": [
                    {
                        "index": index,
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": ""},
                    }
                ]
            }
            if index == 0 and self.say.text is None:
                opening = {"role": "assistant", "content": None, **opening, "refusal": None}
            chunk(opening)
            for piece in _argument_pieces(call.arguments):
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
        chunk({}, self.finish_reason())
        if with_usage:
            last = {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": CREATED_S,
                "model": self.model,
                "service_tier": "default",
                "system_fingerprint": "fp_loopback",
                "choices": [],
                "usage": self.usage(),
            }
            frames.append((b"data: " + json.dumps(last).encode() + b"\n\n", False))
        frames.append((b"data: [DONE]\n\n", False))
        return frames

    @staticmethod
    def error(fail: Fail) -> dict[str, Any]:
        limited = fail.status == 429
        return {
            "error": {
                "message": fail.message,
                "type": "requests" if limited else "server_error",
                "param": None,
                "code": "rate_limit_exceeded" if limited else None,
            }
        }


# -- OpenAI Responses -------------------------------------------------------------------------------


class Responses:
    path = "/responses"

    def __init__(self, say: Say, number: int, request: dict[str, Any]) -> None:
        self.say, self.request = say, request
        self.model = say.model or OPENAI_MODEL
        self.id = f"resp_loopback{number}"
        self.message_id = f"msg_loopback{number}"

    def message(self, text: str, status: str = "completed") -> dict[str, Any]:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        return {
            "id": self.message_id,
            "type": "message",
            "status": status,
            "content": [part] if status == "completed" else [],
            "role": "assistant",
        }

    def function_call(self, call: Call, status: str = "completed") -> dict[str, Any]:
        return {
            "id": f"fc_{call.id}",
            "type": "function_call",
            "status": status,
            "arguments": json.dumps(call.arguments) if status == "completed" else "",
            "call_id": call.id,
            "name": call.name,
        }

    def response(self, status: str = "completed") -> dict[str, Any]:
        say, done = self.say, status == "completed"
        output = []
        if done and say.text is not None:
            output.append(self.message(say.text))
        if done:
            output += [self.function_call(call) for call in say.calls]
        usage = {
            "input_tokens": say.input_tokens,
            "input_tokens_details": {"cached_tokens": say.cached_tokens},
            "output_tokens": say.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": say.input_tokens + say.output_tokens,
        }
        return {
            "id": self.id,
            "object": "response",
            "created_at": CREATED_S,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": self.request.get("instructions"),
            "max_output_tokens": self.request.get("max_output_tokens"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": True,
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": self.request.get("tool_choice", "auto"),
            "tools": self.request.get("tools", []),
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage if done else None,
            "user": None,
            "metadata": {},
        }

    def body(self) -> dict[str, Any]:
        return self.response()

    def frames(self) -> list[Frame]:
        frames: list[Frame] = []

        def event(kind: str, carries_text: bool = False, /, **data: Any) -> None:
            payload = {"type": kind, "sequence_number": len(frames), **data}
            line = f"event: {kind}\ndata: {json.dumps(payload)}\n\n"
            frames.append((line.encode(), carries_text))

        event("response.created", response=self.response("in_progress"))
        event("response.in_progress", response=self.response("in_progress"))
        index = 0
        if self.say.text is not None:
            ids = {"item_id": self.message_id, "output_index": 0}
            empty = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            event(
                "response.output_item.added", output_index=0, item=self.message("", "in_progress")
            )
            event("response.content_part.added", **ids, content_index=0, part=empty)
            for piece in self.say.deltas():
                event(
                    "response.output_text.delta",
                    True,
                    **ids,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                )
            text = self.say.text
            event("response.output_text.done", **ids, content_index=0, text=text, logprobs=[])
            event(
                "response.content_part.done", **ids, content_index=0, part={**empty, "text": text}
            )
            event("response.output_item.done", output_index=0, item=self.message(text))
            index = 1
        for offset, call in enumerate(self.say.calls):
            at = index + offset
            ids = {"item_id": f"fc_{call.id}", "output_index": at}
            event(
                "response.output_item.added",
                output_index=at,
                item=self.function_call(call, "in_progress"),
            )
            for piece in _argument_pieces(call.arguments):
                event("response.function_call_arguments.delta", **ids, delta=piece)
            arguments = json.dumps(call.arguments)
            event(
                "response.function_call_arguments.done", **ids, name=call.name, arguments=arguments
            )
            event("response.output_item.done", output_index=at, item=self.function_call(call))
        event("response.completed", response=self.response())
        return frames

    error = ChatCompletions.error


# -- Anthropic Messages -----------------------------------------------------------------------------


class Messages:
    path = "/messages"

    def __init__(self, say: Say, number: int, request: dict[str, Any]) -> None:
        self.say, self.request = say, request
        self.model = say.model or ANTHROPIC_MODEL
        self.id = f"msg_loopback{number}"

    def stop_reason(self) -> str:
        return "tool_use" if self.say.calls else "end_turn"

    def usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.say.input_tokens - self.say.cached_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": self.say.cached_tokens,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def message(
        self, content: list[Any], stop_reason: str | None, output_tokens: int
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": self.usage(output_tokens),
        }

    def body(self) -> dict[str, Any]:
        content: list[Any] = []
        if self.say.text is not None:
            content.append({"type": "text", "text": self.say.text})
        content += [
            {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}
            for call in self.say.calls
        ]
        return self.message(content, self.stop_reason(), self.say.output_tokens)

    def frames(self) -> list[Frame]:
        frames: list[Frame] = []

        def event(kind: str, carries_text: bool = False, /, **data: Any) -> None:
            line = f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"
            frames.append((line.encode(), carries_text))

        event("message_start", message=self.message([], None, 1))
        blocks: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
        if self.say.text is not None:
            deltas = [{"type": "text_delta", "text": piece} for piece in self.say.deltas()]
            blocks.append(({"type": "text", "text": ""}, deltas))
        for call in self.say.calls:
            start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            pieces = ["", *_argument_pieces(call.arguments)]
            blocks.append(
                (start, [{"type": "input_json_delta", "partial_json": p} for p in pieces])
            )
        for index, (start, deltas) in enumerate(blocks):
            event("content_block_start", index=index, content_block=start)
            if index == 0:
                event("ping")
            for delta in deltas:
                event(
                    "content_block_delta", delta["type"] == "text_delta", index=index, delta=delta
                )
            event("content_block_stop", index=index)
        stop = {"stop_reason": self.stop_reason(), "stop_sequence": None}
        event("message_delta", delta=stop, usage={"output_tokens": self.say.output_tokens})
        event("message_stop")
        return frames

    @staticmethod
    def error(fail: Fail) -> dict[str, Any]:
        kinds = {429: "rate_limit_error", 529: "overloaded_error", 400: "invalid_request_error"}
        return {
            "type": "error",
            "error": {"type": kinds.get(fail.status, "api_error"), "message": fail.message},
            "request_id": "req_loopback",
        }


APIS = (ChatCompletions, Responses, Messages)


# -- the server -------------------------------------------------------------------------------------


@dataclass
class ModelServer:
    """The loopback server, running in a thread until ``close``. ``base_url`` is what the OpenAI
    SDK and LiteLLM take; ``root`` is what the Anthropic SDK takes."""

    script_left: deque[Say | Fail] = field(default_factory=deque)
    requests: list[Received] = field(default_factory=list)
    unscripted: int = 0
    """Requests that came when the script had no reply left (each got a 500)."""
    errors: list[BaseException] = field(default_factory=list)
    """What went wrong inside the server (not a client hanging up): a bug in a test."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._http = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._http.daemon_threads = True
        self._http.model_server = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def script(self, *replies: Say | Fail) -> None:
        with self._lock:
            self.script_left.extend(replies)

    def bodies(self) -> list[dict[str, Any]]:
        return [request.body for request in self.requests]

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ModelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def take(self, received: Received) -> Say | Fail | None:
        with self._lock:
            self.requests.append(received)
            if not self.script_left:
                self.unscripted += 1
                return None
            return self.script_left.popleft()


class _HTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if error is not None and not isinstance(error, ConnectionError):
            self.model_server.errors.append(error)  # type: ignore[attr-defined]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 10

    def do_POST(self) -> None:
        owner: ModelServer = self.server.model_server  # type: ignore[attr-defined]
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        path = self.path.split("?")[0]
        headers = {key.lower(): value for key, value in self.headers.items()}
        api = next((api for api in APIS if path.endswith(api.path)), None)
        if api is None:
            self._json(404, {"error": {"message": f"no route {path}", "type": "invalid_request"}})
            return
        reply = owner.take(Received(path, headers, body))
        if reply is None:
            reply = Fail(500, "the loopback script has no reply left")
        if isinstance(reply, Fail):
            extra = {"retry-after": reply.retry_after} if reply.retry_after else {}
            self._json(reply.status, api.error(reply), extra)
            return
        answer = api(reply, len(owner.requests), body)
        if body.get("stream"):
            self._stream(answer.frames(), reply.cut_after)
        else:
            self._json(200, answer.body())

    def _json(self, status: int, data: dict[str, Any], extra: dict[str, str] | None = None) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.send_header("x-request-id", "req_loopback")
        self.send_header("request-id", "req_loopback")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(raw)

    def _stream(self, frames: list[Frame], cut_after: int | None) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("cache-control", "no-cache")
        self.send_header("x-request-id", "req_loopback")
        self.send_header("request-id", "req_loopback")
        self.end_headers()
        texts = 0
        for frame, is_text in frames:
            self.wfile.write(f"{len(frame):X}\r\n".encode() + frame + b"\r\n")
            self.wfile.flush()
            texts += is_text
            if cut_after is not None and texts >= cut_after:
                self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: a broken body
                self.close_connection = True
                return
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read ``requests``
