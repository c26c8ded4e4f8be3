"""Background subagents: the async task tools, their statuses, the tracked state, and the limits."""

import asyncio
import json
import time

import pytest
from subagent_helpers import (
    call,
    command,
    commander,
    messages_of,
    notes,
    policy,
    quiet,
    settled,
    start,
    text,
    tool_messages,
    values_of,
    wait_until,
)

from backchannel import HumanMessage, Middleware, ScriptedModel, create_agent, interrupt, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.hitl import HumanInTheLoop
from backchannel.runtime import LocalRuntime
from backchannel.subagents import SubAgent


def deep(subagents, **kwargs):
    kwargs.setdefault("general_purpose", False)
    return create_deep_agent(commander(), subagents=subagents, **kwargs)


def bg(name, model, **kwargs):
    return SubAgent(name, f"The {name}.", background=True, model=model, **kwargs)


def check(task_id="$researcher", id="chk"):
    return call("check_async_task", {"task_id": task_id}, id)


def report(message):
    assert message.status == "success", message.text
    return json.loads(message.text)


async def runtime_with(agent, store="memory"):
    rt = LocalRuntime(store, agents={"supervisor": agent})
    await rt.open()
    return rt


@pytest.fixture
async def opened():
    runtimes = []

    async def make(agent, store="memory"):
        rt = await runtime_with(agent, store)
        runtimes.append(rt)
        return rt

    yield make
    for rt in runtimes:
        await rt.close()


# -- starting ---------------------------------------------------------------------------------------


async def test_start_returns_at_once_with_the_child_thread_as_task_id(opened):
    sub_model = ScriptedModel(["slow result"], latency=1.0)
    sub_model.record = True
    agent = deep([bg("researcher", sub_model)])
    rt = await opened(agent)
    began = time.monotonic()
    results = await command(agent, "t1", start("researcher", "find the answer", "s1"))
    assert time.monotonic() - began < 0.6, "start_async_task waited for the subagent"
    assert results["s1"].status == "success"

    [(task_id, task)] = (await values_of(rt, "t1"))["async_tasks"].items()
    assert task_id in results["s1"].text
    assert task["task_id"] == task_id and task["subagent"] == "researcher"
    assert task["description"] == "find the answer" and task["tool_call_id"] == "s1"
    assert task["status"] == "pending" and task["run_id"]

    child = await rt.threads.get(task_id)
    assert child["metadata"]["parent_thread_id"] == "t1" and child["metadata"]["subagent"] == "researcher"
    [child_run] = await rt.runs.list(task_id)
    assert child_run["run_id"] == task["run_id"]
    found = await rt.threads.search(metadata={"parent_thread_id": "t1"})
    assert [t["thread_id"] for t in found] == [task_id]

    # The parent context travels in the child's input state (written by the child's run once it begins).
    values = await wait_until(lambda: values_of(rt, task_id), timeout=30, what="the child's input state")
    assert values["task_id"] == task_id and values["parent_thread_id"] == "t1"
    assert values["parent_assistant_id"] == "supervisor"

    await settled(rt, task_id, 1)
    assert [m.text for m in sub_model.requests[0].messages] == ["find the answer"]


async def test_background_tasks_need_a_runtime():
    agent = deep([bg("researcher", ScriptedModel(["r"]))])
    state = await agent.ainvoke(json.dumps([start("researcher", "x", "s1")]))
    [result] = tool_messages(state["messages"], "start_async_task")
    assert result.status == "error" and "runtime" in result.text


async def test_unknown_task_id_and_unknown_subagent_type_are_clear_errors(opened):
    agent = deep([bg("researcher", ScriptedModel(["r"], loop=True)), bg("analyst", ScriptedModel(["a"]))])
    rt = await opened(agent)
    results = await command(agent, "t1", start("astrologer", "x", "s0"), check("nope", "c0"),
                            call("update_async_task", {"task_id": "nope", "message": "hi"}, "u0"),
                            call("cancel_async_task", {"task_id": "nope"}, "x0"))
    assert results["s0"].status == "error"
    assert "'astrologer'" in results["s0"].text and "researcher" in results["s0"].text \
        and "analyst" in results["s0"].text
    for key in ("c0", "u0", "x0"):
        assert results[key].status == "error" and "'nope'" in results[key].text and "none" in results[key].text

    await command(agent, "t1", start("researcher", "x", "s1"))
    task_id = next(iter((await values_of(rt, "t1"))["async_tasks"]))
    results = await command(agent, "t1", check("missing", "c1"))
    assert results["c1"].status == "error" and task_id in results["c1"].text  # the known ids are listed
    assert await rt.threads.search(metadata={"subagent": "astrologer"}) == []


