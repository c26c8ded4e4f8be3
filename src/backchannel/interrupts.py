"""Pausing a run for a human: ``interrupt(value)`` and resuming it.

Calling :func:`interrupt` inside a hook or a tool stops the run with an
:class:`Interrupt`. When the run is resumed with a value for that interrupt,
the same hook or tool runs again and this time ``interrupt`` returns the
value. Interrupt ids are derived from where the call happened (stage, hook or
tool call, position), so they are the same on every replay.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

__all__ = ["GraphInterrupt", "Interrupt", "interrupt"]


@dataclass(slots=True)
class Interrupt:
    """A pause waiting for a human: the ``value`` to show them and the ``id`` to resume it by."""

    value: Any
    id: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "id": self.id}


class GraphInterrupt(Exception):
    """Raised through the run when it pauses; carries the interrupts and the stage to resume at."""

    def __init__(self, interrupts: list[Interrupt], stage: str = "") -> None:
        super().__init__(f"run interrupted: {[i.value for i in interrupts]!r}")
        self.interrupts = interrupts
        self.stage = stage


@dataclass(slots=True)
class InterruptScope:
    """Where ``interrupt`` is being called from (``kind``, e.g. ``tool``, and ``where``, e.g. the call's id), and the
    resume values available there."""

    kind: str
    where: str
    resume: Mapping[str, Any] = field(default_factory=dict)
    count: int = 0
    # The scope this one was set inside, if any: a tool call's scope is also what a nested agent started under it
    # looks for (``backchannel.context.calling_tool``), one context variable set per call instead of two.
    enclosing: InterruptScope | None = None

    @property
    def key(self) -> str:
        """What names the place in its interrupts' ids: made only when one is raised (a scope is set around every
        model and tool call, and a thousand live subagents each hold one through theirs)."""
        return f"{self.kind}:{self.where}"


current_scope: ContextVar[InterruptScope | None] = ContextVar("backchannel_interrupt_scope", default=None)


def interrupt_id(key: str, index: int) -> str:
    """The stable id of the ``index``-th interrupt raised from the place named ``key``."""
    return hashlib.sha1(f"{key}#{index}".encode()).hexdigest()[:32]


def interrupt(value: Any) -> Any:
    """Pause the run with ``value`` for a human; returns their answer once the run is resumed."""
    scope = current_scope.get()
    if scope is None:
        raise RuntimeError("interrupt() can only be called while an agent runs (in a middleware hook or a tool)")
    iid = interrupt_id(scope.key, scope.count)
    scope.count += 1
    if iid in scope.resume:
        return scope.resume[iid]
    raise GraphInterrupt([Interrupt(value, iid)])
