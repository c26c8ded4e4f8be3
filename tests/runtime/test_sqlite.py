"""SQLite storage on a real file: what survives a restart, WAL, URLs, sharing a file."""

import asyncio
import sqlite3
import uuid

import pytest
from runtime_helpers import contents, echo_agent, looping_agent, user

from backchannel._clock import now_iso
from backchannel.errors import StorageUnavailableError
from backchannel.runtime import LocalRuntime, open_storage
from backchannel.runtime.memory import MemoryStorage
from backchannel.runtime.rows import RunRow, ThreadRow
from backchannel.runtime.sqlite import SQLiteStorage


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path}/state.db"


async def test_everything_survives_a_restart(make_runtime, url):
    rt = await make_runtime({"agent": looping_agent(2)}, store=url)
    thread = await rt.threads.create(metadata={"owner": "ana", "n": 1})
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("go"), metadata={"tag": "x"})
    result = await rt.runs.join(tid, run["run_id"])
    await rt.threads.update_state(tid, {"topic": "t"})
    await rt.store.put_item(["users", "ana"], "prefs", {"theme": "dark"})
    snapshot = {"thread": await rt.threads.get(tid), "state": await rt.threads.get_state(tid),
                "history": await rt.threads.get_history(tid, limit=100), "runs": await rt.runs.list(tid)}
    await rt.close()

    again = await make_runtime({"agent": looping_agent(2)}, store=url)
    assert await again.threads.get(tid) == snapshot["thread"]
    assert await again.threads.get_state(tid) == snapshot["state"]
    assert await again.threads.get_history(tid, limit=100) == snapshot["history"]
    assert await again.runs.list(tid) == snapshot["runs"]
    assert snapshot["runs"][0]["status"] == "success" and snapshot["runs"][0]["metadata"]["tag"] == "x"
    assert contents(snapshot["state"]["values"]) == contents(result)
    assert snapshot["state"]["values"]["topic"] == "t"
    assert [t["thread_id"] for t in await again.threads.search(metadata={"owner": "ana"})] == [tid]
    assert (await again.store.get_item(["users", "ana"], "prefs"))["value"] == {"theme": "dark"}
    # and the conversation goes on
    more = await again.runs.wait(tid, "agent", input=user("more"))
    assert contents(more)[:len(contents(result))] == contents(result)
    assert more["messages"][-1]["content"] == "done after 2 steps"


async def test_the_file_uses_wal_and_is_created_with_its_directory(tmp_path):
    path = tmp_path / "deep" / "dir" / "state.db"
    storage = open_storage(f"sqlite:///{path}")
    await storage.open()
    try:
        assert path.exists()
        assert storage.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        await storage.close()


async def test_urls_and_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    home = open_storage("sqlite:///~/.backchannel/state.db")
    assert isinstance(home, SQLiteStorage) and home.path == str(tmp_path / ".backchannel" / "state.db")
    plain = open_storage(str(tmp_path / "plain.db"))
    assert isinstance(plain, SQLiteStorage) and plain.path == str(tmp_path / "plain.db")
    for memory in ("memory", ":memory:"):
        assert isinstance(open_storage(memory), MemoryStorage)
    assert open_storage("sqlite:///:memory:").path == ":memory:"
    assert open_storage(home) is home
    with pytest.raises(ValueError, match="unsupported"):
        open_storage("redis://localhost")
    await home.open()
    await home.close()
    assert (tmp_path / ".backchannel" / "state.db").exists()


async def test_two_runtimes_share_one_file(make_runtime, store_url):
    if store_url == "memory":
        pytest.skip("a memory store belongs to one runtime")
    a = await make_runtime({"agent": echo_agent()})  # on a SQLite file, then on Postgres
    b = await make_runtime({"agent": echo_agent()})
    thread = await a.threads.create(metadata={"from": "a"})
    await a.runs.wait(thread["thread_id"], "agent", input=user("hi"))
    seen = await b.threads.get(thread["thread_id"])
    assert seen["metadata"]["from"] == "a" and contents(seen["values"]) == ["hi", "echo: hi"]
    # a run created through b is run by b
    result = await b.runs.wait(thread["thread_id"], "agent", input=user("from b"))
    assert contents(result)[-1] == "echo: from b"
    assert contents((await a.threads.get_state(thread["thread_id"]))["values"])[-1] == "echo: from b"


async def test_many_runs_on_a_file(make_runtime, url):
    rt = await make_runtime({"agent": echo_agent(latency=0.005)}, store=url)
    threads = [await rt.threads.create() for _ in range(50)]
    runs = [await rt.runs.create(t["thread_id"], "agent", input=user(str(i))) for i, t in enumerate(threads)]
    results = await asyncio.gather(*(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs))
    assert [contents(r)[-1] for r in results] == [f"echo: {i}" for i in range(50)]


