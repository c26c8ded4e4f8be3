"""What the runtime keeps, and the interface every storage backend implements.

The runtime never speaks SQL: it calls these async methods with Python
objects (rows are small dataclasses; state updates and messages as they are),
and each backend stores them its own way.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from backchannel.messages import AnyMessage

if TYPE_CHECKING:
    from backchannel.runtime.coordination import Coordinator

__all__ = ["THREAD_SORT_SQL", "CheckpointRow", "ItemRow", "RunEnd", "RunRow", "Storage", "ThreadRow", "now_iso", "open_storage",
           "thread_order"]


_second: tuple[int, str] = (0, "")  # the last whole second asked for, formatted


def now_iso() -> str:
    """The current UTC time as ISO 8601 with microseconds, the format the LangGraph API uses.

    Every row written gets one, so the date part is formatted once a second.
    """
    global _second
    now = time.time()
    second, text = _second
    if int(now) != second:
        second = int(now)
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, text)
    return f"{text}.{int((now - second) * 1_000_000):06d}+00:00"


_THREAD_SORT = frozenset({"thread_id", "status", "created_at", "updated_at", "state_updated_at"})
# What SQL sorts threads by for each sortable name: a column, or when the state last changed (the
# newest checkpoint's time; the thread's own for a thread without one).
THREAD_SORT_SQL = {"state_updated_at": "coalesce((SELECT c.created_at FROM checkpoints c WHERE c.thread_id = "
                                       "threads.thread_id ORDER BY c.seq DESC LIMIT 1), threads.updated_at)"}


def thread_order(sort_by: str, sort_order: str) -> tuple[str, str]:
    """The column and direction to sort threads by; ``ValueError`` for a column that is not sortable."""
    if sort_by not in _THREAD_SORT:
        raise ValueError(f"cannot sort threads by {sort_by!r}; use one of {sorted(_THREAD_SORT)}")
    return sort_by, "ASC" if sort_order.lower() == "asc" else "DESC"



@dataclass(slots=True)
class ThreadRow:
    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    status: str = "idle"
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


@dataclass(slots=True)
class RunRow:
    run_id: str
    thread_id: str
    assistant_id: str
    created_at: str
    updated_at: str
    status: str = "pending"
    metadata: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    multitask_strategy: str = "reject"
    worker_id: str | None = None
    scheduled_at: str = ""
    error: dict[str, Any] | None = None
    concurrency_key: str | None = None  # runs sharing a key run at most concurrency_limit at a time
    concurrency_limit: int | None = None


@dataclass(slots=True)
class CheckpointRow:
    """One recorded step: the state change (``delta``) and the stage the run continues at."""

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    seq: int
    run_id: str | None
    delta: Mapping[str, Any]  # the state update; messages as objects or as their dicts
    next: str  # the stage to continue at; "" when the run ended there
    metadata: dict[str, Any]
    created_at: str


@dataclass(slots=True)
class RunEnd:
    """How a run ended: what :meth:`Storage.finish_run` records in one write."""

    run_id: str
    thread_id: str
    status: str  # the run's: success, error, timeout or interrupted
    thread_status: str  # idle, interrupted or error; busy instead while another run of the thread is active
    updated_at: str
    error: dict[str, Any] | None = None  # the run's error
    thread_error: dict[str, Any] | None = None  # the thread's error, in LangGraph's shape
    interrupts: list[dict[str, Any]] | None = None  # the thread's pending interrupts (None: unchanged)
    checkpoint_next: tuple[str, str] | None = None  # (checkpoint_id, stage): where the thread continues


@dataclass(slots=True)
class ItemRow:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: str
    updated_at: str


class Storage(abc.ABC):
    """A storage backend. Methods are async so networked backends fit; local ones return at once."""

    # -- lifecycle
    @abc.abstractmethod
    async def open(self) -> None:
        """Create tables if needed; called once before use."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections."""

    # -- threads
    @abc.abstractmethod
    async def create_thread(self, row: ThreadRow) -> bool:
        """Insert a thread; ``False`` if its id is taken."""

    @abc.abstractmethod
    async def get_thread(self, thread_id: str) -> ThreadRow | None: ...

    @abc.abstractmethod
    async def update_thread(self, thread_id: str, **fields: Any) -> None: ...

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> bool:
        """Delete a thread with its runs, checkpoints and messages waiting for it."""

    @abc.abstractmethod
    async def search_threads(self, *, metadata: dict[str, Any] | None = None, status: str | None = None,
                             ids: Sequence[str] | None = None, limit: int = 10, offset: int = 0,
                             sort_by: str = "created_at", sort_order: str = "desc") -> list[ThreadRow]: ...

    @abc.abstractmethod
    async def count_threads(self, *, metadata: dict[str, Any] | None = None,
                            status: str | None = None) -> int: ...

    # -- runs
    @abc.abstractmethod
    async def create_run(self, row: RunRow) -> None: ...

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunRow | None: ...

    @abc.abstractmethod
    async def update_run(self, run_id: str, **fields: Any) -> None: ...

    @abc.abstractmethod
    async def delete_run(self, run_id: str) -> bool: ...

    @abc.abstractmethod
    async def list_runs(self, thread_id: str, *, status: str | None = None, limit: int = 10,
                        offset: int = 0) -> list[RunRow]:
        """A thread's runs, newest first."""

    @abc.abstractmethod
    async def active_runs(self, thread_id: str) -> list[RunRow]:
        """A thread's pending and running runs, oldest first."""

    @abc.abstractmethod
    async def claim_runs(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        """Mark up to ``limit`` runs of this worker ``running`` and return them.

        A run is claimable when it is pending, its ``scheduled_at`` has passed,
        no other run of its thread is running and its concurrency key (if any)
        has fewer than its limit running; the oldest go first, one per thread.
        """

    @abc.abstractmethod
    async def finish_run(self, end: RunEnd) -> bool:
        """Record a run's end: its status and error; its thread's status (``busy`` while another run
        of the thread is pending or running), error and interrupts; and, if given, the ``next`` stage
        of the checkpoint the run stopped at. Returns whether the thread has undelivered inbox messages.
        """

    @abc.abstractmethod
    async def requeue_orphans(self, alive_workers: Sequence[str], new_worker_id: str) -> list[RunRow]:
        """Give the running and pending runs of workers that are neither in ``alive_workers`` nor
        registered (see :meth:`heartbeat`) to ``new_worker_id``, as pending.

        The caller forgets the workers it found dead first; a worker that registered since it
        looked keeps its runs.
        """

    async def drop_pending_run(self, run_id: str, action: str, now: str) -> bool:
        """Cancel a run that has not started: ``interrupt`` marks it interrupted, ``rollback`` deletes it.
        Its thread, busy on its account, turns idle (interrupted while a person's answer is still
        pending) unless another run is pending or running.

        ``False`` when it is no longer pending (a worker claimed it meanwhile). Backends shared by
        several processes do this in one conditional statement.
        """
        row = await self.get_run(run_id)
        if row is None or row.status != "pending":
            return False
        if action == "rollback":
            await self.delete_run(run_id)
        else:
            await self.update_run(run_id, status="interrupted", updated_at=now)
        if not await self.active_runs(row.thread_id):
            thread = await self.get_thread(row.thread_id)
            if thread is not None and thread.status == "busy":
                await self.update_thread(row.thread_id, status="interrupted" if thread.interrupts else "idle")
        return True

    def coordinator(self) -> Coordinator | None:
        """How runtimes in several processes on this storage reach each other; ``None`` for a
        storage one process uses at a time (memory; SQLite, whose runtimes each run their own runs)."""
        return None

    # -- workers (who is alive, for crash recovery)
    @abc.abstractmethod
    async def heartbeat(self, worker_id: str, info: dict[str, Any], now: str) -> bool:
        """Register the worker, or renew its registration; ``True`` if it was registered already.

        ``False`` after the first heartbeat means other workers took it for dead (and
        gave its runs to themselves).
        """

    @abc.abstractmethod
    async def workers(self) -> dict[str, tuple[dict[str, Any], str]]:
        """Every known worker: id -> (info, last heartbeat)."""

    @abc.abstractmethod
    async def forget_worker(self, worker_id: str) -> None: ...

    # -- checkpoints
    @abc.abstractmethod
    async def put_checkpoint(self, row: CheckpointRow) -> None:
        """Append a checkpoint."""

    @abc.abstractmethod
    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointRow | None: ...

    @abc.abstractmethod
    async def head_checkpoint(self, thread_id: str) -> CheckpointRow | None:
        """The thread's newest checkpoint."""

    @abc.abstractmethod
    async def list_checkpoints(self, thread_id: str, *, limit: int | None = None,
                               before_seq: int | None = None) -> list[CheckpointRow]:
        """A thread's checkpoints, newest first."""

    @abc.abstractmethod
    async def checkpoint_chain(self, thread_id: str, checkpoint_id: str) -> list[CheckpointRow]:
        """The checkpoints from the thread's first up to ``checkpoint_id``, following parents."""

    @abc.abstractmethod
    async def set_checkpoint_next(self, thread_id: str, checkpoint_id: str, next: str) -> None: ...

    @abc.abstractmethod
    async def delete_checkpoints_of_run(self, thread_id: str, run_id: str) -> None: ...

    @abc.abstractmethod
    async def copy_checkpoints(self, thread_id: str, new_thread_id: str) -> None: ...

    @abc.abstractmethod
    async def put_pending_write(self, thread_id: str, key: str, value: Mapping[str, Any]) -> None:
        """Keep one finished tool call of a parallel batch until the batch is checkpointed."""

    @abc.abstractmethod
    async def pending_writes(self, thread_id: str) -> dict[str, Mapping[str, Any]]: ...

    @abc.abstractmethod
    async def clear_pending_writes(self, thread_id: str) -> None:
        """Drop a thread's pending tool results once their batch is checkpointed."""

    # -- inbox: messages for a thread, delivered into its next model call or a new run
    @abc.abstractmethod
    async def put_inbox(self, thread_id: str, key: str, message: AnyMessage, now: str) -> bool:
        """Queue a message for a thread once per ``key``; ``False`` if that key was seen before."""

    @abc.abstractmethod
    async def inbox(self, thread_id: str) -> list[tuple[str, AnyMessage]]:
        """Undelivered ``(key, message)`` pairs, oldest first."""

    @abc.abstractmethod
    async def ack_inbox(self, thread_id: str, keys: Sequence[str]) -> None: ...

    @abc.abstractmethod
    async def threads_with_mail(self) -> list[str]:
        """Threads that have undelivered inbox messages."""

    # -- the key-value store
    @abc.abstractmethod
    async def put_item(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], now: str) -> None: ...

    @abc.abstractmethod
    async def get_item(self, namespace: tuple[str, ...], key: str) -> ItemRow | None: ...

    @abc.abstractmethod
    async def delete_item(self, namespace: tuple[str, ...], key: str) -> None: ...

    @abc.abstractmethod
    async def search_items(self, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None,
                           limit: int = 10, offset: int = 0) -> list[ItemRow]: ...

    @abc.abstractmethod
    async def list_namespaces(self, *, prefix: tuple[str, ...] = (), suffix: tuple[str, ...] = (),
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> list[tuple[str, ...]]: ...


def open_storage(url: str | Storage) -> Storage:
    """A backend from a URL: ``"memory"``, ``"sqlite:///path/to/file.db"`` (``~`` expands), a path, or
    ``"postgresql://user:password@host/database"`` (needs the ``postgres`` extra)."""
    if isinstance(url, Storage):
        return url
    if url in ("memory", ":memory:"):
        from backchannel.runtime.memory import MemoryStorage

        return MemoryStorage()
    if url.startswith(("postgresql://", "postgres://", "postgresql+psycopg://")):
        return _postgres(url)
    from backchannel.runtime.sqlite import SQLiteStorage

    if url in ("sqlite://:memory:", "sqlite:///:memory:"):
        return SQLiteStorage(":memory:")
    if url.startswith("sqlite:///"):
        return SQLiteStorage(url.removeprefix("sqlite:///"))
    if "://" in url:
        scheme = url.split("://", 1)[0]
        raise ValueError(f"unsupported store URL {url!r}: scheme {scheme!r}; use 'memory', 'sqlite:///path' "
                         "or 'postgresql://user:password@host/database'")
    return SQLiteStorage(url)


def _postgres(url: str) -> Storage:
    try:
        from backchannel.runtime.postgres import PostgresStorage
    except ImportError as exc:
        raise ImportError(f"a Postgres store needs psycopg 3 ({exc}): pip install 'backchannel[postgres]'") from exc
    return PostgresStorage(url)
