"""The storage contract, on every backend: the same operations give the same answers."""

import asyncio
import inspect
import json
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from runtime_helpers import Start, opened_storage

from backchannel._clock import now_iso
from backchannel.errors import LostRunError, NotFoundError
from backchannel.messages import HumanMessage, message_to_dict
from backchannel.runtime.backends import open_storage
from backchannel.runtime.rows import (
    CheckpointBase,
    CheckpointRow,
    CheckpointWrite,
    CronRow,
    RunClaim,
    RunEnd,
    RunRow,
    ThreadRow,
    ThreadTTL,
    delta_text,
)
from backchannel.runtime.storage import ParentGoneError, read_together


@pytest.fixture
async def storage(store_url):
    async with opened_storage(store_url) as s:
        yield s


def _run(thread_id, *, status="pending", worker="w1", at=None, key=None, limit=None):
    now = now_iso()
    return RunRow(str(uuid.uuid4()), thread_id, "a", now, now, status, {}, {}, "enqueue", worker, at or now,
                  concurrency_key=key, concurrency_limit=limit)


def _claim(row):
    return RunClaim(row.run_id, row.claim)


def _checkpoint(thread_id, seq, parent, run_id=None, delta=None):
    delta = {"k": 1} if delta is None else delta
    return CheckpointRow(thread_id, f"c{seq}", parent, seq, run_id, delta, "", {"source": "loop", "step": seq},
                         now_iso())


async def test_reads_made_together_answer_both_and_a_failed_first_leaves_no_read_hanging(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now, {"k": 1}))
    thread, head = await read_together(storage, storage.get_thread("t1"), storage.head_checkpoint("t1"))
    assert (thread.thread_id, thread.metadata, head) == ("t1", {"k": 1}, None)

    async def failing():
        raise NotFoundError("gone")

    second = storage.get_thread("t1")
    with pytest.raises(NotFoundError, match="gone"):
        await read_together(storage, failing(), second)
    for _ in range(200):  # at once where reads go one after the other; read to its end where they go together
        if inspect.getcoroutinestate(second) == inspect.CORO_CLOSED:
            break
        await asyncio.sleep(0.01)
    assert inspect.getcoroutinestate(second) == inspect.CORO_CLOSED  # not left never awaited (a warning at exit)


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


async def test_thread_metadata_filters_match_values_exactly(storage):
    now = now_iso()
    threads = {"plain": {"user": "u7", "tags": ["a", "b"]}, "key": {"u7": "user"}, "other": {"user": "u77"},
               "quote": {"user": 'say "hi"', "name": "é"}, "none": {"user": None}, "missing": {}}
    for thread_id, metadata in threads.items():
        await storage.create_thread(ThreadRow(thread_id, now, now, metadata))

    async def found(metadata):
        count = await storage.count_threads(metadata=metadata)
        ids = sorted(t.thread_id for t in await storage.search_threads(metadata=metadata, limit=100))
        assert count == len(ids)
        return ids

    assert await found({"user": "u7"}) == ["plain"]  # not where "u7" is a key, nor a longer value
    assert await found({"user": 'say "hi"'}) == ["quote"]
    assert await found({"name": "é"}) == ["quote"]
    assert await found({"tags": ["a", "b"]}) == ["plain"]
    assert await found({"tags": ["a"]}) == []  # equal, not contained
    assert await found({"user": None}) == ["key", "missing", "none"]  # a missing key counts as null
    assert await found({"user": "u7", "tags": ["a", "b"]}) == ["plain"]


_COUNTED_FILTERS = ({}, {"user": "u1"}, {"n": 1}, {"flag": True}, {"user": "u2", "n": 0}, {"tags": ["a"]},
                    {"user": None}, {"user": "x" * 300})


async def _counts_match_the_threads(storage):
    """Every count (by status, by metadata, both) equals the threads a search finds."""
    for status in (None, "idle", "busy", "interrupted", "error"):
        for metadata in _COUNTED_FILTERS:
            found = await storage.search_threads(metadata=metadata, status=status, limit=10_000)
            assert await storage.count_threads(metadata=metadata, status=status) == len(found), (metadata, status)


async def test_thread_counts_stay_exact_under_concurrent_writes_deletes_and_sweeps(storage, store_url):
    other = open_storage(store_url) if store_url != "memory" else storage  # a second process on the database
    await other.open()
    try:
        now = now_iso()

        def thread(i):
            metadata = {"user": f"u{i % 3}", "n": i % 2, "flag": i % 5 == 0, "tags": ["a"] if i % 4 else []}
            if i % 7 == 0:
                metadata["user"] = "x" * 300  # longer than a value kept by key
            return ThreadRow(f"t{i}", now, now, metadata)

        await asyncio.gather(*((storage if i % 2 else other).create_thread(thread(i)) for i in range(80)))
        await _counts_match_the_threads(storage)
        queued = [_run(f"t{i}") for i in range(0, 80, 9)]
        for row in queued:
            await storage.create_run(row)
        assert not await storage.create_thread(thread(3))  # a thread that exists is not counted twice
        await asyncio.gather(
            *(storage.update_thread(f"t{i}", status="busy") for i in range(0, 80, 3)),
            *(other.update_thread(f"t{i}", status="interrupted") for i in range(1, 80, 5)),
            *(other.update_thread(f"t{i}", metadata={"user": "u1", "n": 2}) for i in range(2, 80, 4)),
            *(storage.update_thread(f"t{i}", metadata=thread(i).metadata) for i in range(5, 80, 10)),  # unchanged
            *(other.delete_thread(f"t{i}") for i in range(4, 80, 6)),
            *(storage.delete_idle_thread(f"t{i}") for i in range(0, 80, 9)),  # a queued run keeps most of them
            *(storage.create_thread(thread(i)) for i in range(80, 100)),
            *(other.drop_pending_run(row.run_id, "interrupt", now_iso()) for row in queued[::2]),
        )
        await _counts_match_the_threads(storage)
        await _counts_match_the_threads(other)
        for thread_id, _ in await storage.expired_threads(_at(now, 10**6), ThreadTTL("delete", 1), 1_000):
            await storage.delete_idle_thread(thread_id)  # the retention sweep
        await _counts_match_the_threads(storage)
        assert await storage.count_threads() == len(await storage.search_threads(limit=10_000)) > 0
    finally:
        if other is not storage:
            await other.close()


