"""Tracing: what a run did, as spans, kept with the run and sent to OpenTelemetry when it is set up.

Every run records, as it goes, a span for itself, for each model call (with
its token usage), each tool call, each subagent it runs to completion and
each background-task notification it takes in. The runtime keeps them with
the run: the run's ``usage`` and the thread's timeline come from them. This
costs well under a microsecond per step.

With OpenTelemetry set up (``pip install 'backchannel[otel]'``), the same
spans are exported, each as its run or call ends (the SDK makes it off the
event loop: ``_otel_span.py``), named and attributed as the GenAI semantic
conventions say::

    invoke_agent supervisor              a run (gen_ai.agent.name, gen_ai.conversation.id = the thread)
      chat gpt-4o-mini                   a model call (gen_ai.request.model, gen_ai.usage.input_tokens, ...)
      execute_tool task                  a tool call (gen_ai.tool.name, gen_ai.tool.call.id)
        invoke_agent researcher          a subagent, under the tool call that ran it
      execute_tool start_async_task
        invoke_agent analyst             a background task's run: in this process, another one or another server
      task_notification analyst          the task's notification, taken in by the supervisor; linked to its run

A run's W3C trace context travels in its ``config["configurable"]``
(``traceparent``), so a background task's run continues the trace of the
tool call that started it wherever it runs; a notification carries its
task run's context, for the link.

Set up by the standard ``OTEL_*`` environment variables: when nothing in the
process has set up OpenTelemetry's SDK, ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
``OTEL_TRACES_EXPORTER``) makes backchannel do it (OTLP over HTTP unless
``OTEL_EXPORTER_OTLP_PROTOCOL`` says ``grpc``; ``OTEL_SERVICE_NAME``,
``OTEL_BSP_*``, ``OTEL_TRACES_SAMPLER`` as the SDK reads them). Or in code,
with :func:`configure_tracing`. Message contents (prompts, replies, tool
arguments and results) are recorded only with
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`` or
``configure_tracing(capture_message_content=True)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from backchannel._version import __version__
from backchannel.interrupts import GraphInterrupt
from backchannel.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage, text_of
from backchannel.usage import add_call, empty_usage

if TYPE_CHECKING:
    from backchannel.agent import RunResult
    from backchannel.context import RunContext
    from backchannel.models.base import ModelRequest
    from backchannel.tools import Tool

__all__ = ["RunSpan", "Trace", "configure_tracing", "continued_from", "trace_context", "with_trace_context"]

logger = logging.getLogger("backchannel")

_ERROR_TEXT_LIMIT = 300
_CAPTURE_VALUES = frozenset({"true", "1", "yes", "span_only", "span_and_event"})


# -- what a run records ------------------------------------------------------------


class RunSpan:
    """One agent run's span: where it nests, and how it ended once it has."""

    __slots__ = ("parent", "name", "cause", "start", "end", "status", "error", "usage", "otel")

    def __init__(self, parent: RunSpan | None, name: str, cause: str | None) -> None:
        self.parent = parent
        self.name = name
        self.cause = cause  # the id of the tool call that runs it (a subagent)
        self.start = time.time()
        self.end: float | None = None
        self.status = "running"
        self.error: BaseException | None = None
        self.usage: dict[str, Any] | None = None  # worked out as it ends (a live subagent keeps no empty one)
        self.otel: Any = None


_PER_CALL = 7  # entries of Trace.calls a finished call takes


