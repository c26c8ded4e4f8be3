"""Runs' event streams: each run's, kept so late joiners can replay it, and the ones this process keeps."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

from backchannel.events import Event, EventBus
from backchannel.runtime.modes import wants_values
from backchannel.runtime.rows import RunRow, RunStatus

__all__ = ["Batches", "RunStream", "Sink", "Streams"]

T = TypeVar("T")
# Takes each batch as it comes (Batches.push); returns None, or when it cannot take more for now, a future done
# when it can (it has the batch it was given either way).
Sink = Callable[[list[T]], "asyncio.Future[Any] | None"]
logger = logging.getLogger("backchannel.runtime")


class RunStream:
    """Collects a run's events and lets any number of readers follow them.

    A resumable run records every event, so readers can start from the
    beginning or after a given ``seq`` (what SSE clients send as
    ``Last-Event-ID``). Otherwise events are recorded only from the moment
    somebody follows (or from the start, for a ``watched`` run), so a run
    nobody watches publishes nothing at all.
    """

    __slots__ = ("run_id", "resumable", "bus", "events", "status", "error", "final_values", "exception", "final_row",
                 "interrupts", "result", "last_seq", "_waiters", "_readers", "_recording", "_awaited", "_loop",
                 "_listeners", "_paused", "_joining")

    def __init__(self, run_id: str, *, resumable: bool = False, values: bool = False, watched: bool = False) -> None:
        self.run_id = run_id
        self.resumable = resumable
        self.bus = EventBus(wants_values=values)
        self.events: list[Event] = []
        self.status: RunStatus | None = None
        self.error: dict[str, Any] | None = None
        self.final_values: dict[str, Any] | None = None
        self.exception: BaseException | None = None  # the agent's own error, for in-process callers
        # How the run ended, for joiners: its row as stored, the interrupts it paused on, and for
        # a stateless run (its thread deleted) its whole result.
        self.final_row: RunRow | None = None
        self.interrupts: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.last_seq = 0  # of the last event kept (the events a reader has had may be let go)
        self._waiters: list[asyncio.Future[None]] = []  # one per reader waiting for the next change
        self._readers = 0  # live readers of ``events``
        self._recording = False
        self._awaited = int(watched)  # followers to come (its creator, a thread's): keep its events until they do
        self._loop: asyncio.AbstractEventLoop | None = None  # its readers' (they wait on futures of it)
        self._listeners: list[_Listener] = []  # readers it hands each event to as it comes (push)
        self._paused = 0  # listeners that cannot take more for now: their events are kept meanwhile
        self._joining = 0  # readers that followed and have not begun to read: their events are kept until they do
        if resumable or watched:  # a run somebody follows from its creation records from the start
            self.keep_events()

    def expect_follower(self, *, values: bool) -> None:
        """Somebody will follow this run (a thread's follower): keep its events from now until they do."""
        self.bus.wants_values = self.bus.wants_values or values
        self._awaited += 1
        self.keep_events()

    def keep_events(self) -> None:
        """Record the run's events from now on (a reader follows, or another process relays them)."""
        if not self._recording:
            self._recording = True
            self.bus.subscribe(self.add)

    @property
    def finished(self) -> bool:
        return self.status is not None

    def add(self, event: Event) -> None:
        """Keep an event (numbered already), hand it to the listeners and wake the readers."""
        listeners = self._listeners
        if not listeners or self._readers or self.resumable or self._awaited or self._joining or self._paused:
            self.events.append(event)  # else only the listeners want it, and they have it (_kept_for_others inline)
        self.last_seq = event.seq
        for listener in listeners:
            listener.take([event])
        if self._waiters:
            self._wake()

    def _kept_for_others(self) -> bool:
        """Whether the kept events may be asked for by someone other than the live readers and listeners."""
        return self.resumable or self._awaited > 0 or self._joining > 0 or self._paused > 0

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():  # its reader may have been cancelled
                waiter.set_result(None)

    def publish(self, type: str, data: Any, *, agent: str = "", thread_id: str | None = None) -> None:
        """Publish an event on behalf of the runtime (not the agent)."""
        self.bus.publish(Event(type, data, (), agent, thread_id, self.run_id))

    def finish(self, status: RunStatus, *, error: dict[str, Any] | None = None,
               values: dict[str, Any] | None = None) -> None:
        """Mark the run ended; followers drain what is left and stop."""
        self.status = status
        self.error = error
        self.final_values = values
        for listener in self._listeners:
            listener.end()
        self._wake()
        if not self.resumable and not self._awaited:
            self.events = []  # only live readers could see them; each drains the list it follows

    async def wait(self) -> RunStatus:
        """Wait for the run to end; returns its status."""
        while self.status is None:
            await self._next_change()
        return self.status

    async def _next_change(self) -> None:
        loop = self._loop
        if loop is None:  # once: on Python 3.11 each get_running_loop() is a getpid() syscall, here one a token
            loop = self._loop = asyncio.get_running_loop()
        waiter = loop.create_future()
        self._waiters.append(waiter)
        await waiter

    def follow(self, after_seq: int = 0, *, values: bool = False) -> Batches[Event]:
        """Every kept event with ``seq > after_seq``, then the ones still to come, until the run ends.

        ``values=True`` asks the run for full-state snapshots from now on. The reader holds on
        to the events from this call on, even if it starts iterating after the run has ended.
        Its :meth:`~Batches.batches` are the events as they come: all that came since the last.
        """
        self.bus.wants_values = self.bus.wants_values or values
        self.keep_events()
        events = self.events
        if self._awaited:
            self._awaited -= 1  # (one of) the followers it waited for
        self._joining += 1  # until it begins to read (a reader may yield something of its own first)
        if self.status is not None and not self.resumable:
            self.events = []  # as finish() does: this reader drains its own list
        return Batches(self._drain(events, after_seq), lambda sink, wire: self._push(events, after_seq, sink))

    async def _drain(self, events: list[Event], after_seq: int) -> AsyncGenerator[list[Event], None]:
        index = _first_after(events, after_seq)
        self._readers += 1
        self._joining -= 1
        try:
            while True:
                if index < len(events):
                    # All that came meanwhile at once: a reader that fell behind catches up in one go.
                    batch = events[index:]
                    index = len(events)
                    yield batch
                    continue
                if self.status is not None:
                    return
                if self._readers == 1 and not self._kept_for_others() and events is self.events:
                    # Nobody can ask for them again: a live stream's memory stays flat however long it runs.
                    events.clear()
                    index = 0
                await self._next_change()
        finally:
            self._readers -= 1


    async def _push(self, events: list[Event], after_seq: int, sink: Sink[Event]) -> None:
        # Each event handed on in the publisher's own call as it is added: no reader task to wake. While the
        # sink cannot take more, its events are kept (in ``events``, the list it follows) and handed on at once
        # when it can, from this coroutine.
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        listener = _Listener(self, sink, after_seq)
        self._listeners.append(listener)
        self._joining -= 1
        try:
            while True:
                if listener.failure is not None:
                    raise listener.failure
                if listener.ready is None:
                    index = _first_after(events, listener.after)
                    if index < len(events):
                        listener.take(events[index:])  # kept ones: at the start, or kept while it could not take
                    if not (self._readers or self._kept_for_others()) and events is self.events:
                        events.clear()  # nobody can ask for them again (as a lone reader's drain does)
                    if listener.ready is not None or listener.failure is not None:
                        continue
                    if self.status is not None:
                        return
                    listener.wake = loop.create_future()
                    await listener.wake  # the run ended, or the sink could not take an event
                    continue
                try:
                    await listener.ready
                finally:
                    listener.ready = None
                    self._paused -= 1
        finally:
            self._listeners.remove(listener)
            if listener.ready is not None:
                self._paused -= 1


class _Listener:
    """A reader the publisher hands each event to (``take``); ``after``: the seq of the last it was given."""

    __slots__ = ("stream", "sink", "after", "ready", "failure", "wake")

    def __init__(self, stream: RunStream, sink: Sink[Event], after: int) -> None:
        self.stream = stream
        self.sink = sink
        self.after = after
        self.ready: asyncio.Future[Any] | None = None  # the sink's, while it cannot take more
        self.failure: Exception | None = None
        self.wake: asyncio.Future[None] | None = None  # its coroutine's, while it waits

    def take(self, events: list[Event]) -> None:
        if self.ready is not None or self.failure is not None:
            return  # the stream keeps them meanwhile
        self.after = events[-1].seq
        try:
            ready = self.sink(events)
        except Exception as exc:  # the publisher (the agent) must not fail for a reader's fault
            self.failure = exc
            self.end()
            return
        if ready is not None:
            self.ready = ready
            self.stream._paused += 1
            self.end()

    def end(self) -> None:
        """Wake its coroutine (the run ended, or there is something to wait for)."""
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)


