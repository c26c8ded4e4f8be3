"""Postgres stopped or restarted under three ``backchannel serve`` processes and an embedded runtime.

Issue 15.5. Traffic goes to every server while the test's own Postgres cluster
stops for a few seconds (or restarts at once). Requests during the outage are
answered 503, never a hang, a 500 or a false 2xx; once the database is back,
every server recovers by itself within seconds: every acknowledged run runs
(once), every background task's notification reaches its supervisor exactly
once, heartbeats resume and ``runs/wait`` answers on every server.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from postgres_cluster import PostgresCluster

from backchannel import ScriptedModel, create_agent, tool
from backchannel.errors import StorageUnavailableError
from backchannel.runtime import LocalRuntime, open_storage
from backchannel.runtime.postgres import scratch_schema

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))
from server_helpers import ProcessServer, user  # noqa: E402

SERVERS = 3
THREADS = 24
LEASE = 2.0  # shorter than the outage: nobody may take a live server for dead because the database was away
RECOVERY = 15.0  # seconds after the database is back by which every server answers runs/wait again
TIMEOUT = 20.0  # an answer slower than this is a hang


@pytest.fixture(scope="module")
def cluster():
    with PostgresCluster() as pg:
        yield pg


def turn_of(message: dict) -> str | None:
    notification = (message.get("additional_kwargs") or {}).get("task_notification")
    return None if notification or message["type"] != "human" else message["content"]


class Traffic:
    """Clients creating runs on every server, recording what each request was answered."""

    def __init__(self, clients: list[httpx.AsyncClient], threads: list[str]) -> None:
        self.clients = clients
        self.threads = threads
        self.acknowledged: dict[int, str] = {}  # turn -> run id, for every 2xx
        self.refused: list[tuple[int, int, str]] = []  # (turn, status, detail) of every 503
        self.bad: list[str] = []  # anything else: a 500, a hang, an unexpected shape
        self.next = 0
        self.running = True

    async def worker(self) -> None:
        while self.running:
            i, self.next = self.next, self.next + 1
            thread = self.threads[i % len(self.threads)]
            client = self.clients[i % len(self.clients)]
            response = await _post(client, f"/threads/{thread}/runs", {
                "assistant_id": "supervisor", "input": user(f"turn {i}"), "metadata": {"turn": i},
                "multitask_strategy": "enqueue"})
            if response is None:
                self.bad.append(f"turn {i}: no answer in {TIMEOUT} s")
            elif response.status_code == 200:
                self.acknowledged[i] = response.json()["run_id"]
            elif response.status_code == 503:
                self.refused.append((i, 503, response.json()["detail"]))
            else:
                self.bad.append(f"turn {i}: {response.status_code} {response.text[:300]}")
            await asyncio.sleep(0.03)


async def _post(client: httpx.AsyncClient, path: str, body: dict) -> httpx.Response | None:
    """The answer to a POST, or ``None`` if there was none within ``TIMEOUT`` seconds (a hang)."""
    try:
        async with asyncio.timeout(TIMEOUT):
            return await client.post(path, json=body)
    except (TimeoutError, httpx.TimeoutException):
        return None


async def _first_wait_answered(client: httpx.AsyncClient, since: float) -> float:
    """Seconds from ``since`` until ``runs/wait`` on a new thread of this server succeeds."""
    while True:
        thread = await _post(client, "/threads", {})
        if thread is not None and thread.status_code == 200:
            waited = await _post(client, f"/threads/{thread.json()['thread_id']}/runs/wait",
                                 {"assistant_id": "supervisor", "input": user("ping")})
            if waited is not None and waited.status_code == 200 and \
                    waited.json()["messages"][-1]["content"] == "started":
                return time.monotonic() - since
        assert time.monotonic() - since < RECOVERY, "a server did not answer runs/wait after the database came back"
        await asyncio.sleep(0.1)


@pytest.mark.parametrize("outage", ["stopped 3 s (crash)", "restart -m fast"])
async def test_servers_recover_from_a_postgres_outage_and_lose_nothing(tmp_path, cluster, outage):
    with scratch_schema(cluster.url, "outage") as url:
        servers = [ProcessServer(["cluster_agents:supervisor"], url, extra=["--lease", str(LEASE)],
                                 log=tmp_path / f"server-{i}.log") for i in range(SERVERS)]
        clients: list[httpx.AsyncClient] = []
        try:
            for server in servers:
                server.start()
            clients += [httpx.AsyncClient(base_url=s.url, timeout=TIMEOUT) for s in servers]
            threads = [(await clients[0].post("/threads", json={})).json()["thread_id"] for _ in range(THREADS)]
            traffic = Traffic(clients, threads)
            workers = [asyncio.create_task(traffic.worker()) for _ in range(6)]
            await asyncio.sleep(2.0)
            if outage.startswith("stopped"):
                await asyncio.to_thread(cluster.stop, "immediate")
                await asyncio.sleep(3.0)
                back = await asyncio.to_thread(cluster.start)
            else:
                back = await asyncio.to_thread(cluster.restart, "fast")
            recovered = await asyncio.gather(*(_first_wait_answered(c, back) for c in clients))
            await asyncio.sleep(2.0)  # traffic goes on a while after the database is back
            traffic.running = False
            await asyncio.gather(*workers)

            assert not traffic.bad, traffic.bad[:10]
            if outage.startswith("stopped"):
                assert traffic.refused, "no request was made during the outage"
            assert all("database" in detail for _, _, detail in traffic.refused), traffic.refused[:3]

            storage = open_storage(url)
            await storage.open()
            try:
                settled_at = await _settled(storage, servers, back)
                beats = await storage.workers()
                ages = [(datetime.now(UTC) - datetime.fromisoformat(at)).total_seconds() for _, at in beats.values()]
                runs_by_thread = {t: list(reversed((await clients[1].get(f"/threads/{t}/runs",
                                                                         params={"limit": 1000})).json()))
                                  for t in threads}
                states = {t: (await clients[2].get(f"/threads/{t}/state")).json() for t in threads}
            finally:
                await storage.close()
        finally:
            for client in clients:
                await client.aclose()
            for server in servers:
                if server.process is not None:
                    server.stop()

    # every server heartbeats again, and none was taken for dead (the outage outlasted the lease)
    assert len(beats) == SERVERS
    assert max(ages) < LEASE, ages
    assert not any("missed its heartbeats" in s.log.read_text() for s in servers)
    # every acknowledged run is stored, and every stored run succeeded
    stored = {r["run_id"]: r for runs in runs_by_thread.values() for r in runs}
    assert set(traffic.acknowledged.values()) <= set(stored), "acknowledged runs were lost"
    failed = [(r["run_id"], r["status"]) for r in stored.values() if r["status"] != "success"]
    assert not failed, failed[:10]
    for thread in threads:
        turns = [f"turn {r['metadata']['turn']}" for r in runs_by_thread[thread] if "turn" in r["metadata"]]
        messages = states[thread]["values"]["messages"]
        # each run's input once, in the order the runs were queued
        assert [t for t in map(turn_of, messages) if t] == turns, thread
        tasks = states[thread]["values"].get("async_tasks", {})
        assert sorted(t["description"] for t in tasks.values()) == sorted(turns)
        notes = Counter(m["additional_kwargs"]["task_notification"]["task_id"] for m in messages
                        if (m.get("additional_kwargs") or {}).get("task_notification"))
        assert notes == Counter(tasks.keys()), f"{thread}: notifications {notes} for tasks {list(tasks)}"
    print(f"\n{outage}: {len(traffic.acknowledged)} runs acknowledged, {len(traffic.refused)} refused (503); "
          f"runs/wait answered again {max(recovered):.2f} s after the database was back on every server; "
          f"everything settled {settled_at:.2f} s after")


async def _settled(storage, servers, since: float) -> float:
    """Wait until no run is pending or running; returns the seconds since ``since``."""
    while True:
        async with storage.pool.connection() as conn:
            (active,) = await (await conn.execute(
                "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')")).fetchone()
        if active == 0:
            return time.monotonic() - since
        if time.monotonic() - since > 90:
            logs = "".join(f"\n--- {s.url}:\n{s.log.read_text()[-3000:]}" for s in servers)
            raise AssertionError(f"{active} runs still pending or running 90 s after the database came back{logs}")
        await asyncio.sleep(0.2)


@tool
async def slow_step(i: int) -> str:
    """One step of work."""
    await asyncio.sleep(0.1)
    return f"step {i} done"


def _three_steps(request):
    done = sum(m.type == "tool" for m in request.messages[[m.type for m in request.messages].index("human"):])
    if done < 3:
        return {"tool_calls": [{"name": "slow_step", "args": {"i": done + 1}, "id": f"call_{done + 1}"}]}
    return "finished"


async def test_an_embedded_runtime_recovers_from_a_postgres_outage(cluster):
    agent = create_agent(ScriptedModel([_three_steps], loop=True), [slow_step], name="worker")
    with scratch_schema(cluster.url, "embedded") as url:
        async with LocalRuntime(url, agents={"worker": agent}, heartbeat_interval=0.2, lease=LEASE) as rt:
            runs = []
            for i in range(20):
                thread = await rt.threads.create()
                runs.append(await rt.runs.create(thread["thread_id"], "worker", input=f"job {i}"))
            await asyncio.sleep(0.15)  # mid-run
            await asyncio.to_thread(cluster.stop, "fast")
            try:
                started = time.monotonic()
                with pytest.raises(StorageUnavailableError):
                    await rt.threads.create()
                assert time.monotonic() - started < 5, "a request during the outage hung"
            finally:
                back = await asyncio.to_thread(cluster.start)
            results = await asyncio.wait_for(asyncio.gather(
                *(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs)), RECOVERY)
            took = time.monotonic() - back
            for run, result in zip(runs, results):
                assert (await rt.runs.get(run["thread_id"], run["run_id"]))["status"] == "success"
                assert [m["content"] for m in result["messages"] if m["type"] == "tool"] == \
                    [f"step {i} done" for i in (1, 2, 3)]
                assert result["messages"][-1]["content"] == "finished"
            # new work goes on as before
            fresh = await rt.threads.create()
            assert (await rt.runs.wait(fresh["thread_id"], "worker", input="after"))["messages"][-1]["content"] == \
                "finished"
    print(f"\nembedded runtime: its 20 runs ended {took:.2f} s after the database was back")
