"""Events: what a run reports while it happens.

Every event carries its ``type``, the ``namespace`` path from the root agent
(``("researcher:call_abc",)`` for a subagent started by tool call
``call_abc``), the emitting ``agent``, the ``thread_id`` and ``run_id``, a
``seq`` that increases across the whole root run, and its ``data``.

An :class:`EventBus` belongs to one root run. Nested runs publish into their
root's bus, so one stream shows everything. When nobody listens, publishing
costs one attribute check.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

__all__ = ["Event", "EventBus", "EventType", "filter_metadata"]

EventType: TypeAlias = Literal[
    "lifecycle", "message", "tool", "values", "updates", "task", "interrupt", "custom"
]


@dataclass(slots=True)
class Event:
    """One thing that happened in a run."""

    type: str
    data: Any
    namespace: tuple[str, ...] = ()
    agent: str = ""
    thread_id: str | None = None
    run_id: str | None = None
    seq: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "namespace": list(self.namespace),
            "agent": self.agent,
            "thread_id": self.thread_id,
            "run_id": self.run_id,
            "seq": self.seq,
            "data": self.data,
        }


@dataclass(slots=True)
class EventBus:
    """Fans a root run's events out to its listeners, numbering them as they pass.

    ``wants_values`` tells the agent whether anybody needs full-state
    snapshots (they cost a copy of the state per step).
    """

    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    wants_values: bool = False
    wants_deltas: bool = True
    seq: int = 0

    @property
    def active(self) -> bool:
        return bool(self.listeners)

    def publish(self, event: Event) -> None:
        self.seq += 1
        event.seq = self.seq
        for listener in self.listeners:
            listener(event)

    def subscribe(self, listener: Callable[[Event], None]) -> Callable[[], None]:
        """Add a listener; returns the function that removes it."""
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener) if listener in self.listeners else None

    def queue(self) -> tuple[asyncio.Queue[Event], Callable[[], None]]:
        """A queue that receives every event from now on, and its unsubscribe function."""
        q: asyncio.Queue[Event] = asyncio.Queue()
        return q, self.subscribe(q.put_nowait)


# What the framework adds to run metadata for its own bookkeeping, never forwarded on events (as
# LangGraph drops its EXCLUDED_METADATA_KEYS and seq:step tags); lc_*/ls_* and user keys ride along.
_FRAMEWORK_PREFIXES = ("langgraph_", "checkpoint_", "__")
_FRAMEWORK_KEYS = frozenset({"thread_id", "run_id", "assistant_id", "graph_id", "checkpoint_id", "checkpoint_ns",
                             "checkpoint_map", "parent_thread_id_internal", "user_id_internal"})


def filter_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """Metadata fit to forward on events: framework keys and the internal ``seq:step`` tags dropped."""
    if not metadata:
        return {}
    out = {k: v for k, v in metadata.items()
           if k not in _FRAMEWORK_KEYS and not k.startswith(_FRAMEWORK_PREFIXES)}
    if "tags" in out:
        tags = [t for t in out["tags"] or () if not str(t).startswith("seq:step")]
        if tags:
            out["tags"] = tags
        else:
            del out["tags"]
    return out
