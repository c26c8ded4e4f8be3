"""Mail for threads (task notifications): delivered once per key, into the thread's active run or by waking it.

A message is stored before anything else happens, so a crash neither loses
nor duplicates it. The run executing on the thread here takes it from its
inbox before its next model call; a run executing in another process is told
there is mail; an idle thread gets a wake-up run that takes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from backchannel._clock import now_iso
from backchannel.errors import InvalidRequestError, NotFoundError, StorageUnavailableError
from backchannel.messages import AnyMessage
from backchannel.runtime.assistants import AssistantCatalog
from backchannel.runtime.checkpoints import Checkpointer
from backchannel.runtime.inbox import ThreadInbox
from backchannel.runtime.metrics import RunMetrics
from backchannel.runtime.peers import Peers
from backchannel.runtime.queue import NewRun, RunQueue
from backchannel.runtime.registry import Registry
from backchannel.runtime.rows import RunClaim, RunRow
from backchannel.runtime.scheduler import Scheduler
from backchannel.runtime.storage import Storage

__all__ = ["Mail"]

logger = logging.getLogger("backchannel")


class Mail:
    """The inboxes of the runs executing here, and the wake-ups of idle threads that have mail."""

    def __init__(self, storage: Storage, checkpoints: Checkpointer, registry: Registry, assistants: AssistantCatalog,
                 queue: RunQueue, scheduler: Scheduler, peers: Peers, metrics: RunMetrics) -> None:
        self.storage = storage
        self.assistants = assistants
        self.metrics = metrics
        self.checkpoints = checkpoints
        self.registry = registry
        self.queue = queue
        self.scheduler = scheduler
        self.peers = peers
        self._inboxes: dict[str, ThreadInbox] = {}
        self._wakes: dict[str, _Wake] = {}  # thread id -> how waking it stands here (while anything is under way)
        self._refills: set[asyncio.Task[Any]] = set()

    async def deliver(self, thread_id: str, message: AnyMessage, *, key: str,
                      assistant_id: str | None = None) -> bool:
        """Give ``message`` to a thread exactly once per ``key``: into its active run, or by waking it.

        Returns ``False`` when a message with this key was delivered before.
        """
        if not await self.storage.put_inbox(thread_id, key, message, now_iso()):
            # Given before. If it is still waiting, this may be a retry after a failed wake-up: make sure of it.
            if thread_id not in self._inboxes and key in {k for k, _ in await self.storage.inbox(thread_id)}:
                await self.wake(thread_id, assistant_id)
            return False
        self.metrics.notification_delivered()
        # The run that takes it will load the thread's state: keep it cached through a busy fan-out
        # (rebuilding a supervisor's long state from its checkpoints costs far more).
        self.checkpoints.keep(thread_id)
        inbox = self._inboxes.get(thread_id)
        if inbox is not None:
            inbox.push(key, message)
            return True
        await self.wake(thread_id, assistant_id)
        return True

    # -- the inboxes of runs executing here

    async def open_inbox(self, thread_id: str, claim: RunClaim | None = None, *, empty: bool = False) -> ThreadInbox:
        """The inbox of the thread's run starting here (under ``claim``), with the mail stored for it (none is
        read if the thread is known to have ``empty`` inbox: made with the run)."""
        inbox = self._inboxes[thread_id] = ThreadInbox(self.storage, thread_id, claim=claim)
        if not empty:
            await self.refill(thread_id)  # registered first: mail announced meanwhile is not missed
        return inbox

    def close_inbox(self, thread_id: str, run_id: str) -> bool:
        """The thread's run here has ended; returns whether mail came for it too late (a new run takes it)."""
        wake = self._wakes.get(thread_id)
        if wake is not None and wake.run_id == run_id:
            wake.run_id = None
            self._forget_if_done(thread_id, wake)
        inbox = self._inboxes.pop(thread_id, None)
        return inbox is not None and bool(inbox.drain())

    async def refill(self, thread_id: str) -> None:
        """Give the thread's run executing here the mail stored for it (by any process)."""
        inbox = self._inboxes.get(thread_id)
        if inbox is not None:
            for key, message in await self.storage.inbox(thread_id):
                inbox.push(key, message)

    def announced(self, thread_id: str) -> None:
        """Another process stored mail for the thread: its run here (if any) takes it."""
        if thread_id in self._inboxes:
            task = asyncio.create_task(self._refill_quietly(thread_id))
            self._refills.add(task)
            task.add_done_callback(self._refills.discard)

    def announced_anywhere(self) -> None:
        """Mail may have been stored for any thread (announcements were lost): every run here looks."""
        for thread_id in list(self._inboxes):
            self.announced(thread_id)

    async def _refill_quietly(self, thread_id: str) -> None:
        try:
            await self.refill(thread_id)
        except StorageUnavailableError as exc:  # the run takes its mail before its next model call anyway
            logger.debug("could not look for mail for thread %s: %s", thread_id, exc)

    # -- waking idle threads

    async def wake(self, thread_id: str, assistant_id: str | None = None) -> None:
        """Make sure a run will take the thread's mail: an active one, or a new wake-up run.

        If the database cannot be reached, the wake-up is tried again by :meth:`retry_wakes`.
        """
        wake = self._wakes.setdefault(thread_id, _Wake())
        if wake.looking:
            # Another call is looking at the thread or queuing its wake-up run (which reads the stored mail as
            # it starts): it looks once more when done, since its look may predate this mail (a run it saw
            # active may have ended before this mail came). A fan-out's results coming together wake it once.
            wake.again = True
            return
        wake.looking = True
        try:
            while True:
                wake.again = False
                await self._wake(thread_id, wake, assistant_id)
                if not wake.again:
                    break
            wake.failed = False
        except StorageUnavailableError:
            wake.failed, wake.assistant_id = True, assistant_id
            raise
        except (NotFoundError, InvalidRequestError):
            wake.failed = False  # the thread is gone, or never ran an assistant: nothing to try again
            raise
        finally:
            wake.looking = False
            self._forget_if_done(thread_id, wake)

    async def retry_wakes(self) -> None:
        """Wake the threads whose wake-up failed because the database could not be reached."""
        for thread_id, assistant_id in [(t, w.assistant_id) for t, w in self._wakes.items() if w.failed]:
            try:
                await self.wake(thread_id, assistant_id)
            except (NotFoundError, InvalidRequestError) as exc:
                logger.warning("cannot deliver mail waiting for thread %s: %s", thread_id, exc)

    def _forget_if_done(self, thread_id: str, wake: _Wake) -> None:
        if wake.run_id is None and not wake.looking and not wake.failed:
            del self._wakes[thread_id]

    async def _wake(self, thread_id: str, wake: _Wake, assistant_id: str | None) -> None:
        waking = wake.run_id
        if not self.peers.shared and waking is not None and (
                self.scheduler.is_unstarted(waking) or self.scheduler.is_executing(waking)):
            # A wake-up run queued or executing here reads the stored mail as it starts (or has
            # its inbox, and then deliver() gave the message to it).
            return
        if await self.storage.active_runs(thread_id):
            self.peers.mail(thread_id)  # its run may be executing in another process
            return  # a queued run will take the message
        if assistant_id is None:
            thread = await self.storage.get_thread(thread_id)
            if thread is None:
                raise NotFoundError(f"thread {thread_id!r} not found")
            assistant_id = thread.metadata.get("assistant_id") or thread.metadata.get("graph_id")
            if assistant_id is None:
                raise InvalidRequestError(f"thread {thread_id!r} has never run an assistant; cannot wake it")
        # (the queue reads the thread anyway, and says NotFoundError if it is gone)
        assistant = await self.assistants.resolve(assistant_id)
        # Resumable: no one created it to watch it, so a UI that learns of it late can still replay it.
        wake_up = NewRun(multitask_strategy="enqueue", wake=True, stream_resumable=True)
        row = await self.queue.create(thread_id, assistant, wake_up)
        wake.run_id = row.run_id

    async def wake_all(self) -> None:
        """Wake the threads with mail stored just before a crash, with no run left to take it (those of
        the agents this runtime serves: another program's threads are left to it)."""
        served = self.registry.served()
        for thread_id in await self.storage.threads_with_mail():
            newest = await self.storage.list_runs(thread_id, limit=1)
            if newest and not _serves(served, newest[0]):
                continue
            try:
                await self.wake(thread_id)
            except (NotFoundError, InvalidRequestError) as exc:
                logger.warning("cannot deliver mail waiting for thread %s: %s", thread_id, exc)

    async def close(self) -> None:
        for task in list(self._refills):
            task.cancel()
        await asyncio.gather(*self._refills, return_exceptions=True)


@dataclass(slots=True)
class _Wake:
    """How waking one thread stands in this process; forgotten once nothing of it is under way."""

    run_id: str | None = None  # the wake-up run queued or executing here
    looking: bool = False  # a wake call is looking at the thread or queuing its wake-up run
    again: bool = False  # mail came while it looked: it looks again when done
    failed: bool = False  # the database could not be reached: retry_wakes tries again, for assistant_id
    assistant_id: str | None = None


def _serves(served: Mapping[str, str], row: RunRow) -> bool:
    """Whether the run's agent is one of ``served`` (assistant id -> digest); by its assistant id if stored
    without a digest."""
    return row.agent_digest in served.values() if row.agent_digest else row.assistant_id in served
