"""Events: the bus, and the event stream of a run (messages, tools, lifecycle, nested agents)."""

import pytest

from backchannel import (
    AIMessage,
    Event,
    EventBus,
    MiddlewareError,
    ModelError,
    ScriptedModel,
    create_agent,
    tool,
)
from backchannel.context import RunContext
from backchannel.events import filter_metadata
from backchannel.middleware import before_model


def call(name, args=None, id="call_1"):
    return {"name": name, "args": args or {}, "id": id}


async def collect(agent, input="hi", **kw):
    stream = agent.astream(input, **kw)
    events = [e async for e in stream]
    return events, stream.result


def of(events, type, event=None):
    return [e for e in events if e.type == type and (event is None or e.data.get("event") == event)]


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


# -- the bus -------------------------------------------------------------------------


def test_bus_numbers_events_and_fans_out():
    bus = EventBus()
    got_a, got_b = [], []
    bus.subscribe(got_a.append)
    unsubscribe = bus.subscribe(got_b.append)
    bus.publish(Event("custom", 1))
    unsubscribe()
    bus.publish(Event("custom", 2))
    assert [e.seq for e in got_a] == [1, 2]
    assert [e.data for e in got_b] == [1]


def test_run_context_emit_is_a_no_op_without_listeners():
    bus = EventBus()
    ctx = RunContext("a", "r", bus=bus)
    ctx.emit("custom", 1)
    assert bus.seq == 0  # nothing was numbered or built


def test_event_to_dict():
    e = Event("tool", {"x": 1}, ("sub:call_1",), "sub", "t1", "r1", 7)
    assert e.to_dict() == {"type": "tool", "namespace": ["sub:call_1"], "agent": "sub", "thread_id": "t1",
                           "run_id": "r1", "seq": 7, "data": {"x": 1}}


def test_filter_metadata_drops_framework_keys_and_tags_only():
    # Seed 002 (last revision): only framework keys (langgraph_*, thread_id, checkpoint_*) and the internal
    # seq:step tags are dropped; lc_*/ls_* keys, user metadata and the other tags ride along.
    meta = {"user": "u", "langgraph_step": 3, "langgraph_node": "tools", "langgraph_checkpoint_ns": "x:1",
            "__pregel_task_id": "1", "thread_id": "t", "checkpoint_ns": "", "checkpoint_id": "c",
            "tags": ["mine", "seq:step:1", "langsmith:hidden"], "ls_provider": "x", "ls_integration": "deepagents",
            "lc_agent_name": "researcher", "ls_custom": 1}
    assert filter_metadata(meta) == {"user": "u", "tags": ["mine", "langsmith:hidden"], "ls_provider": "x",
                                     "ls_integration": "deepagents", "lc_agent_name": "researcher", "ls_custom": 1}
    assert filter_metadata({"tags": ["seq:step:2"]}) == {}
    assert filter_metadata({"langgraph_step": 1, "thread_id": "t", "checkpoint_ns": ""}) == {}
    assert filter_metadata(None) == {}


# -- a run's events ---------------------------------------------------------------------


async def test_every_event_has_the_common_fields_and_increasing_seq():
    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 2})]}, "3"]), [add],
                         name="calc")
    events, state = await collect(agent, "1+2?", values=True)
    assert state["messages"][-1].text == "3"
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[0] >= 1
    run_ids = {e.run_id for e in events}
    assert len(run_ids) == 1 and None not in run_ids
    for e in events:
        d = e.to_dict()
        assert set(d) == {"type", "namespace", "agent", "thread_id", "run_id", "seq", "data"}
        assert d["namespace"] == [] and d["agent"] == "calc" and d["thread_id"] is None
    assert {e.type for e in events} >= {"lifecycle", "message", "tool", "updates", "values"}


async def test_lifecycle_started_first_and_completed_last():
    agent = create_agent(ScriptedModel(["hello"]))
    events, _ = await collect(agent)
    assert events[0].type == "lifecycle" and events[0].data["event"] == "started"
    assert events[0].data["graph_name"] == "agent"
    assert events[-1].type == "lifecycle" and events[-1].data["event"] == "completed"
    assert "cause" not in events[0].data


async def test_message_events_stream_text_and_finish_with_usage():
    usage = {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}
    model = ScriptedModel([{"content": "The answer is forty two", "usage": usage}])
    agent = create_agent(model)
    events, state = await collect(agent)
    msgs = of(events, "message")
    assert [e.data["event"] for e in msgs][0] == "start"
    assert [e.data["event"] for e in msgs][-1] == "finish"
    deltas = [e.data["text"] for e in of(events, "message", "delta")]
    assert len(deltas) > 1
    final = state["messages"][-1]
    assert "".join(deltas) == final.text == "The answer is forty two"
    finish = of(events, "message", "finish")[0]
    assert finish.data["usage"] == usage
    assert final.usage_metadata == usage
    # one message id ties the events to the message in the state
    assert {e.data["message_id"] for e in msgs} == {final.id}


