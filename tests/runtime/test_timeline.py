"""A thread's timeline and token usage, from what its runs recorded, on every backend."""

from __future__ import annotations

import pytest
from subagent_helpers import notes, quiet, wait_until
from tracing_agents import SUPERVISOR_RUN_USAGE, counts, supervisor, sync_only_supervisor

from backchannel.errors import NotFoundError


async def ais(rt, thread_id):
    """How many AI messages (one per model call) a thread's state holds."""
    messages = (await rt.threads.get_state(thread_id))["values"]["messages"]
    return sum(m["type"] == "ai" for m in messages)


async def test_a_runs_record_has_its_token_usage_its_subagents_included(make_runtime):
    rt = await make_runtime({"supervisor": sync_only_supervisor()})
    thread = await rt.threads.create()
    pending = await rt.runs.create(thread["thread_id"], "supervisor", input="go")
    assert pending["usage"] is None  # not yet known
    await rt.runs.join(thread["thread_id"], pending["run_id"])
    run = await rt.runs.get(thread["thread_id"], pending["run_id"])
    assert run["usage"] == SUPERVISOR_RUN_USAGE
    assert (await rt.runs.list(thread["thread_id"]))[0]["usage"] == SUPERVISOR_RUN_USAGE
    assert (await rt.timeline(thread["thread_id"]))["usage"] == SUPERVISOR_RUN_USAGE


async def test_a_threads_timeline_is_what_its_runs_and_tasks_did(make_runtime):
    rt = await make_runtime({"supervisor": supervisor()})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    first = await rt.runs.create(tid, "supervisor", input="go")
    await rt.runs.join(tid, first["run_id"])

    async def both_noted():
        messages = (await rt.threads.get_state(tid))["values"]["messages"]
        return len(notes(messages)) == 2 and messages[-1]["type"] == "ai"

    await wait_until(both_noted, timeout=15)
    await quiet(rt, tid)
    timeline = await rt.timeline(tid)
    tasks = {t["subagent"]: t for t in (await rt.threads.get_state(tid))["values"]["async_tasks"].values()}

    lanes = timeline["threads"]
    assert [(lane["name"], lane["parent_thread_id"], lane["tool_call_id"]) for lane in lanes] == [
        ("supervisor", None, None),
        *sorted(((name, tid, f"call_{name}") for name in ("analyst", "writer")),
                key=lambda lane: tasks[lane[0]]["created_at"])]
    assert {lane["thread_id"] for lane in lanes[1:]} == {t["task_id"] for t in tasks.values()}
    supervisor_lane = lanes[0]
    assert supervisor_lane["runs"][0]["run_id"] == first["run_id"]
    assert all(r["status"] == "success" for lane in lanes for r in lane["runs"])

    # The first run: its span, its model calls, its four tool calls, the sync subagent under its call.
    spans = supervisor_lane["runs"][0]["spans"]
    by_id = {s["id"]: s for s in spans}
    (root,) = [s for s in spans if s["parent"] is None]
    assert (root["kind"], root["name"], root["status"]) == ("run", "supervisor", "success")
    under_root = sorted((s["kind"], s["name"]) for s in spans if s["parent"] == root["id"])
    assert under_root == [("model", "scripted"), ("model", "scripted"), ("tool", "flaky"),
                          ("tool", "start_async_task"), ("tool", "start_async_task"), ("tool", "task")]
    (failed,) = [s for s in spans if s["name"] == "flaky"]
    assert failed["status"] == "error" and "flaky failed on 7" in failed["error"]
    assert failed["tool_call_id"] == "call_flaky"
    (researcher,) = [s for s in spans if s["kind"] == "run" and s["name"] == "researcher"]
    assert by_id[researcher["parent"]]["name"] == "task" and researcher["tool_call_id"] == "call_sync"
    assert researcher["usage"] == counts(3, 2, 1)
    for span in spans:
        assert span["start"] <= span["end"]
        if span["parent"] is not None:
            parent = by_id[span["parent"]]
            assert parent["start"] <= span["start"] and span["end"] <= parent["end"]

    # Each task's notification, taken in by a later supervisor run, names the task run that sent it.
    taken = [s for r in supervisor_lane["runs"][1:] for s in r["spans"] if s["kind"] == "notification"]
    task_runs = {lane["thread_id"]: lane["runs"][0]["run_id"] for lane in lanes[1:]}
    assert sorted((s["name"], s["task_status"]) for s in taken) == [("analyst", "success"), ("writer", "success")]
    assert {s["task_id"]: s["task_run_id"] for s in taken} == task_runs

    # The thread's tokens: each model call's, as the scripted models reported them, the tasks' by name.
    supervisor_calls = await ais(rt, tid)
    analyst_calls, writer_calls = [await ais(rt, tasks[name]["task_id"]) for name in ("analyst", "writer")]
    assert timeline["usage"] == {
        **counts(10 * supervisor_calls + 3 * (1 + analyst_calls + writer_calls),
                 5 * supervisor_calls + 2 * (1 + analyst_calls + writer_calls),
                 supervisor_calls + 1 + analyst_calls + writer_calls),
        "subagents": {"researcher": counts(3, 2, 1), "analyst": counts(3 * analyst_calls, 2 * analyst_calls,
                                                                        analyst_calls),
                      "writer": counts(3 * writer_calls, 2 * writer_calls, writer_calls)}}


async def test_no_timeline_for_a_thread_that_is_not_there(make_runtime):
    rt = await make_runtime({"supervisor": supervisor()})
    with pytest.raises(NotFoundError):
        await rt.timeline("no-such-thread")
