"""Runtimes sharing one Postgres database: streams, cancellation, queues and mail across them.

Each runtime has its own connections, its own LISTEN connection and its own
worker id, exactly as it would in its own process; the tests with real
processes (and ``kill -9``) are in ``test_processes.py``.
"""

import asyncio
import json
import time
from contextlib import AsyncExitStack
from types import SimpleNamespace

import psycopg
import pytest
from runtime_helpers import contents, echo_agent, eventually, looping_agent, run_status_is, user

from backchannel import HumanMessage, ScriptedModel, _clock, create_agent, tool
from backchannel.runtime import LocalRuntime
from backchannel.runtime.storage import MISSED

MODES = ["values", "updates", "messages-tuple", "custom"]


@pytest.fixture
async def runtimes(postgres_url):
    """``await runtimes(agent, n)``: n open runtimes on one fresh Postgres schema, each with ``agent``."""
    async with AsyncExitStack() as stack:
        async def make(agent, n=2, **kwargs):
            return [await stack.enter_async_context(LocalRuntime(postgres_url, agents={"agent": agent}, **kwargs))
                    for _ in range(n)]

        yield make


async def _parts(stream):
    return [(p.event, p.data) async for p in stream]


async def test_a_run_executed_by_one_runtime_streams_to_another(runtimes):
    a, b = await runtimes(looping_agent(3, latency=0.02))
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("go"), stream_mode=MODES, after_seconds=0.3)
    here = asyncio.create_task(_parts(a.runs.join_stream(tid, run["run_id"])))
    there = asyncio.create_task(_parts(b.runs.join_stream(tid, run["run_id"])))
    here, there = await asyncio.wait_for(asyncio.gather(here, there), 10)
    assert there == here
    assert [e for e, _ in here].count("updates") >= 7 and "messages" in {e for e, _ in here}
    assert contents(here[-1][1])[-1] == "done after 3 steps"
    assert (await b.runs.get(tid, run["run_id"]))["status"] == "success"
    assert not b.is_running_here(run["run_id"])


async def test_a_run_s_events_reach_only_the_runtimes_that_follow_it(runtimes):
    """A run's executor relays its events to the runtimes following it; the others hear nothing of them."""
    a, b, c = await runtimes(looping_agent(3, latency=0.02), 3)
    heard = _heard_by(c)
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("go"), stream_mode=MODES, after_seconds=0.3)
    here = asyncio.create_task(_parts(a.runs.join_stream(tid, run["run_id"])))
    there = asyncio.create_task(_parts(b.runs.join_stream(tid, run["run_id"])))
    here, there = await asyncio.wait_for(asyncio.gather(here, there), 10)
    assert there == here and contents(here[-1][1])[-1] == "done after 3 steps"
    await asyncio.sleep(0.2)  # what c would hear of it has come
    assert {m["k"] for m in heard} & {"events", "end"} == set()


def _heard_by(rt: LocalRuntime) -> list[dict]:
    """The messages from the other runtimes that ``rt`` receives from now on."""
    heard: list[dict] = []
    receive = rt.peers.coordinator._receive
    rt.peers.coordinator._receive = lambda message: (heard.append(message), receive(message))[1]
    return heard


async def test_join_stream_of_a_resumable_run_replays_it_from_another_runtime(runtimes):
    a, b = await runtimes(looping_agent(2))
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("go"), stream_mode=["updates"], stream_resumable=True)
    here = await _parts(a.runs.join_stream(tid, run["run_id"]))  # from the start: the run is resumable
    await a.runs.join(tid, run["run_id"])
    there = await asyncio.wait_for(_parts(b.runs.join_stream(tid, run["run_id"], last_event_id="0")), 5)
    assert there == here and len(here) >= 5


