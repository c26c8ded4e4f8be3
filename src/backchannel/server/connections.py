"""Connections: time limits for clients that stall, so none can hold the server's sockets or memory.

uvicorn waits as long as it takes for a request's headers, and keeps writing
into a connection's buffer while its client reads nothing. Each such client
holds a descriptor (1,000 of them and no other client gets in) or, for a
stream, the run's events it has not read. The protocol made by
:func:`limited_protocol` gives each request ``client_timeout`` seconds from
its first byte (or the connection's opening) to its last header, whatever it
trickles in meanwhile, and aborts a connection whose client leaves the
server's writes unread that long. :func:`server_config` builds uvicorn's
configuration with it, for ``serve`` and the tests alike.

The protocol also leaves in each request's scope (:data:`BODY_WRITER`) a :class:`BodyWriter` writing a
chunk of the response's body straight to the connection, as uvicorn's ``send`` would (its
chunked framing, the same bytes), for a streamed response's many small chunks: a token's
chunk then costs one call, not an ASGI message and a coroutine. It writes only what ``send``
would write at once; whenever ``send`` would wait (the client does not keep up) or do more,
it declines and the caller sends as usual.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["BODY_WRITER", "DEFAULT_CLIENT_TIMEOUT", "BodyWriter", "limited_protocol", "server_config"]

DEFAULT_CLIENT_TIMEOUT = 10.0
BODY_WRITER = "backchannel.body_writer"  # the scope key of the request's BodyWriter
logger = logging.getLogger("backchannel.server")
_LATE = b"the request's headers took too long to come"
_TIMED_OUT = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
              b"connection: close\r\n\r\n%b" % (len(_LATE), _LATE))


class _LimitedProtocol(HttpToolsProtocol):
    """uvicorn's HTTP protocol with a deadline for each request's headers and for unread writes."""

    client_timeout = DEFAULT_CLIENT_TIMEOUT

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._headers_due: asyncio.TimerHandle | None = None
        self._reads_due: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._expect_headers()  # a client that connects and says nothing is timed too

    def data_received(self, data: bytes) -> None:
        if self.cycle is None or self.cycle.response_complete:  # the first bytes of a (next) request
            self._expect_headers()
        super().data_received(data)

    def on_headers_complete(self) -> None:
        _cancel(self._headers_due)
        self._headers_due = None
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # (not an upgrade: a websocket's is another protocol)
            cast("dict[str, Any]", self.scope)[BODY_WRITER] = BodyWriter(cycle)  # (an ASGI scope has room for more)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._reads_due is None:
            self._reads_due = self.loop.call_later(self.client_timeout, self._unread)

    def resume_writing(self) -> None:
        super().resume_writing()
        _cancel(self._reads_due)
        self._reads_due = None

    def connection_lost(self, exc: Exception | None) -> None:
        _cancel(self._headers_due)
        _cancel(self._reads_due)
        super().connection_lost(exc)

    def _expect_headers(self) -> None:
        if self._headers_due is None:  # one deadline per request: trickling bytes does not extend it
            self._headers_due = self.loop.call_later(self.client_timeout, self._headers_late)

    def _headers_late(self) -> None:
        if not self.transport.is_closing():
            self.transport.write(_TIMED_OUT)
            self.transport.close()

    def _unread(self) -> None:
        # Nothing more can reach a client that reads nothing: drop the connection, with what it holds.
        logger.warning("%s:%s left the server's writes unread for %s s: disconnected",
                       *(self.client or ("?", "?")), self.client_timeout)
        self.transport.abort()


class BodyWriter:
    """Writes chunks of a request's response body straight to its connection, as uvicorn's ``send`` (``send``)
    would write them."""

    __slots__ = ("cycle", "send")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self.cycle = cycle
        self.send = cycle.send  # what it stands for: a caller given another send (a wrapper) must not use it

    def write(self, body: bytes) -> bool:
        """Write ``body`` as a chunk of the body (more to come); ``False``, writing nothing, whenever ``send`` would
        not simply write it (the client does not keep up, the response has not started or has ended, or is not
        chunked: a HEAD's). A method, not ``__call__``: a bound method is called three times faster."""
        cycle = self.cycle
        if (cycle.flow.write_paused or cycle.disconnected or not cycle.response_started or cycle.response_complete
                or not cycle.chunked_encoding or not body):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(body), body))  # uvicorn's chunk, the same bytes
        return True


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def limited_protocol(client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol giving stalled clients ``client_timeout`` seconds."""
    return type("LimitedHttpProtocol", (_LimitedProtocol,), {"client_timeout": client_timeout})


def server_config(app: Any, *, client_timeout: float = DEFAULT_CLIENT_TIMEOUT, **options: Any) -> uvicorn.Config:
    """uvicorn's configuration for ``app`` with the limits above (``options`` as ``uvicorn.Config`` takes them)."""
    return uvicorn.Config(app, http=limited_protocol(client_timeout), **options)
