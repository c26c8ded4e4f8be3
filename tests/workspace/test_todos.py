"""write_todos: the plan in the state's ``todos``, streamed as a state update, one list per reply."""

from subagent_helpers import call

from backchannel import ScriptedModel, create_agent
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.workspace import TodoListMiddleware

PLAN = [{"content": "find sources", "status": "in_progress"}, {"content": "write summary", "status": "pending"}]


async def test_write_todos_keeps_the_list_in_the_state_and_streams_it_as_an_update():
    model = ScriptedModel([{"tool_calls": [call("write_todos", {"todos": PLAN}, "w")]}, "planned"])
    agent = create_agent(model, middleware=[TodoListMiddleware()])
    async with LocalRuntime("memory", agents={"planner": agent}) as rt:
        thread = await rt.threads.create()
        parts = [p async for p in rt.runs.stream(thread["thread_id"], "planner", input="plan it",
                                                 stream_mode=["updates"])]
        state = (await rt.threads.get_state(thread["thread_id"]))["values"]
    assert state["todos"] == PLAN
    tool_updates = [p.data["tools"] for p in parts if p.event == "updates" and "tools" in p.data]
    assert tool_updates[0]["todos"] == PLAN
    [message] = tool_updates[0]["messages"]
    assert message["content"] == f"Updated todo list to {PLAN}"


async def test_several_write_todos_in_one_reply_are_refused_and_a_bad_status_is_an_error():
    model = ScriptedModel([
        {"tool_calls": [call("write_todos", {"todos": PLAN}, "a"), call("write_todos", {"todos": []}, "b")]},
        {"tool_calls": [call("write_todos", {"todos": [{"content": "x", "status": "someday"}]}, "c")]},
        "ok"])
    state = await create_agent(model, middleware=[TodoListMiddleware()]).ainvoke("go")
    results = {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}
    for call_id in "ab":
        assert results[call_id].status == "error" and "never be called multiple times in parallel" in \
            results[call_id].text
    assert results["c"].status == "error" and "todos.0.status" in results["c"].text
    assert "todos" not in state


def test_planning_is_opt_in_for_a_deep_agent():
    def names(agent):
        return set((agent._plan or agent._compile()).tools)

    assert "write_todos" not in names(create_deep_agent(ScriptedModel([])))
    assert "write_todos" in names(create_deep_agent(ScriptedModel([]), todos=True))
    assert "write_todos" in names(create_deep_agent(ScriptedModel([]), middleware=[TodoListMiddleware()]))
