"""``RemoteRuntime``: the runtime surface over HTTP, against a real server; same answers as LocalRuntime."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from server_agents import AGENTS
from server_helpers import ThreadServer, free_port
from subagent_helpers import wait_until

from backchannel.errors import AuthenticationError, ConflictError, InvalidRequestError, NotFoundError, RemoteError
from backchannel.runtime import LocalRuntime
from backchannel.runtime.remote import RemoteRuntime
from backchannel.server import create_app


@pytest.fixture
async def remote(server):
    async with RemoteRuntime(server.url, api_key=None) as rt:
        yield rt


async def test_threads_runs_and_state(remote):
    thread = await remote.threads.create(metadata={"via": "remote"})
    values = await remote.runs.wait(thread["thread_id"], "calc", input="2 + 3?")
    assert values["messages"][-1]["content"] == "the answer is 5"
    state = await remote.threads.get_state(thread["thread_id"])
    assert state["values"] == values
    history = await remote.threads.get_history(thread["thread_id"], limit=100)
    first = history[-1]["checkpoint"]["checkpoint_id"]
    assert (await remote.threads.get_state(thread["thread_id"], checkpoint_id=first))["values"]["messages"][0][
        "content"] == "2 + 3?"
    assert [t["thread_id"] for t in await remote.threads.search(metadata={"via": "remote"})] == [thread["thread_id"]]
    assert await remote.threads.count(metadata={"via": "remote"}) == 1


async def test_streams_are_parts_like_local_ones(remote):
    thread = await remote.threads.create()
    parts = [p async for p in remote.runs.stream(thread["thread_id"], "calc", input="2 + 3?",
                                                stream_mode=["updates", "custom"])]
    assert parts[0].event == "metadata"
    assert [next(iter(p.data)) for p in parts[1:]] == ["model", "tools", "model"]
    run = await remote.runs.create(thread["thread_id"], "slow", input="later", stream_mode="updates",
                                   stream_resumable=True)
    joined = [p async for p in remote.runs.join_stream(thread["thread_id"], run["run_id"])]
    assert joined[-1].data["model"]["messages"][0]["content"] == "echo: later"
    assert all(p.id for p in joined)
    again = [p async for p in remote.runs.join_stream(thread["thread_id"], run["run_id"], last_event_id=joined[0].id)]
    assert [p.id for p in again] == [p.id for p in joined[1:]]


async def test_the_same_code_runs_on_both_runtimes(remote):
    async def conversation(rt):
        thread = await rt.threads.create(metadata={"same": "code"})
        await rt.runs.wait(thread["thread_id"], "echo", input="one")
        run = await rt.runs.create(thread["thread_id"], "echo", input="two")
        await rt.runs.join(thread["thread_id"], run["run_id"])
        await rt.store.put_item(["same", "code"], "k", {"v": 1})
        state = await rt.threads.get_state(thread["thread_id"])
        item = await rt.store.get_item(["same", "code"], "k")
        runs = await rt.runs.list(thread["thread_id"])
        return ([m["content"] for m in state["values"]["messages"]], item["value"],
                [r["status"] for r in runs])

    async with LocalRuntime("memory", {"echo": AGENTS["echo"]}) as local:
        assert await conversation(local) == await conversation(remote)


async def test_errors_are_backchannels_own(remote):
    thread = await remote.threads.create()
    with pytest.raises(NotFoundError, match="not found"):
        await remote.threads.get("00000000-0000-0000-0000-000000000000")
    with pytest.raises(NotFoundError, match="no-such"):
        await remote.runs.create(thread["thread_id"], "no-such", input="x")
    with pytest.raises(ConflictError):
        await remote.threads.create(thread_id=thread["thread_id"])
    with pytest.raises(InvalidRequestError, match="multitask_strategy"):
        await remote.runs.create(thread["thread_id"], "echo", input="x", multitask_strategy="sometimes")
    run = await remote.runs.create(thread["thread_id"], "slow", input="busy")
    with pytest.raises(ConflictError):
        await remote.runs.create(thread["thread_id"], "slow", input="also", multitask_strategy="reject")
    await remote.runs.cancel(thread["thread_id"], run["run_id"], wait=True)
    assert (await remote.runs.get(thread["thread_id"], run["run_id"]))["status"] == "interrupted"


async def test_an_unreachable_server_is_a_remote_error():
    async with RemoteRuntime(f"http://127.0.0.1:{free_port()}", api_key=None) as rt:
        with pytest.raises(RemoteError, match="ConnectError"):
            await rt.threads.create()


async def test_api_keys(monkeypatch):
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, api_key="k3y")) as live:
        async with RemoteRuntime(live.url, api_key=None) as anonymous:
            with pytest.raises(AuthenticationError, match="x-api-key"):
                await anonymous.threads.create()
        monkeypatch.setenv("BACKCHANNEL_API_KEY", "k3y")  # the default, like the server's
        async with RemoteRuntime(live.url) as keyed:
            assert (await keyed.threads.create())["status"] == "idle"


async def test_arguments_are_langgraph_sdks_a_misspelt_one_is_a_type_error():
    # Refused before any request is made: there is no server at this address.
    async with RemoteRuntime(f"http://127.0.0.1:{free_port()}", api_key=None) as rt:
        with pytest.raises(TypeError, match="'inptu'"):
            await rt.runs.wait("t", "calc", inptu={"messages": []})
        with pytest.raises(TypeError, match="'inptu'"):
            await rt.runs.create("t", "calc", inptu={"messages": []})
        with pytest.raises(TypeError, match="'strem_mode'"):
            rt.runs.stream("t", "calc", strem_mode="updates")
        with pytest.raises(TypeError, match="limt"):
            await rt.runs.list("t", limt=1)  # type: ignore[call-arg]


async def test_per_call_headers_and_on_run_created(remote, server):
    thread = await remote.threads.create(headers={"x-request-id": "abc"})
    tid = thread["thread_id"]
    created: list[dict] = []
    run = await remote.runs.create(tid, "calc", input="2 + 3?", on_run_created=created.append,
                                   headers={"x-request-id": "abc"})
    await remote.runs.join(tid, run["run_id"])
    await remote.runs.wait(tid, "calc", input="2 + 3?", on_run_created=created.append)
    [p async for p in remote.runs.stream(tid, "calc", input="2 + 3?", on_run_created=created.append)]
    runs = [r["run_id"] for r in reversed(await remote.runs.list(tid))]
    assert created == [{"run_id": r, "thread_id": tid} for r in runs]


async def test_per_call_headers_and_params_go_with_the_request():
    import httpx

    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"thread_id": "t1"})

    async with RemoteRuntime("http://server", api_key="key", headers={"x-app": "a"},
                             transport=httpx.MockTransport(answer)) as rt:
        await rt.threads.get("t1", headers={"x-request-id": "abc"}, params={"trace": "1"})
    [request] = seen
    assert (request.headers["x-request-id"], request.headers["x-app"], request.headers["x-api-key"]) == \
        ("abc", "a", "key")
    assert request.url.params["trace"] == "1"


async def test_crons_batches_and_bulk_cancels_over_http(remote):
    async def crons(rt):
        thread = (await rt.threads.create())["thread_id"]
        cron = await rt.crons.create_for_thread(thread, "echo", schedule="0 9 * * *", input="hi",
                                                metadata={"same": "crons"}, timezone=ZoneInfo("Europe/Paris"))
        other = await rt.crons.create("echo", schedule="0 9 * * 1", on_run_completed="keep",
                                      end_time=datetime(2099, 1, 1, tzinfo=UTC), metadata={"same": "crons"})
        changed = await rt.crons.update(other["cron_id"], end_time=None, enabled=False)
        found = await rt.crons.search(metadata={"same": "crons"}, sort_by="created_at", sort_order="asc",
                                      select=["cron_id", "timezone", "end_time", "enabled"])
        counted = await rt.crons.count(metadata={"same": "crons"})
        fetched = await rt.crons.get(cron["cron_id"])
        for made in (cron, other):
            await rt.crons.delete(made["cron_id"])
        with pytest.raises(NotFoundError):
            await rt.crons.delete(cron["cron_id"])
        return ([{k: v for k, v in c.items() if k != "cron_id"} for c in found], counted, set(fetched) == set(cron),
                changed["end_time"], changed["enabled"], await rt.crons.count(metadata={"same": "crons"}))

    async with LocalRuntime("memory", {"echo": AGENTS["echo"]}) as local:
        assert await crons(local) == await crons(remote)
    batch = await remote.runs.create_batch([{"assistant_id": "glacial", "input": "slowly", "on_completion": "keep"}])

    async def input_recorded() -> bool:  # cancelled before its first step, a run keeps no input (seen under load)
        return bool((await remote.threads.get_state(batch[0]["thread_id"]))["values"].get("messages"))

    await wait_until(input_recorded, 30, 0.02, "the run's input to be recorded")
    await remote.runs.cancel_many(thread_id=batch[0]["thread_id"], run_ids=[batch[0]["run_id"]], action="interrupt")
    assert (await remote.runs.join(batch[0]["thread_id"], batch[0]["run_id"]))["messages"][0]["content"] == "slowly"
    assert (await remote.runs.get(batch[0]["thread_id"], batch[0]["run_id"]))["status"] == "interrupted"
    with pytest.raises(InvalidRequestError):
        await remote.runs.cancel_many()
