"""Reactive summarization: past a token threshold, older messages become one summary."""

from __future__ import annotations

from backchannel import AIMessage, HumanMessage, RemoveMessage, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.state import MessageList
from backchannel.subagents import SubAgent
from backchannel.summarization import (
    SUMMARY_PREFIX,
    SummarizationMiddleware,
    count_tokens_approximately,
    message_tokens,
    safe_cutoff,
)


def is_summary_request(request) -> bool:
    return "Context Extraction Assistant" in request.messages[0].text


def policy(summary: str = "SUMMARY: the user asked things"):
    """Answers summary requests with ``summary`` and everything else with 'ok <n>'."""
    count = {"n": 0}

    def reply(request):
        if is_summary_request(request):
            return summary
        count["n"] += 1
        return f"ok {count['n']}"

    model = ScriptedModel([reply], loop=True)
    model.record = True
    return model


def conversation(turns: int, size: int = 200) -> list:
    out = []
    for i in range(turns):
        out += [HumanMessage(f"question {i} " + "x" * size), AIMessage(f"answer {i} " + "y" * size)]
    return out


def test_tokens_are_counted_about_four_characters_each_from_objects_or_dicts():
    assert count_tokens_approximately([HumanMessage("x" * 400)]) == 100 + 3 + 2  # text, per message, role
    assert count_tokens_approximately([{"role": "user", "content": "x" * 400}]) == 105


def test_tool_calls_count_by_their_repr_as_langchain_counts_them():
    from langchain_core.messages import AIMessage as LangChainAIMessage

    calls = [{"name": "search", "args": {"query": "weather in Zürich", "limit": 3}, "id": "call_1"},
             {"name": "fetch", "args": {"url": "https://example.com"}, "id": "call_2"}]
    ours = AIMessage("looking", tool_calls=[{**c, "type": "tool_call"} for c in calls])
    theirs = repr(LangChainAIMessage("looking", tool_calls=calls).tool_calls)

    assert message_tokens(ours) - message_tokens(AIMessage("looking")) == len(theirs) / 4


async def test_below_the_threshold_nothing_is_summarised():
    model = policy()
    agent = create_agent(model, middleware=[SummarizationMiddleware(model, max_tokens_before_summary=10_000)])
    result = await agent.ainvoke(conversation(3) + [HumanMessage("next")])
    assert len(result["messages"]) == 8
    assert not any(is_summary_request(r) for r in model.requests)


async def test_past_the_threshold_older_messages_become_a_summary_and_the_last_six_stay():
    model = policy()
    mw = SummarizationMiddleware(model, max_tokens_before_summary=500)
    agent = create_agent(model, middleware=[mw])
    history = conversation(10) + [HumanMessage("the latest question")]
    result = await agent.ainvoke(history)
    messages = result["messages"]
    assert messages[0].text == f"{SUMMARY_PREFIX}\n\nSUMMARY: the user asked things"
    assert [m.id for m in messages[1:7]] == [m.id for m in history[-6:]]
    assert messages[-1].text == "ok 1"
    summary_request, answer_request = model.requests
    assert "question 0" in summary_request.messages[0].text  # the summariser saw the older messages
    assert "the latest question" not in summary_request.messages[0].text
    assert answer_request.messages[0].text.startswith(SUMMARY_PREFIX)  # the model sees the summary, not the rest
    assert len(answer_request.messages) == 7


def test_the_cut_never_separates_an_ai_message_from_its_tool_results():
    call = {"name": "search", "args": {}, "id": "c1", "type": "tool_call"}
    messages = [HumanMessage("a"), AIMessage("", [call, {**call, "id": "c2"}]), ToolMessage("r1", "c1"),
                ToolMessage("r2", "c2"), AIMessage("done")]
    assert safe_cutoff(messages, 3) == 1  # would have split the pair: moves back to the AI message
    assert safe_cutoff(messages, 2) == 1
    assert safe_cutoff(messages, 4) == 4
    assert safe_cutoff(messages, 99) == 5


async def test_a_summary_keeps_tool_pairs_whole_in_a_real_run():
    model = policy()
    call = {"name": "search", "args": {"q": "x"}, "id": "c1", "type": "tool_call"}
    history = [*conversation(6), HumanMessage("look it up"), AIMessage("", [call]),
               ToolMessage("found " + "z" * 300, "c1"), AIMessage("here it is"), HumanMessage("thanks"),
               AIMessage("welcome"), HumanMessage("one more")]
    agent = create_agent(model, middleware=[SummarizationMiddleware(model, max_tokens_before_summary=300,
                                                                     messages_to_keep=5)])
    result = await agent.ainvoke(history)
    kept = result["messages"][1:]
    assert isinstance(kept[0], AIMessage) and kept[0].tool_calls  # moved back to keep the call with its result
    assert isinstance(kept[1], ToolMessage)


