"""Threads over HTTP with the official client: create, get, update, search, count, copy, delete, state, history."""

from __future__ import annotations

import httpx
import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError
from server_helpers import user


async def test_create_get_update_and_delete(client):
    thread = await client.threads.create(metadata={"user": "ada"})
    assert thread["status"] == "idle" and thread["values"] is None
    assert (await client.threads.get(thread["thread_id"]))["metadata"] == {"user": "ada"}
    updated = await client.threads.update(thread["thread_id"], metadata={"topic": "math"})
    assert updated["metadata"] == {"user": "ada", "topic": "math"}
    await client.threads.delete(thread["thread_id"])
    with pytest.raises(NotFoundError):
        await client.threads.get(thread["thread_id"])
    with pytest.raises(NotFoundError):
        await client.threads.delete(thread["thread_id"])


async def test_a_chosen_thread_id_conflicts_unless_do_nothing(client):
    thread_id = "3c9d6f0e-0000-4000-8000-000000000001"
    await client.threads.create(thread_id=thread_id, metadata={"n": 1})
    with pytest.raises(ConflictError):
        await client.threads.create(thread_id=thread_id)
    again = await client.threads.create(thread_id=thread_id, if_exists="do_nothing")
    assert again["metadata"] == {"n": 1}


async def test_search_and_count_by_metadata_and_status(client):
    tag = {"suite": "threads-search"}
    ids = [(await client.threads.create(metadata={**tag, "i": i}))["thread_id"] for i in range(3)]
    await client.runs.wait(ids[0], "echo", input=user("hi"))
    found = await client.threads.search(metadata=tag, limit=10)
    assert sorted(t["thread_id"] for t in found) == sorted(ids)
    assert [t["thread_id"] for t in await client.threads.search(metadata={**tag, "i": 1})] == [ids[1]]
    assert await client.threads.count(metadata=tag) == 3
    assert len(await client.threads.search(metadata=tag, limit=2)) == 2
    oldest_first = await client.threads.search(metadata=tag, sort_by="created_at", sort_order="asc")
    assert [t["thread_id"] for t in oldest_first] == ids
    assert ids[0] in [t["thread_id"] for t in await client.threads.search(metadata=tag, status="idle")]
    assert found[0]["values"] is None or "messages" in found[0]["values"]


async def test_state_history_and_checkpoints(client):
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], "calc", input=user("2 + 3?"))
    state = await client.threads.get_state(thread["thread_id"])
    assert [m["content"] for m in state["values"]["messages"]][-1] == "the answer is 5"
    assert state["next"] == [] and state["checkpoint"]["checkpoint_id"]
    history = await client.threads.get_history(thread["thread_id"], limit=100)
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    assert len(history) >= 4  # input, model, tools, model
    sizes = [len(h["values"].get("messages", [])) for h in history]
    assert sizes == sorted(sizes, reverse=True)  # newest first
    first = history[-1]
    at_first = await client.threads.get_state(thread["thread_id"], checkpoint_id=first["checkpoint"]["checkpoint_id"])
    assert [m["content"] for m in at_first["values"]["messages"]] == ["2 + 3?"]
    via_post = await client.threads.get_state(thread["thread_id"], checkpoint=first["checkpoint"])
    assert via_post["values"] == at_first["values"]
    older = await client.threads.get_history(thread["thread_id"], limit=2, before=history[1]["checkpoint"])
    assert [h["checkpoint"]["checkpoint_id"] for h in older] == [h["checkpoint"]["checkpoint_id"]
                                                                  for h in history[2:4]]


async def test_update_state_adds_a_checkpoint_the_next_run_sees(client):
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], "echo", input=user("one"))
    written = await client.threads.update_state(thread["thread_id"], {"messages": [
        {"role": "user", "content": "a note from the app"}]})
    assert written["checkpoint"]["checkpoint_id"]
    state = await client.threads.get_state(thread["thread_id"])
    assert state["values"]["messages"][-1]["content"] == "a note from the app"
    values = await client.runs.wait(thread["thread_id"], "echo", input=user("two"))
    assert [m["content"] for m in values["messages"]] == ["one", "echo: one", "a note from the app", "two",
                                                          "echo: two"]


async def test_copy_keeps_the_history(client):
    thread = await client.threads.create(metadata={"kind": "original"})
    await client.runs.wait(thread["thread_id"], "echo", input=user("remember me"))
    copy = await client.threads.copy(thread["thread_id"])
    assert copy["thread_id"] != thread["thread_id"] and copy["metadata"]["kind"] == "original"
    state = await client.threads.get_state(copy["thread_id"])
    assert [m["content"] for m in state["values"]["messages"]] == ["remember me", "echo: remember me"]
    values = await client.runs.wait(copy["thread_id"], "echo", input=user("and me"))
    assert len(values["messages"]) == 4
    assert len((await client.threads.get_state(thread["thread_id"]))["values"]["messages"]) == 2


async def test_update_state_on_a_busy_thread_is_409(server, client):
    thread = await client.threads.create()
    # 5 s a run: still going when the update comes, even on a loaded machine (a run of 0.4 s could end first)
    run = await client.runs.create(thread["thread_id"], "glacial", input=user("busy"))
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.post(f"/threads/{thread['thread_id']}/state", json={"values": {"messages": []}})
    assert response.status_code == 409 and "in-flight runs" in response.json()["detail"]
    await client.runs.cancel(thread["thread_id"], run["run_id"], wait=True)


