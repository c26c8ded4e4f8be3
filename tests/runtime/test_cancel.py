"""Cancelling runs: promptly, mid model call or mid tool, keeping (interrupt) or dropping (rollback) their steps."""

import asyncio
import time

import pytest
from runtime_helpers import contents, echo_agent, eventually, run_status_is, since_last_human, turn_of, user

from backchannel import NotFoundError, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.runtime.sqlite import SQLiteStorage

PROMPT = 0.5  # seconds a cancel may take


def _slow_tool_agent(tool_seconds: float = 5.0):
    """An agent whose first reply calls a slow tool; it records every request the model gets."""
    ran = {"started": 0, "finished": 0}

    @tool
    async def slow(x: int) -> str:
        """Takes a while."""
        ran["started"] += 1
        await asyncio.sleep(tool_seconds)
        ran["finished"] += 1
        return f"slow {x}"

    def reply(request):
        if isinstance(request.messages[-1], ToolMessage):
            return f"after tool: {request.messages[-1].text}"
        if turn_of(request.messages) == 1:
            return {"tool_calls": [{"name": "slow", "args": {"x": 1}, "id": "call_slow"}]}
        return f"echo: {request.messages[-1].text}"

    model = ScriptedModel([reply], loop=True)
    model.record = True
    return create_agent(model, [slow]), model, ran


async def _cancel_timed(rt, tid, run_id, **kwargs):
    started = time.monotonic()
    await rt.runs.cancel(tid, run_id, **kwargs)
    await eventually(lambda: _ended(rt, tid, run_id), timeout=PROMPT)
    return time.monotonic() - started


async def _ended(rt, tid, run_id):
    try:
        return (await rt.runs.get(tid, run_id))["status"] not in ("pending", "running")
    except NotFoundError:
        return True


async def test_cancel_during_a_slow_model_call(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "running"))
    await asyncio.sleep(0.05)
    elapsed = await _cancel_timed(rt, tid, run["run_id"])
    assert elapsed < PROMPT
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    after = await rt.threads.get(tid)
    assert after["status"] != "busy"
    assert after["error"]["error"] == "UserInterrupt"
    assert run["run_id"] in after["error"]["message"]
    # the input step was completed and stays
    assert contents((await rt.threads.get_state(tid))["values"]) == ["hi"]


async def test_cancel_during_a_slow_tool_keeps_finished_steps_and_the_thread_goes_on(make_runtime):
    agent, model, ran = _slow_tool_agent()
    rt = await make_runtime({"agent": agent})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("use the tool"))
    await eventually(lambda: _true(ran["started"] == 1))
    elapsed = await _cancel_timed(rt, tid, run["run_id"])
    assert elapsed < PROMPT
    assert ran["finished"] == 0
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    messages = (await rt.threads.get_state(tid))["values"]["messages"]
    assert [m["type"] for m in messages] == ["human", "ai"]  # the model step is kept; the tool never finished
    assert messages[1]["tool_calls"][0]["id"] == "call_slow"

    # a new run with input works: the dangling call gets an error result before the new message
    result = await rt.runs.wait(tid, "agent", input=user("next"))
    assert (await rt.runs.list(tid))[0]["status"] == "success"
    seen = model.requests[-1].messages
    assert [m.type for m in seen] == ["human", "ai", "tool", "human"]
    dangling = seen[2]
    assert dangling.tool_call_id == "call_slow" and dangling.status == "error"
    assert "cancel" in dangling.text
    assert since_last_human(seen) == []
    assert contents(result)[-1] == "echo: next"
    assert [m["type"] for m in result["messages"]] == ["human", "ai", "tool", "human", "ai"]
    assert ran["started"] == 1  # the cancelled tool call is not retried


