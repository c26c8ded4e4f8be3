"""The v2 thread stream: ``POST /threads/{id}/commands``, ``POST /threads/{id}/stream/events`` and its WebSocket.

What ``client.threads.stream(...)`` in ``langgraph_sdk`` 0.4 (and ``RemoteGraph.stream_events(version="v3")``,
the JS SDK's ``client.threads.stream``) speaks: commands (``run.start``, ``input.respond``, ``agent.getTree``)
answered with ``{"type": "success", "id", "result", "meta"}`` or ``{"type": "error", "id", "error",
"message"}``, and the thread's protocol events (:mod:`backchannel.runtime.threadlog`), filtered by channel
and namespace, as server-sent events (``event: <method>``, ``data: <event>``, ``id: <seq>``) or WebSocket
frames. On the WebSocket every frame a client sends is a command, ``subscription.subscribe`` /
``subscription.unsubscribe`` / ``subscription.reconnect`` included.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any
from uuid import uuid4

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from backchannel.errors import BackchannelError, ConflictError, InvalidRequestError, NotFoundError
from backchannel.runtime.commands import CommandError
from backchannel.runtime.protocol import CHANNELS, ProtocolFilter
from backchannel.runtime.threadlog import Entry, ThreadLog
from backchannel.serde import json_bytes, loads_exact
from backchannel.server.routing import Endpoint, JSONResponse, read_body, runtime_of
from backchannel.server.schemas import EventStreamRequest, ProtocolCommand
from backchannel.server.sse import StreamingBody, event_stream

__all__ = ["ENDPOINTS", "websocket_routes"]

_DEDUP_WINDOW = 2048  # events a WebSocket remembers having sent (two subscriptions may both want one)


async def thread_command(request: Request) -> Response:
    body = await read_body(request, ProtocolCommand)
    return JSONResponse(await _dispatch(runtime_of(request), request.path_params["thread_id"], body))


async def thread_events(request: Request) -> StreamingBody:
    body = await read_body(request, EventStreamRequest)
    subscription = _filter(body.model_dump(exclude_unset=True))
    rt = runtime_of(request)
    await rt.threads.row(request.path_params["thread_id"])  # 404 for an unknown thread, before the stream
    log = rt.thread_logs.get(request.path_params["thread_id"])
    return event_stream(request, _sse(log.follow(subscription, body.since)))


async def _sse(entries: AsyncIterator[Entry]) -> AsyncIterator[bytes]:
    async for entry in entries:
        yield b"event: %b\r\ndata: %b\r\nid: %d\r\n\r\n" % (entry.method.encode(), entry.json, entry.seq)


def _filter(params: dict[str, Any]) -> ProtocolFilter:
    try:
        return ProtocolFilter.parse(params)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


async def _dispatch(rt: Any, thread_id: str, command: ProtocolCommand) -> dict[str, Any]:
    """A command's response envelope (errors included: the protocol answers them in its own shape)."""
    applied = rt.thread_logs.get(thread_id).seq  # the events before the command's own
    try:
        if command.method == "run.start":
            result = await rt.commands.run_start(thread_id, command.params)
        elif command.method == "input.respond":
            result = await rt.commands.input_respond(thread_id, command.params)
        elif command.method == "agent.getTree":
            result = rt.commands.agent_tree(thread_id)
        elif command.method.startswith("subscription."):
            raise CommandError("not_supported", f"{command.method} works on the thread's WebSocket "
                                                "(/threads/{thread_id}/stream/events); over HTTP, a stream's "
                                                "request body is its subscription")
        else:
            raise CommandError("unknown_command", f"unknown protocol command {command.method!r}; use run.start, "
                                                  "input.respond, agent.getTree or subscription.*")
    except BackchannelError as exc:
        return _error(command.id, _code(exc), str(exc), applied)
    return {"type": "success", "id": command.id, "result": result, "meta": {"applied_through_seq": applied}}


def _code(exc: BackchannelError) -> str:
    if isinstance(exc, CommandError):
        return exc.code
    if isinstance(exc, InvalidRequestError | NotFoundError | ConflictError):
        return "invalid_argument"
    return "unknown_error"


