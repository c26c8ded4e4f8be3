"""Helpers for the runtime tests: agents whose scripted model is a function of the request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from backchannel import HumanMessage, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.runtime import LocalRuntime, Storage, open_storage
from backchannel.runtime.rows import CheckpointWrite


class Start:
    """A run's start as the executor makes one for its claim (a ``RunStart``): the thread's newest checkpoint it
    expects, and the checkpoint of its input after it."""

    def __init__(self, parent: str | None, write: CheckpointWrite | None) -> None:
        self.parent, self.write = parent, write

    def __call__(self) -> CheckpointWrite | None:
        return self.write


@asynccontextmanager
async def opened_storage(url: str) -> AsyncIterator[Storage]:
    """The storage at ``url``, open for the block."""
    storage = open_storage(url)
    await storage.open()
    try:
        yield storage
    finally:
        await storage.close()


def user(text: str) -> dict[str, Any]:
    """A run input with one user message."""
    return {"messages": [{"role": "user", "content": text}]}


def contents(values: dict[str, Any]) -> list[Any]:
    """The contents of a state's messages, in order."""
    return [m["content"] for m in values["messages"]]


def since_last_human(messages: list[Any]) -> list[Any]:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return list(messages[i + 1:])
    return list(messages)


def turn_of(messages: list[Any]) -> int:
    return sum(isinstance(m, HumanMessage) for m in messages)


def echo(request: Any) -> str:
    """A reply that depends only on the request: echoes the last user message."""
    humans = [m for m in request.messages if isinstance(m, HumanMessage)]
    return f"echo: {humans[-1].text}" if humans else "echo: nothing"


def echo_agent(*, latency: float = 0.0, **kwargs: Any):
    return create_agent(ScriptedModel([echo], loop=True, latency=latency), **kwargs)


def tool_loop(steps: int, tool_name: str = "step", final: str = "done") -> Callable[[Any], Any]:
    """A model (as a function of the request) that calls ``tool_name`` ``steps`` times, then answers.

    Call ids are unique per thread turn and step, so every process computes the same next reply.
    """

    def reply(request: Any) -> Any:
        tail = since_last_human(request.messages)
        done = sum(isinstance(m, ToolMessage) for m in tail)
        if done < steps:
            turn = turn_of(request.messages)
            return {"tool_calls": [{"name": tool_name, "args": {"i": done + 1},
                                    "id": f"call_t{turn}_s{done + 1}"}]}
        return f"{final} after {done} steps"

    return reply


@tool
async def step(i: int) -> str:
    """One step of work."""
    return f"step {i} ok"


def looping_agent(steps: int, *, latency: float = 0.0, tools: Any = (step,), **kwargs: Any):
    kwargs.setdefault("max_iterations", steps + 5)
    return create_agent(ScriptedModel([tool_loop(steps)], loop=True, latency=latency), list(tools), **kwargs)


async def eventually(predicate: Callable[[], Awaitable[bool]], timeout: float = 3.0,
                     interval: float = 0.01) -> None:
    """Wait until ``await predicate()`` is true; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


async def run_status_is(rt: LocalRuntime, thread_id: str, run_id: str, *statuses: str) -> bool:
    return (await rt.runs.get(thread_id, run_id))["status"] in statuses



__all__ = ["contents", "echo", "echo_agent", "eventually", "looping_agent", "run_status_is", "since_last_human",
           "step", "tool_loop", "turn_of", "user"]
