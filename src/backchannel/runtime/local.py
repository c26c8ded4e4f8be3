"""``LocalRuntime``: threads, runs, checkpoints and a store in this process.

Its public surface is the LangGraph SDK client's (``assistants``, ``crons``,
``threads``, ``runs``, ``store``), so code written against ``langgraph_sdk``
works with it. Underneath, runs are asyncio tasks started by a scheduler that
claims pending runs from storage: at most one run per thread, at most
``max_concurrency`` at once. A run records a checkpoint at every step; when a
runtime opens a database whose previous owner died mid-run, it picks those
runs up from their last checkpoint.

This module only puts the runtime together: each job is a part of its own
(:mod:`~backchannel.runtime.registry`, :mod:`~backchannel.runtime.scheduler`,
:mod:`~backchannel.runtime.queue`, :mod:`~backchannel.runtime.executor`,
:mod:`~backchannel.runtime.mail`, :mod:`~backchannel.runtime.recovery`,
:mod:`~backchannel.runtime.peers`, :mod:`~backchannel.runtime.streams`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from backchannel._clock import now_iso
from backchannel._ids import assistant_id_for, new_id
from backchannel.agent import Agent
from backchannel.errors import BackchannelError
from backchannel.events import EventBus
from backchannel.interrupts import Interrupt
from backchannel.messages import AnyMessage
from backchannel.protocols import HostRuntime
from backchannel.runtime.assistants import AssistantCatalog
from backchannel.runtime.backends import DEFAULT_STORE, open_storage
from backchannel.runtime.checkpoints import IDLE_STATES_KEPT, Checkpointer, ThreadState
from backchannel.runtime.clients import AssistantsClient, CronsClient, RunsClient, StoreClient, ThreadsClient
from backchannel.runtime.commands import ThreadCommands
from backchannel.runtime.crons import CronScheduler
from backchannel.runtime.executor import DEFAULT_MAX_ATTEMPTS, Executor
from backchannel.runtime.follow import Follower
from backchannel.runtime.mail import Mail
from backchannel.runtime.metrics import RunMetrics
from backchannel.runtime.outbox import Outbox
from backchannel.runtime.peers import Peers
from backchannel.runtime.queue import RunQueue
from backchannel.runtime.recovery import Recovery
from backchannel.runtime.registry import Registry
from backchannel.runtime.retention import Retention, StoreTTLConfig, ThreadTTLConfig
from backchannel.runtime.rows import CronRow, RunRow
from backchannel.runtime.scheduler import KnownStart, Scheduler
from backchannel.runtime.storage import Storage
from backchannel.runtime.streams import RunStream, Streams
from backchannel.runtime.threadlog import ThreadLogs
from backchannel.runtime.timeline import thread_timeline

__all__ = ["DEFAULT_STORE", "LocalRuntime", "assistant_id_for"]


class LocalRuntime:
    """The embedded runtime: ``LocalRuntime(store="sqlite:///path.db", agents={"name": agent})``.

    ``store`` is ``"memory"``, a ``sqlite:///`` URL or path (default
    ``~/.backchannel/state.db``), a ``postgresql://`` URL, or a
    :class:`~backchannel.runtime.storage.Storage`. Use it as ``async with
    LocalRuntime(...) as rt:`` or call ``await rt.close()``.

    Runtimes in several processes can share one Postgres database: each runs
    the runs it was asked for, any of them can follow, cancel or message any
    run, and when one dies (no heartbeat for ``lease`` seconds) the others take
    its runs over from their last checkpoints. A run whose execution keeps killing
    its process ends ``error`` once it was started ``max_attempts`` times.

    ``thread_ttl`` and ``store_ttl`` are the operator's retention defaults (LangGraph's
    ``checkpointer.ttl`` and ``store.ttl``: a default time to live, a sweep interval); the
    scheduler sweeps expired threads and store items, measuring time by ``clock``
    (:mod:`~backchannel.runtime.retention`).
    """

    def __init__(self, store: str | Storage = DEFAULT_STORE, agents: Mapping[str, Agent] | None = None, *,
                 max_concurrency: int = 256, heartbeat_interval: float = 5.0, lease: float = 30.0,
                 public_url: str | None = None, max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 thread_ttl: ThreadTTLConfig | None = None, store_ttl: StoreTTLConfig | None = None,
                 clock: Callable[[], str] = now_iso) -> None:
        self.storage = open_storage(store)
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self.worker_id = new_id()
        # Where other servers reach this runtime (set when it is served over HTTP): background
        # tasks on other servers report back to it there.
        self.public_url = public_url
        # Running runs hold their threads' states anyway: cache those and as many idle ones, so a
        # supervisor's state outlives a fan-out of max_concurrency tasks.
        self.checkpoints = Checkpointer(self.storage, cache_size=max_concurrency + IDLE_STATES_KEPT)
        self.registry = Registry(self)
        self.registry.register_all(agents or {})
        self.streams = Streams()
        self.peers = Peers(self.worker_id, self.storage, self.streams)
        self.retention = Retention(self.storage, self.checkpoints, self.registry, threads=thread_ttl, store=store_ttl,
                                   clock=clock)
        self.scheduler = Scheduler(self.storage, self.streams, self.peers, worker_id=self.worker_id,
                                   max_concurrency=max_concurrency, execute=self._execute,
                                   start=self._known_start, sweep=self.retention.sweep,
                                   sweep_interval=self.retention.sweep_interval)
        self.queue = RunQueue(self.storage, self.streams, self.scheduler, self.peers, self.checkpoints,
                              self.registry, worker_id=self.worker_id)
        self.metrics = RunMetrics()
        self.catalog = AssistantCatalog(self.storage, self.registry)
        self.mail = Mail(self.storage, self.checkpoints, self.registry, self.catalog, self.queue, self.scheduler,
                         self.peers, self.metrics)
        self.executor = Executor(self, self.storage, self.checkpoints, self.registry, self.streams, self.scheduler,
                                 self.queue, self.mail, self.peers, self.metrics, spawn=self.spawn,
                                 is_open=lambda: self._opened, max_attempts=max_attempts)
        self.recovery = Recovery(self.storage, self.scheduler, self.mail, worker_id=self.worker_id,
                                 heartbeat_interval=heartbeat_interval, lease=lease, served=self.registry.served)
        follower = Follower(self.storage, self.streams, remote=self._follow_remote, hear=self.peers.hear_thread)
        self.threads = ThreadsClient(self.open, self.storage, self.checkpoints, self.registry, self.queue, follower,
                                     self.retention)
        self.assistants = AssistantsClient(self.open, self.catalog, self.registry, self.storage, self.queue,
                                           self.threads)
        self.runs = RunsClient(self.open, self.storage, self.registry, self.catalog, self.streams, self.queue,
                               self.mail, self.threads, follower)
        self.store = StoreClient(self.open, self.storage, self.retention)
        self.cron_scheduler = CronScheduler(self.storage, start=self._start_cron_run, served=self.catalog.served_ids)
        self.crons = CronsClient(self.open, self.storage, self.registry, self.catalog, self.threads, self.runs,
                                 kick=self.cron_scheduler.kick)
        self.thread_logs = ThreadLogs(follower)
        self.commands = ThreadCommands(self.runs, self.threads, self.storage, self.queue, self.thread_logs)
        self.outbox = Outbox(self.store, self.spawn)
        self._background: list[asyncio.Task[None]] = []  # the scheduler, heartbeats, take-overs
        self._side_tasks: set[asyncio.Task[Any]] = set()  # webhooks and the outbox: not runs

    # -- agents --------------------------------------------------------------

    @property
    def graphs(self) -> dict[str, Agent]:
        """The registered agents, by graph id."""
        return self.registry.graphs

    def register(self, graph_id: str, agent: Agent, *, subagents: bool = True) -> None:
        """Make ``agent`` (and the background subagents it runs here) available as the assistant ``graph_id``."""
        self.registry.register(graph_id, agent, subagents=subagents)

    def graph_id_for_agent(self, agent: Agent) -> str:
        """The graph id ``agent`` is registered under (registering it if new)."""
        return self.registry.graph_id_for_agent(agent)

    # -- lifecycle -----------------------------------------------------------

    async def __aenter__(self) -> LocalRuntime:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Open storage, take over runs whose process died, and start scheduling."""
        if self._opened:
            return
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._opened:
                return
            await self.storage.open()
            await self.recovery.register()
            coordinator = self.storage.coordinator()
            if coordinator is not None:
                await self.peers.start(coordinator, kick=self.scheduler.kick, cancel=self.queue.cancel_here,
                                       mail=self.mail.announced, executing=self.scheduler.is_executing,
                                       missed_mail=self.mail.announced_anywhere)
            self._opened = True
            self._background = [asyncio.create_task(self.scheduler.run_forever()),
                                asyncio.create_task(self.recovery.heartbeat_forever()),
                                asyncio.create_task(self.recovery.wake_forever()),
                                asyncio.create_task(self.cron_scheduler.run_forever())]
            if self.peers.shared:
                self._background.append(asyncio.create_task(self.recovery.take_over_forever()))
            await self.recovery.recover()
            self.outbox.start()  # notifications for other servers left by the previous owner

    async def close(self, grace: float = 0.0) -> None:
        """Stop scheduling and running. Unfinished runs stay in storage and resume at the next open.

        With ``grace`` (seconds), no new run starts but the running ones get that long to finish.
        """
        if not self._opened:
            return
        scheduler = self._background[0]
        scheduler.cancel()  # first, so no new run starts during the grace period
        await asyncio.gather(scheduler, return_exceptions=True)
        if grace > 0:
            await self.scheduler.wait_executing(grace)
        self._opened = False
        sweeping = self.scheduler.stop_sweeping()
        tasks = [*self._background, *self.scheduler.stop_all(), *self._side_tasks, *([sweeping] if sweeping else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._background = []
        await self.thread_logs.close()
        await self.mail.close()
        await self.outbox.close()
        await self.peers.stop()
        await self.recovery.unregister()
        await self.storage.close()
        self.registry.release()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` beside the runs (webhooks, the outbox); cancelled when the runtime closes."""
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def _start_cron_run(self, cron: CronRow, tick: str) -> None:
        # The cron loop is made before the crons client (which kicks it): it starts runs through here.
        await self.crons.start_run(cron, tick)

    def _follow_remote(self, row: RunRow, values: bool) -> RunStream | None:
        """The stream of a run another process executes, fed by it (``None`` when no other process could)."""
        return self.peers.follow(row, values) if self.peers.shared else None

    def _execute(self, row: RunRow, stream: RunStream, known: ThreadState | None) -> Coroutine[Any, Any, None]:
        # The scheduler is made before the executor (which uses it): it starts runs through here (a plain
        # function: a coroutine here would stay suspended as long as the run).
        return self.executor.execute(row, stream, known=known)

    def _known_start(self, row: RunRow) -> KnownStart | None:
        return self.executor.start(row)

    # -- runs seen from inside this process ------------------------------------------

    def run_events(self, run_id: str) -> EventBus | None:
        """The event bus of a run queued or executing in this process, to follow it from inside another."""
        stream = self.streams.get(run_id)
        return stream.bus if stream is not None else None

    def is_running_here(self, run_id: str) -> bool:
        """Whether the run executes in this process now."""
        return self.scheduler.is_executing(run_id)

    # -- messages for threads ----------------------------------------------------

    async def deliver(self, thread_id: str, message: AnyMessage, *, key: str,
                      assistant_id: str | None = None) -> bool:
        """Give ``message`` to a thread exactly once per ``key``: into its active run, or by waking it.

        Returns ``False`` when a message with this key was delivered before.
        """
        await self.open()
        return await self.mail.deliver(thread_id, message, key=key, assistant_id=assistant_id)

    async def deliver_remote(self, url: str, thread_id: str, message: AnyMessage, *, key: str,
                             assistant_id: str | None = None) -> None:
        """Give ``message`` to a thread on the server at ``url`` once per ``key``, through this runtime's outbox
        (kept in its store until that server has taken it)."""
        await self.open()
        await self.outbox.put(key, url=url, thread_id=thread_id, assistant_id=assistant_id, message=message)

    async def timeline(self, thread_id: str, *, spans: bool = True) -> dict[str, Any]:
        """What the thread's runs and its background tasks' runs did: their spans and token usage
        (:mod:`backchannel.runtime.timeline`); ``spans=False`` for the usage alone."""
        await self.open()
        return await thread_timeline(self.storage, thread_id, spans=spans)

    # -- the agent's thread API --------------------------------------------------

    async def invoke(self, agent: Agent, thread_id: str, input: Any, *, context: Any = None,
                     metadata: Mapping[str, Any] | None = None, bus: EventBus | None = None) -> dict[str, Any]:
        """Run ``agent`` on a thread (created if new) and return the final state with message objects."""
        graph_id = self.graph_id_for_agent(agent)
        run = await self.runs.create(thread_id, graph_id, input=input, context=context, metadata=dict(metadata or {}),
                                     if_not_exists="create", multitask_strategy="enqueue")
        stream = self.streams.get(run["run_id"])
        assert stream is not None  # made as the run was queued, and kept until it ends
        if bus is not None:
            stream.bus.listeners.extend(bus.listeners)
            stream.bus.wants_values = stream.bus.wants_values or bus.wants_values
        row = await self.queue.wait_for(run["run_id"])
        if row.status == "error":
            raise stream.exception or BackchannelError(str((row.error or {}).get("message", "the run failed")))
        state = await self.checkpoints.latest(thread_id, agent.state_reducers())
        values = dict(state.values)
        thread = await self.storage.get_thread(thread_id)
        if thread is not None and thread.interrupts:
            values["__interrupt__"] = [Interrupt(i["value"], i["id"]) for i in thread.interrupts]
        return values


if TYPE_CHECKING:
    def _is_a_host_runtime(rt: LocalRuntime) -> HostRuntime:
        return rt  # mypy checks that LocalRuntime has the whole HostRuntime surface
