"""Mail for a thread: results coming together wake an idle thread once, not once each."""

import asyncio

import pytest
from runtime_helpers import contents, echo_agent, eventually, user

from backchannel import HumanMessage
from backchannel.errors import NotFoundError
from backchannel.runtime import LocalRuntime


async def test_mail_arriving_together_wakes_an_idle_thread_once(store_url):
    """A fan-out's results land at once: one wake-up run takes them all (a run each cost a model call each)."""
    async with LocalRuntime(store_url, agents={"agent": echo_agent()}) as rt:
        tid = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(tid, "agent", input=user("hi"))
        sent = await asyncio.gather(*(rt.deliver(tid, HumanMessage(f"result {i}", id=f"r{i}"), key=f"k{i}")
                                      for i in range(50)))
        assert all(sent)

        async def answered():
            thread = await rt.threads.get(tid)
            humans = [c for c in contents((await rt.threads.get_state(tid))["values"]) if c.startswith("result")]
            return thread["status"] == "idle" and len(humans) == 50

        await eventually(answered, timeout=10)
        runs = await rt.runs.list(tid, limit=100)
        assert all(r["status"] == "success" for r in runs)
        # the first run and one wake-up run (a second if some mail came just as the first ended): not one each
        assert len(runs) <= 3


async def test_mail_coming_while_a_wake_up_looks_is_heard(store_url):
    """Mail that comes while another wake-up looks at the thread is heard: that look may predate it (the run it
    found active can end before the mail comes), so it looks again rather than taking the mail as seen."""
    async with LocalRuntime(store_url, agents={"agent": echo_agent()}) as rt:
        tid = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(tid, "agent", input=user("hi"))
        storage = rt.storage
        active_runs = storage.active_runs
        looking, go_on = asyncio.Event(), asyncio.Event()

        async def stale_look(thread_id):
            if go_on.is_set():
                return await active_runs(thread_id)
            looking.set()  # the first look: it finds a run active, which ends before the next mail comes
            await go_on.wait()
            return ["a run that has ended since"]

        storage.active_runs = stale_look
        first = asyncio.create_task(rt.deliver(tid, HumanMessage("result 1", id="r1"), key="k1"))
        await looking.wait()
        assert await rt.deliver(tid, HumanMessage("result 2", id="r2"), key="k2")
        go_on.set()
        assert await first

        async def answered():
            state = await rt.threads.get_state(tid)
            return [c for c in contents(state["values"]) if c.startswith("result")] == ["result 1", "result 2"]

        await eventually(answered, timeout=10)


async def test_mail_for_a_thread_that_is_gone_is_refused_and_not_kept(store_url):
    """Mail for a deleted (or never created) thread raises NotFoundError and is not stored: a stored message
    for no thread is lost, and would be tried again at every start."""
    async with LocalRuntime(store_url, agents={"agent": echo_agent()}) as rt:
        tid = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(tid, "agent", input=user("hi"))
        await rt.threads.delete(tid)
        for thread_id in (tid, "never-created"):
            with pytest.raises(NotFoundError):
                await rt.deliver(thread_id, HumanMessage("late result"), key="k1", assistant_id="agent")
        assert await rt.storage.threads_with_mail() == []
        assert await rt.storage.inbox(tid) == []
