"""The scheduler: an idle runtime leaves its database alone; runs still start at once, and delayed ones on time;
on SQLite and Postgres a run queued on a free thread is claimed in the write that stores it."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import AsyncExitStack

import pytest
from runtime_helpers import Start, echo_agent, opened_storage, tool_loop, user

from backchannel import HumanMessage, ScriptedModel, ToolRuntime, create_agent, tool
from backchannel._clock import now_iso
from backchannel.notifier import CompletionNotifier
from backchannel.runtime import LocalRuntime
from backchannel.runtime.rows import CheckpointBase, CheckpointRow, CheckpointWrite, Delta, RunRow, ThreadRow


@pytest.fixture(params=["sqlite", "postgres"])
def claiming_url(request, tmp_path) -> str:
    """A fresh database of each backend that claims a run in the write that stores it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/claims.db"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
async def claiming_storage(claiming_url):
    """The storage of :func:`claiming_url`, open."""
    async with opened_storage(claiming_url) as storage:
        yield storage


def pending_run(thread_id: str) -> RunRow:
    """A new pending run of worker ``w``'s on ``thread_id``, due now."""
    now = now_iso()
    return RunRow(str(uuid.uuid4()), thread_id, "agent", now, now, "pending", {}, {}, "enqueue", "w", now)


def count_claims(rt) -> list[float]:
    """The times (``time.monotonic()``) at which the runtime asks its storage for runs to start, from now on."""
    claims: list[float] = []
    claim = rt.storage.claim_runs

    async def counted(*args):
        claims.append(time.monotonic())
        return await claim(*args)

    rt.storage.claim_runs = counted
    return claims


async def test_an_idle_runtime_does_not_keep_asking_for_runs_and_still_starts_them_at_once(make_runtime):
    # Each of the runtimes sharing a database paid four claims a second doing nothing (issue 22.2).
    rt = await make_runtime({"agent": echo_agent()})
    await rt.runs.wait(None, "agent", input=user("warm up"))
    claims = count_claims(rt)
    await asyncio.sleep(1.5)
    assert len(claims) <= 1, f"{len(claims)} claims in 1.5 s of doing nothing"
    started = time.monotonic()
    values = await rt.runs.wait(None, "agent", input=user("now"))
    assert values["messages"][-1]["content"] == "echo: now"
    assert time.monotonic() - started < 2.0  # kicked: not left for the next idle look, 5 s on


