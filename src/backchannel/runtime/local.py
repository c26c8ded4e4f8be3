"""``LocalRuntime``: threads, runs, checkpoints and a store in this process.

Its public surface is the LangGraph SDK client's (``assistants``,
``threads``, ``runs``, ``store``), so code written against ``langgraph_sdk``
works with it. Underneath, runs are asyncio tasks started by a scheduler that
claims pending runs from storage: at most one run per thread, at most
``max_concurrency`` at once. A run records a checkpoint at every step; when a
runtime opens a database whose previous owner died mid-run, it picks those
runs up from their last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import socket
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from backchannel.agent import Agent, RunResult, describe_error
from backchannel.context import RunContext
from backchannel.errors import BackchannelError, InvalidRequestError, NotFoundError
from backchannel.events import EventBus
from backchannel.messages import (
    AnyMessage,
    ToolMessage,
    messages_from_input,
    new_id,
    pending_tool_calls,
)
from backchannel.runtime.checkpoints import IDLE_STATES_KEPT, Checkpointer, Recorder, ThreadState
from backchannel.runtime.clients import render_error, render_run, resume_map
from backchannel.runtime.coordination import Peers
from backchannel.runtime.inbox import ThreadInbox
from backchannel.runtime.modes import wants_values
from backchannel.runtime.run_options import iteration_limit
from backchannel.runtime.storage import RunEnd, RunRow, Storage, now_iso, open_storage
from backchannel.runtime.streams import RunStream
from backchannel.runtime.webhooks import post_webhook
from backchannel.serde import to_jsonable
from backchannel.state import Reducer, snapshot
from backchannel.tracing import continued_from

__all__ = ["DEFAULT_STORE", "LocalRuntime", "assistant_id_for"]

DEFAULT_STORE = "sqlite:///~/.backchannel/state.db"

# LangGraph derives a registered graph's assistant id as uuid5(this namespace, graph_id).
_ASSISTANT_NAMESPACE = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
_TERMINAL = frozenset({"success", "error", "timeout", "interrupted"})
_STREAMS_KEPT = 1000

logger = logging.getLogger("backchannel")


@functools.lru_cache(maxsize=1024)
def assistant_id_for(graph_id: str) -> str:
    """The assistant id of a registered graph, as LangGraph computes it."""
    return str(uuid.uuid5(_ASSISTANT_NAMESPACE, graph_id))


class LocalRuntime:
    """The embedded runtime: ``LocalRuntime(store="sqlite:///path.db", agents={"name": agent})``.

    ``store`` is ``"memory"``, a ``sqlite:///`` URL or path (default
    ``~/.backchannel/state.db``), a ``postgresql://`` URL, or a
    :class:`~backchannel.runtime.storage.Storage`. Use it as ``async with
    LocalRuntime(...) as rt:`` or call ``await rt.close()``.

    Runtimes in several processes can share one Postgres database: each runs
    the runs it was asked for, any of them can follow, cancel or message any
    run, and when one dies (no heartbeat for ``lease`` seconds) the others take
    its runs over from their last checkpoints.
    """

    def __init__(self, store: str | Storage = DEFAULT_STORE, agents: Mapping[str, Agent] | None = None, *,
                 max_concurrency: int = 256, heartbeat_interval: float = 5.0, lease: float = 30.0,
                 public_url: str | None = None) -> None:
        from backchannel.runtime.clients import AssistantsClient, RunsClient, StoreClient, ThreadsClient
        from backchannel.runtime.outbox import Outbox

        self.storage = open_storage(store)
        # Running runs hold their threads' states anyway: cache those and as many idle ones, so a
        # supervisor's state outlives a fan-out of max_concurrency tasks.
        self.checkpoints = Checkpointer(self.storage, cache_size=max_concurrency + IDLE_STATES_KEPT)
        self.max_concurrency = max_concurrency
        self.heartbeat_interval = heartbeat_interval
        self.lease = lease
        self.peers: Peers | None = None  # the other processes on a shared database
        self.worker_id = new_id()
        # Where other servers reach this runtime (set when it is served over HTTP): background
        # tasks on other servers report back to it there.
        self.public_url = public_url
        self.graphs: dict[str, Agent] = {}
        self._assistant_ids: dict[str, str] = {}
        for graph_id, agent in (agents or {}).items():
            self.register(graph_id, agent, subagents=False)
        for agent in list(self.graphs.values()):  # after the given names, so none is taken by a subagent
            self._register_subagents(agent)
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[str, RunStream] = {}
        self._finished: deque[str] = deque()  # ids of finished runs whose streams are kept, oldest first
        self._inboxes: dict[str, ThreadInbox] = {}
        self._contexts: dict[str, contextvars.Context] = {}
        self._cancel_actions: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._background: list[asyncio.Task[None]] = []  # the scheduler, heartbeats, take-overs
        self._scheduler: asyncio.Task[None] | None = None
        self._side_tasks: set[asyncio.Task[Any]] = set()  # webhooks and the outbox: not runs
        # Runs created (or taken over) here that have not started: a run that ends makes the
        # scheduler look for more only while some wait (others' runs are theirs to start).
        self._unstarted: set[str] = set()
        self._waking: dict[str, str] = {}  # thread id -> the wake-up run queued or executing here
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self.assistants = AssistantsClient(self)
        self.threads = ThreadsClient(self)
        self.runs = RunsClient(self)
        self.store = StoreClient(self)
        self.outbox = Outbox(self)

    # -- agents --------------------------------------------------------------

    def register(self, graph_id: str, agent: Agent, *, subagents: bool = True) -> None:
        """Make ``agent`` (and the background subagents it runs here) available as the assistant ``graph_id``."""
        if graph_id in self.graphs and self.graphs[graph_id] is not agent:
            raise ValueError(f"an agent is already registered as {graph_id!r}")
        self.graphs[graph_id] = agent
        self._assistant_ids[assistant_id_for(graph_id)] = graph_id
        if agent.runtime is None:
            agent.runtime = self
        if subagents:
            self._register_subagents(agent)

    def _register_subagents(self, agent: Agent) -> None:
        # The agents its middleware runs on this runtime (background subagents) are registered now,
        # not at their first task, so a task run taken over after a restart finds its agent.
        for mw in agent.middleware:
            for sub in getattr(mw, "runtime_agents", lambda: ())():
                self.graph_id_for_agent(sub)

    def graph_id_of(self, assistant_id: str) -> str:
        """The graph id an assistant id (or graph id) names; :class:`NotFoundError` if none."""
        if assistant_id in self.graphs:
            return assistant_id
        if assistant_id in self._assistant_ids:
            return self._assistant_ids[assistant_id]
        known = ", ".join(sorted(self.graphs)) or "none registered"
        raise NotFoundError(f"assistant {assistant_id!r} not found; known assistants: {known}")

    def graph_id_for_agent(self, agent: Agent) -> str:
        for graph_id, registered in self.graphs.items():
            if registered is agent:
                return graph_id
        graph_id, n = agent.graph_name, 1
        while graph_id in self.graphs:  # the name is another agent's: take a stable variant of it
            n += 1
            graph_id = f"{agent.graph_name}-{n}"
        self.register(graph_id, agent)
        return graph_id

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
            await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso())
            coordinator = self.storage.coordinator()
            if coordinator is not None:
                self.peers = Peers(self, coordinator)
                await self.peers.start()
            self._opened = True
            self._scheduler = asyncio.create_task(self._schedule_forever())
            self._background = [self._scheduler, asyncio.create_task(self._heartbeat_forever())]
            if self.peers is not None:
                self._background.append(asyncio.create_task(self._take_over_forever()))
            await self._recover()
            self.outbox.start()  # notifications for other servers left by the previous owner

    async def close(self, grace: float = 0.0) -> None:
        """Stop scheduling and running. Unfinished runs stay in storage and resume at the next open.

        With ``grace`` (seconds), no new run starts but the running ones get that long to finish.
        """
        if not self._opened:
            return
        assert self._scheduler is not None
        self._scheduler.cancel()  # first, so no new run starts during the grace period
        await asyncio.gather(self._scheduler, return_exceptions=True)
        if grace > 0 and self._tasks:
            await asyncio.wait(list(self._tasks.values()), timeout=grace)
        self._opened = False
        tasks = [*self._background, *self._tasks.values(), *self._side_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._background = []
        await self.outbox.close()
        if self.peers is not None:
            await self.peers.stop()
            self.peers = None
        await self.storage.forget_worker(self.worker_id)
        await self.storage.close()

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` beside the runs (webhooks, the outbox); cancelled when the runtime closes."""
        task = asyncio.create_task(coro)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)
        return task

    async def _recover(self, *, opening: bool = True) -> None:
        """Requeue, for this runtime, the runs of workers that are no longer alive."""
        workers = await self.storage.workers()
        alive = [w for w, (info, beat) in workers.items() if _is_alive(info, beat, self.lease)]
        for dead in workers.keys() - set(alive):
            await self.storage.forget_worker(dead)
        recovered = await self.storage.requeue_orphans(alive, self.worker_id)
        for row in recovered:
            self._unstarted.add(row.run_id)
            await self.storage.update_thread(row.thread_id, status="busy")
        if opening or recovered:
            # Mail stored just before a crash, with no run left to take it.
            for thread_id in await self.storage.threads_with_mail():
                try:
                    await self._wake_thread(thread_id)
                except (NotFoundError, InvalidRequestError) as exc:
                    logger.warning("cannot deliver mail waiting for thread %s: %s", thread_id, exc)
        self.kick()

    async def _heartbeat_forever(self) -> None:
        # A loop of its own, so no other work delays a heartbeat past the lease.
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            if not await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso()):
                self._stop_runs_taken_over()

    async def _take_over_forever(self) -> None:
        """On a shared database: take over the runs of processes that died."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            await self._recover(opening=False)

    def _stop_runs_taken_over(self) -> None:
        """Other processes took this one for dead (it missed its heartbeats) and took its runs: stop them here."""
        if self._tasks:
            logger.warning("this runtime missed its heartbeats for %.0f s; %d runs it was running continue "
                           "elsewhere", self.lease, len(self._tasks))
        for task in self._tasks.values():
            task.cancel()  # as when closing: the run's rows are left to their new owner

    # -- scheduling ----------------------------------------------------------

    def kick(self) -> None:
        """Tell the scheduler there may be runs to start."""
        self._wake.set()

    async def _schedule_forever(self) -> None:
        while True:
            self._wake.clear()
            free = self.max_concurrency - len(self._tasks)
            if free > 0:
                for row in await self.storage.claim_runs(self.worker_id, free, now_iso()):
                    self._start(row)
            # A timer rather than asyncio.wait_for, which on 3.11 can swallow a cancellation that
            # arrives as the event is set; the timer also starts runs whose after_seconds passed.
            timer = asyncio.get_running_loop().call_later(0.25, self._wake.set)
            try:
                await self._wake.wait()
            finally:
                timer.cancel()

    def _start(self, row: RunRow) -> None:
        stream = self._streams.get(row.run_id) or self.new_stream(row)
        self._unstarted.discard(row.run_id)
        context = self._contexts.pop(row.run_id, None) or contextvars.copy_context()
        task = asyncio.create_task(self._execute(row, stream), context=context)
        self._tasks[row.run_id] = task
        if self.peers is not None:
            self.peers.run_started(row, stream)

    def new_stream(self, row: RunRow, *, watched: bool = False) -> RunStream:
        """The event stream of a new run; ``watched`` when its creator follows it from the start."""
        resumable = bool(row.kwargs.get("stream_resumable"))
        stream = RunStream(row.run_id, resumable=resumable, watched=watched,
                           values=(resumable or watched) and wants_values(row.kwargs.get("stream_mode") or ()))
        self._streams[row.run_id] = stream
        self._unstarted.add(row.run_id)
        return stream

    def retire_stream(self, stream: RunStream) -> None:
        """Keep the streams of the last runs that finished, for late joiners; forget older ones."""
        self._finished.append(stream.run_id)
        while len(self._finished) > _STREAMS_KEPT:
            self._streams.pop(self._finished.popleft(), None)

    def remember_context(self, run_id: str) -> None:
        """Run ``run_id`` in the caller's contextvars (so values set by hooks reach background runs)."""
        self._contexts[run_id] = contextvars.copy_context()

    def stream_of(self, run_id: str) -> RunStream | None:
        return self._streams.get(run_id)

    def stream_for(self, row: RunRow, *, values: bool = False) -> RunStream | None:
        """The run's stream: this process's, or one relayed from the process that executes the run."""
        stream = self._streams.get(row.run_id)
        if stream is None and self.peers is not None and (row.status in ("pending", "running")
                                                          or row.kwargs.get("stream_resumable")):
            stream = self.peers.follow(row, values)  # a resumable run's executor may still keep its events
        return stream

    def register_stream(self, stream: RunStream) -> None:
        self._streams[stream.run_id] = stream

    def is_running_here(self, run_id: str) -> bool:
        return run_id in self._tasks

    # -- executing one run -----------------------------------------------------

    async def _execute(self, row: RunRow, stream: RunStream) -> None:
        status, error, values, has_mail = "error", None, None, False
        stored: str | None = "error"  # the run's status as stored (None: rolled back, gone)
        agent = self.graphs.get(self._graph_id_or_none(row.assistant_id) or "")
        try:
            if agent is None:
                raise NotFoundError(f"assistant {row.assistant_id!r} is not registered in this runtime")
            state, result = await self._run_agent(row, agent, stream)
            status, values, has_mail = await self._finish(row, agent, state, result)
            stored = "success"  # also when it paused for a human (see _finish)
            stream.interrupts = [i.to_dict() for i in result.interrupts]
        except asyncio.CancelledError:
            action = self._cancel_actions.pop(row.run_id, None)
            if action is None:  # the runtime is closing: leave the run to be resumed
                stream.finish("interrupted")
                raise
            status = await self._cancelled(row, action)
            stored = None if action == "rollback" else "interrupted"
        except TimeoutError:
            status, error = "timeout", {"type": "TimeoutError", "message": "the run exceeded its timeout"}
            stored = status
            await self._fail(row, status, error)
        except Exception as exc:
            error = describe_error(exc)
            stream.exception = exc
            await self._fail(row, "error", error)
        finally:
            self._tasks.pop(row.run_id, None)
            if self._waking.get(row.thread_id) == row.run_id:
                del self._waking[row.thread_id]
            inbox = self._inboxes.pop(row.thread_id, None)
            if inbox is not None and inbox.drain():
                has_mail = True  # it came as the run was ending, too late for it: a new run takes it
            if self._unstarted:
                self.kick()
        # Joiners read how the run ended from its stream, not from storage.
        stream.final_values = values
        if stored is not None:
            stream.final_row = replace(row, status=stored, error=error, updated_at=now_iso())
        if row.kwargs.get("temporary"):
            await self._drop_temporary(row, stream)
        stream.finish(status, error=error, values=values)
        self.retire_stream(stream)
        if self.peers is not None:
            self.peers.run_ended(row, status, error)
        if row.kwargs.get("webhook"):
            await self._call_webhook(row, stream, status, values, error)
        if status == "success" and has_mail and self._opened:  # mail came as the run finished: wake it
            await self._wake_thread(row.thread_id, row.assistant_id)

    async def _call_webhook(self, row: RunRow, stream: RunStream, status: str, values: dict[str, Any] | None,
                            error: dict[str, Any] | None) -> None:
        final = stream.final_row
        if final is None:
            return  # rolled back: the run is gone
        payload = {**render_run(final), "status": status, "values": to_jsonable(values) if values else None,
                   "run_ended_at": now_iso()}
        if error is not None:
            payload["error"] = render_error(error)
        self.spawn(post_webhook(row.kwargs["webhook"], payload))

    async def _run_agent(self, row: RunRow, agent: Agent, stream: RunStream) -> tuple[ThreadState, RunResult]:
        kwargs = row.kwargs
        reducers = agent.state_reducers()
        state = await self._load_state(row, reducers)
        pending = {}
        resuming = state.head is not None and state.head.run_id == row.run_id  # after a crash
        if resuming:
            stored = await self.storage.pending_writes(row.thread_id)
            pending = {call_id: _decode_pending(value) for call_id, value in stored.items()}
        stage, resume = await self._prepare(row, state, reducers, stream, agent)
        inbox = self._inboxes[row.thread_id] = ThreadInbox(self.storage, row.thread_id)
        await self.refill_inbox(row.thread_id)  # registered first: mail announced meanwhile is not missed
        if kwargs.get("wake") and not resuming and not inbox.drain():
            stage = ""  # another run took the mail that was to wake the thread
        step = state.head.metadata.get("step", 0) if state.head else 0
        ctx = RunContext(
            agent.graph_name, row.run_id, thread_id=row.thread_id, bus=stream.bus,
            context=kwargs.get("context"), store=self.store, metadata=row.metadata,
            recorder=Recorder(self.checkpoints, row.thread_id, state, row.run_id, reducers, step, stream.bus,
                              pending=bool(pending), node_at=agent.node_at),
            inbox=inbox, resume=resume, pending_tools=pending, runtime=self,
            max_iterations=iteration_limit(kwargs.get("config")))
        if not stage and not resuming:  # nothing to run (a run resumed after its last step still ends: on_end)
            return state, RunResult("success", state.values)
        if kwargs.get("timeout"):
            ctx.deadline = asyncio.get_running_loop().time() + kwargs["timeout"]
        with continued_from(kwargs.get("config")):  # the trace of whatever queued the run, across processes
            return state, await agent.run(state.values, ctx, stage=stage)

    async def _load_state(self, row: RunRow, reducers: Mapping[str, Reducer]) -> ThreadState:
        checkpoint_id = row.kwargs.get("checkpoint_id")
        latest = await self.checkpoints.latest(row.thread_id, reducers)
        if checkpoint_id and not (latest.head and latest.head.run_id == row.run_id):
            return await self.checkpoints.at(row.thread_id, checkpoint_id, reducers)
        return latest

    async def _prepare(self, row: RunRow, state: ThreadState, reducers: Mapping[str, Reducer],
                       stream: RunStream, agent: Agent) -> tuple[str, dict[str, Any]]:
        """Apply the run's input or command; returns the stage to start at and the resume values."""
        kwargs = row.kwargs
        command = kwargs.get("command") or {}
        resume = kwargs.get("resume_map")
        if resume is None and "resume" in command:
            thread = await self.storage.get_thread(row.thread_id)
            assert thread is not None
            resume = resume_map(thread, command["resume"])
        resume = resume or {}
        if state.head is not None and state.head.run_id == row.run_id:
            return state.next_stage, resume  # this run was interrupted by a crash: continue it
        step = state.head.metadata.get("step", -1) if state.head else -2  # a thread's first input is step -1
        if command.get("update") is not None:
            await self.checkpoints.write(row.thread_id, state, command["update"], next_stage=state.next_stage,
                                         source="update", run_id=row.run_id, step=step + 1, reducers=reducers)
        if "resume" in command:
            await self.storage.update_thread(row.thread_id, interrupts=[])
            return state.next_stage, resume
        if command.get("goto"):
            return _GOTO_STAGES[command["goto"]], resume
        if kwargs.get("wake"):
            return "before_agent", resume
        if kwargs.get("input") is None:
            return state.next_stage, resume
        update = input_update(kwargs["input"])
        cancelled = _cancelled_tool_results(state.values["messages"])
        if cancelled:
            update["messages"] = [*cancelled, *update.get("messages", ())]
        await self.checkpoints.write(row.thread_id, state, update, next_stage="before_agent", source="input",
                                     run_id=row.run_id, step=step + 1, reducers=reducers)
        if stream.bus.wants_values:
            stream.publish("values", snapshot(state.values), agent=agent.graph_name, thread_id=row.thread_id)
        return "before_agent", resume

    async def _finish(self, row: RunRow, agent: Agent, state: ThreadState,
                      result: RunResult) -> tuple[str, dict[str, Any], bool]:
        """Record the end of a run that succeeded or paused; returns its status, its final values and
        whether mail waits for the thread."""
        if not state.newest:  # the run wrote nothing after the checkpoint it started from
            state = await self.checkpoints.latest(row.thread_id, agent.state_reducers())
        if result.status == "interrupted":
            status, stage, interrupts = "interrupted", result.stage, [i.to_dict() for i in result.interrupts]
        else:
            status, stage, interrupts = "success", "", []
        checkpoint_next = None
        if state.head is not None and state.head.next != stage:
            checkpoint_next = (state.head.checkpoint_id, stage)
            state.head.next = stage
        # As in LangGraph, a run that paused for a human succeeded: the thread is what waits
        # ("interrupted"). A run's own "interrupted" status means it was cancelled.
        has_mail = await self.storage.finish_run(RunEnd(
            row.run_id, row.thread_id, "success", "interrupted" if interrupts else "idle", now_iso(),
            interrupts=interrupts, checkpoint_next=checkpoint_next))
        return status, snapshot(result.state), has_mail

    async def _drop_temporary(self, row: RunRow, stream: RunStream) -> None:
        """A stateless run's thread goes when the run ends; joiners get the result kept on its stream."""
        if stream.final_row is not None:
            stream.result = await self.runs._result(stream.final_row)  # this deletes the thread
        else:
            await self.storage.delete_thread(row.thread_id)
            self.checkpoints.forget(row.thread_id)

    async def _fail(self, row: RunRow, status: str, error: dict[str, Any]) -> None:
        self.checkpoints.forget(row.thread_id)
        # A thread's error has LangGraph's shape: {"error": <type>, "message": ...}.
        await self.storage.finish_run(RunEnd(row.run_id, row.thread_id, status, "error", now_iso(), error=error,
                                             thread_error=render_error(error)))

    async def _cancelled(self, row: RunRow, action: str) -> str:
        self.checkpoints.forget(row.thread_id)
        error = None
        if action == "rollback":
            await self.storage.delete_checkpoints_of_run(row.thread_id, row.run_id)
        else:
            error = {"error": "UserInterrupt",
                     "message": f"interrupt requested via POST /threads/{row.thread_id}/runs/{row.run_id}/cancel"}
        # As in LangGraph, a cancelled run leaves its thread idle: "interrupted" means waiting for a person.
        thread = await self.storage.get_thread(row.thread_id)
        waiting = thread is not None and bool(thread.interrupts)
        await self.storage.finish_run(RunEnd(row.run_id, row.thread_id, "interrupted",
                                             "interrupted" if waiting else "idle", now_iso(), thread_error=error))
        if action == "rollback":
            await self.storage.delete_run(row.run_id)
        return "interrupted"

    # -- cancelling and waiting ------------------------------------------------

    async def cancel_run(self, row: RunRow, action: str = "interrupt", wait: bool = False) -> None:
        """Stop a run: ``interrupt`` keeps its finished steps, ``rollback`` deletes the run and its steps."""
        if action not in ("interrupt", "rollback"):
            raise InvalidRequestError(f"cancel action must be 'interrupt' or 'rollback', not {action!r}")
        task = self.cancel_local(row.run_id, action)
        if task is not None:
            if wait:
                await asyncio.gather(task, return_exceptions=True)
            return
        if row.status == "running" and self.peers is not None:  # another process runs it
            self.peers.cancel(row.run_id, action)
            if wait:
                with contextlib.suppress(NotFoundError):
                    await self.wait_for(row.run_id)
            return
        if row.status == "pending":
            self._unstarted.discard(row.run_id)
            if not await self.storage.drop_pending_run(row.run_id, action, now_iso()):
                fresh = await self.storage.get_run(row.run_id)  # it started meanwhile
                if fresh is not None and fresh.status in ("pending", "running"):
                    await self.cancel_run(fresh, action, wait)
                return
            if self.peers is not None:  # its creator may be following it
                self.peers.cancel(row.run_id, action)

    def cancel_local(self, run_id: str, action: str) -> asyncio.Task[None] | None:
        """Cancel the run if this process executes it (returns its task); else end its stream here, if any."""
        task = self._tasks.get(run_id)
        if task is not None:
            self._cancel_actions[run_id] = action
            task.cancel()
            return task
        stream = self._streams.get(run_id)
        if stream is not None and not stream.finished and not (self.peers and self.peers.follows(run_id)):
            stream.finish("interrupted")  # it was queued here and never started
            self.retire_stream(stream)
        return None

    async def wait_for(self, run_id: str) -> RunRow:
        """Wait until a run has ended; returns its final row."""
        stream = self._streams.get(run_id)
        if stream is not None:
            await stream.wait()
            if stream.final_row is not None:  # ended here: no need to read it back
                return stream.final_row
        while True:
            row = await self.storage.get_run(run_id)
            if row is None or row.status in _TERMINAL:
                if row is None:
                    raise NotFoundError(f"run {run_id!r} not found (it may have been rolled back)")
                return row
            await asyncio.sleep(0.05)

    # -- messages for threads ----------------------------------------------------

    async def deliver(self, thread_id: str, message: AnyMessage, *, key: str,
                      assistant_id: str | None = None) -> bool:
        """Give ``message`` to a thread exactly once per ``key``: into its active run, or by waking it.

        Returns ``False`` when a message with this key was delivered before.
        """
        await self.open()
        if not await self.storage.put_inbox(thread_id, key, message, now_iso()):
            return False
        # The run that takes it will load the thread's state: keep it cached through a busy fan-out
        # (rebuilding a supervisor's long state from its checkpoints costs far more).
        self.checkpoints.keep(thread_id)
        inbox = self._inboxes.get(thread_id)
        if inbox is not None:
            inbox.push(key, message)
            return True
        await self._wake_thread(thread_id, assistant_id)
        return True

    def inbox_of(self, thread_id: str) -> ThreadInbox | None:
        """The inbox of the thread's run executing here, if any."""
        return self._inboxes.get(thread_id)

    async def refill_inbox(self, thread_id: str) -> None:
        """Give the thread's run executing here the mail stored for it (by any process)."""
        inbox = self._inboxes.get(thread_id)
        if inbox is not None:
            for key, message in await self.storage.inbox(thread_id):
                inbox.push(key, message)

    async def _wake_thread(self, thread_id: str, assistant_id: str | None = None) -> None:
        waking = self._waking.get(thread_id)
        if self.peers is None and (waking in self._unstarted or waking in self._tasks):
            # A wake-up run queued or executing here reads the stored mail as it starts (or has
            # its inbox, and then deliver() gave the message to it).
            return
        if await self.storage.active_runs(thread_id):
            if self.peers is not None:  # its run may be executing in another process
                self.peers.mail(thread_id)
            return  # a queued run will take the message
        if assistant_id is None:
            thread = await self.storage.get_thread(thread_id)
            if thread is None:
                raise NotFoundError(f"thread {thread_id!r} not found")
            assistant_id = thread.metadata.get("graph_id")
            if assistant_id is None:
                raise InvalidRequestError(f"thread {thread_id!r} has never run an assistant; cannot wake it")
        # (runs.create reads the thread anyway, and says NotFoundError if it is gone)
        run = await self.runs.create(thread_id, assistant_id, multitask_strategy="enqueue", _wake=True)
        self._waking[thread_id] = run["run_id"]

    # -- the agent's thread API --------------------------------------------------

    async def invoke(self, agent: Agent, thread_id: str, input: Any, *, context: Any = None,
                     metadata: Mapping[str, Any] | None = None, bus: EventBus | None = None) -> dict[str, Any]:
        """Run ``agent`` on a thread (created if new) and return the final state with message objects."""
        graph_id = self.graph_id_for_agent(agent)
        run = await self.runs.create(thread_id, graph_id, input=input, context=context, metadata=dict(metadata or {}),
                                     if_not_exists="create", multitask_strategy="enqueue")
        stream = self._streams[run["run_id"]]
        if bus is not None:
            stream.bus.listeners.extend(bus.listeners)
            stream.bus.wants_values = stream.bus.wants_values or bus.wants_values
        row = await self.wait_for(run["run_id"])
        if row.status == "error":
            raise stream.exception or BackchannelError(str((row.error or {}).get("message", "the run failed")))
        state = await self.checkpoints.latest(thread_id, agent.state_reducers())
        values = dict(state.values)
        thread = await self.storage.get_thread(thread_id)
        if thread is not None and thread.interrupts:
            from backchannel.interrupts import Interrupt

            values["__interrupt__"] = [Interrupt(i["value"], i["id"]) for i in thread.interrupts]
        return values

    def _graph_id_or_none(self, assistant_id: str) -> str | None:
        try:
            return self.graph_id_of(assistant_id)
        except NotFoundError:
            return None


