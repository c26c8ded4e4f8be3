"""Streaming: each LangGraph stream mode, subgraph naming, errors, and joining a stream (replay, Last-Event-ID)."""

import asyncio
import tracemalloc

import orjson
import pytest
from runtime_helpers import contents, echo_agent, eventually, run_status_is, tool_loop, user

from backchannel import ScriptedModel, ToolMessage, ToolRuntime, create_agent, tool
from backchannel.hitl import HumanInTheLoop
from backchannel.models.base import ChatModel, FinishDelta, TextDelta, ToolCallDelta


@tool
async def lookup(query: str, runtime: ToolRuntime) -> str:
    """Look something up, reporting progress."""
    runtime.emit({"progress": f"looking up {query}"})
    return f"found {query}"


@tool
async def broken(query: str) -> str:
    """Always fails."""
    raise ValueError("the lookup service is down")


def _tool_then_answer(tool_name: str = "lookup"):
    def reply(request):
        if isinstance(request.messages[-1], ToolMessage):
            return "the answer is forty two"
        return {"tool_calls": [{"name": tool_name, "args": {"query": "meaning"}, "id": "call_1"}]}

    return reply


@pytest.fixture
async def trt(make_runtime):
    """A runtime whose agent calls ``lookup`` once, then answers in several words."""
    agent = create_agent(ScriptedModel([_tool_then_answer()], loop=True), [lookup, broken])
    return await make_runtime({"agent": agent, "echo": echo_agent()})


async def _stream(rt, mode, **kwargs):
    thread = await rt.threads.create()
    parts = [p async for p in rt.runs.stream(thread["thread_id"], kwargs.pop("assistant", "agent"),
                                             input=user(kwargs.pop("text", "what is it?")),
                                             stream_mode=mode, **kwargs)]
    return thread["thread_id"], parts


def _of(parts, event):
    return [p.data for p in parts if p.event == event]


# -- values / updates ---------------------------------------------------------------------------------


async def test_values_stream_full_states_from_input_to_final(trt):
    tid, parts = await _stream(trt, "values")
    assert parts[0].event == "metadata"
    assert set(parts[0].data) == {"run_id", "attempt"} and parts[0].data["attempt"] == 1
    assert {p.event for p in parts[1:]} == {"values"}
    states = _of(parts, "values")
    assert contents(states[0]) == ["what is it?"]
    assert [len(s["messages"]) for s in states] == [1, 2, 3, 4]
    assert contents(states[-1]) == ["what is it?", "", "found meaning", "the answer is forty two"]
    assert states[-1] == (await trt.threads.get_state(tid))["values"]
    assert parts[0].data["run_id"] == (await trt.runs.list(tid))[0]["run_id"]


async def test_updates_stream_what_each_node_returned(trt):
    _, parts = await _stream(trt, "updates")
    updates = _of(parts, "updates")
    assert [list(u) for u in updates] == [["model"], ["tools"], ["model"]]
    assert updates[0]["model"]["messages"][0]["tool_calls"][0]["name"] == "lookup"
    tool_message = updates[1]["tools"]["messages"][0]
    assert tool_message["type"] == "tool" and tool_message["content"] == "found meaning"
    assert updates[2]["model"]["messages"][0]["content"] == "the answer is forty two"


async def test_several_modes_at_once(trt):
    _, parts = await _stream(trt, ["values", "updates", "custom"])
    assert [p.event for p in parts] == ["metadata", "values", "updates", "values", "custom", "updates", "values",
                                        "updates", "values"]


# -- messages ------------------------------------------------------------------------------------------


