"""Multitask strategies: what a new run does when its thread is busy (reject, interrupt, rollback, enqueue)."""

import pytest
from runtime_helpers import contents, echo_agent, eventually, looping_agent, run_status_is, user

from backchannel import ConflictError, NotFoundError

SLOW = 0.1  # seconds per model call


async def _busy_thread(rt, steps_done: int = 0):
    """A thread whose first run is in flight (and, with ``steps_done``, has finished that many tool steps)."""
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    first = await rt.runs.create(tid, "agent", input=user("first"))
    await eventually(lambda: run_status_is(rt, tid, first["run_id"], "running"))
    if steps_done:
        async def progressed():
            values = (await rt.threads.get_state(tid))["values"]
            return sum(m["type"] == "tool" for m in values.get("messages", ())) >= steps_done
        await eventually(progressed)
    return tid, first


async def test_reject_refuses_and_queues_nothing(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=SLOW)})
    tid, first = await _busy_thread(rt)
    with pytest.raises(ConflictError, match="already running"):
        await rt.runs.create(tid, "agent", input=user("second"), multitask_strategy="reject")
    with pytest.raises(ConflictError):
        await rt.runs.wait(tid, "agent", input=user("second"), multitask_strategy="reject")
    assert [r["run_id"] for r in await rt.runs.list(tid)] == [first["run_id"]]
    await rt.runs.join(tid, first["run_id"])
    assert (await rt.runs.get(tid, first["run_id"]))["status"] == "success"
    assert contents((await rt.threads.get_state(tid))["values"]) == ["first", "echo: first"]


async def test_reject_also_counts_pending_runs(make_runtime):
    rt = await make_runtime({"agent": echo_agent()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    delayed = await rt.runs.create(tid, "agent", input=user("later"), after_seconds=0.3)
    with pytest.raises(ConflictError):
        await rt.runs.create(tid, "agent", input=user("now"), multitask_strategy="reject")
    await rt.runs.join(tid, delayed["run_id"])


async def test_interrupt_stops_the_old_run_and_keeps_its_steps(make_runtime):
    rt = await make_runtime({"agent": looping_agent(3, latency=SLOW)})
    tid, first = await _busy_thread(rt, steps_done=1)
    second = await rt.runs.create(tid, "agent", input=user("second"), multitask_strategy="interrupt")
    assert second["multitask_strategy"] == "interrupt"
    assert (await rt.runs.get(tid, first["run_id"]))["status"] == "interrupted"
    await rt.runs.join(tid, second["run_id"])
    assert (await rt.runs.get(tid, second["run_id"]))["status"] == "success"

    messages = (await rt.threads.get_state(tid))["values"]["messages"]
    humans = [m["content"] for m in messages if m["type"] == "human"]
    assert humans == ["first", "second"]
    # the old run's finished steps are still there, before the new input
    cut = next(i for i, m in enumerate(messages) if m["content"] == "second")
    old = messages[:cut]
    assert [m["content"] for m in old[:3]] == ["first", "", "step 1 ok"]
    # every tool call of the old run has a result (a late one is marked cancelled), so the model can go on
    call_ids = [c["id"] for m in old if m["type"] == "ai" for c in m["tool_calls"]]
    answered = [m["tool_call_id"] for m in messages if m["type"] == "tool"]
    assert set(call_ids) <= set(answered)
    assert messages[-1]["content"].startswith("done after")
    # the old run's checkpoints are kept
    history = await rt.threads.get_history(tid, limit=100)
    assert any(h["metadata"].get("run_id") == first["run_id"] for h in history)
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_rollback_deletes_the_old_run_and_its_checkpoints(make_runtime):
    rt = await make_runtime({"agent": looping_agent(3, latency=SLOW)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    await rt.threads.update_state(tid, {"messages": [{"role": "user", "content": "before"}]})
    history_before = await rt.threads.get_history(tid, limit=100)
    first = await rt.runs.create(tid, "agent", input=user("first"))

    async def progressed():
        values = (await rt.threads.get_state(tid))["values"]
        return sum(m["type"] == "tool" for m in values.get("messages", ())) >= 1
    await eventually(progressed)

    second = await rt.runs.create(tid, "agent", input=user("second"), multitask_strategy="rollback")
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, first["run_id"])
    assert [r["run_id"] for r in await rt.runs.list(tid)] == [second["run_id"]]
    history = await rt.threads.get_history(tid, limit=100)
    assert not any(h["metadata"].get("run_id") == first["run_id"] for h in history)
    await rt.runs.join(tid, second["run_id"])
    messages = (await rt.threads.get_state(tid))["values"]["messages"]
    assert [m["content"] for m in messages if m["type"] == "human"] == ["before", "second"]
    assert "first" not in contents({"messages": messages})
    history = await rt.threads.get_history(tid, limit=100)
    older = history[-len(history_before):]  # older history untouched
    assert [(h["checkpoint_id"], h["values"]) for h in older] == [(h["checkpoint_id"], h["values"])
                                                                 for h in history_before]


async def test_enqueue_runs_both_in_order(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=SLOW)})
    tid, first = await _busy_thread(rt)
    second = await rt.runs.create(tid, "agent", input=user("second"), multitask_strategy="enqueue")
    third = await rt.runs.create(tid, "agent", input=user("third"))  # enqueue is the default
    assert (await rt.runs.get(tid, second["run_id"]))["status"] == "pending"
    assert (await rt.runs.get(tid, first["run_id"]))["status"] == "running"
    await rt.runs.join(tid, third["run_id"])
    assert [r["status"] for r in await rt.runs.list(tid)] == ["success"] * 3
    assert contents((await rt.threads.get_state(tid))["values"]) == [
        "first", "echo: first", "second", "echo: second", "third", "echo: third"]
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_thread_stays_busy_while_runs_are_queued(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=SLOW)})
    tid, first = await _busy_thread(rt)
    second = await rt.runs.create(tid, "agent", input=user("second"))
    await rt.runs.join(tid, first["run_id"])
    assert (await rt.threads.get(tid))["status"] == "busy"  # the second is still to run
    await rt.runs.join(tid, second["run_id"])
    assert (await rt.threads.get(tid))["status"] == "idle"


async def test_interrupt_also_cancels_queued_runs(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=SLOW)})
    tid, first = await _busy_thread(rt)
    queued = await rt.runs.create(tid, "agent", input=user("queued"))
    last = await rt.runs.create(tid, "agent", input=user("last"), multitask_strategy="interrupt")
    await rt.runs.join(tid, last["run_id"])
    assert (await rt.runs.get(tid, first["run_id"]))["status"] == "interrupted"
    assert (await rt.runs.get(tid, queued["run_id"]))["status"] == "interrupted"
    humans = [m["content"] for m in (await rt.threads.get_state(tid))["values"]["messages"]
              if m["type"] == "human"]
    assert humans == ["first", "last"]
