"""The agent of the stalled-server test: six slow steps, then an answer."""

from __future__ import annotations

import asyncio

from backchannel import ScriptedModel, create_agent, tool

STEPS = 6  # 3 s a run: runs are still in hand when the server is stopped, even on a loaded machine


@tool
async def step(i: int) -> str:
    """One slow step of work."""
    await asyncio.sleep(0.5)
    return f"step {i} done"


def _steps(request):
    done = sum(m.type == "tool" for m in request.messages)
    if done < STEPS:
        return {"tool_calls": [{"name": "step", "args": {"i": done + 1}, "id": f"call_{done + 1}"}]}
    return "finished"


worker = create_agent(ScriptedModel([_steps], loop=True), [step], name="worker")
