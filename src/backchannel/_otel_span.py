"""The OpenTelemetry span of a run or call, made off the event loop once its work ends.

What OpenTelemetry's SDK does per span (sampling, ids, its mutable span, its processors) costs tens of
microseconds of CPU, a step's whole budget. So while a run or call goes on, its span is this stand-in, current
as the span would be; when the work ends, its times, attributes and outcome go to a thread of their own which
makes the SDK's span in one go (``start_time``, ``end_time``) through the configured tracer, whose processors
and exporter get it as they would a live one, a few milliseconds later. The step pays for the stand-in only,
and the SDK's work falls in the time the event loop waits (on a model, a tool), not on the step.

The stand-in starts the SDK's span at once (back at its start time) when something needs the real one: a span
nested in the work (a subagent's run, an instrumented HTTP call), a trace context injected into a request, code
that annotates the current span. A run, when it ends at the top, awaits its spans' reaching the processors,
so a caller (or a process about to exit) finds them there as it did when spans were ended in place.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util import types

__all__ = ["DeferredSpan", "spans_made"]

logger = logging.getLogger("backchannel")

_HANDOVER_WAIT = 10.0  # seconds a run's end waits for its spans to be made (a processor that blocks, at worst)
_EXIT_WAIT = 2.0  # seconds an exiting process waits for the spans still to be made


class DeferredSpan(trace.Span):
    """A span of ``tracer``'s under ``parent`` (a context), started now, made on another thread once it ends."""

    __slots__ = ("_tracer", "name", "_kind", "_attributes", "_parent", "_start", "_end", "_outcome", "_span")

    def __init__(self, tracer: trace.Tracer, name: str, kind: trace.SpanKind, attributes: dict[str, Any],
                 parent: Context) -> None:
        self._tracer = tracer
        self.name = name
        self._kind = kind
        self._attributes = attributes  # its own: what the end adds goes in
        self._parent = parent
        self._start = time.time_ns()
        self._end = 0
        self._outcome: tuple[Mapping[str, Any], trace.Status | None, BaseException | None] | None = None
        self._span: trace.Span | None = None

    def started(self) -> trace.Span:
        """The SDK's span, started now (back at the time the work started) if it was not yet."""
        with _maker.making:
            if self._span is None:
                self._span = self._tracer.start_span(self.name, context=self._parent, kind=self._kind,
                                                     attributes=self._attributes, start_time=self._start)
            return self._span

    def finish(self, attributes: Mapping[str, Any], status: trace.Status | None,
               exception: BaseException | None) -> None:
        """The work ended now: with ``attributes`` added, ``exception`` recorded and ``status`` set (if given).
        The span is made on the span maker's thread."""
        self._end = time.time_ns()
        self._outcome = (attributes, status, exception)
        _maker.put(self)

    def make(self) -> None:
        """Make the SDK's span (in one go unless it was started) and end it as the work did."""
        assert self._outcome is not None
        attributes, status, exception = self._outcome
        with _maker.making:
            span = self._span
            if span is None:
                self._attributes.update(attributes)
                span = self._span = self._tracer.start_span(self.name, context=self._parent, kind=self._kind,
                                                            attributes=self._attributes, start_time=self._start)
            elif attributes:
                span.set_attributes(attributes)
        if exception is not None:
            span.record_exception(exception, timestamp=self._end)
        if status is not None:
            span.set_status(status)
        span.end(end_time=self._end)

    # -- the Span API, for whoever finds it current: the real span's

    def get_span_context(self) -> trace.SpanContext:
        return self.started().get_span_context()

    def is_recording(self) -> bool:
        return self.started().is_recording()

    def set_attributes(self, attributes: Mapping[str, types.AnyValue]) -> None:
        self.started().set_attributes(attributes)

    def set_attribute(self, key: str, value: types.AnyValue) -> None:
        self.started().set_attribute(key, value)

    def add_event(self, name: str, attributes: types.Attributes = None, timestamp: int | None = None) -> None:
        self.started().add_event(name, attributes, timestamp)

    def add_link(self, context: trace.SpanContext, attributes: types.Attributes = None) -> None:
        self.started().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.started().update_name(name)

    def set_status(self, status: trace.Status | trace.StatusCode, description: str | None = None) -> None:
        self.started().set_status(status, description)

    def record_exception(self, exception: BaseException, attributes: types.Attributes = None,
                         timestamp: int | None = None, escaped: bool = False) -> None:
        self.started().record_exception(exception, attributes, timestamp, escaped)

    def end(self, end_time: int | None = None) -> None:
        self.started().end(end_time)


class _SpanMaker:
    """A thread that makes the spans of ended work, in the order they ended (started when first needed, again
    in a forked process)."""

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._queue: queue.SimpleQueue[DeferredSpan | Callable[[], object]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()
        # A span is made once, by the thread that needs it first (re-entered: making a span may start its parent).
        self.making = threading.RLock()

    def put(self, span: DeferredSpan) -> None:
        if self._thread is None:
            self._start()
        self._queue.put(span)  # no lock on the step's way

    async def made(self) -> None:
        """Once the spans handed over so far reached the tracer's processors (the event loop goes on meanwhile)."""
        if self._thread is None:
            return
        loop = asyncio.get_running_loop()
        reached = loop.create_future()
        self._queue.put(functools.partial(loop.call_soon_threadsafe, _resolve, reached))
        done, _ = await asyncio.wait({reached}, timeout=_HANDOVER_WAIT)
        if not done:
            logger.warning("OpenTelemetry spans still being made after %s s: a span processor is slow",
                           _HANDOVER_WAIT)

    def _start(self) -> None:
        with self._starting:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="backchannel-spans", daemon=True)
                self._thread.start()
                # Registered after the tracer provider's own exit handler, so it runs before that one flushes.
                atexit.register(self._drain)

    def _drain(self) -> None:
        """Make what was handed over, before the process exits (a run cancelled does not wait for its spans)."""
        if self._thread is None:  # a forked process that made none
            return
        reached = threading.Event()
        self._queue.put(reached.set)
        reached.wait(_EXIT_WAIT)

    def _work(self) -> None:
        spans = self._queue
        while True:
            item = spans.get()
            try:
                if isinstance(item, DeferredSpan):
                    item.make()
                else:  # someone waiting for the spans before it
                    item()
            except Exception:  # a processor's or exporter's fault (or a closed event loop): the next ones still go
                logger.exception("OpenTelemetry spans could not be made")


def _resolve(reached: asyncio.Future[None]) -> None:
    if not reached.done():
        reached.set_result(None)


_maker = _SpanMaker()


async def spans_made() -> None:
    """Once the spans of the work that ended so far reached the tracer provider's processors."""
    await _maker.made()
