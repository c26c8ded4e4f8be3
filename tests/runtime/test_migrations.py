"""Schema versions on SQLite and Postgres: recorded at open, applied forward, refused when newer than the code."""

import asyncio
import sqlite3

import pytest

from backchannel._clock import now_iso
from backchannel.errors import SchemaVersionError
from backchannel.runtime import open_storage
from backchannel.runtime.rows import ThreadRow


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/state.db"
    return request.getfixturevalue("postgres_url")


def _module(storage):
    import importlib

    return importlib.import_module(type(storage).__module__)


async def _sql(storage, statement, params=()):
    """Run one statement on whichever database ``storage`` is; returns its rows."""
    if hasattr(storage, "db"):
        rows = storage.db.execute(statement.replace("%s", "?"), params).fetchall()
        storage._commit()
        return rows
    async with storage.pool.connection() as conn:
        cursor = await conn.execute(statement, params)
        return await cursor.fetchall() if cursor.description else []


async def _versions(storage):
    return [v for (v,) in await _sql(storage, "SELECT version FROM schema_migrations ORDER BY version")]


async def test_a_new_database_records_every_version(url):
    storage = open_storage(url)
    await storage.open()
    try:
        assert await _versions(storage) == list(range(1, len(_module(storage)._MIGRATIONS) + 1))
    finally:
        await storage.close()
    again = open_storage(url)  # opening again applies nothing twice
    await again.open()
    try:
        assert await _versions(again) == list(range(1, len(_module(again)._MIGRATIONS) + 1))
    finally:
        await again.close()


async def test_a_new_migration_is_applied_once_at_the_next_open_and_keeps_the_data(url, monkeypatch):
    storage = open_storage(url)
    await storage.open()
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now, {"kept": True}))
    await storage.close()

    module = _module(storage)
    known = len(module._MIGRATIONS)
    monkeypatch.setattr(module, "_MIGRATIONS", (*module._MIGRATIONS, (
        "CREATE TABLE notes (thread_id TEXT PRIMARY KEY, note TEXT NOT NULL)",
        "INSERT INTO notes SELECT thread_id, 'migrated' FROM threads",
    )))
    upgraded = open_storage(url)
    await upgraded.open()
    try:
        assert await _versions(upgraded) == list(range(1, known + 2))
        assert await _sql(upgraded, "SELECT thread_id, note FROM notes") == [("t1", "migrated")]
        assert (await upgraded.get_thread("t1")).metadata == {"kept": True}
    finally:
        await upgraded.close()
    reopened = open_storage(url)
    await reopened.open()  # version known + 1 is recorded: its statements do not run again
    await reopened.close()


async def test_a_database_newer_than_the_code_is_refused_and_left_as_it_is(url):
    storage = open_storage(url)
    await storage.open()
    newest = len(_module(storage)._MIGRATIONS)
    await _sql(storage, "INSERT INTO schema_migrations VALUES (%s, %s)", (newest + 1, now_iso()))
    await storage.close()

    newer = open_storage(url)
    with pytest.raises(SchemaVersionError, match=f"schema version {newest + 1}.*knows versions up to {newest}"
                                                 ".*upgrade backchannel"):
        await newer.open()
    with pytest.raises(RuntimeError, match="not open"):
        await newer.get_thread("t1")
    assert await _raw_versions(url) == list(range(1, newest + 2))


async def _raw_versions(url):
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            return [v for (v,) in db.execute("SELECT version FROM schema_migrations ORDER BY version")]
    import psycopg

    async with await psycopg.AsyncConnection.connect(url) as conn:
        rows = await (await conn.execute("SELECT version FROM schema_migrations ORDER BY version")).fetchall()
    return [v for (v,) in rows]