async def test_a_runtime_cancels_a_run_another_executes(runtimes):
    a, b = await runtimes(echo_agent(latency=5))
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("hi"))

    async def input_recorded() -> bool:  # running, and past its first step (cancelled before it, it keeps none)
        return bool((await b.threads.get_state(tid))["values"].get("messages"))

    await eventually(lambda: run_status_is(b, tid, run["run_id"], "running"))
    await eventually(input_recorded)
    started = time.monotonic()
    await b.runs.cancel(tid, run["run_id"], wait=True)
    assert time.monotonic() - started < 2
    assert (await b.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    thread = await b.threads.get(tid)
    assert thread["status"] != "busy" and thread["error"]["error"] == "UserInterrupt"
    assert (await a.runs.join(tid, run["run_id"]))["messages"][0]["content"] == "hi"


async def test_a_runtime_cancels_a_run_queued_in_another_before_it_starts(runtimes):
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("later"), after_seconds=0.5)
    waiting = asyncio.create_task(a.runs.join(tid, run["run_id"]))
    await b.runs.cancel(tid, run["run_id"])
    await asyncio.wait_for(waiting, 2)  # the creator's own waiters hear of it
    assert (await a.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    assert (await a.threads.get(tid))["status"] == "idle"
    await asyncio.sleep(0.7)  # its time comes and goes: it never runs
    assert (await a.threads.get_state(tid))["values"] == {}


async def test_runs_queued_on_one_thread_by_two_runtimes_run_one_at_a_time_in_order(runtimes):
    running: dict[str, int] = {}
    overlaps: list[str] = []

    @tool
    async def step(i: int) -> str:
        """One step of work."""
        thread = "t"
        running[thread] = running.get(thread, 0) + 1
        if running[thread] > 1:
            overlaps.append(f"step {i}")
        await asyncio.sleep(0.02)
        running[thread] -= 1
        return f"step {i} ok"

    a, b = await runtimes(looping_agent(3, tools=[step]))
    tid = (await a.threads.create())["thread_id"]
    runs = []
    for i in range(6):
        creator = (a, b)[i % 2]
        runs.append((creator, await creator.runs.create(tid, "agent", input=user(f"turn {i}"))))
    for creator, run in runs:
        await asyncio.wait_for(creator.runs.join(tid, run["run_id"]), 10)
    assert overlaps == []
    messages = (await a.threads.get_state(tid))["values"]["messages"]
    assert [m["content"] for m in messages if m["type"] == "human"] == [f"turn {i}" for i in range(6)]
    assert [m["content"] for m in messages if m["type"] == "ai" and not m["tool_calls"]] == ["done after 3 steps"] * 6
    assert {(await a.runs.get(tid, r["run_id"]))["status"] for _, r in runs} == {"success"}


async def test_mail_for_a_run_in_another_runtime_reaches_it_once(runtimes):
    seen_before_answer: list[list[str]] = []

    def reply(request):
        humans = [m.text for m in request.messages if isinstance(m, HumanMessage)]
        tools = sum(m.type == "tool" for m in request.messages)
        if tools < 4:
            return {"tool_calls": [{"name": "pause", "args": {}, "id": f"call_{tools}"}]}
        seen_before_answer.append(humans)
        return "done"

    @tool
    async def pause() -> str:
        """Wait a little."""
        await asyncio.sleep(0.15)
        return "paused"

    a, b = await runtimes(create_agent(ScriptedModel([reply], loop=True), [pause]))
    tid = (await a.threads.create())["thread_id"]
    run = await a.runs.create(tid, "agent", input=user("work"))
    await eventually(lambda: run_status_is(b, tid, run["run_id"], "running"))
    await asyncio.sleep(0.1)
    assert await b.deliver(tid, HumanMessage("a note", id="note-1"), key="k1")
    assert not await a.deliver(tid, HumanMessage("a note again", id="note-2"), key="k1")  # once per key
    await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 10)
    assert seen_before_answer == [["work", "a note"]]  # taken by the running run, not a new one
    messages = (await b.threads.get_state(tid))["values"]["messages"]
    assert [m["content"] for m in messages if m["type"] == "human"] == ["work", "a note"]
    assert len(await b.runs.list(tid)) == 1


