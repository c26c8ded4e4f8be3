"""Crons over HTTP with the official ``langgraph_sdk`` client: created (stateless and on a thread), searched,
counted, changed and deleted in LangGraph's shapes; fired by the server's own loop on time, across a restart of
a real server process (SQLite file), and once per tick by three server processes on one Postgres database."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import httpx
import pytest
from langgraph_sdk import get_client
from langgraph_sdk.errors import NotFoundError
from server_helpers import ProcessServer, user

CRON_KEYS = {"cron_id", "assistant_id", "thread_id", "on_run_completed", "end_time", "schedule", "timezone",
             "created_at", "updated_at", "payload", "user_id", "next_run_date", "metadata", "enabled"}
EVERY_SECOND = "* * * * * *"  # croniter's sixth field is seconds


def when(text: str) -> datetime:
    return datetime.fromisoformat(text)


async def cron_ticks(client, thread_id: str) -> list[str]:
    """The ticks the runs a cron started on the thread were started for, oldest first."""
    runs = await client.runs.list(thread_id, limit=1000)
    return sorted(r["metadata"]["cron_tick"] for r in runs if "cron_tick" in r["metadata"])


async def test_crons_are_created_searched_counted_changed_and_deleted(client):
    tid = (await client.threads.create())["thread_id"]
    daily = await client.crons.create_for_thread(tid, "echo", schedule="0 9 * * *", input=user("morning"),
                                                 metadata={"team": "crud"})
    assert set(daily) == CRON_KEYS
    assert (daily["thread_id"], daily["schedule"], daily["enabled"], daily["on_run_completed"]) == (
        tid, "0 9 * * *", True, None)
    assert daily["payload"]["input"] == user("morning") and daily["metadata"] == {"team": "crud"}
    first = when(daily["next_run_date"])
    assert (first.hour, first.minute, first.second) == (9, 0, 0) and first - datetime.now(UTC) <= timedelta(days=1)

    ends = datetime(2099, 1, 1, tzinfo=UTC)
    weekly = await client.crons.create("echo", schedule="30 18 * * 1", timezone="America/New_York", end_time=ends,
                                       on_run_completed="keep", enabled=False, metadata={"team": "crud"})
    assert weekly["thread_id"] is None and weekly["on_run_completed"] == "keep" and not weekly["enabled"]
    assert when(weekly["end_time"]) == ends and weekly["timezone"] == "America/New_York"
    local = when(weekly["next_run_date"]).astimezone(ZoneInfo("America/New_York"))
    assert (local.weekday(), local.hour, local.minute) == (0, 18, 30)  # Mondays 18:30 in New York

    found = await client.crons.search(metadata={"team": "crud"}, sort_by="created_at", sort_order="asc")
    assert [c["cron_id"] for c in found] == [daily["cron_id"], weekly["cron_id"]]
    assert [c["cron_id"] for c in await client.crons.search(thread_id=tid)] == [daily["cron_id"]]
    assert [c["cron_id"] for c in await client.crons.search(metadata={"team": "crud"}, enabled=False)] == [
        weekly["cron_id"]]
    (picked,) = await client.crons.search(thread_id=tid, select=["cron_id", "schedule"])
    assert picked == {"cron_id": daily["cron_id"], "schedule": "0 9 * * *"}
    assert await client.crons.count(metadata={"team": "crud"}) == 2
    assert await client.crons.count(thread_id=tid) == 1
    assert await client.crons.count(assistant_id="echo", metadata={"team": "crud"}) == 2

    changed = await client.crons.update(daily["cron_id"], schedule="15 10 * * *", input=user("later"),
                                        metadata={"extra": 1})
    moved = when(changed["next_run_date"])
    assert (moved.hour, moved.minute) == (10, 15)
    assert changed["payload"]["input"] == user("later") and changed["metadata"] == {"team": "crud", "extra": 1}
    assert (await client.crons.update(weekly["cron_id"], end_time=None))["end_time"] is None

    await client.crons.delete(daily["cron_id"])
    await client.crons.delete(weekly["cron_id"])
    assert await client.crons.count(metadata={"team": "crud"}) == 0
    with pytest.raises(NotFoundError):
        await client.crons.delete(daily["cron_id"])
    with pytest.raises(NotFoundError):
        await client.http.get(f"/runs/crons/{daily['cron_id']}")


@pytest.mark.parametrize(("call", "status", "says"), [
    ({"assistant_id": "echo", "schedule": "every day at nine"}, 422, "Invalid cron schedule"),
    ({"assistant_id": "echo", "schedule": "0 9 * * *", "timezone": "Mars/Olympus_Mons"}, 422, "Invalid timezone"),
    ({"assistant_id": "echo", "schedule": "0 9 * * *", "end_time": "tomorrow"}, 422, "ISO 8601"),
    ({"assistant_id": "echo", "schedule": "0 9 * * *", "stream_mode": "everything"}, 422, "stream_mode"),
    ({"assistant_id": "nobody", "schedule": "0 9 * * *"}, 404, "nobody"),
])
async def test_a_bad_cron_is_refused_naming_what_is_wrong(client, call, status, says):
    before = await client.crons.count()
    refused = await client.http.client.post("/runs/crons", json=call)
    assert refused.status_code == status and says in refused.json()["detail"]
    missing = await client.http.client.post("/threads/00000000-0000-0000-0000-000000000000/runs/crons",
                                            json={"assistant_id": "echo", "schedule": "0 9 * * *"})
    assert missing.status_code == 404
    assert await client.crons.count() == before


async def test_a_cron_every_second_fires_five_times_in_five_seconds(client):
    tid = (await client.threads.create())["thread_id"]
    cron = await client.crons.create_for_thread(tid, "echo", schedule=EVERY_SECOND, input=user("tick"))
    await asyncio.sleep(5.0)
    await client.crons.delete(cron["cron_id"])
    ticks = await cron_ticks(client, tid)
    assert 4 <= len(ticks) <= 6, ticks
    assert len(set(ticks)) == len(ticks)
    seconds = [when(t) for t in ticks]
    assert all(b - a == timedelta(seconds=1) for a, b in zip(seconds, seconds[1:])), ticks  # none skipped
    runs = await client.runs.list(tid, limit=100)
    assert {r["metadata"]["cron_id"] for r in runs} == {cron["cron_id"]}
    assert (await client.runs.join(tid, runs[0]["run_id"]))["messages"][-1]["content"] == "echo: tick"
    await asyncio.sleep(1.2)
    assert len(await cron_ticks(client, tid)) == len(ticks)  # deleted: it fires no more


async def test_a_stateless_cron_runs_each_time_on_a_new_thread_deleted_unless_kept(client):
    before = await client.threads.count()
    kept = await client.crons.create("echo", schedule=EVERY_SECOND, input=user("kept"), on_run_completed="keep")
    dropped = await client.crons.create("echo", schedule=EVERY_SECOND, input=user("dropped"))
    await asyncio.sleep(2.5)
    await client.crons.delete(kept["cron_id"])
    await client.crons.delete(dropped["cron_id"])
    await asyncio.sleep(0.5)  # the last runs end
    threads = await client.threads.search(limit=1000)
    made = [t for t in threads if t["values"] and t["values"]["messages"][0]["content"] in ("kept", "dropped")]
    assert made and {t["values"]["messages"][-1]["content"] for t in made} == {"echo: kept"}
    assert await client.threads.count() == before + len(made)


async def test_disabling_a_cron_stops_it_and_enabling_it_counts_from_now(client):
    tid = (await client.threads.create())["thread_id"]
    cron = await client.crons.create_for_thread(tid, "echo", schedule=EVERY_SECOND, input=user("tick"),
                                                enabled=False)
    await asyncio.sleep(1.5)
    assert await cron_ticks(client, tid) == []
    enabled = await client.crons.update(cron["cron_id"], enabled=True)
    assert when(enabled["next_run_date"]) - datetime.now(UTC) <= timedelta(seconds=1)
    await asyncio.sleep(1.5)
    assert len(await cron_ticks(client, tid)) in (1, 2)
    await client.crons.delete(cron["cron_id"])


async def test_a_crons_thread_deleted_takes_its_crons_with_it(client):
    tid = (await client.threads.create())["thread_id"]
    await client.crons.create_for_thread(tid, "echo", schedule="0 9 * * *")
    await client.threads.delete(tid)
    assert await client.crons.count(thread_id=tid) == 0


async def test_a_cron_keeps_firing_across_a_restart_and_fires_no_tick_twice(tmp_path):
    database = f"sqlite:///{tmp_path}/state.db"
    server = ProcessServer(["server_agents:AGENTS"], database, log=tmp_path / "server.log").start()
    try:
        client = get_client(url=server.url)
        tid = (await client.threads.create())["thread_id"]
        await client.crons.create_for_thread(tid, "echo", schedule=EVERY_SECOND, input=user("tick"))
        await asyncio.sleep(2.5)
        server.stop(signal.SIGKILL)
        killed = datetime.now(UTC)
        before = await _ticks_in(database, tid)
        time.sleep(1.0)
        server = ProcessServer(["server_agents:AGENTS"], database, port=server.port,
                               log=tmp_path / "server.log").start()
        restarted = datetime.now(UTC)
        await asyncio.sleep(2.5)
        ticks = await cron_ticks(client, tid)
    finally:
        server.stop(signal.SIGKILL)
    assert len(before) >= 2, before
    assert len(set(ticks)) == len(ticks), ticks  # no tick fired twice
    assert ticks[: len(before)] == before
    after = [t for t in ticks if when(t) > killed]
    assert len(after) >= 2 and when(after[-1]) > restarted, (ticks, killed, restarted)


async def _ticks_in(database: str, thread_id: str) -> list[str]:
    """The cron ticks of the thread's runs, read from the server's database file (the server is down)."""
    from backchannel.runtime import open_storage

    storage = open_storage(database)
    await storage.open()
    try:
        runs = await storage.list_runs(thread_id, limit=1000)
    finally:
        await storage.close()
    return sorted(r.metadata["cron_tick"] for r in runs)


async def test_three_servers_on_one_postgres_fire_each_tick_once(tmp_path, postgres_url):
    servers = [ProcessServer(["server_agents:AGENTS"], postgres_url, log=tmp_path / f"server-{i}.log")
               for i in range(3)]
    try:
        await asyncio.gather(*(asyncio.to_thread(server.start) for server in servers))  # each waits for its /ok
        clients = [get_client(url=s.url) for s in servers]
        tid = (await clients[0].threads.create())["thread_id"]
        cron = await clients[1].crons.create_for_thread(tid, "echo", schedule=EVERY_SECOND, input=user("tick"))
        await asyncio.sleep(4.0)
        await clients[2].crons.delete(cron["cron_id"])
        await asyncio.sleep(0.5)
        ticks = await cron_ticks(clients[0], tid)
        workers = {r["run_id"]: r for r in await clients[0].runs.list(tid, limit=1000)}
    finally:
        for server in servers:
            server.stop(signal.SIGKILL)
    assert len(set(ticks)) == len(ticks), ticks  # each tick fired by one server only
    assert 3 <= len(ticks) <= 5, ticks
    assert all(r["status"] == "success" for r in workers.values())


def test_info_says_crons_are_served(server):
    assert httpx.get(f"{server.url}/info").json()["flags"]["crons"] is True
