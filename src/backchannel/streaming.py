"""Streaming a run: all of its events, or one handle per subagent.

``async for event in agent.astream(...)`` yields every event as it happens.
``async for sub in stream.subagents`` yields a :class:`SubagentHandle` for
each subagent the run starts (sync ``task`` subagents and background tasks
alike), with its ``name``, ``cause`` (the tool call that started it),
``status`` and its own ``events()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from typing import Any

from backchannel.events import Event, EventBus

__all__ = ["AgentStream", "SubagentHandle"]

_DONE = object()
_TERMINAL = {"completed": "success", "failed": "error", "interrupted": "interrupted", "cancelled": "cancelled"}


class SubagentHandle:
    """One subagent of a streamed run."""

    def __init__(self, name: str, namespace: tuple[str, ...], cause: dict[str, Any]) -> None:
        self.name = name
        self.namespace = namespace
        self.cause = cause
        self.status = "running"
        self._events: list[Event] = []
        self._ended = False
        self._changed = asyncio.Event()

    def __repr__(self) -> str:
        return f"SubagentHandle(name={self.name!r}, status={self.status!r}, cause={self.cause!r})"

    def _add(self, event: Event) -> None:
        self._events.append(event)
        if event.type == "lifecycle" and event.namespace == self.namespace and event.data["event"] in _TERMINAL:
            self.status = _TERMINAL[event.data["event"]]
            self._ended = True
        self._changed.set()

    def _end(self) -> None:
        self._ended = True
        self._changed.set()

    async def events(self) -> AsyncIterator[Event]:
        """This subagent's events (its nested runs' too), from its start until it ends."""
        index = 0
        while True:
            while index < len(self._events):
                yield self._events[index]
                index += 1
            if self._ended:
                return
            self._changed.clear()
            await self._changed.wait()


class AgentStream:
    """A run in progress. Iterate it for events; ``subagents`` for per-subagent handles;
    ``await stream.wait()`` (or ``stream.result`` after iterating) for the final state."""

    def __init__(self, start: Callable[[EventBus], Coroutine[Any, Any, dict[str, Any]]], *,
                 values: bool = False) -> None:
        self.bus = EventBus(wants_values=values)
        self._start = start
        self._task: asyncio.Task[dict[str, Any]] | None = None
        self._events: asyncio.Queue[Any] = asyncio.Queue()
        self._new_handles: asyncio.Queue[Any] = asyncio.Queue()
        self._handles: dict[str, SubagentHandle] = {}
        self._result: dict[str, Any] | None = None

    @property
    def result(self) -> dict[str, Any]:
        """The final state, once the run has finished."""
        if self._result is None:
            raise RuntimeError("the run has not finished; iterate the stream to the end or await wait() first")
        return self._result

    def _ensure_started(self) -> asyncio.Task[dict[str, Any]]:
        if self._task is None:
            self.bus.subscribe(self._route)
            self._task = asyncio.create_task(self._start(self.bus))
            self._task.add_done_callback(self._finished)
        return self._task

    def _route(self, event: Event) -> None:
        self._events.put_nowait(event)
        if not event.namespace:
            return
        handle = self._handles.get(event.namespace[0])
        if handle is None:
            data = event.data
            if not (event.type == "lifecycle" and len(event.namespace) == 1 and data["event"] == "started"
                    and "cause" in data):
                return
            handle = SubagentHandle(data["graph_name"], event.namespace, data["cause"])
            self._handles[event.namespace[0]] = handle
            self._new_handles.put_nowait(handle)
        handle._add(event)

    def _finished(self, task: asyncio.Task[dict[str, Any]]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._result = task.result()
        for handle in self._handles.values():
            handle._end()
        self._events.put_nowait(_DONE)
        self._new_handles.put_nowait(_DONE)

    async def wait(self) -> dict[str, Any]:
        """Run to the end (if nobody iterates) and return the final state."""
        return await asyncio.shield(self._ensure_started())

    async def __aiter__(self) -> AsyncGenerator[Event, None]:
        task = self._ensure_started()
        try:
            while (event := await self._events.get()) is not _DONE:
                yield event
            self._result = await task
        finally:
            if not task.done():  # the consumer stopped early: stop the run too
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    @property
    def subagents(self) -> AsyncIterator[SubagentHandle]:
        """A handle for each subagent as it starts."""
        return self._subagents()

    async def _subagents(self) -> AsyncIterator[SubagentHandle]:
        self._ensure_started()
        while (handle := await self._new_handles.get()) is not _DONE:
            yield handle
