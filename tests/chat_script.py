"""Scripted models and tools for the chat's terminal tests, loaded through config.toml as ``chat_script:...``."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from backchannel import ScriptedModel, tool
from backchannel.messages import HumanMessage, ToolMessage

SUMMARY = ("Title: Tea research\n"
           "- The user asked about the history of tea.\n"
           "- A researcher found that tea was first drunk in China.\n"
           "- Next: compare green and black tea.\n"
           "TL;DR: Tea began in China.")


def _supervisor(request):
    first = request.messages[0].text if request.messages else ""
    if "Handoff Summary Assistant" in first:
        return SUMMARY
    if "Context Extraction Assistant" in first:
        return "The user and the assistant chatted about tea."
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        if last.name == "start_async_task":
            return "I started a researcher on it in the background."
        return f"The tool said: {last.text}"
    if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
        return "The researcher reports: " + last.text.split("Result: ", 1)[-1]
    text = last.text.lower()
    if "research" in text:
        description = "Research the history of tea" + (", slowly" if "leisurely" in text else "")
        return {"tool_calls": [{"name": "start_async_task",
                                "args": {"subagent_type": "researcher", "description": description}}]}
    if "where were we" in text:
        found = re.search(r"### (.+)", request.system_prompt or "")
        return f"From my notes: {found.group(1)}." if found else "I have no notes about earlier threads."
    if "delete" in text:
        return {"tool_calls": [{"name": "delete_file", "args": {"path": "notes.txt"}}]}
    return f"You said: {last.text}"


class SlowWhenAsked(ScriptedModel):
    """Takes its time (30 s) when the last message says "slow": something to cancel."""

    async def _pause(self, request):
        if request.messages and "slow" in request.messages[-1].text.lower():
            await asyncio.sleep(30)

    async def generate(self, request):
        await self._pause(request)
        return await super().generate(request)

    async def stream(self, request):
        await self._pause(request)
        async for delta in super().stream(request):
            yield delta


@tool
def delete_file(path: str) -> str:
    """Delete a file.

    Args:
        path: The file to delete.
    """
    target = Path.home() / path
    target.unlink()
    return f"deleted {path}"


supervisor = SlowWhenAsked([_supervisor], loop=True, name="scripted")
researcher = SlowWhenAsked(["Tea was first drunk in China, about 2700 BC."], loop=True, latency=2.0,
                           name="scripted")


def _served_agent():
    """The chat's agent as a server serves it (``backchannel serve --agents chat_script:agent``)."""
    from backchannel.config import ChatConfig, build_chat_agent

    config = ChatConfig.model_validate({"subagents": [{"name": "researcher", "description": "Researches one subject",
                                                       "model": "chat_script:researcher", "background": True}]})
    return build_chat_agent(config, supervisor)


def __getattr__(name):
    if name == "agent":  # built on first use, so that importing the models alone builds no agent
        return _served_agent()
    raise AttributeError(name)