class Batches(Generic[T]):
    """Items as they come, one by one, or in :meth:`batches`: a list of all that came since the last,
    or pushed: :meth:`push` hands each batch to a function as it comes.

    Readers that pay per delivery (a write per SSE chunk) take the batches or a push; the rest iterate as usual.
    """

    __slots__ = ("_batches", "_items", "_pusher")

    def __init__(self, batches: AsyncGenerator[list[T], None],
                 pusher: Callable[[Sink[T], bool], Awaitable[None]] | None = None) -> None:
        self._batches = batches
        self._items: AsyncGenerator[T, None] | None = None
        self._pusher = pusher

    def batches(self) -> AsyncGenerator[list[T], None]:
        """The items as lists, each of all that came since the previous (taken instead of iterating)."""
        return self._batches

    async def push(self, sink: Sink[T], *, wire: bool = False) -> None:
        """Hand each batch to ``sink`` as it comes (taken instead of iterating); returns after the last.

        A run's stream calls ``sink`` in the publisher's own call, as each event is published, so ``sink``
        must not block: when it cannot take more for now it returns a future, and the stream keeps what comes
        meanwhile, until that future is done (or raises: the push ends with its exception, as with one ``sink``
        raises; the publisher carries on either way). With ``wire``, ``sink`` renders stream parts as JSON with
        orjson (for the wire): a part's data may come as JSON already (an ``orjson.Fragment``: a model's tokens).
        """
        pusher = self._pusher
        if pusher is None:
            async for batch in self._batches:
                ready = sink(batch)
                if ready is not None:
                    await ready
            return
        await self._batches.aclose()  # never started: the pusher delivers them
        await pusher(sink, wire)

    def __aiter__(self) -> Batches[T]:
        return self

    async def __anext__(self) -> T:
        if self._items is None:
            self._items = _each(self._batches)
        return await anext(self._items)

    async def aclose(self) -> None:
        if self._items is not None:
            await self._items.aclose()
        await self._batches.aclose()