async def test_cancel_with_rollback_deletes_the_run_and_its_steps(make_runtime):
    agent, _, ran = _slow_tool_agent()
    rt = await make_runtime({"agent": agent})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.threads.update_state(tid, {"messages": [{"role": "assistant", "content": "earlier"}]})
    run = await rt.runs.create(tid, "agent", input=user("use the tool"))
    await eventually(lambda: _true(ran["started"] == 1))
    started = time.monotonic()
    await rt.runs.cancel(tid, run["run_id"], action="rollback", wait=True)
    assert time.monotonic() - started < PROMPT
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, run["run_id"])
    assert contents((await rt.threads.get_state(tid))["values"]) == ["earlier"]
    history = await rt.threads.get_history(tid)
    assert [h["metadata"]["source"] for h in history] == ["update"]
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_cancel_wait_returns_once_the_run_has_ended(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "running"))
    await rt.runs.cancel(tid, run["run_id"], wait=True)
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "interrupted"
    assert not rt.scheduler.executing


async def test_cancelling_a_finished_run_is_not_found(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await rt.runs.join(tid, run["run_id"])
    with pytest.raises(NotFoundError, match="No matching runs to cancel"):
        await rt.runs.cancel(tid, run["run_id"])
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "success"


async def test_cancelling_twice_is_not_found_the_second_time(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "running"))
    await rt.runs.cancel(tid, run["run_id"], wait=True)
    with pytest.raises(NotFoundError):
        await rt.runs.cancel(tid, run["run_id"])


async def test_cancel_a_queued_run_before_it_starts(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=0.1)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    first = await rt.runs.create(tid, "agent", input=user("first"))
    queued = await rt.runs.create(tid, "agent", input=user("queued"))
    await rt.runs.cancel(tid, queued["run_id"])
    assert (await rt.runs.get(tid, queued["run_id"]))["status"] == "interrupted"
    await rt.runs.join(tid, first["run_id"])
    await rt.runs.join(tid, queued["run_id"])  # returns at once
    assert contents((await rt.threads.get_state(tid))["values"]) == ["first", "echo: first"]
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_cancel_a_delayed_run_with_rollback(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("later"), after_seconds=5)
    await rt.runs.cancel(tid, run["run_id"], action="rollback")
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, run["run_id"])
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_cancel_rejects_an_unknown_action(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    with pytest.raises(ValueError):
        await rt.runs.cancel(tid, run["run_id"], action="explode")
    await rt.runs.cancel(tid, run["run_id"], wait=True)


async def _true(value):
    return value


async def test_a_run_cancelled_as_soon_as_it_reads_running_ends_interrupted(make_runtime):
    # Claimed, its task made but not yet started: a cancel then used to stop the task before the executor
    # could record the end, and the run stayed 'running' for good.
    rt = await make_runtime({"agent": echo_agent(latency=5.0)})
    thread = (await rt.threads.create())["thread_id"]
    run = await rt.runs.create(thread, "agent", input=user("hi"))
    await eventually(lambda: run_status_is(rt, thread, run["run_id"], "running"), interval=0)
    await rt.runs.cancel(thread, run["run_id"])
    await eventually(lambda: run_status_is(rt, thread, run["run_id"], "interrupted"))


async def test_cancel_a_run_seen_running_before_its_task_started(make_runtime):
    # A claim is visible as "running" a moment before the scheduler starts the run's task (SQLite: the
    # claim's own connection reads it before its commit; Postgres: others read it before the scheduler hears
    # the commit). A cancel in that moment found no task and did nothing: the run went on to succeed.
    rt = await make_runtime({"agent": echo_agent(latency=2.0)})
    thread = await rt.threads.create()
    caught = False
    for _ in range(20):  # until the run is caught in that moment
        # Delayed, so it takes a claim of its own (one due now on a free thread is claimed as it is stored, and
        # started before runs.create returns)
        run = await rt.runs.create(thread["thread_id"], "agent", input=user("stop me"), after_seconds=0.001)
        while (await rt.runs.get(thread["thread_id"], run["run_id"]))["status"] == "pending":
            await asyncio.sleep(0)
        caught = not rt.scheduler.is_executing(run["run_id"])
        await rt.runs.cancel(thread["thread_id"], run["run_id"], wait=True)
        assert (await rt.runs.get(thread["thread_id"], run["run_id"]))["status"] == "interrupted"
        if caught:
            break
    # SQLite's claim is read on its own connection before its commit: that moment always comes. (In memory a
    # claimed run starts at once; on Postgres the moment is a race the loop may not win, each cancel still checked.)
    assert caught or not isinstance(rt.storage, SQLiteStorage)
