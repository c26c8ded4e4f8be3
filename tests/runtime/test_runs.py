"""Runs: shapes, ids, errors, create/get/list/wait/join/delete, stateless runs, delays, timeouts, concurrency."""

import asyncio
import time
import uuid
from datetime import datetime

import pytest
from runtime_helpers import contents, echo_agent, eventually, looping_agent, run_status_is, tool_loop, user
from subagent_helpers import wait_until

from backchannel import (
    InvalidRequestError,
    Middleware,
    NotFoundError,
    ScriptedModel,
    ToolRuntime,
    create_agent,
    tool,
)
from backchannel.errors import StorageUnavailableError
from backchannel.runtime import assistant_id_for

RUN_KEYS = {"run_id", "thread_id", "assistant_id", "metadata", "status", "kwargs", "multitask_strategy",
            "created_at", "updated_at"}
ASSISTANT_KEYS = {"assistant_id", "graph_id", "config", "context", "metadata", "name", "created_at", "updated_at",
                  "version", "description"}
AGENT_UUID = "fe096781-5601-53d2-b2f6-0d3403f7e9ca"  # LangGraph's assistant id for graph "agent"


# -- assistants --------------------------------------------------------------------------------------


def test_assistant_ids_are_langgraphs():
    assert assistant_id_for("agent") == AGENT_UUID
    assert assistant_id_for("chat") == "eb6db400-e3c8-5d06-a834-015cb89efe69"
    assert assistant_id_for("hitl") == "d2a02ed8-fb92-5e43-81ea-cb78d82caa2f"
    ns = uuid.UUID("6ba7b821-9dad-11d1-80b4-00c04fd430c8")
    assert assistant_id_for("x") == str(uuid.uuid5(ns, "x"))


async def test_assistants_get_and_search(make_runtime):
    rt = await make_runtime({"agent": echo_agent(), "other": echo_agent(name="Helper")})
    assistant = await rt.assistants.get(AGENT_UUID)
    assert set(assistant) >= ASSISTANT_KEYS
    assert assistant["assistant_id"] == AGENT_UUID and assistant["graph_id"] == "agent"
    assert assistant["metadata"] == {"created_by": "system"}
    assert assistant["name"] == "agent"
    other = await rt.assistants.get(assistant_id_for("other"))
    assert other["name"] == "Helper" and other["graph_id"] == "other"
    assert {a["graph_id"] for a in await rt.assistants.search()} == {"agent", "other"}
    assert [a["graph_id"] for a in await rt.assistants.search(graph_id="other")] == ["other"]
    with pytest.raises(NotFoundError):
        await rt.assistants.get(str(uuid.uuid4()))


# -- run shape and ids -----------------------------------------------------------------------------


async def test_a_runs_kwargs_list_every_argument_in_langgraphs_order_given_or_not(rt):
    """Every argument, read back from a new run, its list, its end and the runs' search, as it was given or as
    its default (a row keeps the unset ones out)."""
    thread = await rt.threads.create()
    plain = await rt.runs.create(thread["thread_id"], "agent", input=user("hi"))
    given = await rt.runs.create(thread["thread_id"], "agent", input=user("again"), stream_resumable=True,
                                 interrupt_before=["tools"], context={"tone": "dry"}, timeout=30)
    defaults = {"input": user("hi"), "command": None, "config": {}, "context": None, "stream_mode": ["values"],
                "stream_subgraphs": False, "stream_resumable": False, "checkpoint_id": None, "temporary": False,
                "timeout": None, "webhook": None, "interrupt_before": None, "interrupt_after": None}
    changed = {**defaults, "input": user("again"), "stream_resumable": True, "interrupt_before": ["tools"],
               "context": {"tone": "dry"}, "timeout": 30}
    await rt.runs.join(thread["thread_id"], given["run_id"])
    listed = {r["run_id"]: r for r in await rt.runs.list(thread["thread_id"])}
    for run, expected in ((plain, defaults), (given, changed)):
        for seen in (run, await rt.runs.get(thread["thread_id"], run["run_id"]), listed[run["run_id"]]):
            assert list(seen["kwargs"].items()) == list(expected.items())


