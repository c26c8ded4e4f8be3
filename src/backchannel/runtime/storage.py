"""The contracts storage backends implement: narrow protocols, one per kind of row, and the coordinator.

The runtime never speaks SQL: it calls these async methods with the rows of
:mod:`backchannel.runtime.rows`, and each backend (memory, SQLite, Postgres)
stores them its own way. Each part of the runtime is typed against the
protocols it uses (the checkpointer against :class:`CheckpointStorage`, the
inbox against :class:`InboxStorage`, ...); :class:`Storage` is all of them,
what a backend provides. :func:`~backchannel.runtime.backends.open_storage`
picks a backend from a URL.

To add a storage method: declare it on the protocol of its rows, implement
it in the three backends, and add a case to ``tests/runtime/test_storage.py``
(which runs every case on every backend).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from backchannel.messages import AnyMessage
from backchannel.runtime.rows import (
    AssistantRow,
    CancelAction,
    CheckpointBase,
    CheckpointRow,
    CheckpointWrite,
    CronRow,
    ItemRow,
    PruneStrategy,
    RunClaim,
    RunEnd,
    RunRow,
    RunStatus,
    ThreadRow,
    ThreadStatus,
    ThreadTTL,
)

__all__ = ["MISSED", "AssistantStorage", "CheckpointStorage", "Coordinator", "CronStorage", "InboxStorage",
           "ItemStorage", "Notice", "ParentGoneError", "RunStart", "RunStorage", "Storage", "StoredRun",
           "ThreadStorage", "WorkerStorage", "pick_claims", "read_together"]

A = TypeVar("A")
B = TypeVar("B")


class ThreadStorage(Protocol):
    """Threads: conversations, with their status, metadata, pending interrupts and error."""

    @abc.abstractmethod
    async def create_thread(self, row: ThreadRow) -> bool:
        """Insert a thread; ``False`` if its id is taken."""

    @abc.abstractmethod
    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        """The thread, or ``None``."""

    @abc.abstractmethod
    async def update_thread(self, thread_id: str, *, status: ThreadStatus | None = None,
                            metadata: dict[str, Any] | None = None, interrupts: list[dict[str, Any]] | None = None,
                            updated_at: str | None = None) -> None:
        """Change the fields given (``None`` leaves a field as it is); a missing thread is ignored."""

    @abc.abstractmethod
    async def delete_thread(self, thread_id: str) -> bool:
        """Delete a thread with its runs, checkpoints and messages waiting for it."""

    @abc.abstractmethod
    async def delete_idle_thread(self, thread_id: str) -> bool:
        """Delete a thread as :meth:`delete_thread` does, unless a run of it is pending or running, a background
        task of it (a thread naming it ``parent_thread_id``) has a run pending or running, or mail for it is not yet
        taken (checked in the statement that deletes); ``False`` when it was busy or missing."""

    @abc.abstractmethod
    async def set_thread_ttl(self, thread_id: str, ttl: ThreadTTL) -> None:
        """Give the thread a time to live (replacing one it had)."""

    @abc.abstractmethod
    async def thread_ttl(self, thread_id: str) -> ThreadTTL | None:
        """The thread's own time to live, or ``None``."""

    @abc.abstractmethod
    async def expired_threads(self, now: str, default: ThreadTTL | None, limit: int) -> list[tuple[str, PruneStrategy]]:
        """Up to ``limit`` threads (with their strategy) whose time to live, their own or else ``default``, has
        passed at ``now`` since their last update; none with a pending or running run, and for ``keep_latest``
        only those with checkpoints other than their newest (the others have nothing left to prune)."""

    @abc.abstractmethod
    async def search_threads(self, *, metadata: dict[str, Any] | None = None, status: ThreadStatus | None = None,
                             ids: Sequence[str] | None = None, limit: int = 10, offset: int = 0,
                             sort_by: str = "created_at", sort_order: str = "desc") -> list[ThreadRow]:
        """Threads whose metadata contains ``metadata`` (and of that status, among ``ids``), sorted."""

    @abc.abstractmethod
    async def count_threads(self, *, metadata: dict[str, Any] | None = None,
                            status: ThreadStatus | None = None) -> int:
        """How many threads :meth:`search_threads` would find without a limit."""


