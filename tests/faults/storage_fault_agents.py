"""Agents served by the ``backchannel serve`` processes of ``test_storage_faults.py``."""

from __future__ import annotations

import asyncio
import time

from backchannel import ScriptedModel, create_agent, tool


def _echo(request) -> str:
    return "echo: " + request.messages[-1].text


echo = create_agent(ScriptedModel([_echo], loop=True), name="echo")


@tool
async def crunch() -> str:
    """CPU-bound work on the event loop (a parser, a big JSON document): each call holds the loop 50 ms."""
    await asyncio.sleep(0)
    time.sleep(0.05)
    return "crunched"


def _crunch_forever(request) -> dict:
    return {"tool_calls": [{"name": "crunch", "args": {}}]}


# A run that never ends by itself and keeps the server's event loop busy: other requests are served
# between its steps, so what they do at "the end of this event-loop tick" waits for its next step.
busy = create_agent(ScriptedModel([_crunch_forever], loop=True), [crunch], name="busy", max_iterations=1_000_000)


@tool(inline=True)
def step(i: int) -> str:
    """One step of work."""
    return f"step {i} done"


def _steps(request):
    """``"steps N"``: N tool calls, one at a time, then an answer (2N + 2 messages a run)."""
    wanted = int(request.messages[0].text.split()[1])
    done = sum(m.type == "tool" for m in request.messages)
    return {"tool_calls": [{"name": "step", "args": {"i": done}}]} if done < wanted else f"{done} steps"


steps = create_agent(ScriptedModel([_steps], loop=True), [step], name="steps", max_iterations=1_000_000)
