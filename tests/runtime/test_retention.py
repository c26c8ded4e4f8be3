"""Retention: threads.prune, thread TTLs (delete, keep_latest) and store item TTLs, swept by the scheduler.

Every test runs on memory, a SQLite file and Postgres. Time is the runtime's injectable clock, moved
forward by the test: a one-minute TTL passes without waiting a minute. The sweeps are the scheduler's
own, at a short interval.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from runtime_helpers import contents, echo_agent, eventually, user

from backchannel import HumanMessage, ScriptedModel, SubAgent
from backchannel.deep_agent import create_deep_agent
from backchannel.errors import InvalidRequestError, NotFoundError
from backchannel.runtime import LocalRuntime, StoreTTLConfig, ThreadTTLConfig

SWEEP_MINUTES = 0.002  # the scheduler sweeps every 0.12 s


class Clock:
    """The time the runtime measures TTLs by: now, moved forward by the test."""

    def __init__(self) -> None:
        self.ahead = timedelta()

    def advance(self, **delta: float) -> None:
        self.ahead += timedelta(**delta)

    def __call__(self) -> str:
        return (datetime.now(UTC) + self.ahead).isoformat()


async def _swept(rt, count: int = 3) -> None:
    """Wait for ``count`` more sweeps of the scheduler (each looks at everything expired)."""
    for _ in range(count):
        before = rt.retention.sweeps
        await eventually(lambda b=before: _async(rt.retention.sweeps > b), timeout=10)


async def _async(value: bool) -> bool:
    return value


async def _exists(rt, thread_id: str) -> bool:
    try:
        await rt.threads.get(thread_id)
    except NotFoundError:
        return False
    return True


async def _retention_runtime(make_runtime, clock: Clock, **kwargs):
    kwargs.setdefault("thread_ttl", ThreadTTLConfig(sweep_interval_minutes=SWEEP_MINUTES))
    return await make_runtime({"agent": echo_agent()}, clock=clock, **kwargs)


async def test_a_thread_with_a_one_minute_ttl_is_swept_once_the_minute_has_passed(make_runtime):
    clock = Clock()
    rt = await _retention_runtime(make_runtime, clock)
    short = (await rt.threads.create(ttl=1))["thread_id"]
    longer = (await rt.threads.create(ttl={"ttl": 5, "strategy": "delete"}))["thread_id"]
    forever = (await rt.threads.create())["thread_id"]
    await rt.runs.wait(short, "agent", input=user("hello"))
    assert (await rt.threads.get(short, include=["ttl"]))["ttl"]["ttl_minutes"] == 1

    clock.advance(seconds=50)
    await _swept(rt)
    assert await _exists(rt, short)  # 50 s after its last update: not yet

    clock.advance(seconds=15)
    await eventually(lambda: _not(_exists(rt, short)), timeout=10)
    assert await rt.storage.list_runs(short) == [] and await rt.storage.head_checkpoint(short) is None
    assert await _exists(rt, longer) and await _exists(rt, forever)



def supervisor(task_seconds: float):
    """A supervisor that starts one background task (taking ``task_seconds``) and relays its report."""

    def reply(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
            return "Relay: " + last.text
        if isinstance(last, HumanMessage):
            return {"tool_calls": [{"name": "start_async_task", "id": "call_start",
                                    "args": {"description": "find it", "subagent_type": "researcher"}}]}
        return "Started; I'll report back."

    researcher = SubAgent("researcher", "Researches things.", background=True,
                          model=ScriptedModel(["The answer is 42."], latency=task_seconds))
    return create_deep_agent(ScriptedModel([reply], loop=True), subagents=[researcher], general_purpose=False)


async def test_a_thread_whose_ttl_passes_while_its_background_task_runs_is_kept_for_the_task_report(make_runtime):
    clock = Clock()
    rt = await make_runtime({"supervisor": supervisor(task_seconds=4.0)}, clock=clock,
                            thread_ttl=ThreadTTLConfig(sweep_interval_minutes=SWEEP_MINUTES))
    tid = (await rt.threads.create(ttl=1))["thread_id"]
    await rt.runs.wait(tid, "supervisor", input=user("research please"))
    [task] = (await rt.threads.get_state(tid))["values"]["async_tasks"].values()

    clock.advance(minutes=2)  # the supervisor's thread has been idle past its TTL; its task still runs
    await _swept(rt)
    assert [r["status"] for r in await rt.runs.list(task["task_id"])] == ["running"]  # (the test is not moot)
    assert await _exists(rt, tid)
    assert await rt.threads.prune([tid], strategy="delete") == {"pruned_count": 0}  # nor pruned on request
    clock.advance(minutes=-2)  # back to now: the report's wake-up run on the thread is what the test reads

    async def relayed() -> bool:
        return any(m["content"].startswith("Relay: ") for m in
                   (await rt.threads.get_state(tid))["values"]["messages"])

    await eventually(relayed, timeout=20)


async def _not(found) -> bool:
    return not await found


async def test_keep_latest_leaves_the_state_readable_and_the_thread_usable(make_runtime):
    clock = Clock()
    rt = await _retention_runtime(make_runtime, clock)
    thread = (await rt.threads.create(ttl={"ttl": 1, "strategy": "keep_latest"}))["thread_id"]
    await rt.runs.wait(thread, "agent", input=user("one"))
    await rt.runs.wait(thread, "agent", input=user("two"))
    before = await rt.threads.get_state(thread)
    assert len(await rt.threads.get_history(thread, limit=100)) > 2

    clock.advance(minutes=2)
    await eventually(lambda: _history_length(rt, thread, 1), timeout=10)
    [kept] = await rt.storage.list_checkpoints(thread)
    assert kept.whole and kept.parent_id is None  # the state it holds is all there is
    rt.checkpoints.forget(thread)  # read back from storage, not from the cache of the state
    after = await rt.threads.get_state(thread)
    assert after["values"] == before["values"]
    assert after["checkpoint"]["checkpoint_id"] == before["checkpoint"]["checkpoint_id"]
    assert contents(after["values"]) == ["one", "echo: one", "two", "echo: two"]

    await rt.runs.wait(thread, "agent", input=user("three"))
    state = await rt.threads.get_state(thread)
    assert contents(state["values"]) == ["one", "echo: one", "two", "echo: two", "three", "echo: three"]
    assert state["parent_checkpoint"] is not None
    rt.checkpoints.forget(thread)
    assert (await rt.threads.get_state(thread))["values"] == state["values"]
    assert (await rt.threads.get(thread))["status"] == "idle"

    # Deleting the run that wrote the kept checkpoint leaves the later state whole (durability's deletes).
    await rt.runs.delete(thread, kept.run_id)
    rt.checkpoints.forget(thread)
    assert contents((await rt.threads.get_state(thread))["values"])[-2:] == ["three", "echo: three"]
    await rt.runs.wait(thread, "agent", input=user("four"))
    assert contents((await rt.threads.get_state(thread))["values"])[-4:] == ["three", "echo: three", "four",
                                                                             "echo: four"]


async def _history_length(rt, thread_id: str, length: int) -> bool:
    return len(await rt.threads.get_history(thread_id, limit=100)) == length


async def test_prune_deletes_threads_or_keeps_their_latest_checkpoint(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    doomed = [(await rt.threads.create())["thread_id"] for _ in range(2)]
    kept = (await rt.threads.create())["thread_id"]
    for thread in [*doomed, kept]:
        await rt.runs.wait(thread, "agent", input=user(f"hi {thread[:4]}"))
        await rt.runs.wait(thread, "agent", input=user("again"))
    values = (await rt.threads.get_state(kept))["values"]

    assert await rt.threads.prune([*doomed, "no-such-thread"]) == {"pruned_count": 2}
    assert not await _exists(rt, doomed[0]) and not await _exists(rt, doomed[1])
    assert await rt.storage.list_runs(doomed[0]) == []

    assert await rt.threads.prune([kept], strategy="keep_latest") == {"pruned_count": 1}
    assert await _history_length(rt, kept, 1)
    rt.checkpoints.forget(kept)
    assert (await rt.threads.get_state(kept))["values"] == values
    assert len(await rt.threads.search(ids=[kept])) == 1
    await rt.runs.wait(kept, "agent", input=user("after"))
    assert contents((await rt.threads.get_state(kept))["values"])[-2:] == ["after", "echo: after"]

    with pytest.raises(InvalidRequestError, match="strategy"):
        await rt.threads.prune([kept], strategy="everything")
    with pytest.raises(InvalidRequestError, match="thread_ids"):
        await rt.threads.prune(kept)


async def test_a_thread_with_a_run_running_or_pending_is_never_pruned(make_runtime):
    clock = Clock()
    rt = await make_runtime({"agent": echo_agent(), "slow": echo_agent(latency=1.0)}, clock=clock,
                            thread_ttl=ThreadTTLConfig(sweep_interval_minutes=SWEEP_MINUTES))
    thread = (await rt.threads.create(ttl=1))["thread_id"]
    await rt.runs.wait(thread, "agent", input=user("first"))
    running = await rt.runs.create(thread, "slow", input=user("slow one"))
    pending = await rt.runs.create(thread, "slow", input=user("queued"), multitask_strategy="enqueue")
    await eventually(lambda: _status(rt, thread, running["run_id"], "running"), timeout=10)

    assert await rt.threads.prune([thread]) == {"pruned_count": 0}
    assert await rt.threads.prune([thread], strategy="keep_latest") == {"pruned_count": 0}
    clock.advance(minutes=5)  # expired, by its TTL
    await _swept(rt)
    assert await _exists(rt, thread)
    assert len(await rt.threads.get_history(thread, limit=100)) > 1

    clock.advance(minutes=-5)  # back to now: the thread is not swept while the test reads its last run
    assert contents(await rt.runs.join(thread, pending["run_id"]))[-1] == "echo: queued"
    clock.advance(minutes=5)  # idle now, and past its TTL again: swept
    await eventually(lambda: _not(_exists(rt, thread)), timeout=10)


async def _status(rt, thread_id: str, run_id: str, status: str) -> bool:
    return (await rt.runs.get(thread_id, run_id))["status"] == status


async def test_the_operators_default_ttl_applies_to_threads_without_one(make_runtime):
    clock = Clock()
    rt = await _retention_runtime(make_runtime, clock, thread_ttl=ThreadTTLConfig(
        strategy="keep_latest", default_ttl=10, sweep_interval_minutes=SWEEP_MINUTES))
    plain = (await rt.threads.create())["thread_id"]
    own = (await rt.threads.create(ttl={"ttl": 1, "strategy": "delete"}))["thread_id"]
    await rt.runs.wait(plain, "agent", input=user("a"))
    await rt.runs.wait(plain, "agent", input=user("b"))
    assert (await rt.threads.get(plain, include=["ttl"]))["ttl"]["strategy"] == "keep_latest"

    clock.advance(minutes=2)
    await eventually(lambda: _not(_exists(rt, own)), timeout=10)
    assert len(await rt.threads.get_history(plain, limit=100)) > 1  # its default 10 minutes have not passed

    clock.advance(minutes=10)
    await eventually(lambda: _history_length(rt, plain, 1), timeout=10)
    assert await _exists(rt, plain)


async def test_bad_ttls_are_refused_by_name(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    for bad in (0, -1, {"ttl": 1, "strategy": "archive"}, {"strategy": "delete"}, {"ttl": 1, "when": "now"}):
        with pytest.raises(InvalidRequestError, match="ttl|strategy"):
            await rt.threads.create(ttl=bad)
    with pytest.raises(InvalidRequestError, match="ttl"):
        await rt.store.put_item(["ns"], "k", {"v": 1}, ttl=-5)
    with pytest.raises(InvalidRequestError, match="sweep_interval_minutes"):
        ThreadTTLConfig.from_mapping({"sweep_interval_minutes": 0})
    with pytest.raises(InvalidRequestError, match="no setting 'ttl'"):
        StoreTTLConfig.from_mapping({"ttl": 5})


async def test_store_items_expire_after_their_ttl_and_reads_refresh_it(make_runtime):
    clock = Clock()
    rt = await make_runtime({"agent": echo_agent()}, clock=clock,
                            store_ttl=StoreTTLConfig(sweep_interval_minutes=SWEEP_MINUTES))
    await rt.store.put_item(["memories", "u1"], "short", {"text": "expires"}, ttl=1)
    await rt.store.put_item(["memories", "u1"], "read", {"text": "kept alive by reads"}, ttl=1)
    await rt.store.put_item(["memories", "u1"], "forever", {"text": "no ttl"})

    clock.advance(seconds=45)
    assert await rt.store.get_item(["memories", "u1"], "read") is not None  # refreshed (refresh_on_read)
    assert await rt.store.get_item(["memories", "u1"], "short", refresh_ttl=False) is not None
    clock.advance(seconds=30)  # 75 s after the puts, 30 s after the refreshing read
    assert await rt.store.get_item(["memories", "u1"], "short") is None  # expired: gone from reads at once
    found = await rt.store.search_items(["memories"], refresh_ttl=False)
    assert sorted(i["key"] for i in found["items"]) == ["forever", "read"]

    await eventually(lambda: _stored(rt, ("memories", "u1"), "short", False), timeout=10)  # swept
    assert await _stored(rt, ("memories", "u1"), "read", True)
    clock.advance(seconds=40)  # 70 s after its refresh
    await eventually(lambda: _stored(rt, ("memories", "u1"), "read", False), timeout=10)
    assert (await rt.store.get_item(["memories", "u1"], "forever"))["value"] == {"text": "no ttl"}


async def _stored(rt, namespace: tuple[str, ...], key: str, present: bool) -> bool:
    return (await rt.storage.get_item(namespace, key) is not None) is present


async def test_the_stores_default_ttl_and_refresh_setting(make_runtime):
    clock = Clock()
    rt = await make_runtime({"agent": echo_agent()}, clock=clock, store_ttl=StoreTTLConfig(
        default_ttl=1, refresh_on_read=False, sweep_interval_minutes=SWEEP_MINUTES))
    await rt.store.put_item(["ns"], "a", {"v": 1})
    await rt.store.put_item(["ns"], "b", {"v": 2})
    clock.advance(seconds=45)
    await rt.store.get_item(["ns"], "a")  # no refresh: the store's setting
    assert len((await rt.store.search_items(["ns"], filter={"v": 2}, refresh_ttl=True))["items"]) == 1  # b
    clock.advance(seconds=30)
    assert await rt.store.get_item(["ns"], "a") is None
    assert (await rt.store.get_item(["ns"], "b"))["value"] == {"v": 2}


async def _blocked_by(conn, pid: int) -> list[int]:
    """The sessions waiting for a lock ``pid`` holds (polled until there is one)."""
    for _ in range(500):
        rows = await (await conn.execute("SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                         (pid,))).fetchall()
        if rows:
            return [r[0] for r in rows]
        await asyncio.sleep(0.02)
    raise AssertionError(f"nothing waited for session {pid}")


async def test_mail_from_another_process_racing_the_sweep_is_never_lost_on_postgres(postgres_url):
    """Two processes on one Postgres: one sweeps a thread whose TTL passed, the other stores mail for it. Whichever
    takes the thread first wins: the thread deleted before the mail is stored (the sender is told it is gone, and
    no mail is kept for a thread that is gone), or the mail stored first (the thread is kept and its mail taken).
    The test's own transaction holds a row each needs, so that each order happens for sure."""
    import psycopg

    clock = Clock()
    agents = {"agent": echo_agent()}
    async with (LocalRuntime(postgres_url, agents=agents, clock=clock) as sweeper,
                LocalRuntime(postgres_url, agents=agents) as sender,
                await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as holder,
                await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as watcher):
        gone, kept = [(await sweeper.threads.create(ttl=1))["thread_id"] for _ in range(2)]
        for tid in (gone, kept):
            await sweeper.runs.wait(tid, "agent", input=user("hi"))
        clock.advance(minutes=2)

        # The sweep first: it holds the thread's row when the mail comes (and waits for the test's lock on a run).
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM runs WHERE thread_id = %s FOR UPDATE", (gone,))
            sweep = asyncio.create_task(sweeper.retention.prune_thread(gone, "delete"))  # as the sweep does
            [sweeping] = await _blocked_by(watcher, holder.info.backend_pid)
            mail = asyncio.create_task(sender.deliver(gone, HumanMessage("late result"), key="k", assistant_id="agent"))
            await _blocked_by(watcher, sweeping)
        assert await sweep
        with pytest.raises(NotFoundError):
            await mail
        assert await sender.storage.threads_with_mail() == []

        # The mail first: it holds the thread's row when the sweep comes (and waits for the test's same key).
        async with holder.transaction():
            await holder.execute("INSERT INTO inbox (thread_id, key, message, created_at) VALUES (%s, 'k', '{}', '')",
                                 (kept,))
            mail = asyncio.create_task(sender.deliver(kept, HumanMessage("news", id="n1"), key="k",
                                                      assistant_id="agent"))
            [mailing] = await _blocked_by(watcher, holder.info.backend_pid)
            sweep = asyncio.create_task(sweeper.retention.sweep())
            await _blocked_by(watcher, mailing)
            raise psycopg.Rollback()  # the test's row goes: the mail is stored, then the sweep looks
        assert await mail
        assert await sweep == (0, 0)
        await eventually(lambda: _has_news(sender, kept), timeout=10)


async def _has_news(rt, thread_id: str) -> bool:
    return "news" in contents((await rt.threads.get_state(thread_id))["values"])
