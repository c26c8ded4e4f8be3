"""The context of one agent run: who is running, where its events go, what the runtime provides.

Middleware hooks receive it as ``ctx``; tools see a :class:`~backchannel.tools.ToolRuntime`
built from it. A nested agent started from inside a tool finds its parent
here (through :func:`calling_tool`) and reports into the same stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from backchannel.events import Event, EventBus
from backchannel.interrupts import InterruptScope, current_scope
from backchannel.messages import AnyMessage
from backchannel.protocols import HostRuntime, StoreAPI
from backchannel.tracing import RunSpan, Trace

__all__ = ["Breakpoints", "CallingTool", "Inbox", "RunContext", "StepRecorder", "calling_tool", "forward_events"]


class StepRecorder(Protocol):
    """Where a run's state changes are recorded (the runtime's checkpointer)."""

    async def step(self, node: str, update: Mapping[str, Any], next_stage: str) -> None:
        """Record that ``node`` applied ``update``; the run continues at ``next_stage``. The run's last step
        (no ``next_stage``) may be held, to be recorded with the run's end: see :meth:`flush`."""

    async def flush(self) -> None:
        """Record a held last step now: before the run does anything others see after it (``on_end`` hooks)."""

    async def pending(self, tool_call_id: str, update: Mapping[str, Any]) -> None:
        """Record one finished tool call of a parallel batch before the batch is applied."""


class Inbox(Protocol):
    """Messages delivered to a thread while a run is active (task notifications)."""

    def drain(self) -> list[AnyMessage]:
        """The messages waiting now (they stay until acknowledged)."""

    async def ack(self, messages: Sequence[AnyMessage]) -> None:
        """Forget messages that are now in the thread's state."""

    async def wait(self) -> None:
        """Return once a message is waiting."""


@dataclass(frozen=True, slots=True)
class Breakpoints:
    """Where a run pauses for a person to look before it goes on (LangGraph's ``interrupt_before`` and
    ``interrupt_after``): ``model`` (the model call), ``tools`` (the tools step) or a tool's name.

    ``resumed``: the run continues from such a pause, so the breakpoint it paused at lets it through once.
    """

    before: frozenset[str] = frozenset()
    after: frozenset[str] = frozenset()
    resumed: bool = False


# What a run with no resume values or pending tool results holds: one shared empty mapping (thousands of live
# background runs each held two empty dicts).
NOTHING: Mapping[str, Any] = MappingProxyType({})


@dataclass(slots=True)
class RunContext:
    """One agent run as hooks and tools see it."""

    agent: str
    run_id: str
    thread_id: str | None = None
    namespace: tuple[str, ...] = ()
    bus: EventBus | None = None
    context: Any = None
    store: StoreAPI | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    recorder: StepRecorder | None = None
    inbox: Inbox | None = None
    resume: Mapping[str, Any] = field(default_factory=lambda: NOTHING)  # interrupt id -> the value it resumes with
    pending_tools: Mapping[str, Any] = field(default_factory=lambda: NOTHING)  # call id -> its result before a crash
    runtime: HostRuntime | None = None  # the runtime the run executes in
    parent: RunContext | None = None
    deadline: float | None = None  # event-loop time by which the run must end (it then times out)
    max_iterations: int | None = None  # this run's limit of model calls, instead of the agent's
    breakpoints: Breakpoints | None = None  # where this run pauses for a person to look
    trace: Trace = field(default_factory=Trace)  # what the run does, as spans (shared with nested runs)
    span: RunSpan | None = None  # this run's own span in it, while it runs

    def emit(self, type: str, data: Any) -> None:
        """Publish an event of this run (a no-op when nobody listens)."""
        bus = self.bus
        if bus is not None and bus.listeners:
            bus.publish(Event(type, data, self.namespace, self.agent, self.thread_id, self.run_id))

    def emit_custom(self, data: Any) -> None:
        """Publish a ``custom`` event: anything a tool or middleware wants to report."""
        self.emit("custom", data)


class CallingTool(InterruptScope):
    """A tool call running now: the interrupt scope its run sets around it (``where`` is the call's id), which also
    says, for a nested agent started inside it, the calling run and that run's event loop."""

    __slots__ = ("run", "loop")

    def __init__(self, run: RunContext, call_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__("tool", call_id, run.resume)
        self.run = run
        self.loop = loop

    @property
    def call_id(self) -> str:
        return self.where


def calling_tool() -> CallingTool | None:
    """The tool call a nested agent started now runs inside: the innermost one around the current scope, if any."""
    scope = current_scope.get()
    while scope is not None and not isinstance(scope, CallingTool):
        scope = scope.enclosing
    return scope


_TERMINAL = frozenset({"completed", "failed", "interrupted", "cancelled"})


def forward_events(child_bus: EventBus, parent: RunContext, segment: str, tool_call_id: str, *,
                   lifecycle: bool = True, loop: asyncio.AbstractEventLoop | None = None) -> Callable[[], None]:
    """Republish a nested run's events in ``parent``'s stream, under ``segment``, caused by the tool call.

    The child's events are relative to it (its own lifecycle has no namespace).
    ``lifecycle=False`` drops that lifecycle (an unnamed agent is no subagent).
    Given the parent's ``loop``, events published from another thread are
    handed to it rather than published there. Returns the unsubscribe function.
    """
    prefix = (*parent.namespace, segment)
    cause = {"type": "toolCall", "tool_call_id": tool_call_id}
    elsewhere = loop is not None and loop is not _running_loop()

    def forward(event: Event) -> None:
        data = event.data
        if event.type == "lifecycle" and not event.namespace:
            if data["event"] in _TERMINAL:
                unsubscribe()
            if not lifecycle:
                return
            data = {**data, "cause": cause}
        bus = parent.bus
        if bus is None or not bus.listeners:
            return
        copy = Event(event.type, data, prefix + event.namespace, event.agent, event.thread_id, event.run_id)
        if not elsewhere:
            bus.publish(copy)
            return
        assert loop is not None
        try:
            loop.call_soon_threadsafe(bus.publish, copy)
        except RuntimeError:  # the parent's loop has closed: nobody is listening any more
            unsubscribe()

    unsubscribe = child_bus.subscribe(forward)
    return unsubscribe


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
