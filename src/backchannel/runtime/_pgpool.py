"""A small pool of autocommit psycopg connections, for the Postgres storage.

Taking a connection and giving it back costs a deque operation: the storage
makes a dozen statements per run, and psycopg_pool's bookkeeping cost about as
much CPU as the statements themselves. Connections open as needed, up to
``size``; one that broke (or was cut off mid-statement) is dropped and its
slot reopened by the next taker.

When the database restarts, it closes every session: an idle connection it
closed is dropped as it is taken (its socket reads as closed), so the first
requests after a restart get fresh connections rather than errors. A failure
to reach the database, or a connection lost mid-statement, is raised as
:class:`~backchannel.errors.StorageUnavailableError`.
"""

from __future__ import annotations

import asyncio
import logging
import select
import time
from collections import deque
from typing import Any

import psycopg
from psycopg import AsyncConnection

from backchannel.errors import StorageUnavailableError

__all__ = ["ConnectionPool", "unavailable"]

logger = logging.getLogger("backchannel")

IDLE_IN_TRANSACTION_LIMIT = 10  # seconds a transaction may wait for its client before the server ends it


class ConnectionPool:
    """Up to ``size`` connections to ``url``; ``async with pool.connection() as conn: ...``."""

    def __init__(self, url: str, size: int) -> None:
        self.url = url
        self.size = size
        self._idle: deque[AsyncConnection[Any]] = deque()
        self._waiters: deque[asyncio.Future[AsyncConnection[Any] | None]] = deque()
        self._open = 0  # connections opened and not dropped, idle or lent
        self._closed = False
        self._unreachable_since: float | None = None  # time.monotonic() of the first failed connect

    def connection(self) -> _Lent:
        return _Lent(self)

    async def acquire(self) -> AsyncConnection[Any]:
        if self._closed:
            raise RuntimeError("the storage is not open")
        while self._idle:
            idle = self._idle.pop()
            if not _closed_by_server(idle):
                return idle
            self.release(idle, broken=True)  # frees its slot
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
            conn = await _open(self.url)
        except BaseException as exc:
            self._open -= 1
            self._hand_over(None)
            if isinstance(exc, psycopg.OperationalError):
                if self._unreachable_since is None:  # logged once per outage, not per attempt
                    self._unreachable_since = time.monotonic()
                    logger.warning("cannot reach the database (%s); writes are refused until it is back",
                                   _first_line(exc))
                raise StorageUnavailableError(f"the database is unreachable: {_first_line(exc)}") from exc
            raise
        if self._unreachable_since is not None:
            logger.warning("the database is reachable again, after %.1f s",
                           time.monotonic() - self._unreachable_since)
            self._unreachable_since = None
        return conn

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


async def _open(url: str) -> AsyncConnection[Any]:
    conn = await AsyncConnection.connect(url, autocommit=True)
    try:
        # A process stopped mid-transaction (SIGSTOP, a paused VM) would hold the locks of the rows it wrote for as
        # long as it stays stopped, and the processes taking its runs over would wait on them: the server ends
        # such a transaction (ours idle only while the event loop lags, a second or two on a loaded machine).
        await conn.execute(f"SET idle_in_transaction_session_timeout = '{IDLE_IN_TRANSACTION_LIMIT}s'")
    except BaseException:
        await _close_quietly(conn)
        raise
    return conn


class _Lent:
    """``async with``: a connection for the block; dropped if the block was cut off or the connection broke."""

    __slots__ = ("_conn", "_pool")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool
        self._conn: AsyncConnection[Any] | None = None

    async def __aenter__(self) -> AsyncConnection[Any]:
        self._conn = await self._pool.acquire()
        return self._conn

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        conn = self._conn
        self._conn = None
        # A statement cut off by a cancellation leaves the connection mid-protocol: drop it.
        cut_off = kind is not None and issubclass(kind, asyncio.CancelledError)
        broken = cut_off or (conn is not None and (conn.broken or conn.closed))
        self._pool.release(conn, broken=broken)
        if exc is not None and conn is not None:
            error = unavailable(conn, exc)
            if error is not exc:
                raise error from exc


# SQLSTATE classes and codes that say the database (not the statement) failed: connection exceptions,
# insufficient resources (disk full, out of memory, too many connections), shutdown and crash shutdown.
_UNAVAILABLE_CLASSES = ("08", "53")
_UNAVAILABLE_CODES = frozenset({"57P01", "57P02", "57P03"})


def unavailable(conn: AsyncConnection[Any], exc: BaseException) -> BaseException:
    """What to raise for ``exc`` from a statement on ``conn``: a :class:`StorageUnavailableError` when it
    says the database cannot be used now (rather than that the statement is wrong), else ``exc`` itself."""
    if not isinstance(exc, psycopg.OperationalError):
        return exc
    state = exc.sqlstate
    if conn.broken or conn.closed or state is None or state[:2] in _UNAVAILABLE_CLASSES \
            or state in _UNAVAILABLE_CODES:
        return StorageUnavailableError(f"lost the connection to the database: {_first_line(exc)}")
    return exc


def _closed_by_server(conn: AsyncConnection[Any]) -> bool:
    """Whether an idle connection is gone: closed here, or its socket readable (the server closed it,
    or sent the message that it is shutting down; an idle session receives nothing else we use)."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


async def _close_quietly(conn: AsyncConnection[Any]) -> None:
    try:
        await conn.close()
    except Exception as exc:  # closing a broken connection may fail; it is gone either way
        logger.debug("closing a Postgres connection: %s", exc)
