"""Subagents share the supervisor's workspace (or not): in the foreground with ``task``, and in the background."""

import pytest
from subagent_helpers import call, is_note, notes, policy, quiet, start, wait_until

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.subagents import SubAgent


def writer(path, content):
    """A subagent model that writes one file and then says it is done."""
    return ScriptedModel([{"tool_calls": [call("write_file", {"file_path": path, "content": content}, "w")]},
                          f"wrote {path}"])


def reader(path):
    return ScriptedModel([{"tool_calls": [call("read_file", {"file_path": path}, "r")]}, "read it"])


@pytest.mark.parametrize("workspace", ["shared", "isolated"])
async def test_a_task_subagent_sees_the_supervisors_files_and_its_files_come_back(workspace):
    supervisor = ScriptedModel([
        {"tool_calls": [call("write_file", {"file_path": "/brief.md", "content": "Write about tea."}, "w0")]},
        {"tool_calls": [call("task", {"description": "do it", "subagent_type": "author"}, "t1")]},
        {"tool_calls": [call("read_file", {"file_path": "/draft.md"}, "r1")]},
        "done"])
    author = ScriptedModel([
        {"tool_calls": [call("read_file", {"file_path": "/brief.md"}, "a1")]},
        {"tool_calls": [call("write_file", {"file_path": "/draft.md", "content": "Tea is old."}, "a2")]},
        "drafted"])
    agent = create_deep_agent(supervisor, subagents=[SubAgent("author", "Writes.", model=author,
                                                              workspace=workspace)], general_purpose=False)
    state = await agent.ainvoke("go")
    results = {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}
    if workspace == "shared":
        assert results["r1"].text == "@@ lines 1-1 of 1 @@\n1  Tea is old."
        assert state["files"]["/draft.md"]["content"] == "Tea is old."
    else:
        assert results["r1"].status == "error" and "/draft.md" not in state["files"]
    assert results["t1"].text == "drafted"


async def test_a_background_subagent_writes_a_file_its_supervisor_then_reads():
    def supervisor(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and is_note(last):
            return {"tool_calls": [call("read_file", {"file_path": "/report.md"}, "read_report")]}
        if isinstance(last, HumanMessage):
            return {"tool_calls": [call("write_file", {"file_path": "/topic.md", "content": "tea"}, "w")]}
        if isinstance(last, ToolMessage) and last.name == "write_file":  # calls of one reply run at once
            return {"tool_calls": [start("researcher", "research the topic in /topic.md", "s1")]}
        if isinstance(last, ToolMessage) and last.name == "read_file":
            return f"The report says: {last.text.splitlines()[-1]}"
        return "Started."

    researcher = ScriptedModel([
        {"tool_calls": [call("read_file", {"file_path": "/topic.md"}, "r")]},
        lambda request: {"tool_calls": [call("write_file", {"file_path": "/report.md",
                                                            "content": f"Report on {request.messages[-1].text[-3:]}"},
                                             "w")]},
        "The report is in /report.md."])
    agent = create_deep_agent(policy(supervisor), subagents=[SubAgent("researcher", "Researches.", model=researcher,
                                                                      background=True)], general_purpose=False)
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "supervisor", input="research tea")

        async def answered():
            values = (await rt.threads.get_state(thread))["values"]
            last = values["messages"][-1]
            return last["type"] == "ai" and last["content"].startswith("The report says")

        await wait_until(answered, timeout=10)
        await quiet(rt, thread)
        values = (await rt.threads.get_state(thread))["values"]
    assert values["messages"][-1]["content"] == "The report says: 1  Report on tea"
    assert values["files"]["/report.md"]["content"] == "Report on tea"
    assert values["files"]["/topic.md"]["content"] == "tea"
    [note] = notes(values["messages"])
    assert note["additional_kwargs"]["task_notification"]["files"] is True


async def test_a_task_without_files_says_so_and_its_state_is_not_read_for_them():
    """A finished task's state is read for its files only when its notification says it holds some (reading
    a thousand tasks' whole states cost a tenth of a fan-out's time)."""
    def supervisor(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and not is_note(last):
            return {"tool_calls": [start("helper", "help", "s1")]}
        return "ok"

    agent = create_deep_agent(policy(supervisor), general_purpose=False,
                              subagents=[SubAgent("helper", "Helps.", model=ScriptedModel(["helped"]),
                                                  background=True)])
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        read: list[str] = []
        get_state = rt.threads.get_state

        async def spied(thread_id, *args, **kwargs):
            read.append(thread_id)
            return await get_state(thread_id, *args, **kwargs)

        rt.threads.get_state = spied  # what the supervisor's middleware reads through its runtime
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "supervisor", input="go")
        await wait_until(lambda: _noted(rt, thread), timeout=10)
        await quiet(rt, thread)
        rt.threads.get_state = get_state
        values = (await rt.threads.get_state(thread))["values"]
    [note] = notes(values["messages"])
    marker = note["additional_kwargs"]["task_notification"]
    assert marker["status"] == "success" and marker["files"] is False
    assert values["async_tasks"][marker["task_id"]]["status"] == "success"
    assert marker["task_id"] not in read


async def _noted(rt, thread):
    return bool(notes((await rt.threads.get_state(thread))["values"]["messages"]))


async def test_a_finished_task_does_not_undo_what_the_supervisor_wrote_meanwhile():
    """The task's copy of a file it did not write is older than the supervisor's: it is not taken back."""
    def supervisor(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and is_note(last):
            return {"tool_calls": [call("read_file", {"file_path": "/notes.md"}, "final_read")]}
        if isinstance(last, HumanMessage) and last.text == "start":
            return {"tool_calls": [call("write_file", {"file_path": "/notes.md", "content": "v1"}, "w1")]}
        if isinstance(last, ToolMessage) and last.tool_call_id == "w1":
            return {"tool_calls": [start("helper", "help", "s1")]}  # the task starts with v1
        if isinstance(last, HumanMessage):
            return {"tool_calls": [call("write_file", {"file_path": "/notes.md", "content": "v2"}, "w2")]}
        if isinstance(last, ToolMessage) and last.name == "read_file":
            return f"notes: {last.text.splitlines()[-1]}"
        return "ok"

    gate = {"open": False}

    async def slow(request):
        await wait_until(lambda: gate["open"], timeout=10)
        return AIMessage("helped")

    class Gated(ScriptedModel):
        async def generate(self, request):
            return await slow(request)

    agent = create_deep_agent(policy(supervisor), general_purpose=False,
                              subagents=[SubAgent("helper", "Helps.", model=Gated([]), background=True)])
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "supervisor", input="start")
        await rt.runs.wait(thread, "supervisor", input="update the notes")
        gate["open"] = True

        async def answered():
            last = (await rt.threads.get_state(thread))["values"]["messages"][-1]
            return last["type"] == "ai" and last["content"].startswith("notes:")

        await wait_until(answered, timeout=10)
        await quiet(rt, thread)
        values = (await rt.threads.get_state(thread))["values"]
    assert values["messages"][-1]["content"] == "notes: 1  v2"
