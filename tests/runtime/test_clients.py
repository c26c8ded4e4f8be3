"""The runtime clients' arguments, as ``langgraph_sdk``'s: a misspelt keyword is a TypeError, an option
this runtime cannot honour is refused by name, and the options it takes do what they say."""

from __future__ import annotations

import asyncio

import pytest
from runtime_helpers import echo_agent, eventually, run_status_is, user

from backchannel.errors import InvalidRequestError


@pytest.fixture
async def rt(make_runtime):
    return await make_runtime({"agent": echo_agent(), "slow": echo_agent(latency=5.0)})


async def test_a_misspelt_keyword_raises_type_error_and_runs_nothing(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    with pytest.raises(TypeError, match="'inptu'"):
        await rt.runs.wait(tid, "agent", inptu=user("hello"))
    with pytest.raises(TypeError, match="'inptu'"):
        await rt.runs.create(tid, "agent", inptu=user("hello"))
    with pytest.raises(TypeError, match="'strem_mode'"):
        rt.runs.stream(tid, "agent", input=user("hello"), strem_mode="updates")
    assert await rt.runs.list(tid) == []  # nothing ran with an empty input
    with pytest.raises(TypeError, match="limt"):
        await rt.runs.list(tid, limt=1)
    with pytest.raises(TypeError, match="metdata"):
        await rt.threads.create(metdata={"a": 1})
    with pytest.raises(TypeError, match="limt"):
        await rt.threads.search(limt=1)
    with pytest.raises(TypeError, match="chekpoint_id"):
        await rt.threads.get_state(tid, chekpoint_id="x")
    with pytest.raises(TypeError, match="tll"):
        await rt.store.put_item(["ns"], key="k", value={}, tll=5)
    with pytest.raises(TypeError, match="graphid"):
        await rt.assistants.search(graphid="agent")


async def test_langgraph_options_it_cannot_honour_are_refused_by_name(rt):
    tid = (await rt.threads.create())["thread_id"]
    with pytest.raises(InvalidRequestError, match="langsmith_tracing"):
        await rt.runs.create(tid, "agent", input=user("hi"), langsmith_tracing={"project_name": "p"})
    with pytest.raises(InvalidRequestError, match="feedback_keys"):
        rt.runs.stream(tid, "agent", input=user("hi"), feedback_keys=["score"])
    with pytest.raises(InvalidRequestError, match="durability"):
        await rt.runs.create(tid, "agent", input=user("hi"), durability="sometimes")
    with pytest.raises(InvalidRequestError, match="ttl"):  # a TTL is honoured (test_retention), a bad one refused
        await rt.threads.create(ttl=0)
    with pytest.raises(InvalidRequestError, match="ttl"):
        await rt.store.put_item(["ns"], key="k", value={}, ttl=-5)
    with pytest.raises(InvalidRequestError, match="on_disconnect"):
        await rt.runs.wait(tid, "agent", input=user("hi"), on_disconnect="later")
    assert await rt.runs.list(tid) == []


async def test_the_options_it_takes_work(rt):
    tid = (await rt.threads.create(headers={"x-ignored": "1"}, params={"a": 1}))["thread_id"]
    created: list[dict] = []
    run = await rt.runs.create(tid, "agent", input=user("one"), on_run_created=created.append,
                               durability="sync", headers={"x-ignored": "1"})
    assert created == [{"run_id": run["run_id"], "thread_id": tid}]
    values = await rt.runs.wait(tid, "agent", input=user("two"), on_run_created=created.append)
    assert values["messages"][-1]["content"] == "echo: two"
    parts = [p async for p in rt.runs.stream(tid, "agent", input=user("three"), on_run_created=created.append)]
    assert [c["run_id"] for c in created[1:]] == [r["run_id"] for r in reversed(await rt.runs.list(tid))][1:]
    assert parts[0].data["run_id"] == created[-1]["run_id"]
    # count by values, as search does
    other = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(other, "agent", input=user("else"))
    last = (await rt.threads.get(tid))["values"]
    assert await rt.threads.count(values={"messages": last["messages"]}) == 1


async def test_a_stream_closed_early_cancels_its_run_when_asked(rt):
    tid = (await rt.threads.create())["thread_id"]
    stream = rt.runs.stream(tid, "slow", input=user("wait"), on_disconnect="cancel")
    first = await anext(stream)
    await stream.aclose()
    await eventually(lambda: run_status_is(rt, tid, first.data["run_id"], "interrupted"))
    kept = rt.runs.stream(tid, "slow", input=user("go on"), on_disconnect="continue")
    run_id = (await anext(kept)).data["run_id"]
    await kept.aclose()
    await asyncio.sleep(0.1)
    assert (await rt.runs.get(tid, run_id))["status"] in ("pending", "running")
