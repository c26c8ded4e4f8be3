"""Crons: schedules that start runs, fired by every runtime's own loop, each tick at most once.

A cron's schedule is a cron expression read with ``croniter`` (the library LangGraph
uses): five fields, or six with seconds last (``"* * * * * *"`` is every second), in
UTC unless the cron names a timezone. Its row keeps ``next_run_date``, the next tick.
Each runtime's :class:`CronScheduler` reads the crons due within the next second,
waits for each tick, and fires it only if it moves ``next_run_date`` from that tick
to the following one first (one atomic change, see
:meth:`~backchannel.runtime.storage.CronStorage.claim_cron_tick`): with several
processes on one database, one of them fires each tick. Ticks missed while no
runtime was running are not made up, save one: a cron found overdue fires once,
then keeps to its schedule from now on (as LangGraph's scheduler does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from backchannel.errors import BackchannelError, InvalidRequestError, StorageUnavailableError
from backchannel.runtime.rows import CronRow
from backchannel.runtime.storage import CronStorage

__all__ = ["CronScheduler", "check_schedule", "check_timezone", "next_tick", "tick_text", "utc_text"]

logger = logging.getLogger("backchannel")

_LOOK_AHEAD = 1.0  # seconds: how far ahead the loop reads due crons (others' new crons are seen this soon)
_BATCH = 100  # crons read at a time
_UNAVAILABLE_PAUSE = 0.5  # seconds between looks while the database cannot be reached


def check_schedule(schedule: str) -> str:
    """``schedule`` if croniter reads it; :class:`InvalidRequestError` naming it otherwise."""
    from croniter import croniter  # here, as in next_tick: with dateutil, 10 ms of a server's start

    if not isinstance(schedule, str) or not croniter.is_valid(schedule):
        raise InvalidRequestError(
            f"Invalid cron schedule: {schedule!r:.100}. Use the standard cron format (minute hour day_of_month "
            "month day_of_week), optionally with seconds as a sixth field: '*/5 * * * *' is every 5 minutes, "
            "'* * * * * */10' every 10 seconds.")
    return schedule


def check_timezone(timezone: str | None) -> str | None:
    """``timezone`` if it is an IANA name (``None`` stays: UTC); :class:`InvalidRequestError` otherwise."""
    if timezone is None:
        return None
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise InvalidRequestError(
            f"Invalid timezone: {timezone!r:.100}. Use an IANA name (e.g. 'America/New_York').") from None
    return timezone


def next_tick(schedule: str, timezone: str | None, after: datetime) -> datetime:
    """The schedule's first tick after ``after`` (read in ``timezone``), in UTC."""
    from croniter import croniter

    base = after.astimezone(ZoneInfo(timezone)) if timezone else after.astimezone(UTC)
    found: datetime = croniter(schedule, base).get_next(datetime)
    return found.astimezone(UTC)


def tick_text(moment: datetime) -> str:
    """A moment as crons store it: UTC ISO 8601 of fixed width, so ticks compare as text."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


def utc_text(value: datetime | str) -> str:
    """A datetime, or an ISO 8601 string (without an offset: UTC), as :func:`tick_text` writes it."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidRequestError(f"not an ISO 8601 date-time: {value!r:.100}") from None
    return tick_text(value if value.tzinfo else value.replace(tzinfo=UTC))


class CronScheduler:
    """Fires this runtime's share of the crons' ticks: ``start(cron, tick)`` makes the tick's run."""

    def __init__(self, storage: CronStorage, start: Callable[[CronRow, str], Awaitable[Any]],
                 served: Callable[[], Awaitable[Collection[str]]]) -> None:
        self.storage = storage
        self._start = start
        self._served = served  # the assistant ids of the agents this runtime runs: it fires only their crons
        self._wake = asyncio.Event()

    def kick(self) -> None:
        """A cron was made or changed here: look again now."""
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            self._wake.clear()
            try:
                pause = await self._fire_due()
            except StorageUnavailableError as exc:  # crons wait for the database, like runs
                logger.debug("cannot read crons: %s", exc)
                pause = _UNAVAILABLE_PAUSE
            except Exception:  # the loop outlives any one cron
                logger.exception("the cron loop failed; it goes on")
                pause = _LOOK_AHEAD
            if pause > 0:
                await self._sleep(pause)

    async def _fire_due(self) -> float:
        """Fire the ticks due within the look-ahead, each at its time; returns how long to pause after."""
        horizon = datetime.now(UTC) + timedelta(seconds=_LOOK_AHEAD)
        crons = await self.storage.due_crons(tick_text(horizon), _BATCH, list(await self._served()))
        for cron in crons:
            wait = (datetime.fromisoformat(cron.next_run_date) - datetime.now(UTC)).total_seconds()
            if wait > 0 and await self._sleep(wait):
                return 0.0  # kicked: a new or changed cron may come first
            await self._fire(cron)
        return 0.0 if crons else _LOOK_AHEAD

    async def _fire(self, cron: CronRow) -> None:
        tick = cron.next_run_date
        after = max(datetime.now(UTC), datetime.fromisoformat(tick))
        following = tick_text(next_tick(cron.schedule, cron.timezone, after))
        if not await self.storage.claim_cron_tick(cron.cron_id, tick, following):
            return  # fired by another process, or changed meanwhile
        try:
            await self._start(cron, tick)
        except BackchannelError as exc:  # e.g. its thread busy and the strategy 'reject': this tick is skipped
            logger.warning("cron %s could not start its run of %s: %s", cron.cron_id, tick, exc)
        except Exception:
            logger.exception("cron %s failed to start its run of %s", cron.cron_id, tick)

    async def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` or until kicked; ``True`` if kicked."""
        # A timer rather than asyncio.wait_for, which on 3.11 can swallow a cancellation (see Scheduler).
        timer = asyncio.get_running_loop().call_later(seconds, self._wake.set)
        try:
            await self._wake.wait()
        finally:
            timer.cancel()
        kicked = self._wake.is_set() and timer.when() > asyncio.get_running_loop().time()
        self._wake.clear()
        return kicked
