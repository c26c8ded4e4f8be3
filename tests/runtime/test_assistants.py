"""Assistants as in LangGraph (issue 17.9): a served graph with a config and a context of its own, created,
updated (a new version each time), set back to a version, searched, counted and deleted; stored on every
backend; runs of an assistant get its config and context under their own."""

import asyncio
import uuid

import pytest
from runtime_helpers import eventually, looping_agent, user

from backchannel import (
    ConflictError,
    InvalidRequestError,
    MaxIterationsError,
    NotFoundError,
    ScriptedModel,
    ToolRuntime,
    create_agent,
    tool,
)
from backchannel.runtime import LocalRuntime, assistant_id_for

ASSISTANT_KEYS = {"assistant_id", "graph_id", "config", "context", "metadata", "name", "created_at", "updated_at",
                  "version", "description"}


@tool
def show_context(runtime: ToolRuntime) -> str:
    """Say what the run's context is."""
    return repr(sorted((runtime.context or {}).items()))


def context_agent():
    """Calls show_context once, then answers with what it said."""
    def reply(request):
        if request.messages[-1].type == "tool":
            return f"context: {request.messages[-1].content}"
        return {"tool_calls": [{"name": "show_context", "args": {}, "id": f"call_{len(request.messages)}"}]}
    return create_agent(ScriptedModel([reply], loop=True), [show_context])


async def _answer(rt, assistant_id, **options):
    thread = await rt.threads.create()
    out = await rt.runs.wait(thread["thread_id"], assistant_id, input=user("go"), **options)
    return out["messages"][-1]["content"]