async def test_thread_counts_stay_exact_through_runs_claimed_ended_released_and_taken_over(storage):
    """A thread is busy while a run of it is pending or running, and its count says so at every moment of a run's
    life: made busy with its run, claimed, ended in each way, released, dropped, and taken over from a dead worker
    (whose runs it then runs); with and without metadata (the blank threads' '{}' among them)."""
    now = now_iso()
    for i in range(12):
        await storage.create_thread(ThreadRow(f"t{i}", now, now, {"user": f"u{i % 2}"} if i % 3 else {}))
    queued = [_run(f"t{i}", worker="dead" if i % 2 else "w1") for i in range(8)]
    for row in queued:
        await storage.create_run(row)
        await storage.update_thread(row.thread_id, status="busy", metadata={"user": "u1", "graph_id": "g"})
    made = [ThreadRow(f"new{i}", now, now, {"graph_id": "g"}, "busy") for i in range(3)]
    claims_on_insert = storage.claims_on_insert
    for thread in made:  # a run on a thread it makes (claimed there where the storage claims on insert)
        row = _run(thread.thread_id)
        if claims_on_insert:
            await storage.create_claimed_run(row, "token", thread=thread)
        else:
            await storage.create_thread(thread)
            await storage.create_run(row)
    await _counts_match_the_threads(storage)
    assert await storage.count_threads(status="busy") == 8 + 3
    running = await storage.claim_runs("w1", 10, now_iso())
    await storage.claim_runs("dead", 10, now_iso())
    await _counts_match_the_threads(storage)
    for row, (run_status, thread_status) in zip(running, [("success", "idle"), ("error", "error"),
                                                           ("interrupted", "interrupted")], strict=False):
        await storage.finish_run(RunEnd(row.run_id, row.thread_id, run_status, thread_status, now_iso(),
                                        claim=row.claim))
        await _counts_match_the_threads(storage)
    await storage.release_run(_claim(running[-1]), now_iso())  # a run handed back: its thread stays busy
    await storage.drop_pending_run(running[-1].run_id, "interrupt", now_iso())
    await _counts_match_the_threads(storage)
    # the process running "dead"'s runs was killed: another takes them over, runs and ends them
    taken = await storage.requeue_orphans(["w1"], "w2", {"a": "digest-of-a"})
    assert taken
    await _counts_match_the_threads(storage)
    for row in await storage.claim_runs("w2", 10, now_iso()):
        await storage.finish_run(RunEnd(row.run_id, row.thread_id, "success", "idle", now_iso(), claim=row.claim))
    await _counts_match_the_threads(storage)
    assert await storage.count_threads(status="busy") == len(await storage.search_threads(status="busy"))
    for thread_id in ("t0", "t1", "new0"):
        await storage.delete_thread(thread_id)
    await _counts_match_the_threads(storage)


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
    await storage.finish_run(RunEnd(first.run_id, "t1", "success", "idle", now_iso()))
    assert [r.run_id for r in await storage.claim_runs("w1", 10, now_iso())] == [second.run_id]
    assert [r.run_id for r in await storage.active_runs("t1")] == [second.run_id]
    # the limit is respected
    await storage.finish_run(RunEnd(other.run_id, "t2", "success", "idle", now_iso()))
    assert await storage.claim_runs("w1", 0, now_iso()) == []


async def test_a_runs_metadata_and_kwargs_read_back_as_given_integers_past_64_bits_included(storage):
    """What a run was created with comes back the same from a read and from its claim, whatever reads the JSON
    (SQLite and Postgres read it with orjson, which refuses integers past 64 bits: those must still come back)."""
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now))
    metadata = {"owner": "zoë", "big": 2**70 + 1, "nested": {"ids": [1, -(2**65)]}}
    kwargs = {"input": {"messages": [{"type": "human", "content": "héllo ✓"}], "n": 2**64 + 1},
              "config": {"configurable": {"x": 1.5, "none": None}}, "stream_mode": ["values"]}
    row = replace(_run("t1"), metadata=metadata, kwargs=kwargs)
    await storage.create_run(row)
    read = await storage.get_run(row.run_id)
    (claimed,) = await storage.claim_runs("w1", 1, now_iso())
    assert (read.metadata, read.kwargs) == (metadata, kwargs)
    assert (claimed.metadata, claimed.kwargs) == (metadata, kwargs)


async def test_claims_keep_each_concurrency_key_to_its_limit_counting_the_runs_already_running(storage):
    """Runs sharing a concurrency key run at most its limit at once, counting those of the key running already
    (claimed by any worker, in an earlier claim); runs of another key, or of none, are claimed beside them."""
    now = now_iso()
    threads = [f"t{i}" for i in range(8)]
    for t in threads:
        await storage.create_thread(ThreadRow(t, now, now))
    running = _run("t0", worker="w2", key="k", limit=2)
    await storage.create_run(running)
    assert [r.run_id for r in await storage.claim_runs("w2", 10, now_iso())] == [running.run_id]
    keyed = [_run(t, key="k", limit=2) for t in threads[1:4]]
    other = _run("t4", key="other", limit=1)
    free = _run("t5")
    for row in (*keyed, other, free):
        await storage.create_run(row)
    claimed = await storage.claim_runs("w1", 10, now_iso())
    assert [r.run_id for r in claimed] == [keyed[0].run_id, other.run_id, free.run_id]  # k: one more of 2
    assert await storage.claim_runs("w1", 10, now_iso()) == []
    await storage.finish_run(RunEnd(running.run_id, "t0", "success", "idle", now_iso()))
    assert [r.run_id for r in await storage.claim_runs("w1", 10, now_iso())] == [keyed[1].run_id]


async def test_finish_run_records_the_run_its_thread_and_where_the_thread_continues(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now, status="busy"))
    run = _run("t1", status="running")
    await storage.create_run(run)
    await storage.put_checkpoint(_checkpoint("t1", 1, None, run_id=run.run_id))
    interrupts = [{"id": "i1", "value": "ok?"}]
    has_mail = await storage.finish_run(RunEnd(run.run_id, "t1", "interrupted", "interrupted", now,
                                               interrupts=interrupts, checkpoint_next=("c1", "tools")))
    assert not has_mail
    assert (await storage.get_run(run.run_id)).status == "interrupted"
    thread = await storage.get_thread("t1")
    assert (thread.status, thread.interrupts, thread.error) == ("interrupted", interrupts, None)
    assert (await storage.head_checkpoint("t1")).next == "tools"
    # a failure keeps the interrupts it does not name, and reports whether mail is waiting
    await storage.put_inbox("t1", "k1", HumanMessage("news"), now)
    failed = _run("t1", status="running")
    await storage.create_run(failed)
    error = {"type": "ValueError", "message": "bad"}
    assert await storage.finish_run(RunEnd(failed.run_id, "t1", "error", "error", now, error=error,
                                           thread_error={"error": "ValueError", "message": "bad"}))
    assert (await storage.get_run(failed.run_id)).error == error
    thread = await storage.get_thread("t1")
    assert (thread.status, thread.interrupts, thread.error) == ("error", interrupts,
                                                                {"error": "ValueError", "message": "bad"})
    assert (await storage.head_checkpoint("t1")).next == "tools"


async def test_runs_since_a_position_are_those_under_way_and_those_made_after_it(storage):
    """Where other processes make runs (a position given), the runs made after it come back though they ended,
    older ones only while under way; where none can (no position), the runs under way. Oldest first, with a
    position after which the next read starts."""
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now, status="busy"))
    queued_before, ended_before = _run("t1"), _run("t1", status="running")
    for run in (queued_before, ended_before):
        await storage.create_run(run)
    await storage.finish_run(RunEnd(ended_before.run_id, "t1", "success", "busy", now, interrupts=[]))
    position = await storage.run_position()
    ended_after, queued_after = _run("t1", status="running"), _run("t1")
    for run in (ended_after, queued_after):
        await storage.create_run(run)
    await storage.finish_run(RunEnd(ended_after.run_id, "t1", "success", "busy", now, interrupts=[]))
    rows, later = await storage.runs_since("t1", position)
    made_since = [ended_after.run_id] if position is not None else []
    assert [r.run_id for r in rows] == [queued_before.run_id, *made_since, queued_after.run_id]
    rows, _ = await storage.runs_since("t1", later)
    assert [r.run_id for r in rows] == [queued_before.run_id, queued_after.run_id]