async def test_create_returns_a_pending_langgraph_run(rt):
    thread = await rt.threads.create(metadata={"owner": "ana"})
    run = await rt.runs.create(thread["thread_id"], "agent", input=user("hi"), metadata={"tag": "t1"})
    assert set(run) >= RUN_KEYS
    uuid.UUID(run["run_id"])
    assert run["status"] == "pending"
    assert run["thread_id"] == thread["thread_id"]
    assert run["assistant_id"] == AGENT_UUID
    assert run["multitask_strategy"] == "enqueue"  # LangGraph's default
    assert run["metadata"]["owner"] == "ana" and run["metadata"]["tag"] == "t1"
    assert run["metadata"]["assistant_id"] == AGENT_UUID
    assert run["kwargs"]["input"] == user("hi")
    assert run["kwargs"]["stream_mode"] == ["values"]
    assert "resume_map" not in run["kwargs"]
    await rt.runs.join(thread["thread_id"], run["run_id"])
    done = await rt.runs.get(thread["thread_id"], run["run_id"])
    assert done["status"] == "success"
    assert done["updated_at"] >= done["created_at"]


async def test_runs_accept_the_graph_id_or_the_assistant_uuid(rt):
    thread = await rt.threads.create()
    by_name = await rt.runs.wait(thread["thread_id"], "agent", input=user("a"))
    by_uuid = await rt.runs.wait(thread["thread_id"], AGENT_UUID, input=user("b"))
    assert contents(by_name)[-1] == "echo: a" and contents(by_uuid)[-1] == "echo: b"
    assert {r["assistant_id"] for r in await rt.runs.list(thread["thread_id"])} == {AGENT_UUID}