async def test_mail_for_an_idle_thread_wakes_it_once_whoever_sends_it(runtimes):
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    await a.runs.wait(tid, "agent", input=user("hi"))
    sent = await asyncio.gather(a.deliver(tid, HumanMessage("ping", id="p1"), key="same"),
                                b.deliver(tid, HumanMessage("ping", id="p2"), key="same"))
    assert sorted(sent) == [False, True]

    async def answered():
        values = (await a.threads.get_state(tid))["values"]
        return contents(values)[-1] == "echo: ping" and (await a.threads.get(tid))["status"] == "idle"

    await eventually(answered, timeout=5)
    assert contents((await a.threads.get_state(tid))["values"]) == ["hi", "echo: hi", "ping", "echo: ping"]


class _LateReads:
    """A runtime's storage as its peer messages see it, whose run reads answer only once ``gate`` is set: a
    process that hears of a run late (a busy machine), after the run ended elsewhere. ``stale``: the read is
    made at once and answered late (the run was under way when read); otherwise it is made late."""

    def __init__(self, storage, gate: asyncio.Event, *, stale: bool) -> None:
        self._storage = storage
        self._gate = gate
        self._stale = stale

    def __getattr__(self, name):
        return getattr(self._storage, name)

    async def get_run(self, run_id):
        if self._stale:
            row = await self._storage.get_run(run_id)
            await self._gate.wait()
            return row
        await self._gate.wait()
        return await self._storage.get_run(run_id)


@pytest.mark.parametrize("stale", [True, False], ids=["read-while-running", "read-after-the-end"])
@pytest.mark.parametrize("modes", [["values"], ["updates"]])
async def test_a_thread_follower_sees_the_end_state_of_a_run_that_ended_before_it_heard_of_it(runtimes, modes,
                                                                                              stale):
    """A run made in one runtime can end before another runtime following its thread asks for its events
    (each runtime starts a run it stores at once): the follower still sees the run, in its own stream modes,
    with the state it ended in."""
    a, b = await runtimes(echo_agent(latency=0.3))
    tid = (await a.threads.create())["thread_id"]
    heard = asyncio.Event()
    a.peers.storage = _LateReads(a.peers.storage, heard, stale=stale)
    parts: list = []

    async def follow() -> None:
        async for part in a.threads.join_stream(tid):
            parts.append((part.event, part.data))
            if part.event == "metadata" and part.data.get("status") == "run_done":
                return

    follower = asyncio.create_task(follow())
    await eventually(lambda: _true(a.streams.watching(tid)))
    run = await b.runs.create(tid, "agent", input=user("late"), stream_mode=modes)
    await asyncio.wait_for(b.runs.join(tid, run["run_id"]), 10)
    heard.set()
    await asyncio.wait_for(follower, 10)
    assert parts[0] == ("metadata", {"run_id": run["run_id"], "attempt": 1})
    assert parts[-1] == ("metadata", {"status": "run_done", "run_id": run["run_id"]})
    if modes == ["values"]:
        assert [contents(data)[-1] for event, data in parts if event == "values"][-1:] == ["echo: late"]
    else:  # the run's updates went unrecorded (nobody followed it as it ran); values were not asked for
        assert [event for event, _ in parts if event not in ("metadata", "updates")] == []


async def _true(value: bool) -> bool:
    return value



async def _follow_runs(follower, done: list[str]) -> None:
    """Add the id of each run a thread's follower sees to its end to ``done``."""
    async for part in follower:
        if part.event == "metadata" and part.data.get("status") == "run_done":
            done.append(part.data["run_id"])


async def test_a_thread_follower_sees_every_run_made_elsewhere_one_made_and_ended_as_it_attaches_too(runtimes):
    """A follower in one runtime of a thread whose runs are made in another sees each of them, in order: one
    made (and ended) while the follower attaches, before its runtime hears of the thread's runs, too."""
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    subscribe = b.peers.coordinator.subscribe
    meanwhile: list[str] = []

    async def subscribe_late(topic: str) -> None:  # a run is made and ends before b listens to the thread
        if not meanwhile:
            run = await a.runs.create(tid, "agent", input=user("meanwhile"))
            await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 10)
            meanwhile.append(run["run_id"])
        await subscribe(topic)

    b.peers.coordinator.subscribe = subscribe_late
    done: list[str] = []
    follower = asyncio.create_task(_follow_runs(b.threads.join_stream(tid), done))
    await eventually(lambda: _true(done == meanwhile != []), timeout=10)
    later = []
    for i in range(3):
        later.append((await a.runs.create(tid, "agent", input=user(f"later {i}")))["run_id"])
        await asyncio.wait_for(a.runs.join(tid, later[-1]), 10)
    await eventually(lambda: _true(len(done) == 4), timeout=10)
    follower.cancel()
    assert done == [*meanwhile, *later]


