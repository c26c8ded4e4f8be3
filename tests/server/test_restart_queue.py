"""A server restarted on a long queue starts its first run at once, and drains the queue (issue 22.4).

A runtime that runs nothing queues thousands of runs and goes away, as a server stopped with a full
queue does. ``backchannel serve`` started on that database must start the first of them as soon as a
server on an empty database would be answering, not after looking at every queued run (or once per
run), and then run them all, once each.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_agents import echo
from server_helpers import ProcessServer, user

QUEUED = 4_000
PROMPT = 1.0  # seconds: how much later than an empty server's start the first queued run may start


def bench_script(name: str) -> Any:
    """A script of bench/, imported as its siblings import it (bench/ on the path only meanwhile)."""
    saved = list(sys.path)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path[:] = saved


restart = bench_script("restart")  # bench/restart.py queues the runs and watches them as this test does


def seconds_until(server: ProcessServer, condition, timeout: float) -> float:
    """Start ``server``'s process and return how many seconds after that ``condition()`` first held."""
    server.process = subprocess.Popen(server.args, env=server.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT)
    return waited(server, condition, timeout)


def waited(server: ProcessServer, condition, timeout: float) -> float:
    """Seconds until ``condition()`` held, with ``server`` running all along."""
    started = time.monotonic()
    while not condition():
        assert server.process is not None and server.process.poll() is None, "the server exited"
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        time.sleep(0.01)
    return time.monotonic() - started


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    return request.getfixturevalue("postgres_url")


def answers(server: ProcessServer) -> bool:
    try:
        return httpx.get(f"{server.url}/ok", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


async def test_a_server_restarted_on_thousands_of_queued_runs_starts_one_at_once_and_runs_them_all(
        database, tmp_path):
    # what starting a server costs on this machine, with nothing queued (Python, imports, opening the database)
    with ProcessServer(["server_agents:echo"], f"sqlite:///{tmp_path}/empty.db") as empty:
        empty.stop()
    baseline = ProcessServer(["server_agents:echo"], f"sqlite:///{tmp_path}/empty.db")
    try:
        ready = seconds_until(baseline, lambda: answers(baseline), 60)
    finally:
        baseline.stop()

    await restart.queue_runs(database, QUEUED, echo, user("hi"))
    runs = restart.Watcher(database)
    assert not runs.begun()
    server = ProcessServer(["server_agents:echo"], database)
    try:
        first = seconds_until(server, runs.begun, 60)
        assert first <= ready + PROMPT, f"the first queued run started {first:.2f} s after the server process " \
                                        f"(an empty server answers after {ready:.2f} s)"
        waited(server, lambda: runs.ended() == QUEUED, 120)  # all of them run
    finally:
        server.stop()
    try:
        ended = runs.conn.execute("SELECT count(*), min(attempts), max(attempts) FROM runs").fetchall()[0]
    finally:
        runs.close()
    assert tuple(ended) == (QUEUED, 1, 1)  # each run once
