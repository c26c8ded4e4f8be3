"""A thread's inbox: messages that arrive while a run is active (task notifications).

Each message is stored once per idempotency key before anything else
happens, so a crash neither loses nor duplicates it. An active run takes the
messages before its next model call; a message that arrives while the thread
is idle wakes it with a new run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from backchannel.messages import AnyMessage
from backchannel.runtime.storage import Storage

__all__ = ["ThreadInbox"]


class ThreadInbox:
    """The :class:`~backchannel.context.Inbox` of one active run."""

    def __init__(self, storage: Storage, thread_id: str, waiting: Sequence[tuple[str, AnyMessage]] = ()) -> None:
        self.storage = storage
        self.thread_id = thread_id
        self._messages: dict[str, AnyMessage] = dict(waiting)
        self._arrived = asyncio.Event()
        if self._messages:
            self._arrived.set()

    def push(self, key: str, message: AnyMessage) -> None:
        """A message for this run (already stored)."""
        self._messages[key] = message
        self._arrived.set()

    def drain(self) -> list[AnyMessage]:
        return list(self._messages.values())

    async def ack(self, messages: Sequence[AnyMessage]) -> None:
        delivered = {m.id for m in messages}
        keys = [k for k, m in self._messages.items() if m.id in delivered]
        for key in keys:
            del self._messages[key]
        if not self._messages:
            self._arrived.clear()
        await self.storage.ack_inbox(self.thread_id, keys)

    async def wait(self) -> None:
        await self._arrived.wait()
