"""The runtime's public surface: ``assistants``, ``threads``, ``runs`` and ``store``.

Method names, arguments and returned dicts follow ``langgraph_sdk``'s async
client, so code written for a LangGraph server runs against a
:class:`~backchannel.runtime.local.LocalRuntime` unchanged. A misspelt keyword
raises :class:`TypeError`, as it does there; ``headers`` and ``params`` (which
only mean something over HTTP) are accepted and ignored; a LangGraph option
this runtime cannot honour raises :class:`~backchannel.errors.InvalidRequestError`
naming it. The clients check and render; the work is the runtime's parts'
(:mod:`~backchannel.runtime.queue`, :mod:`~backchannel.runtime.mail`, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, Unpack, get_args

from backchannel._clock import now_iso
from backchannel._ids import assistant_id_for
from backchannel.agent import Agent
from backchannel.errors import ConflictError, InvalidRequestError, NotFoundError
from backchannel.messages import HumanMessage
from backchannel.protocols import (
    Checkpoint,
    CronOptions,
    CronUpdate,
    Headers,
    Params,
    RunOptions,
    StreamModes,
    StreamOptions,
    StreamPart,
    WaitOptions,
    timezone_name,
    unexpected_keywords,
)
from backchannel.runtime._select import ASSISTANT_FIELDS, CRON_FIELDS, RUN_FIELDS, STATE_FIELDS, THREAD_FIELDS, selected
from backchannel.runtime.assistants import AssistantCatalog
from backchannel.runtime.checkpoints import Checkpointer
from backchannel.runtime.crons import check_schedule, check_timezone, next_tick, tick_text, utc_text
from backchannel.runtime.follow import THREAD_STREAM_MODES, Follower, ThreadStreamMode
from backchannel.runtime.inbox import notification_in
from backchannel.runtime.mail import Mail
from backchannel.runtime.modes import wants_values
from backchannel.runtime.queue import NewRun, RunQueue
from backchannel.runtime.registry import Registry
from backchannel.runtime.retention import Retention, check_strategy, thread_ttl
from backchannel.runtime.rows import (
    ACTIVE,
    CRON_SORT,
    AssistantChange,
    AssistantRow,
    CancelAction,
    CheckpointRow,
    CronRow,
    RunRow,
    RunStatus,
    ThreadRow,
    ThreadStatus,
)
from backchannel.runtime.run_options import (
    breakpoint_nodes,
    check_input,
    check_state_update,
    check_stream_modes,
    event_position,
    iteration_limit,
    normalize_command,
)
from backchannel.runtime.storage import Storage, read_together
from backchannel.runtime.streams import Batches, Sink, Streams
from backchannel.runtime.webhooks import check_webhook_url
from backchannel.runtime.wire import (
    check_namespace,
    check_run_arguments,
    checkpoint_id_of,
    checkpoint_metadata,
    input_update,
    render_assistant,
    render_cron,
    render_item,
    render_run,
    render_state,
    render_thread,
)
from backchannel.serde import to_jsonable

__all__ = ["AssistantsClient", "CronsClient", "RunsClient", "StoreClient",
           "ThreadsClient"]

Opener = Callable[[], Awaitable[None]]  # opens the runtime on first use
_THREAD_STATUSES: tuple[ThreadStatus, ...] = get_args(ThreadStatus)
_RUN_STATUSES: tuple[RunStatus, ...] = get_args(RunStatus)
S = TypeVar("S", bound=str)
PartBatch = list[StreamPart]  # (RunsClient.list hides the builtin in its body)
_DURABILITY = (None, "sync", "async", "exit")  # when checkpoints are written; every step is, here
_CANCEL_ACTIONS: tuple[CancelAction, ...] = get_args(CancelAction)
_BULK_CANCEL: dict[str, tuple[RunStatus, ...]] = {"pending": ("pending",), "running": ("running",), "all": ACTIVE}


def _refuse(**options: Any) -> None:
    """Raise :class:`InvalidRequestError` for a LangGraph option given that this runtime cannot honour."""
    for name, value in options.items():
        if value is not None and value is not False:
            raise InvalidRequestError(f"{name} is not supported by this runtime")


def _status(status: str | None, known: tuple[S, ...], of: str) -> S | None:
    """``status`` as one of the ``known`` statuses of a thread or run; :class:`InvalidRequestError` if it is none."""
    for value in known:
        if status == value:
            return value
    if status is None:
        return None
    raise InvalidRequestError(f"unknown {of} status {status!r}; use one of {list(known)}")


class AssistantsClient:
    """Assistants: each registered graph's own, and those made from a graph with a config and context of their
    own, versioned (see :mod:`~backchannel.runtime.assistants`)."""

    def __init__(self, open: Opener, catalog: AssistantCatalog, registry: Registry, storage: Storage,
                 queue: RunQueue, threads: ThreadsClient) -> None:
        self._open = open
        self._catalog = catalog
        self._registry = registry
        self._storage = storage
        self._queue = queue
        self._threads = threads

    async def _resolve(self, assistant_id: str) -> AssistantRow:
        await self._open()
        return await self._catalog.resolve(assistant_id)

    async def get(self, assistant_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return render_assistant(await self._resolve(assistant_id))

    async def create(self, graph_id: str | None, config: Mapping[str, Any] | None = None, *,
                     context: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
                     assistant_id: str | None = None, if_exists: str | None = None, name: str | None = None,
                     headers: Headers = None, description: str | None = None,
                     params: Params = None) -> dict[str, Any]:
        """A new assistant: the served graph ``graph_id`` with this config, context and metadata (version 1)."""
        if not graph_id:
            raise InvalidRequestError("an assistant needs the graph_id of a served graph")
        await self._open()
        return render_assistant(await self._catalog.create(
            graph_id, config=config, context=context, metadata=metadata, assistant_id=assistant_id,
            if_exists=if_exists, name=name, description=description))

    async def update(self, assistant_id: str, *, graph_id: str | None = None,
                     config: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                     metadata: Mapping[str, Any] | None = None, name: str | None = None, headers: Headers = None,
                     description: str | None = None, params: Params = None) -> dict[str, Any]:
        """A new version of the assistant, made its current one: the fields given changed (``metadata`` merged
        into its own)."""
        await self._open()
        change = AssistantChange(graph_id=graph_id or None, config=dict(config) if config is not None else None,
                                 context=dict(context) if context is not None else None,
                                 metadata=dict(metadata or {}), name=name or None, description=description)
        return render_assistant(await self._catalog.update(assistant_id, change))

    async def delete(self, assistant_id: str, *, delete_threads: bool = False, headers: Headers = None,
                     params: Params = None) -> None:
        """Delete an assistant with its versions, stopping its runs (``delete_threads``: and its threads)."""
        row = await self._resolve(assistant_id)
        self._catalog.check_deletable(row)  # before anything is stopped
        threads = await self._storage.search_threads(metadata={"assistant_id": row.assistant_id}, limit=1_000_000)
        for thread in threads:
            if delete_threads:
                await self._threads.delete(thread.thread_id)
                continue
            for run in await self._storage.active_runs(thread.thread_id):
                if run.assistant_id == row.assistant_id:
                    await self._queue.cancel(run, "interrupt", wait=True)
        await self._catalog.delete(row)

    async def search(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                     name: str | None = None, limit: int = 10, offset: int = 0, sort_by: str | None = None,
                     sort_order: str | None = None, select: Sequence[str] | None = None,
                     response_format: str = "array", headers: Headers = None,
                     params: Params = None) -> Any:
        """Assistants, newest first unless sorted otherwise; ``response_format="object"``: ``{"assistants",
        "next"}``, ``next`` the offset of the next page (``None`` on the last)."""
        if response_format not in ("array", "object"):
            raise InvalidRequestError(f"response_format must be 'array' or 'object', not {response_format!r}")
        found, next_offset = await self.page(metadata=metadata, graph_id=graph_id, name=name, limit=limit,
                                             offset=offset, sort_by=sort_by, sort_order=sort_order, select=select)
        if response_format == "object":
            return {"assistants": found, "next": None if next_offset is None else str(next_offset)}
        return found

    async def page(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                   name: str | None = None, limit: int = 10, offset: int = 0, sort_by: str | None = None,
                   sort_order: str | None = None,
                   select: Sequence[str] | None = None) -> tuple[list[dict[str, Any]], int | None]:
        """What :meth:`search` finds, and the offset of the next page (``None`` when this one is the last)."""
        if sort_order not in (None, "asc", "desc"):
            raise InvalidRequestError(f"sort_order must be 'asc' or 'desc', not {sort_order!r}")
        await self._open()
        try:
            rows = await self._catalog.search(graph_id=graph_id, name=name, metadata=metadata, limit=limit + 1,
                                              offset=offset, sort_by=sort_by or "created_at",
                                              sort_order=sort_order or "desc")
        except ValueError as exc:
            raise InvalidRequestError(str(exc)) from None
        found = selected([render_assistant(r) for r in rows[:limit]], select, ASSISTANT_FIELDS, "assistant")
        return found, offset + limit if len(rows) > limit else None

    async def count(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                    name: str | None = None, headers: Headers = None, params: Params = None) -> int:
        await self._open()
        return await self._catalog.count(graph_id=graph_id, name=name, metadata=metadata)

    async def get_versions(self, assistant_id: str, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]:
        """The assistant's versions (whose metadata contains ``metadata``), newest first."""
        await self._open()
        rows = await self._catalog.versions(assistant_id, metadata=metadata, limit=limit, offset=offset)
        return [render_assistant(r, as_version=True) for r in rows]

    async def set_latest(self, assistant_id: str, version: int, *, headers: Headers = None,
                         params: Params = None) -> dict[str, Any]:
        """Make one of the assistant's versions its current one again (its runs use it from now on)."""
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidRequestError(f"version must be an integer, not {version!r:.40}")
        await self._open()
        return render_assistant(await self._catalog.set_latest(assistant_id, version))

    async def get_schemas(self, assistant_id: str, *, headers: Headers = None,
                          params: Params = None) -> dict[str, Any]:
        """JSON schemas of the agent's state (its input and output too): ``messages`` and its state keys."""
        row = await self._resolve(assistant_id)
        return {"graph_id": row.graph_id, **_schemas(self._registry.graphs[row.graph_id])}

    async def get_graph(self, assistant_id: str, *, xray: int | bool = False, headers: Headers = None,
                        params: Params = None) -> dict[str, Any]:
        """The agent's loop as nodes and edges (model, tools and each middleware hook); it has no subgraphs
        for ``xray`` to show."""
        agent = self._registry.graphs[(await self._resolve(assistant_id)).graph_id]
        nodes = ["__start__", *agent.node_names(), "__end__"]
        edges: list[dict[str, Any]] = [{"source": a, "target": b} for a, b in zip(nodes, nodes[1:])]
        if "tools" in nodes:
            edges.append({"source": "tools", "target": "model", "conditional": True})
        return {"nodes": [{"id": n, "type": "runnable", "data": {"name": n}} for n in nodes], "edges": edges}

    async def get_subgraphs(self, assistant_id: str, namespace: str | None = None, recurse: bool = False, *,
                            headers: Headers = None, params: Params = None) -> dict[str, Any]:
        """The agent's subgraphs by namespace: none (its subagents are agents of their own, run as tools)."""
        await self._resolve(assistant_id)  # NotFoundError for an unknown one
        return {}


