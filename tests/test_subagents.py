"""The synchronous ``task`` tool, and how subagent runs are named in the supervisor's event stream."""

import asyncio
import time

from subagent_helpers import call, policy, start, tool_messages

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage, create_agent, interrupt, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.subagents import SubAgent, forked_history


def task(subagent_type, description, id):
    return call("task", {"description": description, "subagent_type": subagent_type}, id)


def supervisor(*replies, **kwargs):
    return ScriptedModel(list(replies), **kwargs)


def lifecycle(events, namespace=None):
    return [e for e in events if e.type == "lifecycle" and (namespace is None or e.namespace == namespace)]


# -- running a subagent with `task` ----------------------------------------------------------------


async def test_task_runs_the_subagent_on_a_fresh_context_and_returns_its_final_answer():
    sub_model = ScriptedModel([{"tool_calls": [call("noop", {}, "n1")]}, "The capital is Paris."])
    sub_model.record = True

    @tool
    def noop() -> str:
        """Do nothing."""
        return "nothing"

    agent = create_deep_agent(
        supervisor({"content": "Delegating.", "tool_calls": [task("geo", "What is the capital of France?", "t1")]},
                   "Paris, says my geographer."),
        subagents=[SubAgent("geo", "Geography.", model=sub_model, tools=[noop], system_prompt="You know maps.")])
    state = await agent.ainvoke([HumanMessage("earlier question"), AIMessage("earlier answer"),
                                 HumanMessage("Capital of France?")])

    first = sub_model.requests[0]
    assert [(type(m), m.text) for m in first.messages] == [(HumanMessage, "What is the capital of France?")]
    assert first.system_prompt == "You know maps."
    assert len(sub_model.requests) == 2  # the subagent ran its own loop to the end
    [result] = tool_messages(state["messages"], "task")
    assert result.status == "success" and result.text == "The capital is Paris." and result.tool_call_id == "t1"
    assert state["messages"][-1].text == "Paris, says my geographer."
    # Only the answer comes back: none of the subagent's own messages enter the supervisor's state.
    assert not any(m.text == "nothing" for m in state["messages"])


async def test_forked_subagent_sees_the_parents_history_but_not_the_calling_reply():
    forked_model = ScriptedModel(["forked answer"])
    forked_model.record = True
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("fork", "continue from here", "t1")]}, "done"),
        subagents=[SubAgent("fork", "Forked.", model=forked_model, fork=True)])
    await agent.ainvoke([HumanMessage("my name is Ada"), AIMessage("hello Ada"), HumanMessage("help")])
    seen = forked_model.requests[0].messages
    assert [m.text for m in seen] == ["my name is Ada", "hello Ada", "help", "continue from here"]
    assert not any(isinstance(m, AIMessage) and m.tool_calls for m in seen)

    # forked_history drops only the reply whose calls are still running.
    calling = AIMessage("", [{"name": "task", "args": {}, "id": "x", "type": "tool_call"}])
    history = [HumanMessage("a"), calling]
    assert forked_history(history) == history[:1]
    answered = [HumanMessage("a"), calling, ToolMessage("r", "x")]
    assert forked_history(answered) == answered


async def test_parallel_task_calls_run_concurrently():
    slow = ScriptedModel(["slow answer"], loop=True, latency=0.3)
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("slow", "part one", "t1"), task("slow", "part two", "t2"),
                                   task("slow", "part three", "t3")]}, "all done"),
        subagents=[SubAgent("slow", "Slow.", model=slow)])
    began = time.monotonic()
    state = await agent.ainvoke("do three things")
    elapsed = time.monotonic() - began
    results = tool_messages(state["messages"], "task")
    assert [m.tool_call_id for m in results] == ["t1", "t2", "t3"]
    assert all(m.text == "slow answer" for m in results)
    assert elapsed < 0.6, f"three 0.3 s subagents took {elapsed:.2f}s: they ran one after another"


async def test_unknown_subagent_type_is_an_error_result_listing_valid_types():
    agent = create_deep_agent(supervisor({"tool_calls": [task("wizard", "magic", "t1")]}, "sorry"),
                              subagents=[SubAgent("alpha", "A."), SubAgent("beta", "B.")])
    state = await agent.ainvoke("go")
    [result] = tool_messages(state["messages"], "task")
    assert result.status == "error"
    assert "'wizard'" in result.text
    for name in ("general-purpose", "alpha", "beta"):
        assert name in result.text
    assert state["messages"][-1].text == "sorry"  # the run went on


async def test_failing_subagent_is_an_error_result_and_its_siblings_finish():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("broken", "fail please", "t1"), task("fine", "work please", "t2")]},
                   "recovered"),
        subagents=[SubAgent("broken", "Breaks.", model=ScriptedModel([RuntimeError("model exploded")])),
                   SubAgent("fine", "Works.", model=ScriptedModel(["fine result"], latency=0.1))])
    state = await agent.ainvoke("go")
    broken, fine = tool_messages(state["messages"], "task")
    assert broken.status == "error" and "broken" in broken.text and "model exploded" in broken.text
    assert fine.status == "success" and fine.text == "fine result"
    assert state["messages"][-1].text == "recovered"


