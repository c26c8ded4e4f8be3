"""Retention over HTTP, driven by the official Python SDK: /threads/prune, thread TTLs (include=ttl),
store item TTLs, and ``backchannel serve --checkpointer-ttl`` swept by the server's own scheduler.

The in-process server's runtime measures TTLs by a clock the test moves forward, so a one-minute
TTL passes at once; the served process gets TTLs of a fraction of a minute instead.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from server_agents import AGENTS
from server_helpers import ProcessServer, ThreadServer, user

from backchannel.errors import InvalidRequestError
from backchannel.runtime import LocalRuntime, StoreTTLConfig, ThreadTTLConfig
from backchannel.runtime.remote import RemoteRuntime
from backchannel.server import create_app, served

SWEEP_MINUTES = 0.002  # 0.12 s


class Clock:
    """Now, moved forward by the test (the server's runtime measures TTLs by it)."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def __call__(self) -> str:
        return (datetime.now(UTC) + self.ahead).isoformat()


@pytest.fixture(scope="module")
def clock():
    return Clock()


@pytest.fixture(scope="module")
def server(tmp_path_factory, clock):
    db = tmp_path_factory.mktemp("retention") / "state.db"
    runtime = LocalRuntime(f"sqlite:///{db}", {name: served(agent) for name, agent in AGENTS.items()}, clock=clock,
                           thread_ttl=ThreadTTLConfig(sweep_interval_minutes=SWEEP_MINUTES),
                           store_ttl=StoreTTLConfig(sweep_interval_minutes=SWEEP_MINUTES))
    with ThreadServer(create_app(runtime, heartbeat=0.2, grace=1.0)) as live:
        yield live


async def _gone(client, thread_id: str) -> bool:
    try:
        await client.threads.get(thread_id)
    except httpx.HTTPStatusError as exc:
        return exc.response.status_code == 404
    return False


async def _until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.05)


def _contents(state) -> list[str]:
    return [m["content"] for m in state["values"]["messages"]]


async def test_thread_ttls_over_the_sdk_delete_and_keep_latest(client, clock):
    doomed = await client.threads.create(ttl=1)
    kept = await client.threads.create()
    await client.threads.update(kept["thread_id"], metadata={"kind": "kept"},
                                ttl={"ttl": 1, "strategy": "keep_latest"})
    plain = await client.threads.create()
    for thread in (doomed, kept):
        await client.runs.wait(thread["thread_id"], "echo", input=user("one"))
        await client.runs.wait(thread["thread_id"], "echo", input=user("two"))
    ttl = (await client.threads.get(kept["thread_id"], include=["ttl"]))["ttl"]
    assert ttl["strategy"] == "keep_latest" and ttl["ttl_minutes"] == 1
    assert datetime.fromisoformat(ttl["expires_at"]) > datetime.now(UTC)
    assert "ttl" not in await client.threads.get(plain["thread_id"], include=["ttl"])  # none of its own
    assert "ttl" not in await client.threads.get(kept["thread_id"])  # only when asked for
    before = await client.threads.get_state(kept["thread_id"])

    clock.ahead += timedelta(minutes=2)
    await _until(lambda: _gone(client, doomed["thread_id"]))
    await _until(lambda: _history_length(client, kept["thread_id"], 1))
    after = await client.threads.get_state(kept["thread_id"])
    assert after["values"] == before["values"] and after["checkpoint"] == before["checkpoint"]
    await client.runs.wait(kept["thread_id"], "echo", input=user("three"))
    assert _contents(await client.threads.get_state(kept["thread_id"]))[-2:] == ["three", "echo: three"]
    assert not await _gone(client, plain["thread_id"])


async def _history_length(client, thread_id: str, length: int) -> bool:
    return len(await client.threads.get_history(thread_id, limit=50)) == length


async def test_prune_over_the_sdk_leaves_running_threads_alone(client):
    idle = [(await client.threads.create())["thread_id"] for _ in range(2)]
    busy = (await client.threads.create())["thread_id"]
    for thread in idle:
        await client.runs.wait(thread, "echo", input=user("hi"))
        await client.runs.wait(thread, "echo", input=user("again"))
    run = await client.runs.create(busy, "glacial", input=user("take your time"))

    assert await client.threads.prune([idle[0]], strategy="keep_latest") == {"pruned_count": 1}
    assert len(await client.threads.get_history(idle[0], limit=50)) == 1
    assert await client.threads.prune([*idle, busy, "00000000-0000-0000-0000-000000000000"]) == {"pruned_count": 2}
    assert await _gone(client, idle[0]) and await _gone(client, idle[1])
    assert not await _gone(client, busy)
    assert (await client.runs.get(busy, run["run_id"]))["status"] in ("pending", "running")
    await client.runs.cancel(busy, run["run_id"], wait=True)
    assert await client.threads.prune([busy]) == {"pruned_count": 1}


