"""A supervisor and the researcher it delegates to on another server (``remote_agents:<name>`` for subprocesses).

``RESEARCHER_URL`` says where the researcher is served; ``RESEARCHER_LATENCY`` how long its model takes.
"""

from __future__ import annotations

import os
from typing import Any

from backchannel import HumanMessage, ScriptedModel, ToolMessage, create_agent
from backchannel.agent import Agent
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent


def _last(request: Any) -> Any:
    return request.messages[-1]


def supervisor_reply(request: Any) -> Any:
    last = _last(request)
    if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
        return "the researcher reported: " + last.text.split("Result: ", 1)[-1]
    if isinstance(last, ToolMessage):
        return "started the research"
    return {"tool_calls": [{"name": "start_async_task",
                            "args": {"description": last.text, "subagent_type": "researcher"}}]}


def researcher_reply(request: Any) -> str:
    humans = [m for m in request.messages if isinstance(m, HumanMessage)]
    return f"findings about {humans[-1].text}"


def make_supervisor(researcher_url: str) -> Agent:
    return create_deep_agent(ScriptedModel([supervisor_reply], loop=True), name="supervisor", general_purpose=False,
                             subagents=[SubAgent("researcher", "Researches one subject", url=researcher_url,
                                                 graph_id="researcher")])


researcher = create_agent(ScriptedModel([researcher_reply], loop=True,
                                        latency=float(os.environ.get("RESEARCHER_LATENCY", "0"))), name="researcher")
supervisor = make_supervisor(os.environ.get("RESEARCHER_URL", "http://127.0.0.1:8124"))
