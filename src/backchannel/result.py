"""How an agent run ended: what :meth:`Agent.run <backchannel.agent.Agent.run>` returns and ``on_end`` hooks see."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from backchannel.interrupts import Interrupt

__all__ = ["RunResult"]


@dataclass(slots=True)
class RunResult:
    """How a run ended, with its state: ``success``, ``interrupted`` (waiting for a human, ``stage``
    says where it resumes), or, as ``on_end`` hooks see it, ``error``, ``timeout`` or ``cancelled``."""

    status: Literal["success", "interrupted", "error", "timeout", "cancelled"]
    state: dict[str, Any]
    interrupts: list[Interrupt] = field(default_factory=list)
    stage: str = ""
    error: BaseException | None = None
