"""Crons in the embedded runtime (``rt.crons``, as langgraph_sdk's CronClient), on every backend: schedules read
as LangGraph reads them, ticks fired by the runtime's own loop, an end time honoured."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from runtime_helpers import contents, echo_agent, user

from backchannel import InvalidRequestError, NotFoundError
from backchannel.runtime.crons import next_tick, utc_text


def test_schedules_are_read_in_utc_or_their_timezone_with_optional_seconds():
    winter = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
    assert next_tick("0 9 * * *", None, winter) == datetime(2026, 1, 16, 9, 0, tzinfo=UTC)
    assert next_tick("0 9 * * *", "America/New_York", winter) == datetime(2026, 1, 15, 14, 0, tzinfo=UTC)
    summer = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
    assert next_tick("0 9 * * *", "America/New_York", summer) == datetime(2026, 7, 15, 13, 0, tzinfo=UTC)
    assert next_tick("* * * * * */10", None, winter) == winter + timedelta(seconds=10)
    assert utc_text("2026-01-15T09:00:00-05:00") == "2026-01-15T14:00:00.000000+00:00"
    assert utc_text("2026-01-15T09:00:00") == "2026-01-15T09:00:00.000000+00:00"  # no offset: UTC


async def test_a_cron_on_a_thread_fires_each_second_with_its_runs_options(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = (await rt.threads.create())["thread_id"]
    cron = await rt.crons.create_for_thread(thread, "agent", schedule="* * * * * *", input=user("tick"),
                                            metadata={"source": "cron"})
    await asyncio.sleep(2.4)
    await rt.crons.delete(cron["cron_id"])
    runs = await rt.runs.list(thread, limit=100)
    ticks = sorted(r["metadata"]["cron_tick"] for r in runs)
    assert 2 <= len(ticks) <= 3 and len(set(ticks)) == len(ticks), ticks
    assert all(r["metadata"]["source"] == "cron" and r["metadata"]["cron_id"] == cron["cron_id"] for r in runs)
    assert contents(await rt.runs.join(thread, runs[0]["run_id"]))[-2:] == ["tick", "echo: tick"]


async def test_a_cron_stops_at_its_end_time(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = (await rt.threads.create())["thread_id"]
    ends = datetime.now(UTC) + timedelta(seconds=1.2)
    await rt.crons.create_for_thread(thread, "agent", schedule="* * * * * *", input=user("tick"), end_time=ends)
    await asyncio.sleep(2.5)
    ticks = [r["metadata"]["cron_tick"] for r in await rt.runs.list(thread, limit=100)]
    assert 1 <= len(ticks) <= 2 and all(datetime.fromisoformat(t) <= ends for t in ticks), (ticks, ends)


async def test_bad_crons_are_refused(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    with pytest.raises(InvalidRequestError, match="Invalid cron schedule"):
        await rt.crons.create("agent", schedule="61 * * * *")
    with pytest.raises(InvalidRequestError, match="on_run_completed"):
        await rt.crons.create("agent", schedule="0 9 * * *", on_run_completed="archive")
    with pytest.raises(TypeError):
        await rt.crons.create("agent", schedule="0 9 * * *", inptu=user("typo"))
    with pytest.raises(NotFoundError):
        await rt.crons.create_for_thread("no-such-thread", "agent", schedule="0 9 * * *")
    cron = await rt.crons.create("agent", schedule="0 9 * * *")
    with pytest.raises(InvalidRequestError, match="at least one"):
        await rt.crons.update(cron["cron_id"])
    with pytest.raises(InvalidRequestError, match="sort"):
        await rt.crons.search(sort_by="payload")
    assert await rt.crons.count() == 1


async def test_only_runtimes_serving_a_crons_agent_fire_it(make_runtime, store_url):
    if store_url == "memory":
        pytest.skip("a memory store is one runtime's own")
    rt = await make_runtime({"agent": echo_agent()})
    await make_runtime({"other": echo_agent()}, store=store_url)  # shares the database, not the agent
    thread = (await rt.threads.create())["thread_id"]
    cron = await rt.crons.create_for_thread(thread, "agent", schedule="* * * * * *", input=user("tick"))
    await asyncio.sleep(3.4)
    await rt.crons.delete(cron["cron_id"])
    ticks = sorted(datetime.fromisoformat(r["metadata"]["cron_tick"]) for r in await rt.runs.list(thread, limit=100))
    assert len(ticks) >= 3 and all(b - a == timedelta(seconds=1) for a, b in zip(ticks, ticks[1:])), ticks
