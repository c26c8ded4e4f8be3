"""The app around the routes: health and info, assistants, the API key, bad requests, webhooks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from server_agents import AGENTS
from server_helpers import ThreadServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from backchannel import create_agent
from backchannel.models.base import ChatModel, FinishDelta, TextDelta
from backchannel.runtime import LocalRuntime, assistant_id_for
from backchannel.server import create_app


async def test_ok_info_and_openapi(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.get("/ok")).json() == {"ok": True}
        info = (await http.get("/info")).json()
        document = (await http.get("/openapi.json")).json()
    assert info["version"] and info["flags"]["assistants"] is True
    for path in ("/threads", "/threads/{thread_id}/runs/stream", "/runs/wait", "/store/items",
                 "/assistants/search", "/threads/{thread_id}/history"):
        assert path in document["paths"], path
    run_body = document["paths"]["/threads/{thread_id}/runs"]["post"]["requestBody"]
    assert run_body["content"]["application/json"]["schema"]["$ref"].endswith("/RunCreate")
    assert "multitask_strategy" in document["components"]["schemas"]["RunCreate"]["properties"]


async def test_assistants_are_the_served_graphs(client):
    found = {a["graph_id"]: a for a in await client.assistants.search(limit=100)}
    assert set(found) == set(AGENTS)
    calc = await client.assistants.get(assistant_id_for("calc"))
    assert calc == found["calc"] and calc["assistant_id"] == assistant_id_for("calc")
    assert (await client.assistants.get("calc"))["graph_id"] == "calc"  # a graph id works too
    assert [a["graph_id"] for a in await client.assistants.search(graph_id="echo")] == ["echo"]
    assert await client.assistants.count() == len(AGENTS)
    graph = await client.assistants.get_graph("calc")
    assert {"model", "tools"} <= {n["id"] for n in graph["nodes"]}
    schemas = await client.assistants.get_schemas("calc")
    assert "messages" in schemas["state_schema"]["properties"]
    assert await client.assistants.get_subgraphs("calc") == {}


async def test_an_api_key_guards_every_route_but_ok(tmp_path):
    from langgraph_sdk import get_client

    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, api_key="s3cret")) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            assert (await http.get("/ok")).status_code == 200
            for headers in ({}, {"x-api-key": "wrong"}):
                refused = await http.post("/threads", json={}, headers=headers)
                assert refused.status_code == 401 and "x-api-key" in refused.json()["detail"]
            assert (await http.get("/openapi.json")).status_code == 401
        client = get_client(url=live.url, api_key="s3cret")
        thread = await client.threads.create()
        values = await client.runs.wait(thread["thread_id"], "echo", input="with a key")
        assert values["messages"][-1]["content"] == "echo: with a key"
        await client.http.client.aclose()


@pytest.mark.parametrize("method, path, body, status, says", [
    ("POST", "/threads", b"{not json", 422, "Invalid JSON"),
    ("POST", "/threads", b"[1, 2]", 422, "JSON object"),
    ("POST", "/threads/search", b'{"limit": "many"}', 422, "limit"),
    ("POST", "/runs/wait", b'{"input": "x"}', 422, "assistant_id"),
    ("POST", "/runs/wait", b'{"assistant_id": "echo", "stream_mode": "everything"}', 422, "stream_mode"),
    ("POST", "/runs/wait", b'{"assistant_id": "echo", "input": {"messages": [{"nope": 1}]}}', 422, "messages"),
    ("POST", "/runs/wait", b'{"assistant_id": "nobody"}', 404, "nobody"),
    ("POST", "/runs", b'{"assistant_id": "echo", "webhook": "not a url"}', 422, "webhook"),
    ("GET", "/threads/00000000-0000-0000-0000-00000000dead", b"", 404, "not found"),
    ("GET", "/threads/x/runs?limit=ten", b"", 422, "limit"),
    ("POST", "/threads/x/runs/y/cancel?wait=maybe", b"", 422, "wait"),
    ("GET", "/no/such/route", b"", 404, "Not Found"),
    ("DELETE", "/ok", b"", 405, "Method Not Allowed"),
])
async def test_bad_requests_get_a_typed_error_that_says_what_is_wrong(server, method, path, body, status, says):
    async with httpx.AsyncClient(base_url=server.url) as http:
        response = await http.request(method, path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert says.lower() in detail.lower()
    assert "Traceback" not in response.text


async def test_an_oversized_body_is_413(tmp_path):
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, max_body_bytes=1000)) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            big = json.dumps({"metadata": {"blob": "x" * 5000}})
            response = await http.post("/threads", content=big, headers={"content-type": "application/json"})
            async def chunks():
                for _ in range(3):
                    yield b"x" * 600

            chunked = await http.post("/threads", content=chunks(), headers={"content-type": "application/json"})
            small = await http.post("/threads", json={"metadata": {"ok": True}})
    assert response.status_code == 413 and "limit of 1000 bytes" in response.json()["detail"]
    assert chunked.status_code == 413
    assert small.status_code == 200


async def test_an_unexpected_failure_is_a_500_without_internals(tmp_path):
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})

    async def broken(*args, **kwargs):
        raise RuntimeError("database password is hunter2")

    runtime.threads.get = broken
    with ThreadServer(create_app(runtime)) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            response = await http.get("/threads/anything")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal server error (RuntimeError); see the server log"}


async def test_a_webhook_gets_the_run_when_it_ends(client):
    received: list[dict] = []
    arrived = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def hook(request: Request) -> Response:
        received.append(await request.json())
        loop.call_soon_threadsafe(arrived.set)
        return Response(status_code=204 if len(received) > 1 else 503)  # the first attempt fails: retried

    with ThreadServer(Starlette(routes=[Route("/hook", hook, methods=["POST"])])) as receiver:
        thread = await client.threads.create()
        run = await client.runs.create(thread["thread_id"], "echo", input="call me",
                                       webhook=f"{receiver.url}/hook")
        await client.runs.join(thread["thread_id"], run["run_id"])
        for _ in range(2):
            await asyncio.wait_for(arrived.wait(), 5)
            arrived.clear()
    assert len(received) == 2 and received[0] == received[1]
    payload = received[-1]
    assert payload["run_id"] == run["run_id"] and payload["status"] == "success"
    assert payload["values"]["messages"][-1]["content"] == "echo: call me"


async def test_middleware_added_to_the_app_sees_every_body_a_run_stream_sends(tmp_path):
    # The app's own middleware is passed by a long response's body (it acts on the start only); a user's may
    # want the body (compressing, logging): a run stream's events must go through it like any response's.
    seen: list[bytes] = []

    class BodyRecorder:
        def __init__(self, app):
            self.app = app

        async def __call__(self, scope, receive, send):
            async def recording(message):
                if message["type"] == "http.response.body":
                    seen.append(message.get("body", b""))
                await send(message)

            await self.app(scope, receive, recording)

    app = create_app(LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"chatty": AGENTS["chatty"]}))
    app.add_middleware(BodyRecorder)
    with ThreadServer(app) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            response = await http.post("/runs/stream", json={
                "assistant_id": "chatty", "input": {"messages": [{"role": "user", "content": "hi"}]},
                "stream_mode": ["messages-tuple", "values"]})
    assert response.status_code == 200
    assert response.text.count("event: messages") > 3 and "event: values" in response.text
    assert b"".join(seen).decode() == response.text


class Trickle(ChatModel):
    """Streams 20 tokens, each in a turn of the event loop of its own."""

    async def stream(self, request: Any) -> Any:
        for token in range(20):
            await asyncio.sleep(0.005)
            yield TextDelta(f"t{token} ")
        yield FinishDelta(None, "stop", {}, None)


def _stream_tokens(text: str) -> list[str]:
    return [json.loads(frame.partition("data: ")[2])[0]["content"] for frame in text.split("\r\n\r\n")
            if frame.startswith("event: messages\r\n")]


async def test_a_run_streams_its_tokens_to_the_connection_without_an_asgi_message_each(tmp_path, monkeypatch):
    # A streamed token is the server's most frequent write: it goes to the connection as uvicorn's send would write
    # it (the same chunked bytes), without a message and a coroutine through send for each.
    bodies: list[dict[str, Any]] = []
    send = RequestResponseCycle.send

    async def counted(self: RequestResponseCycle, message: Any) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message)
        await send(self, message)

    monkeypatch.setattr(RequestResponseCycle, "send", counted)
    runtime = LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"trickle": create_agent(Trickle(), name="trickle")})
    with ThreadServer(create_app(runtime)) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            response = await http.post("/runs/stream", json={
                "assistant_id": "trickle", "input": {"messages": [{"role": "user", "content": "go"}]},
                "stream_mode": ["messages-tuple"]})
    assert response.status_code == 200
    assert [t for t in _stream_tokens(response.text) if t] == [f"t{token} " for token in range(20)]
    assert [message.get("more_body", False) for message in bodies] == [False]  # the response's end only


async def test_a_wrapper_around_the_app_sees_every_body_a_run_stream_sends(tmp_path):
    # As middleware added to the app (above), an ASGI app wrapping it gets every body through its send.
    seen: list[bytes] = []
    app = create_app(LocalRuntime(f"sqlite:///{tmp_path}/state.db", {"trickle": create_agent(Trickle(), name="t")}))

    async def wrapper(scope: Any, receive: Any, send: Any) -> None:
        async def recording(message: Any) -> None:
            if message["type"] == "http.response.body":
                seen.append(message.get("body", b""))
            await send(message)

        await app(scope, receive, recording)

    with ThreadServer(wrapper) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            response = await http.post("/runs/stream", json={
                "assistant_id": "trickle", "input": {"messages": [{"role": "user", "content": "go"}]},
                "stream_mode": ["messages-tuple"]})
    assert response.status_code == 200 and len([t for t in _stream_tokens(response.text) if t]) == 20
    assert b"".join(seen).decode() == response.text