class Trace:
    """The spans of one run and of the subagents it runs to completion (their contexts share it).

    While the run goes on, a finished call is ``_PER_CALL`` entries of ``calls``, ``kind, run, start, end,
    subject, outcome, error`` (the model's name and its reply, or the tool call and its result
    message): no tuple per call, since a thousand live subagents each keep theirs. What they mean
    (statuses, usage) is worked out when asked, so a step costs little.
    """

    __slots__ = ("calls", "runs", "on", "_otel")

    def __init__(self, *, kept: bool = True) -> None:
        self.calls: list[Any] = []
        self.runs: list[RunSpan] = []  # in the order they started: the first is the root
        self._otel = _otel()  # None: OpenTelemetry is off
        # Whether anything is recorded: ``kept=False`` when nobody will read the record (a run
        # outside a runtime that nobody streams), so then it costs nothing unless OpenTelemetry is on.
        self.on = kept or self._otel is not None

    @property
    def usage(self) -> dict[str, Any]:
        """The tokens the root run used, its subagents included (and counted separately)."""
        usage = self.runs[0].usage if self.runs else None
        return usage if usage is not None else empty_usage()

    def start_run(self, ctx: RunContext, agent_name: str | None, model: Any) -> RunSpan:
        """Open an agent run's span (ended by :meth:`end_run`); a subagent's nests under the tool call that runs it.

        An unnamed agent is named as the runtime registered it (its graph id), else ``agent``. The agent opens
        and ends it in its own frame: a wrapper coroutine would stay suspended for the whole run.
        """
        parent = ctx.parent.span if ctx.parent is not None else None
        name = agent_name or (ctx.metadata.get("graph_id") if parent is None else None) or "agent"
        cause = ctx.namespace[-1].partition(":")[2] if parent is not None and ctx.namespace else None
        span = ctx.span = RunSpan(parent, name, cause)
        self.runs.append(span)
        if self._otel is not None:
            span.otel = self._otel.start(f"invoke_agent {name}", _INTERNAL, _agent_attributes(ctx, name, model))
        return span

    async def end_run(self, ctx: RunContext, span: RunSpan, result: RunResult | None,
                      error: BaseException | None) -> None:
        """End a run's span with its ``result``, or the ``error`` it raised."""
        if error is not None:
            self._end_run(span, _status_of(error, ctx.deadline is not None), error)
            if isinstance(error, asyncio.CancelledError):
                return  # a cancelled run stops at once
        else:
            assert result is not None
            self._end_run(span, result.status, None)
        await self._exported(span)

    async def _exported(self, span: RunSpan) -> None:
        """A run's spans are with OpenTelemetry's processors by the time it returns (those of its subagents with
        its own)."""
        if self._otel is not None and span.parent is None:
            await self._otel.made()

    def _end_run(self, span: RunSpan, status: str, error: BaseException | None) -> None:
        span.status, span.error, span.end = status, error, time.time()
        span.usage = self.usage_of(span)
        if self._otel is not None:
            self._otel.end(span.otel, status, error, _usage_attributes(span.usage), record=status == "error")

    def usage_of(self, run: RunSpan) -> dict[str, Any]:
        """The tokens of ``run``'s model calls and its subagents' (these also by subagent)."""
        total = empty_usage()
        calls = self.calls
        for kind, owner, reply in zip(calls[::_PER_CALL], calls[1::_PER_CALL], calls[5::_PER_CALL]):
            if kind != _MODEL or reply is None:
                continue
            if owner is run:
                add_call(total, reply.usage_metadata)
                continue
            while owner is not None and owner.parent is not run:
                owner = owner.parent
            if owner is not None:  # a call of the subagent ``owner`` (or of one it ran)
                add_call(total, reply.usage_metadata, owner.name)
        return total

    def start_model(self, request: ModelRequest) -> tuple[float, Any]:
        """A model call's span opened: what :meth:`end_model` needs. The agent awaits the call in its own frame
        between the two: a wrapping coroutine would be one more frame resumed with every token the model streams."""
        otel = self._otel
        return time.time(), otel.start_chat(request) if otel is not None else None

    def end_model(self, ctx: RunContext, request: ModelRequest, opened: tuple[float, Any],
                  message: AIMessage | None, error: BaseException | None) -> None:
        """Record a model call that replied ``message`` or raised ``error``, and end its span."""
        start, handle = opened
        self.calls += (_MODEL, ctx.span, start, time.time(), request.model.name, message, error)
        if self._otel is not None:
            if error is None:
                self._otel.end_chat(handle, message, "success", None)
            else:
                self._otel.end_chat(handle, None, _status_of(error, ctx.deadline is not None), error)

    def start_tool(self, call: Mapping[str, Any], tool: Tool | None) -> tuple[float, Any]:
        """A tool call's span opened: what :meth:`end_tool` needs (the call awaits its tool in its own frame)."""
        otel = self._otel
        return time.time(), otel.start_tool(call, tool) if otel is not None else None

    def end_tool(self, ctx: RunContext, call: Mapping[str, Any], opened: tuple[float, Any],
                 message: ToolMessage | None, error: BaseException | None) -> None:
        """Record a tool call that gave its result ``message`` or raised ``error``, and end its span."""
        start, handle = opened
        self.calls += (_TOOL, ctx.span, start, time.time(), call, message, error)
        if self._otel is not None:
            status, text = _tool_status(message, error, ctx.deadline is not None)
            self._otel.end_tool(handle, message, status, error, text)

    def took_notifications(self, ctx: RunContext, messages: Sequence[AnyMessage]) -> None:
        """Record the background-task notifications among ``messages``, just taken into the run."""
        if not self.on:
            return
        now = time.time()
        for message in messages:
            note = message.additional_kwargs.get("task_notification") if isinstance(message, HumanMessage) else None
            if note is not None:
                self.calls += (_NOTIFICATION, ctx.span, now, now, note, None, None)
                if self._otel is not None:
                    self._otel.notification(note)

    def _each_call(self) -> Iterator[tuple[Any, ...]]:
        """The finished calls as ``(kind, run, start, end, subject, outcome, error)``."""
        calls = self.calls
        return zip(*(calls[i::_PER_CALL] for i in range(_PER_CALL)))

    # -- reading them out

    def span_dicts(self) -> list[dict[str, Any]]:
        """The spans of the runs that ended and of their calls, as JSON-ready dicts: ``id``, ``parent`` (the
        parent's id; a subagent's run nests under the tool call that ran it), ``kind`` (run, model, tool,
        notification), ``name``, ``start`` and ``end`` (epoch seconds), ``status``, ``error``, and per kind
        ``usage``, ``tool_call_id`` or the notification's ``task_id``, ``task_run_id``, ``task_status``."""
        runs = [r for r in self.runs if r.end is not None]
        run_ids = {id(r): i for i, r in enumerate(runs)}
        out: list[dict[str, Any]] = [_run_dict(i, r, run_ids) for i, r in enumerate(runs)]
        tool_ids: dict[tuple[int, str], int] = {}  # (its run, call id) -> a tool call's id
        for kind, owner, start, end, subject, outcome, error in self._each_call():
            if id(owner) in run_ids:
                item = _call_dict(kind, owner, subject, outcome, error)
                item.update(id=len(out), parent=run_ids[id(owner)], start=start, end=end)
                if kind == _TOOL:
                    tool_ids[(id(owner), subject["id"])] = item["id"]
                out.append(item)
        for run, item in zip(runs, out):
            if run.cause is not None and run.parent is not None:
                item["parent"] = tool_ids.get((id(run.parent), run.cause), item["parent"])
        return out


