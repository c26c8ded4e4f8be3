"""The scheduler: claims this process's pending runs from storage and starts them, each in its own task.

At most ``max_concurrency`` runs execute at once, at most one per thread (storage's
claim rule). The scheduler wakes when kicked (a run was queued here, or one
ended, or another process freed a thread) and every quarter second (for runs whose
``after_seconds`` passed). It owns the tasks of the runs executing here; what a
run does is the executor's (:mod:`backchannel.runtime.executor`), handed in as
``execute``. Every ``sweep_interval`` seconds it also starts ``sweep`` (retention's:
expired threads and store items), beside the runs, never delaying them.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from backchannel._clock import now_iso
from backchannel._ids import new_id
from backchannel.errors import StorageUnavailableError
from backchannel.runtime.peers import Peers
from backchannel.runtime.rows import TERMINAL, CancelAction, CheckpointWrite, RunRow, RunStatus, ThreadRow, replaced
from backchannel.runtime.storage import Notice, RunStorage
from backchannel.runtime.streams import RunStream, Streams

if TYPE_CHECKING:
    from backchannel.runtime.checkpoints import ThreadState

__all__ = ["KnownStart", "Scheduler"]

logger = logging.getLogger("backchannel")

_TICK = 0.25  # seconds between looks for runs whose time has come
_UNAVAILABLE_PAUSE = 0.1  # seconds between looks while the database cannot be reached
# Seconds between looks when no run is known to wait here: runs queued here, taken over or freed by another
# process kick the scheduler, so this look is a safety net only, and an idle runtime (one of many sharing a
# database) costs its database a claim now and then instead of four a second.
_IDLE_LOOK = 5.0


class Scheduler:
    """Starts the runs this process claims, and keeps their tasks."""

    def __init__(self, storage: RunStorage, streams: Streams, peers: Peers, *, worker_id: str,
                 max_concurrency: int,
                 execute: Callable[[RunRow, RunStream, ThreadState | None], Coroutine[Any, Any, None]],
                 start: Callable[[RunRow], KnownStart | None] | None = None,
                 sweep: Callable[[], Coroutine[Any, Any, object]] | None = None, sweep_interval: float = 300.0) -> None:
        self.storage = storage
        self.streams = streams
        self.peers = peers
        self.worker_id = worker_id
        self.max_concurrency = max_concurrency
        self._execute = execute
        self._known_start = start  # how a run claimed as it is stored may start without a read (see store)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._contexts: dict[str, contextvars.Context] = {}
        self._cancel_actions: dict[str, CancelAction] = {}
        # Runs created (or taken over) here that have not started: a run that ends makes the
        # scheduler look for more only while some wait (others' runs are theirs to start).
        self._unstarted: set[str] = set()
        # Runs queued here being stored and claimed in the same write (each holds one of the free slots).
        self._inserting: set[str] = set()
        # Runs whose database went away as they executed here: they start again once it answers.
        self._stranded: dict[str, RunRow] = {}
        self._wake = asyncio.Event()
        self._kicked = True  # since the last claim: the next one is due whatever the time
        self._sweep = sweep
        self.sweep_interval = sweep_interval
        self._swept_at = time.monotonic()
        self._sweeping: asyncio.Task[None] | None = None
        self._claims: set[asyncio.Event] = set()  # claims under way, each set once its runs have started

    # -- what the other parts tell it

    def kick(self) -> None:
        """There may be runs to start."""
        self._kicked = True
        self._wake.set()

    def queued(self, run_id: str, *, context: contextvars.Context | None = None) -> None:
        """A run was queued (or taken over) here; it runs in ``context`` (the caller's contextvars, so
        values set by hooks reach background runs)."""
        self._unstarted.add(run_id)
        if context is not None:
            self._contexts[run_id] = context

    def ended(self, run_id: str) -> None:
        """A run executing here has ended (its end is recorded): its slot is free."""
        self._tasks.pop(run_id, None)
        if self._unstarted:
            self.kick()

    def stranded(self, row: RunRow) -> None:
        """A run executing here lost its database, or a write of it was refused: start it again (from its
        last checkpoint) once the database answers if it is still this process's; else end its stream."""
        self._stranded[row.run_id] = row

    def dropped(self, run_id: str) -> None:
        """A run queued here was cancelled before it started."""
        self._unstarted.discard(run_id)
        self._inserting.discard(run_id)
        self._contexts.pop(run_id, None)
        self._cancel_actions.pop(run_id, None)

    # -- what they ask it

    def is_unstarted(self, run_id: str) -> bool:
        return run_id in self._unstarted or run_id in self._inserting

    def is_executing(self, run_id: str) -> bool:
        """Whether the run executes in this process now."""
        return run_id in self._tasks

    @property
    def executing(self) -> int:
        """How many runs execute here now."""
        return len(self._tasks)

    def cancel_here(self, run_id: str, action: CancelAction) -> asyncio.Task[None] | None:
        """Cancel the run if it executes here (returns its task, which ends as ``action`` says)."""
        task = self._tasks.get(run_id)
        if task is not None:
            self._cancel_actions[run_id] = action
            _cancel(task)
        elif self.is_unstarted(run_id):  # its claim may be under way: it is cancelled as it starts
            self._cancel_actions[run_id] = action
        return task

    def cancel_action(self, run_id: str) -> CancelAction | None:
        """How a run cancelled here is to end (``None``: it was stopped because the runtime closes)."""
        return self._cancel_actions.pop(run_id, None)

    def stop_all(self) -> list[asyncio.Task[None]]:
        """Stop every run executing here without an end (their rows are left to be resumed); returns their tasks."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for row in self._stranded.values():
            self._let_go(row, None)
        self._stranded.clear()
        return tasks

    async def wait_executing(self, timeout: float) -> None:
        """Give the runs executing here up to ``timeout`` seconds to end."""
        if self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=timeout)

    # -- the loop

    async def run_forever(self) -> None:
        pause = _TICK
        looked = -_IDLE_LOOK
        while True:
            self._wake.clear()
            self._sweep_if_due()
            try:
                await self._restart_stranded()
                free = self._free()
                now = asyncio.get_running_loop().time()
                if free > 0 and (self._kicked or self._unstarted or now - looked >= _IDLE_LOOK):
                    self._kicked, looked = False, now
                    await self._claim(free)
                pause = _TICK
            except StorageUnavailableError as exc:  # try again soon: runs wait for the database
                logger.debug("cannot claim runs: %s", exc)
                self._kicked = True
                pause = _UNAVAILABLE_PAUSE
            # A timer rather than asyncio.wait_for, which on 3.11 can swallow a cancellation that
            # arrives as the event is set; the timer also starts runs whose after_seconds passed.
            timer = asyncio.get_running_loop().call_later(pause, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _sweep_if_due(self) -> None:
        if self._sweep is None or (self._sweeping is not None and not self._sweeping.done()):
            return
        if time.monotonic() - self._swept_at >= self.sweep_interval:
            self._swept_at = time.monotonic()
            self._sweeping = asyncio.create_task(self._run_sweep(self._sweep))

    async def _run_sweep(self, sweep: Callable[[], Coroutine[Any, Any, object]]) -> None:
        try:
            await sweep()
        except StorageUnavailableError as exc:  # the next sweep will do
            logger.debug("cannot sweep: %s", exc)
        except Exception:
            logger.exception("the retention sweep failed")

    def stop_sweeping(self) -> asyncio.Task[None] | None:
        """Cancel a sweep under way (the runtime closes); returns its task."""
        task, self._sweeping = self._sweeping, None
        if task is not None:
            task.cancel()
        return task

    def _free(self) -> int:
        return self.max_concurrency - len(self._tasks) - len(self._inserting)

    def claims_on_insert(self, row: RunRow, *, free_thread: bool) -> bool:
        """Whether :meth:`store` claims the run in the write that stores it (see there)."""
        return (self.storage.claims_on_insert and free_thread and row.concurrency_key is None
                and row.scheduled_at <= row.created_at and self._free() > 0 and row.run_id in self._unstarted)

    async def store(self, row: RunRow, *, free_thread: bool, new_thread: ThreadRow | None = None,
                    notice: Notice | None = None) -> RunStatus | None:
        """Store a run queued here (see :meth:`queued`). On a ``free_thread`` (no other run of it is known), due
        now, with a slot free, it is claimed in the same write where the storage can, and started: ``"running"``.
        Else it waits for a claim (the caller kicks the scheduler once it may start): ``"pending"``. ``None``:
        not stored, its thread is gone. Where it is claimed so (:meth:`claims_on_insert`), ``new_thread`` is made
        in the same write; on a thread found there as this process holds it (its newest checkpoint the one of the
        state held, or none on a blank thread, and no mail) the run starts from that state without reading the
        thread, and the checkpoint of its input is written with it. A ``notice`` is sent with the run's insert
        (see :class:`Notice`)."""
        if not self.claims_on_insert(row, free_thread=free_thread):
            return "pending" if await self.storage.create_run(row, notice=notice) else None
        token = new_id()
        running = replaced(row, status="running", attempts=1, claim=token)
        start = self._known_start(running) if self._known_start else None
        self._unstarted.discard(row.run_id)
        self._inserting.add(row.run_id)
        claiming = asyncio.Event()
        self._claims.add(claiming)
        try:
            stored = await self.storage.create_claimed_run(row, token, thread=new_thread,
                                                           start=start, notice=notice)
        except StorageUnavailableError:
            # Its commit may have happened all the same: the run then starts once the database answers.
            self._inserting.discard(row.run_id)
            self.stranded(running)
            raise
        finally:
            self._claims.discard(claiming)
            claiming.set()
        if stored is not None and stored.status == "running":
            self._inserting.discard(row.run_id)
            self._start(running, known=start.state if stored.known and start is not None else None)
        elif row.run_id in self._inserting:  # not cancelled meanwhile
            self._inserting.discard(row.run_id)
            if stored is not None:  # it waits for a claim
                self._unstarted.add(row.run_id)
        return None if stored is None else stored.status

    async def _claim(self, limit: int) -> None:
        # Claimed runs show as running before they start here (the claim is read before its commit is
        # answered): whoever would cancel one then waits for them to start (see started_claims).
        claiming = asyncio.Event()
        self._claims.add(claiming)
        try:
            for row in await self.storage.claim_runs(self.worker_id, limit, now_iso()):
                self._start(row)
        finally:
            self._claims.discard(claiming)
            claiming.set()

    async def started_claims(self) -> None:
        """Wait until the runs being claimed now, if any, have started here (their tasks exist)."""
        for claiming in list(self._claims):
            await claiming.wait()

    async def _restart_stranded(self) -> None:
        for run_id, row in list(self._stranded.items()):
            fresh = await self.storage.get_run(run_id)
            del self._stranded[run_id]
            if fresh is not None and fresh.status == "running" and fresh.claim == row.claim \
                    and fresh.worker_id == self.worker_id:  # still under the claim it ran under here
                self._start(fresh)
            else:  # it ended (its end was committed after all) or another process took it over
                self._let_go(row, fresh)

    def _let_go(self, row: RunRow, fresh: RunRow | None) -> None:
        """End this process's stream of a run it no longer executes; its joiners read how it ends from storage."""
        stream = self.streams.get(row.run_id)
        if stream is None:
            return
        if fresh is not None and fresh.status in TERMINAL:
            stream.final_row = fresh
            stream.finish(fresh.status, error=fresh.error)
            self.peers.run_ended(row, fresh.status, fresh.error)
        else:  # as when a run is stopped here to continue elsewhere
            stream.finish("interrupted")
        self.streams.retire(stream)

    def _start(self, row: RunRow, *, known: ThreadState | None = None) -> None:
        """Start executing a run claimed here (``known``: from this state, its thread's as its claim found it)."""
        stream = self.streams.get(row.run_id) or self.streams.new(row)
        self._unstarted.discard(row.run_id)
        context = self._contexts.pop(row.run_id, None) or contextvars.copy_context()
        task = asyncio.create_task(self._execute(row, stream, known), context=context)
        self._tasks[row.run_id] = task
        self.peers.run_started(row, stream)
        if row.run_id in self._cancel_actions:  # cancelled while it was being claimed
            _cancel(task)