class StoredRun(NamedTuple):
    """How :meth:`RunStorage.create_claimed_run` stored a run: its status, and whether it was claimed on a thread as
    its :class:`RunStart` expected it (nothing to read; the start's checkpoint, if any, written with it)."""

    status: RunStatus
    known: bool


class RunStart(Protocol):
    """How a run claimed as it is stored may start without reading its thread: from the state at ``parent``, the
    checkpoint its process holds as the thread's newest (``None``: a thread with none), with the checkpoint of its
    input after it. Made for :meth:`RunStorage.create_claimed_run`, which checks the thread against it."""

    parent: str | None

    def __call__(self) -> CheckpointWrite | None:
        """The checkpoint of the run's input after ``parent`` (``None``: the run has none to write), applied to the
        start's state: made only where the storage may write it with the run's claim."""
        ...


class ParentGoneError(Exception):
    """A run's end came with its last step's checkpoint, whose parent is gone (its run was deleted meanwhile):
    nothing was recorded."""


class RunStorage(Protocol):
    """Runs: queued, claimed by a worker, ended; and taken over when their worker dies.

    The claim rule: a run is claimable by its worker when it is pending, its
    ``scheduled_at`` has passed, no other run of its thread is running and its
    concurrency key (if any) has fewer than its limit running; the oldest go
    first, one per thread (:func:`pick_claims` applies it to rows already due).
    The finish rule: a run's end sets its thread's status, unless another run of
    the thread is still pending or running, which keeps the thread ``busy``.

    The fencing rule: each claim of a run gets a fresh token (:class:`RunClaim`); a write
    that carries one (a run's end, checkpoints, pending tool results, taking mail) changes
    nothing unless the run is ``running`` under that very claim, and raises
    :class:`~backchannel.errors.LostRunError` instead, checked in the statement that writes.
    A process that lost a run (taken over while it stalled) can change nothing about it.
    """

    claims_on_insert: bool = False  # whether create_claimed_run may claim (see there)

    @abc.abstractmethod
    async def create_run(self, row: RunRow, *, notice: Notice | None = None) -> bool:
        """Insert a run; ``False`` (nothing inserted) if its thread is gone, checked in the statement that inserts,
        so a run is never stored on a thread deleted meanwhile (and a thread deleted after it takes it along).
        A ``notice`` (from this storage's coordinator: backends without one get none) is sent in the transaction
        that stores the run, if it does."""

    async def create_claimed_run(self, row: RunRow, claim: str, *, thread: ThreadRow | None = None,
                                 start: RunStart | None = None, notice: Notice | None = None) -> StoredRun | None:
        """Insert a pending run of ``row.worker_id``'s, as :meth:`create_run` does (``None``: not inserted, its thread
        is gone), and if its thread is ``busy`` (the caller's writes made it so before) with no other run pending
        or running, claim it in the same write: stored running under the token ``claim``, its first attempt
        (status ``"running"``; else ``"pending"``). With ``thread`` (busy), the thread is made in the same write and
        the run claimed only if it was made there; a thread made meanwhile by another request is made busy instead,
        with ``thread``'s metadata, and the run goes pending. A run claimed on a thread as its ``start`` expects it
        (its newest checkpoint the start's parent, no mail waiting: a thread made here has none of either; a backend
        may also look at one that exists, in the same write) is ``known``: it may start from the start's state
        without reading it, and the checkpoint ``start()`` makes is written with it, both or neither. Backends whose
        claims cost little (``claims_on_insert`` false) leave it to :meth:`claim_runs`."""
        if thread is not None:  # the scheduler makes the thread apart where the storage does not claim on insert
            raise NotImplementedError("this storage does not make a thread in the write that stores a run")
        return StoredRun("pending", known=False) if await self.create_run(row, notice=notice) else None

    @abc.abstractmethod
    async def get_run(self, run_id: str) -> RunRow | None:
        """The run, or ``None``."""

    @abc.abstractmethod
    async def delete_run(self, run_id: str) -> bool:
        """Delete a run (not its checkpoints); ``False`` if there was none."""

    @abc.abstractmethod
    async def list_runs(self, thread_id: str, *, status: RunStatus | None = None, limit: int = 10,
                        offset: int = 0) -> list[RunRow]:
        """A thread's runs, newest first."""

    @abc.abstractmethod
    async def count_runs_by_status(self) -> dict[RunStatus, int]:
        """How many runs there are of each status (statuses without runs left out)."""

    @abc.abstractmethod
    async def active_runs(self, thread_id: str) -> list[RunRow]:
        """A thread's pending and running runs, oldest first."""

    async def run_position(self) -> str | None:
        """Where the runs made from now on begin, for :meth:`runs_since` (``None`` where no other process can make
        runs: this one's are seen as they are made)."""
        return None

    async def runs_since(self, thread_id: str, position: str | None) -> tuple[list[RunRow], str | None]:
        """A thread's pending and running runs, and those made after ``position`` (:meth:`run_position`) that
        ended, oldest first; with the position as of this read (a run made later is made after it)."""
        return await self.active_runs(thread_id), position

    @abc.abstractmethod
    async def runs_with_status(self, statuses: Sequence[RunStatus]) -> list[RunRow]:
        """Every thread's runs of these statuses, oldest first."""

    @abc.abstractmethod
    async def claim_runs(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        """Mark up to ``limit`` claimable runs of this worker ``running`` and return them (see the claim rule),
        each under a new claim (its ``claim`` token) and with its ``attempts`` counted up by one."""

    @abc.abstractmethod
    async def release_run(self, claim: RunClaim, now: str) -> bool:
        """Hand a running run back, unstarted (``pending``, for the same worker; its attempt not counted), as a
        runtime does that stops without ending it. ``False`` if the claim no longer holds."""

    @abc.abstractmethod
    async def finish_run(self, end: RunEnd) -> bool:
        """Record a run's end: its status, error and usage, and its spans if given; its thread's status (see
        the finish rule), error and interrupts; and, if given, the ``next`` stage of the checkpoint the run
        stopped at, and the checkpoint of its last step (``end.checkpoint``, as :meth:`~CheckpointStorage.
        put_checkpoint` writes it: with its base, only while its parent is there, else :class:`ParentGoneError`
        and nothing recorded). Returns whether the thread has undelivered inbox messages. With ``end.claim``,
        fenced (see the fencing rule): the checkpoint too.
        """

    @abc.abstractmethod
    async def run_spans(self, thread_id: str) -> dict[str, list[dict[str, Any]]]:
        """The spans each ended run of a thread recorded, by run id (runs that recorded none are left out)."""

    @abc.abstractmethod
    async def drop_pending_run(self, run_id: str, action: CancelAction, now: str) -> bool:
        """Cancel a run that has not started: ``interrupt`` marks it interrupted, ``rollback`` deletes it.
        Its thread, busy on its account, turns idle unless another run is pending or running.

        ``False`` when it is no longer pending (a worker claimed it meanwhile). One atomic change.
        """

    @abc.abstractmethod
    async def requeue_orphans(self, alive_workers: Sequence[str], new_worker_id: str,
                              agents: Mapping[str, str], *, limit: int | None = None) -> list[str]:
        """Give the running and pending runs of workers that are neither in ``alive_workers`` nor
        registered (see :meth:`WorkerStorage.heartbeat`) to ``new_worker_id``, as pending (their
        claims no longer hold), their threads ``busy``: those of the agents it serves, ``agents``
        (assistant id -> agent digest; a run stored without a digest goes by its assistant id); with
        ``limit``, the oldest ``limit`` of them only. Returns their run ids, oldest first. One statement
        or transaction whatever their number, and no row read back (a restart may find thousands queued).

        The caller forgets the workers it found dead first; a worker that registered since it
        looked keeps its runs.
        """


class WorkerStorage(Protocol):
    """The processes (workers) running runs, for crash recovery: who is alive, and how to reach them."""

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
    async def forget_worker(self, worker_id: str) -> None:
        """Remove a worker's registration."""

    def coordinator(self) -> Coordinator | None:
        """How runtimes in several processes on this storage reach each other; ``None`` for a
        storage one process uses at a time (memory; SQLite, whose runtimes each run their own runs)."""
        return None

    def serve_alone(self, url: str) -> None:
        """Take the storage for this process's server, listening at ``url``, where another server on it
        could not follow, cancel or take over this one's runs (SQLite): a second server is refused with a
        :class:`~backchannel.errors.ConflictError` naming the first. A no-op for storages servers share."""
        return None


class CheckpointStorage(Protocol):
    """Checkpoints (each step's state change) and the tool results of a parallel batch not yet checkpointed."""

    @abc.abstractmethod
    async def put_checkpoint(self, row: CheckpointRow, claim: RunClaim | None = None, *,
                             parent_seq: int | None = None, base: CheckpointBase | None = None) -> bool:
        """Append a checkpoint (written by a run: under its ``claim``, see the fencing rule). With ``parent_seq``
        (the seq of its parent as the writer read it), only while that parent is there: ``False``, and nothing
        written, when it is gone (its run was deleted meanwhile). ``base`` (the messages at it as text) is
        written with it, in the same transaction; a backend may keep none."""

    @abc.abstractmethod
    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointRow | None:
        """One checkpoint of the thread, or ``None``."""

    @abc.abstractmethod
    async def head_checkpoint(self, thread_id: str) -> CheckpointRow | None:
        """The thread's newest checkpoint."""

    @abc.abstractmethod
    async def list_checkpoints(self, thread_id: str, *, limit: int | None = None,
                               before_seq: int | None = None) -> list[CheckpointRow]:
        """A thread's checkpoints, newest first."""

    @abc.abstractmethod
    async def checkpoint_chain(self, thread_id: str, checkpoint_id: str, seq: int | None = None, *,
                               since: int | None = None) -> list[CheckpointRow]:
        """The checkpoints up to ``checkpoint_id`` (whose ``seq`` the caller may know), following parents back
        to the nearest whole checkpoint, or to the thread's first: what its state is folded from. With ``since``
        (a seq), none before it: the chain starts where the rows from there run out."""

    @abc.abstractmethod
    async def checkpoint_bases(self, thread_id: str, seq: int) -> list[CheckpointBase]:
        """The nearest base at or before ``seq`` and those it extends, oldest (a whole one) first, or joined into
        one whole base; empty when there is none, or when one it extends is gone."""

    async def based_chain(self, thread_id: str, checkpoint_id: str,
                          seq: int) -> tuple[list[CheckpointBase], list[CheckpointRow]]:
        """The :meth:`checkpoint_bases` at or before ``seq``, and the :meth:`checkpoint_chain` up to ``checkpoint_id``
        (at ``seq``) since the nearest one's seq: empty ones without a base. A backend may read both at once."""
        bases = await self.checkpoint_bases(thread_id, seq)
        return bases, (await self.checkpoint_chain(thread_id, checkpoint_id, seq, since=bases[-1].seq) if bases else [])

    @abc.abstractmethod
    async def set_checkpoint_next(self, thread_id: str, checkpoint_id: str, next: str) -> None:
        """Change the stage a checkpoint continues at."""

    @abc.abstractmethod
    async def children_of_run(self, thread_id: str, run_id: str) -> list[CheckpointRow]:
        """The checkpoints of other runs (or of none) whose parent the run wrote, and that are not whole:
        deleting the run's checkpoints would leave them without the state they change."""

    @abc.abstractmethod
    async def delete_checkpoints_of_run(self, thread_id: str, run_id: str,
                                        whole: Sequence[CheckpointRow] = ()) -> bool:
        """Delete the checkpoints one run wrote, and store ``whole`` (its :meth:`children_of_run`, each now
        with the whole state) in their children's place, in one transaction. ``False``, and nothing
        changed, when a child not in ``whole`` is there (written meanwhile): look for them again."""

    @abc.abstractmethod
    async def keep_only_checkpoint(self, row: CheckpointRow) -> bool:
        """Replace a thread's checkpoints by ``row`` alone: its newest, rewritten to hold the whole state and no
        parent. ``False``, and nothing changed, when a run of the thread is pending or running or its newest
        checkpoint is no longer ``row``'s (a step was written meanwhile). One transaction."""

    @abc.abstractmethod
    async def copy_checkpoints(self, thread_id: str, new_thread_id: str) -> None:
        """Copy a thread's checkpoints to another thread (a fork)."""

    @abc.abstractmethod
    async def put_pending_write(self, thread_id: str, key: str, value: Mapping[str, Any],
                                claim: RunClaim | None = None) -> None:
        """Keep one finished tool call of a parallel batch until the batch is checkpointed (fenced by ``claim``)."""

    @abc.abstractmethod
    async def pending_writes(self, thread_id: str) -> dict[str, Mapping[str, Any]]:
        """The thread's pending tool results, by tool call id."""

    @abc.abstractmethod
    async def clear_pending_writes(self, thread_id: str, claim: RunClaim | None = None) -> None:
        """Drop a thread's pending tool results once their batch is checkpointed (fenced by ``claim``)."""


class InboxStorage(Protocol):
    """Messages for a thread (task notifications), delivered into its next model call or a new run."""

    @abc.abstractmethod
    async def put_inbox(self, thread_id: str, key: str, message: AnyMessage, now: str) -> bool:
        """Queue a message for a thread once per ``key``; ``False`` if that key was seen before,
        :class:`NotFoundError` if the thread does not exist (or a deletion committed first)."""

    @abc.abstractmethod
    async def inbox(self, thread_id: str) -> list[tuple[str, AnyMessage]]:
        """Undelivered ``(key, message)`` pairs, oldest first."""

    @abc.abstractmethod
    async def ack_inbox(self, thread_id: str, keys: Sequence[str], claim: RunClaim | None = None) -> None:
        """Mark messages delivered (to the run holding ``claim``: fenced, see the fencing rule)."""

    @abc.abstractmethod
    async def threads_with_mail(self) -> list[str]:
        """Threads that have undelivered inbox messages."""


class ItemStorage(Protocol):
    """The key-value store shared by all threads, addressed by namespace tuples."""

    @abc.abstractmethod
    async def put_item(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], now: str,
                       ttl: float | None = None) -> None:
        """Insert or replace an item (its ``created_at`` stays); with ``ttl``, it expires that many minutes
        after ``now`` or after its last read that refreshed it."""

    @abc.abstractmethod
    async def get_item(self, namespace: tuple[str, ...], key: str, *, now: str | None = None,
                       refresh: bool = False) -> ItemRow | None:
        """The item, or ``None``; with ``now``, ``None`` for an item expired by then too, and with ``refresh``
        its time to live starts again at ``now``."""

    @abc.abstractmethod
    async def delete_item(self, namespace: tuple[str, ...], key: str) -> None:
        """Delete an item, if it exists."""

    @abc.abstractmethod
    async def search_items(self, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, now: str | None = None,
                           refresh: bool = False) -> list[ItemRow]:
        """Items under a namespace prefix whose values contain ``filter``, most recently updated first (with
        ``now`` and ``refresh``, as :meth:`get_item`: unexpired ones, their time to live started again)."""

    @abc.abstractmethod
    async def delete_expired_items(self, now: str) -> int:
        """Delete the items expired at ``now``; returns how many."""

    @abc.abstractmethod
    async def list_namespaces(self, *, prefix: tuple[str, ...] = (), suffix: tuple[str, ...] = (),
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> list[tuple[str, ...]]:
        """The distinct namespaces with this prefix and suffix, cut at ``max_depth``, sorted."""


class CronStorage(Protocol):
    """Crons: schedules that start runs. A cron's ``next_run_date`` is its next tick; a process fires a tick
    only once it has moved ``next_run_date`` past it (:meth:`claim_cron_tick`), so each tick fires at most once
    however many processes share the storage. A thread's crons are deleted with it."""

    @abc.abstractmethod
    async def create_cron(self, row: CronRow) -> None:
        """Insert a cron."""

    @abc.abstractmethod
    async def get_cron(self, cron_id: str) -> CronRow | None:
        """The cron, or ``None``."""

    @abc.abstractmethod
    async def update_cron(self, row: CronRow, *, reschedule: bool) -> bool:
        """Store a cron's changed fields (all but ``created_at``; ``next_run_date`` only with ``reschedule``, so a
        change never brings back a tick fired meanwhile). ``False`` if there is no such cron."""

    @abc.abstractmethod
    async def delete_cron(self, cron_id: str) -> bool:
        """Delete a cron; ``False`` if there was none."""

    @abc.abstractmethod
    async def search_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                           enabled: bool | None = None, metadata: dict[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, sort_by: str = "created_at", sort_order: str = "desc") -> list[CronRow]:
        """Crons of that assistant, thread and state whose metadata contains ``metadata``, sorted (see
        :func:`~backchannel.runtime.rows.cron_order`)."""

    @abc.abstractmethod
    async def count_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                          metadata: dict[str, Any] | None = None) -> int:
        """How many crons :meth:`search_crons` would find without a limit."""

    @abc.abstractmethod
    async def due_crons(self, before: str, limit: int, assistant_ids: Sequence[str]) -> list[CronRow]:
        """Enabled crons of these assistants whose next tick is at or before ``before`` and not after their
        ``end_time``, soonest first."""

    @abc.abstractmethod
    async def claim_cron_tick(self, cron_id: str, tick: str, next_tick: str) -> bool:
        """Move the cron's ``next_run_date`` from ``tick`` to ``next_tick`` in one atomic change: ``True`` for the
        one caller that did (it fires the tick), ``False`` if the cron is elsewhere now (fired, changed, gone)."""


