"""A thread's v2 stream: the protocol events of its runs, numbered once, for all of the thread's subscribers.

A log starts when a thread's v2 stream is first asked for in this process (a
subscriber connects, or a command starts a run on it): with the run under way
then, replayed from its start, and every later run of the thread, wherever it
executes (:meth:`~backchannel.runtime.follow.Follower.thread_runs`). Each run
becomes protocol events (:class:`~backchannel.runtime.protocol.RunProtocol`),
encoded once and numbered with a ``seq`` every subscriber shares, so a client
that reconnects (or widens its subscription on a second connection) passes the
last ``seq`` it saw as ``since`` and misses nothing. Numbers start at the
log's creation time in microseconds, so they keep growing when a log ends and
another starts. A log keeps its last :data:`KEPT_EVENTS` events and ends
:data:`KEEP` seconds after its last subscriber left and its last run ended.

A subscriber that gives no ``since`` sees the run under way from its start,
and a run a command started that no such subscriber has seen yet (the SDKs
start a run, then subscribe: it may have ended meanwhile); runs that ended
before are history, read from the thread's state, so a new subscriber never
takes an old run's end for the end of the run it is about to start.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from backchannel.runtime.follow import Follower
from backchannel.runtime.protocol import ProtocolEvent, ProtocolFilter, RunProtocol
from backchannel.serde import json_bytes, to_jsonable

__all__ = ["KEEP", "KEPT_EVENTS", "Entry", "ThreadLog", "ThreadLogs"]

logger = logging.getLogger("backchannel")

KEEP = 60.0  # seconds a log outlives its last subscriber and its last run
KEPT_EVENTS = 10_000  # events a log keeps for subscribers that join late or come back


@dataclass(frozen=True, slots=True)
class Entry:
    """One numbered protocol event: what a subscriber's filter looks at, and the event as JSON."""

    seq: int
    channel: str
    namespace: tuple[str, ...]
    custom_name: str | None
    method: str
    json: bytes

    def wanted(self, subscription: ProtocolFilter) -> bool:
        return subscription.matches(self.channel, self.namespace, self.custom_name)


@dataclass(slots=True)
class _Run:
    """A run the log has seen start: where its events begin, and whether it has ended."""

    run_id: str
    after: int  # the seq just before its first event
    seen: bool  # by a subscriber without since (followed live, or replayed to one)
    ended: bool = False


def _seq(entry: Entry) -> int:
    return entry.seq


