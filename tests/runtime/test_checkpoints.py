"""Checkpoints: one per step, deltas that grow linearly, reading earlier states, and forking from them."""

import asyncio
import uuid

import orjson
import pytest
from runtime_helpers import contents, echo_agent, eventually, looping_agent, user

from backchannel import HumanMessage, NotFoundError, RemoveMessage, tool
from backchannel.messages import REMOVE_ALL_MESSAGES


async def _stored_bytes(rt, thread_id):
    return sum(len(c.delta) for c in await rt.storage.list_checkpoints(thread_id))


async def test_a_checkpoint_per_step(make_runtime):
    rt = await make_runtime({"agent": looping_agent(2)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    result = await rt.runs.wait(tid, "agent", input=user("go"))
    run_id = (await rt.runs.list(tid))[0]["run_id"]
    history = await rt.threads.get_history(tid, limit=100)
    # input, then model, tools, model, tools, model: one checkpoint each
    assert [h["metadata"]["source"] for h in reversed(history)] == ["input"] + ["loop"] * 5
    assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0, 1, 2, 3, 4]
    assert [len(h["values"]["messages"]) for h in reversed(history)] == [1, 2, 3, 4, 5, 6]
    assert [h["next"] for h in reversed(history)] == [["model"], ["tools"], ["model"], ["tools"], ["model"], []]
    assert all(h["metadata"]["run_id"] == run_id for h in history)
    assert history[0]["values"] == result
    assert len({h["checkpoint_id"] for h in history}) == 6


async def test_a_checkpoint_per_step_on_a_thread_made_with_its_run(make_runtime):
    # On Postgres, the run's input is recorded in the write that stores and claims the run (issue 22.2): the
    # same checkpoints, and the same stream, as on a thread that existed.
    rt = await make_runtime({"agent": looping_agent(1)})
    tid = str(uuid.uuid4())
    values = [part.data async for part in rt.runs.stream(tid, "agent", input=user("go"), stream_mode="values",
                                                         if_not_exists="create") if part.event == "values"]
    assert [len(v["messages"]) for v in values] == [1, 2, 3, 4]
    history = await rt.threads.get_history(tid, limit=100)
    assert [h["metadata"]["source"] for h in reversed(history)] == ["input", "loop", "loop", "loop"]
    assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0, 1, 2]
    assert [h["next"] for h in reversed(history)] == [["model"], ["tools"], ["model"], []]
    assert [h["parent_checkpoint"] for h in reversed(history)][:2] == [
        None, {"thread_id": tid, "checkpoint_ns": "", "checkpoint_id": history[-1]["checkpoint_id"]}]
    assert history[0]["values"] == values[-1]
    again = await rt.runs.wait(tid, "agent", input=user("again"))
    assert contents(again)[:4] == contents(values[-1]) and contents(again)[4] == "again"


async def test_what_a_reader_changes_in_what_it_read_back_changes_no_checkpoint(make_runtime):
    # The memory store keeps one metadata dict for all checkpoints of the same source and step, and a step's one
    # message without the dict and list around it (issue 22.5): every reader still gets values of its own.
    rt = await make_runtime({"agent": looping_agent(1)})
    threads = [(await rt.threads.create())["thread_id"] for _ in range(2)]
    for tid in threads:
        await rt.runs.wait(tid, "agent", input=user("go"))
    before = [await rt.threads.get_history(tid, limit=100) for tid in threads]
    for item in await rt.threads.get_history(threads[0], limit=100):
        item["metadata"]["step"] = 99
        item["metadata"]["source"] = "changed"
        item["values"]["messages"].clear()
    state = await rt.threads.get_state(threads[0], checkpoint_id=before[0][-1]["checkpoint_id"])
    state["values"]["messages"].append({"type": "human", "content": "added"})
    assert [await rt.threads.get_history(tid, limit=100) for tid in threads] == before
    for history in before:
        assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0, 1, 2]
        assert [len(h["values"]["messages"]) for h in reversed(history)] == [1, 2, 3, 4]