class AssistantStorage(Protocol):
    """Assistants made or changed through the API, each with every version it had (a graph's own assistant is
    stored once it is changed)."""

    @abc.abstractmethod
    async def create_assistant(self, row: AssistantRow) -> bool:
        """Insert an assistant and its first version (``row.version``); ``False`` if its id is taken."""

    @abc.abstractmethod
    async def get_assistant(self, assistant_id: str) -> AssistantRow | None:
        """The assistant at its current version, or ``None``."""

    @abc.abstractmethod
    async def update_assistant(self, row: AssistantRow, seen: AssistantRow) -> AssistantRow | None:
        """Add ``row`` as the assistant's newest version (numbered after every version it had) and make it the
        current one, if the assistant is still as ``seen``; returns it with its number, or ``None`` if the
        assistant changed meanwhile or is gone. One atomic change."""

    @abc.abstractmethod
    async def set_assistant_version(self, assistant_id: str, version: int, now: str) -> AssistantRow | None:
        """Make one of the assistant's versions its current one again; ``None`` if it has no such version."""

    @abc.abstractmethod
    async def delete_assistant(self, assistant_id: str) -> bool:
        """Delete an assistant with its versions; ``False`` if there was none."""

    @abc.abstractmethod
    async def search_assistants(self, *, graph_ids: Sequence[str], ids: Sequence[str] | None = None,
                                graph_id: str | None = None, name: str | None = None,
                                metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                                sort_by: str = "created_at", sort_order: str = "desc") -> list[AssistantRow]:
        """Assistants of the graphs ``graph_ids`` (among ``ids``, of ``graph_id``, whose name contains ``name``
        in any case, whose metadata contains ``metadata``), sorted (see :func:`~backchannel.runtime.rows.
        assistant_sort_key`; ``ValueError`` for another field)."""

    @abc.abstractmethod
    async def count_assistants(self, *, graph_ids: Sequence[str], graph_id: str | None = None,
                               name: str | None = None, metadata: dict[str, Any] | None = None) -> int:
        """How many assistants :meth:`search_assistants` would find without a limit."""

    @abc.abstractmethod
    async def assistant_versions(self, assistant_id: str, *, metadata: dict[str, Any] | None = None,
                                 limit: int = 10, offset: int = 0) -> list[AssistantRow]:
        """The assistant's versions whose metadata contains ``metadata``, newest first."""


