"""Threads: create/get/search/update/delete/copy, state, update_state, history, and agent.ainvoke on threads."""

import asyncio
import copy
import uuid

import pytest
from runtime_helpers import contents, echo_agent, eventually, run_status_is, step, tool_loop, user

from backchannel import ConflictError, NotFoundError, ScriptedModel, create_agent

THREAD_KEYS = {"thread_id", "created_at", "updated_at", "state_updated_at", "metadata", "status", "config",
               "values"}
STATE_KEYS = {"values", "next", "tasks", "metadata", "created_at", "checkpoint", "parent_checkpoint",
              "interrupts", "checkpoint_id", "parent_checkpoint_id"}


# -- create / get ---------------------------------------------------------------------------


async def test_create_returns_a_langgraph_thread(rt):
    thread = await rt.threads.create(metadata={"owner": "ana"})
    assert set(thread) >= THREAD_KEYS
    uuid.UUID(thread["thread_id"])
    assert thread["metadata"] == {"owner": "ana"}
    assert thread["status"] == "idle"
    assert thread["values"] is None  # no run yet
    assert thread["created_at"].endswith("+00:00")
    assert await rt.threads.get(thread["thread_id"]) == thread


async def test_create_with_an_id_and_if_exists(rt):
    thread_id = str(uuid.uuid4())
    created = await rt.threads.create(thread_id=thread_id, metadata={"v": 1})
    assert created["thread_id"] == thread_id
    with pytest.raises(ConflictError, match=thread_id):
        await rt.threads.create(thread_id=thread_id)
    with pytest.raises(ConflictError):
        await rt.threads.create(thread_id=thread_id, if_exists="raise")
    same = await rt.threads.create(thread_id=thread_id, metadata={"v": 2}, if_exists="do_nothing")
    assert same["thread_id"] == thread_id and same["metadata"] == {"v": 1}  # untouched


async def test_create_with_graph_id_puts_it_in_metadata(rt):
    thread = await rt.threads.create(metadata={"a": 1}, graph_id="agent")
    assert thread["metadata"] == {"a": 1, "graph_id": "agent"}


async def test_unknown_and_malformed_thread_ids_are_not_found(rt):
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        with pytest.raises(NotFoundError):
            await rt.threads.get(missing)
        with pytest.raises(NotFoundError):
            await rt.threads.get_state(missing)
        with pytest.raises(NotFoundError):
            await rt.threads.get_history(missing)
        with pytest.raises(NotFoundError):
            await rt.threads.update(missing, metadata={"a": 1})
        with pytest.raises(NotFoundError):
            await rt.threads.delete(missing)
        with pytest.raises(NotFoundError):
            await rt.threads.copy(missing)


async def test_a_thread_after_a_run_has_values_and_graph_metadata(rt):
    thread = await rt.threads.create(metadata={"a": 1})
    await rt.runs.wait(thread["thread_id"], "agent", input=user("hi"))
    after = await rt.threads.get(thread["thread_id"])
    assert after["status"] == "idle"
    assert after["metadata"]["a"] == 1
    assert after["metadata"]["graph_id"] == "agent"
    assert after["metadata"]["assistant_id"] == "fe096781-5601-53d2-b2f6-0d3403f7e9ca"
    assert contents(after["values"]) == ["hi", "echo: hi"]
    assert after["interrupts"] == {} and after["error"] is None
    assert after["updated_at"] >= thread["updated_at"]


# -- search -----------------------------------------------------------------------------------