class ThreadLog:
    """The protocol events of one thread's runs, as they come, for any number of subscribers."""

    def __init__(self, thread_id: str, follower: Follower) -> None:
        self.thread_id = thread_id
        self.entries: list[Entry] = []
        self.current: RunProtocol | None = None  # the run under way, or the last one seen
        self.running = False
        self.closed = False
        self.subscribers = 0
        self.used_at = time.monotonic()
        self._seq = time.time_ns() // 1000
        self._runs: list[_Run] = []  # the runs seen start, oldest first (the last few)
        self._commanded: set[str] = set()  # runs a command started, until a subscriber without since sees them
        self._waiter: asyncio.Future[None] | None = None
        self._thread_runs = follower.thread_runs(thread_id, values=True)  # watching from now: no run is missed
        self._task = asyncio.create_task(self._consume())

    @property
    def seq(self) -> int:
        """The number of the last event so far."""
        return self._seq

    def commanded(self, run_id: str) -> None:
        """A command started this run: the next subscriber without ``since`` sees it from its start."""
        self._commanded.add(run_id)

    def start(self) -> int:
        """Where a subscriber without ``since`` starts: the first run under way, or commanded and unseen."""
        start = self._seq
        for run in self._runs:
            if not run.ended or (not run.seen and run.run_id in self._commanded):
                start = run.after
                break
        for run in self._runs:
            run.seen = True
            self._commanded.discard(run.run_id)
        return start

    def latest_run_start(self, cursor: int) -> int:
        """Where the newest run that started after ``cursor`` begins (``cursor`` if none has)."""
        for run in reversed(self._runs):
            if run.after >= cursor:
                return run.after
            break
        return cursor

    def tree(self) -> dict[str, Any] | None:
        """The current run's agents (``agent.getTree``), or ``None`` before the log has seen a run."""
        return self.current.tree() if self.current is not None else None

    async def follow(self, subscription: ProtocolFilter, since: int | None = None) -> AsyncIterator[Entry]:
        """The events the subscription wants with ``seq`` above ``since`` (without: from the run it should
        see first, see the module's docs), then each new one, until the log ends."""
        self.subscribers += 1
        cursor = self.start() if since is None else since
        try:
            while True:
                entries = self.entries  # trimming makes a new list: this one stays as it is
                index = bisect.bisect_right(entries, cursor, key=_seq)
                for entry in entries[index:]:
                    cursor = entry.seq
                    if entry.wanted(subscription):
                        yield entry
                if self.closed:
                    return
                if self._waiter is None:
                    self._waiter = asyncio.get_running_loop().create_future()
                await asyncio.shield(self._waiter)
        finally:
            self.subscribers -= 1
            self.used_at = time.monotonic()

    async def close(self) -> None:
        self.closed = True
        self._wake()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._thread_runs.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    async def _consume(self) -> None:
        try:
            async for row, stream in self._thread_runs:
                protocol = RunProtocol(row.run_id, row.metadata.get("graph_id") or row.assistant_id)
                self.current, self.running = protocol, True
                run = _Run(row.run_id, self._seq, seen=self.subscribers > 0)
                self._runs = [*self._runs[-99:], run]
                count = self._add(row.run_id, 0, protocol.started())
                async for event in stream.follow(0, values=True):
                    count = self._add(row.run_id, count, protocol.events(event))
                self._add(row.run_id, count, protocol.ended(stream.status, stream.error))
                run.ended, self.running = True, False
                self.used_at = time.monotonic()
        except Exception:
            logger.exception("the v2 stream of thread %s failed; its subscribers are disconnected", self.thread_id)
            self.closed = True
            self._wake()

    def _add(self, run_id: str, count: int, events: Iterable[ProtocolEvent]) -> int:
        """Number and encode ``events`` (the run's ``count``-th on), keep them, wake the subscribers."""
        now = int(time.time() * 1000)
        added = False
        for event in events:
            count += 1
            self._seq += 1
            params: dict[str, Any] = {"namespace": event.namespace, "timestamp": now, "data": event.data}
            if event.node is not None:
                params["node"] = event.node
            # An event's id is the same in every log of every process (the run's n-th event), so a client
            # dedupes what two connections both delivered.
            wire = {"type": "event", "event_id": f"{run_id}:{count}", "seq": self._seq, "method": event.method,
                    "params": params}
            data = event.data
            custom = data.get("name") if event.method == "custom" and isinstance(data, dict) else None
            self.entries.append(Entry(self._seq, event.channel, tuple(event.namespace),
                                      custom if isinstance(custom, str) else None, event.method,
                                      json_bytes(wire, to_jsonable)))
            added = True
        if len(self.entries) > 2 * KEPT_EVENTS:
            self.entries = self.entries[-KEPT_EVENTS:]
        if added:
            self._wake()
        return count


class ThreadLogs:
    """The v2 streams of the threads followed in this process (one :class:`ThreadLog` per thread)."""

    def __init__(self, follower: Follower, keep: float = KEEP) -> None:
        self.follower = follower
        self.keep = keep
        self._logs: dict[str, ThreadLog] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._closing: set[asyncio.Future[None]] = set()

    def get(self, thread_id: str) -> ThreadLog:
        """The thread's log, started now if there is none (its run under way replayed from its start)."""
        log = self._logs.get(thread_id)
        if log is None or log.closed:
            log = self._logs[thread_id] = ThreadLog(thread_id, self.follower)
            self._schedule_sweep()
        log.used_at = time.monotonic()
        return log

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        logs, self._logs = list(self._logs.values()), {}
        for log in logs:
            await log.close()

    def _schedule_sweep(self) -> None:
        if self._sweeper is None and self._logs:
            self._sweeper = asyncio.get_running_loop().call_later(self.keep / 2, self._sweep)

    def _sweep(self) -> None:
        """End the logs nobody has used for ``keep`` seconds (no subscriber, no run under way)."""
        self._sweeper = None
        idle_since = time.monotonic() - self.keep
        for thread_id, log in list(self._logs.items()):
            if log.closed or (not log.subscribers and not log.running and log.used_at < idle_since):
                del self._logs[thread_id]
                closing = asyncio.ensure_future(log.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
        self._schedule_sweep()
