"""The agent: entry points, parallel tools, the iteration limit, cancellation and interrupts."""

import asyncio
import contextlib
import time

import pytest
from subagent_helpers import stack_looker

from backchannel import (
    HumanMessage,
    Interrupt,
    MaxIterationsError,
    ScriptedModel,
    ToolMessage,
    after_agent,
    after_model,
    before_agent,
    before_model,
    create_agent,
    interrupt,
    tool,
    wrap_tool_call,
)
from backchannel.agent import initial_state
from backchannel.context import RunContext
from backchannel.events import EventBus


def call(name, args=None, id="call_1"):
    return {"name": name, "args": args or {}, "id": id}


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def calc_agent(**kw):
    return create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 2, "b": 3})]}, "5"]), [add], **kw)


# -- entry points ------------------------------------------------------------------------


def test_invoke_runs_to_the_final_answer():
    state = calc_agent().invoke("2+3?")
    assert [m.type for m in state["messages"]] == ["human", "ai", "tool", "ai"]
    assert state["messages"][2].text == "5"
    assert state["messages"][-1].text == "5"


async def test_ainvoke_accepts_the_usual_input_forms():
    for given in ["hi", ("user", "hi"), {"role": "user", "content": "hi"}, [HumanMessage("hi")],
                  {"messages": [("user", "hi")]}]:
        state = await create_agent(ScriptedModel(["hello"])).ainvoke(given)
        assert [(m.type, m.text) for m in state["messages"]] == [("human", "hi"), ("ai", "hello")], given


async def test_ainvoke_keeps_extra_input_keys():
    state = await create_agent(ScriptedModel(["ok"])).ainvoke({"messages": ["hi"], "user": "u1"})
    assert state["user"] == "u1"


async def test_named_agent_names_its_messages():
    state = await create_agent(ScriptedModel(["hi"]), name="bot").ainvoke("x")
    assert state["messages"][-1].name == "bot"


async def test_model_settings_and_messages_reach_the_model():
    model = ScriptedModel(["ok"])
    model.record = True
    await create_agent(model, [add], system_prompt="Be terse.", model_settings={"temperature": 0}).ainvoke("hi")
    [req] = model.requests
    assert req.system_prompt == "Be terse."
    assert dict(req.settings) == {"temperature": 0}
    assert [m.text for m in req.messages] == ["hi"]
    assert [t.name for t in req.tools] == ["add"]


async def test_astream_yields_events_then_exposes_the_result():
    stream = calc_agent().astream("2+3?")
    with pytest.raises(RuntimeError, match="has not finished"):
        _ = stream.result
    events = [e async for e in stream]
    assert events and events[-1].type == "lifecycle"
    assert stream.result["messages"][-1].text == "5"


def test_stream_is_the_sync_astream():
    events = list(calc_agent().stream("2+3?"))
    assert events[0].data["event"] == "started" and events[-1].data["event"] == "completed"
    assert any(e.type == "tool" and e.data["event"] == "finished" for e in events)


async def test_invoke_inside_a_running_loop_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"inside an event loop.*await agent\.ainvoke"):
        calc_agent().invoke("hi")
    with pytest.raises(RuntimeError, match=r"await agent\.astream"):
        next(calc_agent().stream("hi"))


def test_model_from_an_unknown_provider_string_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model provider"):
        create_agent("nosuch:model").invoke("hi")


def test_max_iterations_must_be_positive():
    with pytest.raises(ValueError, match="max_iterations"):
        create_agent(ScriptedModel([]), max_iterations=0)


async def test_thread_id_without_a_runtime_is_a_clear_error():
    with pytest.raises(RuntimeError, match="no runtime"):
        await create_agent(ScriptedModel(["x"])).ainvoke("hi", thread_id="t1")


async def test_agent_is_reusable_and_runs_do_not_share_state():
    agent = create_agent(ScriptedModel(["one", "two"]))
    first = await agent.ainvoke("a")
    second = await agent.ainvoke("b")
    assert [m.text for m in first["messages"]] == ["a", "one"]
    assert [m.text for m in second["messages"]] == ["b", "two"]