async def test_it_works_on_subagents_with_their_own_model():
    calls = {"n": 0}

    def subagent(request):
        if is_summary_request(request):
            return "SUB SUMMARY"
        calls["n"] += 1  # four tool calls grow its conversation past the threshold, then it answers
        return {"tool_calls": [{"name": "lookup", "args": {}}]} if calls["n"] <= 4 else "sub done"

    sub_model = ScriptedModel([subagent], loop=True)
    sub_model.record = True

    def supervisor(request):
        last = request.messages[-1]
        if isinstance(last, ToolMessage):
            return f"the subagent said: {last.text}"
        return {"tool_calls": [{"name": "task", "args": {"description": "research " + "w" * 2000,
                                                          "subagent_type": "helper"}}]}

    supervisor_model = ScriptedModel([supervisor], loop=True)
    agent = create_deep_agent(supervisor_model, general_purpose=False,
                              subagents=[SubAgent("helper", "helps", model=sub_model)],
                              max_tokens_before_summary=300)
    result = await agent.ainvoke("go")
    assert result["messages"][-1].text == "the subagent said: sub done"
    summaries = [r for r in sub_model.requests if is_summary_request(r)]
    assert summaries and "w" * 100 in summaries[0].messages[0].text  # the subagent's own history, its own model
    last_request = [r for r in sub_model.requests if not is_summary_request(r)][-1]
    assert last_request.messages[0].text.startswith(SUMMARY_PREFIX)


async def test_compact_summarises_now_and_does_not_call_the_agents_model(tmp_path):
    model = policy("COMPACTED")
    agent = create_agent(model, middleware=[SummarizationMiddleware(model)])  # threshold far away
    async with LocalRuntime(f"sqlite:///{tmp_path}/db.sqlite", agents={"agent": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        for i in range(5):
            await rt.runs.wait(thread, "agent", input={"messages": [{"role": "user", "content": f"message {i}"}]})
        before = (await rt.threads.get_state(thread))["values"]["messages"]
        calls = model.calls
        values = await rt.runs.wait(thread, "agent", input={"compact": True})
        after = values["messages"]
        assert len(before) == 10 and len(after) == 7
        assert after[0]["content"].endswith("COMPACTED")
        assert [m["id"] for m in after[1:]] == [m["id"] for m in before[-6:]]
        assert model.calls == calls + 1  # the summary only
        assert not values["compact"]
        # The next message runs normally on the compacted history.
        values = await rt.runs.wait(thread, "agent", input={"messages": [{"role": "user", "content": "and now?"}]})
        assert values["messages"][-1]["content"] == "ok 6"


async def test_the_running_count_follows_replacements_and_removals():
    model = policy()
    mw = SummarizationMiddleware(model, max_tokens_before_summary=1000)
    messages = conversation(2, size=10)
    live = MessageList(messages)
    assert abs(mw._tokens(live) - count_tokens_approximately(messages)) < 1
    live.add(AIMessage("z" * 4000, id=messages[-1].id))  # replaced by id: much longer
    assert mw._tokens(live) > 1000
    live.add(RemoveMessage(messages[0].id))
    live.add(HumanMessage("new"))
    assert abs(mw._tokens(live) - count_tokens_approximately(list(live))) < 1


async def test_many_live_conversations_each_count_only_their_new_messages(monkeypatch):
    import asyncio
    import gc
    import weakref

    from backchannel import summarization

    counted = []
    real = summarization.message_tokens
    monkeypatch.setattr(summarization, "message_tokens", lambda m: counted.append(m) or real(m))

    def reply(request):  # three model calls per conversation
        return f"ok {len(request.messages)}" if len(request.messages) >= 5 else {
            "tool_calls": [{"name": "wait", "args": {}}]}

    gate = asyncio.Event()
    arrived = []

    @tool
    async def wait() -> str:
        """The first call waits until every conversation has made one: all are alive together."""
        arrived.append(1)
        if len(arrived) == 100:
            gate.set()
        await gate.wait()
        return "go on"

    mw = SummarizationMiddleware("unused", max_tokens_before_summary=10_000)
    agent = create_agent(ScriptedModel([reply], loop=True), [wait], middleware=[mw])
    results = await asyncio.gather(*(agent.ainvoke(f"q{i}") for i in range(100)))
    total = sum(len(r["messages"]) for r in results)
    # 100 conversations (more than any fixed cache would hold) are counted once per message,
    # except each final answer, which no model call came after
    assert len(counted) == total - 100
    lists = [weakref.ref(r["messages"]) for r in results]
    del results
    await asyncio.sleep(0)  # the finished runs' tasks let go of their states
    gc.collect()
    assert [ref for ref in lists if ref() is not None] == []  # nothing the counting kept holds a conversation