async def _each(batches: AsyncIterator[list[T]]) -> AsyncGenerator[T, None]:
    async for batch in batches:
        for item in batch:
            yield item


def _first_after(events: list[Event], seq: int) -> int:
    # seq numbers are increasing, so the index of the first later event is a binary search away.
    lo, hi = 0, len(events)
    while lo < hi:
        mid = (lo + hi) // 2
        if events[mid].seq <= seq:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Streams:
    """The streams this process knows: of runs created or executing here, of runs followed from other
    processes, and of the last ``kept`` runs that ended, for late joiners."""

    def __init__(self, kept: int = 1000) -> None:
        self.kept = kept
        self._streams: dict[str, RunStream] = {}
        self._finished: deque[str] = deque()  # ids of ended runs whose streams are kept, oldest first
        self._thread_watchers: dict[str, list[Callable[[RunRow, RunStream], None]]] = {}

    def watch_thread(self, thread_id: str, watcher: Callable[[RunRow, RunStream], None]) -> Callable[[], None]:
        """Call ``watcher`` with each new run of the thread and its stream, as the stream is made (before
        the run can start); returns the function that stops watching."""
        self._thread_watchers.setdefault(thread_id, []).append(watcher)

        def stop() -> None:
            watchers = self._thread_watchers.get(thread_id, [])
            if watcher in watchers:
                watchers.remove(watcher)
            if not watchers:
                self._thread_watchers.pop(thread_id, None)

        return stop

    def new(self, row: RunRow, *, watched: bool = False) -> RunStream:
        """The event stream of a new run; ``watched`` when its creator follows it from the start."""
        resumable = bool(row.kwargs.get("stream_resumable"))
        stream = RunStream(row.run_id, resumable=resumable, watched=watched,
                           values=(resumable or watched) and wants_values(row.kwargs.get("stream_mode") or ()))
        self._streams[row.run_id] = stream
        self.announce(row, stream)
        return stream

    def watching(self, thread_id: str) -> bool:
        """Whether somebody here watches the thread's new runs."""
        return thread_id in self._thread_watchers

    def announce(self, row: RunRow, stream: RunStream) -> None:
        """Tell the thread's watchers of a new run: made here, or in another process and followed here."""
        for watcher in self._thread_watchers.get(row.thread_id, ()):
            watcher(row, stream)

    def add(self, stream: RunStream) -> None:
        """Know a stream made elsewhere (a run followed from another process)."""
        self._streams[stream.run_id] = stream

    def get(self, run_id: str) -> RunStream | None:
        return self._streams.get(run_id)

    def retire(self, stream: RunStream) -> None:
        """Keep the streams of the last runs that ended, for late joiners; forget older ones."""
        self._finished.append(stream.run_id)
        while len(self._finished) > self.kept:
            self._streams.pop(self._finished.popleft(), None)
