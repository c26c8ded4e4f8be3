"""Real servers on loopback for the server tests: uvicorn in a thread, or ``backchannel serve`` processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from backchannel.server.connections import DEFAULT_CLIENT_TIMEOUT, server_config

HERE = Path(__file__).parent


class ThreadServer:
    """A uvicorn server for ``app`` on a free loopback port, in a thread with its own event loop,
    configured as ``backchannel serve`` configures it."""

    def __init__(self, app: Any, *, client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> None:
        self.server = uvicorn.Server(server_config(app, client_timeout=client_timeout, host="127.0.0.1", port=0,
                                                   log_level="warning", access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def user(text: str) -> dict[str, Any]:
    """A run's input: one user message."""
    return {"messages": [{"role": "user", "content": text}]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ProcessServer:
    """``backchannel serve`` in a subprocess, serving agents from this directory's modules."""

    def __init__(self, agents: Sequence[str], database: str, *, port: int | None = None,
                 extra: Sequence[str] = (), env: dict[str, str] | None = None, log: Path | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [sys.executable, "-m", "backchannel.cli", "serve", "--port", str(self.port),
                     "--database", database, "--agents", *agents, *extra]
        # ``env``'s PYTHONPATH goes before this directory and the caller's (whose source tree the server runs).
        given = dict(env or {})
        path = [given.pop("PYTHONPATH", ""), str(HERE), os.environ.get("PYTHONPATH", "")]
        self.env = {**os.environ, **given, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ProcessServer:
        # The child keeps its own copy of the log's descriptor: this process's copy can close at once.
        with open(self.log, "ab") if self.log else contextlib.nullcontext(subprocess.DEVNULL) as out:
            self.process = subprocess.Popen(self.args, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{self.url}/ok", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self.log.read_text() if self.log else ""
                raise RuntimeError(f"backchannel serve did not start (exit {self.process.poll()}):\n{log}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=timeout)

    def __enter__(self) -> ProcessServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
