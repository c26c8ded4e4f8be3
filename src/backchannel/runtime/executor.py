"""The executor: one run, from its thread's state to its recorded end.

A run loads its thread's newest state (or the checkpoint it asks for), applies
its input or command as a checkpoint, and runs its agent with a recorder that
checkpoints every step. It ends ``success`` (also when it paused for a human:
then its thread is ``interrupted``), ``error``, ``timeout``, or ``interrupted``
when cancelled; that end is recorded in one write, with the run's last step. A run stopped because the
runtime closes records nothing, and is resumed from its last checkpoint by the
next runtime to open the database. When the database refuses the end (a full
disk), the run's waiters still learn it from its stream, and the end is
recorded as soon as the database takes writes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from backchannel._clock import now_iso
from backchannel.agent import Agent, describe_error, stops_run
from backchannel.context import NOTHING, Breakpoints, RunContext
from backchannel.errors import BackchannelError, LostRunError, NotFoundError, StorageUnavailableError
from backchannel.messages import AnyMessage, ToolMessage, messages_from_input, pending_tool_calls
from backchannel.protocols import HostRuntime
from backchannel.result import RunResult
from backchannel.runtime.checkpoints import Checkpointer, Recorder, ThreadState
from backchannel.runtime.mail import Mail
from backchannel.runtime.metrics import RunMetrics
from backchannel.runtime.peers import Peers
from backchannel.runtime.queue import RunQueue
from backchannel.runtime.registry import Registry
from backchannel.runtime.rows import CancelAction, CheckpointWrite, RunClaim, RunEnd, RunRow, RunStatus, replaced
from backchannel.runtime.run_options import iteration_limit
from backchannel.runtime.scheduler import KnownStart, Scheduler
from backchannel.runtime.storage import ParentGoneError, Storage, read_together
from backchannel.runtime.streams import RunStream, Streams
from backchannel.runtime.webhooks import post_webhook
from backchannel.runtime.wire import input_update, render_error, render_run, resume_map
from backchannel.serde import to_jsonable
from backchannel.state import Reducer, snapshot
from backchannel.tracing import Trace, continued_from

__all__ = ["DEFAULT_MAX_ATTEMPTS", "Executor"]

logger = logging.getLogger("backchannel")

_GOTO_STAGES = {"model": "before_model", "tools": "tools", "__end__": "", "end": ""}
SPANS_KEPT = 2_000  # spans a run keeps for its timeline; a run with more keeps its first ones
DEFAULT_MAX_ATTEMPTS = 3  # starts of a run whose process died each time, before the run is failed
_RETRY_FIRST, _RETRY_LAST = 0.1, 5.0  # seconds between tries to record a run's end the database refused


class Executor:
    """Executes the runs the scheduler starts, and records how each ended."""

    def __init__(self, host: HostRuntime, storage: Storage, checkpoints: Checkpointer, registry: Registry,
                 streams: Streams, scheduler: Scheduler, queue: RunQueue, mail: Mail, peers: Peers,
                 metrics: RunMetrics, *, spawn: Callable[[Coroutine[Any, Any, Any]], object],
                 is_open: Callable[[], bool], max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.host = host
        self.max_attempts = max_attempts  # starts of a run whose process died each time, before it is failed
        self.storage = storage
        self.checkpoints = checkpoints
        self.registry = registry
        self.streams = streams
        self.scheduler = scheduler
        self.queue = queue
        self.mail = mail
        self.peers = peers
        self.metrics = metrics
        self._spawn = spawn
        self._is_open = is_open

    async def execute(self, row: RunRow, stream: RunStream, *, known: ThreadState | None = None) -> None:
        """Run ``row`` to its end (the scheduler's task for it). ``known``: its claim found its thread at this state
        (no mail), as :meth:`start` made it and the claim wrote it; nothing is read."""
        started = time.monotonic()
        status: RunStatus = "error"
        error: dict[str, Any] | None = None
        values: dict[str, Any] | None = None
        has_mail = False
        stored: RunStatus | None = "error"  # the run's status as stored (None: rolled back, gone)
        agent = self.registry.agent_of_run(row)
        trace = Trace()  # what the run does, kept with its end
        recorder: Recorder | None = None  # its steps' (its last one is written with its end)
        try:
            try:
                if agent is None:
                    raise NotFoundError(f"assistant {row.assistant_id!r} is not registered in this runtime")
                if row.attempts > self.max_attempts:
                    raise RunAttemptsError(row.attempts - 1)
                # The agent's run is awaited here, not in a helper: each frame under a run stays suspended as
                # long as it (a thousand background subagents hold a thousand of each).
                state, ctx, recorder, stage = await self._ready(row, agent, stream, trace, known)
                if ctx is None:  # nothing to run (a run resumed after its last step still ends: on_end)
                    result = RunResult("success", state.values)
                else:
                    with continued_from(row.kwargs.get("config")):  # the trace of whatever queued the run
                        result = await agent.run(state.values, ctx, stage=stage)
                status, values, has_mail = await self._finish(row, agent, state, result, trace, recorder)
                stored = "success"  # also when it paused for a human (see _finish)
                stream.interrupts = [i.to_dict() for i in result.interrupts]
            except asyncio.CancelledError:
                action = self.scheduler.cancel_action(row.run_id)
                if action is None:  # the runtime is closing (or lost the run): it is resumed later
                    stream.finish("interrupted")
                    await self._hand_back(row)
                    raise
                status = await self._cancelled(row, action, trace, recorder)
                stored = None if action == "rollback" else "interrupted"
            except TimeoutError:
                status, error = "timeout", {"type": "TimeoutError", "message": "the run exceeded its timeout"}
                stored = status
                await self._fail(row, status, error, trace, recorder)
            except Exception as exc:
                if stops_run(exc):
                    raise
                error = describe_error(exc)
                stream.exception = exc
                await self._fail(row, "error", error, trace, recorder)
        except Exception as exc:
            if not stops_run(exc):
                raise
            # The database went away mid-run, or another process took the run over: nothing of its end
            # is recorded here. Once the database answers, it starts again from its last checkpoint if it
            # is still this process's; if not, its stream here ends (see Scheduler.stranded).
            self.checkpoints.forget(row.thread_id)
            self.scheduler.stranded(row)
            return
        finally:
            if self.mail.close_inbox(row.thread_id, row.run_id):
                has_mail = True  # it came as the run was ending, too late for it: a new run takes it
            self.scheduler.ended(row.run_id)
        # Joiners read how the run ended from its stream, not from storage.
        stream.final_values = values
        if stored is not None:
            stream.final_row = replaced(row, status=stored, error=error, updated_at=now_iso(), usage=_usage(trace))
        if row.kwargs.get("temporary"):
            with contextlib.suppress(StorageUnavailableError):  # its thread stays, for want of a database
                await self._drop_temporary(row, stream)
        stream.finish(status, error=error, values=values)
        self.metrics.run_ended(status, time.monotonic() - started)
        self.streams.retire(stream)
        self.peers.run_ended(row, status, error)
        if row.kwargs.get("webhook"):
            self._call_webhook(row, stream, status, values, error)
        # Mail the run did not hear (it came as the run ended, or the run failed, was cancelled or reached its
        # limit first) wakes the thread; after a wake-up run that failed, the thread's next run takes it.
        if has_mail and self._is_open() and (status == "success" or not row.kwargs.get("wake")):
            with contextlib.suppress(StorageUnavailableError):  # the mail is stored: recovery wakes it later
                await self.mail.wake(row.thread_id, row.assistant_id)

    def _call_webhook(self, row: RunRow, stream: RunStream, status: RunStatus, values: dict[str, Any] | None,
                      error: dict[str, Any] | None) -> None:
        final = stream.final_row
        if final is None:
            return  # rolled back: the run is gone
        payload = {**render_run(final), "status": status, "values": to_jsonable(values) if values else None,
                   "run_ended_at": now_iso()}
        if error is not None:
            payload["error"] = render_error(error)
        self._spawn(post_webhook(row.kwargs["webhook"], payload))

    async def _ready(self, row: RunRow, agent: Agent, stream: RunStream, trace: Trace, known: ThreadState | None
                     ) -> tuple[ThreadState, RunContext | None, Recorder | None, str]:
        """The run's state, its context with its recorder, and the stage it starts at (no context: it has nothing
        to run)."""
        kwargs = row.kwargs
        reducers = agent.state_reducers()
        claim = _claim_of(row)
        if known is not None:
            state = known
            self.checkpoints.adopt(row.thread_id, state)
            inbox = await self.mail.open_inbox(row.thread_id, claim, empty=True)
        else:  # read together: one round trip where the storage batches a tick's reads
            state, inbox = await read_together(self.storage, self._load_state(row, reducers),
                                               self.mail.open_inbox(row.thread_id, claim))
        pending: Mapping[str, Any] = NOTHING
        own = state.head is not None and state.head.run_id == row.run_id
        resuming = known is None and own  # after a crash
        if resuming:
            stored = await self.storage.pending_writes(row.thread_id)
            pending = {call_id: _decode_pending(value) for call_id, value in stored.items()}
        resume: Mapping[str, Any] = NOTHING
        if known is not None and own:  # its input, written with its claim
            stage = "before_agent"
            self._show_input(row, state, stream, agent)
        else:
            stage, resume = await self._prepare(row, state, reducers, stream, agent)
        if kwargs.get("wake") and not resuming and not inbox.drain():
            stage = ""  # another run took the mail that was to wake the thread
        step = state.head.metadata.get("step", 0) if state.head else 0
        recorder = Recorder(self.checkpoints, row.thread_id, state, row.run_id, reducers, step, stream.bus,
                            claim=claim, pending=bool(pending), node_at=agent.node_at)
        ctx = RunContext(
            agent.graph_name, row.run_id, thread_id=row.thread_id, bus=stream.bus,
            context=kwargs.get("context"), store=self.host.store, metadata=row.metadata,
            recorder=recorder,
            inbox=inbox, resume=resume, pending_tools=pending, runtime=self.host,
            max_iterations=iteration_limit(kwargs.get("config")), trace=trace,
            breakpoints=_breakpoints(kwargs, resumed=resuming or (stage == state.next_stage
                                                                  and not kwargs.get("input"))))
        if not stage and not resuming:
            return state, None, None, stage
        if kwargs.get("timeout"):
            ctx.deadline = asyncio.get_running_loop().time() + kwargs["timeout"]
        return state, ctx, recorder, stage

    async def _load_state(self, row: RunRow, reducers: Mapping[str, Reducer]) -> ThreadState:
        checkpoint_id = row.kwargs.get("checkpoint_id")
        latest = await self.checkpoints.latest(row.thread_id, reducers)
        if checkpoint_id and not (latest.head and latest.head.run_id == row.run_id):
            return await self.checkpoints.at(row.thread_id, checkpoint_id, reducers)
        return latest

    async def _prepare(self, row: RunRow, state: ThreadState, reducers: Mapping[str, Reducer],
                       stream: RunStream, agent: Agent) -> tuple[str, Mapping[str, Any]]:
        """Apply the run's input or command; returns the stage to start at and the resume values."""
        kwargs = row.kwargs
        command = kwargs.get("command") or {}
        resume = kwargs.get("resume_map")
        if resume is None and "resume" in command:
            thread = await self.storage.get_thread(row.thread_id)
            if thread is None:
                raise NotFoundError(f"Thread with ID {row.thread_id} not found")
            resume = resume_map(thread, command["resume"])
        resume = resume or NOTHING
        if state.head is not None and state.head.run_id == row.run_id:
            return state.next_stage, resume  # this run was interrupted by a crash: continue it
        step = _step_of(state)
        if command.get("update") is not None:
            await self.checkpoints.write(row.thread_id, state, command["update"], next_stage=state.next_stage,
                                         claim=_claim_of(row),
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
        await self.checkpoints.write(row.thread_id, state, _input_update(kwargs, state), next_stage="before_agent",
                                     source="input", claim=_claim_of(row),
                                     run_id=row.run_id, step=step + 1, reducers=reducers)
        self._show_input(row, state, stream, agent)
        return "before_agent", resume

    def start(self, row: RunRow) -> KnownStart | None:
        """How a run claimed as it is stored may start without reading its thread: from the thread's newest state as
        this process holds it (a blank one where it holds none), with its input applied for its claim to write where
        it finds the thread at that state (``None``: the run reads its thread; it starts from a checkpoint it names).
        """
        if row.kwargs.get("checkpoint_id") or self.registry.agent_of_run(row) is None:
            return None
        return KnownStart(self.checkpoints.held(row.thread_id) or self.checkpoints.blank(), self._input_write, row)

    def _input_write(self, row: RunRow, state: ThreadState) -> CheckpointWrite | None:
        """The checkpoint of the run's input after ``state``, applied to it (``None``: the run writes what it has to
        itself, as :meth:`_prepare` does: a command, a wake-up, no input). Raises what applying it raised."""
        kwargs = row.kwargs
        agent = self.registry.agent_of_run(row)
        if agent is None or kwargs.get("input") is None or kwargs.get("command") or kwargs.get("wake"):
            return None
        try:
            return self.checkpoints.prepare_next(row.thread_id, state, _input_update(kwargs, state),
                                                 next_stage="before_agent", source="input", run_id=row.run_id,
                                                 step=_step_of(state) + 1, reducers=agent.state_reducers())
        except Exception:
            self.checkpoints.forget(row.thread_id)  # its state may hold part of the input: the run reads it again
            raise

    def _show_input(self, row: RunRow, state: ThreadState, stream: RunStream, agent: Agent) -> None:
        """The state with the run's input applied goes to the run's stream (if it shows values)."""
        if stream.bus.wants_values:
            stream.publish("values", snapshot(state.values), agent=agent.graph_name, thread_id=row.thread_id)

    async def _finish(self, row: RunRow, agent: Agent, state: ThreadState, result: RunResult, trace: Trace,
                      recorder: Recorder | None) -> tuple[RunStatus, dict[str, Any], bool]:
        """Record the end of a run that succeeded or paused; returns its status as streams show it, its final
        values and whether mail waits for the thread."""
        if not state.newest:  # the run wrote nothing after the checkpoint it started from
            state = await self.checkpoints.latest(row.thread_id, agent.state_reducers())
        status: RunStatus
        if result.status == "interrupted":
            status, stage, interrupts = "interrupted", result.stage, [i.to_dict() for i in result.interrupts]
        else:
            status, stage, interrupts = "success", "", []
        # A breakpoint pauses with no question to answer: the thread waits all the same, at its next step.
        checkpoint_next = None
        if state.head is not None and state.head.next != stage:
            checkpoint_next = (state.head.checkpoint_id, stage)
            state.head.next = stage
        # Taken before the end is recorded: once it is, the thread's next run may apply its input to this state.
        values = snapshot(result.state)
        # As in LangGraph, a run that paused for a human succeeded: the thread is what waits
        # ("interrupted"). A run's own "interrupted" status means it was cancelled.
        has_mail = await self._finish_run(RunEnd(
            row.run_id, row.thread_id, "success", "interrupted" if status == "interrupted" else "idle", now_iso(),
            interrupts=interrupts, checkpoint_next=checkpoint_next, usage=_usage(trace), spans=_spans(trace),
            claim=row.claim), recorder)
        return status, values, has_mail

    async def _finish_run(self, end: RunEnd, recorder: Recorder | None) -> bool:
        """Record a run's end, with its last step if the recorder holds it (one transaction); returns whether mail
        waits for its thread."""
        if recorder is None or recorder.held is None:
            return await self.storage.finish_run(end)
        try:
            has_mail = await self.storage.finish_run(replaced(end, checkpoint=recorder.held))
        except ParentGoneError:  # its parent's run was deleted meanwhile: the step goes in whole, then the end
            await recorder.flush()
            return await self.storage.finish_run(end)
        recorder.written()
        return has_mail

    async def _drop_temporary(self, row: RunRow, stream: RunStream) -> None:
        """A stateless run's thread goes when the run ends; joiners get the result kept on its stream."""
        if stream.final_row is not None:
            stream.result = await self.queue.output(stream.final_row)  # this deletes the thread
        else:
            await self.queue.drop_thread(row.thread_id)

    async def _fail(self, row: RunRow, status: RunStatus, error: dict[str, Any], trace: Trace,
                    recorder: Recorder | None) -> None:
        self.checkpoints.forget(row.thread_id)
        # A thread's error has LangGraph's shape: {"error": <type>, "message": ...}.
        await self._record_end(RunEnd(row.run_id, row.thread_id, status, "error", now_iso(), error=error,
                                      thread_error=render_error(error), usage=_usage(trace), spans=_spans(trace),
                                      claim=row.claim), recorder)

    async def _record_end(self, end: RunEnd, recorder: Recorder | None) -> bool:
        """Record how a run ended (with the last step its recorder holds); returns whether mail waits for its
        thread. If the database refuses it, the end is recorded later, once the database takes writes again (the
        thread stays busy until then)."""
        try:
            return await self._finish_run(end, recorder)
        except StorageUnavailableError:
            if recorder is not None:
                recorder.hide()  # the run's stream ends now
            self._spawn(self._record_end_later(end, recorder))
            return False

    async def _record_end_later(self, end: RunEnd, recorder: Recorder | None) -> None:
        delay = _RETRY_FIRST
        while True:
            await asyncio.sleep(delay)
            try:
                await self._finish_run(end, recorder)
            except StorageUnavailableError:
                delay = min(delay * 2, _RETRY_LAST)
            except LostRunError:  # taken over meanwhile: its new owner records how it ends
                return
            else:
                return

    async def _hand_back(self, row: RunRow) -> None:
        """A run stopped here without ending (the runtime closes): give it back unstarted, its attempt
        not counted, for whichever runtime runs it next."""
        claim = _claim_of(row)
        if claim is not None:
            with contextlib.suppress(StorageUnavailableError, LostRunError):  # then it is taken over as it is
                await self.storage.release_run(claim, now_iso())

    async def _cancelled(self, row: RunRow, action: CancelAction, trace: Trace,
                         recorder: Recorder | None) -> RunStatus:
        self.checkpoints.forget(row.thread_id)
        thread = await self.storage.get_thread(row.thread_id)
        error = None
        if action == "rollback":
            if thread is not None:
                with contextlib.suppress(StorageUnavailableError):  # then its steps stay: the run is kept, interrupted
                    await self.checkpoints.delete_run(row.thread_id, row.run_id, self.registry.reducers_for(thread))
        else:
            error = {"error": "UserInterrupt",
                     "message": f"interrupt requested via POST /threads/{row.thread_id}/runs/{row.run_id}/cancel"}
        # As in LangGraph, a cancelled run leaves its thread idle: "interrupted" means waiting for a person.
        waiting = thread is not None and bool(thread.interrupts)
        await self._record_end(RunEnd(row.run_id, row.thread_id, "interrupted",
                                      "interrupted" if waiting else "idle", now_iso(), thread_error=error,
                                      usage=_usage(trace), spans=_spans(trace), claim=row.claim),
                               None if action == "rollback" else recorder)  # (a rolled back run's steps are gone)
        if action == "rollback":
            with contextlib.suppress(StorageUnavailableError):
                await self.storage.delete_run(row.run_id)
        return "interrupted"


def _usage(trace: Trace) -> dict[str, Any] | None:
    """A run's token usage as its row keeps it (``None`` when the agent never ran)."""
    return trace.usage if trace.runs else None


def _spans(trace: Trace) -> list[dict[str, Any]] | None:
    """A run's spans as storage keeps them: the first :data:`SPANS_KEPT` (its runs first)."""
    return trace.span_dicts()[:SPANS_KEPT] if trace.runs else None


def _step_of(state: ThreadState) -> int:
    """The step of the state's head (a thread's first input is step -1)."""
    return state.head.metadata.get("step", -1) if state.head else -2


def _input_update(kwargs: Mapping[str, Any], state: ThreadState) -> dict[str, Any]:
    """A run's input as the update its checkpoint records after ``state``: with results for the tool calls a
    cancelled run left unanswered there."""
    update = input_update(kwargs["input"])
    cancelled = _cancelled_tool_results(state.values["messages"])
    if cancelled:
        update["messages"] = [*cancelled, *update.get("messages", ())]
    return update


def _claim_of(row: RunRow) -> RunClaim | None:
    return RunClaim(row.run_id, row.claim) if row.claim else None


class RunAttemptsError(BackchannelError):
    """A run was started too many times: each time, the process running it stopped before it ended."""

    def __init__(self, attempts: int) -> None:
        super().__init__(
            f"the run was started {attempts} times and each time the process running it died (or stopped "
            "responding) before the run ended, so it is not started again: something it does may take its "
            "process down (a crash in native code, running out of memory, a tool that exits the process)")


def _cancelled_tool_results(messages: list[AnyMessage]) -> list[ToolMessage]:
    """Results for tool calls a cancelled run left unanswered (providers reject a call without a result)."""
    _, calls = pending_tool_calls(messages)
    return [ToolMessage(f"Tool call {c.get('name')!r} (id {c['id']}) was cancelled before it finished.",
                        c["id"], c.get("name"), status="error") for c in calls]


def _breakpoints(kwargs: Mapping[str, Any], *, resumed: bool) -> Breakpoints | None:
    """Where the run pauses for a person to look (``resumed``: it goes on from such a pause)."""
    before, after = kwargs.get("interrupt_before"), kwargs.get("interrupt_after")
    if not before and not after:
        return None
    return Breakpoints(frozenset(before or ()), frozenset(after or ()), resumed=resumed)


def _decode_pending(value: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    update = dict(value["update"])
    update["messages"] = messages_from_input(update.get("messages", []))
    return update, bool(value["direct"])
