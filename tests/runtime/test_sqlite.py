"""SQLite storage on a real file: what survives a restart, WAL, URLs, and the storage operations themselves."""

import asyncio
import uuid

import pytest
from runtime_helpers import contents, echo_agent, looping_agent, user

from backchannel.runtime import LocalRuntime, open_storage
from backchannel.runtime.sqlite import SQLiteStorage
from backchannel.runtime.storage import CheckpointRow, RunRow, ThreadRow, now_iso


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
    for memory in ("memory", ":memory:", "sqlite:///:memory:"):
        assert open_storage(memory).path == ":memory:"
    assert open_storage(home) is home
    with pytest.raises(ValueError, match="unsupported"):
        open_storage("redis://localhost")
    await home.open()
    await home.close()
    assert (tmp_path / ".backchannel" / "state.db").exists()


async def test_two_runtimes_share_one_file(make_runtime, url):
    a = await make_runtime({"agent": echo_agent()}, store=url)
    b = await make_runtime({"agent": echo_agent()}, store=url)
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


@pytest.fixture
async def storage(tmp_path):
    s = SQLiteStorage(str(tmp_path / "s.db"))
    await s.open()
    yield s
    await s.close()


def _run(thread_id, *, status="pending", worker="w1", at=None):
    now = now_iso()
    return RunRow(str(uuid.uuid4()), thread_id, "a", now, now, status, {}, {}, "enqueue", worker, at or now)


def _checkpoint(thread_id, seq, parent, run_id=None, delta='{"k": 1}'):
    return CheckpointRow(thread_id, f"c{seq}", parent, seq, run_id, delta, "", {"source": "loop", "step": seq},
                         now_iso())


async def test_threads_are_unique_and_searchable(storage):
    now = now_iso()
    assert await storage.create_thread(ThreadRow("t1", now, now, {"a.b": 1, "tag with space": "x"}))
    assert not await storage.create_thread(ThreadRow("t1", now, now, {}))
    assert [t.thread_id for t in await storage.search_threads(metadata={"a.b": 1})] == ["t1"]
    assert [t.thread_id for t in await storage.search_threads(metadata={"tag with space": "x"})] == ["t1"]
    assert await storage.search_threads(metadata={"a.b": "1"}) == []  # types matter
    with pytest.raises(ValueError):
        await storage.search_threads(sort_by="metadata; DROP TABLE threads")
    assert await storage.count_threads() == 1


async def test_claim_runs_one_per_thread_oldest_first_and_not_before_time(storage):
    now = now_iso()
    for t in ("t1", "t2"):
        await storage.create_thread(ThreadRow(t, now, now))
    first, second = _run("t1"), _run("t1")
    other = _run("t2")
    later = _run("t2", at="9999-01-01T00:00:00+00:00")
    foreign = _run("t2", worker="w2")
    for row in (first, second, other, later, foreign):
        await storage.create_run(row)
    claimed = await storage.claim_runs("w1", 10, now_iso())
    assert [r.run_id for r in claimed] == [first.run_id, other.run_id]
    assert all(r.status == "running" for r in claimed)
    # the thread's next run waits while one is running
    assert await storage.claim_runs("w1", 10, now_iso()) == []
    await storage.update_run(first.run_id, status="success")
    assert [r.run_id for r in await storage.claim_runs("w1", 10, now_iso())] == [second.run_id]
    assert [r.run_id for r in await storage.active_runs("t1")] == [second.run_id]
    # the limit is respected
    await storage.update_run(other.run_id, status="success")
    assert await storage.claim_runs("w1", 0, now_iso()) == []


async def test_requeue_orphans_hands_dead_workers_runs_over(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now))
    await storage.create_thread(ThreadRow("t2", now, now))
    dead_running = _run("t1", status="running", worker="dead")
    dead_pending = _run("t1", worker="dead")
    alive = _run("t2", status="running", worker="alive")
    finished = _run("t2", status="success", worker="dead")
    for row in (dead_running, dead_pending, alive, finished):
        await storage.create_run(row)
    moved = await storage.requeue_orphans(["alive"], "me")
    assert {r.run_id for r in moved} == {dead_running.run_id, dead_pending.run_id}
    for row in (dead_running, dead_pending):
        again = await storage.get_run(row.run_id)
        assert (again.status, again.worker_id) == ("pending", "me")
    assert (await storage.get_run(alive.run_id)).worker_id == "alive"
    assert (await storage.get_run(finished.run_id)).status == "success"


