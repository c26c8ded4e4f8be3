"""Notifications for supervisors on other servers, kept until their server has taken them.

A background task whose supervisor runs on another server reports back with
``runs.create`` on the supervisor's thread there (any LangGraph-compatible
server accepts that; a backchannel server delivers it once per key). The
message is first written to this runtime's store, under the namespace
``("backchannel", "outbox")`` and its idempotency key, and leaves it only
once the other server has accepted it. While that server is down, sending is
retried with backoff, also across restarts of this one, so a result is
neither lost nor (given the receiver's idempotency) delivered twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

from backchannel.errors import BackchannelError, RemoteError, StorageUnavailableError
from backchannel.messages import AnyMessage, message_to_dict
from backchannel.protocols import StoreAPI
from backchannel.runtime.remote import RemoteRuntime

__all__ = ["NAMESPACE", "Outbox"]

NAMESPACE = ("backchannel", "outbox")
_MAX_DELAY = 60.0  # seconds between attempts, at most
_BATCH = 100
_STORE_RETRY = 0.5  # seconds between looks at the outbox while the database cannot be reached

logger = logging.getLogger("backchannel")


class Outbox:
    """The notifications this runtime still has to hand to other servers."""

    def __init__(self, store: StoreAPI, spawn: Callable[[Coroutine[Any, Any, None]], asyncio.Task[Any]]) -> None:
        self._store = store
        self._spawn = spawn
        self._sender: asyncio.Task[None] | None = None
        self._remotes: dict[str, RemoteRuntime] = {}
        self._more = asyncio.Event()

    async def put(self, key: str, *, url: str, thread_id: str, assistant_id: str | None,
                  message: AnyMessage) -> None:
        """Keep ``message`` for the thread ``thread_id`` on the server at ``url`` (once per ``key``), and send it."""
        if await self._store.get_item(NAMESPACE, key) is None:
            await self._store.put_item(NAMESPACE, key, {
                "url": url, "thread_id": thread_id, "assistant_id": assistant_id,
                "message": message_to_dict(message), "attempts": 0, "next_at": 0.0})
        self._more.set()
        self.start()

    def start(self) -> None:
        """Send what is waiting (a no-op if a sender is already at work)."""
        if self._sender is None or self._sender.done():
            self._sender = self._spawn(self._send_all())

    async def close(self) -> None:
        for remote in self._remotes.values():
            await remote.close()
        self._remotes.clear()

    async def _send_all(self) -> None:
        while True:
            self._more.clear()
            try:
                items = (await self._store.search_items(NAMESPACE, limit=_BATCH))["items"]
                if not items:
                    return
                now = time.time()
                due = [i for i in items if i["value"]["next_at"] <= now]
                await asyncio.gather(*(self._send(i["key"], i["value"]) for i in due))
            except StorageUnavailableError as exc:  # the notifications are kept: send them once it is back
                logger.info("the outbox waits for the database: %s", exc)
                await asyncio.sleep(_STORE_RETRY)
                continue
            later = [i["value"]["next_at"] for i in items if i not in due]
            if later:
                try:  # a new notification is worth trying at once; otherwise wait for the next retry
                    await asyncio.wait_for(self._more.wait(), max(0.0, min(later) - time.time()))
                except TimeoutError:
                    pass

    async def _send(self, key: str, item: Mapping[str, Any]) -> None:
        remote = self._remote(item["url"])
        try:
            await remote.runs.create(item["thread_id"], item["assistant_id"] or "agent",
                                     input={"messages": [item["message"]]}, multitask_strategy="enqueue")
        except RemoteError as exc:
            attempts = item["attempts"] + 1
            delay = min(_MAX_DELAY, 0.5 * 2 ** (attempts - 1))
            logger.info("notification %s for %s not delivered yet (attempt %d, next in %.1fs): %s",
                        key, item["url"], attempts, delay, exc)
            await self._store.put_item(NAMESPACE, key, {**item, "attempts": attempts,
                                                           "next_at": time.time() + delay})
            return
        except BackchannelError as exc:  # refused for good: the thread is gone, the request is wrong
            logger.warning("notification %s for %s dropped: %s", key, item["url"], exc)
        await self._store.delete_item(NAMESPACE, key)

    def _remote(self, url: str) -> RemoteRuntime:
        if url not in self._remotes:
            self._remotes[url] = RemoteRuntime(url, timeout=10.0)
        return self._remotes[url]
