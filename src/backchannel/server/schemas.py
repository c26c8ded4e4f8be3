"""Request bodies the server accepts, as pydantic models.

They validate each request (a bad body is a 422 that names the field) and
describe it in ``/openapi.json``. Field names and allowed values follow the
LangGraph API, so ``langgraph_sdk`` clients send exactly these. Unknown fields
are ignored, as newer clients send options this server does not use.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from backchannel.runtime.modes import StreamMode
from backchannel.runtime.run_options import MAX_DELAY
from backchannel.runtime.wire import MultitaskStrategy
from backchannel.server.routing import MAX_INT

MAX_MINUTES = 1e9  # a time to live beyond this (1,900 years) is a mistake

__all__ = [
    "AssistantCount", "AssistantCreate", "AssistantLatest", "AssistantPatch", "AssistantSearch", "AssistantVersions",
    "CheckpointConfig", "Command", "CronCount", "CronCreate", "CronPatch", "CronSearch", "EventStreamRequest",
    "HistorySearch", "ProtocolCommand", "RunBatch", "RunCreate", "RunsCancel", "Send", "ThreadCronCreate",
    "StateCheckpoint", "StateUpdate", "StoreDelete", "StoreNamespaces", "StorePut", "StoreSearch", "ThreadCount",
    "ThreadCreate", "ThreadPatch", "ThreadPrune", "ThreadSearch", "ThreadTTL",
]

# StreamMode and MultitaskStrategy are the runtime's own types, so a mode or strategy it adds is
# accepted (and documented) here too.


class Body(BaseModel):
    # Each body's validator is built at its first request rather than as the server starts.
    model_config = ConfigDict(extra="ignore", defer_build=True)


class CheckpointConfig(Body):
    thread_id: str | None = None
    checkpoint_ns: str | None = None
    checkpoint_id: str | None = None
    checkpoint_map: dict[str, Any] | None = None


class Send(Body):
    """Go to ``node`` with ``input`` added to the state."""

    node: str
    input: dict[str, Any] | None = None


class Command(Body):
    """LangGraph's Command: answer interrupts (``resume``), change the state (``update``), go to a step."""

    update: dict[str, Any] | list[Any] | None = None  # an object, or [key, value] pairs
    resume: Any = None
    goto: str | Send | list[str | Send] | None = None


class RunCreate(Body):
    """A run: stateful (on a thread) or stateless, created, streamed or waited for."""

    assistant_id: str = Field(min_length=1)
    input: dict[str, Any] | list[Any] | str | None = None
    command: Command | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    checkpoint: CheckpointConfig | None = None
    checkpoint_id: str | None = None
    stream_mode: StreamMode | list[StreamMode] = "values"
    stream_subgraphs: bool = False
    stream_resumable: bool = False
    multitask_strategy: MultitaskStrategy | None = None
    if_not_exists: Literal["reject", "create"] | None = None
    on_completion: Literal["delete", "keep"] | None = None
    on_disconnect: Literal["cancel", "continue"] = "continue"
    after_seconds: float | None = Field(default=None, ge=0, le=MAX_DELAY)
    webhook: str | None = Field(default=None, min_length=1, max_length=65536)
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None


class RunBatch(RootModel[list[RunCreate]]):
    """Stateless runs to queue together (at least one)."""

    model_config = ConfigDict(defer_build=True)
    root: list[RunCreate] = Field(min_length=1)


class RunsCancel(Body):
    """Runs to cancel: a thread's ``run_ids``, or every run of a ``status``."""

    thread_id: str | None = None
    run_ids: list[str] | None = None
    status: Literal["pending", "running", "all"] | None = None


class _CronRuns(Body):
    """What a cron's runs get, as a run's options."""

    input: dict[str, Any] | list[Any] | str | None = None
    metadata: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    webhook: str | None = Field(default=None, min_length=1, max_length=65536)
    interrupt_before: Literal["*"] | list[str] | None = None
    interrupt_after: Literal["*"] | list[str] | None = None
    stream_mode: StreamMode | list[StreamMode] | None = None
    stream_subgraphs: bool | None = None
    stream_resumable: bool | None = None
    durability: Literal["sync", "async", "exit"] | None = None


class ThreadCronCreate(_CronRuns):
    """A cron that runs on a thread: ``schedule`` is a cron expression (UTC unless ``timezone``)."""

    assistant_id: str = Field(min_length=1)
    schedule: str
    timezone: str | None = None
    end_time: str | None = None
    enabled: bool | None = None
    multitask_strategy: MultitaskStrategy | None = None
    checkpoint_during: bool | None = None


class CronCreate(ThreadCronCreate):
    """A cron whose every run gets a new thread, deleted after the run unless ``on_run_completed`` is keep."""

    on_run_completed: Literal["delete", "keep"] | None = None