async def test_remote_runtime_prunes_and_sets_ttls(server):
    async with RemoteRuntime(server.url, api_key=None) as rt:
        thread = (await rt.threads.create(ttl=30))["thread_id"]
        assert (await rt.threads.get(thread, include=["ttl"]))["ttl"]["ttl_minutes"] == 30
        await rt.threads.update(thread, metadata={}, ttl={"ttl": 45, "strategy": "keep_latest"})
        assert (await rt.threads.get(thread, include=["ttl"]))["ttl"]["strategy"] == "keep_latest"
        assert await rt.threads.prune([thread]) == {"pruned_count": 1}
        with pytest.raises(InvalidRequestError, match="strategy"):
            await rt.threads.prune([thread], strategy="archive")


async def test_bad_prune_and_ttl_requests_are_422_naming_the_field(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        bad = [("POST", "/threads/prune", {"thread_ids": ["a"], "strategy": "archive"}, "strategy"),
               ("POST", "/threads/prune", {"thread_ids": "a"}, "thread_ids"),
               ("POST", "/threads", {"ttl": {"ttl": -1}}, "ttl"),
               ("POST", "/threads", {"ttl": {"ttl": 5, "strategy": "forget"}}, "strategy"),
               ("PUT", "/store/items", {"namespace": ["a"], "key": "k", "value": {}, "ttl": 0}, "ttl")]
        for method, path, body, field in bad:
            response = await http.request(method, path, json=body)
            assert response.status_code == 422, (path, body, response.text)
            assert field in response.text
        thread = (await http.post("/threads", json={})).json()["thread_id"]
        assert (await http.get(f"/threads/{thread}", params={"include": "everything"})).status_code == 422


async def test_store_item_ttls_over_the_sdk(client, clock):
    await client.store.put_item(["notes", "u1"], "brief", {"text": "expires"}, ttl=1)
    await client.store.put_item(["notes", "u1"], "read", {"text": "read often"}, ttl=1)
    await client.store.put_item(["notes", "u1"], "forever", {"text": "kept"})
    clock.ahead += timedelta(seconds=45)
    assert (await client.store.get_item(["notes", "u1"], "brief", refresh_ttl=False))["value"] == {"text": "expires"}
    found = await client.store.search_items(["notes"], filter={"text": "read often"}, refresh_ttl=True)
    assert [i["key"] for i in found["items"]] == ["read"]
    clock.ahead += timedelta(seconds=30)
    assert await client.store.get_item(["notes", "u1"], "brief") is None
    assert (await client.store.get_item(["notes", "u1"], "read"))["value"] == {"text": "read often"}
    keys = sorted(i["key"] for i in (await client.store.search_items(["notes"]))["items"])
    assert keys == ["forever", "read"]


def test_serve_sweeps_threads_past_the_operators_default_ttl(tmp_path):
    settings = '{"strategy": "delete", "default_ttl": 0.05, "sweep_interval_minutes": 0.005}'  # 3 s; 0.3 s
    with ProcessServer(["echo=server_agents:echo"], f"sqlite:///{tmp_path / 'state.db'}",
                       extra=["--checkpointer-ttl", settings, "--store-ttl", '{"default_ttl": 0.01}'],
                       log=tmp_path / "serve.log") as live, httpx.Client(base_url=live.url) as http:
        thread = http.post("/threads", json={}).json()["thread_id"]
        assert http.get(f"/threads/{thread}", params={"include": "ttl"}).json()["ttl"]["ttl_minutes"] == 0.05
        deadline = time.monotonic() + 15
        while http.get(f"/threads/{thread}").status_code != 404:
            assert time.monotonic() < deadline, "the thread outlived its TTL"
            time.sleep(0.1)


def test_serve_refuses_bad_retention_settings(tmp_path):
    for option, value, named in (("--checkpointer-ttl", "{not json", "not JSON"),
                                 ("--checkpointer-ttl", '{"strategy": "archive"}', "strategy"),
                                 ("--store-ttl", '{"ttl": 5}', "ttl")):
        result = subprocess.run([sys.executable, "-m", "backchannel.cli", "serve", "--database",
                                 f"sqlite:///{tmp_path / 'db'}", "--agents", "server_agents:AGENTS", option, value],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
        assert result.returncode == 2, result.stdout + result.stderr
        assert named in result.stdout