async def test_messages_tuple_streams_chunks_with_metadata(trt):
    tid, parts = await _stream(trt, "messages-tuple")
    assert {p.event for p in parts[1:]} == {"messages"}
    pairs = _of(parts, "messages")
    for _chunk, meta in pairs:
        assert meta["thread_id"] == tid and meta["run_id"] == parts[0].data["run_id"]
        assert "langgraph_node" in meta
    chunks = [c for c, m in pairs if c["type"] == "AIMessageChunk"]
    final_id = chunks[-1]["id"]
    text = "".join(c["content"] for c in chunks if c["id"] == final_id)
    assert text == "the answer is forty two"
    assert len([c for c in chunks if c["id"] == final_id and c["content"]]) > 1  # really streamed in pieces
    assert chunks[-1]["chunk_position"] == "last"
    assert all(m["langgraph_node"] == "model" for c, m in pairs if c["type"] == "AIMessageChunk")
    # the tool call arrives as tool call chunks
    call_chunks = [tc for c in chunks for tc in c["tool_call_chunks"]]
    assert call_chunks[0]["name"] == "lookup" and call_chunks[0]["id"] == "call_1"
    assert "".join(tc["args"] for tc in call_chunks) == '{"query": "meaning"}'
    # tool results come whole
    tools = [(c, m) for c, m in pairs if c["type"] == "tool"]
    assert [c["content"] for c, _ in tools] == ["found meaning"]
    assert tools[0][1]["langgraph_node"] == "tools"
    # and the final state has the same message ids
    final = (await trt.threads.get_state(tid))["values"]["messages"]
    assert final_id == final[-1]["id"]


async def test_messages_mode_streams_partials_and_completes(trt):
    _, parts = await _stream(trt, "messages")
    events = [p.event for p in parts[1:]]
    assert set(events) <= {"messages/metadata", "messages/partial", "messages/complete"}
    partials = [p.data[0] for p in parts if p.event == "messages/partial"]
    final_id = partials[-1]["id"]
    texts = [m["content"] for m in partials if m["id"] == final_id]
    assert texts[-1] == "the answer is forty two"
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # each partial holds all so far
    assert len(set(texts)) > 2
    assert all(m["type"] == "ai" for m in partials)
    # metadata comes first for each message id
    first_meta = events.index("messages/metadata")
    assert first_meta < events.index("messages/partial")
    metas = [p.data for p in parts if p.event == "messages/metadata"]
    assert any(final_id in m for m in metas)
    completes = [p.data[0] for p in parts if p.event == "messages/complete"]
    assert [m["content"] for m in completes] == ["found meaning"]
    assert completes[0]["type"] == "tool"


# -- custom / tools / lifecycle / checkpoints ----------------------------------------------------------------


async def test_custom_stream_carries_what_tools_emit(trt):
    _, parts = await _stream(trt, "custom")
    assert _of(parts, "custom") == [{"progress": "looking up meaning"}]


async def test_tools_stream_starts_and_finishes(trt):
    _, parts = await _stream(trt, "tools")
    started, finished = _of(parts, "tools")
    assert started == {"event": "tool-started", "tool_call_id": "call_1", "tool_name": "lookup",
                       "input": {"query": "meaning"}}
    assert finished["event"] == "tool-finished" and finished["tool_call_id"] == "call_1"
    assert finished["output"]["type"] == "tool" and finished["output"]["content"] == "found meaning"


async def test_tools_stream_reports_errors(make_runtime):
    agent = create_agent(ScriptedModel([_tool_then_answer("broken")], loop=True), [broken])
    rt = await make_runtime({"agent": agent})
    _, parts = await _stream(rt, "tools")
    started, failed = _of(parts, "tools")
    assert started["event"] == "tool-started"
    assert failed["event"] == "tool-error" and failed["tool_call_id"] == "call_1"
    assert "the lookup service is down" in failed["message"]


async def test_lifecycle_stream(trt):
    _, parts = await _stream(trt, "lifecycle")
    events = _of(parts, "lifecycle")
    assert [e["event"] for e in events] == ["started", "completed"]
    assert all(e["graph_name"] == "agent" and e["namespace"] == [] for e in events)


