"""A thread's inbox: messages that arrive while a run is active (task notifications).

Each message is stored once per idempotency key before anything else
happens, so a crash neither loses nor duplicates it. An active run takes the
messages before its next model call; a message that arrives while the thread
is idle wakes it with a new run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.messages import AnyMessage, HumanMessage, messages_from_input
from backchannel.runtime.rows import RunClaim
from backchannel.runtime.storage import InboxStorage

__all__ = ["ThreadInbox", "notification_in"]


def notification_in(value: Any) -> HumanMessage | None:
    """The task notification a run's input consists of, if it is exactly one (else ``None``).

    A background task on another server reports back with ``runs.create`` on its
    supervisor's thread; this is how the supervisor's runtime tells such a run
    from user input, so it can deliver it once, like a local notification.
    """
    if not isinstance(value, Mapping) or set(value) != {"messages"}:
        return None
    raw = value["messages"]
    if not isinstance(raw, Sequence) or isinstance(raw, str) or len(raw) != 1:
        return None
    candidate = raw[0]
    kwargs = candidate.get("additional_kwargs") if isinstance(candidate, Mapping) else getattr(
        candidate, "additional_kwargs", None)
    note = (kwargs or {}).get("task_notification")
    if not isinstance(note, Mapping) or not note.get("task_id") or not note.get("run_id"):
        return None
    (message,) = messages_from_input(raw)
    return message if isinstance(message, HumanMessage) else None


_NONE_TAKEN: frozenset[str] = frozenset()  # one for every inbox yet to take mail (an empty frozenset is not shared)


class ThreadInbox:
    """The :class:`~backchannel.context.Inbox` of one active run."""

    __slots__ = ("storage", "thread_id", "claim", "_messages", "_taken", "_waiters")

    def __init__(self, storage: InboxStorage, thread_id: str, waiting: Sequence[tuple[str, AnyMessage]] = (), *,
                 claim: RunClaim | None = None) -> None:
        self.storage = storage
        self.thread_id = thread_id
        self.claim = claim  # the run's: mail it takes is marked delivered only while the run is still its
        self._messages: dict[str, AnyMessage] = dict(waiting)
        # Keys this run delivered: the same mail announced again is ignored. Until a first ack, and
        # without a waiter, an inbox holds no more than it must (thousands of subagents each have one).
        self._taken: frozenset[str] = _NONE_TAKEN
        self._waiters: tuple[asyncio.Future[None], ...] = ()  # (rarely more than one: a tuple made when one waits)

    def push(self, key: str, message: AnyMessage) -> None:
        """A message for this run (already stored)."""
        if key in self._taken or key in self._messages:
            return
        self._messages[key] = message
        waiters, self._waiters = self._waiters, ()
        for waiter in waiters:
            if not waiter.done():  # its run may have been cancelled
                waiter.set_result(None)

    def drain(self) -> list[AnyMessage]:
        return list(self._messages.values())

    async def ack(self, messages: Sequence[AnyMessage]) -> None:
        delivered = {m.id for m in messages}
        keys = [k for k, m in self._messages.items() if m.id in delivered]
        for key in keys:
            del self._messages[key]
        self._taken = self._taken.union(keys)
        await self.storage.ack_inbox(self.thread_id, keys, self.claim)

    async def wait(self) -> None:
        """Until a message is here."""
        if not self._messages:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters = (*self._waiters, waiter)
            await waiter
