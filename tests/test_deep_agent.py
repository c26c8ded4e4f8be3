"""create_deep_agent: subagent specs, the general-purpose subagent, inheritance, and the tools it adds."""

import asyncio
import time

import pytest
from subagent_helpers import call, is_note, messages_of, policy, quiet, tool_messages, values_of, wait_until

from backchannel import HumanMessage, Middleware, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.subagents import GENERAL_PURPOSE, SubAgent, as_subagent
from backchannel.workspace import FILE_TOOLS


@tool
def lookup(key: str) -> str:
    """Look a key up."""
    return f"value-of-{key}"


def tool_names(request):
    """The tools a model call offered, besides the workspace's file tools every deep agent has."""
    return sorted(t.name for t in request.tools if t.name not in FILE_TOOLS)


def task_tool(agent):
    plan = agent._plan or agent._compile()
    return plan.tools["task"]


def delegating(subagent_type, description="do the thing", then="done"):
    """A supervisor model that delegates once with ``task`` and then answers ``then``."""
    return ScriptedModel([{"tool_calls": [call("task", {"description": description,
                                                        "subagent_type": subagent_type}, "t1")]}, then])


# -- specs -------------------------------------------------------------------------------------


async def test_subagent_specs_from_dataclass_dicts_and_runnables():
    prebuilt = create_agent(ScriptedModel(["from the prebuilt agent"]), name="prebuilt")
    agent = create_deep_agent(
        ScriptedModel([]),
        subagents=[
            SubAgent("writer", "Writes prose.", model=ScriptedModel(["from writer"])),
            {"name": "critic", "description": "Criticises.", "system_prompt": "Be harsh.",
             "model": ScriptedModel(["from critic"])},
            {"name": "prebuilt", "description": "A compiled agent.", "runnable": prebuilt},
        ])
    description = task_tool(agent).description
    for name, blurb in [("writer", "Writes prose."), ("critic", "Criticises."), ("prebuilt", "A compiled agent."),
                        ("general-purpose", "General-purpose agent")]:
        assert f"- {name}: {blurb}" in description

    for subagent_type, expected in [("writer", "from writer"), ("critic", "from critic"),
                                    ("prebuilt", "from the prebuilt agent")]:
        supervisor = create_deep_agent(
            delegating(subagent_type),
            subagents=[SubAgent("writer", "w", model=ScriptedModel(["from writer"])),
                       {"name": "critic", "description": "c", "model": ScriptedModel(["from critic"])},
                       {"name": "prebuilt", "description": "p",
                        "runnable": create_agent(ScriptedModel(["from the prebuilt agent"]), name="prebuilt")}])
        state = await supervisor.ainvoke("go")
        [result] = tool_messages(state["messages"], "task")
        assert result.status == "success" and result.text == expected


def test_dict_spec_in_deepagents_form_is_read_and_bad_keys_are_rejected():
    prebuilt = create_agent(ScriptedModel(["x"]))
    spec = as_subagent({"name": "a", "description": "d", "runnable": prebuilt})
    assert isinstance(spec, SubAgent) and spec.agent is prebuilt
    assert as_subagent(spec) is spec
    with pytest.raises(ValueError, match="not a subagent spec"):
        as_subagent({"name": "a", "description": "d", "colour": "red"})
    with pytest.raises(ValueError):
        create_deep_agent(ScriptedModel([]), subagents=[{"name": "a"}])  # no description


def test_duplicate_subagent_names_are_rejected():
    with pytest.raises(ValueError, match="'twin'"):
        create_deep_agent(ScriptedModel([]), subagents=[SubAgent("twin", "one"), {"name": "twin",
                                                                                    "description": "two"}])
    with pytest.raises(ValueError, match="'twin'"):  # a foreground and a background one share the namespace
        create_deep_agent(ScriptedModel([]), subagents=[SubAgent("twin", "one"),
                                                        SubAgent("twin", "two", background=True)])


# -- the general-purpose subagent ----------------------------------------------------------------


async def test_general_purpose_subagent_exists_by_default_and_inherits_model_and_tools():
    seen = []

    def model(request):
        seen.append(request.override(messages=list(request.messages)))
        if request.system_prompt and GENERAL_PURPOSE.system_prompt in request.system_prompt:
            return "general-purpose answer"  # the subagent: same model object as the supervisor
        if len(request.messages) == 1:
            return {"tool_calls": [call("task", {"description": "research X",
                                                 "subagent_type": "general-purpose"}, "t1")]}
        return "supervisor done"

    agent = create_deep_agent(policy(model), [lookup])
    state = await agent.ainvoke("hi")
    [result] = tool_messages(state["messages"], "task")
    assert result.text == "general-purpose answer"
    assert state["messages"][-1].text == "supervisor done"
    sub_requests = [r for r in seen if GENERAL_PURPOSE.system_prompt in (r.system_prompt or "")]
    assert len(sub_requests) == 1
    assert tool_names(sub_requests[0]) == ["lookup"]  # the supervisor's tools, not its task tool
    assert [m.text for m in sub_requests[0].messages] == ["research X"]
    assert "task" in tool_names(seen[0]) and "lookup" in tool_names(seen[0])