async def test_checkpoints_stream_one_per_step(trt):
    tid, parts = await _stream(trt, "checkpoints")
    checkpoints = _of(parts, "checkpoints")
    history = list(reversed(await trt.threads.get_history(tid)))
    streamed_ids = [c["config"]["configurable"]["checkpoint_id"] for c in checkpoints]
    assert streamed_ids == [h["checkpoint_id"] for h in history][-len(streamed_ids):]
    assert len(streamed_ids) == 3  # model, tools, model
    assert [c["metadata"]["source"] for c in checkpoints] == ["loop"] * 3
    # next names the node the run goes on to (the last one's is settled when the run ends)
    assert [c["next"] for c in checkpoints[:2]] == [["tools"], ["model"]]
    for c, h in zip(checkpoints, history[-3:]):
        assert c["values"] == h["values"]
        assert c["config"]["configurable"]["thread_id"] == tid
    assert checkpoints[1]["parent_config"]["configurable"]["checkpoint_id"] == streamed_ids[0]


async def test_a_runs_last_step_is_shown_live_and_its_checkpoint_once_stored_with_the_runs_end(make_runtime):
    """A run's last step is stored with its end, in one transaction. Until then its values stream live (as every
    step's do, and its tokens before them), but nothing says it is stored: the thread's state is still the one
    before it, and its checkpoint is streamed only once the end has stored it."""
    rt = await make_runtime({"echo": echo_agent()})
    storage = rt.storage
    ending, finish_run = asyncio.Event(), storage.finish_run

    async def held_back(end):
        await ending.wait()
        return await finish_run(end)

    storage.finish_run = held_back
    tid = (await rt.threads.create())["thread_id"]
    stored = []
    async for part in rt.runs.stream(tid, "echo", input=user("hi"), stream_mode=["values", "checkpoints"]):
        if part.event == "checkpoints":
            checkpoint_id = part.data["config"]["configurable"]["checkpoint_id"]
            stored.append(await storage.get_checkpoint(tid, checkpoint_id) is not None)
        elif part.event == "values" and len(part.data["messages"]) == 2:  # the last step's, as the end waits
            await asyncio.sleep(0.05)
            assert stored == []
            state = await rt.threads.get_state(tid)
            assert ([m["content"] for m in state["values"]["messages"]], state["next"]) == (["hi"], ["model"])
            ending.set()
    assert stored == [True]
    state = await rt.threads.get_state(tid)
    assert ([m["content"] for m in state["values"]["messages"]], state["next"]) == (["hi", "echo: hi"], [])


async def test_events_tasks_and_debug_modes_produce_parts(trt):
    _, parts = await _stream(trt, ["events", "tasks", "debug"])
    kinds = {p.data["event"] for p in parts if p.event == "events"}
    assert {"on_chat_model_start", "on_chat_model_stream", "on_chat_model_end", "on_tool_start",
            "on_tool_end"} <= kinds
    tasks = _of(parts, "tasks")
    assert [t["name"] for t in tasks if "triggers" in t] == ["model", "tools", "model"]
    assert all(t["error"] is None for t in tasks if "result" in t)
    assert {d["type"] for d in _of(parts, "debug")} <= {"checkpoint", "task", "task_result"}


# -- interrupts and errors ------------------------------------------------------------------------------------


async def test_an_interrupt_shows_in_updates_and_values(make_runtime):
    agent = create_agent(ScriptedModel([_tool_then_answer()], loop=True), [lookup],
                         middleware=[HumanInTheLoop({"lookup": True})])
    rt = await make_runtime({"agent": agent})
    _, parts = await _stream(rt, ["updates", "values"])
    interrupt_updates = [u for u in _of(parts, "updates") if "__interrupt__" in u]
    assert len(interrupt_updates) == 1
    [pending] = interrupt_updates[0]["__interrupt__"]
    assert set(pending) == {"value", "id", "response_schema"}
    assert pending["value"]["action_requests"][0]["name"] == "lookup"
    last_values = _of(parts, "values")[-1]
    assert last_values["__interrupt__"] == [pending]


async def test_a_failing_run_ends_its_stream_with_an_error_part(make_runtime):
    rt = await make_runtime({"agent": create_agent(ScriptedModel([ValueError("boom")]))})
    _, parts = await _stream(rt, ["values", "updates"])
    assert parts[-1].event == "error"
    assert parts[-1].data == {"error": "ValueError", "message": "boom"}
    assert [p.event for p in parts] == ["metadata", "values", "error"]