class Storage(ThreadStorage, RunStorage, WorkerStorage, CheckpointStorage, InboxStorage, ItemStorage, CronStorage,
              AssistantStorage, Protocol):
    """A storage backend: every kind of row. Methods are async so networked backends fit."""

    # Whether reads made in one tick of the event loop go to the database together (one round trip): then reads
    # that belong together are made at once (see read_together); else one after the other.
    batches_reads: bool = False

    @abc.abstractmethod
    async def open(self) -> None:
        """Create or migrate the tables; called once before use."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections (writes made before stay)."""


# What a coordinator delivers when messages may have been missed (its connection was lost meanwhile).
MISSED: dict[str, Any] = {"k": "missed", "w": ""}


class Notice(NamedTuple):
    """A message on a topic, made by a coordinator (:meth:`Coordinator.notice`) to go with one of its storage's
    writes: sent in that write's transaction, as it commits (no statement of its own), if the write happens."""

    channel: str
    payload: str


class Coordinator(abc.ABC):
    """Messages between the processes on one database, this one included, in the order they were sent: to all of
    them, or on a topic, to those that subscribed to it."""

    @abc.abstractmethod
    async def start(self, receive: Callable[[dict[str, Any]], None]) -> None:
        """Begin delivering the messages (from any process) sent to all and on the topics subscribed to, to
        ``receive``; after a gap in which messages may have been lost, :data:`MISSED` first."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Send what is queued, then stop."""

    @abc.abstractmethod
    def publish(self, message: dict[str, Any], topic: str | None = None) -> None:
        """Queue ``message`` (JSON-able) for every process, or with a ``topic`` for those subscribed to it;
        sent soon, in order."""

    def notice(self, message: dict[str, Any], topic: str) -> Notice | None:
        """``message`` on ``topic`` made to go with a write of the storage's (see :class:`Notice`); ``None`` if it
        cannot go so (then :meth:`publish` it once the write is done)."""
        return None

    @abc.abstractmethod
    async def subscribe(self, topic: str) -> None:
        """Receive the messages published on ``topic`` from now on: once this returns, whatever any process
        publishes there reaches this one. Each call is undone by one :meth:`unsubscribe`."""

    @abc.abstractmethod
    def unsubscribe(self, topic: str) -> None:
        """Undo one :meth:`subscribe` (an unsubscribed topic's messages cost this process nothing)."""