async def test_an_unknown_checkpoint_is_404(client):
    thread = await client.threads.create()
    await client.runs.wait(thread["thread_id"], "echo", input=user("x"))
    with pytest.raises(NotFoundError):
        await client.threads.get_state(thread["thread_id"], checkpoint_id="no-such-checkpoint")


async def test_a_long_thread_read_from_the_file_is_sent_as_when_cached(tmp_path):
    """A second server on the same file reads the thread from storage (its stored text sent unparsed): the official
    client, and the bytes on the wire, see what the server that ran it sends from its cached state."""
    from langgraph_sdk import get_client
    from server_agents import AGENTS
    from server_helpers import ThreadServer

    from backchannel.runtime import LocalRuntime
    from backchannel.server import create_app, served

    def serve() -> ThreadServer:
        runtime = LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"chatty": served(AGENTS["chatty"])})
        return ThreadServer(create_app(runtime, heartbeat=0.2, grace=1.0))

    async def reads(url: str, thread_id: str, before: str) -> tuple[list[object], list[bytes]]:
        client = get_client(url=url, api_key=None)
        try:
            parsed = [await client.threads.get_state(thread_id),
                      await client.threads.get_state(thread_id, checkpoint_id=before),
                      await client.threads.get_history(thread_id, limit=10),
                      await client.threads.get_history(thread_id, limit=5, before=before)]
        finally:
            await client.http.client.aclose()
        async with httpx.AsyncClient(base_url=url) as http:
            raw = [(await http.get(f"/threads/{thread_id}/state")).content,
                   (await http.get(f"/threads/{thread_id}/history", params={"limit": 10})).content,
                   (await http.post(f"/threads/{thread_id}/history", json={"limit": 3, "before": before})).content]
        return parsed, raw

    with serve() as running:
        client = get_client(url=running.url, api_key=None)
        thread_id = (await client.threads.create())["thread_id"]
        await client.runs.wait(thread_id, "chatty", input=user("go"))
        history = await client.threads.get_history(thread_id, limit=100)
        await client.http.client.aclose()
        before = history[70]["checkpoint_id"]
        warm = await reads(running.url, thread_id, before)
    with serve() as cold_server:
        cold = await reads(cold_server.url, thread_id, before)
    assert cold == warm
    assert len(warm[0][0]["values"]["messages"]) == 602


async def test_integers_past_64_bits_come_back_exactly(tmp_path):
    """Integers JSON allows but 64 bits do not hold (Python clients send them) are kept exactly: in a thread's and
    a run's metadata, in a message of the state, as the server that ran the run answers and as a second server on
    the same file reads them back. Read with the standard library here: the official client's orjson would itself
    turn them into floats."""
    import json

    from server_agents import AGENTS
    from server_helpers import ThreadServer

    from backchannel.runtime import LocalRuntime
    from backchannel.server import create_app, served

    big, low = 2**70 + 1, -(2**63) - 1
    numbers = {"big": big, "low": low, "max": 2**64 - 1}

    def serve() -> ThreadServer:
        runtime = LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"echo": served(AGENTS["echo"])})
        return ThreadServer(create_app(runtime, heartbeat=0.2, grace=1.0))

    async def answer(http: httpx.AsyncClient, method: str, path: str, **kwargs: object) -> object:
        response = await http.request(method, path, **kwargs)
        assert response.status_code == 200, response.text
        return json.loads(response.content)

    async def reads(http: httpx.AsyncClient, thread_id: str) -> tuple[object, object, object]:
        thread = await answer(http, "GET", f"/threads/{thread_id}")
        state = await answer(http, "GET", f"/threads/{thread_id}/state")
        runs = await answer(http, "GET", f"/threads/{thread_id}/runs")
        return thread["metadata"], state["values"]["messages"][0]["additional_kwargs"], runs[0]["metadata"]

    message = {"role": "user", "content": "hi", "additional_kwargs": numbers}
    with serve() as running:
        async with httpx.AsyncClient(base_url=running.url, timeout=30) as http:
            thread_id = (await answer(http, "POST", "/threads", content=json.dumps({"metadata": numbers}),
                                      headers={"content-type": "application/json"}))["thread_id"]
            body: dict[str, object] = {"assistant_id": "echo", "input": {"messages": [message]}, "metadata": numbers}
            await answer(http, "POST", f"/threads/{thread_id}/runs/wait", content=json.dumps(body),
                         headers={"content-type": "application/json"})
            warm = await reads(http, thread_id)
            body["stream_mode"] = ["values", "updates"]
            async with http.stream("POST", f"/threads/{thread_id}/runs/stream", content=json.dumps(body),
                                   headers={"content-type": "application/json"}) as streamed:
                events = [json.loads(line[5:]) async for line in streamed.aiter_lines() if line.startswith("data:")]
    values = [event for event in events if isinstance(event, dict) and "messages" in event]
    assert values and values[-1]["messages"][2]["additional_kwargs"] == numbers
    with serve() as cold_server:
        async with httpx.AsyncClient(base_url=cold_server.url, timeout=30) as http:
            cold = await reads(http, thread_id)
    for read in (warm, cold):
        thread_metadata, kwargs, run_metadata = read
        assert {k: thread_metadata[k] for k in numbers} == numbers
        assert kwargs == numbers
        assert {k: run_metadata[k] for k in numbers} == numbers