async def test_search_by_metadata_status_and_ids(rt):
    a = await rt.threads.create(metadata={"team": "red", "n": 1})
    b = await rt.threads.create(metadata={"team": "red", "n": 2})
    c = await rt.threads.create(metadata={"team": "blue", "nested": {"k": [1, 2]}})
    await rt.runs.wait(b["thread_id"], "agent", input=user("x"))

    def ids(found):
        return {t["thread_id"] for t in found}

    assert ids(await rt.threads.search(metadata={"team": "red"})) == {a["thread_id"], b["thread_id"]}
    assert ids(await rt.threads.search(metadata={"team": "red", "n": 2})) == {b["thread_id"]}
    assert ids(await rt.threads.search(metadata={"nested": {"k": [1, 2]}})) == {c["thread_id"]}
    assert ids(await rt.threads.search(metadata={"team": "green"})) == set()
    assert ids(await rt.threads.search(ids=[a["thread_id"], c["thread_id"]])) == {a["thread_id"], c["thread_id"]}
    assert ids(await rt.threads.search(status="idle")) == {a["thread_id"], b["thread_id"], c["thread_id"]}
    assert ids(await rt.threads.search(status="busy")) == set()
    assert await rt.threads.count(metadata={"team": "red"}) == 2


async def test_search_sorts_and_pages(rt):
    created = [await rt.threads.create(metadata={"i": i}) for i in range(5)]
    newest_first = [t["thread_id"] for t in reversed(created)]
    assert [t["thread_id"] for t in await rt.threads.search()] == newest_first  # updated_at desc by default
    asc = await rt.threads.search(sort_by="created_at", sort_order="asc")
    assert [t["thread_id"] for t in asc] == newest_first[::-1]
    page = await rt.threads.search(limit=2, offset=1)
    assert [t["thread_id"] for t in page] == newest_first[1:3]
    assert len(await rt.threads.search(limit=10)) == 5
    # updating a thread moves it to the front of the default order
    await rt.threads.update(created[0]["thread_id"], metadata={"touched": True})
    assert (await rt.threads.search(limit=1))[0]["thread_id"] == created[0]["thread_id"]


async def test_search_by_values(rt):
    t1 = await rt.threads.create()
    await rt.threads.create()
    await rt.threads.update_state(t1["thread_id"], {"topic": "cats"})
    found = await rt.threads.search(values={"topic": "cats"})
    assert [t["thread_id"] for t in found] == [t1["thread_id"]]


# -- update / delete / copy ----------------------------------------------------------------------


async def test_update_merges_metadata_shallowly(rt):
    thread = await rt.threads.create(metadata={"a": {"x": 1}, "b": 1})
    updated = await rt.threads.update(thread["thread_id"], metadata={"a": {"y": 2}, "c": 3})
    assert updated["metadata"] == {"a": {"y": 2}, "b": 1, "c": 3}
    assert (await rt.threads.get(thread["thread_id"]))["metadata"] == {"a": {"y": 2}, "b": 1, "c": 3}
    assert updated["updated_at"] >= thread["updated_at"]


async def test_delete_removes_the_thread_its_runs_and_state(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await rt.runs.join(tid, run["run_id"])
    assert await rt.threads.delete(tid) is None
    with pytest.raises(NotFoundError):
        await rt.threads.get(tid)
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, run["run_id"])
    assert await rt.storage.list_checkpoints(tid) == []
    with pytest.raises(NotFoundError):
        await rt.threads.delete(tid)


