"""The seed 001 demo: a supervisor with researcher and analyst subagents working in the background.

The supervisor dispatches the subagents, keeps talking while they work, and
answers each result as it comes back, then writes the synthesis. With a real
model configured it uses it; otherwise every agent runs on an offline scripted
model, and the output says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from backchannel.agent import Agent
from backchannel.messages import HumanMessage, ToolMessage
from backchannel.models.base import ModelRequest
from backchannel.models.offline import OFFLINE_LABEL, OfflineModel, search_notes
from backchannel.models.scripted import ScriptedModel

__all__ = ["DEFAULT_PROMPT", "DEMO_DATABASE", "build_demo"]

DEFAULT_PROMPT = "Who is the greater basketball player, LeBron James or Michael Jordan?"
# The demo's own state, so that it never meets the chat's threads and tasks (and their agents of the same names).
DEMO_DATABASE = "sqlite:///~/.backchannel/demo.db"

def build_demo(model: Any = None, *, latency: float = 0.6,
               completion: Literal["notify", "wait"] = "wait") -> Agent:
    """The demo supervisor; ``model=None`` runs everything on offline scripted models.

    ``latency`` is the scripted models' time per reply (seconds). With ``completion="wait"`` the
    supervisor's run lasts until every result is in; with ``"notify"`` it ends after dispatching,
    and each result wakes it with a new run.
    """
    from backchannel.deep_agent import create_deep_agent  # here: a server with the demo page imports this module
    from backchannel.subagents import SubAgent

    researcher = SubAgent(
        "researcher", "Looks up facts and statistics about one subject and reports them.",
        system_prompt="Research the subject you are given with search_notes, then report the key facts.",
        tools=[search_notes], background=True, timeout=120,
        model=model or OfflineModel(latency=latency, name=OFFLINE_LABEL))
    analyst = SubAgent(
        "analyst", "Works out how to compare candidates: criteria and how to weigh them.",
        system_prompt="Explain the criteria for the comparison you are given and how to weigh them.",
        tools=[search_notes], background=True, timeout=120,
        model=model or ScriptedModel([_analyst], loop=True, latency=latency * 1.5, name=OFFLINE_LABEL))
    supervisor_model = model or ScriptedModel([_supervisor], loop=True, latency=latency / 3, name=OFFLINE_LABEL)
    return create_deep_agent(
        supervisor_model, subagents=[researcher, analyst], general_purpose=False, completion=completion,
        name="supervisor",
        system_prompt=("You coordinate researchers and an analyst. For a comparison question, start one "
                       "researcher per subject and the analyst in the background with start_async_task, tell "
                       "the user what you started, comment briefly on each result as it arrives, and when all "
                       "are in, give a clear verdict."))


# -- the offline scripts: each reply is a function of what the agent sees ---------------


def _supervisor(request: ModelRequest) -> Any:
    messages = request.messages
    last = messages[-1]
    tasks: Mapping[str, Any] = request.state.get("async_tasks") or {}
    if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
        done = [t for t in tasks.values() if t.get("status") == "success"]
        if len(done) < len(tasks):
            # One comment per result that came in since the last reply (results arriving together come at once).
            comments = [f"The {m.additional_kwargs['task_notification']['subagent']} is back: "
                        + _shorten(m.text.split("Result: ", 1)[-1], 110)
                        for m in _new_results(messages)]
            return " ".join(comments) + f" Still waiting on {len(tasks) - len(done)} more."
        return _verdict()
    if isinstance(last, ToolMessage):
        return ("I've put two researchers and an analyst to work in the background. While they dig, "
                "a thought: this debate usually comes down to peak versus longevity, and the two of them "
                "are the purest examples of each. I'll comment as each result arrives.")
    return {"tool_calls": [
        {"name": "start_async_task", "args": {"subagent_type": "researcher",
                                              "description": "Research LeBron James: titles, awards, records."}},
        {"name": "start_async_task", "args": {"subagent_type": "researcher",
                                              "description": "Research Michael Jordan: titles, awards, records."}},
        {"name": "start_async_task", "args": {"subagent_type": "analyst",
                                              "description": "Give the criteria for judging the greatest (GOAT) "
                                                             "basketball player and how to weigh them."}},
    ]}


def _new_results(messages: Any) -> list[HumanMessage]:
    """The task notifications since the supervisor's last reply, oldest first."""
    found = []
    for m in reversed(messages):
        if not isinstance(m, HumanMessage) or "task_notification" not in m.additional_kwargs:
            break
        found.append(m)
    return found[::-1]


def _analyst(request: ModelRequest) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return (f"{last.text} Weigh peak dominance and Finals record most, then longevity and "
                "statistical production.")
    return {"tool_calls": [{"name": "search_notes", "args": {"query": "GOAT criteria"}}]}


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + "…"


def _verdict() -> str:
    return ("All three reports are in. On peak dominance and the Finals, Jordan leads: 6 titles in 6 trips, "
            "6 Finals MVPs, 10 scoring titles. On longevity and total production, LeBron leads: the all-time "
            "scoring record and 20 All-Star selections. Weighing peak and Finals record most, as the analyst "
            "suggests, the verdict is Michael Jordan, by a narrow margin that LeBron's longevity keeps alive.")