async def test_a_delayed_run_starts_when_its_time_comes(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    queued = time.monotonic()
    run = await rt.runs.create(thread["thread_id"], "agent", input=user("later"), after_seconds=1.0)
    await rt.runs.join(thread["thread_id"], run["run_id"])
    assert 1.0 <= time.monotonic() - queued < 3.0  # not left for the next idle look


async def test_a_run_on_a_free_thread_starts_without_a_claim_of_its_own(claiming_url):
    # A claim is a transaction of five round trips; a run queued by this process on a thread with no other
    # run is claimed in the write that stores it (issue 22.2).
    async with LocalRuntime(claiming_url, agents={"agent": echo_agent()}) as rt:
        await rt.runs.wait(None, "agent", input=user("warm up"))
        claims = count_claims(rt)
        thread = await rt.threads.create()
        for i in range(10):
            values = await rt.runs.wait(thread["thread_id"], "agent", input=user(f"turn {i}"))
            assert values["messages"][-1]["content"] == f"echo: turn {i}"
            new = await rt.runs.wait(str(uuid.uuid4()), "agent", input=user(f"new {i}"), if_not_exists="create")
            assert new["messages"][-1]["content"] == f"echo: new {i}"
        assert len(claims) <= 2, f"{len(claims)} claims for 20 runs on free threads"  # the idle look, at most
        runs = await rt.runs.list(thread["thread_id"], limit=100)
        assert [r["status"] for r in runs] == ["success"] * 10


async def test_runs_queued_at_once_on_one_new_thread_by_two_processes_run_one_after_the_other(claiming_url):
    spans: dict[str, list[tuple[float, float]]] = {}

    @tool
    async def work(i: int, runtime: ToolRuntime) -> str:
        """Do some work."""
        started = time.monotonic()
        await asyncio.sleep(0.05)
        spans.setdefault(runtime.thread_id, []).append((started, time.monotonic()))
        return "worked"

    def agent():
        return create_agent(ScriptedModel([tool_loop(1, "work")], loop=True), [work])

    async with AsyncExitStack() as stack:
        first, second = [await stack.enter_async_context(LocalRuntime(claiming_url, agents={"agent": agent()}))
                         for _ in range(2)]
        threads = [str(uuid.uuid4()) for _ in range(10)]
        made = await asyncio.gather(*(rt.runs.create(t, "agent", input=user("go"), if_not_exists="create")
                                      for t in threads for rt in (first, second)))
        for run in made:
            await first.runs.join(run["thread_id"], run["run_id"])
        for run in made:
            assert (await first.runs.get(run["thread_id"], run["run_id"]))["status"] == "success"
        for t in threads:
            (a_start, a_end), (b_start, b_end) = sorted(spans[t])
            assert a_end <= b_start, f"two runs of thread {t} ran at once"
            values = (await first.threads.get_state(t))["values"]
            assert [m["content"] for m in values["messages"] if m["type"] == "human"] == ["go", "go"]


def count_reads(rt) -> list[str]:
    """The names of the reads of a run's state and mail that the runtime makes, from now on."""
    reads: list[str] = []
    for name in ("head_checkpoint", "inbox"):
        read = getattr(rt.storage, name)

        async def counted(*args, _read=read, _name=name):
            reads.append(_name)
            return await _read(*args)

        setattr(rt.storage, name, counted)
    return reads


def count_round_trips(rt) -> list[int]:
    """How many times the runtime's Postgres storage takes a connection (a round trip at least each), from now on."""
    taken = [0]
    pool = rt.storage.pool
    acquire = pool.acquire

    async def counted():
        taken[0] += 1
        return await acquire()

    pool.acquire = counted
    return taken


async def test_a_run_on_a_thread_it_makes_starts_without_reading_the_thread(claiming_url):
    # A thread made in the write that claims its run has no state and no mail to read (issue 22.2): checked in
    # that write, so the run starts from an empty state with no read of its own; on SQLite a thread with a past too,
    # where this process holds its state and the write finds the thread at it; one it holds nothing of is read.
    async with LocalRuntime(claiming_url, agents={"agent": echo_agent()}) as rt:
        await rt.runs.wait(None, "agent", input=user("warm up"))
        reads = count_reads(rt)
        threads = [str(uuid.uuid4()) for _ in range(5)]
        for i, thread_id in enumerate(threads):
            values = await rt.runs.wait(thread_id, "agent", input=user(f"new {i}"), if_not_exists="create")
            assert [m["content"] for m in values["messages"]] == [f"new {i}", f"echo: new {i}"]
            stateless = await rt.runs.wait(None, "agent", input=user(f"alone {i}"))
            assert stateless["messages"][-1]["content"] == f"echo: alone {i}"
        assert reads == [], f"runs on threads they made read {reads}"
        values = await rt.runs.wait(threads[0], "agent", input=user("again"))
        assert [m["content"] for m in values["messages"]] == ["new 0", "echo: new 0", "again", "echo: again"]
        assert sorted(reads) == ([] if claiming_url.startswith("sqlite") else ["head_checkpoint", "inbox"])
        reads.clear()
        rt.checkpoints.forget(threads[1])  # as after a restart, or its last run ran in another process
        values = await rt.runs.wait(threads[1], "agent", input=user("again"))
        assert [m["content"] for m in values["messages"]] == ["new 1", "echo: new 1", "again", "echo: again"]
        assert sorted(reads) == ["head_checkpoint", "inbox"]


async def test_runs_queued_at_once_on_a_thread_with_a_past_each_apply_their_input_once(claiming_url):
    # A run's input is applied to the state this process holds for its thread only where its claim may write it:
    # a start made on that state for a run that then waits (another took the thread) would put its input in the
    # state of the run that runs (twice in the thread, once from each), or in a run's live state.
    async with LocalRuntime(claiming_url, agents={"agent": echo_agent(latency=0.01)}) as rt:
        thread_id = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread_id, "agent", input=user("first"))
        for turn in range(3):
            runs = await asyncio.gather(*(rt.runs.create(thread_id, "agent", input=user(f"turn {turn}.{i}"))
                                          for i in range(3)))
            for run in runs:
                await rt.runs.join(thread_id, run["run_id"])
        values = (await rt.threads.get_state(thread_id))["values"]
        humans = [m["content"] for m in values["messages"] if m["type"] == "human"]
        assert sorted(humans) == sorted(["first", *(f"turn {t}.{i}" for t in range(3) for i in range(3))])
        history = await rt.threads.get_history(thread_id, limit=100)
        ids = {h["checkpoint_id"] for h in history}
        assert [h["checkpoint_id"] for h in history if h["parent_checkpoint_id"] not in ids] == \
            [history[-1]["checkpoint_id"]]  # one chain


