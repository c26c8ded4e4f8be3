"""``GET /threads/{id}/stream``: follow every run of a thread, wake-up runs started by background results too."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
from langgraph_sdk import get_client
from server_helpers import ThreadServer, user

from backchannel.demo import DEFAULT_PROMPT, build_demo
from backchannel.runtime import LocalRuntime
from backchannel.server import create_app, served


async def follow(client, thread_id: str, parts: list, **kwargs) -> None:
    async for part in await client.threads.join_stream(thread_id, **kwargs):  # langgraph_sdk awaits, then iterates
        parts.append(part)


async def until(condition, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def runs_seen(parts: list) -> list[str]:
    return [p.data["run_id"] for p in parts if p.event == "metadata" and "attempt" in p.data]


def runs_done(parts: list) -> list[str]:
    return [p.data["run_id"] for p in parts if p.event == "metadata" and p.data.get("status") == "run_done"]


async def test_a_follower_sees_every_run_of_the_thread_in_order(client):
    thread = await client.threads.create()
    tid = thread["thread_id"]
    parts: list = []
    follower = asyncio.create_task(follow(client, tid, parts))
    await asyncio.sleep(0.3)  # the follower is in
    first = await client.runs.create(tid, "slow", input=user("one"), stream_mode=["values", "updates"])
    second = await client.runs.create(tid, "echo", input=user("two"), multitask_strategy="enqueue")
    await until(lambda: len(runs_done(parts)) == 2)
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    assert runs_seen(parts) == runs_done(parts) == [first["run_id"], second["run_id"]]
    events = [p.event for p in parts]
    one = events[:events.index("metadata", 1) + 1]
    assert one[0] == "metadata" and {"values", "updates"} <= set(one)  # the first run's own modes
    last_values = [p.data for p in parts if p.event == "values"][-1]
    assert last_values["messages"][-1]["content"] == "echo: two"


async def test_lifecycle_mode_tells_only_when_runs_start_and_end(client):
    tid = (await client.threads.create())["thread_id"]
    parts: list = []
    follower = asyncio.create_task(follow(client, tid, parts, stream_mode="lifecycle"))
    await asyncio.sleep(0.3)
    run = await client.runs.create(tid, "echo", input=user("hi"))
    await until(lambda: runs_done(parts) == [run["run_id"]])
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    assert {p.event for p in parts} == {"metadata"}


async def test_bad_requests_are_refused_before_the_stream(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/threads/nope/stream")).status_code == 404
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        bad = await http.get(f"/threads/{tid}/stream", params={"stream_mode": "everything"})
        assert bad.status_code == 422 and "everything" in bad.json()["detail"]


async def test_a_wake_up_run_reaches_a_thread_follower_live(tmp_path):
    """A supervisor dispatches background tasks and ends its run; each result wakes it with a run nobody
    started, which a UI following the thread sees as it happens, without reloading."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}",
                           {"supervisor": served(build_demo(latency=0.1, completion="notify"))})
    with ThreadServer(create_app(runtime, heartbeat=0.2)) as live:
        client = get_client(url=live.url, api_key=None)
        tid = (await client.threads.create())["thread_id"]
        parts: list = []
        follower = asyncio.create_task(follow(client, tid, parts))
        await asyncio.sleep(0.3)
        started = await client.runs.create(tid, "supervisor", input=user(DEFAULT_PROMPT))
        await until(lambda: len(runs_done(parts)) >= 3, timeout=60)  # the run, then a wake-up per result
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        wake_ups = [r for r in runs_seen(parts) if r != started["run_id"]]
        assert runs_seen(parts)[0] == started["run_id"] and len(wake_ups) >= 2
        for run_id in wake_ups:
            run = await client.runs.get(tid, run_id)
            assert run["kwargs"]["stream_resumable"]  # a UI that learns of it late can replay it
        texts = [m.get("content") for p in parts if p.event == "values" for m in p.data.get("messages", ())]
        assert any("[task_id=" in str(t) and "Completed" in str(t) for t in texts)  # the result, live
        await client.http.client.aclose()


@pytest.mark.parametrize("mode", ["run_modes", "lifecycle,run_modes"])
async def test_stream_modes_by_either_query_name(server, mode):
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        for name in ("stream_mode", "stream_modes"):
            async with http.stream("GET", f"/threads/{tid}/stream", params={name: mode}) as answer:
                assert answer.status_code == 200
                assert answer.headers["content-type"].startswith("text/event-stream")