async def test_not_found_errors(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    with pytest.raises(NotFoundError):
        await rt.runs.create(tid, "nobody", input=user("hi"))
    with pytest.raises(NotFoundError):
        await rt.runs.create(tid, str(uuid.uuid4()), input=user("hi"))
    with pytest.raises(NotFoundError):
        await rt.runs.create(str(uuid.uuid4()), "agent", input=user("hi"))
    with pytest.raises(NotFoundError):
        await rt.runs.create("not-a-uuid", "agent", input=user("hi"))
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await rt.runs.join(tid, str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await rt.runs.cancel(tid, str(uuid.uuid4()))
    with pytest.raises(NotFoundError):
        await rt.runs.delete(tid, "nope")
    with pytest.raises(NotFoundError):
        await rt.runs.list(str(uuid.uuid4()))
    # a run is only found on its own thread
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    other = await rt.threads.create()
    with pytest.raises(NotFoundError):
        await rt.runs.get(other["thread_id"], run["run_id"])
    # nothing was created by the failed calls
    assert len(await rt.runs.list(tid)) == 1


async def test_invalid_arguments(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    with pytest.raises(InvalidRequestError, match="stream_mode"):
        await rt.runs.create(tid, "agent", input=user("hi"), stream_mode="everything")
    with pytest.raises(InvalidRequestError, match="stream_mode"):
        await rt.runs.create(tid, "agent", input=user("hi"), stream_mode=["values", "nope"])
    with pytest.raises(InvalidRequestError, match="multitask_strategy"):
        await rt.runs.create(tid, "agent", input=user("hi"), multitask_strategy="stampede")
    with pytest.raises(InvalidRequestError):
        await rt.runs.create(tid, "agent", input=user("hi"), command={"resume": "yes"})
    with pytest.raises(InvalidRequestError):
        await rt.runs.create(tid, "agent", command={"bogus": 1})
    with pytest.raises(InvalidRequestError):
        await rt.runs.create(tid, "agent", input=user("hi"), if_not_exists="maybe")
    with pytest.raises(InvalidRequestError):
        await rt.runs.create(None, "agent", input=user("hi"), on_completion="archive")
    with pytest.raises(InvalidRequestError, match="thread_id"):
        await rt.runs.create(None, "agent", command={"resume": "yes"})
    with pytest.raises(InvalidRequestError):  # nothing to resume
        await rt.runs.create(tid, "agent", command={"resume": "yes"})
    assert await rt.runs.list(tid) == []
    assert (await rt.threads.get(tid))["status"] == "idle"
    # InvalidRequestError is a ValueError, like the SDK's 422
    assert issubclass(InvalidRequestError, ValueError)


async def test_if_not_exists_create_makes_the_thread(rt):
    tid = str(uuid.uuid4())
    result = await rt.runs.wait(tid, "agent", input=user("hi"), if_not_exists="create", metadata={"m": 1})
    assert contents(result) == ["hi", "echo: hi"]
    thread = await rt.threads.get(tid)
    assert thread["metadata"]["m"] == 1 and thread["metadata"]["graph_id"] == "agent"


async def test_a_thread_made_with_its_run_is_created_when_the_run_is(rt):
    tid = str(uuid.uuid4())
    run = await rt.runs.create(tid, "agent", input=user("hi"), if_not_exists="create", metadata={"m": 1})
    await rt.runs.join(tid, run["run_id"])
    thread = await rt.threads.get(tid)
    assert thread["created_at"] == run["created_at"]
    assert thread["metadata"] == run["metadata"] == {"m": 1, "graph_id": "agent", "assistant_id": AGENT_UUID}
    # The thread's metadata changed later: its run's stays as it was made.
    await rt.threads.update(tid, metadata={"n": 2})
    assert (await rt.runs.get(tid, run["run_id"]))["metadata"] == {"m": 1, "graph_id": "agent",
                                                                   "assistant_id": AGENT_UUID}


# -- list / wait / join / delete ----------------------------------------------------------------------


async def test_list_is_newest_first_with_paging_and_status(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    runs = [await rt.runs.create(tid, "agent", input=user(str(i))) for i in range(4)]
    for run in runs:
        await rt.runs.join(tid, run["run_id"])
    listed = await rt.runs.list(tid)
    assert [r["run_id"] for r in listed] == [r["run_id"] for r in reversed(runs)]
    assert all(set(r) >= RUN_KEYS for r in listed)
    assert [r["run_id"] for r in await rt.runs.list(tid, limit=2, offset=1)] == [runs[2]["run_id"],
                                                                                runs[1]["run_id"]]
    assert len(await rt.runs.list(tid, status="success")) == 4
    assert await rt.runs.list(tid, status="error") == []


async def test_wait_and_join_return_the_final_values(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    waited = await rt.runs.wait(tid, "agent", input=user("hi"))
    assert contents(waited) == ["hi", "echo: hi"]
    assert [m["type"] for m in waited["messages"]] == ["human", "ai"]
    run = await rt.runs.create(tid, "agent", input=user("again"))
    joined = await rt.runs.join(tid, run["run_id"])
    assert contents(joined) == ["hi", "echo: hi", "again", "echo: again"]
    # joining a finished run gives its thread's values again
    assert await rt.runs.join(tid, run["run_id"]) == joined


async def test_a_failing_run(make_runtime):
    behaviour = {"fail": True}

    def reply(request):
        if behaviour["fail"]:
            raise KeyError("boom")
        return "fine"

    rt = await make_runtime({"agent": create_agent(ScriptedModel([reply], loop=True))})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    with pytest.raises(KeyError, match="boom"):
        await rt.runs.wait(tid, "agent", input=user("hi"))
    run = (await rt.runs.list(tid))[0]
    assert run["status"] == "error"
    after = await rt.threads.get(tid)
    assert after["status"] == "error"
    # LangGraph's shape: {"error": <exception type>, "message": ...}
    assert after["error"] == {"error": "KeyError", "message": "'boom'"}
    result = await rt.runs.join(tid, run["run_id"])
    assert result == {"__error__": {"error": "KeyError", "message": "'boom'"}}
    assert await rt.runs.wait(tid, "agent", input=user("x"), raise_error=False) == result
    # a successful run clears the thread's error
    behaviour["fail"] = False
    assert contents(await rt.runs.wait(tid, "agent", input=user("y")))[-1] == "fine"
    after = await rt.threads.get(tid)
    assert after["status"] == "idle" and after["error"] is None


async def test_delete_removes_the_run_and_its_checkpoints(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    first = await rt.runs.create(tid, "agent", input=user("one"))
    await rt.runs.join(tid, first["run_id"])
    second = await rt.runs.create(tid, "agent", input=user("two"))
    await rt.runs.join(tid, second["run_id"])
    assert await rt.runs.delete(tid, second["run_id"]) is None
    with pytest.raises(NotFoundError):
        await rt.runs.get(tid, second["run_id"])
    assert [r["run_id"] for r in await rt.runs.list(tid)] == [first["run_id"]]
    history = await rt.threads.get_history(tid)
    assert all(h["metadata"].get("run_id") != second["run_id"] for h in history)
    assert contents((await rt.threads.get_state(tid))["values"]) == ["one", "echo: one"]


# -- stateless runs -----------------------------------------------------------------------------------


async def test_stateless_wait_leaves_no_thread(rt):
    before = await rt.threads.count()
    result = await rt.runs.wait(None, "agent", input=user("hi"))
    assert contents(result) == ["hi", "echo: hi"]
    assert await rt.threads.count() == before


async def test_stateless_run_deletes_its_thread_when_done(rt):
    run = await rt.runs.create(None, "agent", input=user("hi"))
    assert run["kwargs"]["temporary"] is True
    result = await rt.runs.join(run["thread_id"], run["run_id"])
    assert contents(result) == ["hi", "echo: hi"]
    with pytest.raises(NotFoundError):
        await rt.threads.get(run["thread_id"])


async def test_stateless_run_is_cleaned_up_even_if_nobody_joins(rt):
    run = await rt.runs.create(None, "agent", input=user("hi"))
    tid = run["thread_id"]

    async def gone():
        try:
            await rt.threads.get(tid)
        except NotFoundError:
            return True
        return False

    await eventually(gone)
    assert await rt.threads.count() == 0


async def test_stateless_stream_leaves_no_thread(rt):
    parts = [p async for p in rt.runs.stream(None, "agent", input=user("hi"))]
    assert parts[0].event == "metadata"
    assert contents(parts[-1].data) == ["hi", "echo: hi"]
    assert await rt.threads.count() == 0


async def test_stateless_run_with_on_completion_keep_keeps_the_thread(rt):
    run = await rt.runs.create(None, "agent", input=user("hi"), on_completion="keep")
    assert run["kwargs"]["temporary"] is False
    await rt.runs.join(run["thread_id"], run["run_id"])
    await asyncio.sleep(0.05)
    thread = await rt.threads.get(run["thread_id"])
    assert contents(thread["values"]) == ["hi", "echo: hi"]
    assert len(await rt.threads.get_history(run["thread_id"])) >= 2
    # it is an ordinary thread now
    await rt.runs.wait(run["thread_id"], "agent", input=user("more"))
    assert contents((await rt.threads.get(run["thread_id"]))["values"])[-1] == "echo: more"


# -- scheduling: after_seconds, timeout -----------------------------------------------------------------


async def test_after_seconds_delays_the_start(rt):
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    started = time.monotonic()
    run = await rt.runs.create(tid, "agent", input=user("later"), after_seconds=0.4)
    created_at = datetime.fromisoformat(run["created_at"])
    assert (created_at - datetime.fromisoformat(thread["created_at"])).total_seconds() >= 0.35
    await asyncio.sleep(0.2)
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "pending"
    assert (await rt.threads.get_state(tid))["values"] == {}
    await rt.runs.join(tid, run["run_id"])
    assert time.monotonic() - started >= 0.4
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "success"


async def test_timeout_ends_the_run_with_status_timeout(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=5)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    started = time.monotonic()
    run = await rt.runs.create(tid, "agent", input=user("hi"), timeout=0.1)
    result = await rt.runs.join(tid, run["run_id"])
    assert time.monotonic() - started < 1
    assert (await rt.runs.get(tid, run["run_id"]))["status"] == "timeout"
    assert result["__error__"]["error"] == "TimeoutError"
    assert (await rt.threads.get(tid))["status"] == "error"
    with pytest.raises(Exception, match="TimeoutError"):
        await rt.runs.wait(tid, "agent", input=user("again"), timeout=0.05)
    assert [r["status"] for r in await rt.runs.list(tid)] == ["timeout", "timeout"]


# -- concurrency ----------------------------------------------------------------------------------------


async def test_many_threads_run_concurrently(make_runtime):
    running, most = 0, 0
    release = asyncio.Event()

    @tool
    async def step(i: int) -> str:
        """Some work that waits until the test has seen how many calls are in flight."""
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return "worked"

    rt = await make_runtime({"agent": looping_agent(1, tools=[step])})
    threads = [await rt.threads.create() for _ in range(200)]
    runs = [await rt.runs.create(t["thread_id"], "agent", input=user(f"n{i}")) for i, t in enumerate(threads)]
    # one after the other, a call would never start while another waits: all 200 are in flight at once
    await wait_until(lambda: running == 200, timeout=60, what="all 200 runs in flight at once")
    release.set()
    results = await asyncio.gather(*(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs))
    assert [contents(r)[1:] for r in results] == [["", "worked", "done after 1 steps"]] * 200
    assert {(await rt.runs.get(r["thread_id"], r["run_id"]))["status"] for r in runs} == {"success"}


def _gauge(gate: asyncio.Event | None = None):
    """A tool that records how many of its calls overlap (overall and per thread); its calls wait for ``gate``."""
    seen = {"now": 0, "max": 0, "per_thread": {}, "max_per_thread": 0, "calls": 0}

    @tool
    async def work(i: int, runtime: ToolRuntime) -> str:
        """Do some work."""
        seen["now"] += 1
        seen["calls"] += 1
        per = seen["per_thread"]
        per[runtime.thread_id] = per.get(runtime.thread_id, 0) + 1
        seen["max"] = max(seen["max"], seen["now"])
        seen["max_per_thread"] = max(seen["max_per_thread"], per[runtime.thread_id])
        await asyncio.sleep(0.02)
        if gate is not None:
            await gate.wait()
        per[runtime.thread_id] -= 1
        seen["now"] -= 1
        return "worked"

    return work, seen


async def test_max_concurrency_bounds_the_runs_in_flight(make_runtime):
    gate = asyncio.Event()
    work, seen = _gauge(gate)
    agent = create_agent(ScriptedModel([tool_loop(1, "work")], loop=True), [work])
    rt = await make_runtime({"agent": agent}, max_concurrency=4)
    threads = [await rt.threads.create() for _ in range(20)]
    runs = [await rt.runs.create(t["thread_id"], "agent", input=user("go")) for t in threads]
    # the first four runs hold their calls open: four are in flight, and no fifth starts meanwhile
    await wait_until(lambda: seen["now"] == 4, timeout=60, what="four runs in flight")
    await asyncio.sleep(0.5)
    gate.set()
    await asyncio.gather(*(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs))
    assert seen["calls"] == 20
    assert seen["max"] == 4  # reached, never exceeded


async def test_one_run_per_thread_at_a_time(make_runtime):
    work, seen = _gauge()
    agent = create_agent(ScriptedModel([tool_loop(2, "work")], loop=True), [work])
    rt = await make_runtime({"agent": agent})
    threads = [await rt.threads.create() for _ in range(3)]
    runs = [await rt.runs.create(t["thread_id"], "agent", input=user(f"go {k}"), multitask_strategy="enqueue")
            for t in threads for k in range(3)]
    await asyncio.gather(*(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs))
    assert seen["calls"] == 18
    assert seen["max_per_thread"] == 1
    assert seen["max"] > 1  # different threads did overlap
    for t in threads:
        values = (await rt.threads.get_state(t["thread_id"]))["values"]
        humans = [m["content"] for m in values["messages"] if m["type"] == "human"]
        assert humans == ["go 0", "go 1", "go 2"]
        assert sum(m["type"] == "tool" for m in values["messages"]) == 6


async def test_runs_on_one_thread_keep_their_tool_results_in_order(make_runtime):
    rt = await make_runtime({"agent": looping_agent(3)})
    thread = await rt.threads.create()
    result = await rt.runs.wait(thread["thread_id"], "agent", input=user("go"))
    assert contents(result) == ["go", "", "step 1 ok", "", "step 2 ok", "", "step 3 ok", "done after 3 steps"]
    tool_messages = [m for m in result["messages"] if m["type"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_t1_s1", "call_t1_s2", "call_t1_s3"]


async def test_reject_is_only_for_busy_threads(rt):
    thread = await rt.threads.create()
    result = await rt.runs.wait(thread["thread_id"], "agent", input=user("hi"), multitask_strategy="reject")
    assert contents(result)[-1] == "echo: hi"
    assert [r["status"] for r in await rt.runs.list(thread["thread_id"])] == ["success"]


async def test_wait_returns_the_run_s_own_end_state_with_runs_queued_behind_it(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=0.02)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    a, b = await asyncio.gather(rt.runs.wait(tid, "agent", input=user("a")),
                                rt.runs.wait(tid, "agent", input=user("b")))
    # Which of two concurrent submissions is stored first is up to the store (a network round trip
    # each on Postgres); whichever ran first returns its own end state, not the next run's input.
    first, second = (a, b) if contents(a)[0] == "a" else (b, a)
    assert len(contents(first)) == 2 and contents(first)[1] == f"echo: {contents(first)[0]}"
    assert contents(second)[:2] == contents(first) and len(contents(second)) == 4
    assert sorted(contents(second)[::2]) == ["a", "b"]


async def test_create_batch_and_cancel_many_for_embedded_callers(make_runtime):
    rt = await make_runtime({"agent": echo_agent(), "slow": echo_agent(latency=5.0)})
    done, slow = await rt.runs.create_batch([{"assistant_id": "agent", "input": user("a"), "on_completion": "keep"},
                                             {"assistant_id": "slow", "input": user("b"), "on_completion": "keep"}])
    assert contents(await rt.runs.join(done["thread_id"], done["run_id"]))[-1] == "echo: a"
    with pytest.raises(InvalidRequestError, match=r"payloads\[0\]: a batch makes stateless runs"):
        await rt.runs.create_batch([{"assistant_id": "agent", "thread_id": slow["thread_id"]}])
    with pytest.raises(TypeError, match=r"payloads\[0\]"):
        await rt.runs.create_batch([{"assistant_id": "agent", "inptu": user("typo")}])
    await eventually(lambda: run_status_is(rt, slow["thread_id"], slow["run_id"], "running"))
    await rt.runs.cancel_many(status="all")
    await eventually(lambda: run_status_is(rt, slow["thread_id"], slow["run_id"], "interrupted"))
    with pytest.raises(NotFoundError):
        await rt.runs.cancel_many(status="all")
    with pytest.raises(InvalidRequestError, match="status"):
        await rt.runs.cancel_many(status="finished")
    with pytest.raises(InvalidRequestError):
        await rt.runs.cancel_many(thread_id=slow["thread_id"])  # which of its runs?


async def test_an_on_end_hook_sees_the_runs_last_step_stored(make_runtime):
    """A run's last step is stored with its end, but a hook told of the end (which may tell others what the run
    did) is called once that step is stored; only a middleware that says it stores the step itself is not."""
    seen = {}

    class Reporter(Middleware):
        async def on_end(self, state, ctx, result):
            seen[ctx.run_id] = (await storage.head_checkpoint(ctx.thread_id)).next

    class Quiet(Middleware):
        on_end_stores_last_step = True

        async def on_end(self, state, ctx, result):
            seen[ctx.run_id] = (await storage.head_checkpoint(ctx.thread_id)).next

    rt = await make_runtime({"reporting": echo_agent(middleware=[Reporter()]),
                             "quiet": echo_agent(middleware=[Quiet()])})
    storage = rt.storage
    reported = await rt.runs.create(str(uuid.uuid4()), "reporting", input=user("hi"), if_not_exists="create")
    quiet = await rt.runs.create(str(uuid.uuid4()), "quiet", input=user("hi"), if_not_exists="create")
    for run in (reported, quiet):
        await rt.runs.join(run["thread_id"], run["run_id"])
    assert seen == {reported["run_id"]: "", quiet["run_id"]: "before_agent"}  # the last step's, or the input's


async def test_a_run_failing_after_its_last_step_records_the_step_with_its_error_once_the_database_takes_it(
        make_runtime):
    """A run that fails after its last step (an ``on_end`` that stores nothing itself raising) records that step with
    its error; a database that refuses the end first gets both, later, together."""

    class Failing(Middleware):
        on_end_stores_last_step = True

        async def on_end(self, state, ctx, result):
            raise RuntimeError("the report could not be sent")

    rt = await make_runtime({"agent": echo_agent(middleware=[Failing()])})
    storage = rt.storage
    finish_run, refused = storage.finish_run, []

    async def refused_once(end):
        if not refused:
            refused.append(end)
            raise StorageUnavailableError("the disk is full")
        return await finish_run(end)

    storage.finish_run = refused_once
    tid = str(uuid.uuid4())
    run = await rt.runs.create(tid, "agent", input=user("hi"), if_not_exists="create")
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "error"))
    [end] = refused
    assert (end.status, end.checkpoint.row.next) == ("error", "")
    state = await rt.threads.get_state(tid)
    assert contents(state["values"]) == ["hi", "echo: hi"]
    assert [h["metadata"]["step"] for h in reversed(await rt.threads.get_history(tid))] == [-1, 0]


@pytest.mark.parametrize("action", ["interrupt", "rollback"])
async def test_a_run_cancelled_while_its_last_step_waits_for_the_end_keeps_or_drops_that_step_with_it(
        make_runtime, action):
    """A run cancelled after its last step was made but before its end was written (an ``on_end`` that stores the
    step itself, still busy): ``interrupt`` keeps the step, written with the run's end; ``rollback`` drops it with
    the run."""
    reporting, slow = asyncio.Event(), []

    class SlowReport(Middleware):
        on_end_stores_last_step = True

        async def on_end(self, state, ctx, result):
            if slow:
                reporting.set()
                await asyncio.sleep(60)

    rt = await make_runtime({"agent": echo_agent(middleware=[SlowReport()])})
    tid = str(uuid.uuid4())
    await rt.runs.wait(tid, "agent", input=user("first"), if_not_exists="create")  # what a rollback returns to
    slow.append(True)
    run = await rt.runs.create(tid, "agent", input=user("hi"))
    await asyncio.wait_for(reporting.wait(), 10)
    await rt.runs.cancel(tid, run["run_id"], action=action, wait=True)
    state = await rt.threads.get_state(tid)
    history = await rt.threads.get_history(tid)
    if action == "interrupt":
        assert (await rt.runs.get(tid, run["run_id"]))["status"] == "interrupted"
        assert contents(state["values"]) == ["first", "echo: first", "hi", "echo: hi"]
        assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0, 1, 2]
    else:
        assert run["run_id"] not in [r["run_id"] for r in await rt.runs.list(tid)]
        assert contents(state["values"]) == ["first", "echo: first"]
        assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0]
    assert state["next"] == [] and (await rt.threads.get(tid))["status"] == "idle"


async def test_a_runs_last_step_whose_parent_was_deleted_meanwhile_is_stored_whole_with_its_end(make_runtime):
    """A run's last step follows a checkpoint of the run before it (the run made none of its own first), and that
    run is deleted while the step waits for the end: the step goes in holding the whole state, then the end."""
    rt = await make_runtime({"agent": echo_agent()})
    storage = rt.storage
    tid = str(uuid.uuid4())
    first = await rt.runs.wait(tid, "agent", input=user("hi"), if_not_exists="create")
    [done] = await rt.runs.list(tid)
    ending, finish_run = asyncio.Event(), storage.finish_run

    async def held_back(end):
        await ending.wait()
        return await finish_run(end)

    storage.finish_run = held_back
    again = await rt.runs.create(tid, "agent", command={"goto": "model"})  # no checkpoint before its step
    await eventually(lambda: run_status_is(rt, tid, again["run_id"], "running"))
    await asyncio.sleep(0.05)
    await rt.runs.delete(tid, done["run_id"])
    ending.set()
    values = await asyncio.wait_for(rt.runs.join(tid, again["run_id"]), 5)
    assert contents(values) == [*contents(first), "echo: hi"]
    assert (await rt.runs.get(tid, again["run_id"]))["status"] == "success"
    [stored] = await rt.threads.get_history(tid)
    assert stored["values"] == values and stored["next"] == []