async def test_a_single_tool_call_is_awaited_by_the_run_with_no_frame_between():
    """A thousand live subagents each waiting on a tool hold each frame between the run and the tool a thousand
    times; without wrap_tool_call middleware there is none."""
    look, stack = stack_looker("seen")
    state = await create_agent(ScriptedModel([{"tool_calls": [{"name": "look", "args": {}, "id": "c1"}]}, "ok"]),
                               [look]).ainvoke("hi")
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["seen"]
    assert stack[:3] == ["stack_looker.<locals>.look", "Agent._tool_call", "Agent._loop"]


# -- parallel tool calls --------------------------------------------------------------------


@tool
async def nap(label: str) -> str:
    """Sleep a little."""
    await asyncio.sleep(0.2)
    return f"rested {label}"


async def test_parallel_async_tool_calls_run_concurrently():
    agent = create_agent(
        ScriptedModel([{"tool_calls": [call("nap", {"label": "a"}, "c1"), call("nap", {"label": "b"}, "c2")]},
                       "done"]), [nap])
    t0 = time.perf_counter()
    state = await agent.ainvoke("go")
    elapsed = time.perf_counter() - t0
    assert elapsed < 0.35, f"tools ran one after the other ({elapsed:.2f}s)"
    tool_msgs = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    # results keep the order of the calls
    assert [(m.tool_call_id, m.text) for m in tool_msgs] == [("c1", "rested a"), ("c2", "rested b")]


async def test_parallel_sync_tool_calls_run_concurrently():
    @tool
    def block(label: str) -> str:
        """Block a thread."""
        time.sleep(0.2)
        return label

    agent = create_agent(
        ScriptedModel([{"tool_calls": [call("block", {"label": "a"}, "c1"), call("block", {"label": "b"}, "c2")]},
                       "done"]), [block])
    t0 = time.perf_counter()
    await agent.ainvoke("go")
    assert time.perf_counter() - t0 < 0.35


async def test_a_failing_parallel_tool_never_cancels_its_sibling():
    finished = []

    @tool
    async def fail_fast() -> str:
        """Fails at once."""
        raise RuntimeError("broken")

    @tool
    async def slow_ok() -> str:
        """Succeeds later."""
        await asyncio.sleep(0.1)
        finished.append(True)
        return "slow result"

    agent = create_agent(
        ScriptedModel([{"tool_calls": [call("fail_fast", {}, "c_fail"), call("slow_ok", {}, "c_ok")]}, "done"]),
        [fail_fast, slow_ok])
    state = await agent.ainvoke("go")
    results = {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}
    assert results["c_fail"].status == "error" and "broken" in results["c_fail"].text
    assert results["c_ok"].status == "success" and results["c_ok"].text == "slow result"
    assert finished == [True]
    assert state["messages"][-1].text == "done"


# -- the iteration limit --------------------------------------------------------------------


async def test_exceeding_max_iterations_raises():
    model = ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}], loop=True)
    agent = create_agent(model, [add], max_iterations=3)
    with pytest.raises(MaxIterationsError, match="limit of 3 model calls") as err:
        await agent.ainvoke("loop forever")
    assert err.value.limit == 3
    assert model.calls == 3


async def test_max_iterations_counts_model_calls_not_tool_calls():
    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "2"]), [add],
                         max_iterations=2)
    state = await agent.ainvoke("go")
    assert state["messages"][-1].text == "2"


# -- cancellation ----------------------------------------------------------------------------


async def _cancel_after(task, delay=0.05):
    await asyncio.sleep(delay)
    t0 = time.perf_counter()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.perf_counter() - t0


async def test_cancel_during_a_slow_model_call_stops_promptly():
    model = ScriptedModel(["too late"], latency=5)
    task = asyncio.create_task(create_agent(model).ainvoke("hi"))
    assert await _cancel_after(task) < 1.0  # against 5 s of work


async def test_cancel_during_a_slow_tool_stops_promptly():
    cancelled = []

    @tool
    async def crawl() -> str:
        """Slow."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("crawl")]}, "never"]), [crawl])
    task = asyncio.create_task(agent.ainvoke("hi"))
    assert await _cancel_after(task) < 1.0  # against 5 s of work
    assert cancelled == [True]


async def test_cancel_during_parallel_tools_cancels_them_all():
    cancelled = []

    @tool
    async def crawl(n: int) -> str:
        """Slow."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(n)
            raise
        return "never"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("crawl", {"n": 1}, "a"), call("crawl", {"n": 2}, "b")]}]),
                         [crawl])
    task = asyncio.create_task(agent.ainvoke("hi"))
    assert await _cancel_after(task) < 1.0  # against 5 s of work
    assert sorted(cancelled) == [1, 2]