_RUN, _MODEL, _TOOL, _NOTIFICATION = "run", "model", "tool", "notification"


def _run_dict(index: int, run: RunSpan, run_ids: Mapping[int, int]) -> dict[str, Any]:
    item: dict[str, Any] = {"id": index, "parent": run_ids.get(id(run.parent)), "kind": _RUN, "name": run.name,
                            "start": run.start, "end": run.end, "status": run.status, "usage": run.usage}
    if run.cause is not None:
        item["tool_call_id"] = run.cause
    if run.error is not None and _error_text(run.error):
        item["error"] = _error_text(run.error)
    return item


def _call_dict(kind: str, run: RunSpan, subject: Any, outcome: Any, error: BaseException | None) -> dict[str, Any]:
    """What a recorded call was: its kind, name, status, error and what is particular to its kind."""
    timed_out = run.status == "timeout"
    if kind == _MODEL:
        item = {"kind": kind, "name": subject, "status": _status_of(error, timed_out),
                "usage": outcome.usage_metadata if outcome is not None else None}
        text = _error_text(error)
    elif kind == _TOOL:
        status, text = _tool_status(outcome, error, timed_out)
        item = {"kind": kind, "name": subject.get("name") or "", "status": status, "tool_call_id": subject["id"]}
    else:
        item = {"kind": kind, "name": subject.get("subagent") or "", "status": "success",
                "task_id": subject.get("task_id"), "task_run_id": subject.get("run_id"),
                "task_status": subject.get("status")}
        text = None
    if text:
        item["error"] = text
    return item


def _tool_status(message: ToolMessage | None, error: BaseException | None,
                 timed_out: bool) -> tuple[str, str | None]:
    """A tool call's status and error text: from what it raised, else from its result message."""
    if error is not None:
        return _status_of(error, timed_out), _error_text(error)
    if message is not None and message.status == "error":
        return "error", message.text[:_ERROR_TEXT_LIMIT]
    return "success", None


def _status_of(error: BaseException | None, timed_out: bool) -> str:
    """A run's or call's status from what it raised; ``timed_out``: its run has a deadline that passed."""
    if error is None:
        return "success"
    if isinstance(error, asyncio.CancelledError):
        return "cancelled"
    if isinstance(error, GraphInterrupt):
        return "interrupted"
    if isinstance(error, TimeoutError) and timed_out:
        return "timeout"
    return "error"