async def test_message_finish_without_usage():
    events, _ = await collect(create_agent(ScriptedModel(["plain"])))
    assert of(events, "message", "finish")[0].data["usage"] is None


async def test_tool_call_deltas_are_streamed():
    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 2}, "call_7")]}, "ok"]), [add])
    events, _ = await collect(agent)
    pieces = [e.data["tool_call"] for e in of(events, "message", "delta") if "tool_call" in e.data]
    assert pieces[0]["id"] == "call_7" and pieces[0]["name"] == "add"
    assert "".join(p["args"] for p in pieces) == '{"a": 1, "b": 2}'


async def test_tool_events_started_finished_and_error():
    @tool
    def boom() -> str:
        """Boom."""
        raise RuntimeError("nope")

    script = [{"tool_calls": [call("add", {"a": 2, "b": 2}, "c_ok"), call("boom", {}, "c_err")]}, "done"]
    agent = create_agent(ScriptedModel(script), [add, boom])
    events, _ = await collect(agent)
    started = of(events, "tool", "started")
    assert {(e.data["tool_call_id"], e.data["tool_name"]) for e in started} == {("c_ok", "add"), ("c_err", "boom")}
    assert [e.data["args"] for e in started if e.data["tool_call_id"] == "c_ok"] == [{"a": 2, "b": 2}]
    [finished] = of(events, "tool", "finished")
    assert finished.data["tool_call_id"] == "c_ok" and finished.data["message"].text == "4"
    [error] = of(events, "tool", "error")
    assert error.data["tool_call_id"] == "c_err" and error.data["tool_name"] == "boom"
    assert "RuntimeError: nope" in error.data["message"].text


async def test_lifecycle_failed_on_a_model_error():
    agent = create_agent(ScriptedModel([ModelError("provider down")]))
    stream = agent.astream("hi")
    events = []
    with pytest.raises(ModelError, match="provider down"):
        async for e in stream:
            events.append(e)
    [failed] = of(events, "lifecycle", "failed")
    assert failed.data["error"] == {"type": "ModelError", "message": "provider down"}
    assert events[-1] is failed


async def test_lifecycle_failed_names_the_middleware_and_hook():
    @before_model
    def guard(state, ctx):
        raise PermissionError("not allowed")

    agent = create_agent(ScriptedModel(["never"]), middleware=[guard])
    events = []
    with pytest.raises(MiddlewareError):
        async for e in agent.astream("hi"):
            events.append(e)
    [failed] = of(events, "lifecycle", "failed")
    assert failed.data["error"]["middleware"] == "guard"
    assert failed.data["error"]["hook"] == "before_model"
    assert "not allowed" in failed.data["error"]["message"]


async def test_updates_events_carry_each_step():
    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "2"]), [add])
    events, _ = await collect(agent)
    nodes = [next(iter(e.data)) for e in of(events, "updates")]
    assert nodes == ["model", "tools", "model"]
    last = of(events, "updates")[-1].data["model"]["messages"][0]
    assert isinstance(last, AIMessage) and last.text == "2"


async def test_values_events_only_when_asked_and_hold_the_full_state():
    agent = create_agent(ScriptedModel(["a", "b"]))
    events, _ = await collect(agent)
    assert of(events, "values") == []
    events, state = await collect(agent, "again", values=True)
    values = of(events, "values")
    assert values and [m.id for m in values[-1].data["messages"]] == [m.id for m in state["messages"]]


async def test_metadata_is_forwarded_on_lifecycle_without_internal_keys():
    agent = create_agent(ScriptedModel(["x"]))
    events, _ = await collect(agent, metadata={"user": "u1", "langgraph_node": "x", "thread_id": "t"})
    assert of(events, "lifecycle", "started")[0].data["metadata"] == {"user": "u1"}


async def test_lifecycle_with_only_framework_metadata_carries_no_metadata_key():
    agent = create_agent(ScriptedModel(["x"]))
    events, _ = await collect(agent, metadata={"langgraph_node": "x", "thread_id": "t", "checkpoint_ns": ""})
    assert all("metadata" not in e.data for e in of(events, "lifecycle"))


