"""Long responses: server-sent events, and JSON bodies that take a while, both with heartbeats.

The SSE framing is LangGraph's: ``event: <mode>[|<namespace>]``, ``data:
<json>``, an ``id:`` for resumable runs, ``\\r\\n`` line ends. While nothing
happens a heartbeat keeps proxies from closing the connection: an SSE
comment, or for a JSON body a newline (leading whitespace is valid JSON).
The response watches for the client going away, so a stream created with
``on_disconnect="cancel"`` cancels its run at once, not at the next write.

A stream's reader that leaves a write unread for ``patience`` seconds is too
slow to follow it: the stream stops (letting go of the run's events the
reader has not had), ends with an ``error`` event saying why, and the
connection is dropped if that is not read either
(:mod:`backchannel.server.connections`).

A response's body goes to the server's own ``send`` when the app put it in the
scope (:data:`BODY_SEND`: it does while its middleware is its own, which acts on
a response's start, CORS headers and errors before it, and passes each body
message on unchanged); else through the middleware, as any response's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from backchannel.runtime.modes import StreamPart
from backchannel.server.routing import render_json

__all__ = ["BODY_SEND", "SSE_HEARTBEAT", "OpenStreams", "StreamingBody", "encode_event", "event_stream", "json_body"]

SSE_HEARTBEAT = b": heartbeat\r\n\r\n"
JSON_HEARTBEAT = b"\n"
BODY_SEND = "backchannel.body_send"  # the scope key of the send the app was called with
logger = logging.getLogger("backchannel.server")


def encode_event(part: StreamPart, *, with_id: bool) -> bytes:
    """One stream part as an SSE event."""
    event = _event_name(part.event)
    data = render_json(part.data)
    if with_id and part.id is not None:
        return b"event: %b\r\ndata: %b\r\nid: %b\r\n\r\n" % (event, data, part.id.encode())
    return b"event: %b\r\ndata: %b\r\n\r\n" % (event, data)


@functools.lru_cache(maxsize=1024)
def _event_name(name: str) -> bytes:
    # A stream has a few names (modes, namespaced ones), each sent many times.
    return name.replace("\r", "").replace("\n", "").encode()


def event_stream(request: Request, chunks: AsyncIterator[bytes], *, headers: Mapping[str, str] | None = None,
                 on_disconnect: Callable[[], Awaitable[None]] | None = None) -> StreamingBody:
    """Server-sent events, with the app's heartbeat, and half its client timeout as a reader's patience."""
    return StreamingBody(chunks, media_type="text/event-stream", heartbeat=request.app.state.heartbeat,
                         patience=request.app.state.client_timeout / 2, headers=headers, on_disconnect=on_disconnect,
                         counter=request.app.state.open_streams)


def json_body(request: Request, chunks: AsyncIterator[bytes], *, headers: Mapping[str, str] | None = None,
              on_disconnect: Callable[[], Awaitable[None]] | None = None) -> StreamingBody:
    """A JSON document that takes a while (a run's output), with the app's heartbeat."""
    return StreamingBody(chunks, media_type="application/json", heartbeat=request.app.state.heartbeat,
                         headers=headers, on_disconnect=on_disconnect)


class OpenStreams:
    """How many event streams are open now (for ``/metrics``)."""

    def __init__(self) -> None:
        self.count = 0


class StreamingBody:
    """An ASGI response sending ``chunks`` as they come, with heartbeats while they don't.

    ``on_disconnect`` runs if the client goes away before the last chunk. With ``patience``, a chunk
    the client leaves unread that long ends the response early, with an ``error`` event saying why.
    """

    def __init__(self, chunks: AsyncIterator[bytes], *, media_type: str, heartbeat: float,
                 patience: float | None = None, headers: Mapping[str, str] | None = None,
                 on_disconnect: Callable[[], Awaitable[None]] | None = None,
                 counter: OpenStreams | None = None) -> None:
        self.chunks = chunks
        self.counter = counter
        self.heartbeat = JSON_HEARTBEAT if media_type == "application/json" else SSE_HEARTBEAT
        self.interval = heartbeat
        self.patience = patience
        self.on_disconnect = on_disconnect
        self._since = 0.0  # loop time the last chunk or heartbeat was sent (or began to be)
        self._sending = False  # a chunk is being sent (the client may not be reading)
        self._stalled = False  # the client left a chunk unread too long: the sender was stopped
        raw = {"content-type": media_type, "cache-control": "no-store", **(headers or {})}
        if media_type == "text/event-stream":
            raw["x-accel-buffering"] = "no"  # nginx would otherwise hold events back
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in raw.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.counter is not None:
            self.counter.count += 1
        try:
            await self._respond(receive, send, scope.get(BODY_SEND, send))
        finally:
            if self.counter is not None:
                self.counter.count -= 1

    async def _respond(self, receive: Receive, send: Send, send_body: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        sending = asyncio.ensure_future(self._send_all(send_body))
        watching = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({sending, watching}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server is stopping: the run carries on or resumes later
            await _cancel(sending, watching)
            raise
        if not sending.done():  # the client went away
            await _cancel(sending, watching)
            if self.on_disconnect is not None:
                await self.on_disconnect()
            return
        await _cancel(watching)
        exc = sending.exception()
        if exc is not None and not isinstance(exc, OSError):
            raise exc

    async def _send_all(self, send: Send) -> None:
        chunks = self.chunks
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        # One watchdog for the whole response (heartbeats, a reader too slow): a timer per chunk would
        # cost more than the chunk.
        sender = asyncio.current_task()
        watchdog = asyncio.ensure_future(self._watch(send, sender))
        last = b""
        try:
            async for chunk in chunks:
                self._since = loop.time()
                self._sending = True
                try:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except asyncio.CancelledError:
                    if not self._stalled or sender is None:
                        raise
                    sender.uncancel()  # the watchdog's cancel, handled here
                    last = self._too_slow()
                    break
                self._sending = False
        finally:
            await _cancel(watchdog)  # before the last message: nothing may follow it
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        await send({"type": "http.response.body", "body": last, "more_body": False})

    def _too_slow(self) -> bytes:
        logger.warning("a stream's reader left its writes unread for %s s: stream ended", self.patience)
        return encode_event(StreamPart("error", {"error": "SlowReader", "message": (
            f"this client read nothing for {self.patience} s, so the stream was ended and what the client had "
            "not read was let go; join the run's stream again (with Last-Event-ID, for a resumable run) "
            "to go on")}), with_id=False)

    async def _watch(self, send: Send, sender: asyncio.Task[Any] | None) -> None:
        """Send a heartbeat whenever ``interval`` seconds pass without a chunk; stop ``sender`` when the
        client leaves a chunk unread for ``patience`` seconds."""
        loop = asyncio.get_running_loop()
        patience = self.patience
        check = self.interval if patience is None else min(self.interval, patience)
        while True:
            now = loop.time()
            if self._sending:
                if patience is None or sender is None:
                    await asyncio.sleep(self.interval)
                elif now - self._since >= patience:
                    self._stalled = True
                    sender.cancel()
                    return
                else:
                    await asyncio.sleep(self._since + patience - now)
            elif now - self._since >= self.interval:
                await send({"type": "http.response.body", "body": self.heartbeat, "more_body": True})
                self._since = loop.time()
            else:
                # the next heartbeat, or soon enough to catch a chunk that starts being sent meanwhile
                await asyncio.sleep(min(self._since + self.interval - now, check))


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