def _error_text(error: BaseException | None) -> str | None:
    if error is None or isinstance(error, (asyncio.CancelledError, GraphInterrupt)):
        return None
    return f"{type(error).__name__}: {error}"[:_ERROR_TEXT_LIMIT]


# -- configuration ------------------------------------------------------------------------


class _Settings:
    provider: Any = None  # set in code; None: OpenTelemetry's global provider
    enabled = True
    capture: bool | None = None  # None: as OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT says
    resolved: tuple[Any, _Otel | None] | None = None  # (provider, what it gave), the last one looked at


def configure_tracing(tracer_provider: Any = None, *, capture_message_content: bool | None = None,
                      enabled: bool = True) -> None:
    """Send runs' spans to ``tracer_provider`` (by default OpenTelemetry's global one, which the
    ``OTEL_*`` environment variables may describe).

    ``capture_message_content`` records prompts, replies and tool arguments and results on the
    spans (default: as ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says, else off).
    ``enabled=False`` turns OpenTelemetry spans off whatever is set up. Runs started afterwards use this.
    """
    _Settings.provider = tracer_provider
    _Settings.capture = capture_message_content
    _Settings.enabled = enabled
    _Settings.resolved = None
    _env_wants_export.cache_clear()


def _otel() -> _Otel | None:
    """OpenTelemetry's tracer as configured now, or ``None`` when traces go nowhere."""
    if not _Settings.enabled:
        return None
    provider = _Settings.provider
    if provider is None:
        if "opentelemetry.trace" not in sys.modules and not _env_wants_export():
            return None  # nothing in this process set OpenTelemetry up, and the environment asks for nothing
        provider = _global_provider()
        if provider is None:
            return None
    resolved = _Settings.resolved
    if resolved is None or resolved[0] is not provider:
        capture = _Settings.capture
        if capture is None:
            setting = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
            capture = setting.strip().lower() in _CAPTURE_VALUES
        resolved = _Settings.resolved = (provider, _Otel(provider.get_tracer("backchannel", __version__), capture))
    return resolved[1]


def _global_provider() -> Any:
    """OpenTelemetry's global tracer provider, set up from the environment if it asks and nobody has; ``None`` if
    there is none that records."""
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider) and _env_wants_export():
        _set_up_sdk()
        provider = trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider


@functools.cache
def _env_wants_export() -> bool:
    """Whether the ``OTEL_*`` variables ask for traces to be exported."""
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _set_up_sdk() -> None:
    """Set OpenTelemetry's SDK up as the ``OTEL_*`` variables describe, as the global tracer provider."""
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        logger.warning("OTEL_* variables ask for traces, but OpenTelemetry's SDK is not installed: "
                       "pip install 'backchannel[otel]'")
        return
    named = "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "") or os.environ.get("OTEL_SERVICE_NAME")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": "backchannel"}))
    for name in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").split(","):
        exporter = _exporter(name.strip().lower())
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


def _exporter(name: str) -> Any:
    """The span exporter an ``OTEL_TRACES_EXPORTER`` name stands for (from the installed exporters)."""
    if name == "otlp":
        env = os.environ
        protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        name = "otlp_proto_grpc" if (protocol or "").strip() == "grpc" else "otlp_proto_http"
    import importlib.metadata  # here: it costs more to import than the rest of this module

    found = importlib.metadata.entry_points(group="opentelemetry_traces_exporter", name=name)
    if not found:
        logger.warning("OTEL_TRACES_EXPORTER names %r, which no installed package provides", name)
        return None
    return next(iter(found)).load()()


# -- trace context across runs ---------------------------------------------------------


def trace_context() -> dict[str, str] | None:
    """The current span's W3C trace context (``traceparent``, ...), or ``None`` without one."""
    if _otel() is None:
        return None
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier if "traceparent" in carrier else None


def with_trace_context(config: Mapping[str, Any] | None,
                       headers: Mapping[str, str] | None = None) -> Mapping[str, Any] | None:
    """A run's ``config`` with the current trace context in its ``configurable`` (or, without a current span,
    that of the HTTP request ``headers`` that create the run), so the run continues that trace. As given when
    it carries one already, or when there is none to add."""
    configurable = (config or {}).get("configurable") or {}
    if "traceparent" in configurable:
        return config
    carrier = trace_context()
    if carrier is None and headers is not None and headers.get("traceparent"):
        carrier = {key: headers[key] for key in ("traceparent", "tracestate") if headers.get(key)}
    if carrier is None:
        return config
    return {**(config or {}), "configurable": {**configurable, **carrier}}