async def test_a_sqlite_file_from_before_versions_takes_version_1_as_is(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the tables as the first release made them, with a thread in them
        db.execute("CREATE TABLE threads (thread_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, "
                   "updated_at TEXT NOT NULL, metadata TEXT NOT NULL, status TEXT NOT NULL, "
                   "interrupts TEXT NOT NULL, error TEXT)")
        db.execute("INSERT INTO threads VALUES ('old', 'then', 'then', '{\"from\": \"before\"}', 'idle', '[]', NULL)")
    storage = open_storage(f"sqlite:///{path}")
    await storage.open()
    try:
        assert (await storage.get_thread("old")).metadata == {"from": "before"}
        assert await _versions(storage) == list(range(1, len(_module(storage)._MIGRATIONS) + 1))
    finally:
        await storage.close()


async def test_sqlite_checkpoints_written_before_version_2_are_kept(tmp_path, monkeypatch):
    from backchannel.runtime import sqlite as module
    from backchannel.runtime._rows import checkpoint_values
    from backchannel.runtime.rows import CheckpointRow

    url = f"sqlite:///{tmp_path}/state.db"

    def checkpoint(thread_id, seq):
        parent = f"{thread_id}-{seq - 1}" if seq > 1 else None
        return CheckpointRow(thread_id, f"{thread_id}-{seq}", parent, seq, "r1", {"n": seq}, "", {"step": seq},
                             now_iso())

    monkeypatch.setattr(module, "_MIGRATIONS", module._MIGRATIONS[:1])
    old = open_storage(url)
    await old.open()
    await old.close()
    with sqlite3.connect(tmp_path / "state.db") as db:  # rows as version 1 wrote them
        for seq in (1, 2, 3):
            for thread_id in ("a", "b"):
                db.execute("INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?,?,?)", checkpoint_values(
                    checkpoint(thread_id, seq))[:9])

    monkeypatch.undo()
    storage = open_storage(url)
    await storage.open()
    try:
        assert await _versions(storage) == list(range(1, len(module._MIGRATIONS) + 1))
        chain = await storage.checkpoint_chain("a", "a-3")
        assert [(c.checkpoint_id, dict(c.delta)) for c in chain] == [(f"a-{n}", {"n": n}) for n in (1, 2, 3)]
        assert (await storage.head_checkpoint("b")).checkpoint_id == "b-3"
        await storage.put_checkpoint(checkpoint("a", 4))
        assert [c.seq for c in await storage.list_checkpoints("a")] == [4, 3, 2, 1]
        with pytest.raises(sqlite3.IntegrityError):  # one checkpoint per thread and seq, as before
            await storage.put_checkpoint(checkpoint("b", 3))
    finally:
        await storage.close()


async def test_threads_made_before_counts_were_kept_are_counted_after_the_upgrade(url, monkeypatch):
    storage = open_storage(url)
    module = _module(storage)
    with monkeypatch.context() as before:  # the schema as it was before thread counts were kept
        before.setattr(module, "_MIGRATIONS", module._MIGRATIONS[:-1])
        await storage.open()
        now = now_iso()
        for i in range(30):
            status = "busy" if i % 3 == 0 else "idle"
            await storage.create_thread(ThreadRow(f"t{i}", now, now, {"user": f"u{i % 4}", "n": i % 2}, status))
        await storage.close()

    upgraded = open_storage(url)
    await upgraded.open()
    try:
        for status in (None, "idle", "busy", "error"):
            for metadata in ({}, {"user": "u1"}, {"user": "u1", "n": 1}, {"n": 0}):
                expected = len([i for i in range(30) if (status is None or status == ("busy" if i % 3 == 0 else "idle"))
                                and all({"user": f"u{i % 4}", "n": i % 2}[k] == v for k, v in metadata.items())])
                assert await upgraded.count_threads(metadata=metadata, status=status) == expected
        await upgraded.update_thread("t1", status="busy", metadata={"user": "u9"})  # and kept from then on
        assert await upgraded.count_threads(status="busy") == 11
        assert await upgraded.count_threads(metadata={"user": "u9"}) == 1
    finally:
        await upgraded.close()


async def test_counts_kept_with_busy_threads_apart_are_converted_and_kept_exact_after_the_upgrade(url, monkeypatch):
    """Counts kept before busy threads were counted with the idle ones (and their metadata, where some) come out the
    same after the upgrade, and stay exact as threads then go busy and back, change metadata and go."""
    storage = open_storage(url)
    module = _module(storage)
    statuses = ("idle", "busy", "interrupted", "error")
    metadata = [{}, {"user": "u1"}, {"user": "u2", "n": 1}]
    with monkeypatch.context() as before:
        before.setattr(module, "_MIGRATIONS", module._MIGRATIONS[:-1])
        await storage.open()
        now = now_iso()
        for i in range(24):
            await storage.create_thread(ThreadRow(f"t{i}", now, now, metadata[i % 3], statuses[i % 4]))
        await storage.close()

    upgraded = open_storage(url)
    await upgraded.open()

    async def counts_match():
        for status in (None, *statuses):
            for filter in ({}, *metadata[1:], {"n": 1}):
                found = await upgraded.search_threads(metadata=filter, status=status, limit=100)
                assert await upgraded.count_threads(metadata=filter, status=status) == len(found), (filter, status)

    try:
        await counts_match()
        for i in range(0, 24, 2):  # a run's cycle on half of them, ending every way
            await upgraded.update_thread(f"t{i}", status="busy", metadata={"user": "u1"})
            await counts_match()
            await upgraded.update_thread(f"t{i}", status=statuses[i % 4 if i % 4 != 1 else 0], metadata={})
        await counts_match()
        for i in range(0, 24, 5):
            await upgraded.delete_thread(f"t{i}")
        await counts_match()
    finally:
        await upgraded.close()


async def test_a_long_thread_written_before_bases_were_kept_reads_the_same_after_the_upgrade(url, monkeypatch):
    from backchannel.messages import HumanMessage
    from backchannel.runtime.checkpoints import Checkpointer

    storage = open_storage(url)
    module = _module(storage)

    async def write(checkpointer, texts):
        state = await checkpointer.latest("t", {})
        for text in texts:
            await checkpointer.write("t", state, {"messages": [HumanMessage(text)]}, next_stage="", source="update",
                                     run_id=None, step=0, reducers={})

    async def reads(checkpointer):
        head = await checkpointer.storage.head_checkpoint("t")
        rows = await checkpointer.storage.list_checkpoints("t", limit=300)
        return (await checkpointer.view("t", head.checkpoint_id, {}), await checkpointer.history("t", rows, {}),
                await checkpointer.history("t", rows[:10], {}, text=True))

    with monkeypatch.context() as before:  # the schema and the checkpointer as they were before bases
        before.setattr(module, "_MIGRATIONS", module._MIGRATIONS[:-1])
        before.setattr(Checkpointer, "_base_if_due", staticmethod(lambda *args: None))
        before.setattr(type(storage), "checkpoint_bases", lambda *args: asyncio.sleep(0, []))
        before.setattr(type(storage), "based_chain", lambda *args: asyncio.sleep(0, ([], [])))
        await storage.open()
        now = now_iso()
        await storage.create_thread(ThreadRow("t", now, now, {}))
        await write(Checkpointer(storage), [f"m{i}" for i in range(200)])
        written = await reads(Checkpointer(storage))
        await storage.close()

    upgraded = open_storage(url)
    await upgraded.open()
    try:
        assert await reads(Checkpointer(upgraded)) == written
        await write(Checkpointer(upgraded), [f"n{i}" for i in range(100)])  # and continued with bases
        head = await upgraded.head_checkpoint("t")
        assert await upgraded.checkpoint_bases("t", head.seq)
        state, _ = await Checkpointer(upgraded).view("t", head.checkpoint_id, {})
        expected = [f"m{i}" for i in range(200)] + [f"n{i}" for i in range(100)]
        assert [m["content"] for m in state["messages"]] == expected
    finally:
        await upgraded.close()