class CronPatch(_CronRuns):
    """What to change in a cron (``end_time: null`` clears it)."""

    schedule: str | None = None
    timezone: str | None = None
    end_time: str | None = None
    enabled: bool | None = None
    on_run_completed: Literal["delete", "keep"] | None = None


class CronSearch(Body):
    assistant_id: str | None = None
    thread_id: str | None = None
    enabled: bool | None = None
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)
    sort_by: Literal["cron_id", "assistant_id", "thread_id", "next_run_date", "end_time", "created_at",
                     "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class CronCount(Body):
    assistant_id: str | None = None
    thread_id: str | None = None
    metadata: dict[str, Any] | None = None


class ThreadTTL(Body):
    """A thread's time to live: ``ttl`` minutes after its last update, ``strategy`` applies."""

    model_config = ConfigDict(extra="forbid")
    strategy: Literal["delete", "keep_latest"] = "delete"
    ttl: float = Field(gt=0, le=MAX_MINUTES)


class ThreadCreate(Body):
    thread_id: str | None = Field(default=None, min_length=1)
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    graph_id: str | None = None
    ttl: ThreadTTL | None = None


class ThreadPatch(Body):
    metadata: dict[str, Any] | None = None
    ttl: ThreadTTL | None = None


class ThreadPrune(Body):
    thread_ids: list[str] = Field(max_length=10_000)
    strategy: Literal["delete", "keep_latest"] = "delete"


class ThreadSearch(Body):
    ids: list[str] | None = None
    metadata: dict[str, Any] | None = None
    values: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)
    sort_by: Literal["thread_id", "status", "created_at", "updated_at", "state_updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class ThreadCount(Body):
    metadata: dict[str, Any] | None = None
    status: Literal["idle", "busy", "interrupted", "error"] | None = None


class StateUpdate(Body):
    values: dict[str, Any] | list[Any] | None = None
    as_node: str | None = None
    checkpoint: CheckpointConfig | None = None
    checkpoint_id: str | None = None


class StateCheckpoint(Body):
    checkpoint: dict[str, Any]  # {"checkpoint_id", ...} or a config: {"configurable": {"checkpoint_id"}}
    subgraphs: bool = False
    select: list[str] | None = None


class HistorySearch(Body):
    limit: int = Field(default=10, ge=1, le=1000)
    before: dict[str, Any] | str | None = None  # a checkpoint id, a checkpoint, or a config with one
    metadata: dict[str, Any] | None = None
    checkpoint: dict[str, Any] | None = None
    select: list[str] | None = None


class AssistantSearch(Body):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)
    sort_by: Literal["assistant_id", "graph_id", "name", "created_at", "updated_at"] | None = None
    sort_order: Literal["asc", "desc"] | None = None
    select: list[str] | None = None


class AssistantCreate(Body):
    """A new assistant: a served graph with a config, context and metadata of its own."""

    graph_id: str = Field(min_length=1)
    assistant_id: str | None = None  # a UUID; a new one when not given
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    if_exists: Literal["raise", "do_nothing"] | None = None
    name: str | None = None
    description: str | None = None


class AssistantPatch(Body):
    """An assistant's next version: the fields given changed (``metadata`` merged into its own)."""

    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None


class AssistantVersions(Body):
    metadata: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)


class AssistantLatest(Body):
    version: int = Field(ge=1, le=MAX_INT)


class AssistantCount(Body):
    metadata: dict[str, Any] | None = None
    graph_id: str | None = None
    name: str | None = None


class StorePut(Body):
    namespace: list[str] = Field(min_length=1)
    key: str = Field(min_length=1)
    value: dict[str, Any]
    index: bool | list[str] | None = None
    ttl: float | None = Field(default=None, gt=0, le=MAX_MINUTES)


class StoreDelete(Body):
    namespace: list[str] = Field(min_length=1)
    key: str = Field(min_length=1)


class StoreSearch(Body):
    namespace_prefix: list[str] | None = None
    filter: dict[str, Any] | None = None
    limit: int = Field(default=10, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)
    query: str | None = None
    refresh_ttl: bool | None = None


class StoreNamespaces(Body):
    prefix: list[str] | None = None
    suffix: list[str] | None = None
    max_depth: int | None = Field(default=None, ge=1)
    limit: int = Field(default=100, ge=1, le=1000)
    offset: int = Field(default=0, ge=0, le=MAX_INT)


class ProtocolCommand(Body):
    """A protocol command: ``{"id", "method", "params"}``."""

    id: int
    method: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class EventStreamRequest(Body):
    """What a thread's event stream carries: ``channels`` (values, updates, messages, tools, lifecycle, input,
    tasks, checkpoints, custom or custom:<name>), optional ``namespaces`` (prefixes) and ``depth`` below them,
    and ``since``: the last ``seq`` the client has (events after it are replayed)."""

    channels: list[str] = Field(min_length=1)
    namespaces: list[list[str]] | None = None
    depth: int | None = Field(default=None, ge=0)
    since: int | None = Field(default=None, ge=0)
