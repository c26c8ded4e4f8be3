"""Runtimes in several processes on one database: the messages they exchange, and what each does with them.

A storage backend that many processes share provides a
:class:`~backchannel.runtime.storage.Coordinator` (Postgres: ``LISTEN/NOTIFY``);
memory and SQLite provide none, and their runtimes keep their in-process paths
(:attr:`Peers.shared` is then false and every message a no-op). Over it,
:class:`Peers` tells the other processes what they need to know:

- ``queued`` / ``kick``: a run was queued behind another process's run on the same thread; that
  process says when its run has ended, so the queued one starts at once;
- ``cancel``: stop a run that another process executes;
- ``mail``: a thread's inbox has a message for the run another process executes on it;
- ``watch`` / ``events`` / ``end``: somebody here follows a run executed elsewhere; its executor
  relays the run's events until it ends (``runs.join_stream`` on any process sees any run), on the run's
  topic, which only the processes following it subscribe to;
- ``created``: a run was made on a thread; processes where somebody follows that thread follow the run
  (a thread's followers on any process see every run of it). Sent on the thread's topic, which only the
  processes with a follower of the thread subscribe to: the others hear nothing of the thread's runs.

Runs belong to the process that created them and run there while it lives; the
others take them over when its lease lapses (see :mod:`backchannel.runtime.recovery`).
What the others' messages make this process do (start queued runs, cancel one,
take mail) is done by the runtime's other parts, handed to :meth:`Peers.start`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, cast, get_args

from backchannel.errors import StorageUnavailableError
from backchannel.events import Event
from backchannel.messages import message_from_dict
from backchannel.runtime.rows import ACTIVE, CancelAction, RunRow, RunStatus
from backchannel.runtime.storage import Coordinator, Notice, RunStorage
from backchannel.runtime.streams import RunStream, Streams
from backchannel.serde import to_jsonable

__all__ = ["Peers"]

logger = logging.getLogger("backchannel")

_WATCH_KEPT = 60.0  # seconds a watch for a run nobody here has started yet is remembered
_AWAITED_KEPT = 10_000  # threads remembered as awaited elsewhere, at most
_CHECK_EVERY = 1.0  # seconds between a follower's looks at a remote run's row (its executor may die)
_STATUSES = frozenset(get_args(RunStatus))


def _nothing(*_: Any) -> None:
    return None


class Peers:
    """One runtime's side of the conversation with the other processes on its database."""

    def __init__(self, worker_id: str, storage: RunStorage, streams: Streams) -> None:
        self.me = worker_id
        self.storage = storage
        self.streams = streams
        self.coordinator: Coordinator | None = None
        # What the others' messages make this process do; set by start().
        self._kick: Callable[[], None] = _nothing
        self._cancel: Callable[[str, CancelAction], object] = _nothing
        self._mail: Callable[[str], None] = _nothing
        self._executing: Callable[[str], bool] = lambda run_id: False
        self._missed: Callable[[], None] = _nothing
        self._watched: dict[str, tuple[float, bool]] = {}  # run -> (when asked, wants values), not started here
        self._relays: dict[str, _Relay] = {}  # runs executed here that others follow
        # Threads with runs queued elsewhere, maybe behind a run of this process (oldest first, bounded).
        self._awaited: dict[str, None] = {}
        self._remote: dict[str, _Feed] = {}  # runs executed elsewhere that somebody here follows
        self._followers_missed: dict[Callable[[], None], None] = {}  # thread followers' calls once messages were lost
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def shared(self) -> bool:
        """Whether other processes share the database (runs may execute, or be followed, elsewhere)."""
        return self.coordinator is not None

    async def start(self, coordinator: Coordinator, *, kick: Callable[[], None],
                    cancel: Callable[[str, CancelAction], object], mail: Callable[[str], None],
                    executing: Callable[[str], bool], missed_mail: Callable[[], None]) -> None:
        """Listen to the other processes: ``kick`` the scheduler, ``cancel`` a run executing here, tell
        this process of ``mail`` for a thread (or, after messages were lost, ``missed_mail`` for any
        thread), and ask whether a run is ``executing`` here."""
        self._kick, self._cancel, self._mail, self._executing = kick, cancel, mail, executing
        self._missed = missed_mail
        self.coordinator = coordinator
        await coordinator.start(self._receive)

    async def stop(self) -> None:
        for task in [*self._tasks, *(feed.heard for feed in self._remote.values())]:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.coordinator is not None:
            coordinator, self.coordinator = self.coordinator, None
            await coordinator.stop()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _send(self, kind: str, topic: str | None = None, **fields: Any) -> None:
        if self.coordinator is not None:
            self.coordinator.publish({"k": kind, "w": self.me, **fields}, topic)

    # -- what this process tells the others

    def kick(self) -> None:
        """Runs queued elsewhere may start now (a thread this process ran is free)."""
        self._send("kick")

    def queued(self, thread_id: str) -> None:
        """A run was queued here behind runs of other processes on ``thread_id``."""
        self._send("queued", thread=thread_id)

    def cancel(self, run_id: str, action: CancelAction) -> None:
        self._send("cancel", run=run_id, action=action)

    def mail(self, thread_id: str) -> None:
        self._send("mail", thread=thread_id)

    def created(self, row: RunRow) -> None:
        """A run was made here: the thread's followers in other processes follow it too."""
        if self.coordinator is not None:
            self.coordinator.publish(*self._created(row))

    def created_notice(self, row: RunRow) -> Notice | None:
        """What :meth:`created` says, to go with the write that stores the run (no message of its own); ``None``
        if it cannot go so, or nobody else shares the database."""
        return None if self.coordinator is None else self.coordinator.notice(*self._created(row))

    def _created(self, row: RunRow) -> tuple[dict[str, Any], str]:
        return {"k": "created", "w": self.me, "thread": row.thread_id, "run": row.run_id}, _thread_topic(row.thread_id)

    async def hear_thread(self, thread_id: str, missed: Callable[[], None]) -> Callable[[], None]:
        """Hear of the thread's runs made in other processes, from when this returns on, and call ``missed`` once
        some may have gone unheard (until the function it returns is called): a thread's follower here must be
        heard of before it looks for the runs under way, and look again after a gap."""
        coordinator = self.coordinator
        if coordinator is None:
            return _nothing
        topic = _thread_topic(thread_id)
        await coordinator.subscribe(topic)
        self._followers_missed[missed] = None

        def stop() -> None:
            coordinator.unsubscribe(topic)
            self._followers_missed.pop(missed, None)

        return stop

    def follow(self, row: RunRow, values: bool) -> RunStream:
        """A local stream of a run another process executes (or will), fed by its executor from its start."""
        feed = self._remote.get(row.run_id)
        if feed is None:
            stream = RunStream(row.run_id, resumable=True)
            feed = self._remote[row.run_id] = _Feed(stream, row.worker_id, self._hear_run(row.run_id))
            self.streams.add(stream)
            self._spawn(self._check_remote(row.run_id, feed))
        elif feed.values or not values:
            return feed.stream  # asked for already
        feed.values = feed.values or values
        self._watch(row.run_id, feed)
        return feed.stream

    async def _hear_run(self, run_id: str) -> None:
        if self.coordinator is not None:
            await self.coordinator.subscribe(_run_topic(run_id))

    def _watch(self, run_id: str, feed: _Feed) -> None:
        """Ask the run's executor for its events (from the first): once they are heard here."""
        def ask(_: object = None) -> None:
            if self._remote.get(run_id) is feed:
                self._send("watch", run=run_id, after=0, values=feed.values)

        if feed.heard.done():
            ask()
        else:
            feed.heard.add_done_callback(ask)

    # -- runs executed here

    def follows(self, run_id: str) -> bool:
        """Whether this process follows the run as it executes elsewhere."""
        return run_id in self._remote

    def run_started(self, row: RunRow, stream: RunStream) -> None:
        """Relay the run's events if somebody elsewhere asked to follow it before it started here."""
        if self._remote.pop(row.run_id, None) is not None and stream.last_seq:
            stream.bus.seq = stream.last_seq  # taken over from its dead executor: number on from there
        asked = self._watched.pop(row.run_id, None)
        if asked is not None:
            self._relay(row.run_id, stream, 0, asked[1])

    def run_ended(self, row: RunRow, status: RunStatus, error: dict[str, Any] | None) -> None:
        """Tell the run's followers elsewhere, and the processes with runs queued behind it."""
        relay = self._relays.pop(row.run_id, None)
        if relay is not None:
            relay.close(status, error)
        if row.thread_id in self._awaited:
            del self._awaited[row.thread_id]
            self.kick()

    def _relay(self, run_id: str, stream: RunStream, after: int, values: bool) -> None:
        relay = self._relays.get(run_id)
        if relay is None:
            relay = self._relays[run_id] = _Relay(self, run_id, stream)
        relay.replay(after, values)

    # -- what the others tell this process

    def _receive(self, message: dict[str, Any]) -> None:
        kind = message.get("k")
        handler = getattr(self, f"_on_{kind}", None)
        if handler is None:
            logger.warning("unknown message from another process: %r", message)
            return
        try:
            handler(message)
        except Exception:  # one bad message must not stop the listener
            logger.exception("cannot handle a message from another process: %r", message)

    def _on_kick(self, message: dict[str, Any]) -> None:
        if message["w"] != self.me:
            self._kick()

    def _on_queued(self, message: dict[str, Any]) -> None:
        if message["w"] != self.me:
            self._awaited[message["thread"]] = None
            while len(self._awaited) > _AWAITED_KEPT:
                del self._awaited[next(iter(self._awaited))]

    def _on_cancel(self, message: dict[str, Any]) -> None:
        if message["action"] in ("interrupt", "rollback"):
            self._cancel(message["run"], message["action"])

    def _on_mail(self, message: dict[str, Any]) -> None:
        self._mail(message["thread"])

    def _on_created(self, message: dict[str, Any]) -> None:
        if message["w"] != self.me and self.streams.watching(message["thread"]):
            self._spawn(self._announce(message["run"]))

    async def _announce(self, run_id: str) -> None:
        try:
            row = await self.storage.get_run(run_id)
        except StorageUnavailableError:
            return  # the database is gone: the run cannot start either until it is back
        if row is not None:  # ended already, it is shown all the same: its executor sends how it ended
            self.streams.announce(row, self.follow(row, values=True))  # values: a follower may want them

    def _on_missed(self, message: dict[str, Any]) -> None:
        """Messages were lost while the connection was down: look again for what they may have said."""
        self._kick()
        self._missed()
        for run_id, feed in self._remote.items():
            self._watch(run_id, feed)
        for missed in list(self._followers_missed):  # thread followers: they read back the runs made meanwhile
            missed()

    def _on_watch(self, message: dict[str, Any]) -> None:
        run_id = message["run"]
        if run_id in self._remote:
            return  # this process follows it too; it is not the executor
        stream = self.streams.get(run_id)
        if stream is not None and self._executing(run_id):
            self._relay(run_id, stream, message["after"], message["values"])
        elif stream is not None and stream.status is not None:  # it ended here already
            _Relay(self, run_id, stream).close(stream.status, stream.error, replay=message["after"],
                                               values=message["values"])
        else:
            now = time.monotonic()
            self._watched[run_id] = (now, bool(message["values"]))
            for old in [r for r, (at, _) in self._watched.items() if now - at > _WATCH_KEPT]:
                del self._watched[old]

    def _on_events(self, message: dict[str, Any]) -> None:
        feed = self._remote.get(message["run"])
        if feed is not None:
            feed.add(message["w"], [_event_from_wire(message["run"], e) for e in message["events"]])

    def _on_end(self, message: dict[str, Any]) -> None:
        feed = self._remote.get(message["run"])
        if feed is not None and message["status"] in _STATUSES:
            self._end_remote(message["run"], feed, cast(RunStatus, message["status"]), message.get("error"))

    def _end_remote(self, run_id: str, feed: _Feed, status: RunStatus, error: dict[str, Any] | None) -> None:
        if self._remote.pop(run_id, None) is not None:
            feed.stream.finish(status, error=error)
            self.streams.retire(feed.stream)
            feed.heard.add_done_callback(functools.partial(self._stop_hearing, run_id))
            feed.heard.cancel()

    def _stop_hearing(self, run_id: str, heard: asyncio.Future[None]) -> None:
        if not heard.cancelled() and heard.exception() is None and self.coordinator is not None:
            self.coordinator.unsubscribe(_run_topic(run_id))

    async def _check_remote(self, run_id: str, feed: _Feed) -> None:
        """Watch the run's row: end the stream if it ended unseen, ask again if another process took it over."""
        while run_id in self._remote:
            await asyncio.sleep(_CHECK_EVERY)
            try:
                row = await self.storage.get_run(run_id)
            except StorageUnavailableError:
                continue  # look again once the database is back
            if row is None or row.status not in ACTIVE:
                self._end_remote(run_id, feed, row.status if row else "interrupted", row.error if row else None)
                return
            if row.worker_id != feed.worker_id:
                feed.worker_id = row.worker_id
                self._watch(run_id, feed)


