"""A run's LangGraph options on the embedded runtime: recursion_limit, Command shapes, input beside a command."""

import pytest
from runtime_helpers import echo_agent, looping_agent, user

from backchannel import InvalidRequestError, MaxIterationsError


async def test_recursion_limit_is_the_runs_iteration_limit(make_runtime):
    rt = await make_runtime({"agent": looping_agent(10, max_iterations=3)})
    thread = await rt.threads.create()
    with pytest.raises(MaxIterationsError, match="limit of 2 model calls"):
        await rt.runs.wait(thread["thread_id"], "agent", input=user("go"), config={"recursion_limit": 4})
    row = await rt.threads.get(thread["thread_id"])
    assert row["status"] == "error" and row["error"]["error"] == "GraphRecursionError"
    done = await rt.runs.wait(thread["thread_id"], "agent", input=user("again"), config={"recursion_limit": 100})
    assert done["messages"][-1]["content"] == "done after 10 steps"  # past the agent's own 3, as asked
    for bad in (0, -3, "25", True, 2.5):
        with pytest.raises(InvalidRequestError, match="recursion_limit"):
            await rt.runs.create(thread["thread_id"], "agent", input=user("x"), config={"recursion_limit": bad})


async def test_commands_in_langgraphs_shapes(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    tid = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("one"))
    out = await rt.runs.wait(tid, "agent", input={"messages": []}, command={
        "update": [["messages", [{"role": "user", "content": "two"}]], ["messages", [{"role": "user",
                                                                                     "content": "three"}]]],
        "goto": ["model"], "resume": None})
    assert [m["content"] for m in out["messages"][-3:]] == ["two", "three", "echo: three"]
    stored = (await rt.runs.list(tid, limit=1))[0]["kwargs"]
    assert stored["input"] is None and stored["command"]["goto"] == "model"
    with pytest.raises(InvalidRequestError, match="not both"):
        await rt.runs.create(tid, "agent", input=user("lost?"), command={"goto": "model"})
    with pytest.raises(InvalidRequestError, match="one step at a time"):
        await rt.runs.create(tid, "agent", command={"goto": ["model", {"node": "tools", "input": {}}]})
    assert len(await rt.runs.list(tid)) == 2


async def test_breakpoints_pause_the_run_and_input_none_goes_on(make_runtime):
    rt = await make_runtime({"agent": looping_agent(2)})
    tid = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(tid, "agent", input=user("go"), interrupt_before=["tools"])
    state = await rt.threads.get_state(tid)
    assert state["next"] == ["tools"] and (await rt.threads.get(tid))["status"] == "interrupted"
    await rt.runs.wait(tid, "agent", input=None, interrupt_before=["tools"])  # through it, to the next one
    assert (await rt.threads.get_state(tid))["next"] == ["tools"]
    done = await rt.runs.wait(tid, "agent", input=None)
    assert done["messages"][-1]["content"] == "done after 2 steps"
    assert (await rt.threads.get(tid))["status"] == "idle"
    await rt.runs.wait(tid, "agent", input=user("again"), interrupt_after="*")
    assert (await rt.threads.get_state(tid))["next"] == ["tools"]  # after the model step
    with pytest.raises(InvalidRequestError, match="no step or tool named 'modle'"):
        await rt.runs.create(tid, "agent", input=user("x"), interrupt_before=["modle"])
