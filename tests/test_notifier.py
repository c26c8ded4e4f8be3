"""Completion notifications: format, truncation, secrecy, once-only delivery, busy/idle/wait parents, crashes."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from subagent_helpers import (
    NOTE_RE,
    SUBPROCESS_SCRIPT,
    call,
    crash_supervisor,
    is_note,
    last_is_note,
    messages_of,
    notes,
    policy,
    quiet,
    relay_supervisor,
    settled,
    start,
    text,
    values_of,
    wait_until,
)

from backchannel import HumanMessage, ScriptedModel, ToolMessage, ToolRuntime, create_agent, interrupt, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.notifier import SUMMARY_LIMIT, CompletionNotifier, format_notification, notification_message
from backchannel.runtime import LocalRuntime
from backchannel.runtime.sqlite import SQLiteStorage
from backchannel.subagents import SubAgent

TESTS_DIR = Path(__file__).parent


def researcher(model, **kwargs):
    return SubAgent("researcher", "Researches things.", background=True, model=model, **kwargs)


def supervisor_with(*subagents, model=None, **kwargs):
    return create_deep_agent(model or relay_supervisor(), subagents=list(subagents), general_purpose=False,
                             **kwargs)


async def task_id_of(rt, thread_id, subagent="researcher"):
    tracked = (await values_of(rt, thread_id))["async_tasks"]
    return next(tid for tid, t in tracked.items() if t["subagent"] == subagent)


async def wait_for_notes(rt, thread_id, count=1, task_id=None, timeout=5.0):
    async def check():
        found = notes(await messages_of(rt, thread_id), task_id)
        return found if len(found) >= count else None

    return await wait_until(check, timeout, what=f"{count} notification(s) on {thread_id}")


# -- the message ---------------------------------------------------------------------------------------


def test_notification_text_per_outcome():
    assert format_notification("t-1", "researcher", "success", "42") == \
        "[task_id=t-1][subagent=researcher] Completed. Result: 42"
    assert format_notification("t-1", "researcher", "error", "it failed") == \
        "[task_id=t-1][subagent=researcher] Error: it failed"
    assert format_notification("t-1", "researcher", "timeout", "too slow") == \
        "[task_id=t-1][subagent=researcher] Error: too slow"
    assert format_notification("t-1", "researcher", "waiting", "which city?") == \
        "[task_id=t-1][subagent=researcher] Waiting for input: which city?"


def test_long_results_are_cut_at_500_characters_with_a_check_hint():
    exact = "x" * SUMMARY_LIMIT
    assert format_notification("t-1", "r", "success", exact).endswith("Result: " + exact)
    long = "".join(str(i % 10) for i in range(SUMMARY_LIMIT + 300))
    cut = format_notification("t-1", "r", "success", long)
    detail = NOTE_RE.match(cut)["detail"]
    assert detail.startswith(long[:SUMMARY_LIMIT]) and long[:SUMMARY_LIMIT + 1] not in detail
    assert 'check_async_task(task_id="t-1")' in detail
    # Error and waiting details are not summaries: never cut or hinted.
    assert "check_async_task" not in format_notification("t-1", "r", "error", long)


def test_notification_message_is_a_user_message_with_a_structured_marker_and_stable_id():
    message = notification_message("t-1", "researcher", "success", "42", "run-9")
    assert isinstance(message, HumanMessage)
    assert message.additional_kwargs == {
        "task_notification": {"task_id": "t-1", "subagent": "researcher", "status": "success", "run_id": "run-9"},
        # deepagents' marker too, so a deepagents supervisor takes it as one of its own
        "deepagents_notification": {"task_id": "t-1", "agent_name": "researcher", "status": "success",
                                    "run_id": "run-9"}}
    again = notification_message("t-1", "researcher", "success", "42", "run-9")
    assert again.id == message.id  # a redelivered copy replaces itself in the messages
    assert notification_message("t-1", "researcher", "success", "42", "run-10").id != message.id


# -- end to end: format, marker, truncation, secrecy --------------------------------------------------------


async def test_idle_parent_is_woken_and_tells_the_user_unprompted():
    model = relay_supervisor()
    model.record = True
    agent = supervisor_with(researcher(ScriptedModel(["The answer is 42."], latency=0.1)), model=model)
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        state = await agent.ainvoke("research please", thread_id="t1")
        assert state["messages"][-1].text == "Started the background work; I'll report back."
        assert notes(state["messages"]) == []  # the first run ended while the task ran
        task_id = await task_id_of(rt, "t1")
        [note] = await wait_for_notes(rt, "t1")
        runs = await settled(rt, "t1", 2)
        child_run = (await rt.runs.list(task_id))[0]

    expected = f"[task_id={task_id}][subagent=researcher] Completed. Result: The answer is 42."
    assert text(note) == expected
    assert note["additional_kwargs"]["task_notification"] == {
        "task_id": task_id, "subagent": "researcher", "status": "success", "run_id": child_run["run_id"],
        "files": False}  # the task's state holds no files
    assert len(runs) == 2  # the wake run
    # The wake run's model call saw the notification and told the user without being asked.
    wake_request = model.requests[-1]
    assert last_is_note(wake_request) and wake_request.messages[-1].text == expected


async def test_notification_lands_in_the_parent_thread_once_with_the_relay_after_it():
    agent = supervisor_with(researcher(ScriptedModel(["The answer is 42."], latency=0.05)))
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        await agent.ainvoke("research please", thread_id="t1")
        task_id = await task_id_of(rt, "t1")
        await wait_for_notes(rt, "t1")
        await settled(rt, "t1", 2)
        await asyncio.sleep(0.2)
        messages = await messages_of(rt, "t1")
        # Delivering the same key again changes nothing.
        child_run = (await rt.runs.list(task_id))[0]["run_id"]
        again = notification_message(task_id, "researcher", "success", "The answer is 42.", child_run)
        assert await rt.deliver("t1", again, key=f"{task_id}:{child_run}") is False
        await asyncio.sleep(0.1)
        assert len(await rt.runs.list("t1")) == 2
        assert await messages_of(rt, "t1") == messages
    kinds = [(m["type"], is_note(m)) for m in messages]
    assert kinds == [("human", False), ("ai", False), ("tool", False), ("ai", False), ("human", True),
                     ("ai", False)]
    assert text(messages[-1]) == f"Relay: {text(messages[-2])}"


async def test_long_result_is_truncated_in_the_notification_but_complete_in_check():
    long_answer = "".join(f"fact {i}. " for i in range(150))
    assert len(long_answer) > SUMMARY_LIMIT
    agent = supervisor_with(researcher(ScriptedModel([long_answer])))
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        await agent.ainvoke("research please", thread_id="t1")
        task_id = await task_id_of(rt, "t1")
        [note] = await wait_for_notes(rt, "t1")
    match = NOTE_RE.match(text(note))
    assert match["kind"] == "Completed. Result: "
    assert match["detail"].startswith(long_answer[:SUMMARY_LIMIT])
    assert long_answer[:SUMMARY_LIMIT + 1] not in match["detail"]
    assert f'check_async_task(task_id="{task_id}")' in match["detail"]
    assert len(text(note)) < SUMMARY_LIMIT + 200


async def test_error_notification_is_generic_and_never_leaks_the_exception():
    model = relay_supervisor()
    model.record = True
    agent = supervisor_with(researcher(ScriptedModel([RuntimeError("secret-db-password")])), model=model)
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        await agent.ainvoke("research please", thread_id="t1")
        task_id = await task_id_of(rt, "t1")
        [note] = await wait_for_notes(rt, "t1")
        await settled(rt, "t1", 2)
        child_run = (await rt.runs.list(task_id))[0]
        assert child_run["status"] == "error"
        # check_async_task is generic too.
        check = create_deep_agent(
            ScriptedModel([{"tool_calls": [call("check_async_task", {"task_id": task_id}, "c1")]}, "ok"]),
            subagents=[researcher(ScriptedModel([]))], general_purpose=False)
        rt.register("checker", check)
        await rt.runs.wait("t1", "checker", input={"messages": [{"role": "user", "content": "check"}]})
        values = await values_of(rt, "t1")
    match = NOTE_RE.match(text(note))
    assert match["kind"] == "Error: " and match["detail"].strip()
    assert note["additional_kwargs"]["task_notification"]["status"] == "error"
    assert "secret" not in json.dumps(values)
    assert json.loads(text(values["messages"][-2]))["status"] == "error"
    for request in model.requests:
        assert not any("secret" in m.text for m in request.messages)


async def test_waiting_task_notifies_with_its_question_and_a_waiting_status():
    @tool
    def ask_city() -> str:
        """Ask which city."""
        return interrupt("which city?")

    sub = ScriptedModel([{"tool_calls": [call("ask_city", {}, "a1")]}, lambda r: f"Sunny in {r.messages[-1].text}"])
    agent = supervisor_with(researcher(sub, tools=[ask_city]))
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        await agent.ainvoke("research please", thread_id="t1")
        task_id = await task_id_of(rt, "t1")
        [note] = await wait_for_notes(rt, "t1")
        await quiet(rt, "t1")
        tracked = (await values_of(rt, "t1"))["async_tasks"][task_id]
    assert text(note) == f"[task_id={task_id}][subagent=researcher] Waiting for input: which city?"
    assert note["additional_kwargs"]["task_notification"]["status"] == "waiting"
    assert tracked["status"] == "waiting"


# -- who gets notified, and how ------------------------------------------------------------------------


async def test_without_a_parent_context_nothing_is_sent():
    worker = create_agent(ScriptedModel(["done"], loop=True), middleware=[CompletionNotifier()], name="worker")
    async with LocalRuntime("memory", agents={"worker": worker}) as rt:
        state = await worker.ainvoke("work", thread_id="w1")
        assert state["messages"][-1].text == "done"
        # A task id alone, or a parent alone, is not a parent context either.
        await worker.ainvoke({"messages": [("user", "work")], "task_id": "w2"}, thread_id="w2")
        await worker.ainvoke({"messages": [("user", "work")], "parent_thread_id": "w1"}, thread_id="w3")
        await asyncio.sleep(0.1)
        assert sorted(t["thread_id"] for t in await rt.threads.search()) == ["w1", "w2", "w3"]
        assert len(await rt.runs.list("w1")) == 1  # w3's "parent" was not woken
        assert [m["type"] for m in await messages_of(rt, "w1")] == ["human", "ai"]
        assert await rt.storage.threads_with_mail() == []
    # Without a runtime at all, the notifier is a no-op too.
    state = await worker.ainvoke({"messages": [("user", "x")], "task_id": "t", "parent_thread_id": "p"})
    assert state["messages"][-1].text == "done"


async def test_busy_parent_gets_the_notification_before_its_next_model_call():
    @tool
    async def think(runtime: ToolRuntime) -> str:
        """Think for a moment."""
        # Long enough for the (fast) task to have finished and notified.
        rt = runtime.ctx.runtime
        [task] = runtime.state["async_tasks"].values()
        await wait_until(lambda: _run_finished(rt, task), what="the task to finish")
        return "thought"

    def boss(request):
        last = request.messages[-1]
        if last_is_note(request):
            return "final: " + last.text
        if isinstance(last, HumanMessage):
            return {"tool_calls": [start("researcher", "quick job", "s1")]}
        if isinstance(last, ToolMessage) and last.name == "start_async_task":
            return {"tool_calls": [call("think", {}, "k1")]}
        return "no notification yet"

    model = policy(boss, latency=0.05)  # the supervisor is slow; its task is fast
    model.record = True
    agent = supervisor_with(researcher(ScriptedModel(["quick result"]), tools=[]), model=model, tools=[think])
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        state = await agent.ainvoke("go", thread_id="t1")
        await asyncio.sleep(0.2)
        runs = await rt.runs.list("t1")
        messages = await messages_of(rt, "t1")
    task_id = next(iter(state["async_tasks"]))
    assert len(runs) == 1, "the notification should have joined the running run, not woken a new one"
    assert [m.type for m in state["messages"]] == ["human", "ai", "tool", "ai", "tool", "human", "ai"]
    expected = f"[task_id={task_id}][subagent=researcher] Completed. Result: quick result"
    assert state["messages"][-1].text == f"final: {expected}"
    assert last_is_note(model.requests[2])
    assert len(notes(messages)) == 1
    assert state["async_tasks"][task_id]["status"] == "success"


async def _run_finished(rt, task):
    return (await rt.runs.get(task["task_id"], task["run_id"]))["status"] == "success"


@pytest.mark.parametrize("ending, store", [
    *[(ending, "memory") for ending in ("success", "error", "cancel", "interrupt", "iteration limit")],
    ("error", "sqlite"), ("iteration limit", "sqlite"), ("cancel", "postgres")])
async def test_a_result_delivered_during_a_run_is_heard_once_however_the_run_ends(ending, store, request, tmp_path):
    """Seed 000: a notification that reaches the supervisor's thread while its run goes on is heard exactly
    once, by that run or by a wake-up run after it, whether the run succeeds, fails, is cancelled, stops for
    a human, or reaches its iteration limit."""
    from backchannel import ModelError

    heard: list[str] = []  # task ids, each time a supervisor model call finds a notification new to it

    @tool
    def ask() -> str:
        """Ask the user."""
        return interrupt("go on?")

    @tool
    async def fidget() -> str:
        """Nothing useful."""
        return "fidgeted"

    def boss(request):
        fresh = []
        for m in reversed(request.messages):
            if m.type == "ai":
                break
            if is_note(m):
                fresh.append(m.additional_kwargs["task_notification"]["task_id"])
        heard.extend(fresh)
        if fresh:
            return "Relay: " + ", ".join(fresh)
        last = request.messages[-1]
        if isinstance(last, HumanMessage):
            return {"tool_calls": [start("researcher", "find it", "s1")]}
        if isinstance(last, ToolMessage) and last.name == "start_async_task":
            # This call takes 1 s: the task ends and its notification reaches the thread meanwhile.
            return {"success": "Started it.", "error": ModelError("the model's provider is down"),
                    "cancel": "never seen: cancelled first", "interrupt": {"tool_calls": [call("ask", {}, "a1")]},
                    "iteration limit": {"tool_calls": [call("fidget", {}, "f1")]}}[ending]
        return "Carrying on."

    agent = create_deep_agent(policy(boss, latency=1.0), [ask, fidget], general_purpose=False,
                              subagents=[researcher(ScriptedModel(["The answer is 42."]))],
                              max_iterations=2 if ending == "iteration limit" else 50)
    url = {"memory": "memory", "sqlite": f"sqlite:///{tmp_path}/state.db"}.get(store) or \
        request.getfixturevalue("postgres_url")
    async with LocalRuntime(url, agents={"supervisor": agent}) as rt:
        first = await rt.runs.create("t1", "supervisor", input={"messages": [{"role": "user", "content": "go"}]},
                                     if_not_exists="create")
        task_id = await wait_until(lambda: _task_id_if_any(rt, "t1"), 10, what="the task to start")
        await wait_until(lambda: _task_succeeded(rt, task_id), 10, what="the task to finish")
        if ending == "cancel":
            await asyncio.sleep(0.1)  # its notification is in the thread; the supervisor's model call goes on
            await rt.runs.cancel("t1", first["run_id"])
        ended = await rt.runs.join("t1", first["run_id"])
        run = await rt.runs.get("t1", first["run_id"])
        expected = {"success": "success", "error": "error", "cancel": "interrupted", "interrupt": "success",
                    "iteration limit": "error"}[ending]
        assert run["status"] == expected, (run, ended)
        await wait_until(lambda: heard, 10, what="the supervisor to hear the result")
        await quiet(rt, "t1")
        await asyncio.sleep(0.3)  # room for a second delivery to show up
        await quiet(rt, "t1")
        messages = await messages_of(rt, "t1")
    assert heard == [task_id]
    assert len(notes(messages, task_id)) == 1


async def _task_id_if_any(rt, thread_id):
    values = await values_of(rt, thread_id)
    return next(iter(values.get("async_tasks") or {}), None)


async def _task_succeeded(rt, task_id):
    runs = await rt.runs.list(task_id)
    return bool(runs) and runs[0]["status"] == "success"


async def test_wait_mode_keeps_the_parents_run_going_until_every_task_reported():
    def boss(request):
        last = request.messages[-1]
        if last_is_note(request):
            seen = len([m for m in request.messages if is_note(m)])
            return f"have {seen} of 2 results"
        if isinstance(last, HumanMessage):
            return {"tool_calls": [start("researcher", "a", "s1"), start("analyst", "b", "s2")]}
        return "started both"

    agent = create_deep_agent(
        policy(boss),
        subagents=[researcher(ScriptedModel(["research done"], latency=0.05)),
                   SubAgent("analyst", "Analyses.", background=True, model=ScriptedModel(["analysis done"],
                                                                                          latency=0.25))],
        general_purpose=False, completion="wait")
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        began = time.monotonic()
        state = await agent.ainvoke("go", thread_id="t1")
        elapsed = time.monotonic() - began
        await asyncio.sleep(0.1)
        runs = await rt.runs.list("t1")
    assert 0.25 <= elapsed < 0.9, elapsed  # waited for the slow task, and didn't poll for a second
    assert len(runs) == 1
    got = [(m.type, m.text.split("]")[1] + "]" if is_note(m) else m.text) for m in state["messages"][4:]]
    assert got == [("ai", "started both"), ("human", "[subagent=researcher]"), ("ai", "have 1 of 2 results"),
                   ("human", "[subagent=analyst]"), ("ai", "have 2 of 2 results")]
    assert {t["status"] for t in state["async_tasks"].values()} == {"success"}


@pytest.mark.parametrize("store", ["memory", "sqlite"])
async def test_wait_mode_takes_completions_that_arrive_together_in_a_few_model_calls(store, tmp_path):
    k = 40
    batches = []  # new notifications per supervisor model call, once the tasks are started

    def boss(request):
        if isinstance(request.messages[-1], HumanMessage) and not is_note(request.messages[-1]):
            return {"tool_calls": [start("researcher", f"job {i}", f"s{i}") for i in range(k)]}
        news = 0
        for m in reversed(request.messages):
            if m.type == "ai":
                break
            news += is_note(m)
        batches.append(news)
        return "noted"

    agent = create_deep_agent(policy(boss), subagents=[researcher(ScriptedModel(["done"], loop=True, latency=0.05))],
                              general_purpose=False, completion="wait", max_concurrent_tasks=k)
    url = "memory" if store == "memory" else f"sqlite:///{tmp_path}/state.db"
    async with LocalRuntime(url, agents={"supervisor": agent}):
        state = await agent.ainvoke("go", thread_id="t1")
    ids = [n.additional_kwargs["task_notification"]["task_id"] for n in notes(state["messages"])]
    assert len(ids) == len(set(ids)) == k  # each task once
    assert sorted(ids) == sorted(state["async_tasks"])
    assert {t["status"] for t in state["async_tasks"].values()} == {"success"}
    # the 40 tasks end within a few ms of each other: the supervisor sees them in a few calls, each
    # taking every completion that has arrived since the last one
    assert sum(batches) == k and len([b for b in batches if b]) <= k // 4, batches


def _trickling_researcher(spacing: float, offset: float = 0.3) -> SubAgent:
    """Background researchers whose task ``job i`` answers ``offset + i * spacing`` s after the first starts."""
    t0: list[float] = []

    @tool
    async def take_turn(i: int) -> str:
        """Wait for turn i."""
        if not t0:
            t0.append(time.monotonic())
        await asyncio.sleep(max(0.0, t0[0] + offset + i * spacing - time.monotonic()))
        return f"turn {i}"

    def work(request):
        last = request.messages[-1]
        if isinstance(last, ToolMessage):
            return f"result of {last.text}"
        return {"tool_calls": [call("take_turn", {"i": int(last.text.split()[-1])}, "w")]}

    return researcher(policy(work), tools=[take_turn])


@pytest.mark.parametrize("k, spacing", [(60, 0.02), (200, 0.01)])
async def test_wait_mode_survives_results_that_trickle_in(k, spacing):
    heard: list[str] = []  # task ids, in the order the supervisor's model first saw them
    calls = 0

    def boss(request):
        nonlocal calls
        calls += 1
        if isinstance(request.messages[-1], HumanMessage) and not is_note(request.messages[-1]):
            return {"tool_calls": [start("researcher", f"job {i}", f"s{i}") for i in range(k)]}
        for m in reversed(request.messages):
            if m.type == "ai":
                break
            if is_note(m):
                heard.append(m.additional_kwargs["task_notification"]["task_id"])
        return f"heard {len(heard)}"

    agent = create_deep_agent(policy(boss, latency=0.005), subagents=[_trickling_researcher(spacing)],
                              general_purpose=False, completion="wait", max_concurrent_tasks=k)
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        state = await asyncio.wait_for(agent.ainvoke("go", thread_id="t1"), 60)
        runs = await rt.runs.list("t1")
    assert [r["status"] for r in runs] == ["success"]
    assert len(heard) == len(set(heard)) == k and sorted(heard) == sorted(state["async_tasks"])
    assert len(notes(state["messages"])) == k
    assert {t["status"] for t in state["async_tasks"].values()} == {"success"}
    assert state["messages"][-1].text == f"heard {k}"


@pytest.mark.skipif(os.environ.get("CI", "").lower() not in ("true", "1"), reason="slow (about 30 s): CI only")
@pytest.mark.parametrize("completion", ["wait", "notify"])
async def test_the_bench_fan_out_of_1000_tasks_succeeds_20_times_in_a_row(completion):
    """bench/fanout.py's K=1,000 fan-out (5 model calls of 50 ms per task), on a fresh runtime each time:
    every task succeeds and the supervisor's model hears each notification, once (the bench checks both)."""
    sys.path.insert(0, str(TESTS_DIR.parent / "bench"))
    try:
        from fanout import fan_out_once
    finally:
        sys.path.pop(0)
    for _ in range(20):
        await fan_out_once("memory", 1_000, completion)  # raises unless every task succeeded and was heard once