async def test_general_purpose_subagent_can_be_replaced_or_disabled():
    custom = SubAgent("general-purpose", "My own general agent.", model=ScriptedModel(["custom gp"]))
    agent = create_deep_agent(delegating("general-purpose"), subagents=[custom])
    description = task_tool(agent).description
    assert description.count("- general-purpose:") == 1 and "My own general agent." in description
    state = await agent.ainvoke("go")
    assert tool_messages(state["messages"], "task")[0].text == "custom gp"

    without = create_deep_agent(delegating("general-purpose"), subagents=[SubAgent("only", "o")],
                                general_purpose=False)
    assert "general-purpose" not in task_tool(without).description
    state = await without.ainvoke("go")
    [result] = tool_messages(state["messages"], "task")
    assert result.status == "error" and "valid types: only" in result.text

    bare = create_deep_agent(ScriptedModel(["hello"]), general_purpose=False)
    bare.model.record = True
    await bare.ainvoke("hi")
    assert tool_names(bare.model.requests[0]) == []  # nothing to delegate to: no task tool


async def test_named_subagent_inherits_parent_model_and_tools_when_omitted():
    seen = []

    def model(request):
        seen.append(request.override(messages=list(request.messages)))
        if "HELPER PROMPT" in (request.system_prompt or ""):
            return {"tool_calls": [call("lookup", {"key": "k"}, "l1")]} if len(request.messages) == 1 \
                else f"helper saw {request.messages[-1].text}"
        if len(request.messages) == 1:
            return {"tool_calls": [call("task", {"description": "use lookup", "subagent_type": "helper"}, "t1")]}
        return "finished"

    agent = create_deep_agent(policy(model), [lookup],
                              subagents=[SubAgent("helper", "Helps.", system_prompt="HELPER PROMPT")],
                              general_purpose=False)
    state = await agent.ainvoke("go")
    assert tool_messages(state["messages"], "task")[0].text == "helper saw value-of-k"
    helper_requests = [r for r in seen if "HELPER PROMPT" in (r.system_prompt or "")]
    assert len(helper_requests) == 2 and tool_names(helper_requests[0]) == ["lookup"]

    # Given tools and model replace the supervisor's.
    own = ScriptedModel(["own model"])
    own.record = True
    agent = create_deep_agent(delegating("solo"), [lookup],
                              subagents=[SubAgent("solo", "Alone.", tools=[], model=own)], general_purpose=False)
    state = await agent.ainvoke("go")
    assert tool_messages(state["messages"], "task")[0].text == "own model"
    assert tool_names(own.requests[0]) == []


def test_background_subagents_add_the_async_task_tools():
    fg = create_deep_agent(ScriptedModel([]), subagents=[SubAgent("a", "a")])
    bg = create_deep_agent(ScriptedModel([]), subagents=[SubAgent("b", "Runs in the background.",
                                                                  background=True)], general_purpose=False)
    fg_tools = set((fg._plan or fg._compile()).tools)
    bg_tools = set((bg._plan or bg._compile()).tools)
    assert "task" in fg_tools and "start_async_task" not in fg_tools
    assert {"start_async_task", "check_async_task", "update_async_task", "cancel_async_task",
            "list_async_tasks"} <= bg_tools
    assert "task" not in bg_tools  # its only subagent runs in the background
    assert "- b: Runs in the background." in bg._plan.tools["start_async_task"].description
    with pytest.raises(ValueError, match="completion"):
        create_deep_agent(ScriptedModel([]), subagents=[SubAgent("b", "b", background=True)], completion="later")


async def test_the_callers_middleware_sees_the_conversation_before_it_is_summarised():
    # A middleware that ends a turn before the model (a handoff request does) must leave the thread as it was.
    class EndsTheTurn(Middleware):
        seen: list[int] = []

        async def before_model(self, state, ctx):
            self.seen.append(len(state["messages"]))
            return {"jump_to": "end"} if len(state["messages"]) > 4 else None

    model = ScriptedModel(["ok"], loop=True)
    agent = create_deep_agent(model, middleware=[EndsTheTurn()], general_purpose=False, max_tokens_before_summary=10)
    history = [HumanMessage(f"question {i} " + "x" * 100) for i in range(9)]  # past the 6 summarization keeps

    state = await agent.ainvoke({"messages": history})

    assert EndsTheTurn.seen == [9]
    assert [m.content for m in state["messages"]] == [m.content for m in history]  # nothing summarised
    assert model.calls == 0