async def test_delete_of_a_busy_thread_stops_its_run(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    await rt.runs.create(thread["thread_id"], "agent", input=user("hi"))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(rt.threads.delete(thread["thread_id"]), 1)
    assert not rt.scheduler.executing  # nothing left running
    with pytest.raises(NotFoundError):
        await rt.threads.get(thread["thread_id"])



async def test_a_run_created_as_its_thread_is_deleted_is_refused_or_deleted_with_it_never_left_on_no_thread(
        make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    outcomes = set()
    for attempt in range(40):
        tid = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(tid, "agent", input=user("first"))  # a thread with state, as deletes usually meet
        creating = asyncio.ensure_future(rt.runs.create(tid, "agent", input=user("racing")))
        for _ in range(attempt % 4):  # the two calls meet at different points
            await asyncio.sleep(0)
        deleting = asyncio.ensure_future(rt.threads.delete(tid))
        created, deleted = await asyncio.gather(creating, deleting, return_exceptions=True)
        assert deleted is None
        assert isinstance(created, dict | NotFoundError), created
        outcomes.add(type(created).__name__)
        await eventually(lambda: _no_run_executing(rt), timeout=10)
        with pytest.raises(NotFoundError):
            await rt.threads.get(tid)
        # nothing of the thread is left: no run (queued, running or ended), no checkpoint
        assert await rt.storage.list_runs(tid) == []
        assert await rt.storage.list_checkpoints(tid) == []
    assert outcomes <= {"dict", "NotFoundError"}  # either is right: the test is that nothing is left behind


async def _no_run_executing(rt) -> bool:
    return not rt.scheduler.executing


async def test_copy_forks_the_thread_with_its_history(rt):
    thread = await rt.threads.create(metadata={"owner": "ana"})
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    copy = await rt.threads.copy(tid)
    assert copy["thread_id"] != tid
    assert copy["metadata"] == (await rt.threads.get(tid))["metadata"]
    assert contents(copy["values"]) == ["one", "echo: one"]
    original_history = await rt.threads.get_history(tid)
    copied_history = await rt.threads.get_history(copy["thread_id"])
    assert [h["values"] for h in copied_history] == [h["values"] for h in original_history]
    assert [h["metadata"]["source"] for h in copied_history] == [h["metadata"]["source"] for h in original_history]

    # the two threads go their own ways
    await rt.runs.wait(copy["thread_id"], "agent", input=user("two"))
    assert contents((await rt.threads.get(copy["thread_id"]))["values"]) == ["one", "echo: one", "two", "echo: two"]
    assert contents((await rt.threads.get(tid))["values"]) == ["one", "echo: one"]
    await rt.runs.wait(tid, "agent", input=user("other"))
    assert contents((await rt.threads.get(tid))["values"])[-1] == "echo: other"
    assert contents((await rt.threads.get(copy["thread_id"]))["values"])[-1] == "echo: two"


# -- state ------------------------------------------------------------------------------------------


async def test_state_of_a_new_thread_is_empty(rt):
    thread = await rt.threads.create()
    assert await rt.threads.get_state(thread["thread_id"]) == {
        "values": {}, "next": [], "tasks": [], "metadata": None, "created_at": None, "checkpoint": None,
        "parent_checkpoint": None, "interrupts": [], "checkpoint_id": None, "parent_checkpoint_id": None}


async def test_get_state_after_a_run(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("hi"))
    state = await rt.threads.get_state(tid)
    assert set(state) >= STATE_KEYS
    assert contents(state["values"]) == ["hi", "echo: hi"]
    assert state["next"] == [] and state["tasks"] == [] and state["interrupts"] == []
    assert state["checkpoint"] == {"checkpoint_id": state["checkpoint_id"], "thread_id": tid, "checkpoint_ns": ""}
    assert state["parent_checkpoint"]["checkpoint_id"] == state["parent_checkpoint_id"]
    assert state["metadata"]["source"] == "loop"
    assert state["metadata"]["graph_id"] == "agent"
    # and at an earlier checkpoint
    first = (await rt.threads.get_history(tid))[-1]
    earlier = await rt.threads.get_state(tid, checkpoint_id=first["checkpoint_id"])
    assert contents(earlier["values"]) == ["hi"]
    assert earlier["parent_checkpoint"] is None
    same = await rt.threads.get_state(tid, checkpoint={"checkpoint_id": first["checkpoint_id"]})
    assert same["values"] == earlier["values"]
    with pytest.raises(NotFoundError):
        await rt.threads.get_state(tid, checkpoint_id=str(uuid.uuid4()))



def scribble(values: dict) -> None:
    """What a caller might do to the state it was handed: change a message, its tool call's arguments, the list."""
    for change in (lambda: values["messages"][0].update(content="scribbled"),
                   lambda: values["messages"][1]["tool_calls"][0]["args"].update(i=99),
                   lambda: values["messages"][1]["additional_kwargs"].update(extra=1)):
        try:
            change()
        except TypeError:  # read-only is as good: nothing the caller does reaches anyone else
            pass
    values["messages"].append({"type": "human", "content": "appended", "id": "x"})


async def test_a_caller_changing_the_state_it_was_handed_changes_nothing_for_the_next_caller_or_the_agent(
        make_runtime):
    seen: list[list] = []

    def model(request):
        seen.append([(m.text, getattr(m, "tool_calls", None)) for m in request.messages])
        return tool_loop(1)(request)

    rt = await make_runtime({"agent": create_agent(ScriptedModel([model], loop=True), [step])})
    tid = (await rt.threads.create())["thread_id"]
    result = await rt.runs.wait(tid, "agent", input=user("hi"))
    state = await rt.threads.get_state(tid)
    history = await rt.threads.get_history(tid, limit=3)
    thread = await rt.threads.get(tid)
    before = copy.deepcopy(state)
    for values in (result, state["values"], history[0]["values"], thread["values"]):
        scribble(values)
    assert await rt.threads.get_state(tid) == before
    assert (await rt.threads.get_history(tid, limit=1))[0]["values"] == before["values"]
    assert (await rt.threads.get(tid))["values"] == before["values"]
    assert copy.deepcopy(before["values"]) == before["values"]
    seen.clear()
    await rt.runs.wait(tid, "agent", input=user("again"))
    assert seen[0][:2] == [("hi", None), ("", [{"name": "step", "args": {"i": 1}, "id": "call_t1_s1",
                                                       "type": "tool_call"}])]


async def test_update_state_appends_messages_and_sets_keys(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("hi"))
    before = len(await rt.threads.get_history(tid))
    result = await rt.threads.update_state(tid, {"messages": [{"role": "user", "content": "added"}],
                                                 "topic": "cats"})
    ref = result["checkpoint"]
    assert ref["thread_id"] == tid and ref["checkpoint_ns"] == ""
    assert result["checkpoint_id"] == ref["checkpoint_id"]
    state = await rt.threads.get_state(tid)
    assert state["checkpoint_id"] == ref["checkpoint_id"]
    assert contents(state["values"]) == ["hi", "echo: hi", "added"]
    assert state["values"]["topic"] == "cats"
    assert state["metadata"]["source"] == "update"
    history = await rt.threads.get_history(tid)
    assert len(history) == before + 1
    assert (await rt.threads.get(tid))["values"]["topic"] == "cats"

    # a later update sets the key again; the next run sees it all
    await rt.threads.update_state(tid, {"topic": "dogs"})
    await rt.runs.wait(tid, "agent", input=user("more"))
    values = (await rt.threads.get_state(tid))["values"]
    assert values["topic"] == "dogs"
    assert contents(values) == ["hi", "echo: hi", "added", "more", "echo: more"]


async def test_update_state_while_a_run_is_in_flight_conflicts(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=0.3)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    with pytest.raises(ConflictError, match="in-flight"):
        await rt.threads.update_state(tid, {"topic": "x"})
    await rt.runs.join(tid, run["run_id"])
    await rt.threads.update_state(tid, {"topic": "x"})  # fine once idle
    assert (await rt.threads.get_state(tid))["values"]["topic"] == "x"


# -- history --------------------------------------------------------------------------------------


async def test_history_is_newest_first_with_limit_before_and_metadata(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    await rt.runs.wait(tid, "agent", input=user("two"))
    await rt.threads.update_state(tid, {"topic": "t"})
    history = await rt.threads.get_history(tid, limit=100)
    assert [h["metadata"]["source"] for h in history] == ["update", "loop", "input", "loop", "input"]
    assert [h["metadata"]["step"] for h in history] == sorted((h["metadata"]["step"] for h in history),
                                                            reverse=True)
    assert all(set(h) >= STATE_KEYS for h in history)
    # each checkpoint's parent is the next one in the list
    for newer, older in zip(history, history[1:]):
        assert newer["parent_checkpoint_id"] == older["checkpoint_id"]
    assert history[-1]["parent_checkpoint"] is None
    assert [len(h["values"]["messages"]) for h in history] == [4, 4, 3, 2, 1]

    assert await rt.threads.get_history(tid, limit=2) == history[:2]
    # the default limit is 10
    assert len(await rt.threads.get_history(tid)) == 5
    # before is exclusive; a plain id and a config both work
    older = await rt.threads.get_history(tid, before=history[1]["checkpoint_id"])
    assert [h["checkpoint_id"] for h in older] == [h["checkpoint_id"] for h in history[2:]]
    as_config = await rt.threads.get_history(
        tid, before={"configurable": {"checkpoint_id": history[1]["checkpoint_id"]}})
    assert as_config == older
    loops = await rt.threads.get_history(tid, metadata={"source": "loop"})
    assert [h["checkpoint_id"] for h in loops] == [history[1]["checkpoint_id"], history[3]["checkpoint_id"]]
    assert await rt.threads.get_history(tid, metadata={"source": "fork"}) == []


# -- agent.ainvoke on a thread ----------------------------------------------------------------------


async def test_ainvoke_with_a_thread_id_continues_the_conversation(make_runtime):
    agent = echo_agent()
    rt = await make_runtime({"agent": agent})
    tid = str(uuid.uuid4())
    first = await agent.ainvoke("hello", thread_id=tid)
    assert [m.text for m in first["messages"]] == ["hello", "echo: hello"]
    second = await agent.ainvoke({"messages": [{"role": "user", "content": "again"}]}, thread_id=tid)
    assert [m.text for m in second["messages"]] == ["hello", "echo: hello", "again", "echo: again"]
    # the thread lives in the runtime the agent is registered with
    thread = await rt.threads.get(tid)
    assert contents(thread["values"]) == ["hello", "echo: hello", "again", "echo: again"]
    assert len(await rt.runs.list(tid)) == 2


async def test_ainvoke_and_runs_share_the_thread(make_runtime):
    agent = echo_agent()
    rt = await make_runtime({"agent": agent})
    thread = await rt.threads.create()
    await rt.runs.wait(thread["thread_id"], "agent", input=user("via runs"))
    state = await agent.ainvoke("via ainvoke", thread_id=thread["thread_id"])
    assert [m.text for m in state["messages"]] == ["via runs", "echo: via runs", "via ainvoke",
                                                   "echo: via ainvoke"]


async def test_ainvoke_raises_the_agent_error(make_runtime):
    agent = create_agent(ScriptedModel([ValueError("model exploded")]))
    rt = await make_runtime({"agent": agent})
    tid = str(uuid.uuid4())
    with pytest.raises(ValueError, match="model exploded"):
        await agent.ainvoke("hi", thread_id=tid)
    assert (await rt.threads.get(tid))["status"] == "error"


async def test_ainvoke_with_a_thread_id_needs_a_runtime():
    agent = echo_agent(name="lonely")
    with pytest.raises(RuntimeError, match="register") as caught:
        await agent.ainvoke("hi", thread_id=str(uuid.uuid4()))
    assert "lonely" in str(caught.value) and "LocalRuntime" in str(caught.value)
    # without a thread it still runs in memory
    assert (await agent.ainvoke("hi"))["messages"][-1].text == "echo: hi"


async def test_thread_status_is_busy_while_running(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=0.2)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    assert (await rt.threads.get(tid))["status"] == "busy"
    assert [t["thread_id"] for t in await rt.threads.search(status="busy")] == [tid]
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "success"))
    assert (await rt.threads.get(tid))["status"] == "idle"
