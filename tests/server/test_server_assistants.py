"""Assistants over HTTP (issue 17.9), with the official Python SDK and RemoteRuntime: create, update (versions),
set_latest, search with sort_by and pagination, count, delete, subgraphs; runs of a created assistant."""

from __future__ import annotations

import uuid

import httpx
import pytest
from server_helpers import ThreadServer, user

from backchannel import ScriptedModel, ToolRuntime, create_agent, tool
from backchannel.runtime import LocalRuntime, assistant_id_for
from backchannel.runtime.remote import RemoteRuntime
from backchannel.server import create_app


@tool
def show_context(runtime: ToolRuntime) -> str:
    """Say what the run's context is."""
    return repr(sorted((runtime.context or {}).items()))


def _reply(request):
    if request.messages[-1].type == "tool":
        return f"context: {request.messages[-1].content}"
    return {"tool_calls": [{"name": "show_context", "args": {}, "id": f"call_{len(request.messages)}"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """This module's own server (conftest's ``client`` talks to it): assistants made here stay out of the others'."""
    db = tmp_path_factory.mktemp("assistants") / "state.db"
    agents = {"teller": create_agent(ScriptedModel([_reply], loop=True), [show_context], name="teller"),
              "plain": create_agent(ScriptedModel(["plain"], loop=True), name="plain")}
    with ThreadServer(create_app(LocalRuntime(f"sqlite:///{db}", agents))) as live:
        yield live

async def _answer(client, assistant_id, **options):
    out = await client.runs.wait(None, assistant_id, input=user("go"), **options)
    return out["messages"][-1]["content"]


async def test_an_assistant_made_changed_and_set_back_with_the_python_sdk(client):
    made = await client.assistants.create("teller", context={"tone": "dry"}, metadata={"team": "a"}, name="Dry",
                                          description="answers dryly")
    aid = made["assistant_id"]
    assert (made["graph_id"], made["version"], made["name"], made["description"]) == ("teller", 1, "Dry",
                                                                                      "answers dryly")
    assert made["config"] == {"configurable": {"tone": "dry"}} and made["context"] == {"tone": "dry"}
    assert await client.assistants.get(aid) == made
    assert await _answer(client, aid) == "context: [('tone', 'dry')]"
    assert await _answer(client, aid, context={"lang": "fr"}) == "context: [('lang', 'fr'), ('tone', 'dry')]"
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], aid, input=user("x"))
    assert run["assistant_id"] == aid
    await client.runs.join(thread["thread_id"], run["run_id"])
    assert (await client.threads.get(thread["thread_id"]))["metadata"]["assistant_id"] == aid

    second = await client.assistants.update(aid, context={"tone": "warm"}, metadata={"owner": "ana"})
    assert (second["version"], second["context"], second["metadata"]) == (2, {"tone": "warm"},
                                                                           {"team": "a", "owner": "ana"})
    assert await _answer(client, aid) == "context: [('tone', 'warm')]"
    versions = await client.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [2, 1]
    assert "updated_at" not in versions[0] and versions[1]["context"] == {"tone": "dry"}
    assert [v["version"] for v in await client.assistants.get_versions(aid, metadata={"owner": "ana"})] == [2]
    back = await client.assistants.set_latest(aid, 1)
    assert (back["version"], back["context"]) == (1, {"tone": "dry"})
    assert await _answer(client, aid) == "context: [('tone', 'dry')]"
    # its graph's schemas and loop; no subgraphs, under any namespace
    assert (await client.assistants.get_schemas(aid))["graph_id"] == "teller"
    assert any(n["id"] == "tools" for n in (await client.assistants.get_graph(aid))["nodes"])
    assert await client.assistants.get_subgraphs(aid) == {}
    assert await client.assistants.get_subgraphs(aid, namespace="tools", recurse=True) == {}

    await client.assistants.delete(aid)
    with pytest.raises(httpx.HTTPStatusError) as gone:
        await client.assistants.get(aid)
    assert gone.value.response.status_code == 404
    with pytest.raises(httpx.HTTPStatusError) as no_run:
        await client.runs.create(thread["thread_id"], aid, input=user("x"))
    assert no_run.value.response.status_code == 404


async def test_search_sorts_pages_and_counts(client):
    names = ["s-beta", "s-Alpha", "s-gamma"]
    made = [await client.assistants.create("plain", name=n, metadata={"suite": "search"}) for n in names]
    try:
        found = await client.assistants.search(metadata={"suite": "search"}, sort_by="name", sort_order="asc")
        assert [a["name"] for a in found] == ["s-Alpha", "s-beta", "s-gamma"]
        page = await client.assistants.search(metadata={"suite": "search"}, sort_by="name", limit=2,
                                              response_format="object")
        assert [a["name"] for a in page["assistants"]] == ["s-gamma", "s-beta"] and page["next"] == "2"
        last = await client.assistants.search(metadata={"suite": "search"}, sort_by="name", limit=2, offset=2,
                                              response_format="object")
        assert [a["name"] for a in last["assistants"]] == ["s-Alpha"] and last["next"] is None
        assert await client.assistants.count(metadata={"suite": "search"}) == 3
        assert await client.assistants.count(name="S-A", metadata={"suite": "search"}) == 1
        assert {a["graph_id"] for a in await client.assistants.search(graph_id="plain", limit=100)} == {"plain"}
        assert [set(a) for a in await client.assistants.search(metadata={"suite": "search"}, limit=1,
                                                               select=["assistant_id", "name"])] == [
            {"assistant_id", "name"}]
    finally:
        for assistant in made:
            await client.assistants.delete(assistant["assistant_id"])


async def test_refusals_have_langgraphs_statuses(server, client):
    async with httpx.AsyncClient(base_url=server.url) as http:
        assert (await http.post("/assistants", json={"graph_id": "nope"})).status_code == 404
        assert (await http.post("/assistants", json={"graph_id": "plain", "assistant_id": "x"})).status_code == 422
        assert (await http.post("/assistants", json={})).status_code == 422
        fixed = str(uuid.uuid4())
        assert (await http.post("/assistants", json={"graph_id": "plain", "assistant_id": fixed})).status_code == 200
        assert (await http.post("/assistants", json={"graph_id": "plain", "assistant_id": fixed})).status_code == 409
        kept = await http.post("/assistants", json={"graph_id": "plain", "assistant_id": fixed, "name": "other",
                                                    "if_exists": "do_nothing"})
        assert kept.status_code == 200 and kept.json()["name"] == "Untitled"
        assert (await http.post(f"/assistants/{fixed}/latest", json={"version": 7})).status_code == 404
        assert (await http.post(f"/assistants/{fixed}/latest", json={})).status_code == 422
        assert (await http.patch(f"/assistants/{fixed}", json={"graph_id": "nope"})).status_code == 404
        both = {"config": {"configurable": {"a": 1}}, "context": {"a": 2}}
        assert (await http.patch(f"/assistants/{fixed}", json=both)).status_code == 422
        assert (await http.delete(f"/assistants/{assistant_id_for('plain')}")).status_code == 409
        assert (await http.delete(f"/assistants/{fixed}?delete_threads=true")).status_code == 204
        assert (await http.delete(f"/assistants/{fixed}")).status_code == 404
        assert (await http.post(f"/assistants/{fixed}/versions", json={})).status_code == 404
        document = (await http.get("/openapi.json")).json()
    for path, method in (("/assistants", "post"), ("/assistants/{assistant_id}", "patch"),
                         ("/assistants/{assistant_id}", "delete"), ("/assistants/{assistant_id}/versions", "post"),
                         ("/assistants/{assistant_id}/latest", "post"),
                         ("/assistants/{assistant_id}/subgraphs/{namespace}", "get")):
        assert method in document["paths"][path], (path, method)


async def test_remote_runtime_speaks_the_same_assistants(server):
    async with RemoteRuntime(server.url, api_key=None) as remote:
        made = await remote.assistants.create("teller", context={"tone": "remote"}, name="Remote")
        aid = made["assistant_id"]
        assert (await remote.assistants.update(aid, name="Remote 2"))["version"] == 2
        assert [v["version"] for v in await remote.assistants.get_versions(aid)] == [2, 1]
        assert (await remote.assistants.set_latest(aid, 1))["name"] == "Remote"
        assert await remote.assistants.get_subgraphs(aid, "tools") == {}
        out = await remote.runs.wait(None, aid, input=user("go"))
        assert out["messages"][-1]["content"] == "context: [('tone', 'remote')]"
        page = await remote.assistants.search(name="Remote", response_format="object")
        assert [a["assistant_id"] for a in page["assistants"]] == [aid] and page["next"] is None
        await remote.assistants.delete(aid, delete_threads=True)
        assert await remote.assistants.count(name="Remote") == 0
