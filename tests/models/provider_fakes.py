"""A loopback HTTP server that speaks the OpenAI and Anthropic wire formats, for adapter tests.

Tests queue the replies (JSON bodies, or server-sent event streams written
with chunked transfer encoding) and read back the requests the SDK clients
sent. Payload builders below follow the providers' documented shapes.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "gpt-test"
CLAUDE = "claude-test"
CREATED = 1_700_000_000


@dataclass
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class JsonReply:
    """A whole JSON response."""

    body: dict[str, Any]
    status: int = 200


@dataclass
class Pause:
    """A point in an event stream where the server waits until the test calls ``release``."""

    released: threading.Event = field(default_factory=threading.Event)
    timed_out: bool = False

    def release(self) -> None:
        self.released.set()


@dataclass
class SseReply:
    """A ``text/event-stream`` response: raw SSE frames, optionally with pauses between them."""

    frames: list[str | Pause]


Reply = JsonReply | SseReply


class FakeServer:
    """A provider API on 127.0.0.1 answering each request with the next queued reply."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self.pending: deque[Reply] = deque()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.fake = self  # type: ignore[attr-defined]
        # A short poll interval, so that stopping (which waits for the next poll) is quick.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, args=(0.01,), name="fake-provider", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)

    def reply(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        self.pending.extend(replies)

    @property
    def last_body(self) -> dict[str, Any]:
        return self.requests[-1].body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming, as real providers serve
    timeout = 5  # an idle kept-alive connection must not outlive the test

    @property
    def fake(self) -> FakeServer:
        return self.server.fake  # type: ignore[attr-defined]

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        self.fake.requests.append(
            RecordedRequest(
                "POST",
                self.path,
                {k.lower(): v for k, v in self.headers.items()},
                json.loads(raw or b"{}"),
            )
        )
        if not self.fake.pending:
            self._send_json(
                JsonReply({"error": {"message": "the fake server has no reply queued"}}, 500)
            )
            return
        reply = self.fake.pending.popleft()
        if isinstance(reply, JsonReply):
            self._send_json(reply)
        else:
            self._send_events(reply)

    def _send_json(self, reply: JsonReply) -> None:
        data = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_events(self, reply: SseReply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for frame in reply.frames:
            if isinstance(frame, Pause):
                frame.timed_out = not frame.released.wait(timeout=5)
            else:
                self._write_chunk(frame.encode())
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


# --- OpenAI Chat Completions ---------------------------------------------------------------


def openai_error(message: str, status: int, kind: str = "invalid_request_error") -> JsonReply:
    return JsonReply(
        {"error": {"message": message, "type": kind, "param": None, "code": None}}, status
    )


def openai_tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def openai_usage(prompt: int, completion: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def openai_completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    *,
    finish_reason: str = "stop",
    usage: tuple[int, int] = (10, 5),
    completion_id: str = "chatcmpl-1",
) -> JsonReply:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return JsonReply(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
            ],
            "usage": openai_usage(*usage),
        }
    )


def openai_chunk(
    delta: dict[str, Any], finish_reason: str | None = None, completion_id: str = "chatcmpl-stream"
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def openai_usage_chunk(
    prompt: int, completion: int, completion_id: str = "chatcmpl-stream"
) -> dict[str, Any]:
    """The last chunk when ``stream_options.include_usage`` is set: no choices, only usage."""
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": openai_usage(prompt, completion),
    }


def openai_tool_call_chunk(
    index: int, arguments: str, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """A chunk with a piece of one tool call: the first has id and name, the rest only arguments."""
    call: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        call.update(id=call_id, type="function")
        call["function"]["name"] = name
    return openai_chunk({"tool_calls": [call]})


def openai_stream(*frames: dict[str, Any] | Pause) -> SseReply:
    """Chunks as ``data:`` events, ending with ``data: [DONE]``."""
    return SseReply(
        [f if isinstance(f, Pause) else f"data: {json.dumps(f)}\n\n" for f in frames]
        + ["data: [DONE]\n\n"]
    )


# --- Anthropic Messages ----------------------------------------------------------------------


def anthropic_error(message: str, status: int, kind: str = "invalid_request_error") -> JsonReply:
    return JsonReply({"type": "error", "error": {"type": kind, "message": message}}, status)


def anthropic_usage(input_tokens: int, output_tokens: int, cache_read: int = 0) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cache_read,
    }


def anthropic_message(
    *content: dict[str, Any],
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
    message_id: str = "msg_1",
) -> JsonReply:
    return JsonReply(
        {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": CLAUDE,
            "content": list(content),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage or anthropic_usage(10, 5),
        }
    )


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(block_id: str, name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": block_id, "name": name, "input": tool_input}


def message_start(
    input_tokens: int, message_id: str = "msg_stream", cache_read: int = 0
) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": CLAUDE,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage(input_tokens, 1, cache_read),
        },
    }


def block_start(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "text_delta", "text": text},
    }


def json_delta(index: int, partial_json: str) -> dict[str, Any]:
    return {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": "input_json_delta", "partial_json": partial_json},
    }


def block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(stop_reason: str, output_tokens: int) -> dict[str, Any]:
    return {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }


def anthropic_event(event: dict[str, Any]) -> str:
    """One SSE frame: the event type on the ``event:`` line, the whole event as ``data:``."""
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def anthropic_stream(*events: dict[str, Any] | Pause) -> SseReply:
    """A stream of events, with a ping after message_start and message_stop last."""
    events = (*events[:1], {"type": "ping"}, *events[1:], {"type": "message_stop"})
    return SseReply([e if isinstance(e, Pause) else anthropic_event(e) for e in events])
