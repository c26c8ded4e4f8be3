"""Slow clients cannot hold the server: half-sent requests time out, a reader that reads nothing is disconnected,
one that falls too far behind is told so, and memory stays flat (a real ``backchannel serve`` process)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_agents import AGENTS
from server_helpers import ProcessServer, ThreadServer, user

from backchannel import ScriptedModel, ToolMessage, create_agent, tool
from backchannel.models.base import ChatModel, FinishDelta, TextDelta
from backchannel.runtime import LocalRuntime
from backchannel.server import create_app

TIMEOUT = 1.0  # the server's --client-timeout in these tests
STREAM = {"assistant_id": "chatty", "input": user("go"), "stream_mode": ["values", "messages-tuple", "updates"]}


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[ProcessServer]:
    db = tmp_path_factory.mktemp("slow") / "state.db"
    with ProcessServer(["chatty=server_agents:chatty", "echo=server_agents:echo"], f"sqlite:///{db}",
                       extra=["--client-timeout", str(TIMEOUT)]) as server:
        yield server


def descriptors(server: ProcessServer) -> int:
    return len(os.listdir(f"/proc/{server.process.pid}/fd"))


def resident_mib(server: ProcessServer) -> float:
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def connect(server: ProcessServer, *, receive_buffer: int | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    if receive_buffer:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    return sock


def closed_by_server(sock: socket.socket, deadline: float) -> bytes | None:
    """What the server sent before closing the connection; ``None`` if it is still open at ``deadline``."""
    received = b""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return None
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def stream_request(thread_id: str) -> bytes:
    body = json.dumps(STREAM).encode()
    return (b"POST /threads/%b/runs/stream HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%b" % (thread_id.encode(), len(body), body))


def test_half_sent_requests_time_out_while_others_are_served(live):
    before = descriptors(live)
    silent = [connect(live) for _ in range(100)]  # connect and say nothing
    half = [connect(live) for _ in range(100)]
    for sock in half:
        sock.sendall(b"GET /ok HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: ")  # headers never finished
    bodies = [connect(live) for _ in range(20)]
    for sock in bodies:  # headers sent, the body never finished
        sock.sendall(b"POST /threads HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                     b"content-length: 100\r\n\r\n{\"meta")
    trickle = connect(live)
    started, cut = time.monotonic(), None
    for byte in b"GET /ok HTTP/1.1\r\nhost: 127.0.0.1\r\nx-slow: " * 10:  # a byte at a time: the deadline holds
        try:
            trickle.sendall(bytes([byte]))
        except OSError:  # the server closed it
            cut = time.monotonic() - started
            break
        time.sleep(0.1)
    assert cut is not None and cut < TIMEOUT + 3, cut
    # Meanwhile every other client is served at once.
    for _ in range(5):
        began = time.monotonic()
        assert httpx.get(f"{live.url}/ok", timeout=5).status_code == 200
        assert time.monotonic() - began < 1.0
    deadline = time.monotonic() + TIMEOUT + 5
    answers = [closed_by_server(sock, deadline) for sock in (*silent, *half, *bodies)]
    assert all(a is not None for a in answers), f"{sum(a is None for a in answers)} connections still open"
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers[100:200])  # told why
    assert all(b"408" in a and b"request body" in a for a in answers[200:220])
    for sock in (*silent, *half, *bodies, trickle):
        sock.close()
    until(lambda: descriptors(live) <= before + 2, 10, "the server still holds the connections' descriptors")


def test_stream_readers_that_read_nothing_are_disconnected_and_memory_stays_flat(live):
    def thread() -> str:
        return httpx.post(f"{live.url}/threads", json={}, timeout=30).json()["thread_id"]

    def read_all() -> int:
        with httpx.stream("POST", f"{live.url}/threads/{thread()}/runs/stream", json=STREAM, timeout=60) as r:
            return sum(len(chunk) for chunk in r.iter_bytes())

    assert read_all() > 50_000_000  # each stream is large: the state, 600 messages, at every step
    reading = resident_mib(live)
    before = descriptors(live)
    stuck = []
    for _ in range(6):  # readers that never read: each leaves everything the server writes unread
        sock = connect(live, receive_buffer=4096)
        sock.sendall(stream_request(thread()))
        stuck.append(sock)
    # The server disconnects them once their writes stay unread for the client timeout, runs or not.
    until(lambda: descriptors(live) <= before + 1, 60, "the readers that read nothing are still connected")
    for sock in stuck:
        sock.close()
    assert read_all() > 50_000_000  # and serves the next reader in full
    grown = resident_mib(live) - reading
    assert grown < 60, f"the server grew by {grown:.0f} MiB for 6 readers that read nothing"


def test_a_reader_that_stops_reading_is_told_and_can_rejoin(tmp_path):
    """Left unread for half the client timeout, a stream ends with an error event saying so; the reader gets it
    if it reads again before the timeout (which would drop the connection), and can rejoin the run."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"chatty": AGENTS["chatty"]})
    with ThreadServer(create_app(runtime, client_timeout=6), client_timeout=6) as server:
        tid = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
        events, last_id, data = [], None, ""
        with httpx.stream("POST", f"{server.url}/threads/{tid}/runs/stream", timeout=60,
                          json={**STREAM, "stream_resumable": True}) as r:
            for line in r.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])
                elif line.startswith("id: "):
                    last_id = line[4:]
                elif line.startswith("data: "):
                    data = line[6:]
                if len(events) == 20 and "(paused)" not in events:
                    time.sleep(4.5)  # past the patience of 3 s, before the timeout of 6 s
                    events.append("(paused)")
        assert events[-1] == "error" and "(paused)" in events, events[-5:]
        told = json.loads(data)
        assert told["error"] == "SlowReader" and "read nothing for 3.0 s" in told["message"]
        run_id = httpx.get(f"{server.url}/threads/{tid}/runs").json()[0]["run_id"]
        with httpx.stream("GET", f"{server.url}/threads/{tid}/runs/{run_id}/stream", timeout=60,
                          headers={"last-event-id": last_id}) as rest:
            resumed = [line[7:] for line in rest.iter_lines() if line.startswith("event: ")]
        assert resumed and "error" not in resumed and resumed[-1] == "values"  # to the run's end