# -- checking -----------------------------------------------------------------------------------------


async def test_check_reports_live_status_and_the_full_result_when_done(opened):
    long_answer = "finding " * 120  # 960 characters: longer than a notification carries
    agent = deep([bg("researcher", ScriptedModel([long_answer], latency=0.2))])
    rt = await opened(agent)
    await command(agent, "t1", start("researcher", "x", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    early = report((await command(agent, "t1", check(id="c1")))["c1"])
    assert early == {"task_id": task_id, "subagent": "researcher", "status": early["status"]}
    assert early["status"] in ("pending", "running")

    await settled(rt, task_id, 1)
    done = report((await command(agent, "t1", check(id="c2")))["c2"])
    assert done["status"] == "success" and done["result"] == long_answer
    assert (await values_of(rt, "t1"))["async_tasks"][task_id]["status"] == "success"


# -- updating -----------------------------------------------------------------------------------------


async def test_update_interrupts_a_running_task_and_continues_with_the_new_message(opened):
    def researcher(request):
        last = request.messages[-1]
        return "focused on Y" if "focus on Y" in last.text else "broad answer about X"

    agent = deep([bg("researcher", policy(researcher, latency=0.3))])
    rt = await opened(agent)
    await command(agent, "t1", start("researcher", "find X", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    first_run = (await values_of(rt, "t1"))["async_tasks"][task_id]["run_id"]
    await wait_until(lambda: _status_is(rt, task_id, first_run, "running"), what="the task to run")
    await asyncio.sleep(0.05)  # the task is in its (slow) model call

    results = await command(agent, "t1", call("update_async_task", {"task_id": task_id,
                                                                     "message": "focus on Y"}, "u1"))
    assert results["u1"].status == "success" and task_id in results["u1"].text
    tracked = (await values_of(rt, "t1"))["async_tasks"][task_id]
    assert tracked["run_id"] != first_run

    runs = await settled(rt, task_id, 2)
    assert {r["run_id"]: r["status"] for r in runs} == {first_run: "interrupted", tracked["run_id"]: "success"}
    child = await messages_of(rt, task_id)
    assert [(m["type"], text(m)) for m in child if m["type"] != "tool"] == [
        ("human", "find X"), ("human", "focus on Y"), ("ai", "focused on Y")]

    await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the notification")
    await quiet(rt, "t1")
    [note] = await _notes_of(rt, "t1", task_id)  # the interrupted run did not report
    assert text(note).endswith("Completed. Result: focused on Y")
    assert note["additional_kwargs"]["task_notification"]["run_id"] == tracked["run_id"]


async def _status_is(rt, thread_id, run_id, status):
    return (await rt.runs.get(thread_id, run_id))["status"] == status


async def _notes_of(rt, thread_id, task_id=None):
    return notes(await messages_of(rt, thread_id), task_id)


@tool
def ask_city() -> str:
    """Ask the user which city they mean."""
    return interrupt("which city?")


def asking_model():
    def reply(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage):
            return {"tool_calls": [call("ask_city", {}, "ask1")]}
        return f"Weather in {last.text}: sunny"

    return policy(reply)


async def test_update_resumes_a_waiting_task_with_the_message(opened):
    agent = deep([bg("forecaster", asking_model(), tools=[ask_city])])
    rt = await opened(agent)
    await command(agent, "t1", start("forecaster", "weather?", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    [waiting] = await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the waiting notification")
    assert text(waiting) == f"[task_id={task_id}][subagent=forecaster] Waiting for input: which city?"
    await quiet(rt, "t1")
    assert (await values_of(rt, "t1"))["async_tasks"][task_id]["status"] == "waiting"
    assert (await rt.threads.get(task_id))["status"] == "interrupted"

    checked = report((await command(agent, "t1", check("$forecaster", "c1")))["c1"])
    assert checked["status"] == "waiting" and checked["question"] == "which city?"
    listed = (await command(agent, "t1", call("list_async_tasks", {"status_filter": "waiting"}, "l1")))["l1"]
    assert task_id in listed.text

    results = await command(agent, "t1", call("update_async_task", {"task_id": task_id, "message": "Paris"}, "u1"))
    assert results["u1"].status == "success"
    await wait_until(lambda: _count(_notes_of(rt, "t1", task_id), 2), what="the completion notification")
    first, second = await _notes_of(rt, "t1", task_id)
    assert text(second) == f"[task_id={task_id}][subagent=forecaster] Completed. Result: Weather in Paris: sunny"
    assert first["additional_kwargs"]["task_notification"]["run_id"] != \
        second["additional_kwargs"]["task_notification"]["run_id"]
    child = await messages_of(rt, task_id)
    assert [text(m) for m in child if m["type"] == "tool"] == ["Paris"]


async def _count(awaitable, n):
    found = await awaitable
    return len(found) >= n


@pytest.mark.parametrize("answer, approved", [
    ("approve", True),
    ('{"decisions": [{"type": "approve"}]}', True),
    ("No: Bob is on holiday", False),
])
async def test_update_answers_a_human_in_the_loop_review_waiting_task(opened, answer, approved):
    sent = []

    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    mailer = ScriptedModel([{"tool_calls": [call("send_email", {"to": "bob"}, "e1")]},
                            lambda request: f"email outcome: {request.messages[-1].text}"])
    agent = deep([bg("mailer", mailer, tools=[send_email], middleware=[HumanInTheLoop({"send_email": True})])])
    rt = await opened(agent)
    await command(agent, "t1", start("mailer", "email bob", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    [waiting] = await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the review notification")
    assert text(waiting) == (f'[task_id={task_id}][subagent=mailer] Waiting for input: '
                             'approve send_email({"to": "bob"})?')
    assert sent == []
    await quiet(rt, "t1")
    assert (await values_of(rt, "t1"))["async_tasks"][task_id]["status"] == "waiting"

    results = await command(agent, "t1", call("update_async_task", {"task_id": task_id, "message": answer}, "u1"))
    assert results["u1"].status == "success", results["u1"].text
    await wait_until(lambda: _count(_notes_of(rt, "t1", task_id), 2), what="the completion notification")
    final = text((await _notes_of(rt, "t1", task_id))[-1])
    if approved:
        assert sent == ["bob"] and final.endswith("Completed. Result: email outcome: sent to bob")
    else:
        assert sent == [] and "Bob is on holiday" in final and "Completed. Result: email outcome:" in final


# -- cancelling and listing ---------------------------------------------------------------------------------


async def test_cancel_stops_a_running_task_without_a_notification(opened):
    agent = deep([bg("researcher", ScriptedModel(["never"], latency=2.0))])
    rt = await opened(agent)
    await command(agent, "t1", start("researcher", "x", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    began = time.monotonic()
    results = await command(agent, "t1", call("cancel_async_task", {"task_id": task_id}, "x1"))
    assert time.monotonic() - began < 1.0
    assert results["x1"].status == "success" and "cancelled" in results["x1"].text
    assert (await values_of(rt, "t1"))["async_tasks"][task_id]["status"] == "cancelled"
    assert report((await command(agent, "t1", check(id="c1")))["c1"])["status"] == "cancelled"
    [run] = await rt.runs.list(task_id)
    assert run["status"] == "interrupted"
    await asyncio.sleep(0.2)
    assert await _notes_of(rt, "t1") == []
    assert len(await rt.runs.list("t1")) == 3  # no wake run


async def test_list_shows_live_statuses_and_filters(opened):
    agent = deep([bg("quick", ScriptedModel(["quick result"])), bg("slow", ScriptedModel(["slow"], latency=1.5))])
    rt = await opened(agent)
    await command(agent, "t1", start("quick", "fast job", "s1"), start("slow", "long job", "s2"))
    ids = {t["subagent"]: tid for tid, t in (await values_of(rt, "t1"))["async_tasks"].items()}
    await wait_until(lambda: _notes_of(rt, "t1", ids["quick"]), what="quick's notification")

    results = await command(agent, "t1", *[call("list_async_tasks", {"status_filter": f}, f"l_{f}")
                                           for f in ("all", "running", "success", "error", "bogus")])
    assert ids["quick"] in results["l_all"].text and ids["slow"] in results["l_all"].text
    assert "fast job" in results["l_all"].text
    assert ids["slow"] in results["l_running"].text and ids["quick"] not in results["l_running"].text
    assert f"- {ids['quick']} [quick] success" in results["l_success"].text
    assert ids["slow"] not in results["l_success"].text
    assert results["l_error"].text == "No tasks."
    assert results["l_bogus"].status == "error" and "'bogus'" in results["l_bogus"].text
    tracked = (await values_of(rt, "t1"))["async_tasks"]
    assert tracked[ids["slow"]]["status"] == "running" and tracked[ids["quick"]]["status"] == "success"


# -- state and restarts ---------------------------------------------------------------------------------------


def sqlite_agent():
    return deep([bg("researcher", ScriptedModel(["persisted result"], loop=True))])


async def test_tracked_tasks_live_in_the_parents_state_and_survive_reopening(tmp_path):
    store = f"sqlite:///{tmp_path / 'state.db'}"
    agent = sqlite_agent()
    async with LocalRuntime(store, agents={"supervisor": agent}) as rt:
        await command(agent, "t1", start("researcher", "persist me", "s1"))
        [task_id] = (await values_of(rt, "t1"))["async_tasks"]
        await settled(rt, task_id, 1)
        await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the notification")
        await quiet(rt, "t1")

    agent = sqlite_agent()
    async with LocalRuntime(store, agents={"supervisor": agent}) as rt:
        tracked = (await values_of(rt, "t1"))["async_tasks"]
        assert list(tracked) == [task_id]
        assert tracked[task_id]["status"] == "success" and tracked[task_id]["description"] == "persist me"
        done = report((await command(agent, "t1", check(id="c1")))["c1"])
        assert done == {"task_id": task_id, "subagent": "researcher", "status": "success",
                        "result": "persisted result"}
        assert len(await _notes_of(rt, "t1", task_id)) == 1  # reopening did not notify again


# -- limits ---------------------------------------------------------------------------------------------


async def test_a_task_that_exceeds_its_timeout_is_reported_as_timeout(opened):
    agent = deep([bg("researcher", ScriptedModel(["too late"], latency=3.0), timeout=0.2)])
    rt = await opened(agent)
    began = time.monotonic()
    await command(agent, "t1", start("researcher", "x", "s1"))
    [task_id] = (await values_of(rt, "t1"))["async_tasks"]
    [note] = await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the timeout notification")
    assert time.monotonic() - began < 1.5
    assert text(note).startswith(f"[task_id={task_id}][subagent=researcher] Error: ")
    [run] = await rt.runs.list(task_id)
    assert run["status"] == "timeout"
    await quiet(rt, "t1")
    assert (await values_of(rt, "t1"))["async_tasks"][task_id]["status"] == "timeout"
    checked = report((await command(agent, "t1", check(id="c1")))["c1"])
    assert checked["status"] == "timeout" and "time" in checked["error"]


class ConcurrencyProbe(Middleware):
    """Counts the subagent model calls in progress; each waits at ``gate`` until the test opens it."""

    def __init__(self):
        self.active = 0
        self.peak = 0
        self.gate = asyncio.Event()

    async def wrap_model_call(self, request, handler):
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            await self.gate.wait()
            return await handler(request)
        finally:
            self.active -= 1


async def test_concurrent_background_tasks_are_bounded_and_the_rest_wait_as_pending(opened):
    probe = ConcurrencyProbe()
    worker = SubAgent("worker", "Works.", background=True, model=ScriptedModel(["work done"], loop=True, latency=0.05),
                      middleware=[probe])
    agent = create_deep_agent(commander(), subagents=[worker], general_purpose=False, max_concurrent_tasks=2)
    rt = await opened(agent)
    await command(agent, "t1", *[start("worker", f"job {i}", f"s{i}") for i in range(5)])
    tracked = (await values_of(rt, "t1"))["async_tasks"]
    assert len(tracked) == 5
    await wait_until(lambda: probe.active == 2, what="two tasks to be running")
    await asyncio.sleep(0.1)  # room for a third to (wrongly) start
    assert probe.active == 2
    listed = (await command(agent, "t1", call("list_async_tasks", {"status_filter": "all"}, "l1")))["l1"].text
    assert listed.count(" running:") == 2 and listed.count(" pending:") == 3, listed
    pending = (await command(agent, "t1", call("list_async_tasks", {"status_filter": "pending"}, "l2")))["l2"].text
    assert len(pending.splitlines()) == 3
    statuses = sorted([(await rt.runs.list(task_id))[0]["status"] for task_id in tracked])
    assert statuses == ["pending"] * 3 + ["running"] * 2

    probe.gate.set()
    for task_id in tracked:
        await settled(rt, task_id, 1)
    assert probe.peak == 2
    statuses = [(await rt.runs.list(task_id))[0]["status"] for task_id in tracked]
    assert statuses == ["success"] * 5
    await wait_until(lambda: _count(_notes_of(rt, "t1"), 5), what="five notifications")


async def test_a_failing_task_does_not_affect_its_siblings(opened):
    agent = deep([bg("broken", ScriptedModel([RuntimeError("kaput")])),
                  bg("steady", ScriptedModel(["steady result"], latency=0.1))])
    rt = await opened(agent)
    await command(agent, "t1", start("broken", "x", "s1"), start("steady", "y", "s2"))
    ids = {t["subagent"]: tid for tid, t in (await values_of(rt, "t1"))["async_tasks"].items()}
    await wait_until(lambda: _count(_notes_of(rt, "t1"), 2), what="both notifications")
    by_task = {n["additional_kwargs"]["task_notification"]["task_id"]: n for n in await _notes_of(rt, "t1")}
    assert " Error: " in text(by_task[ids["broken"]])
    assert text(by_task[ids["steady"]]).endswith("Completed. Result: steady result")
    results = await command(agent, "t1", check("$broken", "c1"), check("$steady", "c2"))
    assert report(results["c1"])["status"] == "error"
    assert report(results["c2"])["status"] == "success"


# -- which agents a task runs, and where they are registered ---------------------------------------------


async def test_a_prebuilt_background_subagent_notifies_too(opened):
    prebuilt = create_agent(ScriptedModel(["prebuilt result"]), name="prebuilt")
    agent = deep([{"name": "prebuilt", "description": "Compiled elsewhere.", "runnable": prebuilt,
                   "background": True}])
    rt = await opened(agent)
    await command(agent, "t1", start("prebuilt", "x", "s1"))
    task_id = next(iter((await values_of(rt, "t1"))["async_tasks"]))
    [note] = await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the notification")
    assert text(note) == f"[task_id={task_id}][subagent=prebuilt] Completed. Result: prebuilt result"
    assert list(prebuilt.middleware) == []  # the user's agent itself is left as it was


async def test_background_subagents_are_registered_with_the_runtime_up_front(opened):
    agent = deep([bg("researcher", ScriptedModel(["r"])), bg("analyst", ScriptedModel(["a"]))])
    rt = await opened(agent)
    graphs = {a["graph_id"] for a in await rt.assistants.search()}
    assert graphs == {"supervisor", "researcher", "analyst"}  # before any task ran


async def test_two_supervisors_with_same_named_subagents_share_a_runtime():
    first = deep([bg("researcher", ScriptedModel(["first's research"], loop=True))])
    second = deep([bg("researcher", ScriptedModel(["second's research"], loop=True))])
    other = create_agent(ScriptedModel(["unrelated"]), name="researcher")
    async with LocalRuntime("memory", agents={"first": first, "second": second, "researcher": other}) as rt:
        assert rt.graphs["researcher"] is other  # an explicitly registered name is never taken
        for graph, thread in ((first, "a"), (second, "b")):
            results = await command(graph, thread, start("researcher", "x", "s1"))
            assert results["s1"].status == "success", results["s1"].text
        note_a = await wait_until(lambda: _notes_of(rt, "a"), what="first's notification")
        note_b = await wait_until(lambda: _notes_of(rt, "b"), what="second's notification")
    assert text(note_a[0]).endswith("Result: first's research")
    assert text(note_b[0]).endswith("Result: second's research")


async def test_a_follow_up_to_a_finished_task_runs_it_again_and_notifies_again(opened):
    def researcher(request):
        return f"answer to: {request.messages[-1].text}"

    agent = deep([bg("researcher", policy(researcher))])
    rt = await opened(agent)
    await command(agent, "t1", start("researcher", "first question", "s1"))
    task_id = next(iter((await values_of(rt, "t1"))["async_tasks"]))
    await wait_until(lambda: _notes_of(rt, "t1", task_id), what="the first notification")
    await command(agent, "t1", call("update_async_task", {"task_id": task_id, "message": "second question"}, "u1"))
    await wait_until(lambda: _count(_notes_of(rt, "t1", task_id), 2), what="the second notification")
    await quiet(rt, "t1")
    await asyncio.sleep(0.1)
    first, second = await _notes_of(rt, "t1", task_id)
    assert text(first).endswith("Result: answer to: first question")
    assert text(second).endswith("Result: answer to: second question")
    runs = await rt.runs.list(task_id)
    assert len(runs) == 2 and {r["status"] for r in runs} == {"success"}
    assert {first["additional_kwargs"]["task_notification"]["run_id"],
            second["additional_kwargs"]["task_notification"]["run_id"]} == {r["run_id"] for r in runs}