@pytest.mark.parametrize("where", ["model", "tool"])
async def test_cancelled_run_reports_a_cancelled_lifecycle_event(where):
    run_task = []

    @before_agent
    def remember_task(state, ctx):
        run_task.append(asyncio.current_task())  # hooks run in the run's own task

    @tool
    async def crawl() -> str:
        """Slow."""
        await asyncio.sleep(5)
        return "never"

    script = ["too late"] if where == "model" else [{"tool_calls": [call("crawl")]}, "never"]
    model = ScriptedModel(script, latency=5 if where == "model" else 0)
    agent = create_agent(model, [crawl], name="worker", middleware=[remember_task])
    events = []
    t0 = None
    with pytest.raises(asyncio.CancelledError):
        async for e in agent.astream("hi"):
            events.append(e)
            slow_part_started = (e.type == "message" and e.data["event"] == "start") if where == "model" \
                else (e.type == "tool" and e.data["event"] == "started")
            if slow_part_started:
                await asyncio.sleep(0.02)
                t0 = time.perf_counter()
                run_task[0].cancel()
    assert time.perf_counter() - t0 < 1.0  # against 5 s of work
    life = [e.data for e in events if e.type == "lifecycle"]
    assert [d["event"] for d in life] == ["started", "cancelled"]
    assert life[-1]["graph_name"] == "worker"
    assert events[-1].type == "lifecycle"


async def test_leaving_astream_early_cancels_the_run():
    cancelled = asyncio.Event()

    @tool
    async def crawl() -> str:
        """Slow."""
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("crawl")]}, "never"]), [crawl])
    t0 = time.perf_counter()
    async with contextlib.aclosing(agent.astream("hi").__aiter__()) as events:
        async for e in events:
            if e.type == "tool" and e.data["event"] == "started":
                break
    await asyncio.wait_for(cancelled.wait(), 1.0)
    assert time.perf_counter() - t0 < 1.0  # against 5 s of work


# -- interrupts --------------------------------------------------------------------------------


async def test_interrupt_in_a_tool_ends_ainvoke_with_the_interrupt():
    @tool
    def deploy(env: str) -> str:
        """Deploy."""
        answer = interrupt({"question": f"deploy to {env}?"})
        return f"deployed: {answer}"

    model = ScriptedModel([{"tool_calls": [call("deploy", {"env": "prod"})]}, "never"])
    state = await create_agent(model, [deploy]).ainvoke("ship it")
    [paused] = state["__interrupt__"]
    assert isinstance(paused, Interrupt)
    assert paused.value == {"question": "deploy to prod?"}
    assert isinstance(paused.id, str) and paused.id
    assert model.calls == 1
    assert not any(isinstance(m, ToolMessage) for m in state["messages"])


async def test_interrupt_in_a_hook_ends_ainvoke_with_the_interrupt():
    @before_model
    def ask_first(state, ctx):
        interrupt("may I call the model?")

    model = ScriptedModel(["never"])
    state = await create_agent(model, middleware=[ask_first]).ainvoke("hi")
    assert [i.value for i in state["__interrupt__"]] == ["may I call the model?"]
    assert model.calls == 0


async def test_interrupt_in_wrap_tool_call_ends_ainvoke_with_the_interrupt():
    @wrap_tool_call
    async def approve(request, handler):
        decision = interrupt({"tool": request.call["name"]})
        return await handler(request) if decision == "yes" else ToolMessage("rejected", request.call["id"])

    state = await create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}]), [add],
                               middleware=[approve]).ainvoke("hi")
    assert [i.value for i in state["__interrupt__"]] == [{"tool": "add"}]


async def test_interrupted_run_is_reported_and_skips_after_agent():
    after = []

    @after_model
    def review(state, ctx):
        interrupt("review the reply")

    @after_agent
    def done(state, ctx):
        after.append(True)

    stream = create_agent(ScriptedModel(["draft"]), middleware=[done, review]).astream("hi")
    events = [e async for e in stream]
    assert after == []
    assert [e.data["event"] for e in events if e.type == "lifecycle"] == ["started", "interrupted"]
    assert [e for e in events if e.type == "interrupt"]
    assert [i.value for i in stream.result["__interrupt__"]] == ["review the reply"]


