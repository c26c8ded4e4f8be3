"""The scheduler: an idle runtime leaves its database alone; runs still start at once, and delayed ones on time."""

from __future__ import annotations

import asyncio
import time

from runtime_helpers import echo_agent, user


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
