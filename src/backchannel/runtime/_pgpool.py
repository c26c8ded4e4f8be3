"""A small pool of autocommit psycopg connections, for the Postgres storage.

Taking a connection and giving it back costs a deque operation: the storage
makes a dozen statements per run, and psycopg_pool's bookkeeping cost about as
much CPU as the statements themselves. Connections open as needed, up to
``size``; one that broke (or was cut off mid-statement) is dropped and its
slot reopened by the next taker.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

from psycopg import AsyncConnection

__all__ = ["ConnectionPool"]

logger = logging.getLogger("backchannel")


class ConnectionPool:
    """Up to ``size`` connections to ``url``; ``async with pool.connection() as conn: ...``."""

    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.size = size
        self._idle: deque[AsyncConnection[Any]] = deque()
        self._waiters: deque[asyncio.Future[AsyncConnection[Any] | None]] = deque()
        self._open = 0  # connections opened and not dropped, idle or lent
        self._closed = False

    def connection(self) -> _Lent:
        return _Lent(self)

    async def acquire(self) -> AsyncConnection[Any]:
        if self._closed:
            raise RuntimeError("the storage is not open")
        if self._idle:
            return self._idle.pop()
        if self._open < self.size:
            return await self._connect()
        waiter: asyncio.Future[AsyncConnection[Any] | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            conn = await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # handed over just as the taker gave up
                self.release(waiter.result())
            raise
        return conn if conn is not None else await self._connect()  # None: a slot was freed

    async def _connect(self) -> AsyncConnection[Any]:
        self._open += 1
        try:
            return await AsyncConnection.connect(self.url, autocommit=True)
        except BaseException:
            self._open -= 1
            self._hand_over(None)
            raise

    def release(self, conn: AsyncConnection[Any] | None, *, broken: bool = False) -> None:
        """Give ``conn`` back; a broken one is closed and its slot freed."""
        if conn is None:
            return
        if broken or conn.closed or self._closed:
            self._open -= 1
            asyncio.get_running_loop().create_task(_close_quietly(conn))
            self._hand_over(None)
            return
        if not self._hand_over(conn):
            self._idle.append(conn)

    def _hand_over(self, conn: AsyncConnection[Any] | None) -> bool:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = list(self._idle), deque()
        self._open -= len(idle)
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(RuntimeError("the storage is not open"))
        await asyncio.gather(*(_close_quietly(c) for c in idle))


class _Lent:
    """``async with``: a connection for the block; dropped if the block was cut off or the connection broke."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._conn: AsyncConnection[Any] | None = None

    async def __aenter__(self) -> AsyncConnection[Any]:
        self._conn = await self._pool.acquire()
        return self._conn

    async def __aexit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        conn = self._conn
        self._conn = None
        # A statement cut off by a cancellation leaves the connection mid-protocol: drop it.
        cut_off = kind is not None and issubclass(kind, asyncio.CancelledError)
        broken = cut_off or (conn is not None and conn.broken)
        self._pool.release(conn, broken=broken)


async def _close_quietly(conn: AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception as exc:  # closing a broken connection may fail; it is gone either way
        logger.debug("closing a Postgres connection: %s", exc)