def _schemas(agent: Agent) -> dict[str, Any]:
    keys: dict[str, Any] = {key: {} for key in agent.state_reducers() if key != "messages"}
    state = {"title": agent.graph_name, "type": "object", "properties": {
        "messages": {"type": "array", "items": {"type": "object"}}, **keys}}
    return {"input_schema": state, "output_schema": state, "state_schema": state, "config_schema": None,
            "context_schema": None}


class ThreadsClient:
    """Threads: conversations with their state, history and metadata."""

    def __init__(self, open: Opener, storage: Storage, checkpoints: Checkpointer, registry: Registry,
                 queue: RunQueue, follower: Follower, retention: Retention) -> None:
        self._open = open
        self._retention = retention
        self._follower = follower
        self._storage = storage
        self._checkpoints = checkpoints
        self._registry = registry
        self._queue = queue

    async def create(self, *, metadata: Mapping[str, Any] | None = None, thread_id: str | None = None,
                     if_exists: str | None = None, supersteps: Sequence[Any] | None = None,
                     graph_id: str | None = None, ttl: int | Mapping[str, Any] | None = None,
                     headers: Headers = None, params: Params = None) -> dict[str, Any]:
        _refuse(supersteps=supersteps)
        lifetime = thread_ttl(ttl) if ttl is not None else None
        await self._open()
        thread_id = thread_id or str(uuid.uuid4())
        meta = dict(metadata or {})
        if graph_id is not None:
            meta["graph_id"] = graph_id
        now = now_iso()
        row = ThreadRow(thread_id, now, now, meta)
        if not await self._storage.create_thread(row):
            if (if_exists or "raise") == "do_nothing":
                return await self.get(thread_id)
            raise ConflictError(f"Thread with ID {thread_id} already exists")
        if lifetime is not None:
            await self._storage.set_thread_ttl(thread_id, lifetime)
        return render_thread(row, None, None)  # a new thread has no state to read

    async def get(self, thread_id: str, *, include: Sequence[str] | None = None, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]:
        unknown = sorted(set(include or ()) - {"ttl"})
        if unknown:
            raise InvalidRequestError(f"cannot include {unknown[0]!r:.80} in a thread; only 'ttl'")
        row = await self.row(thread_id)
        thread = await self._render(row)
        if include and "ttl" in include:
            ttl = await self._storage.thread_ttl(thread_id) or self._retention.threads.default
            if ttl is not None:
                thread["ttl"] = {"strategy": ttl.strategy, "ttl_minutes": ttl.minutes,
                                 "expires_at": (datetime.fromisoformat(row.updated_at)
                                                + timedelta(minutes=ttl.minutes)).isoformat()}
        return thread

    async def row(self, thread_id: str) -> ThreadRow:
        """The thread's row; :class:`NotFoundError` if there is none."""
        await self._open()
        row = await self._storage.get_thread(thread_id)
        if row is None:
            raise NotFoundError(f"Thread with ID {thread_id} not found")
        return row

    async def update(self, thread_id: str, *, metadata: Mapping[str, Any], ttl: int | Mapping[str, Any] | None = None,
                     return_minimal: bool = False, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        _refuse(return_minimal=return_minimal)
        lifetime = thread_ttl(ttl) if ttl is not None else None
        row = await self.row(thread_id)
        row.metadata = {**row.metadata, **metadata}
        row.updated_at = now_iso()
        await self._storage.update_thread(thread_id, metadata=row.metadata, updated_at=row.updated_at)
        if lifetime is not None:
            await self._storage.set_thread_ttl(thread_id, lifetime)
        return await self._render(row)

    async def delete(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> None:
        await self.row(thread_id)
        for run in await self._storage.active_runs(thread_id):
            await self._queue.cancel(run, "interrupt", wait=True)
        await self._queue.drop_thread(thread_id)

    async def prune(self, thread_ids: Sequence[str], *, strategy: str = "delete", headers: Headers = None,
                    params: Params = None) -> dict[str, Any]:
        """Delete threads (``delete``), or drop all but their newest checkpoint (``keep_latest``: the thread stays,
        as it reads now, and takes new runs). A thread with a run pending or running is left as it is, and so is
        a missing one; ``pruned_count`` counts the others."""
        checked = check_strategy(strategy)
        if isinstance(thread_ids, str) or not all(isinstance(t, str) for t in thread_ids):
            raise InvalidRequestError("thread_ids must be a list of thread ids")
        await self._open()
        return {"pruned_count": await self._retention.prune(thread_ids, checked)}

    async def search(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                     ids: Sequence[str] | None = None, status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_by: str | None = None, sort_order: str | None = None, select: Sequence[str] | None = None,
                     extract: Mapping[str, str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]:
        _refuse(extract=extract)
        await self._open()
        rows = await self._storage.search_threads(
            metadata=dict(metadata or {}), status=_status(status, _THREAD_STATUSES, "thread"), ids=ids,
            limit=limit if not values else 1_000_000, offset=offset if not values else 0,
            sort_by=sort_by or "updated_at", sort_order=sort_order or "desc")
        stateless = bool(select) and not values and not {"values", "state_updated_at"} & set(select or ())
        found = [await self._render(r) if not stateless else render_thread(r, None, None)  # no state unselected
                 for r in rows]
        if values:
            found = [t for t in found if all((t["values"] or {}).get(k) == v for k, v in values.items())]
            found = found[offset: offset + limit]
        return selected(found, select, THREAD_FIELDS, "thread")

    async def count(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                    status: str | None = None, headers: Headers = None, params: Params = None) -> int:
        if values:
            return len(await self.search(metadata=metadata, values=values, status=status, limit=1_000_000))
        await self._open()
        return await self._storage.count_threads(metadata=dict(metadata or {}),
                                                 status=_status(status, _THREAD_STATUSES, "thread"))

    async def copy(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        """A new thread with this one's metadata and full checkpoint history (a fork)."""
        row = await self.row(thread_id)
        now = now_iso()
        status: ThreadStatus = row.status if row.status != "busy" else "idle"
        copy = ThreadRow(str(uuid.uuid4()), now, now, dict(row.metadata), status, row.interrupts, row.error)
        await self._storage.create_thread(copy)
        await self._storage.copy_checkpoints(thread_id, copy.thread_id)
        return await self._render(copy)

    async def get_state(self, thread_id: str, checkpoint: Checkpoint = None, checkpoint_id: str | None = None, *,
                        subgraphs: bool = False, select: Sequence[str] | None = None, headers: Headers = None,
                        params: Params = None, stored_json: bool = False) -> dict[str, Any]:
        """The thread's state (at a checkpoint, if given); an agent here has no subgraphs to include.

        ``stored_json``: for a caller that only encodes the state with orjson (the server), its messages may come as
        one ``orjson.Fragment`` of their stored JSON text, unparsed (a long thread's parse costs ten times its
        encoding)."""
        at = checkpoint_id or checkpoint_id_of(checkpoint)
        head: CheckpointRow | None
        if at:
            row = await self.row(thread_id)
            values, head = await self._checkpoints.view(thread_id, at, self._registry.reducers_for(row),
                                                        text=stored_json)
        else:  # the thread and its newest checkpoint read together (one round trip on Postgres)
            row, newest = await read_together(self._storage, self.row(thread_id),
                                              self._storage.head_checkpoint(thread_id))
            values, head = await self._checkpoints.current(thread_id, self._registry.reducers_for(row),
                                                           text=stored_json, head=newest)
        return selected([self._render_state(row, values, head)], select, STATE_FIELDS, "state")[0]

    async def update_state(self, thread_id: str, values: Mapping[str, Any] | Sequence[Any] | None, *,
                           as_node: str | None = None, checkpoint: Checkpoint = None,
                           checkpoint_id: str | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]:
        """Write ``values`` into the thread's state as a new checkpoint (source ``update``)."""
        row = await self.row(thread_id)
        active = await self._storage.active_runs(thread_id)
        if active:
            raise ConflictError(f"Thread {thread_id} has in-flight runs: {[r.run_id for r in active]}")
        state = await self._queue.state_of(row, checkpoint_id or checkpoint_id_of(checkpoint))
        update = input_update(check_state_update(values)) if values is not None else {}
        step = state.head.metadata.get("step", -1) + 1 if state.head else 0
        source = "update" if state.head is None or checkpoint_id is None else "fork"
        written = await self._checkpoints.write(thread_id, state, update, next_stage=state.next_stage,
                                                source=source, run_id=None, step=step,
                                                reducers=self._registry.reducers_for(row))
        await self._storage.update_thread(thread_id, updated_at=now_iso())
        ref = {"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": written.checkpoint_id}
        return {"checkpoint": ref, "configurable": ref, "checkpoint_id": written.checkpoint_id}

    def join_stream(self, thread_id: str, *, last_event_id: str | None = None,
                    stream_mode: ThreadStreamMode | Sequence[ThreadStreamMode] = "run_modes",
                    headers: Headers = None, params: Params = None) -> Batches[StreamPart]:
        """Follow every run of the thread from now on (``run_modes``: each run's parts in its own modes;
        ``lifecycle``: only when each starts and ends), until the caller stops."""
        modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
        unknown = [m for m in modes if m not in THREAD_STREAM_MODES]
        if unknown:
            raise InvalidRequestError(f"unknown thread stream_mode {unknown[0]!r:.80}; use one of "
                                      f"{list(THREAD_STREAM_MODES)}")
        _refuse(last_event_id=last_event_id)
        return Batches(self._join_stream(thread_id, modes),
                       lambda sink, wire: self._push_join_stream(thread_id, modes, sink, wire))

    async def _join_stream(self, thread_id: str,
                           modes: Sequence[ThreadStreamMode]) -> AsyncGenerator[PartBatch, None]:
        await self.row(thread_id)  # 404 for an unknown thread
        async for batch in self._follower.thread(thread_id, modes).batches():
            yield batch

    async def _push_join_stream(self, thread_id: str, modes: Sequence[ThreadStreamMode], sink: Sink[StreamPart],
                                wire: bool) -> None:
        await self.row(thread_id)
        await self._follower.thread(thread_id, modes).push(sink, wire=wire)

    async def get_history(self, thread_id: str, *, limit: int = 10, before: str | Checkpoint = None,
                          metadata: Mapping[str, Any] | None = None, checkpoint: Checkpoint = None,
                          select: Sequence[str] | None = None, headers: Headers = None,
                          params: Params = None, stored_json: bool = False) -> list[dict[str, Any]]:
        """The thread's checkpoints, newest first, each as a ThreadState (an agent here has one namespace,
        so ``checkpoint`` names no other; ``stored_json``: see :meth:`get_state`)."""
        row = await self.row(thread_id)
        before_seq = None
        if before is not None:
            before_id = before if isinstance(before, str) else checkpoint_id_of(before)
            found = await self._storage.get_checkpoint(thread_id, before_id or "")
            if found is None:
                raise NotFoundError(f"thread {thread_id!r} has no checkpoint {before_id!r}")
            before_seq = found.seq
        rows = await self._storage.list_checkpoints(thread_id, before_seq=before_seq,
                                                    limit=None if metadata else limit)
        if metadata:
            rows = [c for c in rows if all(checkpoint_metadata(row, c).get(k) == v for k, v in metadata.items())]
        # A checkpoint pruned since it was listed (keep_latest) is left out.
        history = [self._render_state(row, values, found)
                   for found, values in await self._checkpoints.history(thread_id, rows[:limit],
                                                                        self._registry.reducers_for(row),
                                                                        text=stored_json)]
        return selected(history, select, STATE_FIELDS, "state")

    async def _render(self, row: ThreadRow) -> dict[str, Any]:
        values, head = await self._checkpoints.current(row.thread_id, self._registry.reducers_for(row))
        return render_thread(row, values, head)

    def _render_state(self, row: ThreadRow, values: dict[str, Any], head: CheckpointRow | None) -> dict[str, Any]:
        agent = self._registry.graphs.get(row.metadata.get("graph_id", ""))
        next_nodes = [agent.node_at(head.next)] if agent is not None and head is not None and head.next else []
        return render_state(row, values, head, next_nodes)


class RunsClient:
    """Runs: one agent execution on a thread, queued, streamed, awaited or cancelled.

    ``durability`` and ``checkpoint_during`` are accepted and always get the strongest: every step is
    checkpointed as it happens. ``on_run_created`` is called with the new run's ids.
    """

    def __init__(self, open: Opener, storage: Storage, registry: Registry, catalog: AssistantCatalog,
                 streams: Streams, queue: RunQueue, mail: Mail, threads: ThreadsClient, follower: Follower) -> None:
        self._open = open
        self._catalog = catalog
        self._follower = follower
        self._storage = storage
        self._registry = registry
        self._streams = streams
        self._queue = queue
        self._mail = mail
        self._threads = threads

    async def create(self, thread_id: str | None, assistant_id: str, **options: Unpack[RunOptions]) -> dict[str, Any]:
        """Queue a run and return it (status ``pending``); it starts as soon as its thread is free.

        Beyond the LangGraph arguments: ``timeout`` (seconds) ends the run with status
        ``timeout``; runs sharing a ``concurrency_key`` run at most ``concurrency_limit`` at a time.
        ``webhook`` is an http(s) URL that gets the run (with its final values) POSTed when it ends.

        An input that is one task notification (a background task reporting back, possibly from
        another server) is delivered as :meth:`LocalRuntime.deliver` delivers it, once per task
        run: into the thread's active run, or by waking the thread. The run returned is the one
        that takes it.
        """
        unexpected_keywords("create", options, RunOptions)
        return await self._create(thread_id, assistant_id, options)

    async def create_once(self, thread_id: str, assistant_id: str, **options: Unpack[RunOptions]) -> dict[str, Any]:
        """As :meth:`create`, except on a thread that exists already: then its first run, the one an earlier
        identical call made (a tool call made again after a crash finds the run it started)."""
        unexpected_keywords("create_once", options, RunOptions)
        return await self._create(thread_id, assistant_id, options, once=True)

    async def create_batch(self, payloads: Sequence[Mapping[str, Any]], *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]:
        """Queue stateless runs, one per payload (its ``assistant_id`` and :meth:`create`'s options), and
        return them in order. Every payload is checked before any run is queued: a bad one queues none,
        and the error names its index."""
        if not payloads:
            raise InvalidRequestError("a batch needs at least one run")
        await self._open()
        checked: list[tuple[AssistantRow, NewRun]] = []
        for index, payload in enumerate(payloads):
            options = {key: value for key, value in payload.items() if value is not None}
            try:
                if "thread_id" in options:
                    raise InvalidRequestError("a batch makes stateless runs: give no thread_id "
                                              "(runs.create makes a thread's)")
                assistant_id = options.pop("assistant_id", None)
                if not isinstance(assistant_id, str) or not assistant_id:
                    raise InvalidRequestError("assistant_id is required")
                unexpected_keywords("create_batch", options, RunOptions)
                assistant = await self._catalog.resolve(assistant_id)
                checked.append((assistant, _checked_run(self._registry, assistant, options)))
            except (InvalidRequestError, NotFoundError, TypeError) as exc:
                raise type(exc)(f"payloads[{index}]: {exc}") from None
        return [render_run(await self._queue.create(None, assistant, run)) for assistant, run in checked]

    async def _create(self, thread_id: str | None, assistant_id: str, options: Mapping[str, Any], *,
                      watched: bool = False, once: bool = False) -> dict[str, Any]:
        await self._open()
        # The thread is read with the assistant (one round trip where the storage batches a tick's reads).
        assistant, thread = await read_together(self._storage, self._catalog.resolve(assistant_id),
                                                self._queue.thread(thread_id))
        run = _checked_run(self._registry, assistant, options, watched=watched, once=once)
        notification = notification_in(run.input) if thread_id is not None and run.command is None else None
        if thread_id is not None and notification is not None:
            created = await self._deliver(thread_id, assistant.assistant_id, notification)
        else:
            created = render_run(await self._queue.create(thread_id, assistant, run, stored=thread))
        if options.get("on_run_created") is not None:
            options["on_run_created"]({"run_id": created["run_id"], "thread_id": created["thread_id"]})
        return created

    async def get(self, thread_id: str, run_id: str, *, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]:
        return render_run(await self._row(thread_id, run_id))

    async def _row(self, thread_id: str, run_id: str) -> RunRow:
        await self._open()
        row = await self._storage.get_run(run_id)
        if row is None or row.thread_id != thread_id:
            raise NotFoundError(f"Run {run_id} not found on thread {thread_id}")
        return row

    async def list(self, thread_id: str, *, limit: int = 10, offset: int = 0, status: str | None = None,
                   select: Sequence[str] | None = None, headers: Headers = None,
                   params: Params = None) -> list[dict[str, Any]]:
        await self._threads.row(thread_id)
        rows = await self._storage.list_runs(thread_id, status=_status(status, _RUN_STATUSES, "run"), limit=limit,
                                             offset=offset)
        return selected([render_run(r) for r in rows], select, RUN_FIELDS, "run")

    async def cancel(self, thread_id: str, run_id: str, *, wait: bool = False, action: str = "interrupt",
                     headers: Headers = None, params: Params = None) -> None:
        cancel_action = _cancel_action(action)
        row = await self._row(thread_id, run_id)
        if row.status not in ("pending", "running"):
            raise NotFoundError("No matching runs to cancel. Please verify the thread ID and run IDs are correct, "
                                "and the runs haven't been deleted or completed.")
        await self._queue.cancel(row, cancel_action, wait=wait)

    async def cancel_many(self, *, thread_id: str | None = None, run_ids: Sequence[str] | None = None,
                          status: str | None = None, action: str = "interrupt", headers: Headers = None,
                          params: Params = None) -> None:
        """Cancel runs: a thread's ``run_ids``, or every run of a ``status`` (``pending``, ``running`` or
        ``all`` of both), as LangGraph's ``POST /runs/cancel``. :class:`NotFoundError` when none matches."""
        cancel_action = _cancel_action(action)
        await self._open()
        if status is not None:
            if thread_id is not None or run_ids is not None:
                raise InvalidRequestError("give either a status, or a thread_id with run_ids, not both")
            if status not in _BULK_CANCEL:
                raise InvalidRequestError(f"status must be 'pending', 'running' or 'all', not {status!r:.80}")
            rows = await self._storage.runs_with_status(_BULK_CANCEL[status])
        elif thread_id is not None and run_ids is not None:
            found = [await self._storage.get_run(run_id) for run_id in dict.fromkeys(run_ids)]
            rows = [r for r in found if r is not None and r.thread_id == thread_id]
        else:
            raise InvalidRequestError("give a status, or a thread_id with run_ids")
        if not rows:
            raise NotFoundError("No runs found to cancel.")
        # Pending runs first: cancelling a thread's running run first could start its next one in the gap.
        for row in sorted(rows, key=lambda r: r.status != "pending"):
            if row.status in ("pending", "running"):
                await self._queue.cancel(row, cancel_action)

    async def delete(self, thread_id: str, run_id: str, *, headers: Headers = None, params: Params = None) -> None:
        row = await self._row(thread_id, run_id)
        if row.status in ("pending", "running"):
            await self._queue.cancel(row, "interrupt", wait=True)
        thread = await self._threads.row(thread_id)
        await self._queue.checkpoints.delete_run(thread_id, run_id, self._registry.reducers_for(thread))
        await self._storage.delete_run(run_id)

    async def join(self, thread_id: str, run_id: str, *, headers: Headers = None,
                   params: Params = None) -> dict[str, Any]:
        """Wait for the run to end; returns the thread's final values (``__error__``/``__interrupt__`` if so)."""
        row = await self._row(thread_id, run_id)
        return await self.output(row.run_id)

    async def output(self, run_id: str) -> dict[str, Any]:
        """Wait for a run to end and return what :meth:`join` returns, for a run known to exist."""
        return await self._queue.output(await self._queue.wait_for(run_id))

    async def wait(self, thread_id: str | None, assistant_id: str, **options: Unpack[WaitOptions]) -> Any:
        """Create a run and wait for it; returns its final values like :meth:`join`."""
        unexpected_keywords("wait", options, WaitOptions)
        raise_error = options.pop("raise_error", True)
        on_disconnect = options.pop("on_disconnect", None)
        _check_on_disconnect(on_disconnect)
        run = await self._create(thread_id, assistant_id, options)
        async with self._cancelled_if_left(run, on_disconnect == "cancel"):
            result = await self.output(run["run_id"])
        error = result.get("__error__")
        if error is not None and raise_error:
            stream = self._streams.get(run["run_id"])
            if stream is not None and stream.exception is not None:
                raise stream.exception
            raise RuntimeError(f"{error['error']}: {error['message']}")
        return result

    async def _deliver(self, thread_id: str, assistant_id: str, message: HumanMessage) -> dict[str, Any]:
        await self._threads.row(thread_id)
        note = message.additional_kwargs["task_notification"]
        await self._mail.deliver(thread_id, message, key=f"{note['task_id']}:{note['run_id']}",
                                 assistant_id=assistant_id)
        active = await self._storage.active_runs(thread_id)
        taker = active[-1] if active else (await self._storage.list_runs(thread_id, limit=1))[0]
        return render_run(taker)

    def stream(self, thread_id: str | None, assistant_id: str,
               **options: Unpack[StreamOptions]) -> Batches[StreamPart]:
        """Create a run and yield its stream parts: ``metadata`` first, then each mode's parts, ``error`` on failure.

        Its :meth:`~backchannel.runtime.streams.Batches.batches` give them a list per wake, ``metadata`` alone first.
        """
        unexpected_keywords("stream", options, StreamOptions)
        _refuse(feedback_keys=options.pop("feedback_keys", None))
        if options.pop("version", "v1") != "v1":
            raise InvalidRequestError("only version 'v1' of the run stream is supported")
        on_disconnect = options.pop("on_disconnect", None)
        _check_on_disconnect(on_disconnect)
        cancel = on_disconnect == "cancel"
        return Batches(self._stream(thread_id, assistant_id, options, cancel_on_disconnect=cancel),
                       lambda sink, wire: self._push_stream(thread_id, assistant_id, options, sink, wire,
                                                            cancel_on_disconnect=cancel))

    async def _stream(self, thread_id: str | None, assistant_id: str, options: Mapping[str, Any], *,
                      cancel_on_disconnect: bool) -> AsyncGenerator[PartBatch, None]:
        run = await self._create(thread_id, assistant_id, options, watched=True)
        async with self._cancelled_if_left(run, cancel_on_disconnect):
            async for batch in self._follower.run(run, None, 0).batches():
                yield batch
        await self._after_stream(run)

    async def _push_stream(self, thread_id: str | None, assistant_id: str, options: Mapping[str, Any],
                           sink: Sink[StreamPart], wire: bool, *, cancel_on_disconnect: bool) -> None:
        # As _stream, the parts pushed (Batches.push): the reader's task waits once for the whole run.
        run = await self._create(thread_id, assistant_id, options, watched=True)
        async with self._cancelled_if_left(run, cancel_on_disconnect):
            await self._follower.run(run, None, 0).push(sink, wire=wire)
        await self._after_stream(run)

    async def _after_stream(self, run: Mapping[str, Any]) -> None:
        if run["kwargs"].get("temporary"):
            await self._queue.wait_for(run["run_id"])
            await self._queue.drop_thread(run["thread_id"])

    def join_stream(self, thread_id: str, run_id: str, *, cancel_on_disconnect: bool = False,
                    stream_mode: StreamModes | None = None, headers: Headers = None, params: Params = None,
                    last_event_id: str | None = None) -> Batches[StreamPart]:
        """Follow a run's stream: from the start (or after ``last_event_id``) if still kept, else from now on."""
        return Batches(self._join_stream(thread_id, run_id, stream_mode, last_event_id, cancel_on_disconnect),
                       lambda sink, wire: self._push_join(thread_id, run_id, stream_mode, last_event_id,
                                                          cancel_on_disconnect, sink, wire))

    async def _join_stream(self, thread_id: str, run_id: str, stream_mode: StreamModes | None,
                           last_event_id: str | None,
                           cancel_on_disconnect: bool) -> AsyncGenerator[PartBatch, None]:
        joined = await self._joined(thread_id, run_id, stream_mode, last_event_id)
        if joined is None:
            return
        async with self._cancelled_if_left({"run_id": run_id}, cancel_on_disconnect):
            async for batch in joined.batches():
                yield batch

    async def _push_join(self, thread_id: str, run_id: str, stream_mode: StreamModes | None,
                         last_event_id: str | None, cancel_on_disconnect: bool, sink: Sink[StreamPart],
                         wire: bool) -> None:
        joined = await self._joined(thread_id, run_id, stream_mode, last_event_id)
        if joined is None:
            return
        async with self._cancelled_if_left({"run_id": run_id}, cancel_on_disconnect):
            await joined.push(sink, wire=wire)

    async def _joined(self, thread_id: str, run_id: str, stream_mode: StreamModes | None,
                      last_event_id: str | None) -> Batches[StreamPart] | None:
        """The parts of the run's stream to join, or ``None`` when there is nothing to follow."""
        row = await self._row(thread_id, run_id)
        modes = None if stream_mode is None else check_stream_modes(
            [stream_mode] if isinstance(stream_mode, str) else stream_mode)
        after = event_position(last_event_id)
        stream = self._streams.get(row.run_id)
        if stream is None and self._queue.peers.shared and (row.status in ("pending", "running")
                                                            or row.kwargs.get("stream_resumable")):
            # The run executes (or executed) in another process: its executor relays its events here.
            stream = self._queue.peers.follow(row, wants_values(modes or row.kwargs.get("stream_mode") or ()))
        if stream is None or (not row.kwargs.get("stream_resumable") and last_event_id is None
                              and stream.finished):
            return None
        return self._follower.run(render_run(row), modes, after, with_metadata=False)

    @contextlib.asynccontextmanager
    async def _cancelled_if_left(self, run: Mapping[str, Any], cancel: bool) -> AsyncIterator[None]:
        """With ``cancel``, the run is cancelled if its reader goes away inside (cancelled, or closing the
        generator it reads)."""
        try:
            yield
        except (GeneratorExit, asyncio.CancelledError):
            if cancel:
                await self._cancel_quietly(run)
            raise

    async def _cancel_quietly(self, run: Mapping[str, Any]) -> None:
        row = await self._storage.get_run(run["run_id"])
        if row is not None and row.status in ("pending", "running"):
            await self._queue.cancel(row, "interrupt")


# What a cron passes on to each of its runs (runs.create's options).
_CRON_RUN_OPTIONS = ("input", "metadata", "config", "context", "checkpoint_during", "interrupt_before",
                     "interrupt_after", "webhook", "multitask_strategy", "stream_mode", "stream_subgraphs",
                     "stream_resumable", "durability")


class CronsClient:
    """Crons: runs started on a schedule (a cron expression, in UTC unless a timezone is given), on a thread or
    each on a thread of its own. Every runtime on the storage fires them, each tick once
    (:mod:`backchannel.runtime.crons`). A run a cron starts has the cron's metadata, and ``cron_id`` and
    ``cron_tick`` (the tick it was started for) in its metadata."""

    def __init__(self, open: Opener, storage: Storage, registry: Registry, catalog: AssistantCatalog,
                 threads: ThreadsClient, runs: RunsClient, kick: Callable[[], None]) -> None:
        self._open = open
        self._storage = storage
        self._registry = registry
        self._catalog = catalog
        self._threads = threads
        self._runs = runs
        self._kick = kick

    async def create(self, assistant_id: str, *, schedule: str, on_run_completed: str | None = None,
                     **options: Unpack[CronOptions]) -> dict[str, Any]:
        """A cron whose every run gets a new thread: deleted when the run ends (``on_run_completed="delete"``,
        the default) or kept (``"keep"``)."""
        unexpected_keywords("create", options, CronOptions)
        if on_run_completed not in (None, "delete", "keep"):
            raise InvalidRequestError(f"on_run_completed must be 'delete' or 'keep', not {on_run_completed!r:.80}")
        return await self._create(None, assistant_id, schedule, options, on_run_completed or "delete")

    async def create_for_thread(self, thread_id: str, assistant_id: str, *, schedule: str,
                                **options: Unpack[CronOptions]) -> dict[str, Any]:
        """A cron that runs on the thread (``multitask_strategy`` ``enqueue`` unless given); deleted with it."""
        unexpected_keywords("create_for_thread", options, CronOptions)
        await self._threads.row(thread_id)  # 404 for an unknown thread
        return await self._create(thread_id, assistant_id, schedule, options, None)

    async def _create(self, thread_id: str | None, assistant_id: str, schedule: str, options: Mapping[str, Any],
                      on_run_completed: str | None) -> dict[str, Any]:
        await self._open()
        given = {k: v for k, v in options.items() if v is not None}
        timezone = check_timezone(timezone_name(given.get("timezone")))
        run_options = {k: v for k, v in given.items() if k in _CRON_RUN_OPTIONS}
        assistant = await self._catalog.resolve(assistant_id)
        _checked_run(self._registry, assistant, run_options)
        now = datetime.now(UTC)
        row = CronRow(
            str(uuid.uuid4()), assistant.assistant_id, thread_id, check_schedule(schedule), timezone,
            utc_text(given["end_time"]) if "end_time" in given else None,
            to_jsonable({"assistant_id": assistant.assistant_id, "schedule": schedule, **run_options}),
            dict(given.get("metadata") or {}), on_run_completed, bool(given.get("enabled", True)),
            tick_text(next_tick(schedule, timezone, now)), now.isoformat(), now.isoformat())
        await self._storage.create_cron(row)
        self._kick()
        return render_cron(row)

    async def get(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return render_cron(await self._row(cron_id))

    async def _row(self, cron_id: str) -> CronRow:
        await self._open()
        row = await self._storage.get_cron(cron_id)
        if row is None:
            raise NotFoundError(f"Cron '{cron_id}' not found")
        return row

    async def update(self, cron_id: str, **changes: Unpack[CronUpdate]) -> dict[str, Any]:
        """Change a cron: its schedule, timezone, end, whether it is enabled, its runs' options (merged into
        those it has), metadata (merged). A new schedule or timezone, or enabling it, counts from now."""
        unexpected_keywords("update", changes, CronUpdate)
        given: dict[str, Any] = {k: v for k, v in changes.items() if v is not None and k not in ("headers", "params")}
        if not given and "end_time" not in changes:
            raise InvalidRequestError("give at least one field of the cron to change")
        row = await self._row(cron_id)
        reschedule = False
        if "schedule" in given:
            row.schedule, reschedule = check_schedule(given["schedule"]), True
        if "timezone" in given:
            row.timezone, reschedule = check_timezone(timezone_name(given["timezone"])), True
        if "end_time" in changes:
            row.end_time = utc_text(changes["end_time"]) if changes["end_time"] is not None else None
        if "enabled" in given:
            reschedule = reschedule or (given["enabled"] and not row.enabled)
            row.enabled = bool(given["enabled"])
        if "on_run_completed" in given:
            if row.thread_id is not None or given["on_run_completed"] not in ("delete", "keep"):
                raise InvalidRequestError("on_run_completed ('delete' or 'keep') is for crons without a thread")
            row.on_run_completed = given["on_run_completed"]
        if "metadata" in given:
            row.metadata = {**row.metadata, **given["metadata"]}
        payload = {**row.payload, **to_jsonable({k: v for k, v in given.items() if k in _CRON_RUN_OPTIONS})}
        _checked_run(self._registry, await self._catalog.resolve(row.assistant_id),
                     {k: v for k, v in payload.items() if k in _CRON_RUN_OPTIONS})
        row.payload = {**payload, "schedule": row.schedule}
        now = datetime.now(UTC)
        row.updated_at = now.isoformat()
        if reschedule:
            row.next_run_date = tick_text(next_tick(row.schedule, row.timezone, now))
        if not await self._storage.update_cron(row, reschedule=reschedule):
            raise NotFoundError(f"Cron '{cron_id}' not found")
        self._kick()
        return render_cron(await self._row(cron_id))

    async def delete(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> None:
        await self._open()
        if not await self._storage.delete_cron(cron_id):
            raise NotFoundError(f"Cron '{cron_id}' not found")

    async def search(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                     enabled: bool | None = None, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                     offset: int = 0, sort_by: str | None = None, sort_order: str | None = None,
                     select: Sequence[str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]:
        await self._open()
        if sort_by is not None and sort_by not in CRON_SORT:
            raise InvalidRequestError(f"cannot sort crons by {sort_by!r:.80}; use one of {list(CRON_SORT)}")
        rows = await self._storage.search_crons(
            assistant_id=self._assistant(assistant_id), thread_id=thread_id, enabled=enabled,
            metadata=dict(metadata or {}), limit=limit, offset=offset, sort_by=sort_by or "created_at",
            sort_order=sort_order or "desc")
        return selected([render_cron(r) for r in rows], select, CRON_FIELDS, "cron")

    async def count(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                    metadata: Mapping[str, Any] | None = None, headers: Headers = None,
                    params: Params = None) -> int:
        await self._open()
        return await self._storage.count_crons(assistant_id=self._assistant(assistant_id), thread_id=thread_id,
                                               metadata=dict(metadata or {}))

    def _assistant(self, assistant_id: str | None) -> str | None:
        """The assistant id crons store for a graph id or assistant id (as given if no agent has it now)."""
        if assistant_id is None:
            return None
        graph_id = self._registry.own_graph_of(assistant_id)
        return assistant_id_for(graph_id) if graph_id is not None else assistant_id

    async def start_run(self, cron: CronRow, tick: str) -> dict[str, Any]:
        """The run one tick of ``cron`` starts (what the runtime's cron loop calls)."""
        options: dict[str, Any] = {k: v for k, v in cron.payload.items() if k in _CRON_RUN_OPTIONS}
        options["metadata"] = {**cron.metadata, **(options.get("metadata") or {}), "cron_id": cron.cron_id,
                               "cron_tick": tick}
        if cron.thread_id is None:
            options["on_completion"] = cron.on_run_completed or "delete"
        else:
            options.setdefault("multitask_strategy", "enqueue")
        return await self._runs.create(cron.thread_id, cron.assistant_id, **options)


class StoreClient:
    """A key-value store shared by all threads, addressed by namespace tuples."""

    def __init__(self, open: Opener, storage: Storage, retention: Retention) -> None:
        self._open = open
        self._storage = storage
        self._retention = retention

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any],
                       index: bool | Sequence[str] | None = None, ttl: float | None = None,
                       headers: Headers = None, params: Params = None) -> None:
        """Store ``value`` under ``key`` (no item is indexed for semantic search here, whatever ``index`` says).

        With ``ttl`` (minutes; default: the store's ``default_ttl``), the item expires that long after it was
        written or last read with ``refresh_ttl``, and is then gone from reads and swept."""
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < 1e12):
            raise InvalidRequestError(f"ttl must be a positive number of minutes, not {ttl!r:.80}")
        await self._open()
        await self._storage.put_item(check_namespace(namespace), key, dict(value), self._retention.clock(),
                                     ttl=ttl if ttl is not None else self._retention.store.default_ttl)

    def _refresh(self, refresh_ttl: bool | None) -> bool:
        return self._retention.store.refresh_on_read if refresh_ttl is None else bool(refresh_ttl)

    async def get_item(self, namespace: Sequence[str], /, key: str, *, refresh_ttl: bool | None = None,
                       headers: Headers = None, params: Params = None) -> dict[str, Any] | None:
        """The item, or ``None`` (expired ones too); ``refresh_ttl`` (default: the store's ``refresh_on_read``)
        starts its time to live again."""
        await self._open()
        found = await self._storage.get_item(check_namespace(namespace), key, now=self._retention.clock(),
                                             refresh=self._refresh(refresh_ttl))
        return render_item(found) if found else None

    async def delete_item(self, namespace: Sequence[str], /, key: str, headers: Headers = None,
                          params: Params = None) -> None:
        await self._open()
        await self._storage.delete_item(check_namespace(namespace), key)

    async def search_items(self, namespace_prefix: Sequence[str], /, filter: Mapping[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, query: str | None = None,
                           refresh_ttl: bool | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]:
        await self._open()
        rows = await self._storage.search_items(check_namespace(namespace_prefix, allow_empty=True),
                                                filter=dict(filter or {}), limit=limit, offset=offset,
                                                now=self._retention.clock(), refresh=self._refresh(refresh_ttl))
        return {"items": [{**render_item(r), "score": None} for r in rows]}

    async def list_namespaces(self, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100, offset: int = 0,
                              headers: Headers = None, params: Params = None) -> dict[str, Any]:
        await self._open()
        found = await self._storage.list_namespaces(prefix=check_namespace(prefix or (), allow_empty=True),
                                                    suffix=check_namespace(suffix or (), allow_empty=True),
                                                    max_depth=max_depth, limit=limit, offset=offset)
        return {"namespaces": [list(ns) for ns in found]}


def _cancel_action(action: str) -> CancelAction:
    for known in _CANCEL_ACTIONS:
        if action == known:
            return known
    raise InvalidRequestError(f"cancel action must be 'interrupt' or 'rollback', not {action!r:.80}")


def _check_on_disconnect(value: str | None) -> None:
    if value not in (None, "cancel", "continue"):
        raise InvalidRequestError(f"on_disconnect must be 'cancel' or 'continue', not {value!r}")


def _checked_run(registry: Registry, assistant: AssistantRow, options: Mapping[str, Any], *,
                 watched: bool = False, once: bool = False) -> NewRun:
    """The run of ``assistant`` that ``options`` ask for, checked (nothing queued yet)."""
    run = _new_run(options, watched=watched, once=once, tools=registry.graphs[assistant.graph_id].tool_names())
    if run.webhook is not None:
        check_webhook_url(run.webhook)
    return run


def _new_run(options: Mapping[str, Any], *, watched: bool, once: bool, tools: Sequence[str]) -> NewRun:
    """The run ``runs.create``'s options ask for, checked."""
    _refuse(langsmith_tracing=options.get("langsmith_tracing"), strict_resume=options.get("strict_resume"))
    if options.get("durability") not in _DURABILITY:
        raise InvalidRequestError(f"durability must be 'sync', 'async' or 'exit', not {options['durability']!r}")
    stream_mode = options.get("stream_mode", "values")
    modes = [stream_mode] if isinstance(stream_mode, str) else list(stream_mode)
    check_run_arguments(modes, options.get("multitask_strategy"), options.get("if_not_exists"),
                        options.get("on_completion"), options.get("after_seconds"))
    command = normalize_command(options.get("command"))
    input = check_input(options.get("input"), command)
    iteration_limit(options.get("config"))  # a bad recursion_limit is refused now, not when the run starts
    return NewRun(
        input=input, command=command, stream_mode=modes, stream_subgraphs=bool(options.get("stream_subgraphs")),
        stream_resumable=bool(options.get("stream_resumable")), metadata=options.get("metadata"),
        config=options.get("config"), context=options.get("context"),
        checkpoint_id=options.get("checkpoint_id") or checkpoint_id_of(options.get("checkpoint")),
        multitask_strategy=options.get("multitask_strategy"), if_not_exists=options.get("if_not_exists"),
        on_completion=options.get("on_completion"), after_seconds=options.get("after_seconds"),
        timeout=options.get("timeout"), webhook=options.get("webhook"),
        concurrency_key=options.get("concurrency_key"), concurrency_limit=options.get("concurrency_limit"),
        interrupt_before=breakpoint_nodes(options.get("interrupt_before"), "interrupt_before", tools),
        interrupt_after=breakpoint_nodes(options.get("interrupt_after"), "interrupt_after", tools),
        watched=watched, once=once)