async def test_interrupt_without_a_run_is_a_clear_error():
    with pytest.raises(RuntimeError, match="only be called while an agent runs"):
        interrupt("hello")


@pytest.mark.parametrize("parallel", [False, True])
async def test_a_tool_interrupt_resumes_with_the_answer(parallel):
    runs = []

    @tool
    def deploy(env: str) -> str:
        """Deploy."""
        runs.append(env)
        return f"{env}: {interrupt(f'deploy to {env}?')}"

    calls = [call("deploy", {"env": "prod"}, "c1")]
    if parallel:
        calls.append(call("add", {"a": 1, "b": 1}, "c2"))
    model = ScriptedModel([{"tool_calls": calls}, "shipped"])
    agent = create_agent(model, [deploy, add])
    state = initial_state("ship it")
    first = await agent.run(state, RunContext("agent", "run-1"))
    assert first.status == "interrupted"
    [paused] = first.interrupts
    assert first.stage, "an interrupted run must say where to continue"

    resumed = await agent.run(state, RunContext("agent", "run-2", resume={paused.id: "approved"}),
                              stage=first.stage)
    assert resumed.status == "success"
    tool_msgs = {m.tool_call_id: m.text for m in state["messages"] if isinstance(m, ToolMessage)}
    assert tool_msgs["c1"] == "prod: approved"
    assert state["messages"][-1].text == "shipped"
    assert runs == ["prod", "prod"]  # the tool ran again and got the answer
    assert model.calls == 2


async def test_a_hook_interrupt_resumes_at_the_hook():
    @before_model
    def gate(state, ctx):
        if interrupt("allow?") != "yes":
            return {"jump_to": "end"}

    model = ScriptedModel(["allowed"])
    agent = create_agent(model, middleware=[gate])
    state = initial_state("hi")
    first = await agent.run(state, RunContext("agent", "r1"))
    assert first.stage == "before_model:0"
    second = await agent.run(state, RunContext("agent", "r2", resume={first.interrupts[0].id: "yes"}),
                             stage=first.stage)
    assert second.status == "success"
    assert state["messages"][-1].text == "allowed"


async def test_interrupt_ids_are_stable_across_replays():
    @tool
    def ask_twice() -> str:
        """Ask."""
        return f"{interrupt('first?')} {interrupt('second?')}"

    def make():
        return create_agent(ScriptedModel([{"tool_calls": [call("ask_twice", {}, "c1")]}, "done"]), [ask_twice])

    agent = make()
    state = initial_state("go")
    first = await agent.run(state, RunContext("agent", "r1"))
    first_id = first.interrupts[0].id
    again = await make().run(initial_state("go"), RunContext("agent", "r9"))
    assert again.interrupts[0].id == first_id
    # answering the first exposes the second, with a different id
    second = await agent.run(state, RunContext("agent", "r2", resume={first_id: "a"}), stage=first.stage)
    assert second.status == "interrupted"
    assert second.interrupts[0].value == "second?" and second.interrupts[0].id != first_id


async def test_interrupt_ids_are_those_paused_runs_stored_before():
    # A run paused by an older version resumes with the ids it stored: the id of a tool call's n-th interrupt is
    # sha1("tool:<call id>#<n>"), its first 32 hex digits.
    @tool
    def ask_twice() -> str:
        """Ask."""
        return f"{interrupt('first?')} {interrupt('second?')}"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("ask_twice", {}, "c1")]}, "done"]), [ask_twice])
    state = initial_state("go")
    first = await agent.run(state, RunContext("agent", "r1"))
    second = await agent.run(state, RunContext("agent", "r2", resume={first.interrupts[0].id: "a"}), stage=first.stage)
    assert [first.interrupts[0].id, second.interrupts[0].id] == ["c1fb9bd9bfb18e3e89ee71d75378494c",
                                                                  "fd8532fd499baf294a8c942bd52d831a"]


async def test_run_emits_to_a_given_bus_with_its_thread_and_run_ids():
    bus = EventBus()
    got = []
    bus.subscribe(got.append)
    await create_agent(ScriptedModel(["x"])).run(initial_state("hi"), RunContext("agent", "run-7", thread_id="t-7",
                                                                                 bus=bus))
    assert got and {(e.thread_id, e.run_id) for e in got} == {("t-7", "run-7")}
