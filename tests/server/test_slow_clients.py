"""Slow clients cannot hold the server: half-sent requests time out, a reader that reads nothing is disconnected,
one that falls too far behind is told so, and memory stays flat (a real ``backchannel serve`` process)."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_agents import AGENTS
from server_helpers import ProcessServer, ThreadServer, user

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