async def test_finish_run_leaves_the_thread_busy_while_another_run_waits(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now, status="busy"))
    first, queued = _run("t1", status="running"), _run("t1")
    await storage.create_run(first)
    await storage.create_run(queued)
    await storage.finish_run(RunEnd(first.run_id, "t1", "success", "idle", now, interrupts=[]))
    assert (await storage.get_thread("t1")).status == "busy"
    assert [r.run_id for r in await storage.active_runs("t1")] == [queued.run_id]
    assert [r.run_id for r in await storage.claim_runs("w1", 10, now_iso())] == [queued.run_id]
    await storage.finish_run(RunEnd(queued.run_id, "t1", "success", "idle", now, interrupts=[]))
    assert (await storage.get_thread("t1")).status == "idle"


async def test_a_runs_end_keeps_its_usage_in_its_row_and_its_spans_apart(storage):
    now = now_iso()
    for t in ("t1", "t2"):
        await storage.create_thread(ThreadRow(t, now, now, status="busy"))
    done, other = _run("t1", status="running"), _run("t2", status="running")
    failed, quiet = _run("t1"), _run("t1")
    for run in (done, failed, quiet, other):
        await storage.create_run(run)
    assert (await storage.get_run(done.run_id)).usage is None  # until it ends
    usage = {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15, "model_calls": 2,
             "subagents": {"researcher": {"input_tokens": 2, "output_tokens": 1, "total_tokens": 3, "model_calls": 1}}}
    spans = [{"id": 0, "parent": None, "kind": "run", "name": "agent", "start": 1.5, "end": 2.25,
              "status": "success", "usage": usage},
             {"id": 1, "parent": 0, "kind": "tool", "name": "add", "start": 1.75, "end": 2.0, "status": "error",
              "tool_call_id": "c1", "error": "Error: tool 'add' failed: ValueError: x ✓"}]
    await storage.finish_run(RunEnd(done.run_id, "t1", "success", "idle", now, usage=usage, spans=spans))
    await storage.finish_run(RunEnd(failed.run_id, "t1", "error", "error", now, error={"type": "E", "message": "m"},
                                    usage={**usage, "model_calls": 1}, spans=spans[:1]))
    await storage.finish_run(RunEnd(quiet.run_id, "t1", "interrupted", "idle", now))  # cancelled before it ran
    await storage.finish_run(RunEnd(other.run_id, "t2", "success", "idle", now, usage=usage, spans=spans))
    assert (await storage.get_run(done.run_id)).usage == usage
    assert [r.usage for r in await storage.list_runs("t1")] == [None, {**usage, "model_calls": 1}, usage]
    assert await storage.run_spans("t1") == {done.run_id: spans, failed.run_id: spans[:1]}
    assert await storage.delete_run(failed.run_id)
    assert await storage.run_spans("t1") == {done.run_id: spans}
    assert await storage.delete_thread("t1")
    assert await storage.run_spans("t1") == {}
    assert await storage.run_spans("t2") == {other.run_id: spans}


async def test_a_claim_fences_every_write_of_its_run(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    await storage.create_run(_run("t", worker="stalled"))
    [lost] = await storage.claim_runs("stalled", 1, now_iso())
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id=lost.run_id), _claim(lost))
    await storage.put_inbox("t", "k1", HumanMessage("note", id="m1"), now)
    # the stalled worker is taken for dead: another takes the run over and claims it anew
    assert await storage.requeue_orphans([], "other", {"a": "digest-of-a"}) == [lost.run_id]
    assert (await storage.get_thread("t")).status == "busy"  # the thread of a requeued run is busy
    with pytest.raises(LostRunError):  # requeued, not claimed yet: no claim holds
        await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id=lost.run_id), _claim(lost))
    [held] = await storage.claim_runs("other", 1, now_iso())
    assert held.claim != lost.claim
    stale = [
        storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id=lost.run_id), _claim(lost)),
        storage.finish_run(RunEnd(lost.run_id, "t", "error", "error", now_iso(), error={"message": "x"},
                                  checkpoint_next=("c1", "stale"), claim=lost.claim)),
        storage.put_pending_write("t", "call_1", {"update": {}, "direct": False}, _claim(lost)),
        storage.clear_pending_writes("t", _claim(lost)),
        storage.ack_inbox("t", ["k1"], _claim(lost)),
    ]
    for write in stale:
        with pytest.raises(LostRunError):
            await write
    assert not await storage.release_run(_claim(lost), now_iso())
    # nothing changed: the run runs under the new claim, which writes as usual
    assert (await storage.get_run(lost.run_id)).status == "running"
    assert (await storage.get_thread("t")).status == "busy"
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t")] == ["c1"]
    assert (await storage.get_checkpoint("t", "c1")).next == ""
    assert await storage.pending_writes("t") == {}
    assert [k for k, _ in await storage.inbox("t")] == ["k1"]
    await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id=lost.run_id), _claim(held))
    await storage.put_pending_write("t", "call_1", {"update": {}, "direct": False}, _claim(held))
    await storage.clear_pending_writes("t", _claim(held))
    await storage.ack_inbox("t", ["k1"], _claim(held))
    # a held claim's write with nothing to change is no lost run
    await storage.clear_pending_writes("t", _claim(held))
    await storage.ack_inbox("t", ["k1", "unknown"], _claim(held))
    await storage.finish_run(RunEnd(lost.run_id, "t", "success", "idle", now_iso(), claim=held.claim))
    assert (await storage.get_run(lost.run_id)).status == "success"
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t")] == ["c2", "c1"]
    assert await storage.inbox("t") == []
    with pytest.raises(LostRunError):  # ended: its claim holds no more
        await storage.put_checkpoint(_checkpoint("t", 3, "c2", run_id=lost.run_id), _claim(held))


async def test_a_runs_end_writes_its_last_step_with_it_or_nothing(storage):
    """A run's last step goes in with its end, in one transaction: both or neither, under the run's claim, and only
    while the step's parent is there."""
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now, status="busy"))
    await storage.create_run(_run("t"))
    [run] = await storage.claim_runs("w1", 1, now_iso())
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id=run.run_id), _claim(run))
    last = CheckpointWrite(_checkpoint("t", 2, "c1", run_id=run.run_id), parent_seq=1,
                           base=CheckpointBase("t", "c2", 2, None, '{"type":"human","content":"hi"}', "{}"))
    end = RunEnd(run.run_id, "t", "success", "idle", now_iso(), claim=run.claim, checkpoint=last)

    def unchanged():
        return asyncio.gather(storage.get_run(run.run_id), storage.get_thread("t"), storage.list_checkpoints("t"))

    before = await unchanged()
    with pytest.raises(LostRunError):  # another claim's end: not this one's step either
        await storage.finish_run(replace(end, claim="another claim"))
    # its parent's run deleted meanwhile (a delete of a run whose checkpoint the step follows)
    orphan = CheckpointWrite(_checkpoint("t", 2, "gone", run_id=run.run_id), parent_seq=1)
    with pytest.raises(ParentGoneError):
        await storage.finish_run(replace(end, checkpoint=orphan))
    assert await unchanged() == before
    assert (before[0].status, before[1].status) == ("running", "busy")

    assert not await storage.finish_run(end)
    assert (await storage.get_run(run.run_id)).status == "success"
    assert (await storage.get_thread("t")).status == "idle"
    assert (await storage.head_checkpoint("t")).checkpoint_id == "c2"
    bases = await storage.checkpoint_bases("t", 2)
    assert bases == [] or [b.checkpoint_id for b in bases] == ["c2"]  # a backend may keep none (memory)


