"""Following runs: one run's stream parts, or every run of a thread as it comes.

A thread's follower (LangGraph's ``GET /threads/{id}/stream``) sees the run
under way when it joins, then each later run from its first event: runs a
client starts, queued ones, and the wake-up runs the runtime starts when a
background task reports back to an idle thread, in this process or (on a
shared database) in another. Each run's parts come in its
own stream modes, opened by ``metadata`` ``{run_id, attempt}`` and closed by
``metadata`` ``{"status": "run_done", "run_id"}``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from backchannel.errors import StorageUnavailableError
from backchannel.events import Event
from backchannel.protocols import StreamPart
from backchannel.runtime.modes import StreamMapper, wants_values
from backchannel.runtime.rows import RunRow
from backchannel.runtime.storage import RunStorage
from backchannel.runtime.streams import Batches, RunStream, Sink, Streams
from backchannel.runtime.wire import render_error, render_run

__all__ = ["THREAD_STREAM_MODES", "Follower", "ThreadRuns", "ThreadStreamMode"]

logger = logging.getLogger("backchannel")

ThreadStreamMode = Literal["run_modes", "lifecycle"]
THREAD_STREAM_MODES: tuple[ThreadStreamMode, ...] = ("run_modes", "lifecycle")


RemoteFollow = Callable[[RunRow, bool], "RunStream | None"]  # a stream fed by the process executing a run
# Hear of a thread's runs made in other processes from when it returns on, and call the function given once some
# may have gone unheard (messages lost); returns the function that stops.
HearThread = Callable[[str, Callable[[], None]], Awaitable[Callable[[], None]]]


async def _hear_nothing(thread_id: str, missed: Callable[[], None]) -> Callable[[], None]:
    return lambda: None


class Follower:
    """Turns the streams this process keeps into stream parts for the clients that follow them.

    ``remote`` follows a run another process executes (``None`` when no other process could); ``hear`` has this
    process hear of a thread's runs made in others.
    """

    def __init__(self, storage: RunStorage, streams: Streams,
                 remote: RemoteFollow = lambda row, values: None, hear: HearThread = _hear_nothing) -> None:
        self.storage = storage
        self.streams = streams
        self.remote = remote
        self.hear = hear

    def run(self, run: Mapping[str, Any], modes: Sequence[str] | None, after: int, *,
            with_metadata: bool = True) -> Batches[StreamPart]:
        """The parts of a run's stream (``run`` as :func:`render_run` gives it), after event ``after``;
        in :meth:`~Batches.batches`, ``metadata`` alone first, then the parts of each batch of events."""
        return Batches(self._parts(run, modes, after, with_metadata),
                       lambda sink, wire: self._push(run, modes, after, with_metadata, sink, wire))

    async def _parts(self, run: Mapping[str, Any], modes: Sequence[str] | None, after: int,
                     with_metadata: bool) -> AsyncGenerator[list[StreamPart], None]:
        stream = self.streams.get(run["run_id"])
        if stream is None:
            return
        events, parts = self._open(stream, run, modes, after)
        if with_metadata:
            yield [_metadata(run)]
        async for batch in events.batches():
            found = _mapped(parts, batch)
            if found:
                yield found
        if stream.status == "error" and stream.error:  # LangGraph sends no error event for a timeout
            yield [StreamPart("error", render_error(stream.error))]

    async def _push(self, run: Mapping[str, Any], modes: Sequence[str] | None, after: int, with_metadata: bool,
                    sink: Sink[StreamPart], wire: bool) -> None:
        # As _parts, but each batch mapped and handed on in the publisher's call (RunStream.follow(...).push).
        stream = self.streams.get(run["run_id"])
        if stream is None:
            return
        events, parts = self._open(stream, run, modes, after, wire=wire)
        if with_metadata:
            sink([_metadata(run)])

        def take(batch: list[Event]) -> asyncio.Future[Any] | None:
            # A token comes alone, in the publisher's call: mapped here, without mapped()'s frame.
            found = parts(batch[0]) if len(batch) == 1 else _mapped(parts, batch)
            return sink(found) if found else None

        await events.push(take)
        if stream.status == "error" and stream.error:
            sink([StreamPart("error", render_error(stream.error))])

    @staticmethod
    def _open(stream: RunStream, run: Mapping[str, Any], modes: Sequence[str] | None, after: int, *,
              wire: bool = False) -> tuple[Batches[Event], Callable[[Event], list[StreamPart]]]:
        """Follow ``stream`` after ``after``; with the function mapping each of its events to parts."""
        kwargs = run["kwargs"]
        modes = modes or kwargs.get("stream_mode") or ["values"]
        events = stream.follow(after, values=wants_values(modes))
        mapper = StreamMapper(modes, subgraphs=bool(kwargs.get("stream_subgraphs")),
                              metadata={k: v for k, v in run["metadata"].items() if k != "assistant_id"}, wire=wire)
        return events, mapper.parts

    def thread(self, thread_id: str, modes: Sequence[ThreadStreamMode]) -> Batches[StreamPart]:
        """Every run of the thread from now on, one after the other, until the caller stops (pushed as a run's
        stream is: each batch of a run's parts in the publisher's call)."""
        return Batches(self._thread_parts(thread_id, modes),
                       lambda sink, wire: self._push_thread(thread_id, modes, sink, wire))

    async def _thread_parts(self, thread_id: str,
                            modes: Sequence[ThreadStreamMode]) -> AsyncGenerator[list[StreamPart], None]:
        runs = self.thread_runs(thread_id)
        try:
            async for row, _stream in runs:
                async for batch in self.run(render_run(row), None, 0).batches():
                    shown = _shown(batch, modes)
                    if shown:
                        yield shown
                yield [_run_done(row)]
        finally:
            runs.close()

    async def _push_thread(self, thread_id: str, modes: Sequence[ThreadStreamMode], sink: Sink[StreamPart],
                           wire: bool) -> None:
        # As _thread_parts, each run's parts pushed (Follower.run(...).push).
        def take(batch: list[StreamPart]) -> asyncio.Future[Any] | None:
            shown = _shown(batch, modes)
            return sink(shown) if shown else None

        runs = self.thread_runs(thread_id)
        try:
            async for row, _stream in runs:
                await self.run(render_run(row), None, 0).push(take, wire=wire)
                sink([_run_done(row)])
        finally:
            runs.close()

    def thread_runs(self, thread_id: str, *, values: bool = False) -> ThreadRuns:
        """The thread's runs under way or queued now, then each new one (see :class:`ThreadRuns`)."""
        return ThreadRuns(self, thread_id, values)


