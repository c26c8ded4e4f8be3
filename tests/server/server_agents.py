"""Agents the server tests serve (importable as ``server_agents:<name>`` by server subprocesses too)."""

from __future__ import annotations

import os
from typing import Any

from backchannel import (
    AIMessage,
    HumanInTheLoop,
    HumanMessage,
    ScriptedModel,
    ToolMessage,
    ToolRuntime,
    create_agent,
    tool,
)
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@tool
def report(progress: str, runtime: ToolRuntime) -> str:
    """Report progress on the custom stream.

    Args:
        progress: What to report.
    """
    runtime.emit({"progress": progress})
    return f"reported {progress}"


@tool
def send_email(to: str, body: str) -> str:
    """Send an email.

    Args:
        to: The recipient.
        body: The text.
    """
    return f"sent to {to}: {body}"


@tool
def journal(entry: str) -> str:
    """Write an entry in the journal (a file named by $JOURNAL): a side effect that must happen once.

    Args:
        entry: What to write.
    """
    with open(os.environ["JOURNAL"], "a") as f:
        f.write(entry + "\n")
    return f"wrote {entry}"


def journal_reply(request: Any) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return f"journaled: {last.text}"
    return {"tool_calls": [{"name": "journal", "args": {"entry": last_human(request)}}]}


def last_human(request: Any) -> str:
    humans = [m for m in request.messages if isinstance(m, HumanMessage)]
    return humans[-1].text if humans else ""


def calc_reply(request: Any) -> Any:
    """Adds 2 and 3 with the tool, then states the result."""
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return f"the answer is {last.text}"
    return {"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}


def echo_reply(request: Any) -> str:
    return f"echo: {last_human(request)}"


def reporter_reply(request: Any) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return "reported"
    return {"tool_calls": [{"name": "report", "args": {"progress": "half way"}}]}


def mailer_reply(request: Any) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return f"done: {last.text}"
    if isinstance(last, AIMessage):
        return "ok"
    return {"tool_calls": [{"name": "send_email", "args": {"to": "ada@example.com", "body": last_human(request)}}]}


def looper_reply(request: Any) -> Any:
    """Never finishes: calls the tool again after every result (stopped only by a limit)."""
    return {"tool_calls": [{"name": "add", "args": {"a": 1, "b": len(request.messages)}}]}


def chatty_reply(request: Any) -> Any:
    """300 tool calls with 2 KB results, then a 4 KB answer: a long run whose values stream is large."""
    calls = sum(isinstance(m, ToolMessage) for m in request.messages)
    if calls >= 300:
        return "done " + "y" * 4000
    return {"tool_calls": [{"name": "pad", "args": {"n": calls}}]}


@tool(inline=True)
def pad(n: int) -> str:
    """Return 2 KB of text.

    Args:
        n: Which call this is.
    """
    return f"{n}:" + "x" * 2000


def delegator_reply(request: Any) -> Any:
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return f"the helper said: {last.text}"
    return {"tool_calls": [{"name": "task", "args": {"description": last_human(request), "subagent_type": "helper"}}]}


def helper_reply(request: Any) -> str:
    return f"helped with {last_human(request)}"


calc = create_agent(ScriptedModel([calc_reply], loop=True), [add], name="calc")
echo = create_agent(ScriptedModel([echo_reply], loop=True), name="echo")
# Each model call takes 0.4 s: long enough to cancel, interrupt or queue behind.
slow = create_agent(ScriptedModel([echo_reply], loop=True, latency=0.4), name="slow")
glacial = create_agent(ScriptedModel([echo_reply], loop=True, latency=5.0), name="glacial")  # still going when asked
reporter = create_agent(ScriptedModel([reporter_reply], loop=True), [report], name="reporter")
mailer = create_agent(ScriptedModel([mailer_reply], loop=True), [send_email], name="mailer",
                      middleware=[HumanInTheLoop({"send_email": True})])
# The same, slow to ask (1 s a model call): langgraph_sdk's thread stream drops the end of a run that ended
# before a projection (run.values) subscribed (its dedup takes the replay for a repeat), so its
# RemoteGraph v3 tests need the run still going when they subscribe.
slow_mailer = create_agent(ScriptedModel([mailer_reply], loop=True, latency=1.0), [send_email], name="slow_mailer",
                           middleware=[HumanInTheLoop({"send_email": True})])
# Two model calls of 1.5 s around a side effect: a stop between them must not repeat the side effect.
journaler = create_agent(ScriptedModel([journal_reply], loop=True, latency=1.5), [journal], name="journaler")
chatty = create_agent(ScriptedModel([chatty_reply], loop=True, chunk_size=4), [pad], name="chatty",
                      max_iterations=1000)
looper = create_agent(ScriptedModel([looper_reply], loop=True), [add], name="looper")
delegator = create_deep_agent(
    ScriptedModel([delegator_reply], loop=True), name="delegator", general_purpose=False,
    subagents=[SubAgent("helper", "Helps with anything", model=ScriptedModel([helper_reply], loop=True))])

AGENTS = {"calc": calc, "echo": echo, "slow": slow, "glacial": glacial, "reporter": reporter, "mailer": mailer,
          "slow_mailer": slow_mailer, "delegator": delegator, "looper": looper, "chatty": chatty}