async def test_user_meaningful_metadata_reaches_the_subagents_lifecycle_events():
    researcher = create_agent(ScriptedModel(["found it"]), name="researcher")

    @tool
    async def research(topic: str) -> str:
        """Research a topic."""
        return (await researcher.ainvoke(topic))["messages"][-1].text

    supervisor = create_agent(
        ScriptedModel([{"tool_calls": [call("research", {"topic": "bees"}, "call_abc")]}, "summary"]),
        [research], name="supervisor")
    events, _ = await collect(supervisor, "go", metadata={
        "ls_integration": "deepagents", "lc_custom": "c", "user": "u1", "langgraph_step": 4, "thread_id": "t"})
    sub_life = [e for e in of(events, "lifecycle") if e.namespace]
    assert [e.data["event"] for e in sub_life] == ["started", "completed"]
    for e in sub_life:
        meta = e.data["metadata"]
        assert meta["ls_integration"] == "deepagents" and meta["lc_custom"] == "c" and meta["user"] == "u1"
        assert not any(k.startswith(("langgraph_", "checkpoint_")) or k == "thread_id" for k in meta)


# -- nested agents ----------------------------------------------------------------------


async def test_named_agent_inside_a_tool_is_a_subagent():
    researcher = create_agent(ScriptedModel(["found it"]), name="researcher")

    @tool
    async def research(topic: str) -> str:
        """Research a topic."""
        state = await researcher.ainvoke(topic)
        return state["messages"][-1].text

    supervisor = create_agent(
        ScriptedModel([{"tool_calls": [call("research", {"topic": "bees"}, "call_abc")]}, "summary"]),
        [research], name="supervisor")
    events, state = await collect(supervisor, "go")
    assert state["messages"][-1].text == "summary"
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["found it"]

    nested = [e for e in events if e.namespace]
    assert nested, "the subagent's events are in the parent's stream"
    assert {tuple(e.namespace) for e in nested} == {("researcher:call_abc",)}
    assert {e.agent for e in nested} == {"researcher"}
    assert {e.to_dict()["namespace"][0] for e in nested} == {"researcher:call_abc"}
    sub_life = [e for e in of(events, "lifecycle") if e.namespace]
    assert [e.data["event"] for e in sub_life] == ["started", "completed"]
    for e in sub_life:
        assert e.data["graph_name"] == "researcher"
        assert e.data["cause"] == {"type": "toolCall", "tool_call_id": "call_abc"}
    # the subagent's message events are streamed too
    assert "".join(e.data["text"] for e in nested if e.type == "message" and e.data["event"] == "delta") == "found it"
    # one stream, one numbering; the subagent runs between the tool's start and finish
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    tool_started = of(events, "tool", "started")[0].seq
    tool_finished = of(events, "tool", "finished")[0].seq
    assert tool_started < sub_life[0].seq < sub_life[-1].seq < tool_finished
    root_life = [e for e in of(events, "lifecycle") if not e.namespace]
    assert [e.data["event"] for e in root_life] == ["started", "completed"]


async def test_agent_started_by_a_hook_inside_a_tool_call_reports_under_that_call():
    # The hook runs inside the tool call (the researcher's before_model, under the supervisor's research call): an
    # agent it starts is the supervisor's subagent there, as one started by the tool itself is. A hook of the
    # top-level agent, inside no tool call, starts an agent of its own.
    checker = create_agent(ScriptedModel(["checked"], loop=True), name="checker")

    @before_model
    async def check(state, ctx):
        await checker.ainvoke("check")

    researcher = create_agent(ScriptedModel(["found it"]), middleware=[check], name="researcher")

    @tool
    async def research(topic: str) -> str:
        """Research a topic."""
        return (await researcher.ainvoke(topic))["messages"][-1].text

    supervisor = create_agent(
        ScriptedModel([{"tool_calls": [call("research", {"topic": "bees"}, "call_abc")]}, "summary"]),
        [research], middleware=[check], name="supervisor")
    events, state = await collect(supervisor, "go")
    assert state["messages"][-1].text == "summary"
    started = [tuple(e.namespace) for e in of(events, "lifecycle", "started") if e.data["graph_name"] == "checker"]
    assert started == [("checker:call_abc",)]