# -- subgraphs ---------------------------------------------------------------------------------------------


@pytest.fixture
async def nested(make_runtime):
    researcher = create_agent(ScriptedModel(["deep research result"], loop=True), name="researcher")

    @tool
    async def research(topic: str) -> str:
        """Ask the researcher."""
        state = await researcher.ainvoke(f"research {topic}")
        return state["messages"][-1].text

    def reply(request):
        if isinstance(request.messages[-1], ToolMessage):
            return f"boss says: {request.messages[-1].text}"
        return {"tool_calls": [{"name": "research", "args": {"topic": "x"}, "id": "call_r"}]}

    boss = create_agent(ScriptedModel([reply], loop=True), [research], name="boss")
    return await make_runtime({"boss": boss})


async def test_subgraph_parts_are_named_mode_pipe_namespace(nested):
    """A subagent's namespace is ``tools:<tool call id>``, as LangGraph names a tool-dispatched subgraph (so its
    UI hooks take it for a subagent); the agent's own name is in the messages' metadata."""
    tid, parts = await _stream(nested, ["updates", "messages-tuple", "values"], assistant="boss",
                               stream_subgraphs=True)
    names = {p.event for p in parts}
    assert "updates|tools:call_r" in names
    assert "messages|tools:call_r" in names
    assert "values|tools:call_r" in names
    assert not any("researcher" in name for name in names)
    _, meta = next(p.data for p in parts if p.event == "messages|tools:call_r")
    assert meta["lc_agent_name"] == "researcher" and meta["langgraph_checkpoint_ns"] == "tools:call_r"
    nested_update = next(p.data for p in parts if p.event == "updates|tools:call_r")
    assert nested_update["model"]["messages"][0]["content"] == "deep research result"
    root_updates = _of(parts, "updates")
    assert [list(u) for u in root_updates] == [["model"], ["tools"], ["model"]]
    assert contents(_of(parts, "values")[-1])[-1] == "boss says: deep research result"
    # the nested agent's messages are not in the parent's state
    assert "research x" not in contents((await nested.threads.get_state(tid))["values"])


async def test_without_subgraphs_nested_parts_are_left_out(nested):
    _, parts = await _stream(nested, ["updates", "messages-tuple"], assistant="boss")
    assert all("|" not in p.event for p in parts)


async def test_lifecycle_reports_the_subagent_with_its_cause(nested):
    _, parts = await _stream(nested, "lifecycle", assistant="boss")  # reported even without subgraphs
    assert [p.event for p in parts[1:]] == ["lifecycle", "lifecycle|tools:call_r",
                                            "lifecycle|tools:call_r", "lifecycle"]
    events = [(p.data["event"], p.data["graph_name"], p.data["namespace"]) for p in parts[1:]]
    assert events == [("started", "boss", []), ("started", "researcher", ["tools:call_r"]),
                      ("completed", "researcher", ["tools:call_r"]), ("completed", "boss", [])]
    assert parts[2].data["cause"] == {"type": "toolCall", "tool_call_id": "call_r"}
    assert "cause" not in parts[1].data


# -- joining a stream -------------------------------------------------------------------------------------------


async def test_join_stream_replays_a_resumable_run_from_the_start(trt):
    thread = await trt.threads.create()
    tid = thread["thread_id"]
    live = [p async for p in trt.runs.stream(tid, "agent", input=user("q"), stream_mode=["values", "updates"],
                                             stream_resumable=True)]
    run_id = live[0].data["run_id"]
    ids = [int(p.id) for p in live[1:]]
    assert ids == sorted(ids) and all(p.id is not None for p in live[1:])
    replay = [p async for p in trt.runs.join_stream(tid, run_id)]
    assert replay == live[1:]  # everything but the metadata part, with the same ids
    # Last-Event-ID: only what came after it
    cut = live[4].id
    after = [p async for p in trt.runs.join_stream(tid, run_id, last_event_id=cut)]
    assert after == [p for p in live[1:] if int(p.id) > int(cut)]
    assert after and all(int(p.id) > int(cut) for p in after)
    # the stream_mode filter
    only_values = [p async for p in trt.runs.join_stream(tid, run_id, stream_mode="values")]
    assert only_values == [p for p in live[1:] if p.event == "values"]


