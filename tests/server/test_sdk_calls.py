"""langgraph_sdk calls as LangGraph answers them: history before a config, select, sorting, cancelled threads,
joining a stream with several modes."""

from __future__ import annotations

import asyncio

from server_helpers import user
from test_server_runs import until_status


async def test_history_before_a_config_as_the_js_sdk_sends_it(client):
    thread = await client.threads.create()
    tid = thread["thread_id"]
    await client.runs.wait(tid, "echo", input=user("one"))
    history = await client.threads.get_history(tid, limit=10)
    newest = history[0]["checkpoint"]["checkpoint_id"]
    for before in (newest, {"checkpoint_id": newest}, {"configurable": {"checkpoint_id": newest}}):
        older = await client.http.post(f"/threads/{tid}/history", json={"limit": 10, "before": before})
        assert [s["checkpoint"]["checkpoint_id"] for s in older] == [
            s["checkpoint"]["checkpoint_id"] for s in history[1:]], before
    config = {"configurable": {"checkpoint_id": history[1]["checkpoint_id"]}}
    state = await client.http.post(f"/threads/{tid}/state/checkpoint", json={"checkpoint": config})
    assert state["checkpoint"]["checkpoint_id"] == history[1]["checkpoint_id"]


async def test_a_cancelled_run_leaves_its_thread_idle_and_not_awaiting_a_person(client):
    cancelled = await client.threads.create(metadata={"case": "cancelled"})
    run = await client.runs.create(cancelled["thread_id"], "glacial", input=user("slowly"))
    await until_status(client, cancelled["thread_id"], run["run_id"], "running")
    await client.runs.cancel(cancelled["thread_id"], run["run_id"], wait=True)
    assert (await client.threads.get(cancelled["thread_id"]))["status"] == "idle"
    waiting = await client.threads.create(metadata={"case": "waiting"})
    await client.runs.wait(waiting["thread_id"], "mailer", input=user("hi"))
    found = await client.threads.search(status="interrupted", limit=1000)
    ids = {t["thread_id"] for t in found}
    assert waiting["thread_id"] in ids and cancelled["thread_id"] not in ids
    # a resume run cancelled before it starts leaves the person's question pending
    blocker = await client.runs.create(waiting["thread_id"], "mailer", command={"update": {"x": 1}},
                                       after_seconds=30)
    await client.runs.cancel(waiting["thread_id"], blocker["run_id"], wait=True)
    assert (await client.threads.get(waiting["thread_id"]))["status"] == "interrupted"


async def test_select_returns_only_the_fields_asked_for(client):
    thread = await client.threads.create(metadata={"select": "me"})
    await client.runs.wait(thread["thread_id"], "echo", input=user("hi"))
    (found,) = await client.threads.search(metadata={"select": "me"}, select=["thread_id", "status"])
    assert found == {"thread_id": thread["thread_id"], "status": "idle"}
    (run,) = await client.runs.list(thread["thread_id"], select=["run_id", "status"])
    assert set(run) == {"run_id", "status"} and run["status"] == "success"
    (assistant,) = await client.assistants.search(graph_id="echo", select=["assistant_id", "name"])
    assert set(assistant) == {"assistant_id", "name"}
    state = await client.threads.get_state(thread["thread_id"], select=["values.messages", "next"])
    assert set(state) == {"values", "next"} and state["values"]["messages"][-1]["content"] == "echo: hi"
    history = await client.threads.get_history(thread["thread_id"], limit=2, select=["checkpoint"])
    assert [set(s) for s in history] == [{"checkpoint"}, {"checkpoint"}]
    refused = await client.http.client.post("/threads/search", json={"select": ["password"]})
    assert refused.status_code == 422 and "password" in refused.json()["detail"]


async def test_sorting_assistants_and_threads_by_state_updated_at(client):
    names = [a["graph_id"] for a in await client.assistants.search(limit=100, sort_by="graph_id", sort_order="asc")]
    assert names == sorted(names) and len(names) > 3
    desc = [a["name"] for a in await client.assistants.search(limit=100, sort_by="name", sort_order="desc")]
    assert desc == sorted(desc, reverse=True)
    older = await client.threads.create(metadata={"sorted": "yes"})
    newer = await client.threads.create(metadata={"sorted": "yes"})
    await client.runs.wait(newer["thread_id"], "echo", input=user("first"))
    await asyncio.sleep(0.01)
    await client.runs.wait(older["thread_id"], "echo", input=user("later"))
    await client.threads.update(newer["thread_id"], metadata={"touched": True})  # metadata is not state
    by_state = await client.threads.search(metadata={"sorted": "yes"}, sort_by="state_updated_at", sort_order="desc")
    assert [t["thread_id"] for t in by_state] == [older["thread_id"], newer["thread_id"]]
    by_update = await client.threads.search(metadata={"sorted": "yes"}, sort_by="updated_at", sort_order="desc")
    assert [t["thread_id"] for t in by_update] == [newer["thread_id"], older["thread_id"]]


async def test_join_stream_with_several_modes_streams_each(client):
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "slow", input=user("hello"), stream_resumable=True)
    modes = {part.event async for part in client.runs.join_stream(
        thread["thread_id"], run["run_id"], stream_mode=["values", "messages-tuple", "updates"])}
    assert {"values", "messages", "updates"} <= modes, modes