# -- the storage operations ------------------------------------------------------------------------------


async def test_a_closed_storage_says_so(tmp_path):
    storage = SQLiteStorage(str(tmp_path / "x.db"))
    with pytest.raises(RuntimeError, match="not open"):
        await storage.get_thread("t")
    await storage.open()
    await storage.open()  # opening twice is harmless
    await storage.close()
    await storage.close()


async def test_what_a_claim_reads_does_not_grow_with_the_runs_under_way(tmp_path):
    """A claim with a thousand runs running reads about what it does with ten (it read every running run, to count
    each concurrency key's, at every claim): the steps of its statements, counted by SQLite's progress handler."""
    storage = SQLiteStorage(str(tmp_path / "x.db"))
    await storage.open()

    async def steps_of_a_claim(running: int) -> int:
        now = now_iso()
        for _ in range(running):
            thread_id = str(uuid.uuid4())
            await storage.create_thread(ThreadRow(thread_id, now, now))
            await storage.create_run(RunRow(str(uuid.uuid4()), thread_id, "a", now, now, worker_id="other",
                                            scheduled_at=now))
        assert len(await storage.claim_runs("other", running, now_iso())) == running
        thread_id = str(uuid.uuid4())
        await storage.create_thread(ThreadRow(thread_id, now, now))
        await storage.create_run(RunRow(str(uuid.uuid4()), thread_id, "a", now, now, worker_id="w1", scheduled_at=now,
                                        concurrency_key="k", concurrency_limit=2))
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        storage.db.set_progress_handler(count, 10)
        try:
            assert len(await storage.claim_runs("w1", 10, now_iso())) == 1
        finally:
            storage.db.set_progress_handler(None, 10)
        return steps

    try:
        few = await steps_of_a_claim(10)
        many = await steps_of_a_claim(990)  # 1,000 running
    finally:
        await storage.close()
    assert many < 2 * few + 50, (few, many)


async def test_runtime_close_is_idempotent_and_reopenable(url):
    rt = LocalRuntime(store=url, agents={"agent": echo_agent()})
    async with rt:
        thread = await rt.threads.create()
    await rt.close()
    async with LocalRuntime(store=url, agents={"agent": echo_agent()}) as again:
        assert (await again.threads.get(thread["thread_id"]))["status"] == "idle"


async def test_the_wal_is_copied_into_the_database_once_writes_pause(tmp_path):
    from backchannel.runtime import sqlite

    path = tmp_path / "state.db"
    storage = SQLiteStorage(str(path))
    await storage.open()
    try:
        for _ in range(sqlite._CHANGES_PER_CHECKPOINT):
            await storage.create_thread(ThreadRow(str(uuid.uuid4()), now_iso(), now_iso(), {"pad": "x" * 200}))
        await asyncio.sleep(0)  # the tick's commit
        size_after_commit = path.stat().st_size
        assert (tmp_path / "state.db-wal").stat().st_size > 100 * 4096  # the rows are in the WAL only

        await asyncio.sleep(sqlite._QUIET_SECONDS + 0.2)

        assert path.stat().st_size > size_after_commit + 100 * 4096  # copied into the database
        assert await storage.count_threads() == sqlite._CHANGES_PER_CHECKPOINT
    finally:
        await storage.close()


async def test_a_write_refused_while_another_connection_writes_is_unavailable_and_the_next_goes_in(tmp_path):
    storage = SQLiteStorage(str(tmp_path / "state.db"))
    await storage.open()
    try:
        storage.db.execute("PRAGMA busy_timeout = 0")  # refused at once, not after ten seconds
        other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writing: SQLITE_BUSY
        now = now_iso()
        with pytest.raises(StorageUnavailableError, match="could not write to the database"):
            await storage.create_thread(ThreadRow("t1", now, now, {}))
        other.execute("ROLLBACK")
        other.close()
        assert await storage.create_thread(ThreadRow("t1", now, now, {}))
        assert (await storage.get_thread("t1")).thread_id == "t1"
    finally:
        await storage.close()


async def test_two_storages_of_one_process_on_one_file_write_in_the_same_tick(tmp_path):
    first, second = SQLiteStorage(str(tmp_path / "state.db")), SQLiteStorage(str(tmp_path / "state.db"))
    await first.open()
    await second.open()
    try:
        second.db.execute("PRAGMA busy_timeout = 0")  # the first's open transaction would refuse it at once
        now = now_iso()
        made = await asyncio.gather(first.create_thread(ThreadRow("t1", now, now, {})),
                                    second.create_thread(ThreadRow("t2", now, now, {})))
        assert made == [True, True]
        assert [(await first.get_thread(t)).thread_id for t in ("t1", "t2")] == ["t1", "t2"]
    finally:
        await first.close()
        await second.close()