async def test_a_run_whose_input_fails_to_apply_on_a_thread_with_a_past_fails_as_it_starts(claiming_url):
    # The input of a run on a thread with a past is applied to the state held for it inside the write that claims
    # it: an input that fails there (a removal of a message the thread lacks, after a new one) must neither fail
    # that write nor leave its part applied: the run is stored, fails as any run would, and the thread is as it was.
    async with LocalRuntime(claiming_url, agents={"agent": echo_agent()}) as rt:
        thread_id = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread_id, "agent", input=user("hi"))
        bad = {"messages": [{"role": "user", "content": "half"}, {"type": "remove", "id": "no such message"}]}
        run = await rt.runs.create(thread_id, "agent", input=bad)
        await rt.runs.join(thread_id, run["run_id"])
        assert (await rt.runs.get(thread_id, run["run_id"]))["status"] == "error"
        values = (await rt.threads.get_state(thread_id))["values"]
        assert [m["content"] for m in values["messages"]] == ["hi", "echo: hi"]
        values = await rt.runs.wait(thread_id, "agent", input=user("again"))
        assert [m["content"] for m in values["messages"]] == ["hi", "echo: hi", "again", "echo: again"]


async def test_a_run_is_claimed_with_the_thread_it_makes_only_if_it_makes_it(claiming_storage):
    # One statement makes the thread, stores the run and claims it, with the run's first checkpoint (issue 22.2).
    storage, now = claiming_storage, now_iso()

    def first(thread_id: str, run_id: str) -> Start:
        row = CheckpointRow(thread_id, "c1", None, 1, run_id, Delta.of({}), "before_agent", {}, now)
        return Start(None, CheckpointWrite(row, base=CheckpointBase(thread_id, "c1", 1, None, "", "{}")))

    made = pending_run("new")
    assert await storage.create_claimed_run(made, "claim", thread=ThreadRow("new", now, now, status="busy"),
                                            start=first("new", made.run_id)) == ("running", True)
    assert (await storage.get_thread("new")).status == "busy"
    assert (await storage.get_run(made.run_id)).claim == "claim"
    assert (await storage.head_checkpoint("new")).run_id == made.run_id
    assert [b.checkpoint_id for b in await storage.checkpoint_bases("new", 1)] == ["c1"]  # with its base
    # made meanwhile by another request: it is made busy, with this one's metadata, and the run waits
    await storage.create_thread(ThreadRow("there", now, now))
    waiting = pending_run("there")
    stored = await storage.create_claimed_run(waiting, "claim", start=first("there", waiting.run_id),
                                              thread=ThreadRow("there", now, now, {"k": "v"}, "busy"))
    assert stored == ("pending", False)
    thread = await storage.get_thread("there")
    assert (thread.status, thread.metadata) == ("busy", {"k": "v"})
    assert await storage.head_checkpoint("there") is None
    # a checkpoint left without its thread: the thread is made, its run waits for a claim that reads it
    await storage.put_checkpoint(first("left", "old").write.row)
    stored = await storage.create_claimed_run(pending_run("left"), "claim",
                                              thread=ThreadRow("left", now, now, status="busy"))
    assert stored == ("pending", False)