async def test_a_run_claimed_as_it_is_stored_writes_its_input_with_its_claim_or_nothing(storage, store_url):
    """A run on a thread with a past, claimed in the write that stores it (where the backend claims so), writes the
    checkpoint of its input in that write: both or neither, only on the thread as its start expects it (its newest
    checkpoint the input's parent, no mail waiting), never when the run is not claimed there. SQLite looks at a
    thread that exists in that write; Postgres does not (it would make the start before its one statement)."""
    now = now_iso()
    for thread_id in ("t", "moved", "mailed", "taken"):
        await storage.create_thread(ThreadRow(thread_id, now, now, status="busy"))
        await storage.put_checkpoint(_checkpoint(thread_id, 1, None, run_id="earlier"))
    await storage.put_checkpoint(_checkpoint("moved", 2, "c1", run_id="elsewhere"))  # written meanwhile
    await storage.put_inbox("mailed", "k1", HumanMessage("note", id="m1"), now)
    await storage.create_run(_run("taken"))
    [other] = await storage.claim_runs("w1", 1, now_iso())

    def start(row, seq=2, base=None):
        return Start("c1", CheckpointWrite(_checkpoint(row.thread_id, seq, "c1", run_id=row.run_id), parent_seq=1,
                                            base=base))

    def input_of(row, seq=2):
        return storage.get_checkpoint(row.thread_id, f"c{seq}")

    row = _run("t")
    base = CheckpointBase("t", "c2", 2, None, '{"type":"human","content":"hi"}', "{}")
    stored = await storage.create_claimed_run(row, "claim", start=start(row, base=base))
    written = await input_of(row)
    assert stored.known == (written is not None)  # both or neither
    assert stored.status == ("running" if storage.claims_on_insert else "pending")
    assert stored.known == store_url.startswith("sqlite")
    if stored.known:
        assert (written.run_id, written.parent_id) == (row.run_id, "c1")
        assert (await storage.head_checkpoint("t")).checkpoint_id == "c2"
        run = await storage.get_run(row.run_id)
        assert (run.status, run.claim, run.attempts) == ("running", "claim", 1)
        assert [b.checkpoint_id for b in await storage.checkpoint_bases("t", 2)] == ["c2"]
    # the thread moved past the start's parent, or mail waits for it: the run reads it; nothing of its start written
    for thread_id, seq in (("moved", 3), ("mailed", 2)):
        row = _run(thread_id)
        stored = await storage.create_claimed_run(row, "claim", start=start(row, seq))
        assert not stored.known
        assert await input_of(row, seq) is None
        assert stored.status == ("running" if storage.claims_on_insert else "pending")
    # not claimed (another run of the thread runs): pending, its input not written
    row = _run("taken")
    assert await storage.create_claimed_run(row, "claim", start=start(row)) == ("pending", False)
    assert await input_of(row) is None
    assert (await storage.get_run(other.run_id)).status == "running"
    # its thread gone: nothing stored
    row = _run("gone")
    assert await storage.create_claimed_run(row, "claim", start=start(row)) is None
    assert await storage.list_checkpoints("gone") == []


async def test_a_write_that_fails_undoes_only_its_own_statements_among_the_writes_made_beside_it(storage):
    """Writes made at once (SQLite: one transaction) with one that fails, first or last: the failed one leaves
    nothing (its run still running, its thread busy), the others are all kept."""
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now, status="busy"))
    await storage.create_run(_run("t"))
    [run] = await storage.claim_runs("w1", 1, now_iso())
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id=run.run_id), _claim(run))
    orphan = CheckpointWrite(_checkpoint("t", 2, "gone", run_id=run.run_id), parent_seq=1)
    end = RunEnd(run.run_id, "t", "success", "idle", now_iso(), claim=run.claim, checkpoint=orphan)

    async def failing_end():
        with pytest.raises(ParentGoneError):
            await storage.finish_run(end)

    await asyncio.gather(failing_end(), storage.put_item(("a",), "first", {"v": 1}, now),
                         storage.create_thread(ThreadRow("u", now, now)))
    await asyncio.gather(storage.put_item(("a",), "second", {"v": 2}, now), failing_end())
    assert (await storage.get_run(run.run_id)).status == "running"
    assert (await storage.get_thread("t")).status == "busy"
    assert [c.checkpoint_id for c in await storage.list_checkpoints("t")] == ["c1"]
    assert sorted(i.key for i in await storage.search_items(("a",))) == ["first", "second"]
    assert await storage.get_thread("u") is not None


