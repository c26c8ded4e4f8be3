"""Scripted models and tools for the chat's terminal tests, loaded through config.toml as ``chat_script:...``."""

from __future__ import annotations

import asyncio
import logging
import re
import warnings
from pathlib import Path

from backchannel import ScriptedModel, create_agent, tool
from backchannel.errors import ModelServerError
from backchannel.messages import HumanMessage, ToolMessage

SUMMARY = ("Title: Tea research\n"
           "- The user asked about the history of tea.\n"
           "- A researcher found that tea was first drunk in China.\n"
           "- Next: compare green and black tea.\n"
           "TL;DR: Tea began in China.")


MANY_POINTS = ("Title: Many points\n" + "".join(f"- Point number {i}.\n" for i in range(1, 9))
               + "TL;DR: Eight points.")


def _supervisor(request):
    first = request.messages[0].text if request.messages else ""
    if "Handoff Summary Assistant" in first:
        return MANY_POINTS if "many points" in first else SUMMARY
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
        description = ("Research the history of tea" + (", slowly" if "leisurely" in text else "")
                       + (", at length" if "at length" in text else ""))
        return {"tool_calls": [{"name": "start_async_task",
                                "args": {"subagent_type": "researcher", "description": description}}]}
    if "make some noise" in text:
        return {"tool_calls": [{"name": "start_async_task",
                                "args": {"subagent_type": "noisy", "description": "Make some noise"}}]}
    if "break" in text:
        raise ModelServerError("scripted 503: the provider is down", provider="scripted", status=503)
    if "where were we" in text:
        found = re.search(r"### (.+)", request.system_prompt or "")
        return f"From my notes: {found.group(1)}." if found else "I have no notes about earlier threads."
    if "delete" in text:
        return {"tool_calls": [{"name": "delete_file", "args": {"path": "notes.txt"}}]}
    return f"You said: {last.text}"


class SlowWhenAsked(ScriptedModel):
    """Takes its time (30 s) when the last message says "slow", or when a handoff summary is asked of a thread
    that says "take your time": something to cancel. A task "at length" takes 6 s."""

    async def _pause(self, request):
        if not request.messages:
            return
        if "slow" in request.messages[-1].text.lower() or (
                "Handoff Summary Assistant" in request.messages[0].text
                and "take your time" in request.messages[0].text):
            await asyncio.sleep(30)
        elif ", at length" in request.messages[-1].text:
            await asyncio.sleep(6)

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


USAGE = {"input_tokens": 1200, "output_tokens": 34, "total_tokens": 1234}  # what each reply reports


def _with_usage(request):
    reply = _supervisor(request)
    return {**(reply if isinstance(reply, dict) else {"content": reply}), "usage": USAGE}


supervisor = SlowWhenAsked([_with_usage], loop=True, name="scripted")
researcher = SlowWhenAsked(["Tea was first drunk in China, about 2700 BC."], loop=True, latency=2.0,
                           name="scripted")


@tool
async def noisy_tool() -> str:
    """Log a warning and warn."""
    logging.getLogger("backchannel.chat_script").info("the noisy tool starts")
    return _make_noise()


@tool(name="noisy_tool")  # the noisy model calls it
async def noisy_tool_on_cue() -> str:
    """Log a warning and warn once the file ``cue`` appears in the home directory: when the test has seen the
    chat ask its question (a fixed delay was too short on a loaded machine, the noise came before the question)."""
    logging.getLogger("backchannel.chat_script").info("the noisy tool starts")
    while not (Path.home() / "cue").exists():
        await asyncio.sleep(0.05)
    return _make_noise()


def _make_noise() -> str:
    logging.getLogger("backchannel.chat_script").warning("a log line from the noisy tool")
    warnings.warn("a Python warning from the noisy tool", UserWarning, stacklevel=2)
    return "noise made"


noisy = ScriptedModel([{"tool_calls": [{"name": "noisy_tool", "args": {}}]}, "Made some noise."], loop=True,
                      name="scripted")
broken = ScriptedModel([ModelServerError("scripted 503: the provider is down", provider="scripted", status=503)],
                       loop=True, name="scripted")
plain = create_agent(ScriptedModel([lambda r: f"You said: {r.messages[-1].text}"], loop=True), name="plain")


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