class _Relay:
    """Sends the events of a run executed here to the processes that follow it, a batch per loop tick."""

    def __init__(self, peers: Peers, run_id: str, stream: RunStream) -> None:
        self.peers = peers
        self.run_id = run_id
        self.stream = stream
        self._pending: list[dict[str, Any]] = []
        self._flushing = False
        self._unsubscribe: Callable[[], None] | None = None
        self._values = False  # a follower asked for the run's values
        self._sent_values = False  # and it has had some (later steps' values follow, once asked for)

    def replay(self, after: int, values: bool) -> None:
        """Send the kept events after ``after`` (a new follower), then every event from now on."""
        self._values = self._values or values
        self.stream.bus.wants_values = self.stream.bus.wants_values or values
        if self._unsubscribe is None:
            self.stream.keep_events()
            self._unsubscribe = self.stream.bus.subscribe(self._add)
        start = min(after, self._pending[0]["seq"] - 1) if self._pending else after  # unsent ones stay
        self._pending = [self._to_wire(e) for e in self.stream.events if e.seq > start]
        self._schedule()

    def _add(self, event: Event) -> None:
        self._pending.append(self._to_wire(event))
        self._schedule()

    def _to_wire(self, event: Event) -> dict[str, Any]:
        if event.type == "values" and not event.namespace:
            self._sent_values = True
        return _event_to_wire(event)

    def _schedule(self) -> None:
        if not self._flushing and self._pending:
            self._flushing = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flushing = False
        if self._pending:
            events, self._pending = self._pending, []
            self.peers._send("events", _run_topic(self.run_id), run=self.run_id, events=events)

    def close(self, status: RunStatus, error: dict[str, Any] | None, *, replay: int | None = None,
              values: bool = False) -> None:
        """Send what is left and the run's end; ``replay`` (a follower asking after the end): the kept events
        after it, ``values``: with the run's final values."""
        self._values = self._values or values
        if replay is not None:
            self._pending = [self._to_wire(e) for e in self.stream.events if e.seq > replay]
        if self._unsubscribe is not None:
            self._unsubscribe()
        if self._values and not self._sent_values and self.stream.final_values is not None:
            # The run ended before its values were asked for (or as they were): send the state it ended in.
            self._pending.append(self._final_values())
        self._flush()
        self.peers._send("end", _run_topic(self.run_id), run=self.run_id, status=status, error=error)

    def _final_values(self) -> dict[str, Any]:
        stream = self.stream
        data = dict(stream.final_values or {})
        if stream.interrupts:
            data["__interrupt__"] = stream.interrupts
        thread_id = stream.final_row.thread_id if stream.final_row is not None else None
        return _event_to_wire(Event("values", data, (), "", thread_id, self.run_id, stream.bus.seq + 1))


