"""Runs over HTTP with the official ``langgraph_sdk`` clients: wait, stream modes, join, cancel, multitask,
interrupts, stateless runs and resumable streams, on a real server with a SQLite file."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError
from langgraph_sdk.schema import Command
from server_helpers import user


async def until_status(client, thread_id: str, run_id: str, *statuses: str, timeout: float = 5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        run = await client.runs.get(thread_id, run_id)
        if run["status"] in statuses:
            return run
        assert time.monotonic() < deadline, f"run stayed {run['status']}, expected {statuses}"
        await asyncio.sleep(0.02)


async def test_wait_returns_the_final_values(client):
    thread = await client.threads.create()
    values = await client.runs.wait(thread["thread_id"], "calc", input=user("2 + 3?"))
    assert [m["type"] for m in values["messages"]] == ["human", "ai", "tool", "ai"]
    assert values["messages"][-1]["content"] == "the answer is 5"
    assert (await client.threads.get(thread["thread_id"]))["status"] == "idle"


def test_the_sync_client_works_too(sync_client):
    thread = sync_client.threads.create(metadata={"client": "sync"})
    values = sync_client.runs.wait(thread["thread_id"], "echo", input=user("hi"))
    assert values["messages"][-1]["content"] == "echo: hi"
    parts = list(sync_client.runs.stream(thread["thread_id"], "echo", input=user("again"), stream_mode="updates"))
    assert parts[0].event == "metadata"
    assert parts[-1].data["model"]["messages"][0]["content"] == "echo: again"
    assert sync_client.threads.search(metadata={"client": "sync"})[0]["thread_id"] == thread["thread_id"]


async def stream(client, assistant: str, text: str, **kwargs) -> list:
    thread = await client.threads.create()
    return [p async for p in client.runs.stream(thread["thread_id"], assistant, input=user(text), **kwargs)]


async def test_stream_starts_with_metadata_then_values(client):
    parts = await stream(client, "calc", "2 + 3?")
    assert parts[0].event == "metadata" and set(parts[0].data) == {"run_id", "attempt"}
    assert {p.event for p in parts[1:]} == {"values"}
    contents = [[m["content"] for m in p.data["messages"]] for p in parts[1:]]
    assert contents[0] == ["2 + 3?"]
    assert contents[-1] == ["2 + 3?", "", "5", "the answer is 5"]


async def test_updates_name_the_node_that_made_them(client):
    parts = await stream(client, "calc", "2 + 3?", stream_mode="updates")
    nodes = [next(iter(p.data)) for p in parts[1:]]
    assert nodes == ["model", "tools", "model"]
    assert parts[2].data["tools"]["messages"][0]["content"] == "5"


async def test_messages_tuple_streams_tokens_with_metadata(client):
    parts = await stream(client, "calc", "2 + 3?", stream_mode="messages-tuple")
    assert {p.event for p in parts[1:]} == {"messages"}
    chunks = [(chunk, meta) for chunk, meta in (p.data for p in parts[1:])]
    text = "".join(c["content"] for c, m in chunks if c["type"] == "AIMessageChunk")
    assert text == "the answer is 5"
    tool_results = [c for c, m in chunks if c["type"] == "tool"]
    assert [c["content"] for c in tool_results] == ["5"]
    assert {m["langgraph_node"] for c, m in chunks} == {"model", "tools"}
    assert all(m["thread_id"] for _, m in chunks)


async def test_messages_mode_sends_metadata_partial_and_complete(client):
    parts = await stream(client, "calc", "2 + 3?", stream_mode="messages")
    events = [p.event for p in parts[1:]]
    assert events[0] == "messages/metadata"
    assert "messages/partial" in events and "messages/complete" in events
    finals = [p.data[0]["content"] for p in parts if p.event == "messages/partial"]
    assert finals[-1] == "the answer is 5"


async def test_custom_events_reach_the_stream(client):
    parts = await stream(client, "reporter", "go", stream_mode="custom")
    assert [p.data for p in parts[1:]] == [{"progress": "half way"}]


@pytest.mark.parametrize("mode, kinds", [
    ("events", {"on_chat_model_start", "on_chat_model_stream", "on_chat_model_end", "on_tool_start", "on_tool_end"}),
    ("debug", {"checkpoint", "task_result"}),
])
async def test_events_and_debug_modes(client, mode, kinds):
    parts = await stream(client, "calc", "2 + 3?", stream_mode=mode)
    assert {p.event for p in parts[1:]} == {mode}
    key = "event" if mode == "events" else "type"
    assert kinds <= {p.data[key] for p in parts[1:]}


async def test_tasks_and_checkpoints_modes(client):
    parts = await stream(client, "calc", "2 + 3?", stream_mode=["tasks", "checkpoints"])
    tasks = [p.data for p in parts if p.event == "tasks"]
    assert {t["name"] for t in tasks} == {"model", "tools"}
    checkpoints = [p.data for p in parts if p.event == "checkpoints"]
    assert checkpoints and all(c["config"]["configurable"]["checkpoint_id"] for c in checkpoints)


async def test_several_modes_at_once(client):
    parts = await stream(client, "calc", "2 + 3?", stream_mode=["values", "updates", "messages-tuple"])
    assert {p.event for p in parts} == {"metadata", "values", "updates", "messages"}


async def test_subagents_stream_under_their_namespace(client):
    parts = await stream(client, "delegator", "look it up", stream_mode=["updates"], stream_subgraphs=True)
    nested = [p for p in parts if p.event.startswith("updates|")]
    assert nested, [p.event for p in parts]
    assert all(p.event.split("|")[1].startswith("tools:call_") for p in nested)  # as useStream knows subagents
    top = [p for p in parts if p.event == "updates"]
    assert top[-1].data["model"]["messages"][0]["content"] == "the helper said: helped with look it up"


async def test_join_and_join_stream_follow_a_background_run(client):
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "slow", input=user("patience"), stream_mode="updates")
    parts = [p async for p in client.runs.join_stream(thread["thread_id"], run["run_id"])]
    assert parts[-1].data["model"]["messages"][0]["content"] == "echo: patience"
    values = await client.runs.join(thread["thread_id"], run["run_id"])
    assert values["messages"][-1]["content"] == "echo: patience"
    assert (await client.runs.get(thread["thread_id"], run["run_id"]))["status"] == "success"
    listed = await client.runs.list(thread["thread_id"])
    assert [r["run_id"] for r in listed] == [run["run_id"]]


async def test_cancel_stops_a_run_mid_model_call(client):
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "slow", input=user("never mind"))
    await until_status(client, thread["thread_id"], run["run_id"], "running")
    started = time.monotonic()
    await client.runs.cancel(thread["thread_id"], run["run_id"], wait=True)
    assert time.monotonic() - started < 0.35  # sooner than the model call would have ended
    assert (await client.runs.get(thread["thread_id"], run["run_id"]))["status"] == "interrupted"
    assert (await client.threads.get(thread["thread_id"]))["status"] in ("idle", "interrupted")
    with pytest.raises(NotFoundError):  # it is no longer active
        await client.runs.cancel(thread["thread_id"], run["run_id"])


async def test_reject_answers_409_while_the_thread_is_busy(client):
    thread = await client.threads.create()
    first = await client.runs.create(thread["thread_id"], "slow", input=user("one"))
    with pytest.raises(ConflictError):
        await client.runs.create(thread["thread_id"], "slow", input=user("two"), multitask_strategy="reject")
    assert (await client.runs.join(thread["thread_id"], first["run_id"]))["messages"][-1]["content"] == "echo: one"


async def test_enqueue_runs_one_after_the_other(client):
    thread = await client.threads.create()
    first = await client.runs.create(thread["thread_id"], "slow", input=user("one"))
    second = await client.runs.create(thread["thread_id"], "slow", input=user("two"), multitask_strategy="enqueue")
    assert second["status"] == "pending"
    values = await client.runs.join(thread["thread_id"], second["run_id"])
    assert [m["content"] for m in values["messages"]] == ["one", "echo: one", "two", "echo: two"]
    assert (await client.runs.get(thread["thread_id"], first["run_id"]))["status"] == "success"


@pytest.mark.parametrize("strategy", ["interrupt", "rollback"])
async def test_interrupt_and_rollback_replace_the_running_run(client, strategy):
    thread = await client.threads.create()
    first = await client.runs.create(thread["thread_id"], "slow", input=user("one"))
    await until_status(client, thread["thread_id"], first["run_id"], "running")
    second = await client.runs.create(thread["thread_id"], "slow", input=user("two"), multitask_strategy=strategy)
    values = await client.runs.join(thread["thread_id"], second["run_id"])
    assert values["messages"][-1]["content"] == "echo: two"
    if strategy == "interrupt":
        assert (await client.runs.get(thread["thread_id"], first["run_id"]))["status"] == "interrupted"
        assert [m["content"] for m in values["messages"]][:1] == ["one"]  # its input stays
    else:
        with pytest.raises(NotFoundError):
            await client.runs.get(thread["thread_id"], first["run_id"])
        assert "one" not in [m["content"] for m in values["messages"]]


async def test_interrupt_then_resume_with_a_command(client):
    thread = await client.threads.create()
    values = await client.runs.wait(thread["thread_id"], "mailer", input=user("hello Ada"))
    (pending,) = values["__interrupt__"]
    request = pending["value"]["action_requests"][0]
    assert request["name"] == "send_email" and request["args"]["to"] == "ada@example.com"
    state = await client.threads.get(thread["thread_id"])
    assert state["status"] == "interrupted"
    with pytest.raises(httpx.HTTPStatusError) as refused:  # two decisions for one action
        await client.runs.wait(thread["thread_id"], "mailer", command=Command(resume={"decisions": [
            {"type": "approve"}, {"type": "approve"}]}))
    assert refused.value.response.status_code == 422
    assert "does not match" in refused.value.response.json()["detail"]
    assert (await client.threads.get(thread["thread_id"]))["status"] == "interrupted"
    values = await client.runs.wait(thread["thread_id"], "mailer",
                                    command=Command(resume={"decisions": [{"type": "approve"}]}))
    assert values["messages"][-1]["content"] == "done: sent to ada@example.com: hello Ada"
    assert (await client.threads.get(thread["thread_id"]))["status"] == "idle"


async def test_stateless_runs_leave_no_thread(client):
    before = await client.threads.count()
    values = await client.runs.wait(None, "echo", input=user("no thread"))
    assert values["messages"][-1]["content"] == "echo: no thread"
    parts = [p async for p in client.runs.stream(None, "echo", input=user("streamed"), stream_mode="updates")]
    assert parts[-1].data["model"]["messages"][0]["content"] == "echo: streamed"
    assert await client.threads.count() == before  # both threads went before their runs' ends were sent
    run = await client.runs.create(None, "echo", input=user("background"))
    assert run["status"] == "pending"
    assert await client.threads.count() <= before + 1  # the background one may not have finished yet


async def test_a_resumable_stream_resumes_after_the_last_event_id(client):
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], "calc", input=user("2 + 3?"), stream_resumable=True,
                                   stream_mode=["values", "updates"])
    await client.runs.join(thread["thread_id"], run["run_id"])
    everything = [p async for p in client.runs.join_stream(thread["thread_id"], run["run_id"], last_event_id="0")]
    assert len(everything) > 4 and all(p.id for p in everything)
    cut = everything[2].id
    rest = [p async for p in client.runs.join_stream(thread["thread_id"], run["run_id"], last_event_id=cut)]
    assert [(p.event, p.id) for p in rest] == [(p.event, p.id) for p in everything[3:]]


async def test_stream_responses_carry_location_headers_and_heartbeats(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        thread = (await http.post("/threads", json={})).json()
        async with http.stream("POST", f"/threads/{thread['thread_id']}/runs/stream",
                               json={"assistant_id": "slow", "input": user("hi"), "stream_mode": "updates"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            run_url = r.headers["content-location"]
            assert r.headers["location"] == f"{run_url}/stream"
            body = (await r.aread()).decode()
    assert body.startswith("event: metadata\r\ndata: ")
    assert ": heartbeat" in body  # the server under test beats every 0.2 s; the model call takes 0.4 s
    assert "event: updates\r\ndata: " in body
    async with httpx.AsyncClient(base_url=server.url) as http:
        run = (await http.get(run_url)).json()
    assert run["status"] == "success"


async def test_a_wait_for_a_slow_run_beats_with_newlines_before_its_values(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        thread = (await http.post("/threads", json={})).json()
        response = await http.post(f"/threads/{thread['thread_id']}/runs/wait",
                                   json={"assistant_id": "slow", "input": user("hi")})
    assert response.headers["content-type"].startswith("application/json")
    assert response.content.startswith(b"\n")  # the server under test beats every 0.2 s; the model call takes 0.4 s
    assert response.json()["messages"][-1]["content"] == "echo: hi"  # (leading whitespace is valid JSON)


async def test_disconnecting_cancels_only_when_asked(server, client):
    thread = await client.threads.create()
    runs = {}
    for mode in ("cancel", "continue"):
        async with httpx.AsyncClient(base_url=server.url) as http, http.stream(
                "POST", f"/threads/{thread['thread_id']}/runs/stream",
                json={"assistant_id": "slow", "input": user(mode), "on_disconnect": mode}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    runs[mode] = __import__("json").loads(line[6:])["run_id"]
                    break
        if mode == "cancel":
            await until_status(client, thread["thread_id"], runs[mode], "interrupted", timeout=2)
    assert (await client.runs.join(thread["thread_id"], runs["continue"]))["messages"][-1]["content"] == \
        "echo: continue"
    assert (await client.runs.get(thread["thread_id"], runs["continue"]))["status"] == "success"


async def test_unknown_thread_and_assistant_are_404(client):
    thread = await client.threads.create()
    with pytest.raises(NotFoundError):
        await client.runs.create("00000000-0000-0000-0000-000000000000", "echo", input=user("x"))
    with pytest.raises(NotFoundError):
        await client.runs.create(thread["thread_id"], "no-such-agent", input=user("x"))
    with pytest.raises(NotFoundError):
        await client.runs.get(thread["thread_id"], "00000000-0000-0000-0000-000000000000")
    run = await client.runs.create("11111111-0000-0000-0000-000000000000", "echo", input=user("x"),
                                   if_not_exists="create")
    assert run["thread_id"] == "11111111-0000-0000-0000-000000000000"


async def test_a_supervisors_stream_says_once_when_every_background_task_has_reported(tmp_path):
    """Over the server too: one ``drained`` event in the ``async_tasks`` mode, after the last result is heard."""
    from langgraph_sdk import get_client
    from server_helpers import ThreadServer

    from backchannel.demo import DEFAULT_PROMPT, build_demo
    from backchannel.runtime import LocalRuntime
    from backchannel.server import create_app, served

    runtime = LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"supervisor": served(build_demo(latency=0.02))})
    with ThreadServer(create_app(runtime)) as live:
        client = get_client(url=live.url, api_key=None)
        try:
            thread = await client.threads.create()
            parts = [(p.event, p.data) async for p in client.runs.stream(
                thread["thread_id"], "supervisor", input=user(DEFAULT_PROMPT), stream_mode=["async_tasks"])]
        finally:
            await client.http.client.aclose()
    tasks = [data for event, data in parts if event == "async_tasks"]
    drained = [i for i, data in enumerate(tasks) if data.get("event") == "drained"]
    assert len(drained) == 1
    statuses = tasks[drained[0]]["tasks"]
    assert len(statuses) == 3 and set(statuses.values()) == {"success"}
    assert {t["task_id"] for t in tasks[:drained[0]] if t.get("status") == "success"} == set(statuses)


async def test_a_batch_queues_stateless_runs_and_returns_them_in_order(client):
    runs = await client.runs.create_batch([
        {"assistant_id": "echo", "input": user("first"), "on_completion": "keep"},
        {"assistant_id": "calc", "input": user("2 + 3?"), "on_completion": "keep", "metadata": {"batch": "yes"}},
        {"assistant_id": "echo", "input": user("gone"), "thread_id": None},  # the SDK's RunCreate has one
    ])
    assert [r["status"] for r in runs] == ["pending"] * 3
    assert len({r["thread_id"] for r in runs}) == 3  # each on a thread of its own
    assert runs[1]["metadata"]["batch"] == "yes"
    first = await client.runs.join(runs[0]["thread_id"], runs[0]["run_id"])
    second = await client.runs.join(runs[1]["thread_id"], runs[1]["run_id"])
    assert first["messages"][-1]["content"] == "echo: first"
    assert second["messages"][-1]["content"] == "the answer is 5"


@pytest.mark.parametrize(("bad", "status", "says"), [
    ({"assistant_id": "nobody"}, 404, "payloads[1]"),
    ({"assistant_id": "echo", "multitask_strategy": "sideways"}, 422, "1.multitask_strategy"),
    ({"assistant_id": "echo", "after_seconds": -1}, 422, "1.after_seconds"),
])
async def test_a_batch_with_a_bad_run_queues_none(client, bad, status, says):
    before = await client.threads.count()
    with pytest.raises(httpx.HTTPStatusError) as refused:
        await client.runs.create_batch([{"assistant_id": "echo", "input": user("fine"), "on_completion": "keep"},
                                        bad])
    assert refused.value.response.status_code == status
    assert says in refused.value.response.json()["detail"]
    assert await client.threads.count() == before
    with pytest.raises(httpx.HTTPStatusError) as empty:
        await client.runs.create_batch([])
    assert empty.value.response.status_code == 422


async def test_cancel_many_cancels_a_threads_runs_by_id(client):
    thread = (await client.threads.create())["thread_id"]
    running = await client.runs.create(thread, "glacial", input=user("one"))
    queued = await client.runs.create(thread, "echo", input=user("two"), multitask_strategy="enqueue")
    await until_status(client, thread, running["run_id"], "running")
    await client.runs.cancel_many(thread_id=thread, run_ids=[running["run_id"], queued["run_id"]])
    await until_status(client, thread, running["run_id"], "interrupted")
    assert (await client.runs.get(thread, queued["run_id"]))["status"] == "interrupted"
    assert (await client.threads.get(thread))["status"] == "idle"
    with pytest.raises(NotFoundError):  # no run of that thread has this id
        await client.runs.cancel_many(thread_id=thread, run_ids=["00000000-0000-0000-0000-000000000000"])


async def test_cancel_many_by_status_cancels_only_runs_of_that_status(client):
    thread = (await client.threads.create())["thread_id"]
    running = await client.runs.create(thread, "glacial", input=user("one"))
    await until_status(client, thread, running["run_id"], "running")
    queued = await client.runs.create(thread, "echo", input=user("two"), multitask_strategy="enqueue")
    await client.runs.cancel_many(status="pending", action="rollback")
    with pytest.raises(NotFoundError):  # rolled back: gone
        await client.runs.get(thread, queued["run_id"])
    assert (await client.runs.get(thread, running["run_id"]))["status"] == "running"
    await client.runs.cancel_many(status="running")
    await until_status(client, thread, running["run_id"], "interrupted")
    with pytest.raises(httpx.HTTPStatusError) as both:
        await client.runs.cancel_many(thread_id=thread, run_ids=[running["run_id"]], status="all")
    assert both.value.response.status_code == 422