# -- a reader that falls behind while its stream is pushed (the run's events handed to the connection as they come)

WORDS = [f"w{i}" for i in range(20_000)]
talker = create_agent(ScriptedModel([" ".join(WORDS)], loop=True), name="talker")  # 20,000 tokens at full speed


@tool(inline=True)
def bulk(n: int) -> str:
    """Return 50 KB of text.

    Args:
        n: Which call this is.
    """
    return f"{n}:" + "z" * 50_000


def bulk_reply(request: Any) -> Any:
    calls = sum(isinstance(m, ToolMessage) for m in request.messages)
    return "done" if calls >= 100 else {"tool_calls": [{"name": "bulk", "args": {"n": calls}}]}


# 100 steps of 50 ms, its values growing by 50 KB a step: its stream outgrows any socket's buffers in a second
bulky = create_agent(ScriptedModel([bulk_reply], loop=True, latency=0.05), [bulk], name="bulky", max_iterations=1000)


def raw_stream(url: str, thread_id: str, body: dict[str, Any]) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window from the start
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    sock.sendall(b"POST /threads/%b/runs/stream HTTP/1.1\r\nhost: %b\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%b" % (thread_id.encode(), host.encode(), len(payload), payload))
    return sock


def read_response(sock: socket.socket, timeout: float) -> tuple[bytes, bytes]:
    """The head and the de-chunked body of a chunked response, read to its last chunk."""
    head, chunks = read_chunks(sock, timeout)
    return head, b"".join(chunks)


def read_chunks(sock: socket.socket, timeout: float,
                until: Callable[[bytes], bool] = lambda received: received.endswith(b"\r\n0\r\n\r\n"),
                ) -> tuple[bytes, list[bytes]]:
    """The head and the chunks of a chunked response (each one write of the server's), read to its last (or until
    what was received so far is ``until``)."""
    sock.settimeout(timeout)
    received = bytearray()
    while not until(bytes(received)):
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed the connection before the response's end"
        received += chunk
    head, _, rest = bytes(received).partition(b"\r\n\r\n")
    chunks = []
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(rest[:size])
        rest = rest[size + 2:]
    return head, chunks