async def test_checkpoints_store_deltas_not_copies(make_runtime):
    rt = await make_runtime({"agent": looping_agent(30)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("go"))
    rows = await rt.storage.list_checkpoints(tid)
    assert len(rows) == 62  # input + 30 × (model, tools) + the answer
    # every step's delta is small and about the same size, however long the conversation is
    sizes = [len(r.delta) for r in rows[:-1]]  # the input checkpoint aside
    assert max(sizes) < 1000
    assert max(sizes[:10]) <= 2 * max(sizes[-10:]) and max(sizes[-10:]) <= 2 * max(sizes[:10])


@pytest.mark.parametrize("store", ["memory", "file"])
async def test_stored_bytes_grow_linearly(make_runtime, tmp_path, store):
    sizes = {}
    for steps in (100, 200):
        url = "memory" if store == "memory" else f"sqlite:///{tmp_path}/{steps}.db"
        rt = await make_runtime({"agent": looping_agent(steps)}, store=url)
        thread = await rt.threads.create()
        tid = thread["thread_id"]
        result = await rt.runs.wait(tid, "agent", input=user("go"))
        assert contents(result)[-1] == f"done after {steps} steps"
        if store == "memory":
            sizes[steps] = await _stored_bytes(rt, tid)
        else:
            await rt.close()
            sizes[steps] = sum(p.stat().st_size for p in tmp_path.glob(f"{steps}.db*"))
    # full copies per step would make this about 4×; deltas keep it about 2×
    assert sizes[200] <= 2.5 * sizes[100], sizes
    if store == "memory":
        assert sizes[200] >= 1.5 * sizes[100], sizes  # and the steps really were stored


async def test_state_at_each_checkpoint(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    for word in ("one", "two", "three"):
        await rt.runs.wait(tid, "agent", input=user(word))
    history = await rt.threads.get_history(tid)
    for h in history:
        state = await rt.threads.get_state(tid, checkpoint_id=h["checkpoint_id"])
        assert state["values"] == h["values"]
        assert state["checkpoint_id"] == h["checkpoint_id"]
    assert contents(history[3]["values"]) == ["one", "echo: one", "two"]


async def test_a_run_from_an_earlier_checkpoint_forks_the_thread(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    await rt.runs.wait(tid, "agent", input=user("two"))
    history = await rt.threads.get_history(tid)
    after_one = next(h for h in history if contents(h["values"]) == ["one", "echo: one"])

    result = await rt.runs.wait(tid, "agent", input=user("three"), checkpoint_id=after_one["checkpoint_id"])
    assert contents(result) == ["one", "echo: one", "three", "echo: three"]
    state = await rt.threads.get_state(tid)
    assert contents(state["values"]) == ["one", "echo: one", "three", "echo: three"]
    assert contents((await rt.threads.get(tid))["values"]) == ["one", "echo: one", "three", "echo: three"]
    # the new branch hangs off the chosen checkpoint
    new_history = await rt.threads.get_history(tid, limit=100)
    branch = [h for h in new_history if h["checkpoint_id"] not in {x["checkpoint_id"] for x in history}]
    assert len(branch) == 2
    assert branch[-1]["parent_checkpoint_id"] == after_one["checkpoint_id"]
    # the old branch is still readable
    old_tip = history[0]["checkpoint_id"]
    old = await rt.threads.get_state(tid, checkpoint_id=old_tip)
    assert contents(old["values"]) == ["one", "echo: one", "two", "echo: two"]
    # and the conversation goes on from the new branch
    await rt.runs.wait(tid, "agent", input=user("four"))
    assert contents((await rt.threads.get_state(tid))["values"]) == [
        "one", "echo: one", "three", "echo: three", "four", "echo: four"]


async def test_fork_with_a_checkpoint_dict(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    await rt.runs.wait(tid, "agent", input=user("two"))
    first = (await rt.threads.get_history(tid))[-1]  # the input checkpoint of "one"
    result = await rt.runs.wait(tid, "agent", input=user("again"),
                                checkpoint={"checkpoint_id": first["checkpoint_id"], "thread_id": tid,
                                            "checkpoint_ns": ""})
    assert contents(result) == ["one", "again", "echo: again"]


async def test_update_state_at_an_earlier_checkpoint_forks(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    await rt.runs.wait(tid, "agent", input=user("two"))
    history = await rt.threads.get_history(tid)
    after_one = next(h for h in history if contents(h["values"]) == ["one", "echo: one"])
    await rt.threads.update_state(tid, {"messages": [{"role": "user", "content": "instead"}]},
                                  checkpoint_id=after_one["checkpoint_id"])
    state = await rt.threads.get_state(tid)
    assert contents(state["values"]) == ["one", "echo: one", "instead"]
    assert state["metadata"]["source"] == "fork"
    assert state["parent_checkpoint_id"] == after_one["checkpoint_id"]


async def test_an_unknown_checkpoint_is_not_found(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    with pytest.raises(NotFoundError):
        await rt.runs.create(tid, "agent", input=user("x"), checkpoint_id="nope")
    with pytest.raises(NotFoundError):
        await rt.threads.get_history(tid, before="nope")
    assert len(await rt.runs.list(tid)) == 1


async def test_copy_of_a_thread_keeps_checkpoints_separate(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    copy = await rt.threads.copy(tid)
    await rt.runs.delete(tid, (await rt.runs.list(tid))[0]["run_id"])  # drops the original's checkpoints
    assert await rt.threads.get_history(tid) == []
    assert contents((await rt.threads.get_state(copy["thread_id"]))["values"]) == ["one", "echo: one"]


async def test_a_supervisor_s_state_stays_cached_through_a_fan_out_of_its_tasks(make_runtime, monkeypatch):
    from backchannel import ScriptedModel, tool
    from backchannel.deep_agent import create_deep_agent
    from backchannel.runtime import local
    from backchannel.runtime.checkpoints import Checkpointer
    from backchannel.subagents import SubAgent

    monkeypatch.setattr(local, "IDLE_STATES_KEPT", 2)  # few idle threads' states kept: the tasks' would push it out
    rebuilt = []
    fold = Checkpointer.at

    async def at(self, thread_id, checkpoint_id, reducers, **kwargs):
        rebuilt.append(thread_id)
        return await fold(self, thread_id, checkpoint_id, reducers, **kwargs)

    monkeypatch.setattr(Checkpointer, "at", at)
    k = 12

    def boss(request):
        if len(request.messages) == 1:
            return {"tool_calls": [{"name": "start_async_task", "args": {"description": f"job {i}",
                                                                         "subagent_type": "worker"}}
                                   for i in range(k)]}
        return "noted"

    @tool
    async def step() -> str:
        """One step of the work."""
        return "ok"

    def work(request):  # three steps, then the answer: the tasks write many checkpoints meanwhile
        steps = sum(1 for m in request.messages if m.type == "tool")
        return {"tool_calls": [{"name": "step", "args": {}}]} if steps < 3 else "done"

    worker = SubAgent("worker", "Works.", background=True, tools=[step],
                      model=ScriptedModel([work], loop=True, latency=0.02))
    agent = create_deep_agent(ScriptedModel([boss], loop=True), subagents=[worker], general_purpose=False,
                              max_concurrent_tasks=k)
    rt = await make_runtime({"supervisor": agent}, max_concurrency=k + 1)
    await rt.runs.wait("boss", "supervisor", input=user("go"), if_not_exists="create")

    async def all_reported() -> bool:  # every task reported back, each waking the supervisor's thread (notify mode)
        children = await rt.threads.search(metadata={"parent_thread_id": "boss"}, limit=100)
        return (len(children) == k and all(c["status"] == "idle" for c in children)
                and not await rt.storage.active_runs("boss") and not await rt.storage.inbox("boss"))

    await eventually(all_reported, timeout=10, interval=0.02)
    tasks = (await rt.threads.get_state("boss"))["values"]["async_tasks"]
    assert len(tasks) == k and {t["status"] for t in tasks.values()} == {"success"}
    assert "boss" not in rebuilt  # its wake-up runs found its state cached, not refolded from storage


async def test_deleting_runs_in_any_order_leaves_the_thread_readable_and_usable(make_runtime):
    """Issue 15.2: checkpoints are deltas chained across runs; deleting a run's must not break the others'."""
    rt = await make_runtime({"agent": looping_agent(2)})
    tid = (await rt.threads.create())["thread_id"]
    runs, states = [], []
    for word in ("one", "two", "three", "four"):
        await rt.runs.wait(tid, "agent", input=user(word))
        runs.append((await rt.runs.list(tid, limit=1))[0]["run_id"])
        states.append(contents((await rt.threads.get_state(tid))["values"]))  # 6 more messages a run

    async def check(expected_state, kept_runs):
        for cold in (False, True):
            if cold:
                rt.checkpoints.forget(tid)  # read back from storage, not the cached state
            assert contents((await rt.threads.get_state(tid))["values"]) == expected_state
            history = await rt.threads.get_history(tid, limit=100)
            assert len(history) == 6 * len(kept_runs)
            assert {h["metadata"]["run_id"] for h in history} == set(kept_runs)
            for h in history[::5]:
                assert (await rt.threads.get_state(tid, checkpoint_id=h["checkpoint_id"]))["values"] == h["values"]

    await rt.runs.delete(tid, runs[1])  # an earlier run: its checkpoints go, every other state stays
    await check(states[3], [runs[0], runs[2], runs[3]])
    await rt.runs.delete(tid, runs[0])  # the first
    await check(states[3], [runs[2], runs[3]])
    await rt.runs.delete(tid, runs[3])  # the newest: the thread's state is its newest checkpoint left's
    await check(states[2], [runs[2]])
    assert [r["run_id"] for r in await rt.runs.list(tid)] == [runs[2]]
    result = await rt.runs.wait(tid, "agent", input=user("five"))  # and it goes on from there
    assert contents(result) == states[2] + contents(result)[len(states[2]):]
    assert contents(result)[len(states[2]):][0] == "five" and contents(result)[-1] == "done after 2 steps"
    await rt.runs.delete(tid, runs[2])
    rt.checkpoints.forget(tid)
    assert contents((await rt.threads.get_state(tid))["values"]) == contents(result)


async def test_deleting_the_run_a_running_run_started_from(make_runtime):
    """The run being deleted wrote the checkpoint another run, running now, goes on from."""
    entered, release = asyncio.Event(), asyncio.Event()

    @tool
    async def step(i: int) -> str:
        """Wait for the test."""
        entered.set()
        await release.wait()
        return "waited"

    rt = await make_runtime({"agent": looping_agent(1, tools=[step]), "quick": echo_agent()})
    tid = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(tid, "quick", input=user("first"))
    first = (await rt.runs.list(tid))[0]["run_id"]
    second = await rt.runs.create(tid, "agent", input=user("second"))
    await asyncio.wait_for(entered.wait(), 10)
    await rt.runs.delete(tid, first)  # the second run's checkpoints so far now stand alone
    release.set()
    result = await rt.runs.join(tid, second["run_id"])
    expected = ["first", "echo: first", "second", "", "waited", "done after 1 steps"]
    assert contents(result) == expected
    rt.checkpoints.forget(tid)
    assert contents((await rt.threads.get_state(tid))["values"]) == expected
    assert [len(h["values"]["messages"]) for h in await rt.threads.get_history(tid)] == [6, 5, 4, 3]


async def test_a_checkpoint_whose_parent_was_deleted_meanwhile_is_written_whole(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    tid = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("first"))
    first = (await rt.runs.list(tid))[0]["run_id"]
    state = await rt.checkpoints.latest(tid, {})  # what a run about to go on from the first's end holds
    await rt.runs.delete(tid, first)
    row = await rt.checkpoints.write(tid, state, {"messages": [HumanMessage("more")]}, next_stage="",
                                     source="update", run_id=None, step=2, reducers={})
    assert row.whole
    rt.checkpoints.forget(tid)
    assert contents((await rt.threads.get_state(tid))["values"]) == ["first", "echo: first", "more"]


async def test_a_whole_checkpoint_is_written_where_a_read_would_fold_much_more_than_the_state(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})

    async def writer(tid):
        state = await rt.checkpoints.latest(tid, {})
        return lambda update, step: rt.checkpoints.write(tid, state, update, next_stage="", source="update",
                                                         run_id=None, step=step, reducers={})

    async def read_back(tid):
        values = (await rt.threads.get_state(tid))["values"]
        rt.checkpoints.forget(tid)
        assert (await rt.threads.get_state(tid))["values"] == values
        return values

    # a conversation that only grows: every delta is still in the state, nothing is stored twice
    chat = (await rt.threads.create())["thread_id"]
    write = await writer(chat)
    rows = [await write({"messages": [HumanMessage(f"message {i} " + "x" * 300)]}, i) for i in range(300)]
    assert not any(r.whole for r in rows)
    # ... until a summary replaces the history: then the small state is written whole at once
    summary = await write({"messages": [RemoveMessage(REMOVE_ALL_MESSAGES), HumanMessage("summary")]}, 300)
    assert summary.whole
    assert contents(await read_back(chat)) == ["summary"]
    assert len((await rt.threads.get_history(chat, limit=2))[1]["values"]["messages"]) == 300

    # a key rewritten at every step: a read would fold 4 kB a step for a 4 kB state
    planner = (await rt.threads.create())["thread_id"]
    write = await writer(planner)
    plan = "p" * 4000
    rows = [await write({"plan": f"{i} {plan}"}, i) for i in range(100)]
    assert 3 <= sum(r.whole for r in rows) <= 10
    chain = await rt.storage.checkpoint_chain(planner, rows[-1].checkpoint_id)
    assert chain[0].whole and len(chain) <= 20
    assert (await read_back(planner))["plan"] == f"99 {plan}"
    history = await rt.threads.get_history(planner, limit=100)
    assert [h["values"]["plan"] for h in history] == [f"{i} {plan}" for i in range(99, -1, -1)]


async def test_history_taken_back_from_the_cached_state_is_the_history_read_from_storage(make_runtime, monkeypatch):
    rt = await make_runtime({"agent": looping_agent(2)})
    tid = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    first = (await rt.threads.get_state(tid))["values"]["messages"][0]
    await rt.threads.update_state(tid, {"messages": [RemoveMessage(id=first["id"])]})
    await rt.threads.update_state(tid, {"note": "a key besides messages"})
    await rt.runs.wait(tid, "agent", input=user("two"))
    last = (await rt.threads.get_state(tid))["values"]["messages"][-1]
    await rt.threads.update_state(tid, {"messages": [{**last, "content": "replaced"}]})  # same id: a replacement
    await rt.threads.update_state(tid, {"messages": [HumanMessage("three")]})

    reads = 0
    chain = rt.storage.checkpoint_chain

    async def counted(*args, **kwargs):
        nonlocal reads
        reads += 1
        return await chain(*args, **kwargs)

    monkeypatch.setattr(rt.storage, "checkpoint_chain", counted)
    recent = await rt.threads.get_history(tid, limit=2)
    assert reads == 0  # the last step only appended a message: taken back from the cached state
    cached = await rt.threads.get_history(tid, limit=30)
    rt.checkpoints.forget(tid)
    assert await rt.threads.get_history(tid, limit=30) == cached
    assert cached[:2] == recent
    counts = [len(h["values"]["messages"]) for h in reversed(cached)]
    # run one (1-6), the removal (5), the note (5), run two (6-11), the replacement (11), a message (12)
    assert counts == [1, 2, 3, 4, 5, 6, 5, 5, 6, 7, 8, 9, 10, 11, 11, 12]
    assert [m["content"] for m in cached[1]["values"]["messages"]][-1] == "replaced"
    assert [m["content"] for m in cached[2]["values"]["messages"]][-1] != "replaced"
    assert "note" not in cached[-7]["values"] and cached[-8]["values"]["note"] == "a key besides messages"


async def test_a_long_thread_is_read_from_its_nearest_base_as_it_would_be_folded_from_its_first(make_runtime,
                                                                                                 monkeypatch):
    from backchannel.runtime import checkpoints

    monkeypatch.setattr(checkpoints, "_BASE_EVERY", 8)
    rt = await make_runtime({"agent": echo_agent()})
    tid = (await rt.threads.create())["thread_id"]
    state = await rt.checkpoints.latest(tid, {})

    async def write(update):
        return await rt.checkpoints.write(tid, state, update, next_stage="", source="update", run_id=None, step=0,
                                          reducers={})

    for i in range(120):
        await write({"messages": [HumanMessage(f"m{i} é \U0001f600 {i / 3}")]})
        if i == 30:
            await write({"plan": "a key besides messages"})
        if i == 45:  # a replacement (same id), then a removal: steps that do more than append
            await write({"messages": [HumanMessage("edited", id=state.values["messages"][10].id)]})
        if i == 61:
            await write({"messages": [RemoveMessage(id=state.values["messages"][20].id)]})
    fork_from = (await rt.threads.get_history(tid, limit=40))[-1]["checkpoint_id"]
    await rt.threads.update_state(tid, {"messages": [HumanMessage("a fork")]}, checkpoint_id=fork_from)
    await rt.threads.update_state(tid, {"messages": [HumanMessage("after the fork")]})
    cached = await rt.threads.get_state(tid)

    chains = []
    chain, based = rt.storage.checkpoint_chain, rt.storage.based_chain

    async def spied(*args, **kwargs):
        chains.append(await chain(*args, **kwargs))
        return chains[-1]

    async def spied_based(*args, **kwargs):
        bases, found = await based(*args, **kwargs)
        chains.append(found)
        return bases, found

    monkeypatch.setattr(rt.storage, "checkpoint_chain", spied)
    monkeypatch.setattr(rt.storage, "based_chain", spied_based)
    rt.checkpoints.forget(tid)
    state_read = await rt.threads.get_state(tid)
    if type(rt.storage).__name__ != "MemoryStorage":  # a store in memory keeps no text to read
        assert len(chains[-1]) <= 8 + 1
    history = await rt.threads.get_history(tid, limit=1000)
    stored_json = [await rt.threads.get_state(tid, stored_json=True),
                   *await rt.threads.get_history(tid, limit=1000, stored_json=True)]
    continued = rt.checkpoints.jsonable(tid, (await rt.checkpoints.latest(tid, {})).values)

    async def no_bases(thread_id, *args):
        return [], []

    monkeypatch.setattr(rt.storage, "based_chain", no_bases)  # every state folded from the first checkpoint
    rt.checkpoints.forget(tid)
    folded = await rt.threads.get_history(tid, limit=1000)
    assert state_read == cached == folded[0]
    assert history == folded
    assert continued == folded[0]["values"]
    # what the server sends, its stored text spliced unparsed: the same bytes as the parsed states' encoding
    assert orjson.dumps(stored_json) == orjson.dumps([folded[0], *folded])
    messages = [m["content"] for m in folded[0]["values"]["messages"]]
    assert len(folded) == 125 and messages[10] == "edited" and not any(c.startswith("m20 ") for c in messages)
    # forked at the 84th checkpoint (81 messages written, one removed), then two more
    assert messages[-2:] == ["a fork", "after the fork"] and len(messages) == 80 + 2


def _plain(value):
    """``value`` with every dict and list checked to be a plain one (as a JSON parse gives): its copy."""
    if isinstance(value, dict):
        assert type(value) is dict, type(value)
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        assert type(value) is list, type(value)
        return [_plain(v) for v in value]
    assert type(value) in (str, int, float, bool, type(None)), type(value)
    return value


async def test_a_long_thread_read_back_is_what_its_steps_wrote_in_plain_values_of_its_own(make_runtime, monkeypatch):
    # A state read back from storage (after a restart, or once it left the cache) is the messages the agent
    # held, field for field, in order, with their ids: plain dicts and lists, each read's own to change.
    from backchannel import AIMessage, ToolMessage
    from backchannel.messages import message_to_dict
    from backchannel.runtime import checkpoints

    monkeypatch.setattr(checkpoints, "_BASE_EVERY", 8)
    rt = await make_runtime({"agent": echo_agent()})
    tid = (await rt.threads.create())["thread_id"]
    state = await rt.checkpoints.latest(tid, {})

    async def write(update):
        await rt.checkpoints.write(tid, state, update, next_stage="", source="update", run_id=None, step=0,
                                   reducers={})

    for i in range(60):
        call = {"name": "step", "args": {"i": i, "deep": {"list": [i, "é"]}}, "id": f"call_{i}", "type": "tool_call"}
        await write({"messages": [HumanMessage(f"go {i} \U0001f600")]})
        await write({"messages": [AIMessage("", tool_calls=[call], response_metadata={"model": "m"},
                                            usage_metadata={"input_tokens": i, "output_tokens": 1,
                                                            "total_tokens": i + 1})]})
        await write({"messages": [ToolMessage(f"step {i} done", tool_call_id=f"call_{i}", artifact={"n": i}),
                                  AIMessage(f"{i} done", additional_kwargs={"k": [1, {"v": i}]})]})
        if i == 40:
            await write({"plan": {"after": i}})
    written = [message_to_dict(m) for m in state.values["messages"]]
    expected = orjson.loads(orjson.dumps(written))  # as JSON gives them: tuples as lists
    head = state.head.checkpoint_id
    rt.checkpoints.forget(tid)

    read = await rt.threads.get_state(tid)
    assert _plain(read["values"]) == {"messages": expected, "plan": {"after": 40}}
    assert [m["id"] for m in read["values"]["messages"]] == [m.id for m in state.values["messages"]]
    at = await rt.threads.get_state(tid, checkpoint_id=head)
    assert _plain(at["values"]) == read["values"]
    history = await rt.threads.get_history(tid, limit=12)
    assert history[0]["values"] == read["values"]
    counts = [len(h["values"]["messages"]) for h in history]
    assert counts == [240, 238, 237, 236, 234, 233, 232, 230, 229, 228, 226, 225]
    for entry, count in zip(history, counts, strict=True):
        assert _plain(entry["values"]["messages"]) == expected[:count]

    # each read's own values: changing one changes neither storage nor the next read
    message = read["values"]["messages"][1]
    message["tool_calls"][0]["args"]["deep"]["list"].append("changed")
    message["additional_kwargs"]["x"] = 1
    read["values"]["messages"].append({"type": "human"})
    history[0]["values"]["messages"][4]["content"] = "changed"
    rt.checkpoints.forget(tid)
    assert (await rt.threads.get_state(tid))["values"]["messages"] == expected
    assert (await rt.threads.get_history(tid, limit=1))[0]["values"]["messages"] == expected


async def test_integers_past_64_bits_in_the_state_are_read_back_exactly(make_runtime, store_url):
    # orjson, which reads the stored states, takes an integer past 64 bits for a float: 2**70 + 1 came back 2**70.
    numbers = {"big": 2**70 + 1, "low": -(2**63) - 1, "max": 2**64 - 1, "digits": "12345678901234567890"}
    message = HumanMessage("hi", additional_kwargs=numbers)
    rt = await make_runtime({"agent": echo_agent()})
    tid = (await rt.threads.create(metadata=numbers))["thread_id"]
    await rt.runs.wait(tid, "agent", input={"messages": [message]}, metadata=numbers)
    readers = [rt]
    if store_url != "memory":  # a second runtime on the same database reads everything from storage
        readers.append(await make_runtime({"agent": echo_agent()}, store=store_url))
    for reader in readers:
        state = await reader.threads.get_state(tid)
        history = await reader.threads.get_history(tid, limit=10)
        thread = await reader.threads.get(tid)
        run = (await reader.runs.list(tid))[0]
        assert state["values"]["messages"][0]["additional_kwargs"] == numbers
        assert all(h["values"]["messages"][0]["additional_kwargs"] == numbers for h in history)
        assert {k: thread["metadata"][k] for k in numbers} == numbers
        assert {k: run["metadata"][k] for k in numbers} == numbers