_GOTO_STAGES = {"model": "before_model", "tools": "tools", "__end__": "", "end": ""}


def _cancelled_tool_results(messages: list[AnyMessage]) -> list[ToolMessage]:
    """Results for tool calls a cancelled run left unanswered (providers reject a call without a result)."""
    _, calls = pending_tool_calls(messages)
    return [ToolMessage(f"Tool call {c.get('name')!r} (id {c['id']}) was cancelled before it finished.",
                        c["id"], c.get("name"), status="error") for c in calls]


def input_update(value: Any) -> dict[str, Any]:
    """A run's input as a state update: ``{"messages": [...], ...}`` (messages read from any accepted form)."""
    if isinstance(value, Mapping):
        update = dict(value)
        if "messages" in update:
            update["messages"] = messages_from_input(update["messages"])
        return update
    return {"messages": messages_from_input(value)}


def _decode_pending(value: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    update = dict(value["update"])
    update["messages"] = messages_from_input(update.get("messages", []))
    return update, bool(value["direct"])


def _worker_info() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _is_alive(info: dict[str, Any], heartbeat_at: str, lease: float) -> bool:
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            return False
        except PermissionError:
            pass
    return datetime.now(UTC) - datetime.fromisoformat(heartbeat_at) < timedelta(seconds=lease)