async def test_claims_count_attempts_and_a_release_gives_its_attempt_back(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    await storage.create_run(_run("t"))
    [first] = await storage.claim_runs("w1", 1, now_iso())
    assert first.attempts == 1 and (await storage.get_run(first.run_id)).attempts == 1
    assert await storage.release_run(_claim(first), now_iso())  # stopped without ending: handed back
    again = await storage.get_run(first.run_id)
    assert (again.status, again.worker_id, again.attempts) == ("pending", "w1", 0)
    assert not await storage.release_run(_claim(first), now_iso())
    [second] = await storage.claim_runs("w1", 1, now_iso())
    assert second.attempts == 1 and second.claim != first.claim
    # its process dies mid-run: the attempt stays counted, and the next claim counts one more
    await storage.requeue_orphans([], "w2", {"a": "digest-of-a"})
    [third] = await storage.claim_runs("w2", 1, now_iso())
    assert third.attempts == 2 == (await storage.get_run(first.run_id)).attempts


async def test_a_claimed_row_stays_as_it_was_claimed_whatever_happens_to_the_run(storage):
    # Its executor holds it for the run's whole length and fences every write with its claim.
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    await storage.create_run(_run("t"))
    [first] = await storage.claim_runs("w1", 1, now_iso())
    claimed = (first.status, first.claim, first.attempts, first.worker_id, first.updated_at)
    assert await storage.release_run(_claim(first), now_iso())
    [second] = await storage.claim_runs("w1", 1, now_iso())
    await storage.requeue_orphans([], "w2", {"a": "digest-of-a"})
    [third] = await storage.claim_runs("w2", 1, now_iso())
    await storage.finish_run(RunEnd(third.run_id, "t", "error", "error", now_iso(), error={"message": "x"},
                                    usage={"total_tokens": 3}, claim=third.claim))
    assert (first.status, first.claim, first.attempts, first.worker_id, first.updated_at) == claimed
    assert (second.status, second.worker_id, third.status, third.worker_id) == ("running", "w1", "running", "w2")
    assert first.error is second.error is third.error is None and third.usage is None
    assert len({first.claim, second.claim, third.claim}) == 3
    assert (await storage.get_run(first.run_id)).status == "error"


async def test_requeue_orphans_takes_only_the_runs_of_agents_it_serves(storage):
    now = now_iso()
    rows = {}
    for name, assistant, digest in (("mine", "a", "d-a"), ("same name, other agent", "a", "d-other"),
                                    ("other assistant", "b", "d-b"), ("stored before digests", "a", None),
                                    ("other, before digests", "b", None)):
        await storage.create_thread(ThreadRow(name, now, now))
        rows[name] = RunRow(str(uuid.uuid4()), name, assistant, now, now, "running", {}, {}, "enqueue", "dead",
                            now, agent_digest=digest)
        await storage.create_run(rows[name])
    moved = await storage.requeue_orphans([], "me", {"a": "d-a"})
    assert moved == [rows["mine"].run_id, rows["stored before digests"].run_id]  # in queue order
    for name, row in rows.items():
        again = await storage.get_run(row.run_id)
        expected = ("pending", "me") if name in ("mine", "stored before digests") else ("running", "dead")
        assert (again.status, again.worker_id) == expected, name


async def test_requeue_orphans_hands_dead_workers_runs_over(storage):
    now = now_iso()
    for thread_id in ("t1", "t2", "t3"):
        await storage.create_thread(ThreadRow(thread_id, now, now))
    dead_running = _run("t1", status="running", worker="dead")
    dead_pending = _run("t1", worker="dead")
    alive = _run("t2", status="running", worker="alive")
    finished = _run("t2", status="success", worker="dead")
    for row in (dead_running, dead_pending, alive, finished):
        await storage.create_run(row)
    registered = _run("t3", status="running", worker="registered")  # registered since the caller looked
    await storage.create_run(registered)
    await storage.heartbeat("registered", {"pid": 1}, now_iso())
    moved = await storage.requeue_orphans(["alive"], "me", {"a": "digest-of-a"})
    assert moved == [dead_running.run_id, dead_pending.run_id]
    for row in (dead_running, dead_pending):
        again = await storage.get_run(row.run_id)
        assert (again.status, again.worker_id) == ("pending", "me")
    assert (await storage.get_run(alive.run_id)).worker_id == "alive"
    assert (await storage.get_run(registered.run_id)).worker_id == "registered"
    assert (await storage.get_run(finished.run_id)).status == "success"


async def test_requeue_orphans_with_a_limit_takes_the_oldest_and_leaves_the_rest_to_the_next_call(storage):
    now = now_iso()
    queued = []
    for i in range(5):
        await storage.create_thread(ThreadRow(f"q{i}", now, now))
        row = _run(f"q{i}", worker="dead")
        await storage.create_run(row)
        queued.append(row.run_id)
    assert await storage.requeue_orphans(["me"], "me", {"a": "digest-of-a"}, limit=2) == queued[:2]
    assert [(await storage.get_thread(f"q{i}")).status for i in range(5)] == ["busy"] * 2 + ["idle"] * 3
    assert (await storage.get_run(queued[2])).worker_id == "dead"  # not yet taken over
    assert [row.run_id for row in await storage.claim_runs("me", 10, now_iso())] == queued[:2]  # start at once
    assert await storage.requeue_orphans(["me"], "me", {"a": "digest-of-a"}) == queued[2:]
    assert {(await storage.get_run(run_id)).worker_id for run_id in queued} == {"me"}


async def test_a_checkpoint_reads_back_with_the_time_and_the_change_it_was_written_with(storage):
    # The memory store keeps a step's one message bare (no dict and list around it): every change reads back as
    # given, a message given as a dict included; and times in any text form.
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    message = HumanMessage("hi", id="m1")
    written = [
        ("c1", now_iso(), {"messages": [message]}),
        ("c2", "2020-02-29T23:59:59.000001+00:00", {"messages": [message_to_dict(message)]}),  # a message as a dict
        ("c3", "0999-01-01T00:00:00.000000+00:00", {"messages": [message], "k": 1}),  # a year before 1000
        ("c4", "2024-05-01T10:00:00Z", {"messages": []}),
        ("c5", "2024-05-01T10:00:00.5+00:00", {"messages": [message, message]}),
        ("c6", "2024-05-01 10:00:00.000000+00:00", {"k": [1]}),
        ("c7", "1969-12-31T23:59:59.999999+00:00", {"messages": [message]}),
    ]
    parent = None
    for seq, (checkpoint_id, at, delta) in enumerate(written, 1):
        await storage.put_checkpoint(replace(_checkpoint("t", seq, parent, delta=delta), checkpoint_id=checkpoint_id,
                                             created_at=at))
        parent = checkpoint_id
    expected = [(c, at, json.loads(delta_text(delta))) for c, at, delta in written]
    chain = await storage.checkpoint_chain("t", "c7")
    for rows in (chain, [await storage.get_checkpoint("t", c) for c, _, _ in written],
                 list(reversed(await storage.list_checkpoints("t")))):
        assert [(r.checkpoint_id, r.created_at, json.loads(delta_text(r.delta))) for r in rows] == expected
    assert (await storage.head_checkpoint("t")).created_at == written[-1][1]


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
    await storage.put_pending_write("t", "call_1", {"update": {}, "direct": False})
    await storage.put_pending_write("t", "call_2", {"update": {}, "direct": False})
    await storage.put_pending_write("t", "call_2", {"update": {"x": 1}, "direct": False})  # replaced
    await storage.put_pending_write("other", "call_9", {})
    assert await storage.pending_writes("t") == {"call_1": {"update": {}, "direct": False},
                                                 "call_2": {"update": {"x": 1}, "direct": False}}
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


async def test_a_chain_starts_at_the_nearest_whole_checkpoint(storage):
    await storage.put_checkpoint(_checkpoint("t", 1, None))
    await storage.put_checkpoint(_checkpoint("t", 2, "c1"))
    whole = _checkpoint("t", 3, "c2", delta={"messages": [], "k": 3})
    whole.whole = True
    await storage.put_checkpoint(whole)
    await storage.put_checkpoint(_checkpoint("t", 4, "c3"))
    await storage.put_checkpoint(_checkpoint("t", 5, "c2"))  # a fork from before the whole checkpoint
    chain = await storage.checkpoint_chain("t", "c4")
    assert [(c.checkpoint_id, c.whole) for c in chain] == [("c3", True), ("c4", False)]
    assert dict(chain[0].delta) == {"messages": [], "k": 3}
    assert [c.checkpoint_id for c in await storage.checkpoint_chain("t", "c4", seq=4)] == ["c3", "c4"]
    assert [c.checkpoint_id for c in await storage.checkpoint_chain("t", "c5")] == ["c1", "c2", "c5"]


async def test_a_checkpoint_written_after_its_parent_only_while_the_parent_is_there(storage):
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id="r1"))
    assert await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id="r2"), parent_seq=1)
    assert await storage.delete_checkpoints_of_run("t", "r2")
    assert await storage.delete_checkpoints_of_run("t", "r1")
    assert not await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id="r3"), parent_seq=1)  # c1 is gone
    assert await storage.list_checkpoints("t") == []


