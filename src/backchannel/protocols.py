"""The runtime's surface as protocols: what agents, tools and clients may rely on, whichever transport.

:class:`Runtime` is the LangGraph SDK client's surface (``assistants``,
``threads``, ``runs``, ``store``); both
:class:`~backchannel.runtime.local.LocalRuntime` (in process) and
:class:`~backchannel.runtime.remote.RemoteRuntime` (over HTTP) satisfy it.
:class:`HostRuntime` adds what a run's own runtime offers the agent, its tools
and its middleware (a ``LocalRuntime``): delivering messages, running agents
on threads, and work beside the runs.

This module sits below the agent, so the agent layer is typed against it
without importing the runtime; it names the agent only for type checking.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypedDict, Unpack

from backchannel.events import EventBus
from backchannel.messages import AnyMessage

if TYPE_CHECKING:
    from typing import Self

    from backchannel.agent import Agent

__all__ = ["AssistantsAPI", "CronFields", "CronOptions", "CronUpdate", "CronsAPI", "HostRunsAPI", "HostRuntime",
           "RunOptions", "RunsAPI", "Runtime", "StoreAPI", "StreamOptions", "StreamPart", "ThreadsAPI", "WaitOptions",
           "unexpected_keywords", "timezone_name"]

Headers = Mapping[str, str] | None
Params = Mapping[str, Any] | None
Checkpoint = Mapping[str, Any] | None
StreamModes = str | Sequence[str]


class StreamPart(NamedTuple):
    """One part of a run's stream, as ``langgraph_sdk`` yields it."""

    event: str
    data: Any
    id: str | None = None


class AssistantsAPI(Protocol):
    """Assistants: each served graph's own, and those made from a graph with a config and context of their own
    (versioned: an update adds a version, ``set_latest`` goes back to one)."""

    async def get(self, assistant_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]: ...

    async def create(self, graph_id: str | None, config: Mapping[str, Any] | None = None, *,
                     context: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
                     assistant_id: str | None = None, if_exists: str | None = None, name: str | None = None,
                     headers: Headers = None, description: str | None = None,
                     params: Params = None) -> dict[str, Any]: ...

    async def update(self, assistant_id: str, *, graph_id: str | None = None,
                     config: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                     metadata: Mapping[str, Any] | None = None, name: str | None = None, headers: Headers = None,
                     description: str | None = None, params: Params = None) -> dict[str, Any]: ...

    async def delete(self, assistant_id: str, *, delete_threads: bool = False, headers: Headers = None,
                     params: Params = None) -> None: ...

    async def search(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                     name: str | None = None, limit: int = 10, offset: int = 0, sort_by: str | None = None,
                     sort_order: str | None = None, select: Sequence[str] | None = None,
                     response_format: str = "array", headers: Headers = None, params: Params = None) -> Any:
        """A list of assistants; ``response_format="object"``: ``{"assistants": [...], "next": offset or None}``."""

    async def count(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                    name: str | None = None, headers: Headers = None, params: Params = None) -> int: ...

    async def get_versions(self, assistant_id: str, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]: ...

    async def set_latest(self, assistant_id: str, version: int, *, headers: Headers = None,
                         params: Params = None) -> dict[str, Any]: ...

    async def get_graph(self, assistant_id: str, *, xray: int | bool = False, headers: Headers = None,
                        params: Params = None) -> dict[str, Any]: ...

    async def get_schemas(self, assistant_id: str, *, headers: Headers = None,
                          params: Params = None) -> dict[str, Any]: ...

    async def get_subgraphs(self, assistant_id: str, namespace: str | None = None, recurse: bool = False, *,
                            headers: Headers = None, params: Params = None) -> dict[str, Any]: ...


