"""Agents the useStream page test serves: a typist whose reply streams word by word, a delegator whose subagent
takes its time, the mailer that asks first, and the demo supervisor whose background results wake it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from server_agents import AGENTS, delegator_reply, last_human

from backchannel import ScriptedModel
from backchannel.deep_agent import create_deep_agent
from backchannel.demo import build_demo
from backchannel.models import ModelDelta, ModelRequest
from backchannel.subagents import SubAgent

TYPED = "the quick brown fox jumps over the lazy dog and keeps on running far away"


class Typist(ScriptedModel):
    """A scripted model that types: each word of its reply ``pause`` seconds after the last, as a real one streams."""

    def __init__(self, script: list[Any], pause: float = 0.08) -> None:
        super().__init__(script, loop=True)
        self.pause = pause

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        async for delta in super().stream(request):
            yield delta
            await asyncio.sleep(self.pause)


def helper_reply(request: Any) -> str:
    return f"helper working on {last_human(request)}: " + TYPED


typist = create_deep_agent(Typist([TYPED]), name="typist", general_purpose=False)
slow_delegator = create_deep_agent(
    ScriptedModel([delegator_reply], loop=True), name="delegator", general_purpose=False,
    subagents=[SubAgent("helper", "Helps with anything", model=Typist([helper_reply]))])

BROWSER_AGENTS = {"typist": typist, "delegator": slow_delegator, "mailer": AGENTS["mailer"],
                  "supervisor": build_demo(latency=0.3, completion="notify")}