async def test_supervisor_system_prompt_mentions_delegation():
    model = ScriptedModel(["ok"])
    model.record = True
    await create_deep_agent(model, system_prompt="You are Ada.").ainvoke([HumanMessage("hi")])
    prompt = model.requests[0].system_prompt
    assert prompt.startswith("You are Ada.") and "`task`" in prompt
    assert not isinstance(model.requests[0].messages[-1], ToolMessage)


# -- the seed 001 demo: a supervisor with a researcher and an analyst in the background ------------------


def demo_supervisor():
    def reply(request):
        last = request.messages[-1]
        reported = {m.additional_kwargs["task_notification"]["subagent"]: m.text.split("Result: ", 1)[-1]
                    for m in request.messages if is_note(m)
                    and m.additional_kwargs["task_notification"]["status"] == "success"}
        if is_note(last):
            if {"researcher", "analyst"} <= set(reported):
                return f"Synthesis: {reported['researcher']} Together with: {reported['analyst']}"
            return f"The {', '.join(sorted(reported))} reported back; still waiting for the rest."
        if isinstance(last, HumanMessage) and "tall" in last.text:
            return "LeBron is 6 ft 9 in."
        if isinstance(last, HumanMessage):
            return {"content": "Let me get a researcher and an analyst on it.", "tool_calls": [
                call("start_async_task", {"description": "Research LeBron James's career",
                                          "subagent_type": "researcher"}, "call_r"),
                call("start_async_task", {"description": "Analyse LeBron's stats against Jordan's",
                                          "subagent_type": "analyst"}, "call_a")]}
        return "Both are working in the background; ask me anything meanwhile."

    return policy(reply)


async def test_demo_supervisor_keeps_talking_while_research_and_analysis_run_and_then_synthesises():
    agent = create_deep_agent(demo_supervisor(), subagents=[
        SubAgent("researcher", "Researches a topic in depth.", background=True,
                 model=ScriptedModel(["LeBron has 4 titles and 4 Finals MVPs."], latency=0.3)),
        SubAgent("analyst", "Analyses data and compares numbers.", background=True,
                 model=ScriptedModel(["LeBron leads in total points; Jordan in points per game."], latency=0.5)),
    ])
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        began = time.monotonic()
        first = await agent.ainvoke("Compare LeBron James and Michael Jordan.", thread_id="demo")
        assert time.monotonic() - began < 0.25
        assert first["messages"][-1].text == "Both are working in the background; ask me anything meanwhile."
        tracked = first["async_tasks"]
        assert sorted(t["subagent"] for t in tracked.values()) == ["analyst", "researcher"]
        for task_id in tracked:
            assert (await rt.runs.list(task_id))[0]["status"] in ("pending", "running")

        # The supervisor keeps talking while its tasks run.
        second = await agent.ainvoke("How tall is LeBron?", thread_id="demo")
        assert second["messages"][-1].text == "LeBron is 6 ft 9 in."
        assert not any(is_note(m) for m in second["messages"])

        async def synthesised():
            messages = await messages_of(rt, "demo")
            return messages[-1]["content"].startswith("Synthesis:") and messages

        messages = await wait_until(synthesised, timeout=3, what="the synthesis")
        await quiet(rt, "demo")
        await asyncio.sleep(0.1)
        values = await values_of(rt, "demo")

    notes = [m for m in values["messages"] if is_note(m)]
    assert [m["additional_kwargs"]["task_notification"]["subagent"] for m in notes] == ["researcher", "analyst"]
    assert notes[0]["content"].endswith("Completed. Result: LeBron has 4 titles and 4 Finals MVPs.")
    assert notes[1]["content"].endswith("Completed. Result: LeBron leads in total points; Jordan in points per game.")
    assert values["messages"][-1]["content"] == ("Synthesis: LeBron has 4 titles and 4 Finals MVPs. Together with: "
                                                 "LeBron leads in total points; Jordan in points per game.")
    between = values["messages"][values["messages"].index(notes[0]) + 1]
    assert between["content"] == "The researcher reported back; still waiting for the rest."
    assert {t["status"] for t in values["async_tasks"].values()} == {"success"}
    assert len(messages) == len(values["messages"])