async def test_sync_task_honours_the_subagents_timeout():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("slow", "take forever", "t1"), task("quick", "be quick", "t2")]},
                   "moved on"),
        subagents=[SubAgent("slow", "Hangs.", model=ScriptedModel(["too late"], latency=30), timeout=0.5),
                   SubAgent("quick", "Quick.", model=ScriptedModel(["quick answer"]), timeout=0.5)])
    started = time.monotonic()
    stream = agent.astream("go")
    events = [e async for e in stream]
    elapsed = time.monotonic() - started
    state = stream.result
    slow, quick = tool_messages(state["messages"], "task")
    assert slow.status == "error" and "slow" in slow.text and "0.5" in slow.text and "timed out" in slow.text
    assert quick.status == "success" and quick.text == "quick answer"
    assert state["messages"][-1].text == "moved on"
    assert elapsed < 5  # 30 s if the timeout were ignored
    [ended] = [e for e in lifecycle(events, ("slow:t1",)) if e.data["event"] != "started"]
    assert ended.data["event"] in ("failed", "cancelled")


async def test_subagent_that_asks_for_human_input_is_an_error_for_sync_task():
    @tool
    def ask() -> str:
        """Ask the user."""
        return interrupt("which city?")

    agent = create_deep_agent(
        supervisor({"tool_calls": [task("asker", "ask", "t1")]}, "ok"),
        subagents=[SubAgent("asker", "Asks.", tools=[ask],
                            model=ScriptedModel([{"tool_calls": [call("ask", {}, "a1")]}, "never"]))])
    state = await agent.ainvoke("go")
    [result] = tool_messages(state["messages"], "task")
    assert result.status == "error" and "background" in result.text
    assert "__interrupt__" not in state  # the supervisor itself was not paused


# -- lifecycle naming (seed 002) ---------------------------------------------------------------------


async def test_sync_subagent_is_reported_by_name_with_the_tool_call_as_cause():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("researcher", "look it up", "call_abc")]}, "done"),
        subagents=[SubAgent("researcher", "Researches.", model=ScriptedModel(["found it"]))], name="boss")
    events = [e async for e in agent.astream("go")]
    root = lifecycle(events, ())
    assert [e.data["event"] for e in root] == ["started", "completed"]
    assert all(e.data["graph_name"] == "boss" and "cause" not in e.data for e in root)

    nested = [e for e in lifecycle(events) if e.namespace]
    assert [(e.data["event"], e.namespace) for e in nested] == [
        ("started", ("researcher:call_abc",)), ("completed", ("researcher:call_abc",))]
    for e in nested:
        assert e.data["graph_name"] == "researcher"
        assert e.data["cause"] == {"type": "toolCall", "tool_call_id": "call_abc"}
        assert e.agent == "researcher"
        assert e.to_dict()["namespace"] == ["researcher:call_abc"]
    # The subagent's own messages are in the stream under its namespace, between its start and end.
    sub_messages = [e for e in events if e.type == "message" and e.namespace == ("researcher:call_abc",)]
    assert sub_messages and nested[0].seq < sub_messages[0].seq < nested[1].seq


async def test_failing_subagent_is_reported_failed():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("broken", "x", "c1")]}, "ok"),
        subagents=[SubAgent("broken", "Breaks.", model=ScriptedModel([RuntimeError("nope")]))])
    events = [e async for e in agent.astream("go")]
    nested = lifecycle(events, ("broken:c1",))
    assert [e.data["event"] for e in nested] == ["started", "failed"]
    assert nested[1].data["cause"] == {"type": "toolCall", "tool_call_id": "c1"}
    assert nested[1].data["error"]["type"] == "RuntimeError"
    assert [e.data["event"] for e in lifecycle(events, ())] == ["started", "completed"]


async def test_parallel_subagents_each_have_their_own_cause():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("a", "x", "c1"), task("b", "y", "c2")]}, "ok"),
        subagents=[SubAgent("a", "A.", model=ScriptedModel(["ra"], latency=0.02)),
                   SubAgent("b", "B.", model=ScriptedModel(["rb"]))])
    events = [e async for e in agent.astream("go")]
    started = {e.namespace: e.data for e in lifecycle(events) if e.namespace and e.data["event"] == "started"}
    assert started == {
        ("a:c1",): {"event": "started", "graph_name": "a", "cause": {"type": "toolCall", "tool_call_id": "c1"}},
        ("b:c2",): {"event": "started", "graph_name": "b", "cause": {"type": "toolCall", "tool_call_id": "c2"}}}


