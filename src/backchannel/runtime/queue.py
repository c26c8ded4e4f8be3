"""The run queue: runs created on threads (with their multitask strategies), cancelled, and waited for.

A new run is stored ``pending`` with its thread marked ``busy``, in one tick,
and the scheduler starts it when its thread is free. A run is cancelled where it
is: its task stopped if it executes here, a message to its executor if it
executes in another process, or its row dropped if it has not started.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from backchannel._clock import now_iso
from backchannel.errors import ConflictError, InvalidRequestError, NotFoundError, StorageUnavailableError
from backchannel.runtime.assistants import run_config, run_context
from backchannel.runtime.checkpoints import Checkpointer, ThreadState
from backchannel.runtime.modes import interrupt_part
from backchannel.runtime.peers import Peers
from backchannel.runtime.registry import Registry
from backchannel.runtime.rows import TERMINAL, AssistantRow, CancelAction, RunRow, ThreadRow
from backchannel.runtime.scheduler import Scheduler
from backchannel.runtime.storage import Notice, Storage
from backchannel.runtime.streams import Streams
from backchannel.runtime.wire import BUSY, render_error, resume_map, run_kwargs
from backchannel.serde import to_jsonable
from backchannel.tracing import with_trace_context

__all__ = ["NewRun", "RunQueue"]

_POLL = 0.05  # seconds between looks at the row of a run that ends elsewhere


@dataclass(slots=True)
class NewRun:
    """A run to queue, with its options as the runs client checked them."""

    input: Any = None
    command: Mapping[str, Any] | None = None
    stream_mode: list[str] = field(default_factory=lambda: ["values"])
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    metadata: Mapping[str, Any] | None = None
    config: Mapping[str, Any] | None = None
    context: Any = None
    checkpoint_id: str | None = None
    multitask_strategy: str | None = None
    if_not_exists: str | None = None
    on_completion: str | None = None
    after_seconds: float | None = None
    timeout: float | None = None
    webhook: str | None = None
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    interrupt_before: list[str] | None = None  # steps and tools the run pauses before, for a person to look
    interrupt_after: list[str] | None = None
    wake: bool = False  # a run that wakes an idle thread to take the mail waiting for it
    watched: bool = False  # its creator follows its stream from the start
    once: bool = False  # on a thread that exists, the thread's first run instead (the same call made again)


class RunQueue:
    """Creates, cancels and waits for runs, wherever they execute."""

    def __init__(self, storage: Storage, streams: Streams, scheduler: Scheduler, peers: Peers,
                 checkpoints: Checkpointer, registry: Registry, *, worker_id: str) -> None:
        self.storage = storage
        self.streams = streams
        self.scheduler = scheduler
        self.peers = peers
        self.checkpoints = checkpoints
        self.registry = registry
        self.worker_id = worker_id

    # -- creating

    async def thread(self, thread_id: str | None) -> ThreadRow | None:
        """The thread's row as :meth:`create` needs it (``None``: no such thread, or none named)."""
        return None if thread_id is None else await self.storage.get_thread(thread_id)

    async def create(self, thread_id: str | None, assistant: AssistantRow, run: NewRun, *,
                     stored: ThreadRow | None | Literal["unread"] = "unread") -> RunRow:
        """Queue a run of ``assistant`` (status ``pending``); it starts as soon as its thread is free.

        Without ``thread_id`` the run is stateless: it gets a thread of its own, deleted when it ends
        (unless ``on_completion="keep"``). With ``run.once``, a thread that exists gives its first run.
        ``stored`` is the thread's row if the caller read it already (with :meth:`thread`).
        """
        if_not_exists = run.if_not_exists
        temporary = thread_id is None
        if thread_id is None:
            if run.command and "resume" in run.command:
                raise InvalidRequestError("You must provide a thread_id when resuming.")
            thread_id = str(uuid.uuid4())
            if_not_exists = "create"
        thread = await self.storage.get_thread(thread_id) if stored == "unread" else stored
        if thread is not None and run.once:  # the same call made again (a tool call resumed after a crash)
            first = (await self.storage.list_runs(thread_id, limit=1_000_000))[-1:]
            if first:
                return first[0]
        new_thread = thread is None
        if thread is None:
            if (if_not_exists or "reject") != "create":
                raise NotFoundError(f"Thread with ID {thread_id} not found")
            created = now_iso()  # stored below, with the run, already busy
            thread = ThreadRow(thread_id, created, created, dict(run.metadata or {}) if not temporary else {})
        if run.checkpoint_id and await self.storage.get_checkpoint(thread_id, run.checkpoint_id) is None:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {run.checkpoint_id!r}")
        strategy = run.multitask_strategy or "enqueue"
        active = [] if new_thread else await self.storage.active_runs(thread_id)
        if active and strategy == "reject":
            raise ConflictError(BUSY)
        # A thread made with its run is made when the run is: one string for both (a live run keeps them).
        stamp = thread.created_at if new_thread else now_iso()
        row = self._row(thread, assistant, run, strategy, stamp, temporary=temporary)
        if run.command and "resume" in run.command and not active:
            row.kwargs["resume_map"] = resume_map(thread, run.command["resume"])
        # The stream and context exist before the run is stored: the scheduler may start it at
        # the first await (e.g. while the runs it supersedes are being cancelled).
        self.streams.new(row, watched=run.watched)
        self.scheduler.queued(row.run_id, context=contextvars.copy_context())
        metadata = {**thread.metadata, "graph_id": assistant.graph_id, "assistant_id": row.assistant_id}
        # A thread made with a run that says the same of it keeps the run's dict: one a live run (stores replace a
        # row's metadata, never change it in place).
        thread.metadata = row.metadata if new_thread and metadata == row.metadata else metadata
        thread.status = "busy"
        notice = self.peers.created_notice(row)  # the thread's followers elsewhere follow it too: told as it is stored
        try:
            started = await self._store(thread, row, new_thread=new_thread, free=not active, notice=notice)
        except (StorageUnavailableError, NotFoundError):
            self.scheduler.dropped(row.run_id)
            self.cancel_here(row.run_id, "interrupt")  # its stream ends: the run was never stored
            raise
        if self.peers.shared:
            if notice is None:
                self.peers.created(row)
            if any(r.worker_id != self.worker_id for r in active):
                self.peers.queued(thread_id)  # behind another process's run: it says when that one ends
        if active and strategy in ("interrupt", "rollback"):
            # Newest first, so a queued run cannot start in the gap left by the running one.
            for other in reversed(active):
                await self.cancel(other, "interrupt" if strategy == "interrupt" else "rollback", wait=True)
        if not started:
            self.scheduler.kick()
        return row

    async def _store(self, thread: ThreadRow, row: RunRow, *, new_thread: bool, free: bool,
                     notice: Notice | None) -> bool:
        """Store the run and its thread, busy: in one transaction where the backend groups a tick's writes.
        On a ``free`` thread the run may be claimed in it, and started: returns whether it was. The ``notice``
        goes with the run's insert."""
        if new_thread and self.scheduler.claims_on_insert(row, free_thread=free):  # the thread made in that write
            stored = await self.scheduler.store(row, free_thread=free, new_thread=thread, notice=notice)
            if stored is None:
                raise NotFoundError(f"Thread with ID {thread.thread_id} not found")
            return stored == "running"
        created = False
        store = self.scheduler.store(row, free_thread=free, notice=notice)
        if new_thread:
            created, stored = await asyncio.gather(self.storage.create_thread(thread), store)
        else:
            _, stored = await asyncio.gather(self._mark_busy(thread, row), store)
        if stored is None:  # the thread was deleted since it was read
            raise NotFoundError(f"Thread with ID {thread.thread_id} not found")
        if new_thread and not created and stored == "pending":  # made meanwhile by another request (running: busy)
            await self._mark_busy(thread, row)
        return stored == "running"

    async def _mark_busy(self, thread: ThreadRow, row: RunRow) -> None:
        await self.storage.update_thread(thread.thread_id, status="busy", metadata=thread.metadata,
                                         updated_at=row.created_at)

    def _row(self, thread: ThreadRow, assistant: AssistantRow, run: NewRun, strategy: str, stamp: str, *,
             temporary: bool) -> RunRow:
        # Over the assistant's; a wake-up starts a trace of its own (its notifications link back to their tasks).
        config = run_config(assistant, run.config if run.wake else with_trace_context(run.config))
        kwargs = run_kwargs({
            "input": to_jsonable(run.input), "command": to_jsonable(run.command) if run.command else None,
            "config": dict(config or {}), "context": run_context(assistant, run.context),
            "stream_mode": run.stream_mode,
            "stream_subgraphs": run.stream_subgraphs, "stream_resumable": run.stream_resumable,
            "checkpoint_id": run.checkpoint_id, "temporary": temporary and (run.on_completion or "delete") == "delete",
            "timeout": run.timeout, "wake": run.wake, "webhook": run.webhook,
            "interrupt_before": run.interrupt_before, "interrupt_after": run.interrupt_after})
        graph_id = assistant.graph_id
        metadata = {**thread.metadata, **(config or {}).get("metadata", {}), **dict(run.metadata or {}),
                    "graph_id": graph_id, "assistant_id": assistant.assistant_id}
        return RunRow(str(uuid.uuid4()), thread.thread_id, assistant.assistant_id, stamp, stamp,
                      "pending", metadata, kwargs, strategy, self.worker_id,
                      (datetime.fromisoformat(stamp) + timedelta(seconds=run.after_seconds)).isoformat()
                      if run.after_seconds else stamp,
                      concurrency_key=run.concurrency_key, concurrency_limit=run.concurrency_limit,
                      agent_digest=self.registry.digest_of(graph_id))

    # -- cancelling

    async def cancel(self, row: RunRow, action: CancelAction = "interrupt", wait: bool = False) -> None:
        """Stop a run: ``interrupt`` keeps its finished steps, ``rollback`` deletes the run and its steps."""
        task = self.cancel_here(row.run_id, action)
        if task is None and row.status == "running" and row.worker_id == self.worker_id:
            await self.scheduler.started_claims()  # claimed here a moment ago: it is about to start
            task = self.cancel_here(row.run_id, action)
        if task is not None:
            if wait:
                await asyncio.gather(task, return_exceptions=True)
            return
        if row.status == "running" and self.peers.shared:  # another process runs it
            self.peers.cancel(row.run_id, action)
            if wait:
                with contextlib.suppress(NotFoundError):
                    await self.wait_for(row.run_id)
            return
        if row.status == "pending":
            self.scheduler.dropped(row.run_id)
            if not await self.storage.drop_pending_run(row.run_id, action, now_iso()):
                fresh = await self.storage.get_run(row.run_id)  # it started meanwhile
                if fresh is not None and fresh.status in ("pending", "running"):
                    await self.cancel(fresh, action, wait)
                return
            if self.peers.shared:  # its creator may be following it
                self.peers.cancel(row.run_id, action)

    def cancel_here(self, run_id: str, action: CancelAction) -> asyncio.Task[None] | None:
        """Cancel the run if this process executes it (returns its task); else end its stream here, if any."""
        task = self.scheduler.cancel_here(run_id, action)
        if task is not None:
            return task
        stream = self.streams.get(run_id)
        if stream is not None and not stream.finished and not self.peers.follows(run_id):
            stream.finish("interrupted")  # it was queued here and never started
            self.streams.retire(stream)
        return None

    # -- waiting

    async def wait_for(self, run_id: str) -> RunRow:
        """Wait until a run has ended; returns its final row."""
        stream = self.streams.get(run_id)
        if stream is not None:
            await stream.wait()
            if stream.final_row is not None:  # ended here: no need to read it back
                return stream.final_row
        while True:
            row = await self.storage.get_run(run_id)
            if row is None:
                raise NotFoundError(f"run {run_id!r} not found (it may have been rolled back)")
            if row.status in TERMINAL:
                return row
            await asyncio.sleep(_POLL)

    async def output(self, row: RunRow) -> dict[str, Any]:
        """What ``runs.join`` returns for an ended run: the thread's final values, with ``__error__`` or
        ``__interrupt__`` when it failed or paused."""
        stream = self.streams.get(row.run_id)
        if stream is not None and stream.result is not None:
            return stream.result  # a stateless run whose thread is gone
        result: dict[str, Any]
        if row.status in ("error", "timeout"):
            result = {"__error__": render_error(row.error or {})}
        elif stream is not None and stream.final_values is not None:
            # this run's own end state, whatever queued run came next
            result = self.checkpoints.jsonable(row.thread_id, stream.final_values)
            if stream.interrupts:
                result["__interrupt__"] = [interrupt_part(i) for i in stream.interrupts]
        else:  # a run that ended in another process, or before a restart
            thread = await self.storage.get_thread(row.thread_id)
            if thread is None:
                return {}
            result, _ = await self.checkpoints.current(thread.thread_id, self.registry.reducers_for(thread))
            if thread.status == "interrupted" and thread.interrupts:
                result["__interrupt__"] = [interrupt_part(i) for i in thread.interrupts]
        if row.kwargs.get("temporary"):
            await self.drop_thread(row.thread_id)
        return result

    async def state_of(self, thread: ThreadRow, checkpoint_id: str | None = None) -> ThreadState:
        """The thread's state: its newest, or at ``checkpoint_id``."""
        reducers = self.registry.reducers_for(thread)
        if checkpoint_id:
            return await self.checkpoints.at(thread.thread_id, checkpoint_id, reducers)
        return await self.checkpoints.latest(thread.thread_id, reducers)

    async def drop_thread(self, thread_id: str) -> None:
        """Delete a thread and forget its cached state."""
        await self.storage.delete_thread(thread_id)
        self.checkpoints.forget(thread_id)