async def test_join_stream_of_a_finished_run_that_was_not_resumable_is_empty(trt):
    thread = await trt.threads.create()
    run = await trt.runs.create(thread["thread_id"], "agent", input=user("q"))
    await trt.runs.join(thread["thread_id"], run["run_id"])
    assert [p async for p in trt.runs.join_stream(thread["thread_id"], run["run_id"])] == []


async def test_join_stream_follows_a_running_run_to_its_end(make_runtime):
    rt = await make_runtime({"agent": create_agent(ScriptedModel([tool_loop(3)], loop=True, latency=0.03),
                                                  [lookup_step()])})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("go"), stream_mode=["values", "updates"])
    await eventually(lambda: run_status_is(rt, tid, run["run_id"], "running"))
    parts = [p async for p in rt.runs.join_stream(tid, run["run_id"])]
    assert parts, "a live join sees the rest of the run"
    assert parts[-1].event == "values"
    assert contents(parts[-1].data)[-1] == "done after 3 steps"
    assert parts[-1].data == (await rt.threads.get_state(tid))["values"]


async def test_two_live_readers_see_the_same_parts(make_runtime):
    rt = await make_runtime({"agent": echo_agent(latency=0.05)})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input=user("hi"), stream_mode="updates", stream_resumable=True)

    async def read():
        return [p async for p in rt.runs.join_stream(tid, run["run_id"])]

    a, b = await asyncio.gather(read(), read())
    assert a == b and [list(p.data) for p in a] == [["model"]]


def lookup_step():
    @tool
    async def step(i: int) -> str:
        """One step."""
        return f"step {i} ok"

    return step


