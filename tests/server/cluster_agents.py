"""The agents of the multi-process server test: a supervisor that starts one background task per user turn."""

from __future__ import annotations

from typing import Any

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent


def is_note(message: Any) -> bool:
    return isinstance(message, HumanMessage) and "task_notification" in message.additional_kwargs


def reply(request: Any) -> Any:
    """A user turn starts a researcher on it; its result says "started"; task notifications get "noted"."""
    trailing = []
    for message in reversed(request.messages):
        if isinstance(message, AIMessage):
            break
        trailing.append(message)
    if any(isinstance(m, ToolMessage) for m in trailing):
        return "started"
    turns = [m for m in trailing if isinstance(m, HumanMessage) and not is_note(m)]
    if turns:
        turn = turns[-1].text
        return {"tool_calls": [{"name": "start_async_task", "id": "call_" + turn.replace(" ", "_"),
                                "args": {"description": turn, "subagent_type": "researcher"}}]}
    return "noted"


supervisor = create_deep_agent(
    ScriptedModel([reply], loop=True),
    subagents=[SubAgent("researcher", "Researches one question.", background=True,
                        model=ScriptedModel(["The answer is 42."], loop=True, latency=0.05))],
    general_purpose=False, name="supervisor")