class KnownStart:
    """How a run claimed as it is stored may start without reading its thread (a :class:`RunStart`): from
    ``state``, the thread's newest as this process holds it (a blank one where it holds none), with its input
    applied when the storage, inside the run's insert, finds the thread at that state (it calls this); kept for
    the run only if the storage says it did (``StoredRun.known``). An input that fails to apply leaves no state: the
    run reads its thread, and fails on its input as any run would."""

    __slots__ = ("_input", "_row", "parent", "state")

    def __init__(self, state: ThreadState, write_input: Callable[[RunRow, ThreadState], CheckpointWrite | None],
                 row: RunRow) -> None:
        self.state: ThreadState | None = state
        self.parent = state.head.checkpoint_id if state.head is not None else None
        self._input = write_input
        self._row = row

    def __call__(self) -> CheckpointWrite | None:
        if self.state is None:
            return None
        try:
            return self._input(self._row, self.state)
        except Exception:  # (not to fail the write that stores the run)
            self.state = None
            return None


def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel a run's task so that its executor records how it ends."""
    if inspect.getcoroutinestate(task.get_coro()) == inspect.CORO_CREATED:  # type: ignore[arg-type]
        # Not started: cancelled now, it would never enter the executor and the run would stay 'running'.
        # Its first step is scheduled already, so it runs before this.
        asyncio.get_running_loop().call_soon(task.cancel)
    else:
        task.cancel()
