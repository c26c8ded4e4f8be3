"""Recovery: heartbeats, and taking over the runs of processes that died.

Every runtime registers itself as a worker and renews that registration every
``heartbeat_interval`` seconds. A worker whose heartbeat is older than the
``lease`` (or, on this machine, whose process is gone) is dead: its pending
and running runs are given to a live runtime, as pending, and continue from
their last checkpoints. On a database one process uses at a time this happens
when a runtime opens it; on a shared one (Postgres), every live runtime looks
every ``heartbeat_interval`` seconds. A runtime that finds its own registration
gone was taken for dead: it stops its runs, which continue elsewhere.

While the database cannot be reached, heartbeats fail everywhere alike: once it
is back, a runtime judges others by the age of their heartbeats only after a
lease of its own reconnection (by then every live runtime has renewed its own),
so an outage longer than the lease takes no live runtime for dead. Mail whose
wake-up could not be stored meanwhile wakes its thread then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from backchannel._clock import now_iso
from backchannel.errors import StorageUnavailableError
from backchannel.runtime.mail import Mail
from backchannel.runtime.scheduler import Scheduler
from backchannel.runtime.storage import Storage

__all__ = ["Recovery"]

logger = logging.getLogger("backchannel")

_RETRY = 0.1  # seconds between heartbeats while the database cannot be reached


class Recovery:
    """This runtime's heartbeats, and its take-overs of dead workers' runs."""

    def __init__(self, storage: Storage, scheduler: Scheduler, mail: Mail, *, worker_id: str,
                 heartbeat_interval: float, lease: float, served: Callable[[], Mapping[str, str]]) -> None:
        self.storage = storage
        self._served = served  # the agents this runtime serves (assistant id -> digest): it takes only their runs
        self.scheduler = scheduler
        self.mail = mail
        self.worker_id = worker_id
        self.heartbeat_interval = heartbeat_interval
        self.lease = lease
        # Since when (time.monotonic()) the database has answered without a break; None: it does not.
        self._reachable_since: float | None = None
        self._mail_due = asyncio.Event()  # a heartbeat went through: wake-ups that failed may be retried
        self._mail_lost = False  # the database came back: mail stored as it went away may have no run to take it

    async def register(self) -> None:
        """Register this runtime as a live worker."""
        await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso())
        self._reachable_since = time.monotonic() - self.lease  # ages can be trusted at once

    async def unregister(self) -> None:
        await self.storage.forget_worker(self.worker_id)

    async def recover(self, *, opening: bool = True) -> None:
        """Requeue, for this runtime, the runs of workers that are no longer alive."""
        workers = await self.storage.workers()
        lease = self.lease if self._ages_trusted() else None  # until then, only processes seen gone are dead
        alive = [w for w, (info, beat) in workers.items() if w == self.worker_id or _is_alive(info, beat, lease)]
        for dead in workers.keys() - set(alive):
            await self.storage.forget_worker(dead)
        # The oldest first, as many as start at once: their claims go while the rest are taken over (with
        # thousands queued, the rest take longer than starting the first).
        first = max(self.scheduler.max_concurrency, 1)
        recovered = await self._requeue(alive, limit=first)
        if len(recovered) == first:
            await asyncio.sleep(0)  # the scheduler, kicked, begins its claim of them
            await self.scheduler.started_claims()  # committed on its own, not with the long statement
            recovered += await self._requeue(alive, limit=None)
        if opening or recovered:
            await self.mail.wake_all()
        self.scheduler.kick()

    async def _requeue(self, alive: list[str], *, limit: int | None) -> list[str]:
        """Take over the runs of dead workers (at most ``limit``) and tell the scheduler."""
        recovered = await self.storage.requeue_orphans(alive, self.worker_id, self._served(), limit=limit)
        for run_id in recovered:  # their threads are busy already (requeue_orphans)
            self.scheduler.queued(run_id)
        if recovered:
            self.scheduler.kick()
        return recovered

    async def heartbeat_forever(self) -> None:
        # A loop of its own that does nothing else, so no other work delays a heartbeat past the lease (waking
        # the threads with mail once the database is back took 1.5 s at load 12, a 2 s lease taken for dead).
        while True:
            await asyncio.sleep(self.heartbeat_interval if self._reachable_since is not None else _RETRY)
            try:
                registered = await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso())
            except StorageUnavailableError as exc:
                logger.debug("heartbeat failed: %s", exc)
                self._reachable_since = None
                continue
            if self._reachable_since is None:
                self._reachable_since = time.monotonic()
                self._mail_lost = True
            if not registered:
                self._stop_runs_taken_over()
            self._mail_due.set()

    async def wake_forever(self) -> None:
        """After each heartbeat, retry the wake-ups the database refused; once it is back from an outage, wake
        every thread with mail."""
        while True:
            await self._mail_due.wait()
            self._mail_due.clear()
            lost, self._mail_lost = self._mail_lost, False
            try:
                if lost:
                    await self.mail.wake_all()
                await self.mail.retry_wakes()
            except StorageUnavailableError as exc:
                logger.debug("could not wake threads with mail yet: %s", exc)
                self._mail_lost = self._mail_lost or lost  # looked for again after the next heartbeat

    async def take_over_forever(self) -> None:
        """On a shared database: take over the runs of processes that died."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.recover(opening=False)
            except StorageUnavailableError as exc:
                logger.debug("cannot look for dead workers: %s", exc)
                self._reachable_since = None

    def _ages_trusted(self) -> bool:
        """Whether heartbeats' ages say who is dead: the database has answered for a lease without a break."""
        since = self._reachable_since
        return since is not None and time.monotonic() - since >= self.lease

    def _stop_runs_taken_over(self) -> None:
        """Other processes took this one for dead (it missed its heartbeats) and took its runs: stop them here."""
        if self.scheduler.executing:
            logger.warning("this runtime missed its heartbeats for %.0f s; %d runs it was running continue "
                           "elsewhere", self.lease, self.scheduler.executing)
        self.scheduler.stop_all()  # as when closing: the runs' rows are left to their new owner


def _worker_info() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _is_alive(info: dict[str, Any], heartbeat_at: str, lease: float | None) -> bool:
    """Whether a worker lives: its process exists (on this machine), and (with a ``lease``) it heartbeat lately."""
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            return False
        except PermissionError:
            pass
    return lease is None or datetime.now(UTC) - datetime.fromisoformat(heartbeat_at) < timedelta(seconds=lease)