async def test_a_one_step_run_takes_few_round_trips_to_the_database(postgres_url):
    # Each round trip costs both sides CPU, and with several processes (fewer runs in flight in each) fewer
    # of them are shared between runs (issue 22.2). On a new thread: the assistant and the thread read together,
    # the run stored and claimed with its thread and its input, the step, the end (the message to other processes
    # about the new run goes with one of those writes).
    async with LocalRuntime(postgres_url, agents={"agent": echo_agent()}) as rt:
        await rt.runs.wait(None, "agent", input=user("warm up"))
        taken = count_round_trips(rt)
        for i in range(10):
            values = await rt.runs.wait(str(uuid.uuid4()), "agent", input=user(f"new {i}"), if_not_exists="create")
            assert values["messages"][-1]["content"] == f"echo: new {i}"
        # 4 a run, and a few for the runtime's own looks (crons once a second, heartbeats) meanwhile
        assert taken[0] <= 10 * 4 + 8, f"{taken[0] / 10:.1f} round trips a run"


async def test_the_statements_of_a_run_are_parsed_once(postgres_url, monkeypatch):
    # psycopg parses a statement's placeholders again at every execution when it has more than 50 parameters (or
    # is longer than 4 KiB): the claim on insert had 55, ~200 µs of the server's CPU a run (issue 22.2).
    import psycopg._queries

    parsed: list[bytes] = []
    uncached = psycopg._queries._query2pg_nocache

    def counted(query, encoding):
        parsed.append(query[:60])
        return uncached(query, encoding)

    monkeypatch.setattr(psycopg._queries, "_query2pg_nocache", counted)
    async with LocalRuntime(postgres_url, agents={"agent": echo_agent()}) as rt:
        thread_id = str(uuid.uuid4())
        for i in range(3):  # a new thread, then the same
            values = await rt.runs.wait(thread_id, "agent", input=user(f"turn {i}"), if_not_exists="create")
            assert values["messages"][-1]["content"] == f"echo: turn {i}"
        await rt.runs.wait(None, "agent", input=user("alone"))
    assert parsed == []


async def test_a_run_is_claimed_as_it_is_stored_only_on_a_busy_thread_with_no_other_run(claiming_storage):
    # The claim rule holds in the write that stores the run: one running run per thread, and the thread busy
    # (its run's own writes made it so before: a thread left idle is not this run's to start).
    storage, now = claiming_storage, now_iso()
    await storage.create_thread(ThreadRow("idle", now, now))
    assert (await storage.create_claimed_run(pending_run("idle"), "claim")).status == "pending"
    await storage.create_thread(ThreadRow("busy", now, now, status="busy"))
    first, second = pending_run("busy"), pending_run("busy")
    assert (await storage.create_claimed_run(first, "first")).status == "running"
    assert (await storage.create_claimed_run(second, "second")).status == "pending"
    stored = [await storage.get_run(r.run_id) for r in (first, second)]
    assert [(r.status, r.claim, r.attempts) for r in stored] == [("running", "first", 1), ("pending", None, 0)]
    gone = pending_run("gone")
    assert await storage.create_claimed_run(gone, "claim") is None
    assert await storage.get_run(gone.run_id) is None