async def test_checkpoint_chains_follow_parents_across_forks(storage):
    await storage.put_checkpoint(_checkpoint("t", 1, None))
    await storage.put_checkpoint(_checkpoint("t", 2, "c1"))
    await storage.put_checkpoint(_checkpoint("t", 3, "c2"))
    await storage.put_checkpoint(_checkpoint("t", 4, "c1"))  # a fork from c1
    assert [c.checkpoint_id for c in await storage.checkpoint_chain("t", "c4")] == ["c1", "c4"]
    assert [c.checkpoint_id for c in await storage.checkpoint_chain("t", "c3")] == ["c1", "c2", "c3"]
    assert await storage.checkpoint_chain("t", "missing") == []
    assert (await storage.head_checkpoint("t")).checkpoint_id == "c4"
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t", before_seq=3)] == ["c2", "c1"]
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t", limit=2)] == ["c4", "c3"]


async def test_pending_writes_are_kept_per_thread_until_cleared(storage):
    await storage.put_pending_write("t", "call_1", '{"update": {}, "direct": false}')
    await storage.put_pending_write("t", "call_2", '{"update": {}, "direct": false}')
    await storage.put_pending_write("t", "call_2", '{"update": {"x": 1}, "direct": false}')  # replaced
    await storage.put_pending_write("other", "call_9", "{}")
    assert await storage.pending_writes("t") == {"call_1": '{"update": {}, "direct": false}',
                                                 "call_2": '{"update": {"x": 1}, "direct": false}'}
    await storage.clear_pending_writes("t")
    assert await storage.pending_writes("t") == {}
    assert set(await storage.pending_writes("other")) == {"call_9"}


async def test_deleting_a_run_s_checkpoints_and_copying_a_thread(storage):
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id="r1"))
    await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id="r2"))
    await storage.copy_checkpoints("t", "copy")
    await storage.delete_checkpoints_of_run("t", "r2")
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t")] == ["c1"]
    assert [c.checkpoint_id for c in await storage.list_checkpoints("copy")] == ["c2", "c1"]


async def test_inbox_takes_each_key_once(storage):
    assert await storage.put_inbox("t", "k1", '{"type": "human", "content": "a"}', now_iso())
    assert not await storage.put_inbox("t", "k1", '{"type": "human", "content": "again"}', now_iso())
    assert await storage.put_inbox("t", "k2", '{"type": "human", "content": "b"}', now_iso())
    assert [k for k, _ in await storage.inbox("t")] == ["k1", "k2"]
    await storage.ack_inbox("t", ["k1"])
    assert [k for k, _ in await storage.inbox("t")] == ["k2"]
    assert not await storage.put_inbox("t", "k1", "{}", now_iso())  # delivered keys stay taken


async def test_deleting_a_thread_deletes_what_belongs_to_it(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    await storage.create_run(_run("t"))
    await storage.put_checkpoint(_checkpoint("t", 1, None))
    await storage.put_inbox("t", "k", "{}", now)
    assert await storage.delete_thread("t")
    assert await storage.get_thread("t") is None
    assert await storage.list_runs("t") == []
    assert await storage.list_checkpoints("t") == []
    assert await storage.inbox("t") == []
    assert not await storage.delete_thread("t")


async def test_item_prefixes_are_matched_by_label_not_by_text(storage):
    now = now_iso()
    await storage.put_item(("a_",), "k", {"v": 1}, now)
    await storage.put_item(("ab",), "k", {"v": 2}, now)
    await storage.put_item(("a%", "x"), "k", {"v": 3}, now)
    assert [i.value["v"] for i in await storage.search_items(("a_",))] == [1]
    assert [i.value["v"] for i in await storage.search_items(("a%",))] == [3]
    assert await storage.search_items(("a",)) == []


async def test_a_closed_storage_says_so(tmp_path):
    storage = SQLiteStorage(str(tmp_path / "x.db"))
    with pytest.raises(RuntimeError, match="not open"):
        await storage.get_thread("t")
    await storage.open()
    await storage.open()  # opening twice is harmless
    await storage.close()
    await storage.close()


async def test_runtime_close_is_idempotent_and_reopenable(url):
    rt = LocalRuntime(store=url, agents={"agent": echo_agent()})
    async with rt:
        thread = await rt.threads.create()
    await rt.close()
    async with LocalRuntime(store=url, agents={"agent": echo_agent()}) as again:
        assert (await again.threads.get(thread["thread_id"]))["status"] == "idle"
