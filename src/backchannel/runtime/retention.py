"""Retention: pruning threads on request, and sweeping threads and store items whose time to live ran out.

As on LangGraph's server: a thread's ``ttl`` (``{"strategy": "delete" | "keep_latest",
"ttl": minutes}``) counts from its last update (created, changed, a run queued or ended);
once it has passed, ``delete`` removes the thread with its runs and checkpoints, and
``keep_latest`` keeps the thread with its newest checkpoint only, rewritten to hold the
whole state, so the thread reads and continues as before. A store item's ``ttl`` counts
from when it was written, started again by reads that refresh it. The runtime's scheduler
calls :meth:`Retention.sweep` every sweep interval; a thread with a pending or running
run is never pruned (storage checks it in the transaction that prunes), and the sweep passes
over a thread whose background tasks still run or whose mail is not yet taken: their reports
would be lost, and the wake-up run that takes them starts the thread's time again.

The operator's defaults are LangGraph's ``checkpointer.ttl`` and ``store.ttl`` settings:
:class:`ThreadTTLConfig` and :class:`StoreTTLConfig`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, get_args

from backchannel._clock import now_iso
from backchannel.errors import InvalidRequestError
from backchannel.runtime.checkpoints import Checkpointer
from backchannel.runtime.registry import Registry
from backchannel.runtime.rows import PruneStrategy, ThreadTTL
from backchannel.runtime.storage import Storage

__all__ = ["Retention", "StoreTTLConfig", "ThreadTTLConfig", "check_strategy", "thread_ttl"]

logger = logging.getLogger("backchannel")

_STRATEGIES: tuple[PruneStrategy, ...] = get_args(PruneStrategy)
DEFAULT_SWEEP_MINUTES = 5.0


@dataclass(frozen=True, slots=True)
class ThreadTTLConfig:
    """Threads' retention, as LangGraph's ``checkpointer.ttl``: a ``default_ttl`` (minutes) for threads
    that have none of their own, what happens when it passes, and how often to look."""

    strategy: PruneStrategy = "delete"
    default_ttl: float | None = None
    sweep_interval_minutes: float = DEFAULT_SWEEP_MINUTES
    sweep_limit: int = 10_000  # threads pruned per sweep at most

    def __post_init__(self) -> None:
        check_strategy(self.strategy)
        _check_minutes(self.default_ttl, "default_ttl")
        _check_minutes(self.sweep_interval_minutes, "sweep_interval_minutes")
        if not isinstance(self.sweep_limit, int) or self.sweep_limit < 1:
            raise InvalidRequestError(f"sweep_limit must be a positive integer, not {self.sweep_limit!r:.80}")

    @property
    def default(self) -> ThreadTTL | None:
        return ThreadTTL(self.strategy, self.default_ttl) if self.default_ttl is not None else None

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> ThreadTTLConfig:
        """From LangGraph's ``checkpointer.ttl`` settings (unknown keys refused)."""
        return cls(**_known(settings, cls, "checkpointer.ttl"))


@dataclass(frozen=True, slots=True)
class StoreTTLConfig:
    """Store items' retention, as LangGraph's ``store.ttl``: a ``default_ttl`` (minutes) for items put
    without one, whether reads start an item's time again by default, and how often to sweep."""

    refresh_on_read: bool = True
    default_ttl: float | None = None
    sweep_interval_minutes: float = DEFAULT_SWEEP_MINUTES

    def __post_init__(self) -> None:
        if not isinstance(self.refresh_on_read, bool):
            raise InvalidRequestError(f"refresh_on_read must be true or false, not {self.refresh_on_read!r:.80}")
        _check_minutes(self.default_ttl, "default_ttl")
        _check_minutes(self.sweep_interval_minutes, "sweep_interval_minutes")

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any]) -> StoreTTLConfig:
        """From LangGraph's ``store.ttl`` settings (unknown keys refused)."""
        return cls(**_known(settings, cls, "store.ttl"))


def _known(settings: Mapping[str, Any], cls: type, what: str) -> dict[str, Any]:
    if not isinstance(settings, Mapping):
        raise InvalidRequestError(f"{what} must be an object, not {settings!r:.80}")
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(settings) - set(names))
    if unknown:
        raise InvalidRequestError(f"{what} has no setting {unknown[0]!r}; use {names}")
    return {k: v for k, v in settings.items() if v is not None}