def run_status(url: str, thread_id: str) -> str:
    return httpx.get(f"{url}/threads/{thread_id}/runs", timeout=30).json()[0]["status"]


def stream_unread_to_its_end(url: str, assistant: str) -> socket.socket:
    """A run of ``assistant`` streamed (messages-tuple) on a new thread to a client that reads nothing until the run
    has ended: the socket, its response unread."""
    tid = httpx.post(f"{url}/threads", json={}).json()["thread_id"]
    sock = raw_stream(url, tid, {"assistant_id": assistant, "input": user("go"), "stream_mode": ["messages-tuple"]})
    try:
        until(lambda: httpx.get(f"{url}/threads/{tid}/runs").json() != [], 10, "the run was not made")
        until(lambda: run_status(url, tid) == "success", 60, "the run waited for its reader")
    except BaseException:
        sock.close()
        raise
    return sock


def test_a_reader_that_falls_behind_gets_every_token_in_order_and_holds_up_neither_run_nor_others(tmp_path):
    """A reader that reads nothing for a while (less than its patience): its run goes on to its end meanwhile,
    another client's stream is served at once, and when it reads on it gets every token, each once, in order."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"talker": talker, "echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, client_timeout=60), client_timeout=60) as server:
        sock = stream_unread_to_its_end(server.url, "talker")
        try:
            other = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
            started = time.monotonic()
            with httpx.stream("POST", f"{server.url}/threads/{other}/runs/stream", timeout=30,
                              json={"assistant_id": "echo", "input": user("hi")}) as r:
                assert "echo: hi" in r.read().decode()
            assert time.monotonic() - started < 5
            head, body = read_response(sock, timeout=60)
        finally:
            sock.close()
    assert head.startswith(b"HTTP/1.1 200")
    assert len(body) > 8_000_000  # far more than the socket buffers hold: the server held most of it back
    tokens = []
    for frame in body.decode().split("\r\n\r\n"):
        if frame.startswith("event: messages\r\n"):
            chunk, _meta = json.loads(frame.partition("data: ")[2])
            tokens.append(chunk["content"])
    assert "".join(tokens) == " ".join(WORDS)
    assert len([t for t in tokens if t]) == len(WORDS)


def test_a_reader_that_falls_behind_then_leaves_cancels_its_run_when_asked(tmp_path):
    """``on_disconnect="cancel"``: a reader that leaves while the server holds its stream back (it was not
    reading) cancels its run; the server serves the next stream as before."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"bulky": bulky, "echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, client_timeout=60), client_timeout=60) as server:
        tid = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
        sock = raw_stream(server.url, tid, {"assistant_id": "bulky", "input": user("go"), "on_disconnect": "cancel",
                                            "stream_mode": ["values", "messages-tuple"]})
        until(lambda: httpx.get(f"{server.url}/threads/{tid}/runs").json() != [], 10, "the run was not made")
        time.sleep(1.5)  # ~30 steps: ~20 MB of values unread
        assert run_status(server.url, tid) == "running"
        sock.close()
        until(lambda: run_status(server.url, tid) == "interrupted", 10, "the run outlived its reader")
        with httpx.stream("POST", f"{server.url}/threads/{tid}/runs/stream", timeout=30,
                          json={"assistant_id": "echo", "input": user("hi")}) as r:
            assert "echo: hi" in r.read().decode()


class Bursts(ChatModel):
    """Streams 5 bursts of 5 tokens, the tokens of a burst at once (one network read's worth), 0.2 s apart."""

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        for burst in range(5):
            await asyncio.sleep(0.2)
            for token in range(5):
                yield TextDelta(f"{burst}.{token} ")
        yield FinishDelta(None, "stop", {}, None)