async def test_deleting_a_run_s_checkpoints_stores_their_children_whole(storage):
    await storage.put_checkpoint(_checkpoint("t", 1, None, run_id="r1"))
    await storage.put_checkpoint(_checkpoint("t", 2, "c1", run_id="r2"))
    await storage.put_checkpoint(_checkpoint("t", 3, "c2", run_id="r2"))
    await storage.put_checkpoint(_checkpoint("t", 4, "c3", run_id="r3"))
    await storage.put_checkpoint(_checkpoint("t", 5, "c4", run_id=None))
    assert [c.checkpoint_id for c in await storage.children_of_run("t", "r2")] == ["c4"]
    assert [c.checkpoint_id for c in await storage.children_of_run("t", "r3")] == ["c5"]
    # a child not given whole (written since the caller looked): nothing changes
    assert not await storage.delete_checkpoints_of_run("t", "r2")
    assert len(await storage.list_checkpoints("t")) == 5
    child = _checkpoint("t", 4, "c3", run_id="r3", delta={"messages": [], "k": "whole"})
    child.whole = True
    assert await storage.delete_checkpoints_of_run("t", "r2", [child])
    assert [(c.checkpoint_id, c.whole) for c in await storage.list_checkpoints("t")] == [
        ("c5", False), ("c4", True), ("c1", False)]
    assert [(c.checkpoint_id, dict(c.delta)) for c in await storage.checkpoint_chain("t", "c5")] == [
        ("c4", {"messages": [], "k": "whole"}), ("c5", {"k": 1})]


async def test_inbox_takes_each_key_once(storage):
    now = now_iso()
    for thread_id in ("t", "other"):
        await storage.create_thread(ThreadRow(thread_id, now, now))
    assert await storage.put_inbox("t", "k1", HumanMessage("a", id="m1"), now_iso())
    assert not await storage.put_inbox("t", "k1", HumanMessage("again"), now_iso())
    assert await storage.put_inbox("t", "k2", HumanMessage("b", id="m2"), now_iso())
    assert [k for k, _ in await storage.inbox("t")] == ["k1", "k2"]
    await storage.ack_inbox("t", ["k1"])
    assert [k for k, _ in await storage.inbox("t")] == ["k2"]
    assert [(k, m.text, m.id) for k, m in await storage.inbox("t")] == [("k2", "b", "m2")]
    assert not await storage.put_inbox("t", "k1", HumanMessage("x"), now_iso())  # delivered keys stay taken
    await storage.put_inbox("t", "k3", HumanMessage("c"), now_iso())
    await storage.put_inbox("other", "k2", HumanMessage("not acked"), now_iso())
    await storage.ack_inbox("t", ["k2", "k3"])
    assert await storage.inbox("t") == []
    assert [k for k, _ in await storage.inbox("other")] == ["k2"]
    with pytest.raises(NotFoundError):  # mail for no thread is not kept
        await storage.put_inbox("missing", "k1", HumanMessage("lost"), now_iso())
    assert await storage.inbox("missing") == [] and "missing" not in await storage.threads_with_mail()