class _Feed:
    """A followed remote run: its local stream, fed by the run's executor.

    Events keep their executor's numbers, so a ``Last-Event-ID`` means the same on every process;
    when another process takes the run over (its events start again at 1), they follow on.
    """

    def __init__(self, stream: RunStream, worker_id: str | None, hear: Coroutine[Any, Any, None]) -> None:
        self.stream = stream
        self.worker_id = worker_id  # the executor, as the run's row last said
        self.heard = asyncio.ensure_future(hear)  # done once the run's events are heard here
        self.values = False
        self._sender: str | None = None  # the executor whose events arrive now
        self._gone: set[str] = set()  # earlier executors: what they still send is stale
        self._base = 0  # the last number before the current executor's first event
        self._last = 0  # the current executor's last event number

    def add(self, worker: str, events: list[Event]) -> None:
        if worker != self._sender:
            if worker in self._gone:
                return
            if self._sender is not None:
                self._gone.add(self._sender)
                self._base += self._last
            self._sender, self._last = worker, 0
        for event in events:
            if event.seq <= self._last:
                continue  # sent again for another follower
            self._last = event.seq
            event.seq += self._base
            self.stream.add(event)


def _thread_topic(thread_id: str) -> str:
    return f"thread:{thread_id}"


def _run_topic(run_id: str) -> str:
    return f"run:{run_id}"


def _event_to_wire(event: Event) -> dict[str, Any]:
    return {"type": event.type, "data": to_jsonable(event.data), "ns": list(event.namespace), "agent": event.agent,
            "thread": event.thread_id, "seq": event.seq}


def _event_from_wire(run_id: str, wire: dict[str, Any]) -> Event:
    data = wire["data"]
    if wire["type"] in ("tool", "message") and isinstance(data, dict) and isinstance(data.get("message"), dict):
        data = {**data, "message": message_from_dict(data["message"])}
    return Event(wire["type"], data, tuple(wire["ns"]), wire["agent"], wire["thread"], run_id, wire["seq"])