def test_a_burst_of_tokens_goes_out_in_two_writes(tmp_path):
    """Tokens published at once (a model's network read holding several): the first is written at once, the
    rest of the burst together at the end of the event loop's turn, not one write each; each token still its
    own event, in order."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"bursts": create_agent(Bursts(), name="bursts")})
    with ThreadServer(create_app(runtime)) as server:
        tid = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
        sock = raw_stream(server.url, tid, {"assistant_id": "bursts", "input": user("go"),
                                            "stream_mode": ["messages-tuple"]})
        try:
            _head, chunks = read_chunks(sock, timeout=30)
        finally:
            sock.close()
    assert _tokens_by_write(chunks) == [chunk for burst in range(5)
                                        for chunk in ([f"{burst}.0 "], [f"{burst}.{token} " for token in range(1, 5)])]


def test_a_thread_follower_gets_a_burst_of_tokens_in_two_writes(tmp_path):
    """A thread's follower (``GET /threads/{id}/stream``) is pushed each run's parts as the run's creator is: the
    first token of a burst written at once, the rest together at the end of the event loop's turn, not one write
    a part."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"bursts": create_agent(Bursts(), name="bursts")})
    with ThreadServer(create_app(runtime)) as server:
        tid = httpx.post(f"{server.url}/threads", json={}).json()["thread_id"]
        host, port = server.url.removeprefix("http://").split(":")
        sock = socket.create_connection((host, int(port)))
        sock.sendall(b"GET /threads/%b/stream HTTP/1.1\r\nhost: %b\r\n\r\n" % (tid.encode(), host.encode()))
        try:
            until(lambda: runtime.streams.watching(tid), 10, "the thread's follower did not start")
            httpx.post(f"{server.url}/threads/{tid}/runs", timeout=30,
                       json={"assistant_id": "bursts", "input": user("go"), "stream_mode": ["messages-tuple"]})
            _head, chunks = read_chunks(sock, timeout=30, until=lambda received: b'"run_done"' in received
                                        and received.endswith(b"\r\n\r\n\r\n"))
        finally:
            sock.close()
    assert _tokens_by_write(chunks) == [chunk for burst in range(5)
                                        for chunk in ([f"{burst}.0 "], [f"{burst}.{token} " for token in range(1, 5)])]


class BigBursts(ChatModel):
    """Streams 60 bursts of 5 tokens of 50 KB each, the tokens of a burst at once: 15 MB, far more than sockets hold."""

    async def stream(self, request: Any) -> AsyncIterator[Any]:
        for burst in range(60):
            await asyncio.sleep(0)
            for token in range(5):
                yield TextDelta(f"{burst}.{token}:" + "x" * 50_000 + " ")
        yield FinishDelta(None, "stop", {}, None)


def test_a_reader_that_falls_behind_mid_burst_gets_every_token_in_order(tmp_path):
    """The rest of a burst, sent at the end of the loop's turn, meets a connection that takes no more (its reader
    reads nothing for a while): it waits its turn with the others, and the reader gets every token once, in order."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"big": create_agent(BigBursts(), name="big")})
    with ThreadServer(create_app(runtime, client_timeout=60), client_timeout=60) as server:
        sock = stream_unread_to_its_end(server.url, "big")
        try:
            _head, body = read_response(sock, timeout=60)
        finally:
            sock.close()
    tokens = [json.loads(frame.partition("data: ")[2])[0]["content"] for frame in body.decode().split("\r\n\r\n")
              if frame.startswith("event: messages\r\n")]
    assert [token.partition(":")[0] for token in tokens if token] == [
        f"{burst}.{token}" for burst in range(60) for token in range(5)]


def _tokens_by_write(chunks: list[bytes]) -> list[list[str]]:
    """The tokens of the messages-tuple events in each chunk (one write of the server's) that has any."""
    with_tokens = []
    for chunk in chunks:
        tokens = [json.loads(frame.partition("data: ")[2])[0]["content"] for frame in chunk.decode().split("\r\n\r\n")
                  if frame.startswith("event: messages\r\n")]
        if any(tokens):
            with_tokens.append([t for t in tokens if t])
    return with_tokens
