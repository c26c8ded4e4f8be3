"""The context of one agent run: who is running, where its events go, what the runtime provides.

Middleware hooks receive it as ``ctx``; tools see a :class:`~backchannel.tools.ToolRuntime`
built from it. A nested agent started from inside a tool finds its parent
here (through :data:`current_tool_call`) and reports into the same stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol

from backchannel.events import Event, EventBus
from backchannel.messages import AnyMessage
from backchannel.tracing import RunSpan, Trace

__all__ = ["Inbox", "RunContext", "StepRecorder", "current_tool_call"]


class StepRecorder(Protocol):
    """Where a run's state changes are recorded (the runtime's checkpointer)."""

    async def step(self, node: str, update: Mapping[str, Any], next_stage: str) -> None:
        """Record that ``node`` applied ``update``; the run continues at ``next_stage``."""

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


@dataclass(slots=True)
class RunContext:
    """One agent run as hooks and tools see it."""

    agent: str
    run_id: str
    thread_id: str | None = None
    namespace: tuple[str, ...] = ()
    bus: EventBus | None = None
    context: Any = None
    store: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    recorder: StepRecorder | None = None
    inbox: Inbox | None = None
    resume: dict[str, Any] = field(default_factory=dict)
    pending_tools: dict[str, Any] = field(default_factory=dict)
    runtime: Any = None
    parent: RunContext | None = None
    deadline: float | None = None  # event-loop time by which the run must end (it then times out)
    max_iterations: int | None = None  # this run's limit of model calls, instead of the agent's
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


# Set while a tool runs: the run that called it and the tool call id, so a
# nested agent can report as that run's subagent.
current_tool_call: ContextVar[tuple[RunContext, str] | None] = ContextVar(
    "backchannel_current_tool_call", default=None
)
