"""Recovery: heartbeats, and taking over the runs of processes that died.

Every runtime registers itself as a worker and renews that registration every
``heartbeat_interval`` seconds. A worker whose heartbeat is older than the
``lease`` (or, on this machine, whose process is gone) is dead: its pending
and running runs are given to a live runtime, as pending, and continue from
their last checkpoints. On a database one process uses at a time this happens
when a runtime opens it; on a shared one (Postgres), every live runtime looks
every ``heartbeat_interval`` seconds. A runtime that finds its own registration
gone was taken for dead: it stops its runs, which continue elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

from backchannel._clock import now_iso
from backchannel.errors import StorageUnavailableError
from backchannel.runtime.mail import Mail
from backchannel.runtime.scheduler import Scheduler
from backchannel.runtime.storage import Storage

__all__ = ["Recovery"]

logger = logging.getLogger("backchannel")


class Recovery:
    """This runtime's heartbeats, and its take-overs of dead workers' runs."""

    def __init__(self, storage: Storage, scheduler: Scheduler, mail: Mail, *, worker_id: str,
                 heartbeat_interval: float, lease: float) -> None:
        self.storage = storage
        self.scheduler = scheduler
        self.mail = mail
        self.worker_id = worker_id
        self.heartbeat_interval = heartbeat_interval
        self.lease = lease

    async def register(self) -> None:
        """Register this runtime as a live worker."""
        await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso())

    async def unregister(self) -> None:
        await self.storage.forget_worker(self.worker_id)

    async def recover(self, *, opening: bool = True) -> None:
        """Requeue, for this runtime, the runs of workers that are no longer alive."""
        workers = await self.storage.workers()
        alive = [w for w, (info, beat) in workers.items() if _is_alive(info, beat, self.lease)]
        for dead in workers.keys() - set(alive):
            await self.storage.forget_worker(dead)
        recovered = await self.storage.requeue_orphans(alive, self.worker_id)
        for row in recovered:
            self.scheduler.queued(row.run_id)
            await self.storage.update_thread(row.thread_id, status="busy")
        if opening or recovered:
            await self.mail.wake_all()
        self.scheduler.kick()

    async def heartbeat_forever(self) -> None:
        # A loop of its own, so no other work delays a heartbeat past the lease.
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                known = await self.storage.heartbeat(self.worker_id, _worker_info(), now_iso())
            except StorageUnavailableError:  # the database takes no writes now: the next beat may get through
                continue
            if not known:
                self._stop_runs_taken_over()

    async def take_over_forever(self) -> None:
        """On a shared database: take over the runs of processes that died."""
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            with contextlib.suppress(StorageUnavailableError):  # try again at the next look
                await self.recover(opening=False)

    def _stop_runs_taken_over(self) -> None:
        """Other processes took this one for dead (it missed its heartbeats) and took its runs: stop them here."""
        if self.scheduler.executing:
            logger.warning("this runtime missed its heartbeats for %.0f s; %d runs it was running continue "
                           "elsewhere", self.lease, self.scheduler.executing)
        self.scheduler.stop_all()  # as when closing: the runs' rows are left to their new owner


def _worker_info() -> dict[str, Any]:
    return {"pid": os.getpid(), "host": socket.gethostname()}


def _is_alive(info: dict[str, Any], heartbeat_at: str, lease: float) -> bool:
    if info.get("host") == socket.gethostname():
        try:
            os.kill(int(info["pid"]), 0)
        except (ProcessLookupError, ValueError, KeyError):
            return False
        except PermissionError:
            pass
    return datetime.now(UTC) - datetime.fromisoformat(heartbeat_at) < timedelta(seconds=lease)
