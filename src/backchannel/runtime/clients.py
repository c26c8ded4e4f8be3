"""The runtime's public surface: ``assistants``, ``threads``, ``runs`` and ``store``.

Method names, arguments and returned dicts follow ``langgraph_sdk``'s async
client, so code written for a LangGraph server runs against a
:class:`~backchannel.runtime.local.LocalRuntime` unchanged (``headers`` and
``params`` are accepted and ignored).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from backchannel.errors import ConflictError, InvalidRequestError, NotFoundError
from backchannel.messages import HumanMessage
from backchannel.runtime._select import ASSISTANT_FIELDS, RUN_FIELDS, STATE_FIELDS, THREAD_FIELDS, selected
from backchannel.runtime.checkpoints import ThreadState
from backchannel.runtime.inbox import notification_in
from backchannel.runtime.modes import StreamMapper, StreamPart, interrupt_part, wants_values
from backchannel.runtime.run_options import (
    check_delay,
    check_input,
    check_state_update,
    check_stream_modes,
    event_position,
    iteration_limit,
    normalize_command,
)
from backchannel.runtime.storage import CheckpointRow, ItemRow, RunRow, ThreadRow, now_iso
from backchannel.runtime.webhooks import check_webhook_url
from backchannel.serde import to_jsonable
from backchannel.tracing import with_trace_context

if TYPE_CHECKING:
    from backchannel.runtime.local import LocalRuntime

__all__ = ["AssistantsClient", "RunsClient", "StoreClient", "ThreadsClient"]

MULTITASK_STRATEGIES = ("reject", "interrupt", "rollback", "enqueue")
_ASSISTANT_SORT = ("assistant_id", "graph_id", "name", "created_at", "updated_at")
_BUSY = "Thread is already running a task. Wait for it to finish or choose a different multitask strategy."


class AssistantsClient:
    """The registered agents, one assistant per graph id."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self._rt = runtime
        self._created_at = now_iso()

    def _assistant(self, graph_id: str) -> dict[str, Any]:
        from backchannel.runtime.local import assistant_id_for

        agent = self._rt.graphs[graph_id]
        return {"assistant_id": assistant_id_for(graph_id), "graph_id": graph_id, "config": {}, "context": {},
                "metadata": {"created_by": "system"}, "name": agent.name or graph_id,
                "created_at": self._created_at, "updated_at": self._created_at, "version": 1, "description": None}

    async def get(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        return self._assistant(self._rt.graph_id_of(assistant_id))

    async def search(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                     name: str | None = None, limit: int = 10, offset: int = 0, sort_by: str | None = None,
                     sort_order: str | None = None, select: Sequence[str] | None = None,
                     **_: Any) -> list[dict[str, Any]]:
        found = [self._assistant(g) for g in self._rt.graphs]
        found = [a for a in found if (graph_id is None or a["graph_id"] == graph_id)
                 and (name is None or name in a["name"])
                 and all(a["metadata"].get(k) == v for k, v in (metadata or {}).items())]
        if sort_by is not None:
            if sort_by not in _ASSISTANT_SORT:
                raise InvalidRequestError(f"cannot sort assistants by {sort_by!r}; use one of {list(_ASSISTANT_SORT)}")
            found.sort(key=lambda a: a[sort_by] or "", reverse=(sort_order or "desc") == "desc")
        return selected(found[offset: offset + limit], select, ASSISTANT_FIELDS, "assistant")

    async def count(self, **kwargs: Any) -> int:
        return len(await self.search(limit=1_000_000, **kwargs))

    async def get_schemas(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        """JSON schemas of the agent's state (its input and output too): ``messages`` and its state keys."""
        graph_id = self._rt.graph_id_of(assistant_id)
        agent = self._rt.graphs[graph_id]
        keys = {key: {} for key in agent.state_reducers() if key != "messages"}
        state = {"title": agent.graph_name, "type": "object", "properties": {
            "messages": {"type": "array", "items": {"type": "object"}}, **keys}}
        return {"graph_id": graph_id, "input_schema": state, "output_schema": state, "state_schema": state,
                "config_schema": None, "context_schema": None}

    async def get_graph(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        """The agent's loop as nodes and edges (model, tools and each middleware hook)."""
        agent = self._rt.graphs[self._rt.graph_id_of(assistant_id)]
        nodes = ["__start__", *agent.node_names(), "__end__"]
        edges = [{"source": a, "target": b} for a, b in zip(nodes, nodes[1:])]
        edges.append({"source": "tools", "target": "model", "conditional": True}) if "tools" in nodes else None
        return {"nodes": [{"id": n, "type": "runnable", "data": {"name": n}} for n in nodes], "edges": edges}


class ThreadsClient:
    """Threads: conversations with their state, history and metadata."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self._rt = runtime

    async def create(self, *, metadata: Mapping[str, Any] | None = None, thread_id: str | None = None,
                     if_exists: str | None = None, graph_id: str | None = None, **_: Any) -> dict[str, Any]:
        await self._rt.open()
        thread_id = thread_id or str(uuid.uuid4())
        meta = dict(metadata or {})
        if graph_id is not None:
            meta["graph_id"] = graph_id
        now = now_iso()
        row = ThreadRow(thread_id, now, now, meta)
        if not await self._rt.storage.create_thread(row):
            if (if_exists or "raise") == "do_nothing":
                return await self.get(thread_id)
            raise ConflictError(f"Thread with ID {thread_id} already exists")
        return await self._render(row, new=True)

    async def get(self, thread_id: str, **_: Any) -> dict[str, Any]:
        return await self._render(await self._row(thread_id))

    async def _row(self, thread_id: str) -> ThreadRow:
        await self._rt.open()
        row = await self._rt.storage.get_thread(thread_id)
        if row is None:
            raise NotFoundError(f"Thread with ID {thread_id} not found")
        return row

    async def update(self, thread_id: str, *, metadata: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        row = await self._row(thread_id)
        row.metadata = {**row.metadata, **metadata}
        row.updated_at = now_iso()
        await self._rt.storage.update_thread(thread_id, metadata=row.metadata, updated_at=row.updated_at)
        return await self._render(row)

    async def delete(self, thread_id: str, **_: Any) -> None:
        await self._row(thread_id)
        for run in await self._rt.storage.active_runs(thread_id):
            await self._rt.cancel_run(run, "interrupt", wait=True)
        await self._rt.storage.delete_thread(thread_id)
        self._rt.checkpoints.forget(thread_id)

    async def search(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                     ids: Sequence[str] | None = None, status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_by: str | None = None, sort_order: str | None = None, select: Sequence[str] | None = None,
                     **_: Any) -> list[dict[str, Any]]:
        await self._rt.open()
        rows = await self._rt.storage.search_threads(
            metadata=dict(metadata or {}), status=status, ids=ids, limit=limit if not values else 1_000_000,
            offset=offset if not values else 0, sort_by=sort_by or "updated_at", sort_order=sort_order or "desc")
        stateless = bool(select) and not values and not {"values", "state_updated_at"} & set(select or ())
        found = [await self._render(r, new=stateless) for r in rows]  # without reading state nobody selected
        if values:
            found = [t for t in found if all((t["values"] or {}).get(k) == v for k, v in values.items())]
            found = found[offset: offset + limit]
        return selected(found, select, THREAD_FIELDS, "thread")

    async def count(self, *, metadata: Mapping[str, Any] | None = None, status: str | None = None,
                    **_: Any) -> int:
        await self._rt.open()
        return await self._rt.storage.count_threads(metadata=dict(metadata or {}), status=status)

    async def copy(self, thread_id: str, **_: Any) -> dict[str, Any]:
        """A new thread with this one's metadata and full checkpoint history (a fork)."""
        row = await self._row(thread_id)
        now = now_iso()
        copy = ThreadRow(str(uuid.uuid4()), now, now, dict(row.metadata), row.status if row.status != "busy" else "idle",
                         row.interrupts, row.error)
        await self._rt.storage.create_thread(copy)
        await self._rt.storage.copy_checkpoints(thread_id, copy.thread_id)
        return await self._render(copy)

    async def get_state(self, thread_id: str, checkpoint: Mapping[str, Any] | None = None,
                        checkpoint_id: str | None = None, *, select: Sequence[str] | None = None,
                        **_: Any) -> dict[str, Any]:
        row = await self._row(thread_id)
        checkpoint_id = checkpoint_id or _checkpoint_id_of(checkpoint)
        state = await self._state(row, checkpoint_id)
        return selected([self._render_state(row, state.values, state.head)], select, STATE_FIELDS, "state")[0]

    async def update_state(self, thread_id: str, values: Mapping[str, Any] | Sequence[Any] | None, *,
                           as_node: str | None = None, checkpoint: Mapping[str, Any] | None = None,
                           checkpoint_id: str | None = None, **_: Any) -> dict[str, Any]:
        """Write ``values`` into the thread's state as a new checkpoint (source ``update``)."""
        row = await self._row(thread_id)
        if await self._rt.storage.active_runs(thread_id):
            ids = [r.run_id for r in await self._rt.storage.active_runs(thread_id)]
            raise ConflictError(f"Thread {thread_id} has in-flight runs: {ids}")
        from backchannel.runtime.local import input_update

        state = await self._state(row, checkpoint_id or _checkpoint_id_of(checkpoint), live=True)
        reducers = self._reducers(row)
        update = input_update(check_state_update(values)) if values is not None else {}
        step = state.head.metadata.get("step", -1) + 1 if state.head else 0
        source = "update" if state.head is None or checkpoint_id is None else "fork"
        written = await self._rt.checkpoints.write(thread_id, state, update, next_stage=state.next_stage,
                                                   source=source, run_id=None, step=step, reducers=reducers)
        await self._rt.storage.update_thread(thread_id, updated_at=now_iso())
        ref = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": written.checkpoint_id}
        return {"checkpoint": ref, "configurable": ref, "checkpoint_id": written.checkpoint_id}

    async def get_history(self, thread_id: str, *, limit: int = 10, before: str | Mapping[str, Any] | None = None,
                          metadata: Mapping[str, Any] | None = None, select: Sequence[str] | None = None,
                          **_: Any) -> list[dict[str, Any]]:
        """The thread's checkpoints, newest first, each as a ThreadState."""
        row = await self._row(thread_id)
        before_seq = None
        if before is not None:
            before_id = before if isinstance(before, str) else _checkpoint_id_of(before)
            found = await self._rt.storage.get_checkpoint(thread_id, before_id or "")
            if found is None:
                raise NotFoundError(f"thread {thread_id!r} has no checkpoint {before_id!r}")
            before_seq = found.seq
        rows = await self._rt.storage.list_checkpoints(thread_id, before_seq=before_seq)
        if metadata:
            rows = [c for c in rows if all(self._checkpoint_metadata(row, c).get(k) == v for k, v in metadata.items())]
        history = []
        for checkpoint in rows[:limit]:
            state = await self._rt.checkpoints.at(thread_id, checkpoint.checkpoint_id, self._reducers(row))
            history.append(self._render_state(row, state.values, checkpoint))
        return selected(history, select, STATE_FIELDS, "state")

    # -- rendering

    def _reducers(self, row: ThreadRow) -> dict[str, Any]:
        agent = self._rt.graphs.get(row.metadata.get("graph_id", ""))
        return agent.state_reducers() if agent is not None else {}

    async def _state(self, row: ThreadRow, checkpoint_id: str | None = None, live: bool = False) -> ThreadState:
        reducers = self._reducers(row)
        if checkpoint_id:
            return await self._rt.checkpoints.at(row.thread_id, checkpoint_id, reducers)
        return await self._rt.checkpoints.latest(row.thread_id, reducers)

    async def _render(self, row: ThreadRow, *, new: bool = False) -> dict[str, Any]:
        state = None if new else await self._state(row)  # a new thread has no state to read
        head = state.head if state is not None else None
        return {"thread_id": row.thread_id, "created_at": row.created_at, "updated_at": row.updated_at,
                "state_updated_at": head.created_at if head else row.updated_at, "metadata": row.metadata,
                "status": row.status, "config": {}, "values": to_jsonable(state.values) if head else None,
                "interrupts": _interrupts_by_task(row), "error": row.error}

    def _checkpoint_metadata(self, row: ThreadRow, checkpoint: CheckpointRow) -> dict[str, Any]:
        meta = {**row.metadata, **checkpoint.metadata, "thread_id": row.thread_id, "parents": {}}
        if checkpoint.run_id:
            meta["run_id"] = checkpoint.run_id
        return meta

    def _render_state(self, row: ThreadRow, values: dict[str, Any], head: CheckpointRow | None) -> dict[str, Any]:
        if head is None:
            return {"values": {}, "next": [], "tasks": [], "metadata": None, "created_at": None, "checkpoint": None,
                    "parent_checkpoint": None, "interrupts": [], "checkpoint_id": None, "parent_checkpoint_id": None}
        agent = self._rt.graphs.get(row.metadata.get("graph_id", ""))
        next_nodes = [agent.node_at(head.next)] if agent is not None and head.next else []
        is_latest = row.interrupts and head.next and row.status == "interrupted"
        interrupts = [{"id": i["id"], "value": i["value"]} for i in row.interrupts] if is_latest else []
        tasks = [{"id": _task_id(row.thread_id, head.checkpoint_id, node), "name": node,
                  "path": ["__pregel_pull", node], "error": None, "interrupts": interrupts, "checkpoint": None,
                  "state": None, "result": None} for node in next_nodes]
        ref = {"checkpoint_id": head.checkpoint_id, "thread_id": row.thread_id, "checkpoint_ns": ""}
        parent = ({"checkpoint_id": head.parent_id, "thread_id": row.thread_id, "checkpoint_ns": ""}
                  if head.parent_id else None)
        return {"values": to_jsonable(values), "next": next_nodes, "tasks": tasks,
                "metadata": self._checkpoint_metadata(row, head), "created_at": head.created_at,
                "checkpoint": ref, "parent_checkpoint": parent, "interrupts": interrupts,
                "checkpoint_id": head.checkpoint_id, "parent_checkpoint_id": head.parent_id}


class RunsClient:
    """Runs: one agent execution on a thread, queued, streamed, awaited or cancelled."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self._rt = runtime

    async def create(self, thread_id: str | None, assistant_id: str, *, input: Any = None,
                     command: Mapping[str, Any] | None = None, stream_mode: str | Sequence[str] = "values",
                     stream_subgraphs: bool = False, stream_resumable: bool = False,
                     metadata: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
                     context: Any = None, checkpoint: Mapping[str, Any] | None = None,
                     checkpoint_id: str | None = None, multitask_strategy: str | None = None,
                     if_not_exists: str | None = None, on_completion: str | None = None,
                     after_seconds: float | None = None, timeout: float | None = None,
                     webhook: str | None = None, concurrency_key: str | None = None,
                     concurrency_limit: int | None = None, _wake: bool = False, _watched: bool = False,
                     _once: bool = False, **_: Any) -> dict[str, Any]:
        """Queue a run and return it (status ``pending``); it starts as soon as its thread is free.

        Beyond the LangGraph arguments: ``timeout`` (seconds) ends the run with status
        ``timeout``; runs sharing a ``concurrency_key`` run at most ``concurrency_limit`` at a time.
        ``webhook`` is an http(s) URL that gets the run (with its final values) POSTed when it ends.

        An input that is one task notification (a background task reporting back, possibly from
        another server) is delivered as :meth:`LocalRuntime.deliver` delivers it, once per task
        run: into the thread's active run, or by waking the thread. The run returned is the one
        that takes it.
        """
        rt = self._rt
        await rt.open()
        graph_id = rt.graph_id_of(assistant_id)
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        _check_run_arguments(modes, multitask_strategy, if_not_exists, on_completion, after_seconds)
        command = normalize_command(command)
        input = check_input(input, command)
        iteration_limit(config)  # a bad recursion_limit is refused now, not when the run starts
        if webhook is not None:
            check_webhook_url(webhook)
        notification = notification_in(input) if thread_id is not None and command is None else None
        if notification is not None:
            return await self._deliver(thread_id, graph_id, notification)
        temporary = thread_id is None
        if thread_id is None:
            if command and "resume" in command:
                raise InvalidRequestError("You must provide a thread_id when resuming.")
            thread_id = str(uuid.uuid4())
            if_not_exists = "create"
        thread = await rt.storage.get_thread(thread_id)
        if thread is not None and _once:  # the same call made again (a tool call resumed after a crash)
            first = (await rt.storage.list_runs(thread_id, limit=1_000_000))[-1:]
            if first:
                return render_run(first[0])
        new_thread = thread is None
        if thread is None:
            if (if_not_exists or "reject") != "create":
                raise NotFoundError(f"Thread with ID {thread_id} not found")
            created = now_iso()  # stored below, with the run, already busy
            thread = ThreadRow(thread_id, created, created, dict(metadata or {}) if not temporary else {})
        checkpoint_id = checkpoint_id or _checkpoint_id_of(checkpoint)
        if checkpoint_id and await rt.storage.get_checkpoint(thread_id, checkpoint_id) is None:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        strategy = multitask_strategy or "enqueue"
        active = [] if new_thread else await rt.storage.active_runs(thread_id)
        if active and strategy == "reject":
            raise ConflictError(_BUSY)
        if not _wake:  # a wake-up starts a trace of its own (its notifications link back to their tasks)
            config = with_trace_context(config)
        kwargs: dict[str, Any] = {
            "input": to_jsonable(input), "command": to_jsonable(command) if command else None,
            "config": dict(config or {}), "context": context, "stream_mode": modes,
            "stream_subgraphs": stream_subgraphs, "stream_resumable": stream_resumable,
            "checkpoint_id": checkpoint_id, "temporary": temporary and (on_completion or "delete") == "delete",
            "timeout": timeout, "wake": _wake, "webhook": webhook}
        if command and "resume" in command and not active:
            kwargs["resume_map"] = resume_map(thread, command["resume"])
        now = datetime.now(UTC)
        assistant = _assistant_id(graph_id)
        run_metadata = {**thread.metadata, **(config or {}).get("metadata", {}), **dict(metadata or {}),
                        "graph_id": graph_id, "assistant_id": assistant}
        row = RunRow(str(uuid.uuid4()), thread_id, assistant, now.isoformat(), now.isoformat(),
                     "pending", run_metadata, kwargs, strategy, rt.worker_id,
                     (now + timedelta(seconds=after_seconds or 0)).isoformat(),
                     concurrency_key=concurrency_key, concurrency_limit=concurrency_limit)
        # The stream and context exist before the run is stored: the scheduler may start it at
        # the first await (e.g. while the runs it supersedes are being cancelled).
        rt.new_stream(row, watched=_watched)
        rt.remember_context(row.run_id)
        thread.metadata = {**thread.metadata, "graph_id": graph_id, "assistant_id": assistant}
        thread.status = "busy"
        if not (new_thread and await rt.storage.create_thread(thread)):
            await rt.storage.update_thread(thread_id, status="busy", metadata=thread.metadata,
                                           updated_at=row.created_at)
        await rt.storage.create_run(row)
        if rt.peers is not None and any(r.worker_id != rt.worker_id for r in active):
            rt.peers.queued(thread_id)  # behind another process's run: it says when that one ends
        if active and strategy in ("interrupt", "rollback"):
            # Newest first, so a queued run cannot start in the gap left by the running one.
            for other in reversed(active):
                await rt.cancel_run(other, strategy, wait=True)
        rt.kick()
        return render_run(row)

    async def get(self, thread_id: str, run_id: str, **_: Any) -> dict[str, Any]:
        return render_run(await self._row(thread_id, run_id))

    async def _row(self, thread_id: str, run_id: str) -> RunRow:
        await self._rt.open()
        row = await self._rt.storage.get_run(run_id)
        if row is None or row.thread_id != thread_id:
            raise NotFoundError(f"Run {run_id} not found on thread {thread_id}")
        return row

    async def list(self, thread_id: str, *, limit: int = 10, offset: int = 0, status: str | None = None,
                   select: Sequence[str] | None = None, **_: Any) -> list[dict[str, Any]]:
        await self._rt.threads._row(thread_id)
        rows = await self._rt.storage.list_runs(thread_id, status=status, limit=limit, offset=offset)
        return selected([render_run(r) for r in rows], select, RUN_FIELDS, "run")

    async def cancel(self, thread_id: str, run_id: str, *, wait: bool = False, action: str = "interrupt",
                     **_: Any) -> None:
        row = await self._row(thread_id, run_id)
        if row.status not in ("pending", "running"):
            raise NotFoundError("No matching runs to cancel. Please verify the thread ID and run IDs are correct, "
                                "and the runs haven't been deleted or completed.")
        await self._rt.cancel_run(row, action, wait=wait)

    async def delete(self, thread_id: str, run_id: str, **_: Any) -> None:
        row = await self._row(thread_id, run_id)
        if row.status in ("pending", "running"):
            await self._rt.cancel_run(row, "interrupt", wait=True)
        await self._rt.storage.delete_checkpoints_of_run(thread_id, run_id)
        await self._rt.storage.delete_run(run_id)
        self._rt.checkpoints.forget(thread_id)

    async def join(self, thread_id: str, run_id: str, **_: Any) -> dict[str, Any]:
        """Wait for the run to end; returns the thread's final values (``__error__``/``__interrupt__`` if so)."""
        row = await self._row(thread_id, run_id)
        return await self.output(row.run_id)

    async def output(self, run_id: str) -> dict[str, Any]:
        """Wait for a run to end and return what :meth:`join` returns, for a run known to exist."""
        return await self._result(await self._rt.wait_for(run_id))

    async def wait(self, thread_id: str | None, assistant_id: str, *, raise_error: bool = True,
                   **kwargs: Any) -> dict[str, Any]:
        """Create a run and wait for it; returns its final values like :meth:`join`."""
        run = await self.create(thread_id, assistant_id, **kwargs)
        result = await self.output(run["run_id"])
        error = result.get("__error__")
        if error is not None and raise_error:
            stream = self._rt.stream_of(run["run_id"])
            if stream is not None and stream.exception is not None:
                raise stream.exception
            raise RuntimeError(f"{error['error']}: {error['message']}")
        return result

    async def _deliver(self, thread_id: str, graph_id: str, message: HumanMessage) -> dict[str, Any]:
        rt = self._rt
        await self._rt.threads._row(thread_id)
        note = message.additional_kwargs["task_notification"]
        await rt.deliver(thread_id, message, key=f"{note['task_id']}:{note['run_id']}", assistant_id=graph_id)
        active = await rt.storage.active_runs(thread_id)
        taker = active[-1] if active else (await rt.storage.list_runs(thread_id, limit=1))[0]
        return render_run(taker)

    async def _result(self, row: RunRow) -> dict[str, Any]:
        stream = self._rt.stream_of(row.run_id)
        if stream is not None and stream.result is not None:
            return stream.result  # a stateless run whose thread is gone
        if row.status in ("error", "timeout"):
            result = {"__error__": render_error(row.error or {})}
        elif stream is not None and stream.final_values is not None:
            result = to_jsonable(stream.final_values)  # this run's own end state, whatever queued run came next
            if stream.interrupts:
                result["__interrupt__"] = [interrupt_part(i) for i in stream.interrupts]
        else:  # a run that ended in another process, or before a restart
            thread = await self._rt.storage.get_thread(row.thread_id)
            if thread is None:
                return {}
            result = to_jsonable((await self._rt.threads._state(thread)).values)
            if thread.status == "interrupted" and thread.interrupts:
                result["__interrupt__"] = [interrupt_part(i) for i in thread.interrupts]
        if row.kwargs.get("temporary"):
            await self._rt.storage.delete_thread(row.thread_id)
            self._rt.checkpoints.forget(row.thread_id)
        return result

    def stream(self, thread_id: str | None, assistant_id: str, *, stream_mode: str | Sequence[str] = "values",
               stream_subgraphs: bool = False, **kwargs: Any) -> AsyncIterator[StreamPart]:
        """Create a run and yield its stream parts: ``metadata`` first, then each mode's parts, ``error`` on failure."""
        return self._stream(thread_id, assistant_id, stream_mode=stream_mode,
                            stream_subgraphs=stream_subgraphs, **kwargs)

    async def _stream(self, thread_id: str | None, assistant_id: str, **kwargs: Any) -> AsyncIterator[StreamPart]:
        run = await self.create(thread_id, assistant_id, _watched=True, **kwargs)
        async for part in self._follow(run, None, 0):
            yield part
        if run["kwargs"].get("temporary"):
            await self._rt.wait_for(run["run_id"])
            await self._rt.storage.delete_thread(run["thread_id"])

    def join_stream(self, thread_id: str, run_id: str, *, stream_mode: str | Sequence[str] | None = None,
                    last_event_id: str | None = None, **_: Any) -> AsyncIterator[StreamPart]:
        """Follow a run's stream: from the start (or after ``last_event_id``) if still kept, else from now on."""
        return self._join_stream(thread_id, run_id, stream_mode, last_event_id)

    async def _join_stream(self, thread_id: str, run_id: str, stream_mode: str | Sequence[str] | None,
                           last_event_id: str | None) -> AsyncIterator[StreamPart]:
        row = await self._row(thread_id, run_id)
        modes = None if stream_mode is None else check_stream_modes(
            [stream_mode] if isinstance(stream_mode, str) else stream_mode)
        after = event_position(last_event_id)
        stream = self._rt.stream_for(row, values=wants_values(modes or row.kwargs.get("stream_mode") or ()))
        if stream is None or (not row.kwargs.get("stream_resumable") and last_event_id is None
                              and stream.finished):
            return
        async for part in self._follow(render_run(row), modes, after, with_metadata=False):
            yield part

    async def _follow(self, run: Mapping[str, Any], modes: Sequence[str] | None, after: int, *,
                      with_metadata: bool = True) -> AsyncIterator[StreamPart]:
        """The parts of a run's stream (``run`` as :func:`render_run` gives it)."""
        stream = self._rt.stream_of(run["run_id"])
        if stream is None:
            return
        kwargs = run["kwargs"]
        modes = modes or kwargs.get("stream_mode") or ["values"]
        events = stream.follow(after, values=wants_values(modes))
        if with_metadata:
            yield StreamPart("metadata", {"run_id": run["run_id"], "attempt": 1})
        mapper = StreamMapper(modes, subgraphs=bool(kwargs.get("stream_subgraphs")),
                              metadata={k: v for k, v in run["metadata"].items() if k != "assistant_id"})
        async for event in events:
            for part in mapper.parts(event):
                yield part
        if stream.status == "error" and stream.error:  # LangGraph sends no error event for a timeout
            yield StreamPart("error", render_error(stream.error))


class StoreClient:
    """A key-value store shared by all threads, addressed by namespace tuples."""

    def __init__(self, runtime: LocalRuntime) -> None:
        self._rt = runtime

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any],
                       index: Any = None, ttl: Any = None, **_: Any) -> None:
        await self._rt.open()
        await self._rt.storage.put_item(_namespace(namespace), key, dict(value), now_iso())

    async def get_item(self, namespace: Sequence[str], /, key: str, **_: Any) -> dict[str, Any] | None:
        await self._rt.open()
        found = await self._rt.storage.get_item(_namespace(namespace), key)
        return _render_item(found) if found else None

    async def delete_item(self, namespace: Sequence[str], /, key: str, **_: Any) -> None:
        await self._rt.open()
        await self._rt.storage.delete_item(_namespace(namespace), key)

    async def search_items(self, namespace_prefix: Sequence[str], /, filter: Mapping[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, query: str | None = None,
                           **_: Any) -> dict[str, Any]:
        await self._rt.open()
        rows = await self._rt.storage.search_items(_namespace(namespace_prefix, allow_empty=True),
                                                   filter=dict(filter or {}), limit=limit, offset=offset)
        return {"items": [{**_render_item(r), "score": None} for r in rows]}

    async def list_namespaces(self, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100, offset: int = 0,
                              **_: Any) -> dict[str, Any]:
        await self._rt.open()
        found = await self._rt.storage.list_namespaces(prefix=_namespace(prefix or (), allow_empty=True),
                                                       suffix=_namespace(suffix or (), allow_empty=True),
                                                       max_depth=max_depth, limit=limit, offset=offset)
        return {"namespaces": [list(ns) for ns in found]}


# -- helpers -------------------------------------------------------------------


def _assistant_id(graph_id: str) -> str:
    from backchannel.runtime.local import assistant_id_for

    return assistant_id_for(graph_id)


def _check_run_arguments(modes: Sequence[str], strategy: str | None, if_not_exists: str | None,
                         on_completion: str | None, after_seconds: float | None) -> None:
    check_stream_modes(modes)
    check_delay(after_seconds)
    if strategy is not None and strategy not in MULTITASK_STRATEGIES:
        raise InvalidRequestError(f"unknown multitask_strategy {strategy!r}; use one of {list(MULTITASK_STRATEGIES)}")
    if if_not_exists not in (None, "reject", "create"):
        raise InvalidRequestError(f"if_not_exists must be 'reject' or 'create', not {if_not_exists!r}")
    if on_completion not in (None, "delete", "keep"):
        raise InvalidRequestError(f"on_completion must be 'delete' or 'keep', not {on_completion!r}")


def resume_map(thread: ThreadRow, resume: Any) -> dict[str, Any]:
    """Which pending interrupt each resume value answers: ``{interrupt_id: value}``.

    Raises :class:`InvalidRequestError` when the value cannot answer the
    thread's interrupts (none pending, ambiguous, or a malformed HITL decision).
    """
    pending = {i["id"]: i["value"] for i in thread.interrupts}
    if isinstance(resume, Mapping) and resume and set(resume) <= set(pending):
        answers = dict(resume)
    elif len(pending) == 1:
        answers = {next(iter(pending)): resume}
    elif not pending:
        if thread.status != "interrupted":
            raise InvalidRequestError(f"thread {thread.thread_id} has no pending interrupt to resume")
        return {}
    else:
        raise InvalidRequestError(f"thread {thread.thread_id} has {len(pending)} pending interrupts; resume with "
                                  f"a map {{interrupt_id: value}} for ids {sorted(pending)}")
    from backchannel.hitl import check_resume

    for interrupt_id, value in answers.items():
        check_resume(pending[interrupt_id], value)
    return answers


def _checkpoint_id_of(checkpoint: Mapping[str, Any] | None) -> str | None:
    if not checkpoint:
        return None
    if "checkpoint_id" in checkpoint:
        return checkpoint["checkpoint_id"]
    return (checkpoint.get("configurable") or {}).get("checkpoint_id")


def _task_id(thread_id: str, checkpoint_id: str, node: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{thread_id}:{checkpoint_id}:{node}"))


def _interrupts_by_task(row: ThreadRow) -> dict[str, list[dict[str, Any]]]:
    if not row.interrupts:
        return {}
    return {_task_id(row.thread_id, "interrupt", "pending"): [{"id": i["id"], "value": i["value"]}
                                                              for i in row.interrupts]}


def render_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """A run's stored error (``{"type", "message"}``) in LangGraph's shape: ``{"error", "message"}``.

    An error LangGraph has its own name for is named as LangGraph names it, so clients recognise it.
    """
    kind = error.get("type", "Error")
    return {"error": _LANGGRAPH_ERRORS.get(kind, kind), "message": error.get("message", "")}


_LANGGRAPH_ERRORS = {"MaxIterationsError": "GraphRecursionError"}


def render_run(row: RunRow) -> dict[str, Any]:
    kwargs = {k: v for k, v in row.kwargs.items() if k not in ("resume_map", "wake")}
    return {"run_id": row.run_id, "thread_id": row.thread_id, "assistant_id": row.assistant_id,
            "metadata": row.metadata, "status": row.status, "kwargs": kwargs,
            "multitask_strategy": row.multitask_strategy, "created_at": row.scheduled_at or row.created_at,
            "updated_at": row.updated_at}


def _namespace(namespace: Sequence[str], *, allow_empty: bool = False) -> tuple[str, ...]:
    ns = tuple(namespace)
    if not ns and not allow_empty:
        raise InvalidRequestError("a namespace needs at least one label")
    for label in ns:
        # "." joins labels in the API's query strings, control characters in storage: either would alias
        if not isinstance(label, str) or not label or "." in label or not label.isprintable():
            raise InvalidRequestError(f"Namespace label {label!r} must be a non-empty string without periods "
                                      "or control characters")
    return ns


def _render_item(row: ItemRow) -> dict[str, Any]:
    return {"namespace": list(row.namespace), "key": row.key, "value": row.value, "created_at": row.created_at,
            "updated_at": row.updated_at}