class ThreadsAPI(Protocol):
    """Threads: conversations with their state, history and metadata."""

    async def create(self, *, metadata: Mapping[str, Any] | None = None, thread_id: str | None = None,
                     if_exists: str | None = None, supersteps: Sequence[Any] | None = None,
                     graph_id: str | None = None, ttl: int | Mapping[str, Any] | None = None,
                     headers: Headers = None, params: Params = None) -> dict[str, Any]: ...

    async def get(self, thread_id: str, *, include: Sequence[str] | None = None, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]: ...

    async def update(self, thread_id: str, *, metadata: Mapping[str, Any], ttl: int | Mapping[str, Any] | None = None,
                     return_minimal: bool = False, headers: Headers = None,
                     params: Params = None) -> dict[str, Any]: ...

    async def delete(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> None: ...

    async def prune(self, thread_ids: Sequence[str], *, strategy: str = "delete", headers: Headers = None,
                    params: Params = None) -> dict[str, Any]: ...

    async def search(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                     ids: Sequence[str] | None = None, status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_by: str | None = None, sort_order: str | None = None, select: Sequence[str] | None = None,
                     extract: Mapping[str, str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]: ...

    async def count(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                    status: str | None = None, headers: Headers = None, params: Params = None) -> int: ...

    async def copy(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]: ...

    async def get_state(self, thread_id: str, checkpoint: Checkpoint = None, checkpoint_id: str | None = None, *,
                        subgraphs: bool = False, select: Sequence[str] | None = None, headers: Headers = None,
                        params: Params = None) -> dict[str, Any]: ...

    async def update_state(self, thread_id: str, values: Mapping[str, Any] | Sequence[Any] | None, *,
                           as_node: str | None = None, checkpoint: Checkpoint = None,
                           checkpoint_id: str | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]: ...

    async def get_history(self, thread_id: str, *, limit: int = 10, before: str | Checkpoint = None,
                          metadata: Mapping[str, Any] | None = None, checkpoint: Checkpoint = None,
                          select: Sequence[str] | None = None, headers: Headers = None,
                          params: Params = None) -> list[dict[str, Any]]: ...


class RunOptions(TypedDict, total=False):
    """The keyword arguments of ``runs.create``: LangGraph's, and backchannel's last three.

    ``timeout`` (seconds) ends a run with status ``timeout``; runs sharing a
    ``concurrency_key`` run at most ``concurrency_limit`` at a time.
    """

    input: Any
    command: Mapping[str, Any] | None
    stream_mode: StreamModes
    stream_subgraphs: bool
    stream_resumable: bool
    metadata: Mapping[str, Any] | None
    config: Mapping[str, Any] | None
    context: Any
    checkpoint: Checkpoint
    checkpoint_id: str | None
    checkpoint_during: bool | None
    interrupt_before: str | Sequence[str] | None
    interrupt_after: str | Sequence[str] | None
    webhook: str | None
    multitask_strategy: str | None
    if_not_exists: str | None
    on_completion: str | None
    after_seconds: float | None
    langsmith_tracing: Mapping[str, Any] | None
    headers: Headers
    params: Params
    on_run_created: Callable[[dict[str, Any]], None] | None
    durability: str | None
    strict_resume: bool | None
    timeout: float | None
    concurrency_key: str | None
    concurrency_limit: int | None


class StreamOptions(RunOptions, total=False):
    """The keyword arguments of ``runs.stream``: those of ``runs.create``, and these."""

    feedback_keys: Sequence[str] | None
    on_disconnect: str | None
    version: str


class WaitOptions(RunOptions, total=False):
    """The keyword arguments of ``runs.wait``: those of ``runs.create``, and these."""

    on_disconnect: str | None
    raise_error: bool


class CronFields(TypedDict, total=False):
    """What ``crons.create``, ``create_for_thread`` and ``update`` take alike: the runs' options, and when the
    cron runs (``end_time`` a datetime or ISO 8601; ``timezone`` an IANA name or a ``tzinfo``)."""

    input: Any
    metadata: Mapping[str, Any] | None
    config: Mapping[str, Any] | None
    context: Any
    interrupt_before: str | Sequence[str] | None
    interrupt_after: str | Sequence[str] | None
    webhook: str | None
    stream_mode: StreamModes | None
    stream_subgraphs: bool | None
    stream_resumable: bool | None
    durability: str | None
    end_time: datetime | str | None
    enabled: bool | None
    timezone: str | tzinfo | None
    headers: Headers
    params: Params


class CronOptions(CronFields, total=False):
    """The keyword arguments of ``crons.create`` and ``crons.create_for_thread`` beside ``schedule``."""

    checkpoint_during: bool | None
    multitask_strategy: str | None


class CronUpdate(CronFields, total=False):
    """The keyword arguments of ``crons.update``: what to change (``end_time=None`` clears it)."""

    schedule: str | None
    on_run_completed: str | None


def timezone_name(timezone: str | tzinfo | None) -> str | None:
    """A cron's timezone as the API takes it, an IANA name, from a name or a ``tzinfo`` (as ``langgraph_sdk``)."""
    if timezone is None or isinstance(timezone, str):
        return timezone
    key = getattr(timezone, "key", None)
    return key if isinstance(key, str) else timezone.tzname(None)


def unexpected_keywords(function: str, given: Mapping[str, Any], accepted: type) -> None:
    """Raise :class:`TypeError` as Python does for keywords a function does not take (``accepted``:
    a TypedDict of them), so a misspelt option fails instead of being ignored."""
    known = accepted.__required_keys__ | accepted.__optional_keys__  # type: ignore[attr-defined]
    for name in given:
        if name not in known:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")


class RunsAPI(Protocol):
    """Runs: one agent execution on a thread, queued, streamed, awaited or cancelled."""

    async def create(self, thread_id: str | None, assistant_id: str,
                     **options: Unpack[RunOptions]) -> dict[str, Any]: ...

    async def create_batch(self, payloads: Sequence[Mapping[str, Any]], *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]: ...

    def stream(self, thread_id: str | None, assistant_id: str,
               **options: Unpack[StreamOptions]) -> AsyncIterator[StreamPart]: ...

    async def wait(self, thread_id: str | None, assistant_id: str, **options: Unpack[WaitOptions]) -> Any: ...

    async def get(self, thread_id: str, run_id: str, *, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]: ...

    async def list(self, thread_id: str, *, limit: int = 10, offset: int = 0, status: str | None = None,
                   select: Sequence[str] | None = None, headers: Headers = None,
                   params: Params = None) -> list[dict[str, Any]]: ...

    async def cancel(self, thread_id: str, run_id: str, *, wait: bool = False, action: str = "interrupt",
                     headers: Headers = None, params: Params = None) -> None: ...

    async def delete(self, thread_id: str, run_id: str, *, headers: Headers = None, params: Params = None) -> None: ...

    async def join(self, thread_id: str, run_id: str, *, headers: Headers = None,
                   params: Params = None) -> dict[str, Any]: ...

    def join_stream(self, thread_id: str, run_id: str, *, cancel_on_disconnect: bool = False,
                    stream_mode: StreamModes | None = None, headers: Headers = None, params: Params = None,
                    last_event_id: str | None = None) -> AsyncIterator[StreamPart]: ...

    async def cancel_many(self, *, thread_id: str | None = None, run_ids: Sequence[str] | None = None,
                          status: str | None = None, action: str = "interrupt", headers: Headers = None,
                          params: Params = None) -> None: ...


class HostRunsAPI(RunsAPI, Protocol):
    """A host runtime's runs: LangGraph's, and one of backchannel's own."""

    async def create_once(self, thread_id: str, assistant_id: str,
                          **options: Unpack[RunOptions]) -> dict[str, Any]:
        """As ``create``, except on a thread that exists already: then its first run, the one an earlier
        identical call made (a tool call made again after a crash finds the run it started)."""


class StoreAPI(Protocol):
    """A key-value store shared by all threads, addressed by namespace tuples."""

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any],
                       index: bool | Sequence[str] | None = None, ttl: int | None = None,
                       headers: Headers = None, params: Params = None) -> None: ...

    async def get_item(self, namespace: Sequence[str], /, key: str, *, refresh_ttl: bool | None = None,
                       headers: Headers = None, params: Params = None) -> dict[str, Any] | None: ...

    async def delete_item(self, namespace: Sequence[str], /, key: str, headers: Headers = None,
                          params: Params = None) -> None: ...

    async def search_items(self, namespace_prefix: Sequence[str], /, filter: Mapping[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, query: str | None = None,
                           refresh_ttl: bool | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]: ...

    async def list_namespaces(self, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100, offset: int = 0,
                              headers: Headers = None, params: Params = None) -> dict[str, Any]: ...


class CronsAPI(Protocol):
    """Crons: runs started on a schedule, on a new thread each time or on one thread."""

    async def create(self, assistant_id: str, *, schedule: str, on_run_completed: str | None = None,
                     **options: Unpack[CronOptions]) -> dict[str, Any]: ...

    async def create_for_thread(self, thread_id: str, assistant_id: str, *, schedule: str,
                                **options: Unpack[CronOptions]) -> dict[str, Any]: ...

    async def get(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]: ...

    async def update(self, cron_id: str, **changes: Unpack[CronUpdate]) -> dict[str, Any]: ...

    async def delete(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> None: ...

    async def search(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                     enabled: bool | None = None, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                     offset: int = 0, sort_by: str | None = None, sort_order: str | None = None,
                     select: Sequence[str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]: ...

    async def count(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                    metadata: Mapping[str, Any] | None = None, headers: Headers = None,
                    params: Params = None) -> int: ...


class Runtime(Protocol):
    """The LangGraph SDK client's surface, in process or over HTTP."""

    @property
    def assistants(self) -> AssistantsAPI: ...

    @property
    def threads(self) -> ThreadsAPI: ...

    @property
    def runs(self) -> RunsAPI: ...

    @property
    def store(self) -> StoreAPI: ...

    @property
    def crons(self) -> CronsAPI: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...


class HostRuntime(Runtime, Protocol):
    """The runtime a run executes in (a ``LocalRuntime``), as its agent, tools and middleware see it."""

    @property
    def runs(self) -> HostRunsAPI: ...

    @property
    def public_url(self) -> str | None:
        """Where other servers reach this runtime (``None``: they cannot call back)."""

    def graph_id_for_agent(self, agent: Agent) -> str:
        """The graph id ``agent`` is registered under (registering it if new)."""

    def run_events(self, run_id: str) -> EventBus | None:
        """The event bus of a run queued or executing in this process, to follow it from inside another."""

    async def deliver(self, thread_id: str, message: AnyMessage, *, key: str,
                      assistant_id: str | None = None) -> bool:
        """Give ``message`` to a thread once per ``key``: into its active run, or by waking it."""

    async def deliver_remote(self, url: str, thread_id: str, message: AnyMessage, *, key: str,
                             assistant_id: str | None = None) -> None:
        """Give ``message`` to a thread on the server at ``url`` once per ``key``, retried until it takes it."""

    async def invoke(self, agent: Agent, thread_id: str, input: Any, *, context: Any = None,
                     metadata: Mapping[str, Any] | None = None, bus: EventBus | None = None) -> dict[str, Any]:
        """Run ``agent`` on a thread (created if new) and return its final state."""

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Run ``coro`` beside the runs (cancelled when the runtime closes)."""