def _check_minutes(value: object, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or value == float("inf"):
        raise InvalidRequestError(f"{name} must be a positive number of minutes, not {value!r:.80}")


def check_strategy(strategy: object) -> PruneStrategy:
    """``strategy`` as a prune strategy; :class:`InvalidRequestError` naming the allowed ones otherwise."""
    for known in _STRATEGIES:
        if strategy == known:
            return known
    raise InvalidRequestError(f"Invalid strategy: {strategy!r:.80}. Expected 'delete' or 'keep_latest'.")


def thread_ttl(ttl: float | Mapping[str, Any]) -> ThreadTTL:
    """A thread's ``ttl`` as LangGraph's clients send it (minutes, or ``{"ttl": minutes, "strategy": ...}``)."""
    if isinstance(ttl, Mapping):
        unknown = sorted(set(ttl) - {"ttl", "strategy"})
        if unknown:
            raise InvalidRequestError(f"ttl has no field {unknown[0]!r:.80}; give ttl (minutes) and strategy")
        minutes, strategy = ttl.get("ttl"), check_strategy(ttl.get("strategy", "delete"))
    else:
        minutes, strategy = ttl, "delete"
    if minutes is None:
        raise InvalidRequestError("ttl needs its ttl: the thread's time to live in minutes")
    _check_minutes(minutes, "ttl")
    assert isinstance(minutes, int | float)
    return ThreadTTL(strategy, float(minutes))


class Retention:
    """Prunes threads and sweeps what has expired, measuring time by ``clock`` (ISO 8601, like rows)."""

    def __init__(self, storage: Storage, checkpoints: Checkpointer, registry: Registry, *,
                 threads: ThreadTTLConfig | None = None, store: StoreTTLConfig | None = None,
                 clock: Callable[[], str] = now_iso) -> None:
        self.storage = storage
        self.checkpoints = checkpoints
        self.registry = registry
        self.threads = threads or ThreadTTLConfig()
        self.store = store or StoreTTLConfig()
        self.clock = clock
        self.sweeps = 0  # sweeps done so far

    @property
    def sweep_interval(self) -> float:
        """Seconds between sweeps: the shorter of the two settings'."""
        return 60 * min(self.threads.sweep_interval_minutes, self.store.sweep_interval_minutes)

    async def prune(self, thread_ids: Sequence[str], strategy: PruneStrategy) -> int:
        """Prune each thread as ``strategy`` says; returns how many were (missing and busy ones are not)."""
        pruned = 0
        for thread_id in dict.fromkeys(thread_ids):
            pruned += await self.prune_thread(thread_id, strategy)
        return pruned

    async def prune_thread(self, thread_id: str, strategy: PruneStrategy) -> bool:
        """Delete an idle thread, or keep only its newest checkpoint (``keep_latest``); ``False`` if it is
        missing or a run of it is pending or running."""
        if strategy == "delete":
            deleted = await self.storage.delete_idle_thread(thread_id)
            if deleted:
                self.checkpoints.forget(thread_id)
            return deleted
        thread = await self.storage.get_thread(thread_id)
        if thread is None:
            return False
        if await self.checkpoints.keep_latest(thread_id, self.registry.reducers_for(thread)):
            return True
        # Nothing to keep but the thread itself: pruned already, unless a run of it is under way.
        return thread.status != "busy" and await self.storage.head_checkpoint(thread_id) is None

    async def sweep(self) -> tuple[int, int]:
        """Prune the threads whose time to live has passed and delete expired store items; returns how many
        of each."""
        now = self.clock()
        expired = await self.storage.expired_threads(now, self.threads.default, self.threads.sweep_limit)
        pruned = 0
        for thread_id, strategy in expired:
            pruned += await self.prune_thread(thread_id, strategy)
        items = await self.storage.delete_expired_items(now)
        self.sweeps += 1
        if pruned or items:
            logger.info("retention: %d expired threads pruned, %d expired store items deleted", pruned, items)
        return pruned, items