def continued_from(config: Mapping[str, Any] | None) -> contextlib.AbstractContextManager[None]:
    """Within the block, the current trace context is the one a run's ``config`` carries (none: a new
    trace), not whatever the code that queued the run had."""
    # Without OpenTelemetry, one shared no-op: a block around a run is held as long as the run.
    return _UNCHANGED if _otel() is None else _attached(config)


_UNCHANGED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


@contextlib.contextmanager
def _attached(config: Mapping[str, Any] | None) -> Iterator[None]:
    from opentelemetry import context, propagate

    carrier = (config or {}).get("configurable") or {}
    token = context.attach(propagate.extract(carrier, context=context.Context()))
    try:
        yield
    finally:
        context.detach(token)


# -- OpenTelemetry spans ---------------------------------------------------------------------

_INTERNAL, _CLIENT = "INTERNAL", "CLIENT"
_SETTING_ATTRIBUTES = {"temperature": "gen_ai.request.temperature", "max_tokens": "gen_ai.request.max_tokens",
                       "top_p": "gen_ai.request.top_p", "top_k": "gen_ai.request.top_k",
                       "seed": "gen_ai.request.seed", "frequency_penalty": "gen_ai.request.frequency_penalty",
                       "presence_penalty": "gen_ai.request.presence_penalty", "stop": "gen_ai.request.stop_sequences"}


class _Otel:
    """OpenTelemetry's side: a span per run or call, current while it goes on (so what runs inside nests under it)."""

    def __init__(self, tracer: Any, capture: bool) -> None:
        from opentelemetry import context, trace

        from backchannel._otel_span import DeferredSpan, spans_made

        self.tracer = tracer
        self._deferred = DeferredSpan
        self._made = spans_made
        self.capture = capture
        self._context = context
        self._trace = trace
        self._kinds = {_INTERNAL: trace.SpanKind.INTERNAL, _CLIENT: trace.SpanKind.CLIENT}

    def start(self, name: str, kind: str, attributes: dict[str, Any]) -> tuple[Any, Any]:
        """A span for work starting now, current until :meth:`end` (made in one go then, unless something inside
        needed it sooner: nested spans, a trace context passed on)."""
        parent = self._context.get_current()
        span = self._deferred(self.tracer, name, self._kinds[kind], attributes, parent)
        return span, self._context.attach(self._trace.set_span_in_context(span, parent))

    def end(self, handle: tuple[Any, Any], status: str, error: BaseException | None,
            attributes: dict[str, Any] | None = None, *, record: bool = True,
            description: str | None = None) -> None:
        span, token = handle
        self._context.detach(token)
        attributes = attributes if attributes is not None else {}
        failed = None
        if status in ("error", "timeout"):
            attributes["error.type"] = type(error).__name__ if error is not None else "_OTHER"
            failed = self._trace.Status(self._trace.StatusCode.ERROR, description or _error_text(error))
        elif status != "success":
            attributes["backchannel.status"] = status
        span.finish(attributes, failed, error if failed is not None and record else None)

    async def made(self) -> None:
        """Once the spans of the work that ended so far reached the tracer provider's processors."""
        await self._made()

    def start_chat(self, request: ModelRequest) -> tuple[Any, Any]:
        model = request.model
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": _provider(model),
                                      "gen_ai.request.model": model.name}
        ctx = request.ctx
        if ctx is not None and ctx.thread_id:
            attributes["gen_ai.conversation.id"] = ctx.thread_id
        for key, value in request.settings.items():
            if key in _SETTING_ATTRIBUTES and value is not None:
                attributes[_SETTING_ATTRIBUTES[key]] = [value] if key == "stop" and isinstance(value, str) else value
        if self.capture:
            if request.system_prompt:
                attributes["gen_ai.system_instructions"] = _json([{"type": "text", "content": request.system_prompt}])
            attributes["gen_ai.input.messages"] = _json([_otel_message(m) for m in request.messages])
            if request.tools:
                attributes["gen_ai.tool.definitions"] = _json([
                    {"type": "function", "name": t.name, "description": t.description, "parameters": t.parameters}
                    for t in request.tools])
        return self.start(f"chat {model.name}", _CLIENT, attributes)

    def end_chat(self, handle: tuple[Any, Any], message: AIMessage | None, status: str,
                 error: BaseException | None) -> None:
        attributes: dict[str, Any] = {}
        if message is not None:
            meta = message.response_metadata
            if meta.get("model_name"):
                attributes["gen_ai.response.model"] = meta["model_name"]
            if meta.get("id"):  # the provider's id of its reply
                attributes["gen_ai.response.id"] = meta["id"]
            if meta.get("finish_reason"):
                attributes["gen_ai.response.finish_reasons"] = [meta["finish_reason"]]
            attributes.update(_usage_attributes(message.usage_metadata))
            if self.capture:
                output = _otel_message(message)
                output["finish_reason"] = meta.get("finish_reason") or ("tool_call" if message.tool_calls else "stop")
                attributes["gen_ai.output.messages"] = _json([output])
        self.end(handle, status, error, attributes)

    def start_tool(self, call: Mapping[str, Any], tool: Tool | None) -> tuple[Any, Any]:
        name = call.get("name") or ""
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name,
                      "gen_ai.tool.call.id": call["id"], "gen_ai.tool.type": "function"}
        if tool is not None and tool.description:
            attributes["gen_ai.tool.description"] = tool.description
        if self.capture:
            attributes["gen_ai.tool.call.arguments"] = _json(call.get("args"))
        return self.start(f"execute_tool {name}", _INTERNAL, attributes)

    def end_tool(self, handle: tuple[Any, Any], message: ToolMessage | None, status: str,
                 error: BaseException | None, text: str | None) -> None:
        attributes = {}
        if self.capture and message is not None:
            attributes["gen_ai.tool.call.result"] = message.text
        self.end(handle, status, error, attributes, description=text)

    def notification(self, note: Mapping[str, Any]) -> None:
        """A span for a task notification taken in, linked to the span of the task's run that sent it."""
        from opentelemetry import propagate

        links = []
        sender = self._trace.get_current_span(propagate.extract(note.get("trace_context") or {}))
        if sender.get_span_context().is_valid:
            links.append(self._trace.Link(sender.get_span_context()))
        subagent = note.get("subagent") or ""
        span = self.tracer.start_span(f"task_notification {subagent}", kind=self._trace.SpanKind.INTERNAL, links=links,
                                      attributes={"gen_ai.agent.name": subagent, "backchannel.task.id": note["task_id"],
                                                  "backchannel.task.run_id": note.get("run_id") or "",
                                                  "backchannel.task.status": note.get("status") or ""})
        span.end()