async def read_together(storage: Storage, first: Coroutine[Any, Any, A], second: Coroutine[Any, Any, B]) -> tuple[A, B]:
    """Two reads: at once where the storage batches a tick's reads (one round trip for both), else one after the
    other: a backend that reads in process answers each without waiting, and a task for each would cost more
    than the reads (and suspend the caller once more)."""
    if storage.batches_reads:
        one, other = await asyncio.gather(first, second)
        return one, other
    try:
        one = await first
    except BaseException:
        second.close()  # never started
        raise
    return one, await second


def pick_claims(candidates: Iterable[RunRow], running_by_key: Mapping[str, int], limit: int) -> list[RunRow]:
    """The claim rule for backends that apply it in Python: from ``candidates`` (due, of the claiming
    worker, on threads with no running run, oldest first), up to ``limit`` runs, one per thread, each
    concurrency key below its limit counting the ``running_by_key`` already."""
    claimed: list[RunRow] = []
    threads: set[str] = set()
    claimed_by_key: dict[str, int] = {}
    for row in candidates:
        if len(claimed) == limit:
            break
        key = row.concurrency_key
        if row.thread_id in threads or (key and running_by_key.get(key, 0) + claimed_by_key.get(key, 0)
                                         >= (row.concurrency_limit or 1)):
            continue
        threads.add(row.thread_id)
        if key:
            claimed_by_key[key] = claimed_by_key.get(key, 0) + 1
        claimed.append(row)
    return claimed
