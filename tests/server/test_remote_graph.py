"""LangGraph's own ``RemoteGraph`` driving the server: invoke, stream, interrupt and resume with ``Command``, limits."""

from __future__ import annotations

import uuid

import httpx
import pytest
from langgraph.pregel.remote import RemoteException, RemoteGraph
from langgraph.types import Command
from server_helpers import user


@pytest.fixture
def thread(server):
    """A config naming a new thread (RemoteGraph creates it on first use)."""
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def last_text(values: dict) -> str:
    return values["messages"][-1]["content"]


def test_invoke_and_stream(server, thread):
    calc = RemoteGraph("calc", url=server.url)
    assert last_text(calc.invoke(user("2+3?"), thread)) == "the answer is 5"
    updates = list(calc.stream(user("again"), thread, stream_mode="updates"))
    assert [next(iter(u)) for u in updates] == ["model", "tools", "model"]
    modes = {part.event for part in calc.stream(user("once more"), thread, stream_mode=["values", "updates"])}
    assert modes == {"values", "updates"}
    state = calc.get_state(thread)
    assert last_text(state.values) == "the answer is 5" and state.next == ()
    assert len(list(calc.get_state_history(thread, limit=3))) == 3


async def test_async_invoke_and_stream(server, thread):
    echo = RemoteGraph("echo", url=server.url)
    assert last_text(await echo.ainvoke(user("hi"), thread)) == "echo: hi"
    chunks = [c async for c in echo.astream(user("there"), thread, stream_mode="values")]
    assert last_text(chunks[-1]) == "echo: there"


def test_interrupt_then_resume_with_a_command(server, thread):
    """RemoteGraph sends LangGraph's whole Command: ``goto: []``, ``update: null`` beside ``resume``."""
    mailer = RemoteGraph("mailer", url=server.url)
    paused = mailer.invoke(user("hello Ada"), thread)
    (interrupt,) = paused["__interrupt__"]
    assert interrupt["value"]["action_requests"][0]["name"] == "send_email"
    paused_at = mailer.get_state(thread)
    assert paused_at.next == ("HumanInTheLoop.after_model",)  # as LangChain's agent names its middleware steps
    assert paused_at.tasks[0].interrupts[0].value["action_requests"][0]["name"] == "send_email"
    done = mailer.invoke(Command(resume={"decisions": [{"type": "approve"}]}), thread)
    assert last_text(done) == "done: sent to ada@example.com: hello Ada"
    assert mailer.get_state(thread).next == ()


def test_a_command_updates_the_state_and_goes_to_a_step(server, thread):
    echo = RemoteGraph("echo", url=server.url)
    echo.invoke(user("first"), thread)
    out = echo.invoke(Command(update={"messages": [{"role": "user", "content": "second"}]}, goto="model"), thread)
    assert last_text(out) == "echo: second"
    # [key, value] pairs, as LangGraph also accepts an update
    out = echo.invoke(Command(update=[("messages", [{"role": "user", "content": "third"}])], goto="model"), thread)
    assert last_text(out) == "echo: third"


async def test_the_sdk_sends_command_in_every_shape_langgraph_accepts(client):
    thread = await client.threads.create()
    tid = thread["thread_id"]
    # What UIs send on Approve: an empty input beside the command.
    values = await client.runs.wait(tid, "mailer", input=user("hello Bob"))
    assert values["__interrupt__"]
    values = await client.runs.wait(tid, "mailer", input={}, command={"resume": {"decisions": [{"type": "approve"}]},
                                                                      "goto": [], "update": None})
    assert last_text(values) == "done: sent to ada@example.com: hello Bob"
    # goto as a Send: its input is added to the state, then the run goes to that step.
    echo = await client.threads.create()
    await client.runs.wait(echo["thread_id"], "echo", input=user("one"))
    values = await client.runs.wait(echo["thread_id"], "echo", command={
        "goto": {"node": "model", "input": {"messages": [{"role": "user", "content": "sent"}]}}})
    assert last_text(values) == "echo: sent"
    values = await client.runs.wait(echo["thread_id"], "echo", command={
        "goto": [{"node": "model", "input": {"messages": [{"role": "user", "content": "listed"}]}}]})
    assert last_text(values) == "echo: listed"


def test_recursion_limit_bounds_the_run_as_graph_recursion_error(server, thread):
    looper = RemoteGraph("looper", url=server.url)
    with pytest.raises(RemoteException) as raised:
        looper.invoke(user("go"), {**thread, "recursion_limit": 5})
    assert raised.value.args[0]["error"] == "GraphRecursionError"
    assert "limit of 3 model calls" in raised.value.args[0]["message"]
    messages = looper.get_state(thread).values["messages"]
    assert sum(m["type"] == "ai" for m in messages) == 3  # steps: model, tools, model, tools, model
    thread_row = httpx.get(f"{server.url}/threads/{thread['configurable']['thread_id']}").json()
    assert thread_row["status"] == "error" and thread_row["error"]["error"] == "GraphRecursionError"


async def test_recursion_limit_through_the_sdk(client):
    result = await client.runs.wait(None, "looper", input=user("go"), config={"recursion_limit": 1},
                                    raise_error=False)
    assert result["__error__"]["error"] == "GraphRecursionError"
    calc = await client.runs.wait(None, "calc", input=user("2+3"), config={"recursion_limit": 3})
    assert last_text(calc) == "the answer is 5"  # model, tools, model: within 3 steps


def test_breakpoints_pause_before_and_after_steps_and_tools(server, thread):
    """Studio-style breakpoints: the run stops before (or after) a step, the thread waits ``interrupted`` with
    ``next`` naming the step, and invoking with no input goes on from there."""
    calc = RemoteGraph("calc", url=server.url)
    paused = calc.invoke(user("2+3?"), thread, interrupt_before=["tools"])
    assert paused["messages"][-1]["tool_calls"][0]["name"] == "add"  # the model asked; the tool has not run
    state = calc.get_state(thread)
    assert state.next == ("tools",) and state.tasks[0].name == "tools"
    thread_row = httpx.get(f"{server.url}/threads/{thread['configurable']['thread_id']}").json()
    assert thread_row["status"] == "interrupted" and thread_row["interrupts"] == {}  # a breakpoint: no question
    assert last_text(calc.invoke(None, thread, interrupt_before=["tools"])) == "the answer is 5"  # passes it once
    paused = calc.invoke(user("again"), thread, interrupt_after=["model"])
    assert calc.get_state(thread).next == ("tools",) and paused["messages"][-1]["tool_calls"]
    assert last_text(calc.invoke(None, thread)) == "the answer is 5"
    calc.invoke(user("by name"), thread, interrupt_before=["add"])  # a tool's name
    assert calc.get_state(thread).next == ("tools",)
    calc.invoke(None, thread)
    echo = RemoteGraph("echo", url=server.url)
    other = {"configurable": {"thread_id": str(uuid.uuid4())}}
    echo.invoke(user("wait"), other, interrupt_before="*")
    assert echo.get_state(other).next == ("model",)
    assert last_text(echo.invoke(None, other)) == "echo: wait"


async def test_breakpoints_name_steps_and_tools_that_exist(client):
    thread = await client.threads.create()
    for option in ("interrupt_before", "interrupt_after"):
        with pytest.raises(httpx.HTTPStatusError) as refused:
            await client.runs.create(thread["thread_id"], "calc", input=user("x"), **{option: ["nonexistent"]})
        assert refused.value.response.status_code == 422
        assert "nonexistent" in refused.value.response.json()["detail"]
