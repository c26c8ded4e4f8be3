"""The load generator of ``streams.py``: N connections, each streaming one run after another, in one process.

Run by ``streams.py`` as its own process (``python _stream_client.py SPEC``, the spec a JSON document), so
its CPU is its own and is reported. It speaks HTTP/1.1 on raw sockets (asyncio protocols, on uvloop when
installed) and never decodes an event: it finds the model's timestamps in the bytes as they arrive
(``"content":"@<monotonic ns> "``, the scripted model's tokens), counts them, and spots the end of a
response (the chunked encoding's last chunk) and ``event: error`` frames. Each connection starts its first
run at its own moment of the first run's length (so run starts are spread evenly), and a new run on the
same keep-alive connection when one ends, until ``seconds`` have passed.

It prints one JSON document: token latencies (model yields → bytes read here) of the tokens the model
yielded inside the measurement window (from ``window[0]`` to ``window[1]`` seconds after its start),
percentiles in ms, how many tokens and runs, the failures by kind, and its own CPU seconds in the window.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
import uuid
from typing import Any

MARKER = b'"content":"@'
ERROR = b"event: error"
LAST_CHUNK = b"\r\n0\r\n\r\n"


class Totals:
    def __init__(self, window_ns: tuple[int, int]) -> None:
        self.window_ns = window_ns
        self.latencies_us: list[int] = []
        self.tokens = 0  # every token read
        self.runs = 0  # runs streamed to their end
        self.failures: dict[str, int] = {}

    def fail(self, kind: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1


class StreamConnection(asyncio.Protocol):
    """One client: streams a run, then the next, until ``stop_at`` (monotonic ns)."""

    def __init__(self, spec: dict[str, Any], totals: Totals, stop_at: int, done: asyncio.Future[None]) -> None:
        self.spec = spec
        self.totals = totals
        self.stop_at = stop_at
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.expected = spec["tokens"]
        self.closing = False
        self._reset()

    def _reset(self) -> None:
        self.head = True  # reading the status line and headers
        self.pending = b""
        self.tokens = 0
        self.failed = False
        self.started = time.monotonic_ns()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._request()

    def _request(self) -> None:
        self._reset()
        path = self.spec["path"].replace("{thread_id}", str(uuid.uuid4()))
        body = self.spec["body"].encode()
        assert self.transport is not None
        self.transport.write(b"POST %b HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n"
                             b"accept: text/event-stream\r\ncontent-length: %d\r\n\r\n%b"
                             % (path.encode(), self.spec["host"].encode(), len(body), body))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        data = self.pending + data if self.pending else data
        if self.head:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.pending = data
                return
            if not data.startswith(b"HTTP/1.1 200"):
                self.totals.fail("status " + data[9:12].decode(errors="replace"))
                self._close()
                return
            self.head = False
            data = data[end + 2:]  # keep "\r\n": the last chunk is found as "\r\n0\r\n\r\n"
        totals = self.totals
        low, high = totals.window_ns
        kept = max(0, len(data) - len(MARKER))  # a marker, or the last chunk, may go on in the next read
        found = data.find(MARKER)
        while found >= 0:
            digits = found + len(MARKER)
            space = data.find(b" ", digits, digits + 24)
            if space < 0:  # its digits go on in the next read
                kept = found
                break
            yielded = int(data[digits:space])
            self.tokens += 1
            if low <= yielded < high:
                totals.latencies_us.append((now - yielded) // 1000)
            kept = max(kept, space)
            found = data.find(MARKER, space)
        if ERROR in data:
            self.failed = True
        if data.endswith(LAST_CHUNK):
            self._run_ended()
        else:
            self.pending = data[kept:]

    def _run_ended(self) -> None:
        totals = self.totals
        totals.tokens += self.tokens
        if self.failed:
            totals.fail("error event")
        elif self.tokens != self.expected:
            totals.fail(f"{self.tokens} tokens, not {self.expected}")
        else:
            totals.runs += 1
        self._reset()
        if time.monotonic_ns() < self.stop_at:
            self._request()
        else:
            self._close()

    def _close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closing:  # cut off by the server
            self.totals.fail("connection lost mid-stream")
        if not self.done.done():
            self.done.set_result(None)


async def client(spec: dict[str, Any], totals: Totals, started: int, offset: float) -> None:
    loop = asyncio.get_running_loop()
    await asyncio.sleep(offset)
    done: asyncio.Future[None] = loop.create_future()
    stop_at = started + int(spec["seconds"] * 1e9)
    try:
        await loop.create_connection(lambda: StreamConnection(spec, totals, stop_at, done), spec["address"],
                                     spec["port"])
    except OSError as exc:
        totals.fail(f"connect: {type(exc).__name__}")
        return
    try:
        await asyncio.wait_for(done, spec["seconds"] + spec["run_seconds"] * 10)
    except TimeoutError:
        totals.fail("stream unfinished")


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def main(spec: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic_ns()
    window = (started + int(spec["window"][0] * 1e9), started + int(spec["window"][1] * 1e9))
    totals = Totals(window)
    print(json.dumps({"started_ns": started}), flush=True)  # the parent times the window from here
    n = spec["clients"]
    cpu: dict[str, float] = {}

    async def mark(name: str, at: int) -> None:
        await asyncio.sleep(max(0.0, (at - time.monotonic_ns()) / 1e9))
        cpu[name] = cpu_seconds()

    marks = [asyncio.ensure_future(mark("start", window[0])), asyncio.ensure_future(mark("end", window[1]))]
    await asyncio.gather(*(client(spec, totals, started, spec["run_seconds"] * i / n) for i in range(n)))
    await asyncio.gather(*marks)
    latencies = sorted(totals.latencies_us)

    def pct(p: float) -> float | None:
        return latencies[min(len(latencies) - 1, int(len(latencies) * p / 100))] / 1000 if latencies else None

    return {"p50_ms": pct(50), "p99_ms": pct(99), "max_ms": latencies[-1] / 1000 if latencies else None,
            "window_tokens": len(latencies), "tokens": totals.tokens, "runs": totals.runs,
            "failures": totals.failures, "cpu_seconds": cpu["end"] - cpu["start"]}


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