class _Tokens(ChatModel):
    """Streams ``n`` short tokens, letting the event loop run between them as a model's network reads do."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def stream(self, request):
        for _ in range(self.n):
            await asyncio.sleep(0)
            yield TextDelta("token ")
        yield FinishDelta(None, "stop", {}, None)


async def test_a_live_stream_holds_no_more_memory_the_longer_it_runs(make_runtime):
    """A reader following a run (not resumable) has each part once: what it has had is let go, so the
    memory a stream holds stays flat over thousands of tokens."""
    rt = await make_runtime({"agent": create_agent(_Tokens(12_000))}, store="memory")
    thread = await rt.threads.create()
    held: dict[int, int] = {}
    tracemalloc.start()
    try:
        tokens = 0
        async for part in rt.runs.stream(thread["thread_id"], "agent", input=user("go"),
                                         stream_mode="messages-tuple"):
            if part.event == "messages" and part.data[0]["content"]:
                tokens += 1
                if tokens in (2_000, 11_000):
                    held[tokens] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert tokens == 12_000
    grown = held[11_000] - held[2_000]
    assert grown < 200_000, f"the stream held {grown:,} bytes more after 9,000 more tokens"


class _Bursts(ChatModel):
    """Streams ``bursts`` of ``size`` tokens each, the tokens of a burst at once (one network read's worth)."""

    def __init__(self, bursts: int, size: int) -> None:
        self.bursts, self.size = bursts, size

    async def stream(self, request):
        for burst in range(self.bursts):
            await asyncio.sleep(0.01)
            for token in range(self.size):
                yield TextDelta(f"{burst}.{token} ")
        yield FinishDelta(None, "stop", {}, None)


async def test_a_reader_gets_everything_that_came_since_its_last_read_at_once_each_part_in_order(make_runtime):
    """A stream's batches are what came while the reader was away: a server writes each in one go, so a reader
    that fell behind catches up in one write rather than one per token; iterated, the parts are the same."""
    rt = await make_runtime({"agent": create_agent(_Bursts(4, 5))}, store="memory")
    options = {"input": user("go"), "stream_mode": "messages-tuple"}
    thread = await rt.threads.create()
    batches = [batch async for batch in rt.runs.stream(thread["thread_id"], "agent", **options).batches()]
    assert [p.event for p in batches[0]] == ["metadata"]  # alone: it is what creates the run
    tokens = [[p.data[0]["content"] for p in batch if p.data[0]["content"]] for batch in batches[1:]]
    assert [b for b in tokens if b] == [[f"{burst}.{token} " for token in range(5)] for burst in range(4)]

    thread = await rt.threads.create()
    parts = [p async for p in rt.runs.stream(thread["thread_id"], "agent", **options)]
    assert [p.event for p in parts] == ["metadata"] + ["messages"] * (len(parts) - 1)
    assert [p.data[0]["content"] for p in parts[1:] if p.data[0]["content"]] == [
        f"{burst}.{token} " for burst in range(4) for token in range(5)]
    assert len({id(p.data[1]) for p in parts[1:]}) == 1  # one metadata dict for a message's chunks, as LangGraph


async def test_pushed_parts_come_as_published_and_a_sink_that_cannot_take_more_gets_the_rest_when_it_can(make_runtime):
    """``push``: each token handed on in the publisher's call, one batch each; a sink that returns a future (it
    cannot take more for now) is given nothing until it is done, then everything kept meanwhile at once, in order."""
    rt = await make_runtime({"agent": create_agent(_Bursts(4, 5))}, store="memory")
    thread = await rt.threads.create()
    loop = asyncio.get_running_loop()
    batches: list[list[str]] = []
    ready: list[asyncio.Future[None]] = []

    def sink(batch):
        batches.append([p.data[0]["content"] if p.event == "messages" else p.event for p in batch])
        if batches[-1] == ["1.2 "]:  # mid-burst: the rest of it, and the next burst, come while it waits
            ready.append(loop.create_future())
            loop.call_later(0.05, ready[-1].set_result, None)
            return ready[-1]
        return None

    await rt.runs.stream(thread["thread_id"], "agent", input=user("go"), stream_mode="messages-tuple").push(sink)
    assert batches[0] == ["metadata"]
    tokens = [token for batch in batches[1:] for token in batch if token]
    assert tokens == [f"{burst}.{token} " for burst in range(4) for token in range(5)]
    assert ready and ready[0].done()
    caught_up = batches[batches.index(["1.2 "]) + 1]
    assert caught_up[:7] == ["1.3 ", "1.4 ", "2.0 ", "2.1 ", "2.2 ", "2.3 ", "2.4 "]  # kept while it waited
    assert all(len(batch) == 1 for batch in batches[:batches.index(["1.2 "])])  # before: each token as it came


_AWKWARD = ['he said "hi"\n', "back\\slash\t", "é ü 😀 \u2028", "\x00\x1f", ""]


class _Awkward(ChatModel):
    """Streams text JSON must escape (quotes, backslashes, line ends, control and non-ASCII characters), an empty
    token, and a tool call in pieces; then, told the tool does not exist, a last word."""

    async def stream(self, request):
        await asyncio.sleep(0.05)
        if isinstance(request.messages[-1], ToolMessage):
            yield TextDelta("done")
        else:
            for text in _AWKWARD:
                yield TextDelta(text)
            yield ToolCallDelta(0, "call_1", "lookup", '{"query": ')
            yield ToolCallDelta(0, args='"é"}')
        yield FinishDelta(None, "stop", {}, None)


async def test_parts_pushed_for_the_wire_render_to_the_same_json_as_the_parts_themselves(make_runtime):
    """``push(sink, wire=True)`` (the server's): a model's text tokens come as their JSON already, spliced into what
    the rest of the part renders to once per message; the bytes are those of the part's data rendered, token by
    token (another reader of the same run takes the parts themselves), whatever the text holds."""
    rt = await make_runtime({"agent": create_agent(_Awkward(), name="writer")}, store="memory")
    thread = await rt.threads.create()
    wired: list = []
    plain: list = []
    joined: list[asyncio.Task[None]] = []

    def take(batch):
        if not wired:  # metadata: the run exists, another reader joins it
            joined.append(asyncio.ensure_future(
                rt.runs.join_stream(thread["thread_id"], batch[0].data["run_id"]).push(plain.extend)))
        wired.extend(batch)

    await rt.runs.stream(thread["thread_id"], "agent", input=user("go"), stream_mode="messages-tuple",
                         stream_resumable=True, metadata={"tenant": "ünï", "n": 1}).push(take, wire=True)
    await joined[0]
    wired = wired[1:]  # the joiner has no metadata part
    assert [(p.event, p.id) for p in wired] == [(p.event, p.id) for p in plain]
    for wire, part in zip(wired, plain, strict=True):
        assert not isinstance(part.data, orjson.Fragment)
        assert orjson.dumps(wire.data, option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(part.data)
    rendered = [orjson.loads(orjson.dumps(p.data)) for p in wired if isinstance(p.data, orjson.Fragment)]
    assert [chunk["content"] for chunk, _meta in rendered] == [*_AWKWARD, "done"]
    assert {meta["tenant"] for _chunk, meta in rendered} == {"ünï"}
    calls = [chunk for chunk, _meta in (p.data for p in plain) if chunk.get("tool_call_chunks")]
    assert "".join(c["tool_call_chunks"][0]["args"] for c in calls) == '{"query": "é"}'


async def test_a_sink_that_fails_ends_its_push_and_not_the_run(make_runtime):
    rt = await make_runtime({"agent": create_agent(_Bursts(3, 3))}, store="memory")
    thread = await rt.threads.create()

    def sink(batch):
        if any(p.event == "messages" and p.data[0]["content"] == "1.1 " for p in batch):
            raise ValueError("the reader broke")

    parts = rt.runs.stream(thread["thread_id"], "agent", input=user("go"), stream_mode="messages-tuple")
    with pytest.raises(ValueError, match="the reader broke"):
        await parts.push(sink)
    run = (await rt.runs.list(thread["thread_id"]))[0]
    assert await rt.runs.join(thread["thread_id"], run["run_id"])
    assert (await rt.runs.get(thread["thread_id"], run["run_id"]))["status"] == "success"


async def test_a_pushed_stream_holds_no_more_memory_the_longer_it_runs(make_runtime):
    rt = await make_runtime({"agent": create_agent(_Tokens(12_000))}, store="memory")
    thread = await rt.threads.create()
    held: dict[int, int] = {}
    tokens = 0

    def sink(batch):
        nonlocal tokens
        for part in batch:
            if part.event == "messages" and part.data[0]["content"]:
                tokens += 1
                if tokens in (2_000, 11_000):
                    held[tokens] = tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        await rt.runs.stream(thread["thread_id"], "agent", input=user("go"), stream_mode="messages-tuple").push(sink)
    finally:
        tracemalloc.stop()
    assert tokens == 12_000
    grown = held[11_000] - held[2_000]
    assert grown < 200_000, f"the stream held {grown:,} bytes more after 9,000 more tokens"


async def _follow_thread_tokens(rt, tid: str, into: list[str], *, metadata_pause: float = 0.0) -> None:
    """Follow the thread's stream, putting each token of its run into ``into``, until that run is done; after each
    metadata part, a ``metadata_pause``."""
    async for part in rt.threads.join_stream(tid):
        if part.event == "messages" and part.data[0]["content"]:
            into.append(part.data[0]["content"])
        if part.event == "metadata" and part.data.get("status") == "run_done":
            return
        if part.event == "metadata" and metadata_pause:
            await asyncio.sleep(metadata_pause)


async def test_a_thread_follower_gets_every_part_of_a_run_its_creator_streams_pushed(make_runtime):
    """A run streamed by its creator (pushed: each token handed on in the publisher's call) while another reader
    follows its thread: the thread's reader, which starts on the run later (its write of the run's metadata
    took a while), still gets every token from the run's start, not only those published once it began to read."""
    rt = await make_runtime({"agent": create_agent(_Tokens(200))}, store="memory")
    tid = (await rt.threads.create())["thread_id"]
    followed: list[str] = []
    # the metadata's write taking a while, as a server's to a client that reads slowly
    follower = asyncio.create_task(_follow_thread_tokens(rt, tid, followed, metadata_pause=0.05))
    await eventually(lambda: _true(rt.streams.watching(tid)))
    pushed: list[str] = []

    def sink(batch):
        pushed.extend(p.data[0]["content"] for p in batch if p.event == "messages" and p.data[0]["content"])

    await rt.runs.stream(tid, "agent", input=user("go"), stream_mode="messages-tuple").push(sink)
    await asyncio.wait_for(follower, 10)
    assert len(pushed) == 200
    assert followed == pushed


async def test_a_pushed_reader_held_back_gets_what_came_meanwhile_though_another_reader_drained_it(make_runtime):
    """The creator's pushed sink cannot take more for a while; the run's tokens meanwhile are kept for it, though
    another reader (following the thread, iterating) reads them all and, being the only one iterating, lets go of
    what it read: the held-back sink still gets every token, in order."""
    rt = await make_runtime({"agent": create_agent(_Tokens(200))}, store="memory")
    tid = (await rt.threads.create())["thread_id"]
    followed: list[str] = []
    follower = asyncio.create_task(_follow_thread_tokens(rt, tid, followed))
    await eventually(lambda: _true(rt.streams.watching(tid)))
    loop = asyncio.get_running_loop()
    pushed: list[str] = []

    def sink(batch):
        pushed.extend(p.data[0]["content"] for p in batch if p.event == "messages" and p.data[0]["content"])
        if len(pushed) == 20 and len(followed) < 200:  # held back while the thread's reader reads on
            ready = loop.create_future()
            loop.call_later(0.1, ready.set_result, None)
            return ready
        return None

    await rt.runs.stream(tid, "agent", input=user("go"), stream_mode="messages-tuple").push(sink)
    await asyncio.wait_for(follower, 10)
    assert len(followed) == 200
    assert len(pushed) == 200


async def test_a_thread_follower_still_busy_with_the_last_run_gets_every_part_of_the_next_one_pushed(make_runtime):
    """The thread's reader is still busy with the previous run (writing its end to a slow client) when the next
    run starts, streamed pushed by its creator: the reader still gets every token of it from its start."""
    rt = await make_runtime({"agent": create_agent(_Tokens(200))}, store="memory")
    tid = (await rt.threads.create())["thread_id"]
    followed: list[list[str]] = []
    first_done = asyncio.Event()

    async def follow_thread() -> None:
        async for part in rt.threads.join_stream(tid):
            if part.event == "messages" and part.data[0]["content"]:
                followed[-1].append(part.data[0]["content"])
            elif part.event == "metadata" and "attempt" in part.data:
                followed.append([])
            elif part.event == "metadata" and part.data.get("status") == "run_done":
                if len(followed) == 2:
                    return
                first_done.set()
                await asyncio.sleep(0.2)  # as a server's write of it to a client that reads slowly

    follower = asyncio.create_task(follow_thread())
    await eventually(lambda: _true(rt.streams.watching(tid)))
    pushed: list[list[str]] = []
    for _ in range(2):
        pushed.append([])
        await rt.runs.stream(tid, "agent", input=user("go"), stream_mode="messages-tuple").push(
            lambda batch: pushed[-1].extend(p.data[0]["content"] for p in batch
                                            if p.event == "messages" and p.data[0]["content"]))
        await asyncio.wait_for(first_done.wait(), 10)
    await asyncio.wait_for(follower, 10)
    assert [len(tokens) for tokens in pushed] == [200, 200]
    assert followed == pushed


async def _true(value: bool) -> bool:
    return value
