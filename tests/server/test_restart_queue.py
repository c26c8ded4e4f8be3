"""A server restarted on a long queue starts its first run at once, and drains the queue (issue 22.4).

A runtime that runs nothing queues thousands of runs and goes away, as a server stopped with a full
queue does. ``backchannel serve`` started on that database must start the first of them as soon as a
server on an empty database would be answering, not after looking at every queued run (or once per
run), and then run them all, once each.

Starting is compared by the server process's CPU time, and by the moment its own ``/ok`` answered in the same
start, not by wall time against a start measured earlier: on a loaded machine (CI's two cores shared by the
suite's servers and Postgres) two starts a minute apart differ by more than the margin.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
from server_agents import echo
from server_helpers import ProcessServer, user

from backchannel.runtime import LocalRuntime, open_storage
from backchannel.server.serving import served

QUEUED = 4_000
PROMPT = 1.0  # seconds: how much later than the server's own answering the first queued run may start
PROMPT_CPU = 0.5  # CPU seconds: how much more than an empty server's start (~0.45 s here) the first run may take


async def queue_runs(database: str, count: int) -> None:
    """Leave ``count`` pending runs of the echo agent, each on a thread of its own, queued by a runtime that
    starts none and then closes (as a server stopped with a full queue leaves them)."""
    # As the server serves it (with its middleware), so the server takes these runs as its agent's.
    async with LocalRuntime(database, agents={"echo": served(echo)}, max_concurrency=0) as rt:
        for start in range(0, count, 500):  # in groups: the backends store a tick's writes at once
            await asyncio.gather(*(rt.runs.create(str(uuid.uuid4()), "echo", input=user("hi"),
                                                  if_not_exists="create") for _ in range(min(500, count - start))))


def cpu_seconds(process: subprocess.Popen[bytes]) -> float:
    """The CPU time ``process`` has used so far (user and system)."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def start_until(server: ProcessServer, conditions: dict[str, Callable[[], Awaitable[bool]]],
                      timeout: float) -> dict[str, tuple[float, float]]:
    """Start ``server``'s process; for each of ``conditions`` (name: ``async () -> bool``), the seconds after the
    start and the CPU seconds the process had used when it first held."""
    server.process = subprocess.Popen(server.args, env=server.env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.STDOUT)
    started = time.monotonic()
    held: dict[str, tuple[float, float]] = {}
    while len(held) < len(conditions):
        for name, condition in conditions.items():
            if name not in held and await condition():
                held[name] = (time.monotonic() - started, cpu_seconds(server.process))
        assert server.process.poll() is None, "the server exited"
        assert time.monotonic() - started < timeout, f"not within {timeout} s: only {sorted(held)}"
        await asyncio.sleep(0.01)
    return held


async def waited(server: ProcessServer, condition, timeout: float) -> float:
    """Seconds until ``await condition()`` held, with ``server`` running all along."""
    started = time.monotonic()
    while not await condition():
        assert server.process is not None and server.process.poll() is None, "the server exited"
        assert time.monotonic() - started < timeout, f"not within {timeout} s"
        await asyncio.sleep(0.01)
    return time.monotonic() - started


@pytest.fixture(params=["sqlite", "postgres"])
def database(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    return request.getfixturevalue("postgres_url")


async def test_a_server_restarted_on_thousands_of_queued_runs_starts_one_at_once_and_runs_them_all(database):
    # What starting a server costs on this machine with nothing queued (Python, imports, opening the database),
    # on this same database while it is empty: a Postgres server also imports psycopg and fills its pool.
    with ProcessServer(["server_agents:echo"], database) as warm:  # its tables made, its files in the page cache
        warm.stop()
    baseline = ProcessServer(["server_agents:echo"], database)

    def answers(server: ProcessServer) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            try:
                async with httpx.AsyncClient(timeout=1) as client:
                    return (await client.get(f"{server.url}/ok")).status_code == 200
            except httpx.HTTPError:
                return False
        return check

    try:
        _, ready_cpu = (await start_until(baseline, {"answers": answers(baseline)}, 60))["answers"]
    finally:
        baseline.stop()

    await queue_runs(database, QUEUED)
    # The runs watched from outside the server, as an operator's process reads the database.
    runs = open_storage(database)
    await runs.open()
    try:
        async def count(*statuses: str) -> int:
            return sum(n for status, n in (await runs.count_runs_by_status()).items() if status in statuses)

        async def begun() -> bool:
            return await count("running", "success") > 0

        async def all_ended() -> bool:
            return await count("success") == QUEUED

        assert not await begun()
        server = ProcessServer(["server_agents:echo"], database)
        try:
            held = await start_until(server, {"begun": begun, "answers": answers(server)}, 60)
            (first, first_cpu), (answered, _) = held["begun"], held["answers"]
            assert first_cpu <= ready_cpu + PROMPT_CPU, f"the first queued run started after {first_cpu:.2f} s " \
                f"of the server's CPU (an empty server answers after {ready_cpu:.2f} s)"
            assert first <= answered + PROMPT, f"the first queued run started {first:.2f} s after the server " \
                f"process, {first - answered:.2f} s after it answered"
            await waited(server, all_ended, 120)  # all of them run
        finally:
            server.stop()
        ended = await runs.runs_with_status(["success"])
    finally:
        await runs.close()
    assert len(ended) == QUEUED and {r.attempts for r in ended} == {1}  # each run once