async def test_plain_tools_and_unnamed_nested_agents_are_not_subagents_but_named_ones_are():
    inner_unnamed = create_agent(ScriptedModel(["inner says hi"], loop=True))
    inner_named = create_agent(ScriptedModel(["named says hi"], loop=True), name="helper")

    @tool
    def plain(x: int) -> int:
        """A plain tool."""
        return x * 2

    @tool
    async def unnamed_inside() -> str:
        """Runs an unnamed agent."""
        state = await inner_unnamed.ainvoke("hello")
        return state["messages"][-1].text

    @tool
    async def named_inside() -> str:
        """Runs a named agent."""
        state = await inner_named.ainvoke("hello")
        return state["messages"][-1].text

    agent = create_agent(
        supervisor({"tool_calls": [call("plain", {"x": 2}, "p1"), call("unnamed_inside", {}, "u1")]},
                   {"tool_calls": [call("named_inside", {}, "n1")]}, "done"),
        [plain, unnamed_inside, named_inside], name="root")
    stream = agent.astream("go")
    handles = []

    async def collect():
        async for handle in stream.subagents:
            handles.append(handle)

    collector = asyncio.create_task(collect())
    events = [e async for e in stream]
    await collector
    results = {m.tool_call_id: m.text for m in tool_messages(stream.result["messages"])}
    assert results == {"p1": "4", "u1": "inner says hi", "n1": "named says hi"}

    nested = [e for e in lifecycle(events) if e.namespace]
    assert [(e.data["event"], e.namespace, e.data["graph_name"], e.data["cause"]) for e in nested] == [
        ("started", ("helper:n1",), "helper", {"type": "toolCall", "tool_call_id": "n1"}),
        ("completed", ("helper:n1",), "helper", {"type": "toolCall", "tool_call_id": "n1"})]
    assert [(h.name, h.cause, h.status) for h in handles] == [
        ("helper", {"type": "toolCall", "tool_call_id": "n1"}, "success")]


async def test_a_subagent_named_like_its_parent_is_still_reported():
    agent = create_deep_agent(
        supervisor({"tool_calls": [task("boss", "recurse once", "c9")]}, "done"),
        subagents=[SubAgent("boss", "Same name as the supervisor.", model=ScriptedModel(["inner boss"]))],
        name="boss")
    events = [e async for e in agent.astream("go")]
    nested = lifecycle(events, ("boss:c9",))
    assert [e.data["event"] for e in nested] == ["started", "completed"]
    assert nested[0].data["graph_name"] == "boss"
    assert nested[0].data["cause"] == {"type": "toolCall", "tool_call_id": "c9"}


async def test_lifecycle_metadata_drops_internal_keys_and_tags():
    metadata = {"user_key": 1, "langgraph_step": 3, "thread_id": "x", "tags": ["seq:step:1", "mine"]}

    def build():
        return create_deep_agent(
            supervisor({"tool_calls": [task("researcher", "x", "c1")]}, "done"),
            subagents=[SubAgent("researcher", "R.", model=ScriptedModel(["r"]))], name="boss")

    events = [e async for e in build().astream("go", metadata=metadata)]
    for e in lifecycle(events):
        assert e.data["metadata"] == {"user_key": 1, "tags": ["mine"]}, e
    assert len(lifecycle(events, ("researcher:c1",))) == 2

    # On a runtime thread the run's own bookkeeping (graph id, assistant id, thread id) is dropped too.
    agent = build()
    async with LocalRuntime("memory", agents={"boss": agent}):
        events = [e async for e in agent.astream("go", thread_id="t1", metadata=metadata)]
    found = lifecycle(events)
    assert len(found) == 4
    for e in found:
        assert e.data["metadata"] == {"user_key": 1, "tags": ["mine"]}, e


async def test_background_tasks_are_linked_to_their_start_call_in_the_supervisors_stream():
    def boss(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
            return "all reported"
        if isinstance(last, HumanMessage):
            return {"tool_calls": [start("researcher", "dig", "call_bg1"), start("analyst", "crunch", "call_bg2")]}
        return "started both"

    agent = create_deep_agent(
        policy(boss),
        subagents=[SubAgent("researcher", "R.", background=True, model=ScriptedModel(["dug"], latency=0.05)),
                   SubAgent("analyst", "A.", background=True, model=ScriptedModel([RuntimeError("bad")]))],
        completion="wait", general_purpose=False, name="boss")
    async with LocalRuntime("memory", agents={"boss": agent}):
        events = [e async for e in agent.astream("go", thread_id="t1")]
    for segment, call_id, ending in [("researcher:call_bg1", "call_bg1", "completed"),
                                     ("analyst:call_bg2", "call_bg2", "failed")]:
        found = lifecycle(events, (segment,))
        assert [e.data["event"] for e in found] == ["started", ending], segment
        for e in found:
            assert e.data["graph_name"] == segment.split(":")[0]
            assert e.data["cause"] == {"type": "toolCall", "tool_call_id": call_id}
    task_events = [e for e in events if e.type == "task" and e.data.get("event") != "drained"]
    assert {e.data["tool_call_id"] for e in task_events} == {"call_bg1", "call_bg2"}
    # The supervisor's own run ends after its tasks (wait mode) and is reported last.
    assert events[-1].type == "lifecycle" and events[-1].namespace == () and events[-1].data["event"] == "completed"
