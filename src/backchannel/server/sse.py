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

A run's stream is pushed (:class:`PushedChunks`): each chunk is sent in the call that
wrote it (the model's, as it publishes a token) while the connection takes it, the
rest of a burst at the end of the event loop's turn; a send that has to wait goes on
in a task, and the run's stream keeps what comes meanwhile.

A response's body goes to the server's own ``send`` when the app put it in the
scope (:data:`BODY_SEND`: it does while its middleware is its own, which acts on
a response's start, CORS headers and errors before it, and passes each body
message on unchanged); else through the middleware, as any response's. A pushed
chunk goes straight to the connection when the server's protocol offers that
(:data:`~backchannel.server.connections.BODY_WRITER`) for that same ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from backchannel.errors import BackchannelError
from backchannel.runtime.modes import StreamPart
from backchannel.runtime.streams import Batches
from backchannel.server.connections import BODY_WRITER
from backchannel.server.routing import render_json

__all__ = ["BODY_SEND", "SSE_HEARTBEAT", "OpenStreams", "PushedChunks", "StreamingBody", "Write", "encode_event",
           "event_stream", "json_body", "push_parts"]

SSE_HEARTBEAT = b": heartbeat\r\n\r\n"
JSON_HEARTBEAT = b"\n"
BODY_SEND = "backchannel.body_send"  # the scope key of the send the app was called with
logger = logging.getLogger("backchannel.server")
T = TypeVar("T")
Write = Callable[[bytes], "asyncio.Future[Any] | None"]  # see PushedChunks.write


def encode_event(part: StreamPart, *, with_id: bool) -> bytes:
    """One stream part as an SSE event."""
    event = _event_name(part.event)
    data = render_json(part.data)
    if with_id and part.id is not None:
        return b"event: %b\r\ndata: %b\r\nid: %b\r\n\r\n" % (event, data, part.id.encode())
    return b"event: %b\r\ndata: %b\r\n\r\n" % (event, data)


async def push_parts(parts: Batches[StreamPart], write: Write, *, with_id: bool,
                     created: asyncio.Future[str] | None = None) -> None:
    """A stream's parts (a run's, a thread's) as SSE, written as they come, one chunk per batch of them (a run's
    first is ``[metadata]``, whose run id is ``created``'s result); a failure of the stream itself (once created)
    ends it with an ``error`` event."""
    def take(batch: list[StreamPart]) -> asyncio.Future[Any] | None:
        if created is not None and not created.done():
            created.set_result(batch[0].data["run_id"])
        if len(batch) == 1:  # (a token)
            return write(encode_event(batch[0], with_id=with_id))
        return write(b"".join([encode_event(part, with_id=with_id) for part in batch]))

    try:
        await parts.push(take, wire=True)
    except Exception as exc:
        if created is not None and not created.done():
            raise  # the run was not created: the request's error
        if isinstance(exc, BackchannelError):
            write(encode_event(StreamPart("error", {"error": type(exc).__name__, "message": str(exc)}), with_id=False))
        else:
            logger.exception("a stream failed")
            write(encode_event(StreamPart("error", {"error": "InternalServerError",
                                                    "message": "the stream failed; see the server log"}),
                               with_id=False))


@functools.lru_cache(maxsize=1024)
def _event_name(name: str) -> bytes:
    # A stream has a few names (modes, namespaced ones), each sent many times.
    return name.replace("\r", "").replace("\n", "").encode()


def event_stream(request: Request, chunks: AsyncIterator[bytes] | PushedChunks, *,
                 headers: Mapping[str, str] | None = None,
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


class PushedChunks:
    """A response's chunks written by their producer as they come, rather than pulled by the response.

    ``produce(write)`` runs in a task of its own and calls ``write`` with each chunk, in its own call (for a run's
    stream: the model's, as it publishes a token), so no reader task wakes per chunk. The response sends a chunk
    at once while the connection takes it, and queues the next ones behind a send that has to wait; chunks
    written before the response starts wait for it.
    """

    def __init__(self, produce: Callable[[Write], Awaitable[None]]) -> None:
        self._pending: list[bytes] = []
        self._send: Write | None = None
        self.task = asyncio.ensure_future(produce(self.write))

    def write(self, chunk: bytes) -> asyncio.Future[Any] | None:
        """Send ``chunk`` (in order after the others); never blocks. Returns ``None``, or when the client does not
        keep up, a future done once what it was given is sent: write more only then, or it queues up."""
        if self._send is None:
            self._pending.append(chunk)
            return None
        return self._send(chunk)

    def attach(self, send: Write) -> None:
        """From now on each chunk goes to ``send`` (the response has started); what came before goes first."""
        self._send = send
        if self._pending:
            chunk = b"".join(self._pending)
            self._pending = []
            send(chunk)

    async def until(self, started: asyncio.Future[T]) -> T:
        """``started``'s result, once the producer gave it; or what the producer failed with before."""
        await asyncio.wait((started, self.task), return_when=asyncio.FIRST_COMPLETED)
        if not started.done():
            self.task.result()  # raises what it failed with
            raise RuntimeError("the stream ended before it started")
        return started.result()


class OpenStreams:
    """How many event streams are open now (for ``/metrics``)."""

    def __init__(self) -> None:
        self.count = 0


class StreamingBody:
    """An ASGI response sending ``chunks`` as they come, with heartbeats while they don't.

    ``on_disconnect`` runs if the client goes away before the last chunk. With ``patience``, a chunk
    the client leaves unread that long ends the response early, with an ``error`` event saying why.
    """

    def __init__(self, chunks: AsyncIterator[bytes] | PushedChunks, *, media_type: str, heartbeat: float,
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
        # Pushed chunks: the body's send, the task finishing a send that had to wait, and what queued behind it
        self._send_body: Send | None = None
        self._write: Callable[[bytes], bool] | None = None  # the connection's, when the body's send is the server's
        self._writer: asyncio.Task[None] | None = None
        self._queued: list[bytes] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None  # the request's: pushed chunks are sent in it
        self._corked: list[bytes] = []  # chunks pushed after the first in this turn of the event loop: sent at its end
        self._turns: _Turns | None = None  # the event loop's
        self._turn = -1  # the turn of the last chunk sent at once
        raw = {"content-type": media_type, "cache-control": "no-store", **(headers or {})}
        if media_type == "text/event-stream":
            raw["x-accel-buffering"] = "no"  # nginx would otherwise hold events back
        self.raw_headers = [(k.lower().encode(), v.encode()) for k, v in raw.items()]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.counter is not None:
            self.counter.count += 1
        try:
            send_body = scope.get(BODY_SEND, send)
            writer = scope.get(BODY_WRITER)
            if writer is not None and writer.send == send_body:
                self._write = writer.write
            await self._respond(receive, send, send_body)
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
        watching.cancel()  # it waits for a message that will not come: stopped, not waited for (it sends nothing)
        exc = sending.exception()
        if exc is not None and not isinstance(exc, OSError):
            raise exc

    async def _send_all(self, send: Send) -> None:
        chunks = self.chunks
        if isinstance(chunks, PushedChunks):
            return await self._send_pushed(send, chunks)
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        # One watchdog for the whole response (heartbeats, a reader too slow): a timer per chunk would
        # cost more than the chunk.
        sender = asyncio.current_task()
        watchdog = self._watchdog(loop, send, sender)
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
            await watchdog.stop()  # before the last message: nothing may follow it
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        await send({"type": "http.response.body", "body": last, "more_body": False})

    async def _send_pushed(self, send: Send, chunks: PushedChunks) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._since = loop.time()
        self._send_body = send
        self._context = contextvars.copy_context()  # not the publisher's (middleware in the send's path may care)
        self._turns = _turns_of(loop)
        sender = asyncio.current_task()
        watchdog = self._watchdog(loop, self._beat, sender)
        last = b""
        try:
            chunks.attach(self._push)
            try:
                await chunks.task  # until the producer has written its last chunk (cancelling us cancels it)
                self._send_corked()
                if self._writer is not None:
                    await self._writer  # what queued behind a send that had to wait
            except asyncio.CancelledError:
                if not self._stalled or sender is None:
                    raise
                sender.uncancel()  # the watchdog's cancel, handled here
                last = self._too_slow()
        finally:
            await watchdog.stop()
            await _cancel(chunks.task, *([self._writer] if self._writer is not None else []))
            self._queued = []
            self._corked.clear()
        await send({"type": "http.response.body", "body": last, "more_body": False})

    def _push(self, chunk: bytes) -> asyncio.Future[None] | None:
        """Send ``chunk``: at once if it is the connection's first in this turn of the event loop, else at the
        turn's end with the others pushed in it (a burst: a model's network read, a step's end, in one write);
        queued behind a send that has to wait, whose task is returned then (see :meth:`PushedChunks.write`)."""
        writer = self._writer
        if writer is not None:  # a send is waiting for the client to read: in order, after it
            if not writer.done():  # (done: the send failed, the connection is gone)
                self._queued.append(chunk)
            return writer
        corked = self._corked
        if corked:  # to be sent at this turn's end
            corked.append(chunk)
            return None
        assert self._turns is not None and self._context is not None and self._loop is not None
        turns = self._turns
        turn = turns.count if turns.asked else turns.now()  # (asked: counted from the turn's end, no call)
        if turn != self._turn:
            self._turn = turn
            return self._send_now(chunk)
        corked.append(chunk)
        self._loop.call_soon(self._send_corked)
        return None

    def _send_corked(self) -> None:
        corked = self._corked
        if corked:
            chunk = corked[0] if len(corked) == 1 else b"".join(corked)
            corked.clear()
            self._send_now(chunk)

    def _send_now(self, chunk: bytes) -> asyncio.Future[None] | None:
        """Send ``chunk`` at once while the connection takes it, else in a task (returned)."""
        assert self._loop is not None and self._context is not None
        if self._writer is not None:  # (the response's end, while a send waits)
            self._queued.append(chunk)
            return self._writer
        self._since = self._loop.time()
        if self._write is not None and self._write(chunk):  # straight to the connection
            return None
        return self._context.run(self._step_send, chunk)  # in the request's context, not the publisher's

    def _step_send(self, chunk: bytes) -> asyncio.Future[None] | None:
        assert self._send_body is not None and self._loop is not None
        step = self._send_body({"type": "http.response.body", "body": chunk, "more_body": True}).__await__()
        # A send the connection takes at once ends in its first step. Stepped by a loop, not send(None): its end
        # raises no StopIteration (a quarter of a microsecond a chunk).
        for blocked in step:  # it has to wait for ``blocked``: a task goes on with it
            self._sending = True
            self._writer = self._loop.create_task(self._finish(step, blocked), context=self._context)
            return self._writer
        return None

    async def _finish(self, step: Any, blocked: Any) -> None:
        """Finish the send that had to wait, then send what queued behind it (each time all of it as one chunk).

        If a send fails, the writer stays (done), so later chunks are dropped, and the response ends with its error.
        """
        assert self._send_body is not None and self._loop is not None
        await _resume(step, blocked)
        while self._queued:
            chunk = b"".join(self._queued)
            self._queued = []
            self._since = self._loop.time()
            await self._send_body({"type": "http.response.body", "body": chunk, "more_body": True})
        self._writer = None
        self._sending = False

    async def _beat(self, message: Message) -> None:
        self._push(message["body"])  # a heartbeat goes in order with the pushed chunks

    def _too_slow(self) -> bytes:
        logger.warning("a stream's reader left its writes unread for %s s: stream ended", self.patience)
        return encode_event(StreamPart("error", {"error": "SlowReader", "message": (
            f"this client read nothing for {self.patience} s, so the stream was ended and what the client had "
            "not read was let go; join the run's stream again (with Last-Event-ID, for a resumable run) "
            "to go on")}), with_id=False)

    def _watchdog(self, loop: asyncio.AbstractEventLoop, send: Send, sender: asyncio.Task[Any] | None) -> _Watchdog:
        """The response's watchdog (:meth:`_watch`), its task started when its first look is due: a response that
        ends sooner (a short run's wait) has none."""
        first = self.interval if self.patience is None else min(self.interval, self.patience)
        return _Watchdog(loop, first, functools.partial(self._watch, send, sender))

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


class _Turns:
    """Counts an event loop's turns, lazily: a callback at the end of each turn in which somebody asked."""

    __slots__ = ("loop", "count", "asked")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0  # the current turn's number, while ``asked``
        self.asked = False

    def now(self) -> int:
        """The current turn's number."""
        if not self.asked:
            self.asked = True
            self.loop.call_soon(self._next)
        return self.count

    def _next(self) -> None:
        self.count += 1
        self.asked = False


_TURNS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Turns] = weakref.WeakKeyDictionary()


def _turns_of(loop: asyncio.AbstractEventLoop) -> _Turns:
    turns = _TURNS.get(loop)
    if turns is None:
        turns = _TURNS[loop] = _Turns(loop)
    return turns


async def _resume(step: Any, blocked: Any) -> None:
    """Go on with an awaitable's ``step`` (its ``__await__``) that was started outside any task and yielded
    ``blocked`` (the future it waits for, or ``None`` to let others run), until it ends; as a task would."""
    while True:
        try:
            if blocked is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait((blocked,))
        except asyncio.CancelledError as exc:
            try:
                blocked = step.throw(exc)  # it handles its own cancellation (cleans up, re-raises)
            except StopIteration:
                return
            continue
        try:
            blocked = step.send(None)
        except StopIteration:
            return


class _Watchdog:
    """A response's watchdog task, started once ``delay`` seconds have passed (its first look would wait that long)."""

    __slots__ = ("_start", "_timer", "_task")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, start: Callable[[], Awaitable[None]]) -> None:
        self._start = start
        self._task: asyncio.Future[None] | None = None
        self._timer = loop.call_later(delay, self._begin)

    def _begin(self) -> None:
        self._task = asyncio.ensure_future(self._start())

    async def stop(self) -> None:
        """Stop it, and wait for its task to end if it started."""
        self._timer.cancel()
        if self._task is not None:
            await _cancel(self._task)


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
