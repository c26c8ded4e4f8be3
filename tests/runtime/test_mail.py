"""Mail for a thread: results coming together wake an idle thread once, not once each."""

import asyncio

from runtime_helpers import contents, echo_agent, eventually, user

from backchannel import HumanMessage
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