def _agent_attributes(ctx: RunContext, name: str, model: Any) -> dict[str, Any]:
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
                  "gen_ai.provider.name": _provider(model), "backchannel.run_id": ctx.run_id}
    model_name = getattr(model, "name", None)
    if model_name:
        attributes["gen_ai.request.model"] = model_name
    if ctx.thread_id:
        attributes["gen_ai.conversation.id"] = ctx.thread_id
    assistant_id = ctx.metadata.get("assistant_id")
    if assistant_id and ctx.parent is None:
        attributes["gen_ai.agent.id"] = assistant_id
    return attributes


def _usage_attributes(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    if not usage:
        return {}
    attributes = {"gen_ai.usage.input_tokens": usage.get("input_tokens") or 0,
                  "gen_ai.usage.output_tokens": usage.get("output_tokens") or 0}
    cached = (usage.get("input_token_details") or {}).get("cache_read")
    if cached:
        attributes["gen_ai.usage.cache_read.input_tokens"] = cached
    return attributes


def _provider(model: Any) -> str:
    """``gen_ai.provider.name``: what the model adapter says, else ``_OTHER`` as the conventions ask."""
    return getattr(model, "provider", None) or "_OTHER"


_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _otel_message(message: AnyMessage) -> dict[str, Any]:
    """A message in the conventions' ``gen_ai.input.messages`` form: a role and typed parts."""
    parts: list[dict[str, Any]] = []
    if isinstance(message, ToolMessage):
        parts.append({"type": "tool_call_response", "id": message.tool_call_id, "response": message.text})
    elif message.content:
        parts.append({"type": "text", "content": text_of(message.content)})
    if isinstance(message, AIMessage):
        parts += [{"type": "tool_call", "id": c["id"], "name": c["name"], "arguments": c["args"]}
                  for c in message.tool_calls]
    return {"role": _ROLES[message.type], "parts": parts}


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)
