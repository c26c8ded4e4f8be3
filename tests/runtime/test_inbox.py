"""A run's inbox: mail pushed to it wakes its waiting run, and an open inbox with no mail holds little."""

import asyncio
import tracemalloc

from backchannel import HumanMessage
from backchannel.runtime.inbox import ThreadInbox
from backchannel.runtime.memory import MemoryStorage


async def test_a_waiting_run_wakes_when_mail_arrives_and_a_cancelled_wait_does_not_stop_another():
    inbox = ThreadInbox(MemoryStorage(), "t1")
    first, second = asyncio.ensure_future(inbox.wait()), asyncio.ensure_future(inbox.wait())
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    assert not second.done()
    inbox.push("k1", HumanMessage("task done"))
    await asyncio.wait_for(second, 1)
    await asyncio.wait_for(inbox.wait(), 1)  # mail is here: at once
    assert [m.text for m in inbox.drain()] == ["task done"]


async def test_open_inboxes_without_mail_hold_little():
    """Every live subagent's run has one: a thousand of them stay small."""
    storage = MemoryStorage()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        inboxes = [ThreadInbox(storage, f"thread-{i}") for i in range(1000)]
        held = (tracemalloc.get_traced_memory()[0] - before) / len(inboxes)
    finally:
        tracemalloc.stop()
    assert held < 600, f"an empty inbox holds {held:.0f} bytes"