async def test_the_iteration_limit_still_stops_a_supervisor_that_loops_on_its_own_while_waiting():
    from backchannel import MaxIterationsError

    @tool
    async def fidget() -> str:
        """Do nothing useful."""
        return "fidgeted"

    def boss(request):
        if isinstance(request.messages[-1], HumanMessage) and not is_note(request.messages[-1]):
            return {"tool_calls": [start("researcher", "job 0", "s0")]}
        return {"tool_calls": [call("fidget", {}, f"f{len(request.messages)}")]}  # never stops by itself

    agent = create_deep_agent(policy(boss), [fidget], subagents=[researcher(ScriptedModel(["r"], latency=30))],
                              general_purpose=False, completion="wait", max_iterations=8)
    async with LocalRuntime("memory", agents={"supervisor": agent}):
        with pytest.raises(MaxIterationsError):
            await asyncio.wait_for(agent.ainvoke("go", thread_id="t1"), 10)


async def test_the_iteration_limit_stops_a_supervisor_that_starts_a_task_for_every_result():
    from backchannel import MaxIterationsError

    def boss(request):
        n = len([m for m in request.messages if m.type == "ai"])
        return {"tool_calls": [start("researcher", f"job {n}", f"s{n}")]}  # every result starts another task

    agent = create_deep_agent(policy(boss), subagents=[researcher(ScriptedModel(["r"], loop=True, latency=0.01))],
                              general_purpose=False, completion="wait", max_iterations=8)
    async with LocalRuntime("memory", agents={"supervisor": agent}):
        with pytest.raises(MaxIterationsError):
            await asyncio.wait_for(agent.ainvoke("go", thread_id="t1"), 10)


