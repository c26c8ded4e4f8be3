"""The agents ``bench/chaos.py`` serves: scripted, with small sleeps so runs are in flight when the server dies.

Every answer names the turn it answers, so the soak can count each run's input and its final answer in a
thread's state: ``worker`` calls a tool on its turn and answers ``done <turn>``; ``supervisor`` starts a
background ``researcher`` on its turn and answers ``started <turn>``, each of its final answers adding
`` | noted <task id> ...`` for the notifications since the previous one (the researcher looks its turn up
with a tool, then answers ``researched <turn>``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent

LATENCY = 0.02  # seconds a model takes to reply
TOOL_TIME = 0.03  # seconds a tool takes


def is_note(message: Any) -> bool:
    return isinstance(message, HumanMessage) and "task_notification" in message.additional_kwargs


def trailing(request: Any) -> list[Any]:
    """The messages after the model's last reply."""
    out = []
    for message in reversed(request.messages):
        if isinstance(message, AIMessage):
            break
        out.append(message)
    return out[::-1]


def call_id(turn: str) -> str:
    return "call_" + turn.replace(" ", "_")


@tool
async def work(turn: str) -> str:
    """Work on one turn."""
    await asyncio.sleep(TOOL_TIME)
    return f"worked on {turn}"


def worker_reply(request: Any) -> Any:
    """A turn: call ``work`` on it; its result: ``done <turn>``."""
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return "done " + last.text.removeprefix("worked on ")
    return {"tool_calls": [{"name": "work", "args": {"turn": last.text}, "id": call_id(last.text)}]}


def researcher_reply(request: Any) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return "researched " + last.text.removeprefix("worked on ")
    return {"tool_calls": [{"name": "work", "args": {"turn": last.text}, "id": call_id(last.text)}]}


def supervisor_reply(request: Any) -> Any:
    """A turn starts a researcher on it; the tool's result: ``started <turn>``. A final answer also lists the
    notifications that came since the previous one (``noted <ids>``), wherever they came: with a wake, or in
    the middle of a turn's run."""
    after = trailing(request)
    turns = [m for m in after if isinstance(m, HumanMessage) and not is_note(m)]
    if turns:
        turn = turns[-1].text
        return {"tool_calls": [{"name": "start_async_task", "id": call_id(turn),
                                "args": {"description": turn, "subagent_type": "researcher"}}]}
    results = [m for m in after if isinstance(m, ToolMessage)]
    parts = ["started " + results[-1].tool_call_id.removeprefix("call_").replace("_", " ")] if results else []
    ids = sorted(m.additional_kwargs["task_notification"]["task_id"] for m in since_final_answer(request)
                 if is_note(m))
    if ids:
        parts.append("noted " + " ".join(ids))
    return " | ".join(parts) or "idle"


def since_final_answer(request: Any) -> list[Any]:
    """The messages after the model's last answer without tool calls."""
    out = []
    for message in reversed(request.messages):
        if isinstance(message, AIMessage) and not message.tool_calls:
            break
        out.append(message)
    return out


worker = create_agent(ScriptedModel([worker_reply], loop=True, latency=LATENCY), [work], name="worker")
supervisor = create_deep_agent(
    ScriptedModel([supervisor_reply], loop=True, latency=LATENCY),
    subagents=[SubAgent("researcher", "Researches one turn.", background=True, tools=[work],
                        model=ScriptedModel([researcher_reply], loop=True, latency=LATENCY))],
    general_purpose=False, name="supervisor")
