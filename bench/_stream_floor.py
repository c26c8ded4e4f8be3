"""The floor of ``streams.py``: what one streamed token costs a Python server with no framework at all.

A bare asyncio protocol (on uvloop when installed) that answers ``streams.py``'s requests as the servers do,
on the wire: ``POST .../runs/stream`` gets ``200``, chunked ``text/event-stream``, a ``metadata`` event, then
``TOKENS`` ``messages`` events (the same bytes as backchannel's, the model's ``@<monotonic ns>`` inside), one
every ``INTERVAL`` seconds, each on a timer of its own and written the moment it is due, then the last chunk;
``GET /ok`` answers ``200``. No run, no thread, no storage, no event objects: a timer, one pre-rendered frame
(the token's text formatted in) and one ``write`` per token. Its CPU per token is the least a server in
Python on this event loop can spend delivering a token to its own connection.

    python bench/_stream_floor.py PORT TOKENS INTERVAL
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-store\r\n"
        b"x-accel-buffering: no\r\ntransfer-encoding: chunked\r\n\r\n")
OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}"
METADATA = b'event: metadata\r\ndata: {"run_id":"%b","attempt":1}\r\n\r\n'
TOKEN = (b'event: messages\r\ndata: [{"content":"@%d ","additional_kwargs":{},"response_metadata":{},'
         b'"type":"AIMessageChunk","name":"tokens","id":"%b","tool_calls":[],"invalid_tool_calls":[],'
         b'"usage_metadata":null,"tool_call_chunks":[],"chunk_position":null},{"graph_id":"tokens",'
         b'"run_id":"%b","thread_id":"%b","lc_agent_name":"tokens","langgraph_node":"model",'
         b'"langgraph_checkpoint_ns":""}]\r\n\r\n')
LAST = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


class FloorProtocol(asyncio.Protocol):
    def __init__(self, tokens: int, interval: float) -> None:
        self.tokens = tokens
        self.interval = interval
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].lower()
        length = 0
        for line in head.split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        if len(self.buffer) < end + 4 + length:
            return
        self.buffer = self.buffer[end + 4 + length:]
        assert self.transport is not None
        if head.startswith(b"get /ok"):
            self.transport.write(OK)
            return
        run_id = str(uuid.uuid4()).encode()
        self.transport.write(HEAD + chunk(METADATA % run_id))
        loop = asyncio.get_running_loop()
        ids = (str(uuid.uuid4()).encode(), run_id, str(uuid.uuid4()).encode())
        loop.call_at(loop.time() + self.interval, self._token, loop, loop.time() + self.interval, 0, ids)

    def _token(self, loop: asyncio.AbstractEventLoop, due: float, sent: int, ids: tuple[bytes, ...]) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        self.transport.write(chunk(TOKEN % (time.monotonic_ns(), *ids)))
        if sent + 1 == self.tokens:
            self.transport.write(LAST)
            return
        loop.call_at(due + self.interval, self._token, loop, due + self.interval, sent + 1, ids)


async def main(port: int, tokens: int, interval: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FloorProtocol(tokens, interval), "127.0.0.1", port, backlog=4096)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))