async def test_a_run_on_a_blank_thread_that_exists_is_claimed_with_its_input_on_sqlite(tmp_path):
    # A thread made by a request of its own (POST /threads, then the run) has nothing to read either: SQLite
    # looks in the write that claims the run, and writes the run's input with it (issue 22); as it does on a thread
    # with a past whose state this process holds.
    async with LocalRuntime(f"sqlite:///{tmp_path}/blank.db", agents={"agent": echo_agent()}) as rt:
        await rt.runs.wait(None, "agent", input=user("warm up"))
        reads = count_reads(rt)
        thread = await rt.threads.create()
        values = await rt.runs.wait(thread["thread_id"], "agent", input=user("first"))
        assert [m["content"] for m in values["messages"]] == ["first", "echo: first"]
        assert reads == [], f"a run on a blank thread read {reads}"
        values = await rt.runs.wait(thread["thread_id"], "agent", input=user("again"))
        assert [m["content"] for m in values["messages"]] == ["first", "echo: first", "again", "echo: again"]
        assert reads == [], f"a run on a thread with a past read {reads}"
        # in the storage: the first checkpoint goes in only on a thread with none and no mail
        now = now_iso()
        storage = rt.storage
        for thread_id in ("empty", "stepped", "mailed"):
            await storage.create_thread(ThreadRow(thread_id, now, now, status="busy"))
        await storage.put_checkpoint(CheckpointRow("stepped", "c0", None, 1, "old", Delta.of({}), "", {}, now))
        await storage.put_inbox("mailed", "m", HumanMessage("mail"), now)
        for thread_id, blank in (("empty", True), ("stepped", False), ("mailed", False)):
            row = pending_run(thread_id)
            checkpoint = CheckpointRow(thread_id, "c1", None, 2, row.run_id, Delta.of({}), "before_agent", {}, now)
            assert await storage.create_claimed_run(row, "claim", start=Start(None, CheckpointWrite(checkpoint))) == (
                "running", blank)
            assert (await storage.get_checkpoint(thread_id, "c1") is not None) == blank


async def test_a_one_step_run_on_sqlite_takes_few_commits(tmp_path):
    # A commit costs more than the statements it carries, and runs that come one at a time share none (issue 22):
    # on a thread it makes (or a blank one, or one with a past whose state this process holds), the thread, the
    # run, its claim and its input go in one; its last step goes in with its end.
    served = echo_agent(middleware=[CompletionNotifier()])  # as a server serves every agent (a no-op here)
    async with LocalRuntime(f"sqlite:///{tmp_path}/commits.db", agents={"agent": served}) as rt:
        await rt.runs.wait(None, "agent", input=user("warm up"))
        commits: list[str] = []
        rt.storage.db.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        for i in range(10):
            values = await rt.runs.wait(str(uuid.uuid4()), "agent", input=user(f"new {i}"), if_not_exists="create")
            assert values["messages"][-1]["content"] == f"echo: new {i}"
        made = len(commits)
        commits.clear()
        for i in range(10):
            thread = await rt.threads.create()
            values = await rt.runs.wait(thread["thread_id"], "agent", input=user(f"first {i}"))
            assert values["messages"][-1]["content"] == f"echo: first {i}"
        blank = len(commits)
        commits.clear()
        for i in range(10):
            values = await rt.runs.wait(thread["thread_id"], "agent", input=user(f"turn {i}"))
            assert values["messages"][-1]["content"] == f"echo: turn {i}"
        # 2 a run on a new thread (and 1 more where the thread is made by a request of its own), 2 on one with
        # a past; a few for the runtime's own writes meanwhile (heartbeats)
        assert made <= 10 * 2 + 4, f"{made / 10:.1f} commits a run on a new thread"
        assert blank <= 10 * 3 + 4, f"{blank / 10:.1f} commits a thread made and its first run"
        assert len(commits) <= 10 * 2 + 4, f"{len(commits) / 10:.1f} commits a run on a thread with a past"