@pytest.mark.parametrize("queued", [False, True], ids=["claimed-as-stored", "queued-behind-another"])
async def test_a_run_is_told_to_its_thread_s_listeners_in_the_transaction_that_stores_it(runtimes, postgres_url,
                                                                                         queued):
    """'created' goes with the run's insert, not in a message after it: once ``runs.create`` returns, a process
    listening to the thread's channel has been told (and a follower elsewhere can read the run)."""
    (a,) = await runtimes(echo_agent(latency=1.0), n=1)
    tid = (await a.threads.create())["thread_id"]
    if queued:  # running: the next run is stored pending, by the plain insert
        await a.runs.create(tid, "agent", input=user("first"))
    channel = a.peers.coordinator._channel_of(f"thread:{tid}")  # the thread's topic's
    with psycopg.connect(postgres_url, autocommit=True) as listener:  # as a subscriber elsewhere listens
        listener.execute("INSERT INTO listeners VALUES (%s, pg_backend_pid())", (channel,))
        listener.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        run = await a.runs.create(tid, "agent", input=user("told"))
        listener.execute("SELECT 1")  # what was committed before it comes with its answer
        told = [m for note in listener.notifies(timeout=0) for m in json.loads(note.payload)]
    assert [(m["k"], m["run"]) for m in told] == [("created", run["run_id"])]
    assert (await a.runs.get(tid, run["run_id"]))["status"] == ("pending" if queued else "running")


async def test_a_process_with_no_follower_of_a_thread_hears_nothing_of_its_runs(runtimes):
    """Runs made in one runtime reach another as messages only while somebody there follows their thread."""
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    heard = _heard_by(b)
    for i in range(3):
        run = await a.runs.create(tid, "agent", input=user(f"unfollowed {i}"))
        await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 10)
    done: list[str] = []
    follower = asyncio.create_task(_follow_runs(b.threads.join_stream(tid), done))
    await eventually(lambda: _true(bool(b.peers.coordinator._subscribed)), timeout=10)
    await asyncio.sleep(0.5)  # the follower has attached
    followed = await a.runs.create(tid, "agent", input=user("followed"))
    await asyncio.wait_for(a.runs.join(tid, followed["run_id"]), 10)
    await eventually(lambda: _true(done == [followed["run_id"]]), timeout=10)
    follower.cancel()
    assert [m["run"] for m in heard if m["k"] == "created"] == [followed["run_id"]]


async def test_a_thread_follower_finds_a_run_made_elsewhere_while_its_runtime_could_not_hear(runtimes):
    """Messages lost while a runtime's listening connection was down (it says so once back): its thread followers
    still get the runs made elsewhere meanwhile that are under way."""
    a, b = await runtimes(echo_agent(latency=1.0))
    tid = (await a.threads.create())["thread_id"]
    done: list[str] = []
    follower = asyncio.create_task(_follow_runs(b.threads.join_stream(tid), done))
    await eventually(lambda: _true(bool(b.peers.coordinator._subscribed)), timeout=10)
    await asyncio.sleep(0.5)  # the follower has attached
    receive = b.peers.coordinator._receive
    b.peers.coordinator._receive = lambda message: None if message["k"] == "created" else receive(message)  # lost
    run = await a.runs.create(tid, "agent", input=user("unheard"))
    await asyncio.sleep(0.3)
    receive(MISSED)  # what the coordinator delivers once it listens again
    await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 10)
    await eventually(lambda: _true(done == [run["run_id"]]), timeout=10)
    follower.cancel()