def _error(command_id: int | None, code: str, message: str, applied: int | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": "error", "id": command_id, "error": code, "message": message}
    if applied is not None:
        error["meta"] = {"applied_through_seq": applied}
    return error


# -- the WebSocket ------------------------------------------------------------------------------------------


async def thread_socket(websocket: WebSocket) -> None:
    rt = websocket.app.state.runtime
    thread_id = websocket.path_params["thread_id"]
    await websocket.accept()  # on a thread that may not exist yet: a run.start sent here makes it
    socket = _Socket(websocket, rt.thread_logs.get(thread_id))
    try:
        while True:
            raw = await websocket.receive_text()
            await socket.send(await socket.handle(rt, thread_id, raw))
    except WebSocketDisconnect:
        pass
    finally:
        await socket.close()


class _Socket:
    """One WebSocket: its subscriptions, and the thread's events going out in order, each once, when any
    subscription wants it. A new subscription first gets the earlier events it wants (after its ``since``;
    without, from the start of the newest run the socket has seen), as LangGraph's sockets replay them."""

    def __init__(self, websocket: WebSocket, log: ThreadLog) -> None:
        self.websocket = websocket
        self.log = log
        self.subscriptions: dict[str, ProtocolFilter] = {}
        self.opened = 0  # where the socket's view of the thread begins: set by its first subscription
        self._cursor = 0  # the last event the pump has looked at
        self._sent: OrderedDict[int, None] = OrderedDict()
        self._lock = asyncio.Lock()
        self._pump: asyncio.Task[None] | None = None

    async def handle(self, rt: Any, thread_id: str, raw: str) -> dict[str, Any]:
        try:
            command = ProtocolCommand.model_validate(loads_exact(raw))
        except (ValueError, RecursionError):
            return _error(None, "invalid_argument", "a command is a JSON object with an integer id and a method")
        method, params = command.method, command.params
        if method in ("subscription.subscribe", "subscription.reconnect"):
            return await self._subscribe(command.id, method, params)
        if method == "subscription.unsubscribe":
            if self.subscriptions.pop(str(params.get("subscription_id")), None) is None:
                return _error(command.id, "no_such_subscription", f"no subscription {params.get('subscription_id')}")
            return {"type": "success", "id": command.id, "result": {}, "meta": {"applied_through_seq": self._cursor}}
        return await _dispatch(rt, thread_id, command)

    async def _subscribe(self, command_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
        since = params.get("since")
        if since is not None and (not isinstance(since, int) or isinstance(since, bool) or since < 0):
            return _error(command_id, "invalid_argument", f"since must be a non-negative integer, not {since!r}")
        if method == "subscription.reconnect" and since is None:
            return _error(command_id, "invalid_argument", "subscription.reconnect needs since: an integer")
        try:
            subscription = ProtocolFilter.parse(params)
        except ValueError as exc:
            return _error(command_id, "invalid_argument", str(exc))
        subscription_id = str(params.get("subscription_id") or uuid4())
        if self._pump is None:  # the first: the pump starts where it does
            self.opened = self._cursor = since if since is not None else self.log.start()
            self.subscriptions[subscription_id] = subscription
            self._pump = asyncio.create_task(self._forward())
            return {"type": "success", "id": command_id, "result": {"subscription_id": subscription_id},
                    "meta": {"applied_through_seq": self._cursor}}
        after = since if since is not None else self.log.latest_run_start(self.opened)
        async with self._lock:  # the pump waits: what it sends next comes after the replay
            replayed = [e for e in self.log.entries if after < e.seq <= self._cursor and e.seq not in self._sent
                        and e.wanted(subscription)]
            for entry in replayed:
                await self._send_entry(entry)
            self.subscriptions[subscription_id] = subscription
        return {"type": "success", "id": command_id,
                "result": {"subscription_id": subscription_id, "replayed_events": len(replayed)},
                "meta": {"applied_through_seq": self._cursor}}

    async def send(self, message: dict[str, Any]) -> None:
        async with self._lock:
            await self.websocket.send_text(json_bytes(message).decode())

    async def _send_entry(self, entry: Entry) -> None:
        self._sent[entry.seq] = None
        if len(self._sent) > _DEDUP_WINDOW:
            self._sent.popitem(last=False)
        await self.websocket.send_text(entry.json.decode())

    async def _forward(self) -> None:
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the socket closed under a send
            async for entry in self.log.follow(_EVERYTHING, self.opened):
                async with self._lock:
                    self._cursor = entry.seq
                    if entry.seq not in self._sent and any(entry.wanted(s) for s in self.subscriptions.values()):
                        await self._send_entry(entry)

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            await asyncio.gather(self._pump, return_exceptions=True)


_EVERYTHING = ProtocolFilter(CHANNELS)


def websocket_routes() -> list[WebSocketRoute]:
    return [WebSocketRoute("/threads/{thread_id}/stream/events", thread_socket)]


ENDPOINTS = [
    Endpoint("POST", "/threads/{thread_id}/commands", thread_command,
             "A v2 protocol command on the thread: run.start (starts or resumes a run; the thread is made if new), "
             "input.respond (answers interrupts by id), agent.getTree", ProtocolCommand,
             responses={200: "{type: success, id, result, meta} or {type: error, id, error, message}",
                        422: "Not a command"}),
    Endpoint("POST", "/threads/{thread_id}/stream/events", thread_events,
             "The thread's v2 protocol events, filtered by channel and namespace (the same path is a WebSocket "
             "taking commands, subscription.* included)", EventStreamRequest,
             responses={200: "Server-sent events: event <method>, data <protocol event>, id <seq>",
                        404: "Thread not found", 422: "Invalid filter"}, media_type="text/event-stream"),
]
