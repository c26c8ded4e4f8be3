"""Programs sharing one database: each runtime runs only the runs of the agents it serves.

Issue 15.11 and 15.12. A chat leaves a background task unfinished in the
database every CLI command opens; another program with no agent of that name
must not fail it, one with a different agent of the same name must not run it,
and the chat, started again, finishes it and hears of it once. An agent that
joins a second runtime works there, never in the first.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from backchannel import ScriptedModel, create_agent, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.subagents import SubAgent

sys.path.insert(0, str(Path(__file__).parent.parent))
from subagent_helpers import is_note, relay_supervisor  # noqa: E402

RESEARCH_DONE = asyncio.Event()


@tool
async def lookup(query: str) -> str:
    """Look a subject up in the chat's notes (waits until the test lets it answer)."""
    await RESEARCH_DONE.wait()
    return f"notes on {query}"


@tool
async def search_notes(query: str) -> str:
    """The demo's own search."""
    return "the demo's notes"


def _research(tool_name: str, answer: str):
    def reply(request):
        if request.messages[-1].type == "tool":
            return answer
        return {"tool_calls": [{"name": tool_name, "args": {"query": "q"}, "id": "call_lookup"}]}
    return reply


def chat_program():
    """The chat: a supervisor whose researcher looks things up in its notes."""
    return create_deep_agent(
        relay_supervisor(), name="supervisor", general_purpose=False,
        subagents=[SubAgent("researcher", "Researches things.", background=True, tools=[lookup],
                            model=ScriptedModel([_research("lookup", "The chat's answer.")], loop=True))])


def demo_program(calls: list[str]):
    """The demo: another supervisor, with another researcher of the same name."""
    def reply(request):
        calls.append("researcher")
        return _research("search_notes", "The demo's answer.")(request)
    return create_deep_agent(
        relay_supervisor(), name="supervisor", general_purpose=False,
        subagents=[SubAgent("researcher", "Researches a player.", background=True, tools=[search_notes],
                            model=ScriptedModel([reply], loop=True))])


async def _task_run(rt: LocalRuntime, parent: str) -> dict:
    [task] = (await rt.threads.get_state(parent))["values"]["async_tasks"].values()
    return await rt.runs.get(task["task_id"], task["run_id"])


async def test_runtimes_leave_alone_the_runs_of_agents_they_do_not_serve(tmp_path):
    db = f"sqlite:///{tmp_path}/state.db"
    RESEARCH_DONE.clear()
    async with LocalRuntime(db, agents={"supervisor": chat_program()}) as chat:
        parent = (await chat.threads.create())["thread_id"]
        await chat.runs.wait(parent, "supervisor", input="compare them")
        for _ in range(100):  # the researcher is mid-run, waiting in its lookup
            if (await _task_run(chat, parent))["status"] == "running":
                break
            await asyncio.sleep(0.02)
    # closed mid-task: the task's run waits in the database for a runtime that serves its researcher

    async with LocalRuntime(db, agents={"agent": create_agent(ScriptedModel(["hi"]), name="agent")}) as oneshot:
        await oneshot.runs.wait((await oneshot.threads.create())["thread_id"], "agent", input="hello")
        await asyncio.sleep(0.5)
        assert (await _task_run(oneshot, parent))["status"] == "pending"  # not failed: not its to run

    demo_calls: list[str] = []
    async with LocalRuntime(db, agents={"supervisor": demo_program(demo_calls)}) as demo:
        await asyncio.sleep(0.5)
        assert (await _task_run(demo, parent))["status"] == "pending"  # another researcher: not its to run
    assert demo_calls == []

    RESEARCH_DONE.set()
    async with LocalRuntime(db, agents={"supervisor": chat_program()}) as chat:
        run = await _task_run(chat, parent)
        task_thread = run["thread_id"]
        await asyncio.wait_for(chat.runs.join(task_thread, run["run_id"]), 10)
        assert (await chat.runs.get(task_thread, run["run_id"]))["status"] == "success"
        for _ in range(200):
            state = await chat.threads.get_state(parent)
            notes = [m for m in state["values"]["messages"] if is_note(m)]
            if notes and (await chat.threads.get(parent))["status"] == "idle":
                break
            await asyncio.sleep(0.02)
        assert len(notes) == 1 and "The chat's answer." in notes[0]["content"]


async def test_an_agent_registered_in_a_second_runtime_works_there_only(tmp_path):
    agent = create_agent(ScriptedModel(["hello"], loop=True), name="greeter")
    async with LocalRuntime(f"sqlite:///{tmp_path}/a.db", agents={"greeter": agent}):
        await agent.ainvoke("one", thread_id="in-a")
    async with LocalRuntime(f"sqlite:///{tmp_path}/b.db", agents={"greeter": agent}) as b:
        await agent.ainvoke("two", thread_id="in-b")
        assert (await b.threads.get("in-b"))["status"] == "idle"
    async with LocalRuntime(f"sqlite:///{tmp_path}/a.db", agents={}) as a:
        assert [t["thread_id"] for t in await a.threads.search()] == ["in-a"]
    # with both runtimes closed, the agent has none to keep threads in: it says so, and opens nothing
    try:
        await agent.ainvoke("three", thread_id="nowhere")
    except RuntimeError as exc:
        assert "no runtime" in str(exc)
    else:
        raise AssertionError("the agent ran on a closed runtime")
    async with LocalRuntime(f"sqlite:///{tmp_path}/b.db", agents={}) as b:
        assert sorted(t["thread_id"] for t in await b.threads.search()) == ["in-b"]