async def test_a_thread_follower_whose_clock_runs_ahead_sees_a_run_made_elsewhere_as_it_attaches(runtimes,
                                                                                                monkeypatch):
    """Processes on machines whose clocks disagree by minutes: a follower in a runtime whose clock runs ahead still
    sees a run made (and ended) in another while it attaches, and every later one, in the order they were made
    (one heard of before the follower has read back the runs made as it attached too)."""
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    real = time.time
    monkeypatch.setattr(_clock, "time", SimpleNamespace(time=lambda: real() + 600))  # b's clock as b attaches
    subscribe = b.peers.coordinator.subscribe
    meanwhile: list[str] = []
    later: list[str] = []

    async def subscribe_late(topic: str) -> None:  # a run is made and ends (a's clock right) before b listens
        if meanwhile:
            return await subscribe(topic)
        monkeypatch.setattr(_clock, "time", time)
        run = await a.runs.create(tid, "agent", input=user("meanwhile"))
        await asyncio.wait_for(a.runs.join(tid, run["run_id"]), 10)
        meanwhile.append(run["run_id"])
        await subscribe(topic)
        # and another is heard of before the follower reads back what was made as it attached
        later.append((await a.runs.create(tid, "agent", input=user("later 0")))["run_id"])
        await eventually(lambda: _true(b.streams.get(later[0]) is not None), timeout=10)

    b.peers.coordinator.subscribe = subscribe_late
    done: list[str] = []
    follower = asyncio.create_task(_follow_runs(b.threads.join_stream(tid), done))
    try:
        await eventually(lambda: _true(len(later) == 1), timeout=10)
        await asyncio.wait_for(a.runs.join(tid, later[0]), 10)
        later.append((await a.runs.create(tid, "agent", input=user("later 1")))["run_id"])
        await asyncio.wait_for(a.runs.join(tid, later[-1]), 10)
        await eventually(lambda: _true(len(done) >= 3), timeout=10)
        await asyncio.sleep(0.5)  # a run missed at first would not come later either
    finally:
        follower.cancel()
    assert done == [*meanwhile, *later]


async def test_a_thread_follower_sees_a_run_made_and_ended_elsewhere_while_its_runtime_could_not_hear(
        runtimes, postgres_url):
    """The listening connection of a follower's runtime is cut (its backend terminated), and a run is made and ends
    in another runtime before that runtime listens again: the follower still sees it, between the runs before
    and after."""
    a, b = await runtimes(echo_agent())
    tid = (await a.threads.create())["thread_id"]
    done: list[str] = []
    follower = asyncio.create_task(_follow_runs(b.threads.join_stream(tid), done))
    try:
        await eventually(lambda: _true(bool(b.peers.coordinator._subscribed)), timeout=10)
        before = (await a.runs.create(tid, "agent", input=user("before")))["run_id"]
        await eventually(lambda: _true(done == [before]), timeout=10)
        heard = _heard_by(b)
        async with await psycopg.AsyncConnection.connect(postgres_url) as db, db.transaction():
            # Reconnecting, b's listener first tidies the listeners table: held off until the run has ended.
            await db.execute("LOCK TABLE listeners IN EXCLUSIVE MODE")
            pids = [pid for pid, in await (await db.execute("SELECT DISTINCT pid FROM listeners")).fetchall()]
            assert len(pids) == 1  # b's, listening to the thread
            await db.execute("SELECT pg_terminate_backend(%s)", (pids[0],))
            gap = (await a.runs.create(tid, "agent", input=user("in the gap")))["run_id"]
            await asyncio.wait_for(a.runs.join(tid, gap), 10)
            await asyncio.sleep(0.3)  # its 'created' would have been heard by now
        await eventually(lambda: _true(MISSED in heard), timeout=10)
        # The gap was real: nothing of the run was heard before it (after it, b's own watch of the run read back
        # brings the run's end).
        assert not [m for m in heard[:heard.index(MISSED)] if m.get("run") == gap]
        after = (await a.runs.create(tid, "agent", input=user("after")))["run_id"]
        await asyncio.wait_for(a.runs.join(tid, after), 10)
        await eventually(lambda: _true(after in done), timeout=10)
    finally:
        follower.cancel()
    assert done == [before, gap, after]