def _research_tool(researcher, way, runtime=None):
    """A ``research`` tool whose body runs ``researcher`` one way (seed 002: all are reported alike)."""
    if way == "ainvoke":
        @tool
        async def research(topic: str) -> str:
            """Research a topic."""
            return (await researcher.ainvoke(topic))["messages"][-1].text
    elif way == "invoke":
        @tool
        def research(topic: str) -> str:
            """Research a topic."""
            return researcher.invoke(topic)["messages"][-1].text
    elif way == "astream":
        @tool
        async def research(topic: str) -> str:
            """Research a topic."""
            stream = researcher.astream(topic)
            async for _ in stream:  # watching its progress
                pass
            return stream.result["messages"][-1].text
    elif way == "stream":
        @tool
        def research(topic: str) -> str:
            """Research a topic."""
            finishes = [e for e in researcher.stream(topic) if e.type == "message" and e.data["event"] == "finish"]
            return finishes[-1].data["message"].text
    else:  # through a runtime: the agent is registered there and runs on a thread of its own
        @tool
        async def research(topic: str) -> str:
            """Research a topic."""
            return (await researcher.ainvoke(topic, thread_id="research-thread"))["messages"][-1].text
    return research


@pytest.mark.parametrize("way", ["ainvoke", "invoke", "astream", "stream", "runtime"])
async def test_every_way_of_running_a_named_agent_in_a_tool_reports_a_subagent(way):
    from backchannel.runtime import LocalRuntime

    researcher = create_agent(ScriptedModel(["found it"]), name="researcher")
    supervisor = create_agent(
        ScriptedModel([{"tool_calls": [call("research", {"topic": "bees"}, "call_abc")]}, "summary"]),
        [_research_tool(researcher, way)], name="supervisor")
    async with LocalRuntime("memory", agents={"researcher": researcher}):
        events, state = await collect(supervisor, "go")
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["found it"]
    sub_life = [e for e in of(events, "lifecycle") if e.namespace]
    assert [e.data["event"] for e in sub_life] == ["started", "completed"], way
    for e in sub_life:
        assert tuple(e.namespace) == ("researcher:call_abc",) and e.agent == "researcher"
        assert e.data["graph_name"] == "researcher"
        assert e.data["cause"] == {"type": "toolCall", "tool_call_id": "call_abc"}
    nested = [e for e in events if e.namespace]
    assert "".join(e.data["text"] for e in nested if e.type == "message" and e.data["event"] == "delta") == "found it"
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    assert of(events, "tool", "started")[0].seq < sub_life[0].seq < sub_life[-1].seq < of(
        events, "tool", "finished")[0].seq
    root_life = [e for e in of(events, "lifecycle") if not e.namespace]
    assert [e.data["event"] for e in root_life] == ["started", "completed"]


@pytest.mark.parametrize("way", ["ainvoke", "invoke", "astream", "stream"])
async def test_no_way_of_running_an_unnamed_agent_in_a_tool_reports_a_subagent(way):
    helper = create_agent(ScriptedModel(["found it"]))  # no name
    agent = create_agent(ScriptedModel([{"tool_calls": [call("research", {"topic": "?"}, "call_h")]}, "ok"]),
                         [_research_tool(helper, way)], name="main")
    events, state = await collect(agent)
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["found it"]
    life = of(events, "lifecycle")
    assert [(tuple(e.namespace), e.data["event"]) for e in life] == [((), "started"), ((), "completed")]


async def test_unnamed_nested_agent_emits_no_lifecycle_of_its_own():
    helper = create_agent(ScriptedModel(["helped"]))  # no name

    @tool
    async def ask_helper(q: str) -> str:
        """Ask."""
        return (await helper.ainvoke(q))["messages"][-1].text

    agent = create_agent(ScriptedModel([{"tool_calls": [call("ask_helper", {"q": "?"}, "call_h")]}, "ok"]),
                         [ask_helper], name="main")
    events, state = await collect(agent)
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["helped"]
    life = of(events, "lifecycle")
    assert [(tuple(e.namespace), e.data["event"]) for e in life] == [((), "started"), ((), "completed")]
    assert all(e.data["graph_name"] == "main" for e in life)


async def test_nested_subagent_failure_is_reported_and_becomes_a_tool_error():
    broken = create_agent(ScriptedModel([ModelError("sub down")]), name="broken")

    @tool
    async def delegate() -> str:
        """Delegate."""
        return (await broken.ainvoke("x"))["messages"][-1].text

    agent = create_agent(ScriptedModel([{"tool_calls": [call("delegate", {}, "call_d")]}, "recovered"]),
                         [delegate])
    events, state = await collect(agent)
    assert state["messages"][-1].text == "recovered"
    [failed] = [e for e in of(events, "lifecycle", "failed")]
    assert tuple(failed.namespace) == ("broken:call_d",)
    assert failed.data["cause"]["tool_call_id"] == "call_d"
    assert of(events, "tool", "error")[0].data["tool_call_id"] == "call_d"
