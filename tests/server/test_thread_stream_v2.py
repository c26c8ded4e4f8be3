"""The v2 thread stream (``POST /threads/{id}/commands``, ``POST /threads/{id}/stream/events`` and its
WebSocket), driven by the clients that speak it: ``langgraph_sdk``'s ``client.threads.stream`` (SSE and
WebSocket) and LangGraph's ``RemoteGraph.stream_events(version="v3")``; the JS SDK's is in sdk_calls.mjs."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from langgraph.pregel.remote import RemoteGraph
from langgraph.types import Command
from langgraph_sdk import get_client
from server_agents import AGENTS
from server_helpers import ThreadServer, user

from backchannel.runtime import LocalRuntime
from backchannel.server import create_app, served

APPROVE = {"decisions": [{"type": "approve"}]}


async def within(awaitable, seconds: float = 20.0):
    return await asyncio.wait_for(awaitable, seconds)


@pytest.mark.parametrize("transport", ["sse", "websocket"])
async def test_a_run_started_on_a_new_thread_streams_its_values_messages_and_tool_calls(client, transport):
    async with client.threads.stream(assistant_id="calc", transport=transport) as thread:
        started = await thread.run.start(input=user("add them"))
        tool_calls = [call async for call in thread.tool_calls]
        output = await within(thread.output)
    assert started["run_id"]
    assert [(c.name, c.input) for c in tool_calls] == [("add", {"a": 2, "b": 3})]
    assert (await tool_calls[0].output)["content"] == "5"
    assert output["messages"][-1]["content"] == "the answer is 5"
    run = await client.runs.get(thread.thread_id, started["run_id"])  # the thread was made by run.start
    assert run["status"] == "success" and run["kwargs"]["stream_resumable"]


async def test_messages_stream_as_content_blocks_and_values_as_states(client):
    async with client.threads.stream(assistant_id="echo") as thread:
        await thread.run.start(input=user("hello there"))
        states = [state async for state in thread.values]
    async with client.threads.stream(thread.thread_id, assistant_id="echo") as again:
        await again.run.start(input=user("and again"))
        streams = [message async for message in again.messages]
        texts = [await message.text for message in streams]
    reply = states[-1]["messages"][-1]
    assert (reply["type"], reply["content"], reply["name"]) == ("ai", "echo: hello there", "echo")
    assert "additional_kwargs" not in reply  # the protocol's message shape
    assert texts == ["echo: and again"]  # the new run's reply only, not the thread's earlier one


async def test_an_interrupt_is_asked_on_the_stream_and_answered_with_respond(client):
    async with client.threads.stream(assistant_id="mailer") as thread:
        await thread.run.start(input=user("hi Ada"))
        [_ async for _ in thread.values]  # until the run pauses
        assert thread.interrupted
        [asked] = thread.interrupts
        assert asked["value"]["action_requests"][0]["args"] == {"to": "ada@example.com", "body": "hi Ada"}
        await thread.run.respond(APPROVE)
        output = await within(thread.output)
    assert output["messages"][-1]["content"] == "done: sent to ada@example.com: hi Ada"
    assert (await client.threads.get(thread.thread_id))["status"] == "idle"


async def test_a_subagent_is_a_subgraph_with_its_own_messages_and_tree(client):
    async with client.threads.stream(assistant_id="delegator") as thread:
        await thread.run.start(input=user("a job"))
        [subagent] = [handle async for handle in thread.subgraphs]
        texts = [await message.text async for message in _messages(subagent)]
        output = await within(thread.output)
        tree = await thread._send_command("agent.getTree", {})
    call_id = output["messages"][1]["tool_calls"][0]["id"]
    assert subagent.path == (f"tools:{call_id}",) and subagent.trigger_call_id == call_id
    assert subagent.status == "completed"
    assert texts == ["helped with a job"]
    assert tree["tree"]["status"] == "completed" and tree["tree"]["graph_name"] == "delegator"
    assert tree["tree"]["children"] == [{"namespace": [f"tools:{call_id}"], "status": "completed",
                                         "graph_name": "helper"}]


async def _messages(handle):
    for message in [m async for m in handle.messages]:
        yield message


async def test_remote_graph_stream_events_v3_with_an_interrupt_and_a_resume(server):
    graph = RemoteGraph("slow_mailer", url=server.url)  # (see slow_mailer: the run must outlast the subscribing)
    config = {"configurable": {"thread_id": (await get_client(url=server.url).threads.create())["thread_id"]}}
    async with await graph.astream_events(user("to Ada"), config, version="v3") as run:
        [_ async for _ in run.values]
        assert await run.interrupted()
        assert len(await run.interrupts()) == 1
    async with await graph.astream_events(Command(resume=APPROVE), config, version="v3") as run:
        output = await within(run.output())
    assert output["messages"][-1]["content"] == "done: sent to ada@example.com: to Ada"


async def test_remote_graph_turns_on_one_thread_each_get_their_own_output(server):
    """A stream opened on a thread that ran before must not take the earlier run's end for the new run's."""
    graph = RemoteGraph("slow", url=server.url)
    config = {"configurable": {"thread_id": (await get_client(url=server.url).threads.create())["thread_id"]}}
    for turn in ("one", "two", "three"):
        async with await graph.astream_events(user(turn), config, version="v3") as run:
            output = await within(run.output())
        assert output["messages"][-1]["content"] == f"echo: {turn}"


def test_remote_graph_sync_stream_events_v3(server):
    graph = RemoteGraph("calc", url=server.url)
    with graph.stream_events(user("add"), version="v3") as run:
        methods = {event["method"] for event in run}
        output = run.output
    assert {"lifecycle", "values", "messages", "tools"} <= methods
    assert output["messages"][-1]["content"] == "the answer is 5"


# -- the protocol itself ---------------------------------------------------------------------------------------


async def _streams_open(http: httpx.AsyncClient, count: int) -> None:
    """Wait until the server has ``count`` event streams open (its /metrics say so)."""
    for _ in range(400):
        metrics = (await http.get("/metrics")).text
        if f"backchannel_active_streams {count}" in metrics:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server never had {count} streams open")


def run_ended(event: dict) -> bool:
    return (event["method"] == "lifecycle" and not event["params"]["namespace"]
            and event["params"]["data"]["event"] in ("completed", "failed", "interrupted"))


async def read_events(http: httpx.AsyncClient, thread_id: str, body: dict, count: int | None = None) -> list[dict]:
    """The stream's events: ``count`` of them, or (without) up to the end of a run."""
    events: list[dict] = []
    async with http.stream("POST", f"/threads/{thread_id}/stream/events", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        async for line in answer.aiter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))  # not orjson: it reads integers past 64 bits as floats
                if len(events) == count or (count is None and run_ended(events[-1])):
                    return events
    return events