async def test_the_stream_tells_once_when_the_last_pending_task_has_been_heard():
    """One ``drained`` task event, when the supervisor has heard its last pending task and none remain."""
    def boss(request):
        if isinstance(request.messages[-1], HumanMessage) and not is_note(request.messages[-1]):
            return {"tool_calls": [start("researcher", "quick", "s1"), start("analyst", "slow", "s2")]}
        return "noted"

    agent = create_deep_agent(
        policy(boss), general_purpose=False, completion="wait", name="supervisor",
        subagents=[researcher(ScriptedModel(["quick result"], latency=0.05)),
                   SubAgent("analyst", "Analyses.", background=True, model=ScriptedModel(["slow result"],
                                                                                         latency=0.4))])
    async with LocalRuntime("memory", agents={"supervisor": agent}):
        stream = agent.astream("go", thread_id="t1")
        events = [e async for e in stream]
    tasks = [e for e in events if e.type == "task"]
    [drained] = [e for e in tasks if e.data.get("event") == "drained"]
    assert drained.namespace == () and drained.agent == "supervisor"
    assert drained.data["tasks"] == {tid: "success" for tid in stream.result["async_tasks"]}
    # after the last task's result was taken in, before the model call that hears it
    heard = [i for i, e in enumerate(events) if e.type == "updates" and "inbox" in e.data]
    finishes = [i for i, e in enumerate(events) if e.type == "message" and e.data["event"] == "finish"
                and not e.namespace]
    position = events.index(drained)
    assert heard[-1] < position < finishes[-1]
    assert all(e.data.get("event") != "drained" for e in events[:heard[-1]])