async def test_create_get_and_a_run_of_the_assistant_with_its_context_under_the_runs(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    made = await rt.assistants.create("agent", context={"tone": "dry", "lang": "en"}, name="Dry",
                                      metadata={"team": "a"}, description="answers dryly")
    assert set(made) >= ASSISTANT_KEYS
    assert made["graph_id"] == "agent" and made["version"] == 1 and made["name"] == "Dry"
    assert made["context"] == {"tone": "dry", "lang": "en"} and made["metadata"] == {"team": "a"}
    assert made["description"] == "answers dryly"
    assert str(uuid.UUID(made["assistant_id"])) == made["assistant_id"]
    assert await rt.assistants.get(made["assistant_id"]) == made
    # the run gets the assistant's context, the run's own keys over it
    assert await _answer(rt, made["assistant_id"]) == "context: [('lang', 'en'), ('tone', 'dry')]"
    assert await _answer(rt, made["assistant_id"], context={"lang": "fr"}) == \
        "context: [('lang', 'fr'), ('tone', 'dry')]"
    assert await _answer(rt, "agent") == "context: []"  # the graph's own assistant has none
    # the run and its thread name the assistant; the graph is the one it points at
    thread = await rt.threads.create()
    run = await rt.runs.create(thread["thread_id"], made["assistant_id"], input=user("x"))
    assert run["assistant_id"] == made["assistant_id"]
    await rt.runs.join(thread["thread_id"], run["run_id"])
    found = await rt.threads.get(thread["thread_id"])
    assert found["metadata"]["assistant_id"] == made["assistant_id"] and found["metadata"]["graph_id"] == "agent"
    # a stateless run of it too
    out = await rt.runs.wait(None, made["assistant_id"], input=user("x"))
    assert out["messages"][-1]["content"] == "context: [('lang', 'en'), ('tone', 'dry')]"


async def test_the_assistants_config_applies_to_its_runs_under_the_runs_own(make_runtime):
    rt = await make_runtime({"agent": looping_agent(10, max_iterations=50)})
    strict = await rt.assistants.create("agent", config={"recursion_limit": 4, "tags": ["x"]})
    assert strict["config"] == {"recursion_limit": 4, "tags": ["x"]}
    with pytest.raises(MaxIterationsError):
        await _answer(rt, strict["assistant_id"])
    assert await _answer(rt, strict["assistant_id"], config={"recursion_limit": 100}) == "done after 10 steps"
    thread = await rt.threads.create()
    run = await rt.runs.create(thread["thread_id"], strict["assistant_id"], input=user("x"),
                               config={"configurable": {"user": "ana"}})
    assert run["kwargs"]["config"]["recursion_limit"] == 4 and run["kwargs"]["config"]["tags"] == ["x"]
    assert run["kwargs"]["config"]["configurable"]["user"] == "ana"


async def test_config_configurable_and_context_are_kept_in_step(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    by_context = await rt.assistants.create("agent", context={"k": 1})
    assert by_context["config"] == {"configurable": {"k": 1}}
    by_config = await rt.assistants.create("agent", config={"configurable": {"k": 2}})
    assert by_config["context"] == {"k": 2}
    assert await _answer(rt, by_config["assistant_id"]) == "context: [('k', 2)]"
    with pytest.raises(InvalidRequestError, match="configurable"):
        await rt.assistants.create("agent", config={"configurable": {"k": 1}}, context={"k": 2})


async def test_update_makes_a_new_version_and_set_latest_goes_back(make_runtime):
    rt = await make_runtime({"agent": context_agent(), "other": context_agent()})
    made = await rt.assistants.create("agent", context={"tone": "dry"}, name="A", metadata={"team": "a"})
    aid = made["assistant_id"]
    await asyncio.sleep(0.002)
    second = await rt.assistants.update(aid, context={"tone": "warm"}, metadata={"owner": "ana"})
    assert second["version"] == 2 and second["context"] == {"tone": "warm"} and second["name"] == "A"
    assert second["metadata"] == {"team": "a", "owner": "ana"}  # merged into the assistant's
    assert second["created_at"] == made["created_at"] and second["updated_at"] > made["updated_at"]
    assert await _answer(rt, aid) == "context: [('tone', 'warm')]"
    third = await rt.assistants.update(aid, graph_id="other", name="B")
    assert (third["version"], third["graph_id"], third["name"], third["context"]) == (3, "other", "B",
                                                                                       {"tone": "warm"})
    versions = await rt.assistants.get_versions(aid)
    assert [v["version"] for v in versions] == [3, 2, 1]
    assert [v["name"] for v in versions] == ["B", "A", "A"]
    assert all(v["assistant_id"] == aid for v in versions)
    assert [v["version"] for v in await rt.assistants.get_versions(aid, limit=1, offset=1)] == [2]
    assert [v["version"] for v in await rt.assistants.get_versions(aid, metadata={"owner": "ana"})] == [3, 2]
    back = await rt.assistants.set_latest(aid, 1)
    assert (back["version"], back["graph_id"], back["name"], back["context"], back["metadata"]) == (
        1, "agent", "A", {"tone": "dry"}, {"team": "a"})
    assert await rt.assistants.get(aid) == back
    assert await _answer(rt, aid) == "context: [('tone', 'dry')]"
    assert [v["version"] for v in await rt.assistants.get_versions(aid)] == [3, 2, 1]  # none lost
    # an update after going back is a version after the newest
    assert (await rt.assistants.update(aid, name="C"))["version"] == 4
    with pytest.raises(NotFoundError, match="Version 9"):
        await rt.assistants.set_latest(aid, 9)
    with pytest.raises(NotFoundError):
        await rt.assistants.update(str(uuid.uuid4()), name="x")
    with pytest.raises(NotFoundError):
        await rt.assistants.get_versions(str(uuid.uuid4()))


async def test_create_refuses_what_langgraph_refuses(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    with pytest.raises(NotFoundError, match="nope"):
        await rt.assistants.create("nope")
    with pytest.raises(InvalidRequestError, match="UUID"):
        await rt.assistants.create("agent", assistant_id="not-a-uuid")
    fixed = str(uuid.uuid4())
    first = await rt.assistants.create("agent", assistant_id=fixed, name="first")
    assert first["assistant_id"] == fixed
    with pytest.raises(ConflictError):
        await rt.assistants.create("agent", assistant_id=fixed, name="second")
    kept = await rt.assistants.create("agent", assistant_id=fixed, name="second", if_exists="do_nothing")
    assert kept["name"] == "first"
    with pytest.raises(ConflictError):  # the graph's own assistant exists already
        await rt.assistants.create("agent", assistant_id=assistant_id_for("agent"))
    with pytest.raises(InvalidRequestError, match="if_exists"):
        await rt.assistants.create("agent", if_exists="replace")
    with pytest.raises(NotFoundError, match="nope"):
        await rt.assistants.update(fixed, graph_id="nope")
    with pytest.raises(TypeError):
        await rt.assistants.create("agent", contxt={})


async def test_search_count_sort_and_page(make_runtime):
    rt = await make_runtime({"agent": context_agent(), "zeta": context_agent()})
    made = []
    for name in ("beta", "Alpha", "gamma"):
        made.append(await rt.assistants.create("zeta" if name == "gamma" else "agent", name=name,
                                               metadata={"kind": "custom", "n": name}))
        await asyncio.sleep(0.002)
    everything = await rt.assistants.search(limit=100)
    assert len(everything) == 5 and await rt.assistants.count() == 5
    # newest first by default; the graphs' own assistants were there before
    assert [a["name"] for a in everything[:3]] == ["gamma", "Alpha", "beta"]
    assert [a["name"] for a in await rt.assistants.search(metadata={"kind": "custom"}, sort_by="name",
                                                          sort_order="asc")] == ["Alpha", "beta", "gamma"]
    assert [a["name"] for a in await rt.assistants.search(name="ALP")] == ["Alpha"]  # any case, a part
    assert await rt.assistants.count(name="a", metadata={"kind": "custom"}) == 3
    assert [a["name"] for a in await rt.assistants.search(graph_id="zeta")] == ["gamma", "zeta"]
    assert await rt.assistants.count(graph_id="agent") == 3
    page = await rt.assistants.search(metadata={"kind": "custom"}, sort_by="created_at", sort_order="asc",
                                      limit=2, offset=1)
    assert [a["name"] for a in page] == ["Alpha", "gamma"]
    assert [a["name"] for a in await rt.assistants.search(sort_by="updated_at", limit=100)][:3] == \
        ["gamma", "Alpha", "beta"]
    await rt.assistants.update(made[0]["assistant_id"], name="beta2")
    assert (await rt.assistants.search(sort_by="updated_at", limit=1))[0]["name"] == "beta2"
    assert [set(a) for a in await rt.assistants.search(select=["assistant_id", "version"], limit=1)] == [
        {"assistant_id", "version"}]
    with pytest.raises(InvalidRequestError, match="sort"):
        await rt.assistants.search(sort_by="colour")


async def test_the_graphs_own_assistant_can_be_updated_not_deleted(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    own = assistant_id_for("agent")
    changed = await rt.assistants.update("agent", context={"tone": "dry"})  # by graph id too
    assert (changed["assistant_id"], changed["version"], changed["metadata"]) == (own, 2, {"created_by": "system"})
    assert await _answer(rt, "agent") == "context: [('tone', 'dry')]"
    assert await _answer(rt, own) == "context: [('tone', 'dry')]"
    assert [v["version"] for v in await rt.assistants.get_versions(own)] == [2, 1]
    assert (await rt.assistants.set_latest(own, 1))["context"] == {}
    assert await _answer(rt, "agent") == "context: []"
    assert await rt.assistants.count() == 1
    with pytest.raises(ConflictError, match="graph"):
        await rt.assistants.delete(own)


async def test_delete_an_assistant_its_versions_runs_and_optionally_its_threads(make_runtime):
    rt = await make_runtime({"agent": context_agent(), "slow": looping_agent(1000, latency=0.05,
                                                                              max_iterations=2000)})
    made = await rt.assistants.create("agent", name="gone")
    kept_thread = await rt.threads.create()
    await rt.runs.wait(kept_thread["thread_id"], made["assistant_id"], input=user("x"))
    await rt.assistants.delete(made["assistant_id"])
    with pytest.raises(NotFoundError):
        await rt.assistants.get(made["assistant_id"])
    with pytest.raises(NotFoundError):
        await rt.assistants.get_versions(made["assistant_id"])
    with pytest.raises(NotFoundError):
        await rt.runs.create(kept_thread["thread_id"], made["assistant_id"], input=user("x"))
    assert await rt.threads.get(kept_thread["thread_id"])  # its threads stay unless asked
    with pytest.raises(NotFoundError):
        await rt.assistants.delete(made["assistant_id"])
    # delete_threads: its threads go too, and its running runs are stopped
    busy = await rt.assistants.create("slow", name="busy")
    thread = await rt.threads.create()
    run = await rt.runs.create(thread["thread_id"], busy["assistant_id"], input=user("x"))
    other = await rt.threads.create()
    await rt.runs.wait(other["thread_id"], "agent", input=user("x"))
    await eventually(lambda: _status_is(rt, thread["thread_id"], run["run_id"], "running"), timeout=10)
    await rt.assistants.delete(busy["assistant_id"], delete_threads=True)
    with pytest.raises(NotFoundError):
        await rt.threads.get(thread["thread_id"])
    assert await rt.threads.get(other["thread_id"])  # another assistant's thread stays
    # without: its threads stay, its runs are stopped
    stopped = await rt.assistants.create("slow", name="stopped")
    run = await rt.runs.create(other["thread_id"], stopped["assistant_id"], input=user("x"))
    await eventually(lambda: _status_is(rt, other["thread_id"], run["run_id"], "running"), timeout=10)
    await rt.assistants.delete(stopped["assistant_id"])
    assert (await rt.runs.get(other["thread_id"], run["run_id"]))["status"] == "interrupted"


async def _status_is(rt, thread_id, run_id, status):
    return (await rt.runs.get(thread_id, run_id))["status"] == status


async def test_assistants_outlive_the_runtime(store_url, tmp_path):
    if store_url == "memory":
        pytest.skip("a memory store ends with its runtime")
    async with LocalRuntime(store=store_url, agents={"agent": context_agent()}) as rt:
        made = await rt.assistants.create("agent", context={"tone": "dry"}, name="kept")
        await rt.assistants.update(made["assistant_id"], context={"tone": "warm"})
        await rt.assistants.update("agent", name="own")
    async with LocalRuntime(store=store_url, agents={"agent": context_agent()}) as again:
        found = await again.assistants.get(made["assistant_id"])
        assert (found["name"], found["version"], found["context"]) == ("kept", 2, {"tone": "warm"})
        assert [v["version"] for v in await again.assistants.get_versions(made["assistant_id"])] == [2, 1]
        assert (await again.assistants.get("agent"))["name"] == "own"
        assert await _answer(again, made["assistant_id"]) == "context: [('tone', 'warm')]"
    # a runtime that does not serve the graph does not show its assistants
    async with LocalRuntime(store=store_url, agents={"other": context_agent()}) as elsewhere:
        assert [a["graph_id"] for a in await elsewhere.assistants.search(limit=100)] == ["other"]
        with pytest.raises(NotFoundError):
            await elsewhere.assistants.get(made["assistant_id"])


async def test_a_wake_up_run_is_of_the_threads_assistant(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    made = await rt.assistants.create("agent", context={"tone": "dry"})
    thread = await rt.threads.create()
    await rt.runs.wait(thread["thread_id"], made["assistant_id"], input=user("x"))
    from backchannel import HumanMessage
    await rt.deliver(thread["thread_id"], HumanMessage("a result came"), key="k1")
    await eventually(lambda: _runs_of(rt, thread["thread_id"], 2))
    runs = await rt.runs.list(thread["thread_id"])
    assert {r["assistant_id"] for r in runs} == {made["assistant_id"]}
    assert runs[0]["kwargs"]["context"] == {"tone": "dry"}


async def _runs_of(rt, thread_id, n):
    runs = await rt.runs.list(thread_id)
    return len(runs) >= n and all(r["status"] == "success" for r in runs)


async def test_concurrent_updates_each_make_a_version(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    made = await rt.assistants.create("agent", name="n0")
    done = await asyncio.gather(*(rt.assistants.update(made["assistant_id"], name=f"n{i}", metadata={f"k{i}": i})
                                  for i in range(1, 11)))
    assert sorted(d["version"] for d in done) == list(range(2, 12))
    versions = await rt.assistants.get_versions(made["assistant_id"], limit=100)
    assert [v["version"] for v in versions] == list(range(11, 0, -1))
    newest = await rt.assistants.get(made["assistant_id"])
    assert newest["version"] == 11 and newest["metadata"] == {f"k{i}": i for i in range(1, 11)}  # none lost


async def test_a_cron_of_an_assistant_runs_that_assistant(make_runtime):
    rt = await make_runtime({"agent": context_agent()})
    made = await rt.assistants.create("agent", context={"tone": "dry"})
    thread = (await rt.threads.create())["thread_id"]
    cron = await rt.crons.create_for_thread(thread, made["assistant_id"], schedule="* * * * * *", input=user("tick"))
    assert cron["assistant_id"] == made["assistant_id"]

    async def ran() -> bool:
        return any(r["status"] == "success" for r in await rt.runs.list(thread))

    await eventually(ran, timeout=10)
    await rt.crons.delete(cron["cron_id"])
    done = [r for r in await rt.runs.list(thread) if r["status"] == "success"][-1]
    assert done["assistant_id"] == made["assistant_id"] and done["kwargs"]["context"] == {"tone": "dry"}
