"""Shared helpers for the subagent tests (sync ``task``, background tasks, notifications).

Imported by ``tests/test_subagents.py``, ``test_async_tasks.py``,
``test_notifier.py`` and ``test_deep_agent.py``, and by the crash-recovery
subprocess script (which puts this directory on ``sys.path``).
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent

NOTE_RE = re.compile(r"^\[task_id=(?P<task_id>[^\]]+)\]\[subagent=(?P<subagent>[^\]]+)\] "
                     r"(?P<kind>Completed\. Result: |Error: |Waiting for input: )(?P<detail>.*)$", re.S)


def call(name: str, args: Mapping[str, Any] | None = None, id: str | None = None) -> dict[str, Any]:
    """A tool call for a scripted reply."""
    out: dict[str, Any] = {"name": name, "args": dict(args or {})}
    if id is not None:
        out["id"] = id
    return out


def stack_looker(result: str) -> tuple[Any, list[str]]:
    """A tool answering ``result`` that notes the qualified names of the frames it runs under (innermost first):
    what each live call holds suspended while a tool runs."""
    import sys

    from backchannel import tool

    names: list[str] = []

    @tool
    async def look() -> str:
        """Look at who waits for this call."""
        frame = sys._getframe()
        while frame is not None:
            names.append(frame.f_code.co_qualname)
            frame = frame.f_back
        return result

    return look, names


def start(subagent: str, description: str, id: str) -> dict[str, Any]:
    return call("start_async_task", {"description": description, "subagent_type": subagent}, id)


def policy(fn: Callable[[Any], Any], **kwargs: Any) -> ScriptedModel:
    """A scripted model that answers every request with ``fn(request)``."""
    return ScriptedModel([fn], loop=True, **kwargs)


# -- reading messages (objects or LangGraph dicts) ---------------------------------------------


def kind(m: Any) -> str:
    return m["type"] if isinstance(m, Mapping) else m.type


def text(m: Any) -> str:
    if isinstance(m, Mapping):
        content = m["content"]
        if isinstance(content, str):
            return content
        return "".join(b.get("text", "") for b in content if isinstance(b, Mapping))
    return m.text


def extra(m: Any) -> dict[str, Any]:
    return (m.get("additional_kwargs") if isinstance(m, Mapping) else m.additional_kwargs) or {}


def is_note(m: Any) -> bool:
    return kind(m) == "human" and "task_notification" in extra(m)


def notes(messages: Any, task_id: str | None = None) -> list[Any]:
    """The task notifications among ``messages`` (for one task if ``task_id``)."""
    return [m for m in messages if is_note(m)
            and (task_id is None or extra(m)["task_notification"]["task_id"] == task_id)]


def last_is_note(request: Any) -> bool:
    return bool(request.messages) and isinstance(request.messages[-1], HumanMessage) and is_note(request.messages[-1])


def tool_messages(messages: Any, name: str | None = None) -> list[Any]:
    return [m for m in messages if kind(m) == "tool" and (name is None or (m["name"] if isinstance(m, Mapping)
                                                                          else m.name) == name)]


def tasks_of(request: Any) -> dict[str, dict[str, Any]]:
    """The supervisor's tracked tasks, as its model sees them in a request."""
    return dict(request.state.get("async_tasks") or {})


def task_ids_by_subagent(state: Mapping[str, Any]) -> dict[str, str]:
    return {t["subagent"]: tid for tid, t in (state.get("async_tasks") or {}).items()}


# -- waiting on the runtime ---------------------------------------------------------------------