async def test_wait_mode_ends_at_once_when_nothing_is_pending():
    agent = create_deep_agent(ScriptedModel(["nothing to wait for"]), subagents=[researcher(ScriptedModel([]))],
                              general_purpose=False, completion="wait")
    async with LocalRuntime("memory", agents={"supervisor": agent}):
        began = time.monotonic()
        state = await agent.ainvoke("hi", thread_id="t1")
    assert time.monotonic() - began < 0.5
    assert state["messages"][-1].text == "nothing to wait for"


async def test_each_task_run_notifies_exactly_once_even_with_many_tasks():
    starts = [start("researcher", f"job {i}", f"s{i}") for i in range(4)]
    agent = supervisor_with(researcher(ScriptedModel(["r"], loop=True, latency=0.02)),
                            model=relay_supervisor(starts))
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        await agent.ainvoke("go", thread_id="t1")
        await wait_for_notes(rt, "t1", 4)
        await quiet(rt, "t1")
        await asyncio.sleep(0.2)
        await quiet(rt, "t1")
        found = notes(await messages_of(rt, "t1"))
        tracked = (await values_of(rt, "t1"))["async_tasks"]
    ids = [n["additional_kwargs"]["task_notification"]["task_id"] for n in found]
    assert sorted(ids) == sorted(tracked) and len(set(ids)) == 4
    assert {t["status"] for t in tracked.values()} == {"success"}


