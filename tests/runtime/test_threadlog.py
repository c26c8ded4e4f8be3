"""A thread's v2 stream (the log behind ``/threads/{id}/stream/events``): who sees which run from where."""

from __future__ import annotations

import asyncio

import orjson
from runtime_helpers import user

from backchannel.runtime.protocol import ProtocolFilter

LIFECYCLE = ProtocolFilter(frozenset({"lifecycle"}), ((),), 0)


async def root_lifecycle(log, since=None, count=2):
    """The first ``count`` root lifecycle events a subscriber gets: [(run_id, event)]."""
    found = []
    async for entry in log.follow(LIFECYCLE, since):
        event = orjson.loads(entry.json)
        found.append((event["event_id"].partition(":")[0], event["params"]["data"]["event"]))
        if len(found) == count:
            return found
    return found


async def started(rt, thread_id, text="hi"):
    result = await rt.commands.run_start(thread_id, {"assistant_id": "agent", "input": user(text)})
    await rt.queue.wait_for(result["run_id"])
    return result["run_id"]


async def test_a_run_a_command_started_is_replayed_to_the_first_subscriber_even_when_it_has_ended(rt):
    """The SDKs start a run, then subscribe: a fast run has ended by then, and they must still see it."""
    log = rt.thread_logs.get("t1")
    applied = log.seq
    run_id = await started(rt, "t1")
    # a projection subscribing with since does not count as having seen it
    assert await root_lifecycle(log, since=applied) == [(run_id, "running"), (run_id, "completed")]
    assert await asyncio.wait_for(root_lifecycle(log), 5) == [(run_id, "running"), (run_id, "completed")]


async def test_a_run_already_seen_live_is_not_replayed_to_a_later_subscriber(rt):
    """A client reopening a thread's stream before its next run must not take the old run's end for the
    end of the run it is about to start (langgraph_sdk's output would return at once, with stale state)."""
    log = rt.thread_logs.get("t2")
    watcher = asyncio.create_task(root_lifecycle(log))
    await asyncio.sleep(0)  # the watcher is in before the run starts
    first = await started(rt, "t2", "one")
    assert await asyncio.wait_for(watcher, 5) == [(first, "running"), (first, "completed")]
    again = asyncio.create_task(root_lifecycle(log))
    await asyncio.sleep(0.05)
    second = await started(rt, "t2", "two")
    assert await asyncio.wait_for(again, 5) == [(second, "running"), (second, "completed")]


async def test_numbers_are_shared_by_every_subscriber_and_keep_growing_across_logs(rt):
    log = rt.thread_logs.get("t3")
    await started(rt, "t3")
    first = [entry.seq async for entry in _until_end(log.follow(ProtocolFilter(frozenset({"lifecycle", "values"})),
                                                                 0))]
    again = [entry.seq async for entry in _until_end(log.follow(ProtocolFilter(frozenset({"lifecycle"})), 0))]
    assert set(again) < set(first) and first == sorted(first)
    await log.close()
    newer = rt.thread_logs.get("t3")
    assert newer is not log and newer.seq > first[-1]


async def _until_end(entries):
    async for entry in entries:
        yield entry
        event = orjson.loads(entry.json)
        if event["method"] == "lifecycle" and event["params"]["data"]["event"] == "completed":
            return