async def wait_until(predicate: Callable[[], Any], timeout: float = 5.0, interval: float = 0.01,
                     what: str = "condition") -> Any:
    """Poll a sync or async predicate until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def settled(rt: Any, thread_id: str, runs: int, timeout: float = 5.0) -> list[dict[str, Any]]:
    """Wait until ``thread_id`` has had ``runs`` runs and none is pending or running; returns them."""
    async def check() -> list[dict[str, Any]] | None:
        found = await rt.runs.list(thread_id, limit=100)
        if len(found) >= runs and all(r["status"] not in ("pending", "running") for r in found):
            return found
        return None

    return await wait_until(check, timeout, what=f"{runs} finished runs on thread {thread_id}")


async def quiet(rt: Any, thread_id: str, timeout: float = 5.0) -> None:
    """Wait until no run of ``thread_id`` is pending or running."""
    async def check() -> bool:
        return all(r["status"] not in ("pending", "running") for r in await rt.runs.list(thread_id, limit=100))

    await wait_until(check, timeout, what=f"thread {thread_id} to be quiet")


async def messages_of(rt: Any, thread_id: str) -> list[dict[str, Any]]:
    state = await rt.threads.get_state(thread_id)
    return state["values"].get("messages", [])


async def values_of(rt: Any, thread_id: str) -> dict[str, Any]:
    return (await rt.threads.get_state(thread_id))["values"]


async def task_run_status(rt: Any, task: Mapping[str, Any]) -> str:
    from backchannel.async_tasks import task_status

    return await task_status(rt, task)


# -- agents shared with the crash-recovery subprocess -------------------------------------------


def relay_supervisor(starts: list[dict[str, Any]] | None = None, **kwargs: Any) -> ScriptedModel:
    """A supervisor model: on a user message, start the given tasks; on tool results, say so;
    on task notifications, relay every one it sees in that request to the user."""
    starts = starts or [start("researcher", "find the answer", "call_start")]

    def reply(request: Any) -> Any:
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and is_note(last):
            fresh = []
            for m in reversed(request.messages):
                if isinstance(m, AIMessage):
                    break
                if is_note(m):
                    fresh.append(m.text)
            return "Relay: " + " | ".join(reversed(fresh))
        if isinstance(last, HumanMessage):
            return {"tool_calls": starts}
        if isinstance(last, ToolMessage):
            return "Started the background work; I'll report back."
        return "ok"

    return policy(reply, **kwargs)


def crash_supervisor() -> Any:
    """The agent definitions used by the crash-recovery test, in the subprocess and after restart."""
    return create_deep_agent(
        relay_supervisor([start("researcher", "find the answer", "call_start")]),
        subagents=[SubAgent("researcher", "Researches things.", background=True,
                            model=ScriptedModel(["The answer is 42."], loop=True))],
        general_purpose=False)


SUBPROCESS_SCRIPT = r'''
import asyncio, os, sys
from pathlib import Path

sys.path.insert(0, {tests_dir!r})
db, marker, kill_point = sys.argv[1], Path(sys.argv[2]), sys.argv[3]

from subagent_helpers import crash_supervisor
from backchannel.notifier import CompletionNotifier
from backchannel.runtime import LocalRuntime
from backchannel.runtime.mail import Mail


async def hang(label):
    marker.write_text(label)
    await asyncio.sleep(3600)


if kill_point == "before_delivery":
    # The subagent's run has its answer; stall just before its notification is stored.
    original = CompletionNotifier.on_end

    async def slow_on_end(self, state, ctx, result):
        if result.status == "success" and state.get("task_id"):
            await hang("child finished, notification not stored")
        return await original(self, state, ctx, result)

    CompletionNotifier.on_end = slow_on_end
elif kill_point == "after_notification":
    # The notification is stored in the parent's inbox; stall before the subagent's run's end is recorded.
    from backchannel.runtime.sqlite import SQLiteStorage

    finish_run = SQLiteStorage.finish_run

    async def slow_finish_run(self, end):
        if end.thread_id != "parent":
            await hang("notification stored, the task's end not recorded")
        return await finish_run(self, end)

    SQLiteStorage.finish_run = slow_finish_run
else:
    # The notification is stored in the parent's inbox; stall before the parent is woken.
    async def slow_wake(self, thread_id, assistant_id=None):
        await hang("notification stored, parent not woken")

    Mail.wake = slow_wake


async def main():
    agent = crash_supervisor()
    async with LocalRuntime("sqlite:///" + db, agents={{"supervisor": agent}}) as rt:
        await agent.ainvoke("research please", thread_id="parent")
        Path(str(marker) + ".started").write_text("supervisor run done")
        await asyncio.sleep(3600)


asyncio.run(main())
'''


# -- a supervisor driven by its user: each user message is a JSON list of tool calls to make -----


def commander(**kwargs: Any) -> ScriptedModel:
    """A supervisor model whose user messages are JSON lists of tool calls (``$name`` in an argument
    stands for the task id of the tracked task of subagent ``name``). It answers tool results with
    ``"ok"`` and task notifications with ``"noted: <notification>"``."""
    import json

    def reply(request: Any) -> Any:
        trailing = []
        for m in reversed(request.messages):
            if isinstance(m, AIMessage):
                break
            trailing.append(m)
        trailing.reverse()
        commands = [m for m in trailing if isinstance(m, HumanMessage) and not is_note(m)]
        if commands:
            ids = {t["subagent"]: tid for tid, t in tasks_of(request).items()}
            calls = []
            for c in json.loads(commands[-1].text):
                args = {k: ids.get(v[1:], v) if isinstance(v, str) and v.startswith("$") else v
                        for k, v in c["args"].items()}
                calls.append({**c, "args": args})
            return {"tool_calls": calls}
        if any(isinstance(m, ToolMessage) for m in trailing):
            return "ok"
        return "noted: " + " | ".join(m.text for m in trailing if is_note(m))

    return policy(reply, **kwargs)


async def command(agent: Any, thread_id: str, *calls: dict[str, Any]) -> dict[str, Any]:
    """Have a :func:`commander` supervisor make ``calls`` in one reply; returns their tool messages by id."""
    import json

    state = await agent.ainvoke(json.dumps(list(calls)), thread_id=thread_id)
    wanted = {c["id"] for c in calls}
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage) and m.tool_call_id in wanted}