async def test_deleting_a_thread_deletes_what_belongs_to_it(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    await storage.create_run(_run("t"))
    await storage.put_checkpoint(_checkpoint("t", 1, None))
    await storage.put_inbox("t", "k", HumanMessage("hi"), now)
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


async def test_a_pending_run_is_dropped_only_while_pending(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    queued, claimed, doomed = _run("t"), _run("t", status="running"), _run("t")
    for row in (queued, claimed, doomed):
        await storage.create_run(row)
    assert await storage.drop_pending_run(queued.run_id, "interrupt", now_iso())
    assert (await storage.get_run(queued.run_id)).status == "interrupted"
    assert not await storage.drop_pending_run(claimed.run_id, "interrupt", now_iso())  # a worker has it
    assert (await storage.get_run(claimed.run_id)).status == "running"
    assert await storage.drop_pending_run(doomed.run_id, "rollback", now_iso())
    assert await storage.get_run(doomed.run_id) is None
    assert not await storage.drop_pending_run(doomed.run_id, "rollback", now_iso())


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
async def test_dropping_a_pending_run_leaves_its_thread_idle_unless_another_run_waits(storage, action):
    now = now_iso()
    for thread_id in ("alone", "shared"):
        await storage.create_thread(ThreadRow(thread_id, now, now, status="busy"))
    alone, first, second = _run("alone"), _run("shared"), _run("shared")
    for row in (alone, first, second):
        await storage.create_run(row)

    assert await storage.drop_pending_run(alone.run_id, action, now_iso())
    assert await storage.drop_pending_run(first.run_id, action, now_iso())

    assert (await storage.get_thread("alone")).status == "idle"
    assert (await storage.get_thread("shared")).status == "busy"  # the second run still waits


async def test_dropping_a_pending_run_leaves_a_persons_question_pending(storage):
    now = now_iso()
    question = [{"id": "i1", "value": {"action_requests": []}}]
    await storage.create_thread(ThreadRow("asking", now, now, status="busy", interrupts=question))
    queued = _run("asking")
    await storage.create_run(queued)
    assert await storage.drop_pending_run(queued.run_id, "interrupt", now_iso())
    thread = await storage.get_thread("asking")
    assert (thread.status, thread.interrupts) == ("interrupted", question)


async def test_a_run_is_stored_only_on_a_thread_that_exists(storage):
    now = now_iso()
    assert not await storage.create_run(_run("gone"))  # never made, or deleted since the caller read it
    assert await storage.list_runs("gone") == [] and await storage.count_runs_by_status() == {}
    await storage.create_thread(ThreadRow("t", now, now))
    run = _run("t")
    assert await storage.create_run(run)
    assert await storage.delete_thread("t")
    assert await storage.get_run(run.run_id) is None  # gone with its thread
    assert not await storage.create_run(_run("t"))
    assert await storage.count_runs_by_status() == {}


async def test_runs_are_counted_by_status(storage):
    assert await storage.count_runs_by_status() == {}
    for thread_id in ("t", "u"):
        await storage.create_thread(ThreadRow(thread_id, now_iso(), now_iso()))
    queued, doomed, claimed = _run("t"), _run("t"), _run("u", status="running")
    for row in (queued, doomed, claimed):
        await storage.create_run(row)
    await storage.drop_pending_run(doomed.run_id, "interrupt", now_iso())
    assert await storage.count_runs_by_status() == {"pending": 1, "interrupted": 1, "running": 1}


async def test_threads_sort_by_when_their_state_last_changed(storage):
    for thread_id, at in (("a", "2026-01-01T00:00:01"), ("b", "2026-01-01T00:00:02"), ("c", "2026-01-01T00:00:03")):
        await storage.create_thread(ThreadRow(thread_id, at, at))
    await storage.put_checkpoint(_checkpoint("a", 1, None))  # a's state changed last (now, in 2026 or later)
    found = await storage.search_threads(sort_by="state_updated_at", sort_order="desc")
    assert [t.thread_id for t in found] == ["a", "c", "b"]
    found = await storage.search_threads(sort_by="state_updated_at", sort_order="asc", limit=2)
    assert [t.thread_id for t in found] == ["b", "c"]


async def test_a_heartbeat_says_whether_the_worker_was_still_registered(storage):
    assert not await storage.heartbeat("w", {"pid": 1}, now_iso())  # first registration
    assert await storage.heartbeat("w", {"pid": 1}, now_iso())
    await storage.forget_worker("w")  # others took it for dead
    assert not await storage.heartbeat("w", {"pid": 1}, now_iso())
    assert set(await storage.workers()) == {"w"}


async def test_runs_with_status_finds_every_threads_runs_oldest_first(storage):
    now = now_iso()
    for t in ("t1", "t2"):
        await storage.create_thread(ThreadRow(t, now, now))
    first, second, third = _run("t1"), _run("t2"), _run("t2")
    for row in (first, second, third):
        await storage.create_run(row)
    (running,) = await storage.claim_runs("w1", 1, now_iso())
    assert running.run_id == first.run_id
    assert [r.run_id for r in await storage.runs_with_status(("pending",))] == [second.run_id, third.run_id]
    assert [r.run_id for r in await storage.runs_with_status(("running",))] == [first.run_id]
    assert [r.run_id for r in await storage.runs_with_status(("pending", "running"))] == [
        first.run_id, second.run_id, third.run_id]
    assert await storage.runs_with_status(("success",)) == []


def _cron(cron_id, tick, *, thread_id=None, enabled=True, end_time=None, metadata=None):
    now = now_iso()
    return CronRow(cron_id, "a", thread_id, "* * * * * *", None, end_time, {"input": {"x": 1}}, metadata or {}, None,
                   enabled, tick, now, now)


async def test_a_cron_tick_is_claimed_once(storage):
    await storage.create_cron(_cron("c1", "2026-01-01T00:00:01.000000+00:00"))
    claims = [storage.claim_cron_tick("c1", "2026-01-01T00:00:01.000000+00:00", "2026-01-01T00:00:02.000000+00:00")
              for _ in range(3)]
    assert sorted(await asyncio.gather(*claims)) == [False, False, True]
    assert (await storage.get_cron("c1")).next_run_date == "2026-01-01T00:00:02.000000+00:00"
    assert not await storage.claim_cron_tick("gone", "2026-01-01T00:00:01.000000+00:00", "x")


async def test_due_crons_are_enabled_before_their_end_and_soonest_first(storage):
    await storage.create_cron(_cron("later", "2026-01-01T00:00:05.000000+00:00"))
    await storage.create_cron(_cron("sooner", "2026-01-01T00:00:02.000000+00:00"))
    await storage.create_cron(_cron("off", "2026-01-01T00:00:01.000000+00:00", enabled=False))
    await storage.create_cron(_cron("ended", "2026-01-01T00:00:03.000000+00:00",
                                    end_time="2026-01-01T00:00:02.500000+00:00"))
    await storage.create_cron(_cron("future", "2027-01-01T00:00:00.000000+00:00"))
    await storage.create_cron(replace(_cron("elsewhere", "2026-01-01T00:00:01.000000+00:00"), assistant_id="b"))
    due = await storage.due_crons("2026-01-01T00:00:05.000000+00:00", 10, ["a"])
    assert [c.cron_id for c in due] == ["sooner", "later"]
    assert [c.cron_id for c in await storage.due_crons("2026-01-01T00:00:05.000000+00:00", 1, ["a"])] == ["sooner"]
    assert [c.cron_id for c in await storage.due_crons("2026-01-01T00:00:05.000000+00:00", 10, ["b"])] == [
        "elsewhere"]


async def test_a_cron_changed_keeps_its_next_tick_unless_rescheduled(storage):
    await storage.create_cron(_cron("c1", "2026-01-01T00:00:01.000000+00:00", metadata={"k": 1}))
    assert await storage.claim_cron_tick("c1", "2026-01-01T00:00:01.000000+00:00", "2026-01-01T00:00:02.000000+00:00")
    stale = _cron("c1", "2026-01-01T00:00:01.000000+00:00", metadata={"k": 2})  # read before the tick fired
    assert await storage.update_cron(stale, reschedule=False)
    found = await storage.get_cron("c1")
    assert found.metadata == {"k": 2} and found.next_run_date == "2026-01-01T00:00:02.000000+00:00"
    assert await storage.update_cron(_cron("c1", "2026-01-01T00:00:09.000000+00:00"), reschedule=True)
    assert (await storage.get_cron("c1")).next_run_date == "2026-01-01T00:00:09.000000+00:00"
    assert not await storage.update_cron(_cron("gone", "x"), reschedule=True)


async def test_crons_are_searched_counted_and_deleted_with_their_thread(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t1", now, now))
    await storage.create_cron(_cron("c1", "2026-01-01T00:00:01.000000+00:00", thread_id="t1", metadata={"k": 1}))
    await storage.create_cron(_cron("c2", "2026-01-01T00:00:02.000000+00:00", enabled=False, metadata={"k": 2}))
    assert [c.cron_id for c in await storage.search_crons(sort_by="next_run_date", sort_order="asc")] == ["c1", "c2"]
    assert [c.cron_id for c in await storage.search_crons(thread_id="t1")] == ["c1"]
    assert [c.cron_id for c in await storage.search_crons(enabled=False)] == ["c2"]
    assert [c.cron_id for c in await storage.search_crons(metadata={"k": 2})] == ["c2"]
    assert [c.cron_id for c in await storage.search_crons(limit=1, offset=1, sort_by="cron_id", sort_order="asc")] \
        == ["c2"]
    assert await storage.count_crons(assistant_id="a") == 2 and await storage.count_crons(metadata={"k": 1}) == 1
    with pytest.raises(ValueError):
        await storage.search_crons(sort_by="payload; DROP TABLE crons")
    await storage.delete_thread("t1")
    assert await storage.get_cron("c1") is None
    assert await storage.delete_cron("c2") and not await storage.delete_cron("c2")
    assert await storage.count_crons() == 0


def _at(timestamp: str, seconds: float) -> str:
    return (datetime.fromisoformat(timestamp) + timedelta(seconds=seconds)).isoformat()


async def test_idle_threads_are_deleted_busy_ones_are_not(storage):
    now = now_iso()
    for t in ("idle", "busy"):
        await storage.create_thread(ThreadRow(t, now, now))
        await storage.put_checkpoint(_checkpoint(t, 1, None))
    await storage.create_run(_run("busy"))
    assert not await storage.delete_idle_thread("busy")
    assert await storage.get_thread("busy") is not None and await storage.head_checkpoint("busy") is not None
    assert await storage.delete_idle_thread("idle")
    assert await storage.get_thread("idle") is None and await storage.head_checkpoint("idle") is None
    assert not await storage.delete_idle_thread("idle")



async def test_a_thread_with_a_background_task_under_way_or_mail_to_take_neither_expires_nor_is_deleted_idle(storage):
    now = now_iso()
    for t in ("parent", "other"):
        await storage.create_thread(ThreadRow(t, now, now))
        await storage.set_thread_ttl(t, ThreadTTL("delete", 1))
    await storage.create_thread(ThreadRow("task", now, now, {"parent_thread_id": "parent"}))
    await storage.set_thread_ttl("task", ThreadTTL("delete", 100))
    task = _run("task")
    await storage.create_run(task)
    later = _at(now, 61)
    assert await storage.expired_threads(later, None, 10) == [("other", "delete")]
    assert not await storage.delete_idle_thread("parent")
    await storage.drop_pending_run(task.run_id, "interrupt", now_iso())  # the task is over, its report stored
    await storage.put_inbox("parent", "report", HumanMessage("done"), now_iso())
    assert sorted(await storage.expired_threads(later, None, 10)) == [("other", "delete")]
    assert not await storage.delete_idle_thread("parent")
    await storage.ack_inbox("parent", ["report"])  # taken: nothing more to come
    assert sorted(await storage.expired_threads(later, None, 10)) == [("other", "delete"), ("parent", "delete")]
    assert await storage.delete_idle_thread("parent")

async def test_threads_expire_by_their_own_ttl_or_the_default(storage):
    now = now_iso()
    for t in ("own", "default", "busy", "kept", "single"):
        await storage.create_thread(ThreadRow(t, now, now))
    await storage.set_thread_ttl("own", ThreadTTL("delete", 1))
    await storage.set_thread_ttl("busy", ThreadTTL("delete", 1))
    await storage.create_run(_run("busy"))
    for t in ("kept", "single"):
        await storage.set_thread_ttl(t, ThreadTTL("keep_latest", 1))
        await storage.put_checkpoint(_checkpoint(t, 1, None))
    await storage.put_checkpoint(_checkpoint("kept", 2, "c1"))
    assert await storage.thread_ttl("own") == ThreadTTL("delete", 1)
    assert await storage.thread_ttl("default") is None
    assert await storage.expired_threads(_at(now, 59), None, 10) == []
    expired = await storage.expired_threads(_at(now, 61), None, 10)
    assert sorted(expired) == [("kept", "keep_latest"), ("own", "delete")]  # busy, and single with one checkpoint
    with_default = await storage.expired_threads(_at(now, 61), ThreadTTL("delete", 2), 10)
    assert "default" not in dict(with_default)
    assert dict(await storage.expired_threads(_at(now, 121), ThreadTTL("delete", 2), 10))["default"] == "delete"
    assert len(await storage.expired_threads(_at(now, 121), ThreadTTL("delete", 2), 2)) == 2
    assert await storage.delete_idle_thread("own")
    assert await storage.thread_ttl("own") is None


async def test_keeping_only_the_newest_checkpoint(storage):
    now = now_iso()
    await storage.create_thread(ThreadRow("t", now, now))
    for seq in (1, 2, 3):
        await storage.put_checkpoint(_checkpoint("t", seq, f"c{seq - 1}" if seq > 1 else None))
    whole = replace(_checkpoint("t", 3, None, delta={"k": 3}), created_at=now)
    assert not await storage.keep_only_checkpoint(replace(whole, checkpoint_id="c2"))  # not the newest
    run = _run("t")
    await storage.create_run(run)
    assert not await storage.keep_only_checkpoint(whole)  # a run is pending
    await storage.drop_pending_run(run.run_id, "rollback", now_iso())
    assert await storage.keep_only_checkpoint(whole)
    [kept] = await storage.list_checkpoints("t")
    assert (kept.checkpoint_id, kept.parent_id, kept.seq, dict(kept.delta)) == ("c3", None, 3, {"k": 3})
    assert [c.checkpoint_id for c in await storage.checkpoint_chain("t", "c3")] == ["c3"]


async def test_items_expire_and_reads_refresh_them(storage):
    now = now_iso()
    await storage.put_item(("a",), "ttl", {"v": 1}, now, ttl=1)
    await storage.put_item(("a",), "plain", {"v": 2}, now)
    assert (await storage.get_item(("a",), "ttl", now=_at(now, 59))).value == {"v": 1}
    assert await storage.get_item(("a",), "ttl", now=_at(now, 61)) is None
    assert (await storage.get_item(("a",), "ttl")).value == {"v": 1}  # without a time: as stored
    assert (await storage.get_item(("a",), "ttl", now=_at(now, 50), refresh=True)) is not None
    assert sorted(i.key for i in await storage.search_items(("a",), now=_at(now, 100))) == ["plain", "ttl"]
    found = await storage.search_items(("a",), filter={"v": 1}, now=_at(now, 100), refresh=True)
    assert [i.key for i in found] == ["ttl"]  # refreshed at 100 s: expires at 160 s
    assert await storage.delete_expired_items(_at(now, 150)) == 0
    assert await storage.delete_expired_items(_at(now, 161)) == 1
    assert await storage.get_item(("a",), "ttl") is None and await storage.get_item(("a",), "plain") is not None
    await storage.put_item(("a",), "plain", {"v": 3}, now, ttl=1)
    await storage.put_item(("a",), "plain", {"v": 4}, now)  # replaced without a ttl: it no longer expires
    assert await storage.delete_expired_items(_at(now, 1000)) == 0


async def test_assistants_their_versions_and_updates_that_saw_an_older_one(storage):
    from dataclasses import replace

    from backchannel.runtime.rows import AssistantRow

    first = AssistantRow("a1", "g", 1, "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00", {"k": 1},
                         {"c": 1}, {"team": "x"}, "beta")
    assert await storage.create_assistant(first)
    assert not await storage.create_assistant(replace(first, name="again"))
    assert await storage.get_assistant("a1") == first
    second = await storage.update_assistant(replace(first, name="Alpha", updated_at="2026-01-02T00:00:00+00:00"),
                                            first)
    assert second is not None and second.version == 2 and second.name == "Alpha"
    assert await storage.update_assistant(replace(first, name="lost"), first) is None  # it saw version 1
    assert await storage.get_assistant("a1") == second
    assert [(v.version, v.name, v.created_at) for v in await storage.assistant_versions("a1")] == [
        (2, "Alpha", "2026-01-02T00:00:00+00:00"), (1, "beta", "2026-01-01T00:00:00+00:00")]
    back = await storage.set_assistant_version("a1", 1, "2026-01-03T00:00:00+00:00")
    assert (back.version, back.name, back.created_at, back.updated_at) == (
        1, "beta", "2026-01-01T00:00:00+00:00", "2026-01-03T00:00:00+00:00")
    assert await storage.set_assistant_version("a1", 5, "2026-01-03T00:00:00+00:00") is None
    third = await storage.update_assistant(replace(back, metadata={"team": "y"}), back)
    assert third.version == 3  # after the newest, not after the current
    assert [v.version for v in await storage.assistant_versions("a1", metadata={"team": "x"})] == [2, 1]
    assert [v.version for v in await storage.assistant_versions("a1", limit=1, offset=1)] == [2]
    other = AssistantRow("a2", "h", 1, "2026-01-04T00:00:00+00:00", "2026-01-04T00:00:00+00:00", name="gamma")
    hidden = AssistantRow("a3", "unserved", 1, "2026-01-05T00:00:00+00:00", "2026-01-05T00:00:00+00:00", name="x")
    assert await storage.create_assistant(other) and await storage.create_assistant(hidden)
    served = ["g", "h"]
    assert [a.assistant_id for a in await storage.search_assistants(graph_ids=served)] == ["a2", "a1"]
    assert [a.name for a in await storage.search_assistants(graph_ids=served, sort_by="name",
                                                            sort_order="asc")] == ["beta", "gamma"]
    assert [a.assistant_id for a in await storage.search_assistants(graph_ids=served, name="AMM")] == ["a2"]
    assert [a.assistant_id for a in await storage.search_assistants(graph_ids=served,
                                                                    metadata={"team": "y"})] == ["a1"]
    assert [a.assistant_id for a in await storage.search_assistants(graph_ids=served, ids=["a1", "a3"])] == ["a1"]
    assert [a.assistant_id for a in await storage.search_assistants(graph_ids=served, graph_id="h")] == ["a2"]
    assert await storage.count_assistants(graph_ids=served) == 2
    assert await storage.count_assistants(graph_ids=served, name="a", metadata={"team": "y"}) == 1
    with pytest.raises(ValueError):
        await storage.search_assistants(graph_ids=served, sort_by="name; DROP TABLE assistants")
    assert await storage.delete_assistant("a1") and not await storage.delete_assistant("a1")
    assert await storage.get_assistant("a1") is None and await storage.assistant_versions("a1") == []