def _mapped(parts: Callable[[Event], list[StreamPart]], batch: list[Event]) -> list[StreamPart]:
    """The parts a batch of events becomes (``parts``: of one event)."""
    return parts(batch[0]) if len(batch) == 1 else [part for event in batch for part in parts(event)]


def _metadata(run: Mapping[str, Any]) -> StreamPart:
    return StreamPart("metadata", {"run_id": run["run_id"], "attempt": 1})


def _run_done(row: RunRow) -> StreamPart:
    return StreamPart("metadata", {"status": "run_done", "run_id": row.run_id})


def _shown(batch: list[StreamPart], modes: Sequence[ThreadStreamMode]) -> list[StreamPart]:
    """What a thread's follower sees of a batch of a run's parts: all (``run_modes``), or its ``metadata``."""
    return batch if "run_modes" in modes else [part for part in batch if part.event == "metadata"]


class ThreadRuns:
    """A thread's runs under way or queued when iterated, then each new one (wherever it executes), in turn:
    each with its stream, kept from its start. ``values`` asks every run for full-state snapshots.

    New runs are watched for from construction, so a run made right after is not missed: one made here is seen as it
    is made; one made in another process after the storage noted where the runs made from then on begin (at once,
    before this process listens to the thread) is heard of once it listens, or read back then with those under way
    or queued, ended too. Once messages may have been lost (the listening connection was down), the runs made since
    the last read are read back again. A position in the storage, not a time: no run is missed whatever the
    processes' clocks say. Runs come in the order they were made: those heard of while a read is due wait for it.
    """

    def __init__(self, follower: Follower, thread_id: str, values: bool) -> None:
        self.follower = follower
        self.thread_id = thread_id
        self.values = values
        self._arrived: asyncio.Queue[tuple[RunRow, RunStream]] = asyncio.Queue()
        self._expected: set[str] = set()  # runs it has heard of (each is followed once)
        self._stop = follower.streams.watch_thread(thread_id, self._expect)
        self._position: str | None = None  # where the runs not read back yet begin (see RunStorage.runs_since)
        # Reads back to come (the first once it hears): the runs heard of meanwhile wait, behind those read.
        self._reads_due = 1
        self._held: dict[str, tuple[RunRow, RunStream]] = {}
        self._hearing = asyncio.ensure_future(self._hear())
        self._looks: set[asyncio.Task[None]] = set()  # reads again after messages were lost
        self._closed = False

    def close(self) -> None:
        """Stop watching the thread."""
        if self._closed:
            return  # a subscription is undone once
        self._closed = True
        self._stop()
        self._hearing.add_done_callback(_stop_hearing)
        self._hearing.cancel()
        for look in self._looks:
            look.cancel()

    async def _hear(self) -> Callable[[], None]:
        self._position = await self.follower.storage.run_position()  # before listening: what it misses is after
        return await self.follower.hear(self.thread_id, self._missed)

    def _wants_values(self, row: RunRow) -> bool:
        return self.values or wants_values(row.kwargs.get("stream_mode") or ())

    def _expect(self, row: RunRow, stream: RunStream) -> None:
        """Show a run heard of (here, or from another process): in turn, or once the reads back due are done."""
        if self._keep(row, stream):
            if self._reads_due:
                self._held[row.run_id] = (row, stream)
            else:
                self._arrived.put_nowait((row, stream))

    def _keep(self, row: RunRow, stream: RunStream) -> bool:
        """Have ``stream`` keep its events for this follower (once a run, however it heard of it)."""
        if row.run_id in self._expected:
            return False
        self._expected.add(row.run_id)
        stream.expect_follower(values=self._wants_values(row))
        return True

    async def _read_back(self) -> None:
        """Show the thread's runs under way or queued, and those made since the last read that ended unheard, in
        the order they were made: before the runs heard of meanwhile that it did not read (made after it)."""
        rows, self._position = await self.follower.storage.runs_since(self.thread_id, self._position)
        for row in rows:
            held = self._held.pop(row.run_id, None)
            if held is not None:
                self._arrived.put_nowait(held)
            elif row.run_id not in self._expected:
                stream = self.follower.streams.get(row.run_id) or self.follower.remote(row, self._wants_values(row))
                if stream is not None and self._keep(row, stream):
                    self._arrived.put_nowait((row, stream))

    def _read_back_done(self) -> None:
        self._reads_due -= 1
        if not self._reads_due:
            for held in self._held.values():
                self._arrived.put_nowait(held)
            self._held.clear()

    def _missed(self) -> None:
        """Messages were lost (this process listens again): read back what they may have said."""
        if not self._closed:
            self._reads_due += 1
            look = asyncio.ensure_future(self._read_back_until_done())
            self._looks.add(look)
            look.add_done_callback(self._looks.discard)

    async def _read_back_until_done(self) -> None:
        delay = _RETRY_FIRST
        try:
            while True:
                try:
                    return await self._read_back()
                except StorageUnavailableError:
                    await asyncio.sleep(delay)  # the database is away: the runs wait for it
                    delay = min(delay * 2, _RETRY_MAX)
                except Exception:
                    logger.exception("cannot read back the runs of thread %s made unheard", self.thread_id)
                    return
        finally:
            self._read_back_done()

    async def __aiter__(self) -> AsyncIterator[tuple[RunRow, RunStream]]:
        try:
            await self._hearing  # a run made elsewhere from now on is heard of; one made before is read now
            try:
                await self._read_back()
            finally:
                self._read_back_done()
            while True:
                yield await self._arrived.get()
        finally:
            self.close()


_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0  # seconds between reads back while the database is away


def _stop_hearing(hearing: asyncio.Future[Callable[[], None]]) -> None:
    if not hearing.cancelled() and hearing.exception() is None:
        hearing.result()()