# -- a crash between the subagent's end and the parent's notification ----------------------------------------


@pytest.mark.parametrize("kill_point", ["before_delivery", "after_notification", "after_store"])
async def test_crash_before_the_parent_is_told_still_notifies_exactly_once(tmp_path, kill_point):
    db = tmp_path / "state.db"
    marker = tmp_path / "marker"
    script = tmp_path / "supervisor_process.py"
    script.write_text(SUBPROCESS_SCRIPT.format(tests_dir=str(TESTS_DIR)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, str(script), str(db), str(marker), kill_point], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 15
        while not marker.exists():
            if process.poll() is not None:
                raise AssertionError(f"the supervisor process died early: {process.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise AssertionError("the subagent never finished in the supervisor process")
            await asyncio.sleep(0.02)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()  # reap it, so the restarted runtime sees it is gone
    assert process.returncode == -signal.SIGKILL
    if kill_point == "after_notification":  # what the parent was told is the task's state, stored before it
        storage = SQLiteStorage(str(db))
        await storage.open()
        [task] = [t for t in await storage.search_threads() if t.thread_id != "parent"]
        last = await storage.head_checkpoint(task.thread_id)
        assert (last.next, [m["content"] for m in last.delta["messages"]]) == ("", ["The answer is 42."])
        await storage.close()

    agent = crash_supervisor()
    async with LocalRuntime(f"sqlite:///{db}", agents={"supervisor": agent}) as rt:
        task_id = await task_id_of(rt, "parent")
        [note] = await wait_for_notes(rt, "parent")
        await settled(rt, "parent", 2)
        await asyncio.sleep(0.3)  # room for a duplicate to show up
        messages = await messages_of(rt, "parent")
        parent_runs = await rt.runs.list("parent")
        child_runs = await rt.runs.list(task_id)
        tracked = (await values_of(rt, "parent"))["async_tasks"][task_id]

    assert text(note) == f"[task_id={task_id}][subagent=researcher] Completed. Result: The answer is 42."
    assert len(notes(messages)) == 1
    position = next(i for i, m in enumerate(messages) if is_note(m))
    replies_after = [m for m in messages[position + 1:] if m["type"] == "ai"]
    assert [text(m) for m in replies_after] == [f"Relay: {text(note)}"]
    assert len(parent_runs) == 2 and all(r["status"] == "success" for r in parent_runs)
    assert [r["status"] for r in child_runs] == ["success"]  # the same run, finished after the restart
    assert note["additional_kwargs"]["task_notification"]["run_id"] == child_runs[0]["run_id"]
    assert tracked["status"] == "success"


async def test_wait_mode_hears_a_result_that_arrives_as_its_wait_times_out(monkeypatch):
    """The task's notification can reach the inbox just as the supervisor's wait for it times out (its status
    already success): the run still takes it in, rather than ending without it (the result then left to a
    wake-up run that a one-shot `backchannel run` never shows)."""
    from backchannel.runtime.inbox import ThreadInbox

    async def missed(self):  # the arrival is never announced: only the periodic recheck can find the mail
        await asyncio.Event().wait()

    monkeypatch.setattr(ThreadInbox, "wait", missed)

    def boss(request):
        if last_is_note(request):
            return "got the result"
        if isinstance(request.messages[-1], HumanMessage):
            return {"tool_calls": [start("researcher", "a", "s1")]}
        return "started it"

    agent = create_deep_agent(policy(boss), subagents=[researcher(ScriptedModel(["research done"]))],
                              general_purpose=False, completion="wait")
    async with LocalRuntime("memory", agents={"supervisor": agent}) as rt:
        state = await agent.ainvoke("go", thread_id="t1")
        assert state["messages"][-1].text == "got the result"
        assert len(await rt.runs.list("t1")) == 1