async def command(http: httpx.AsyncClient, thread_id: str, method: str, **params) -> dict:
    answer = await http.post(f"/threads/{thread_id}/commands", json={"id": 1, "method": method, "params": params})
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_events_are_numbered_once_for_every_subscriber_and_since_replays_the_rest(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        started = await command(http, tid, "run.start", assistant_id="calc", input=user("add"))
        assert started["type"] == "success" and started["meta"]["applied_through_seq"] >= 0
        run_id = started["result"]["run_id"]
        everything = ["values", "updates", "messages", "tools", "lifecycle", "input", "tasks", "checkpoints"]
        first = await within(read_events(http, tid, {"channels": everything}))
        lifecycles = [e for e in first if e["method"] == "lifecycle" and not e["params"]["namespace"]]
        assert lifecycles[0]["params"]["data"] == {"event": "running", "graph_name": "calc"}
        seqs = [e["seq"] for e in first]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert all(e["event_id"].startswith(f"{run_id}:") for e in first)
        # since: a second connection gets exactly the events after it, with the same numbers and ids
        later = await within(read_events(http, tid, {"channels": everything, "since": seqs[9]}, 5))
        assert [(e["seq"], e["event_id"]) for e in later] == [(e["seq"], e["event_id"]) for e in first[10:15]]
        # a filter: only the tools channel at the root
        tools = await within(read_events(http, tid, {"channels": ["tools"], "namespaces": [[]], "depth": 0,
                                                     "since": 0}, 2))
        assert [e["params"]["data"]["event"] for e in tools] == ["tool-started", "tool-finished"]


async def test_the_run_ends_with_a_terminal_lifecycle_after_its_last_event(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        await command(http, tid, "run.start", assistant_id="echo", input=user("hi"))
        events = await within(read_events(http, tid, {"channels": ["lifecycle", "values"]}))
    assert [(e["method"], e["params"]["data"].get("event")) for e in events] == [
        ("lifecycle", "running"), ("values", None), ("values", None), ("lifecycle", "completed")]


async def test_integers_past_64_bits_in_a_command_are_kept_exactly(server):
    numbers = {"big": 2**70 + 1, "low": -(2**63) - 1}
    message = {"role": "user", "content": "hi", "additional_kwargs": numbers}
    body = {"id": 1, "method": "run.start", "params": {"assistant_id": "echo", "input": {"messages": [message]}}}
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        answer = await http.post(f"/threads/{tid}/commands", content=json.dumps(body),
                                 headers={"content-type": "application/json"})
        assert answer.status_code == 200 and answer.json()["type"] == "success", answer.text
        events = await within(read_events(http, tid, {"channels": ["lifecycle", "values"]}))
        state = json.loads((await http.get(f"/threads/{tid}/state")).content)
    assert events[-1]["params"]["data"]["event"] == "completed"
    assert state["values"]["messages"][0]["additional_kwargs"] == numbers


async def test_bad_commands_and_streams_are_refused_clearly(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
        tid = (await http.post("/threads", json={})).json()["thread_id"]
        assert (await http.post(f"/threads/{tid}/commands", json={"method": "run.start"})).status_code == 422
        unknown = await command(http, tid, "run.explode")
        assert unknown["type"] == "error" and unknown["error"] == "unknown_command"
        no_assistant = await command(http, tid, "run.start", input=user("x"))
        assert no_assistant["error"] == "invalid_argument" and "assistant_id" in no_assistant["message"]
        missing = await command(http, tid, "run.start", assistant_id="nobody", input=user("x"))
        assert missing["error"] == "invalid_argument" and "nobody" in missing["message"]
        wrong = await command(http, tid, "input.respond", interrupt_id="not-one", response="yes")
        assert wrong["error"] == "no_such_interrupt"
        tree = await command(http, tid, "agent.getTree")
        assert tree["error"] == "no_such_run"
        gone = await http.post("/threads/not-a-thread/stream/events", json={"channels": ["values"]})
        assert gone.status_code == 404
        bad = await http.post(f"/threads/{tid}/stream/events", json={"channels": ["values", "everything"]})
        assert bad.status_code == 422 and "everything" in bad.json()["detail"]


async def test_the_websocket_needs_the_api_key_when_the_server_has_one(tmp_path):
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {"echo": served(AGENTS["echo"])})
    with ThreadServer(create_app(runtime, api_key="sesame")) as live:
        refused = get_client(url=live.url, api_key="wrong")
        thread_id = (await get_client(url=live.url, api_key="sesame").threads.create())["thread_id"]
        async with refused.threads.stream(thread_id, assistant_id="echo", transport="websocket") as thread:
            with pytest.raises(Exception):  # noqa: B017 - the handshake is refused (403), then run.start (401)
                await thread.run.start(input=user("hi"))
        client = get_client(url=live.url, api_key="sesame")
        # langgraph_sdk puts on the WebSocket's handshake only the headers given to stream(), not the client's
        async with client.threads.stream(thread_id, assistant_id="echo", transport="websocket",
                                         headers={"x-api-key": "sesame"}) as thread:
            await thread.run.start(input=user("hi"))
            output = await within(thread.output)
        assert output["messages"][-1]["content"] == "echo: hi"


async def test_followers_on_one_server_see_the_runs_made_on_another(postgres_url):
    """Two servers on one Postgres database: a thread followed on the first (the v1 thread stream and the
    v2 event stream) shows a run made on the second, live."""
    first = LocalRuntime(postgres_url, {"echo": served(AGENTS["echo"])})
    second = LocalRuntime(postgres_url, {"echo": served(AGENTS["echo"])})
    with ThreadServer(create_app(first)) as one, ThreadServer(create_app(second)) as two:
        async with httpx.AsyncClient(base_url=one.url, timeout=30) as http:
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            v1_parts: list = []

            async def follow_v1() -> None:
                async for part in await get_client(url=one.url).threads.join_stream(tid):
                    v1_parts.append(part)
                    if part.event == "metadata" and part.data.get("status") == "run_done":
                        return

            v1 = asyncio.create_task(follow_v1())
            v2 = asyncio.create_task(read_events(http, tid, {"channels": ["lifecycle", "values"]}))
            await _streams_open(http, 2)  # both followers are in (however loaded the machine)
            await asyncio.sleep(0.2)
            run = await get_client(url=two.url).runs.create(tid, "echo", input=user("from the other server"))
            events = await within(v2)
            await within(v1)
    assert [p.data["run_id"] for p in v1_parts if p.event == "metadata"] == [run["run_id"]] * 2
    assert any(p.event == "values" and p.data["messages"][-1]["content"] == "echo: from the other server"
               for p in v1_parts)
    assert events[0]["event_id"].startswith(run["run_id"])
    assert events[-2]["params"]["data"]["messages"][-1]["content"] == "echo: from the other server"
    assert events[-1]["params"]["data"]["event"] == "completed"
