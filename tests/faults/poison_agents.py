"""Agents of the poison-run test: one whose tool kills its own process, and one that just answers."""

from __future__ import annotations

import asyncio
import os
import signal

from backchannel import ScriptedModel, create_agent, tool


@tool
async def crash(how: str) -> str:
    """Take the whole process down, as a native library's segfault or the OOM killer would."""
    await asyncio.sleep(0.3)
    if how == "exit":
        os._exit(3)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def _crash_then_answer(request):
    if request.messages[-1].type == "tool":
        return "survived"
    how = "exit" if "exit" in request.messages[-1].text else "kill"
    return {"tool_calls": [{"name": "crash", "args": {"how": how}, "id": "call_crash"}]}


poison = create_agent(ScriptedModel([_crash_then_answer], loop=True), [crash], name="poison")
steady = create_agent(ScriptedModel(["steady answer"], loop=True), name="steady")
