"""Handoff (seed 004): selection, summaries, approval, the memory block, the child thread, the store mirror."""

from __future__ import annotations

import asyncio
import json

import pytest
from subagent_helpers import wait_until

from backchannel import AIMessage, HumanMessage, ScriptedModel, SystemMessage, ToolMessage, create_agent
from backchannel.errors import InvalidRequestError
from backchannel.handoff import (
    HANDOFF_ACTION,
    HandoffError,
    HandoffMiddleware,
    HandoffProposal,
    HandoffResult,
    SummaryMirror,
    decide_handoff,
    generate_summary,
    pending_handoff,
    propose_handoff,
    render_summary,
    select_messages,
    structure_summary,
)
from backchannel.memory import BLOCK_PLACEHOLDER, AgentMemoryMiddleware, MemoryFile
from backchannel.runtime import LocalRuntime

SUMMARY = ("Title: Comparing LeBron and Jordan\n"
           "- The user wants to know who is the greater player.\n"
           "- Research found Jordan won 6 titles in 6 Finals.\n"
           "- LeBron holds the all-time scoring record.\n"
           "TL;DR: Jordan leads on peak, LeBron on longevity.")


def is_handoff_request(request) -> bool:
    return bool(request.messages) and "Handoff Summary Assistant" in request.messages[0].text


class Policy:
    """The scripted model: a summary for handoff requests, 'reply <n>' for the rest; records what it saw."""

    def __init__(self, summary: str = SUMMARY) -> None:
        self.summary = summary
        self.replies = 0
        self.model = ScriptedModel([self], loop=True, name="scripted-summarizer")
        self.model.record = True

    def __call__(self, request):
        if is_handoff_request(request):
            return AIMessage(self.summary, usage_metadata={"input_tokens": 900, "output_tokens": 80,
                                                           "total_tokens": 980})
        self.replies += 1
        return f"reply {self.replies}"

    def prompts(self) -> list[str | None]:
        return [r.system_prompt for r in self.model.requests if not is_handoff_request(r)]


def build(tmp_path, store=None, mirror=True, summary: str = SUMMARY):
    policy = Policy(summary)
    memory = MemoryFile(tmp_path / "agents" / "agent" / "agent.md")
    handoff = HandoffMiddleware(policy.model, memory, store=store, mirror=mirror)
    agent = create_agent(policy.model, system_prompt="You are helpful.",
                         middleware=[handoff, AgentMemoryMiddleware(memory)], name="agent")
    return policy, memory, handoff, agent


async def chat(rt, thread, text):
    return await rt.runs.wait(thread, "agent", input={"messages": [{"role": "user", "content": text}]})


async def thread_with_history(rt, turns: int = 3) -> str:
    thread = (await rt.threads.create())["thread_id"]
    for i in range(turns):
        await chat(rt, thread, f"question {i}")
    return thread


# -- selection -----------------------------------------------------------------------------------


def call(id: str) -> dict:
    return {"name": "search", "args": {"q": id}, "id": id, "type": "tool_call"}


def test_selection_takes_the_top_25_of_the_last_120_oldest_first():
    messages = [HumanMessage(f"q{i}") if i % 2 == 0 else AIMessage(f"a{i}") for i in range(200)]
    chosen = select_messages(messages)
    assert len(chosen) == 24 and isinstance(chosen[0], HumanMessage)  # the top 25, less an AI reply opening it
    assert all(m in messages[-120:] for m in chosen)
    positions = [messages.index(m) for m in chosen]
    assert positions == sorted(positions)
    assert positions[-1] == 199  # recent first: the newest messages are in


def test_selection_prefers_what_people_said_over_tool_traffic_and_keeps_pairs_whole():
    messages = []
    for i in range(12):
        messages += [HumanMessage(f"question {i}"), AIMessage("", [call(f"c{i}")]), ToolMessage(f"result {i}", f"c{i}"),
                     AIMessage(f"answer {i}")]
    chosen = select_messages(messages, top_n=10)
    texts = [m.text for m in chosen]
    assert "question 11" in texts and "answer 11" in texts
    for i, m in enumerate(chosen):  # every tool result right after its call, every call with its results
        if isinstance(m, ToolMessage):
            assert isinstance(chosen[i - 1], AIMessage) and chosen[i - 1].tool_calls[0]["id"] == m.tool_call_id
        if isinstance(m, AIMessage) and m.tool_calls:
            assert isinstance(chosen[i + 1], ToolMessage)
    talk = sum(1 for m in chosen if not (isinstance(m, ToolMessage) or (isinstance(m, AIMessage) and m.tool_calls)))
    assert talk > len(chosen) - talk


def test_selection_is_trimmed_to_the_token_budget_and_starts_on_a_human_message():
    messages = [SystemMessage("system")]
    for i in range(20):
        messages += [HumanMessage(f"q{i} " + "x" * 800), AIMessage(f"a{i} " + "y" * 800)]
    chosen = select_messages(messages, max_tokens=1000)
    assert sum(len(m.text) for m in chosen) <= 4000
    assert isinstance(chosen[0], HumanMessage) and chosen[-1].text.startswith("a19")
    assert not any(isinstance(m, SystemMessage) for m in chosen)


def test_long_tool_results_are_shortened_and_a_huge_last_message_is_cut():
    messages = [HumanMessage("go"), AIMessage("", [call("c1")]), ToolMessage("r" * 10_000, "c1")]
    chosen = select_messages(messages)
    assert len(chosen[2].text) < 1300 and messages[2].text == "r" * 10_000  # a copy was shortened
    huge = select_messages([HumanMessage("z" * 100_000)], max_tokens=100)
    assert len(huge) == 1 and len(huge[0].text) <= 400


def test_an_empty_thread_selects_nothing():
    assert select_messages([]) == []


# -- summary and structure ------------------------------------------------------------------------


async def test_the_summary_is_asked_for_in_about_300_tokens_and_reports_model_and_usage():
    policy = Policy()
    generated = await generate_summary(policy.model, [HumanMessage("who is greater?"), AIMessage("Jordan.")])
    request = policy.model.requests[-1]
    assert request.settings == {"max_tokens": 300}
    assert "Human: who is greater?" in request.messages[0].text and "AI: Jordan." in request.messages[0].text
    assert generated.text == SUMMARY and generated.model == "scripted-summarizer" and generated.tokens_used == 980


async def test_a_model_that_ignores_the_cap_is_cut_to_it():
    policy = Policy("\n".join(f"- point {i} " + "x" * 60 for i in range(100)))
    generated = await generate_summary(policy.model, [HumanMessage("hi")], max_tokens=100)
    assert len(generated.text) <= 400 and generated.text.endswith("x")


def test_structure_reads_title_bullets_and_tldr():
    assert structure_summary(SUMMARY) == {
        "title": "Comparing LeBron and Jordan",
        "body": ["The user wants to know who is the greater player.", "Research found Jordan won 6 titles in 6 Finals.",
                 "LeBron holds the all-time scoring record."],
        "tldr": "Jordan leads on peak, LeBron on longevity."}


def test_structure_copes_with_markdown_prose_and_too_many_bullets():
    md = "## **Plan**\n1. one\n2) two\n* three\n" + "".join(f"- extra {i}\n" for i in range(6)) + "**TL;DR:** short"
    summary = structure_summary(md)
    assert summary["title"] == "Plan" and len(summary["body"]) == 6 and summary["tldr"] == "short"
    prose = structure_summary("We compared two players. Jordan has six titles. LeBron has the scoring record.")
    assert prose["title"] == "We compared two players"
    assert prose["body"] == ["We compared two players.", "Jordan has six titles.", "LeBron has the scoring record."]
    assert prose["tldr"] == "We compared two players."


def test_the_markdown_reads_back_as_the_same_summary():
    summary = structure_summary(SUMMARY)
    md = render_summary(summary)
    assert md.startswith("### Comparing LeBron and Jordan\n\n- The user wants")
    assert md.endswith("**TL;DR:** Jordan leads on peak, LeBron on longevity.")
    assert structure_summary(md) == summary


# -- the whole flow on a runtime -------------------------------------------------------------------


async def test_preview_approve_child_thread_first_turn_and_cleanup(tmp_path, store_url):
    policy, memory, _, agent = build(tmp_path)
    async with LocalRuntime(store_url, agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        messages_before = (await rt.threads.get_state(parent))["values"]["messages"]

        proposal = await propose_handoff(rt, parent, "agent")
        assert isinstance(proposal, HandoffProposal)
        thread = await rt.threads.get(parent)
        assert thread["status"] == "interrupted"
        [pending] = [i for items in thread["interrupts"].values() for i in items]
        action = pending["value"]["action_requests"][0]
        assert action["name"] == HANDOFF_ACTION
        assert action["description"] == "Preview handoff summary for approval"
        assert set(action["args"]) == {"handoff_id", "summary_json", "summary_md", "assistant_id", "parent_thread_id"}
        assert action["args"]["summary_json"]["title"] == "Comparing LeBron and Jordan"
        assert action["args"]["assistant_id"] == "agent" and action["args"]["parent_thread_id"] == parent
        assert not memory.path.exists()  # nothing written before the decision

        result = await decide_handoff(rt, parent, "agent", {"type": "approve"})
        assert isinstance(result, HandoffResult) and result.status == "accepted"
        child = result.child_thread_id
        assert memory.block_handoff_id() == proposal.handoff_id
        assert proposal.summary_md in memory.block()

        child_thread = await rt.threads.get(child)
        assert child_thread["metadata"]["parent_thread_id"] == parent
        assert child_thread["metadata"]["handoff_source_thread_id"] == parent
        assert child_thread["metadata"]["handoff_pending"] is True
        parent_thread = await rt.threads.get(parent)
        assert parent_thread["status"] == "idle"
        last = parent_thread["metadata"]["last_handoff"]
        assert last["handoff_id"] == proposal.handoff_id and last["child_thread_id"] == child
        assert last["model"] == "scripted-summarizer" and last["tokens_used"] == 980
        assert (await rt.threads.get_state(parent))["values"]["messages"] == messages_before

        item = await rt.store.get_item(["agent", "thread_summaries"], key=proposal.handoff_id)
        assert item["value"]["summary_md"] == proposal.summary_md
        record = item["value"]["summary_json"]
        assert record["handoff_id"] == proposal.handoff_id and record["child_thread_id"] == child
        assert record["parent_thread_id"] == parent and record["assistant_id"] == "agent"
        assert record["title"] == "Comparing LeBron and Jordan" and len(record["body"]) == 3
        assert record["model"] == "scripted-summarizer" and record["tokens_used"] == 980 and record["created_at"]

        await chat(rt, child, "where were we?")
        assert "Research found Jordan won 6 titles" in policy.prompts()[-1]  # the child's first system prompt
        assert memory.block() == BLOCK_PLACEHOLDER  # cleared after the reply
        assert (await rt.threads.get(child))["metadata"]["handoff_pending"] is False
        await chat(rt, child, "and then?")
        assert "Jordan won" not in policy.prompts()[-1]


async def test_approve_with_a_new_title_and_edit_with_new_markdown(tmp_path):
    _, memory, _, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        await propose_handoff(rt, parent, "agent")
        result = await decide_handoff(rt, parent, "agent", {"type": "approve", "args": {"title": "GOAT debate"}})
        assert result.summary_json["title"] == "GOAT debate"
        assert result.summary_md.startswith("### GOAT debate\n") and "### GOAT debate" in memory.block()

        edited = ("### My own notes\n\n- keep the stats\n- drop the opinions\n- check the sources\n\n"
                  "**TL;DR:** stats only")
        await propose_handoff(rt, parent, "agent")
        result = await decide_handoff(rt, parent, "agent", {"type": "edit", "args": {"summary_md": edited}})
        assert result.summary_md == edited and memory.block().endswith(edited)
        assert result.summary_json["title"] == "My own notes"
        assert result.summary_json["body"] == ["keep the stats", "drop the opinions", "check the sources"]
        assert result.summary_json["tldr"] == "stats only"
        # The HITL form of an edit works too.
        await propose_handoff(rt, parent, "agent")
        result = await decide_handoff(rt, parent, "agent", {"type": "edit", "edited_action": {
            "name": HANDOFF_ACTION, "args": {"title": "From an HITL UI"}}})
        assert result.summary_json["title"] == "From an HITL UI"


async def test_reject_leaves_everything_as_it_was(tmp_path, store_url):
    _, memory, _, agent = build(tmp_path)
    memory.path.parent.mkdir(parents=True)
    memory.path.write_text("# Notes\nKeep answers short.\n")
    async with LocalRuntime(store_url, agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        state_before = (await rt.threads.get_state(parent))["values"]["messages"]
        threads_before = await rt.threads.count()
        proposal = await propose_handoff(rt, parent, "agent")
        result = await decide_handoff(rt, parent, "agent", {"type": "reject", "message": "not now"})
        assert result.status == "rejected" and result.child_thread_id is None
        assert memory.path.read_text() == "# Notes\nKeep answers short.\n"
        assert await rt.threads.count() == threads_before
        thread = await rt.threads.get(parent)
        assert thread["status"] == "idle" and "last_handoff" not in thread["metadata"]
        assert (await rt.threads.get_state(parent))["values"]["messages"] == state_before
        assert await rt.store.get_item(["agent", "thread_summaries"], key=proposal.handoff_id) is None
        values = await chat(rt, parent, "carry on")  # the thread goes on normally
        assert values["messages"][-1]["content"] == "reply 4"


async def test_apply_accepts_without_asking(tmp_path):
    _, memory, _, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        result = await propose_handoff(rt, parent, "agent", apply=True)
        assert isinstance(result, HandoffResult) and result.status == "accepted"
        assert (await rt.threads.get(parent))["status"] == "idle"
        assert memory.block_handoff_id() == result.handoff_id


@pytest.mark.parametrize("decision, error", [
    ({"type": "maybe"}, "not allowed"),
    ({"type": "edit"}, "needs 'edited_action'"),
    ({"type": "edit", "args": {"summary": "x"}}, "unknown arg 'summary'"),
    ({"type": "edit", "args": {"summary_md": "  "}}, "must not be empty"),
    ({"type": "approve", "args": {"title": 3}}, "must be a string"),
    ({"type": "approve", "args": "yes"}, "must be an object"),
    ("approve", "not allowed"),
])
async def test_bad_decisions_are_rejected_with_a_clear_error_and_the_handoff_keeps_waiting(tmp_path, decision, error):
    _, memory, _, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        proposal = await propose_handoff(rt, parent, "agent")
        with pytest.raises(InvalidRequestError, match=error):
            await decide_handoff(rt, parent, "agent", decision)
        # Sent straight to the runtime, the same decision is refused before any run starts.
        with pytest.raises(InvalidRequestError, match=error):
            await rt.runs.create(parent, "agent", command={"resume": {"decisions": [decision]}})
        with pytest.raises(InvalidRequestError, match="does not match"):
            await rt.runs.create(parent, "agent", command={"resume": {"decisions": [{"type": "approve"}] * 2}})
        assert (await pending_handoff(rt, parent)).handoff_id == proposal.handoff_id
        assert not memory.path.exists()
        result = await decide_handoff(rt, parent, "agent", {"type": "approve"})
        assert result.handoff_id == proposal.handoff_id


async def test_nothing_to_summarise_and_no_handoff_waiting_are_clear_errors(tmp_path):
    _, _, _, agent = build(tmp_path)
    plain = create_agent(ScriptedModel(["hello"], loop=True))
    async with LocalRuntime("memory", agents={"agent": agent, "plain": plain}) as rt:
        empty = (await rt.threads.create())["thread_id"]
        with pytest.raises(HandoffError, match="nothing to summarise"):
            await propose_handoff(rt, empty, "agent")
        with pytest.raises(HandoffError, match="no handoff is waiting"):
            await decide_handoff(rt, empty, "agent", {"type": "approve"})
        other = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(other, "plain", input={"messages": [{"role": "user", "content": "hi"}]})
        with pytest.raises(HandoffError, match="HandoffMiddleware"):
            await propose_handoff(rt, other, "plain")


async def test_a_proposal_left_unanswered_is_dropped_when_the_thread_moves_on(tmp_path):
    _, memory, _, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        await propose_handoff(rt, parent, "agent")
        values = await chat(rt, parent, "never mind, next question")
        assert values["messages"][-1]["content"] == "reply 4" and "__interrupt__" not in values
        with pytest.raises(HandoffError, match="no handoff is waiting"):
            await decide_handoff(rt, parent, "agent", {"type": "approve"})
        assert values["handoff"]["status"] == "abandoned" and not memory.path.exists()


async def test_cleanup_is_idempotent_and_finishes_on_the_next_turn_after_a_failure(tmp_path, monkeypatch):
    policy, memory, _, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        first = await propose_handoff(rt, parent, "agent", apply=True)
        # A second handoff from the same parent replaces the block; the first child must not wipe it.
        second = await propose_handoff(rt, parent, "agent", apply=True)
        await chat(rt, first.child_thread_id, "hello from the first child")
        assert memory.block_handoff_id() == second.handoff_id
        assert (await rt.threads.get(first.child_thread_id))["metadata"]["handoff_pending"] is False

        real_update = rt.threads.update
        failures = []

        async def failing_update(thread_id, **kwargs):
            if kwargs.get("metadata", {}).get("handoff_pending") is False and not failures:
                failures.append(thread_id)
                raise ConnectionError("storage hiccup")  # the crash between the reset and the flag
            return await real_update(thread_id, **kwargs)

        monkeypatch.setattr(rt.threads, "update", failing_update)
        values = await chat(rt, second.child_thread_id, "hello from the second child")
        assert values["messages"][-1]["content"].startswith("reply")  # the reply stands
        assert memory.block() == BLOCK_PLACEHOLDER
        assert (await rt.threads.get(second.child_thread_id))["metadata"]["handoff_pending"] is True
        memory.write_block("a newer summary by hand")
        await chat(rt, second.child_thread_id, "again")
        assert (await rt.threads.get(second.child_thread_id))["metadata"]["handoff_pending"] is False
        assert memory.block() == "a newer summary by hand"  # not ours: left alone


async def test_a_crash_after_approval_repeats_the_steps_without_duplicates(tmp_path):
    policy, memory, handoff, agent = build(tmp_path)
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        parent = await thread_with_history(rt)
        proposal = await propose_handoff(rt, parent, "agent")
        state = dict((await rt.threads.get_state(parent))["values"])

        class Ctx:  # the resumed run's context, twice: as after a crash that repeats the step
            metadata = {"graph_id": "agent"}
            runtime = rt
            store = rt.store
            thread_id = parent

        first = await handoff._accept(state["handoff"], None, state, Ctx())
        second = await handoff._accept(state["handoff"], None, state, Ctx())
        assert first["child_thread_id"] == second["child_thread_id"]
        children = await rt.threads.search(metadata={"handoff_id": proposal.handoff_id})
        assert len(children) == 1
        assert memory.path.read_text().count("<current_thread_summary>") == 1


# -- the store mirror ------------------------------------------------------------------------------


class FlakyStore:
    """The runtime's store behind a connection that fails ``failures`` times (or hangs), then works."""

    def __init__(self, store, failures: int = 0, hang: bool = False) -> None:
        self.store, self.failures, self.hang, self.calls = store, failures, hang, 0

    async def put_item(self, namespace, key, value):
        self.calls += 1
        if self.hang:
            await asyncio.sleep(3600)
        if self.failures:
            self.failures -= 1
            raise ConnectionError("store unavailable")
        await self.store.put_item(namespace, key=key, value=value)


async def test_a_store_that_fails_briefly_is_retried_with_backoff(tmp_path):
    async with LocalRuntime("memory") as rt:
        flaky = FlakyStore(rt.store, failures=2)
        _, _, handoff, agent = build(tmp_path, store=flaky)
        rt.register("agent", agent)
        parent = await thread_with_history(rt)
        result = await propose_handoff(rt, parent, "agent", apply=True)
        assert result.mirrored is True and flaky.calls == 3
        stats = handoff.mirror.stats
        assert (stats.mirrored, stats.retries, stats.failures, stats.fallbacks, stats.pending) == (1, 2, 2, 0, 0)
        assert await rt.store.get_item(["agent", "thread_summaries"], key=result.handoff_id)


async def test_a_store_that_is_down_never_blocks_the_handoff_and_catches_up_when_back(tmp_path, caplog):
    async with LocalRuntime("memory") as rt:
        down = FlakyStore(rt.store, failures=10**6)
        mirror = SummaryMirror(tmp_path / "outbox.json", attempts=3, backoff=0.01, max_backoff=0.05)
        _, memory, handoff, agent = build(tmp_path, store=down, mirror=mirror)
        rt.register("agent", agent)
        parent = await thread_with_history(rt)
        result = await asyncio.wait_for(propose_handoff(rt, parent, "agent", apply=True), 5)
        assert result.status == "accepted" and result.mirrored is False
        assert memory.block_handoff_id() == result.handoff_id  # the handoff itself went through
        assert mirror.stats.fallbacks == 1 and mirror.stats.pending == 1
        assert "the store is unavailable" in caplog.text
        assert result.handoff_id in json.loads((tmp_path / "outbox.json").read_text())

        down.failures = 0  # the store is back
        await wait_until(lambda: not mirror.pending, what="the outbox to drain")
        assert mirror.stats.pending == 0 and not (tmp_path / "outbox.json").exists()
        item = await rt.store.get_item(["agent", "thread_summaries"], key=result.handoff_id)
        assert item["value"]["summary_json"]["child_thread_id"] == result.child_thread_id


async def test_a_hanging_store_is_given_up_on_in_bounded_time(tmp_path):
    async with LocalRuntime("memory") as rt:
        hanging = FlakyStore(rt.store, hang=True)
        mirror = SummaryMirror(None, attempts=2, backoff=0.01, timeout=0.1)
        _, _, _, agent = build(tmp_path, store=hanging, mirror=mirror)
        rt.register("agent", agent)
        parent = await thread_with_history(rt)
        result = await asyncio.wait_for(propose_handoff(rt, parent, "agent", apply=True), 5)
        assert result.status == "accepted" and result.mirrored is False and mirror.stats.failures >= 2


async def test_the_outbox_is_written_only_for_what_the_store_could_not_take(tmp_path, monkeypatch):
    import backchannel.handoff as handoff_module

    real_write, writes = handoff_module.write_atomic, []

    def write_atomic(path, text):
        writes.append(path)
        real_write(path, text)

    monkeypatch.setattr(handoff_module, "write_atomic", write_atomic)
    outbox, namespace = tmp_path / "outbox.json", ["agent", "thread_summaries"]
    async with LocalRuntime("memory") as rt:
        mirror = SummaryMirror(outbox, attempts=1, backoff=0.01)
        assert await mirror.mirror(rt.store, namespace, "h1", {"summary_md": "one"})
        assert writes == [] and not outbox.exists()
        assert not await mirror.mirror(FlakyStore(rt.store, failures=10**6), namespace, "h2", {"summary_md": "two"})
        assert writes == [outbox] and "h2" in json.loads(outbox.read_text())
        # The same write again (a run resumed after a crash) with the store back: it leaves the outbox.
        assert await mirror.mirror(rt.store, namespace, "h2", {"summary_md": "two"})
        assert mirror.pending == {} and not outbox.exists()
        await asyncio.wait_for(mirror._catching_up, 5)  # the catch-up loop ends: nothing waits
        assert (await rt.store.get_item(namespace, key="h2"))["value"] == {"summary_md": "two"}


async def test_summaries_waiting_in_the_outbox_are_mirrored_after_a_restart(tmp_path):
    outbox = tmp_path / "outbox.json"
    async with LocalRuntime("memory") as rt:
        mirror = SummaryMirror(outbox, attempts=1, backoff=0.01)
        _, _, _, agent = build(tmp_path, store=FlakyStore(rt.store, failures=10**6), mirror=mirror)
        rt.register("agent", agent)
        result = await propose_handoff(rt, await thread_with_history(rt), "agent", apply=True)
        assert outbox.exists()
    async with LocalRuntime("memory") as rt:  # a new process: the store works again
        _, _, handoff, agent = build(tmp_path, store=rt.store, mirror=SummaryMirror(outbox, backoff=0.01))
        rt.register("agent", agent)
        assert handoff.mirror.stats.pending == 1
        await chat(rt, (await rt.threads.create())["thread_id"], "hello")  # any run starts the catch-up
        await wait_until(lambda: not handoff.mirror.pending, what="the outbox to drain")
        assert await rt.store.get_item(["agent", "thread_summaries"], key=result.handoff_id)
        assert not outbox.exists()


# -- the bullets, an assistant without handoff, a cancelled proposal, results of tasks still running ------------


class Answers:
    """A summarizer that answers each handoff request with the next of ``summaries`` (the last one repeats)."""

    def __init__(self, *summaries: str) -> None:
        self.summaries = list(summaries)
        self.asked: list[list[str]] = []  # the texts of each summary request's messages

    def __call__(self, request):
        if is_handoff_request(request):
            self.asked.append([m.text for m in request.messages])
            text = self.summaries[min(len(self.asked), len(self.summaries)) - 1]
            return AIMessage(text, usage_metadata={"input_tokens": 100, "output_tokens": 20, "total_tokens": 120})
        return "reply"


def bullets(n: int) -> str:
    return "Title: Points\n" + "".join(f"- Point number {i + 1}\n" for i in range(n)) + "TL;DR: Many points."


async def test_a_summary_with_too_few_bullets_is_asked_for_again(tmp_path):
    answers = Answers(bullets(1), bullets(4))
    model = ScriptedModel([answers], loop=True)
    agent = create_agent(model, middleware=[HandoffMiddleware(model, tmp_path / "agent.md")], name="agent")
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        thread = await thread_with_history(rt, 2)
        proposal = await propose_handoff(rt, thread, "agent")
        assert len(answers.asked) == 2
        correction = answers.asked[1][-1]
        assert "1 bullet" in correction and "3 to 6" in correction
        assert answers.asked[1][1] == bullets(1)  # the model sees its own first answer
        assert proposal.summary_json["body"] == [f"Point number {i}" for i in (1, 2, 3, 4)]
        assert proposal.omitted == []
        result = await decide_handoff(rt, thread, "agent", {"type": "approve"})
        assert result.tokens_used == 240  # both requests counted


async def test_bullets_beyond_six_are_cut_and_the_proposal_says_which(tmp_path):
    answers = Answers(bullets(8))
    model = ScriptedModel([answers], loop=True)
    agent = create_agent(model, middleware=[HandoffMiddleware(model, tmp_path / "agent.md")], name="agent")
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        thread = await thread_with_history(rt, 2)
        proposal = await propose_handoff(rt, thread, "agent")
        assert len(answers.asked) == 2  # asked again once, then it keeps what it has
        assert proposal.summary_json["body"] == [f"Point number {i}" for i in range(1, 7)]
        assert proposal.omitted == ["Point number 7", "Point number 8"]
        assert "Point number 7" not in proposal.summary_md


async def test_an_assistant_without_handoff_is_refused_before_any_run(tmp_path):
    plain_model = ScriptedModel(["hello"], loop=True)
    plain = create_agent(plain_model, name="plain")
    async with LocalRuntime("memory", agents={"plain": plain}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "plain", input={"messages": [{"role": "user", "content": "hi"}]})
        runs_before, calls_before = len(await rt.runs.list(thread)), plain_model.calls
        with pytest.raises(HandoffError, match=r"assistant 'plain' has no HandoffMiddleware"):
            await propose_handoff(rt, thread, "plain")
        assert len(await rt.runs.list(thread)) == runs_before and plain_model.calls == calls_before


class SlowSummaries(ScriptedModel):
    """Takes 30 s over a handoff summary (something to cancel); answers other requests at once."""

    async def generate(self, request):
        if is_handoff_request(request):
            self.summarising.set()
            await asyncio.sleep(30)
        return await super().generate(request)


async def test_a_proposal_cancelled_while_summarising_leaves_the_thread_as_it_was(tmp_path):
    model = SlowSummaries([lambda r: SUMMARY if is_handoff_request(r) else "reply"], loop=True)
    model.summarising = asyncio.Event()
    memory = MemoryFile(tmp_path / "agent.md")
    agent = create_agent(model, middleware=[HandoffMiddleware(model, memory)], name="agent")
    async with LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents={"agent": agent}) as rt:
        thread = await thread_with_history(rt, 2)
        proposing = asyncio.create_task(propose_handoff(rt, thread, "agent"))
        await asyncio.wait_for(model.summarising.wait(), 10)
        proposing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await proposing
        assert (await rt.threads.get(thread))["status"] == "idle"
        assert await pending_handoff(rt, thread) is None
        assert all(r["status"] not in ("pending", "running") for r in await rt.runs.list(thread))
        values = await chat(rt, thread, "and now?")  # the next message gets a reply, not a handoff
        assert values["messages"][-1]["content"] == "reply" and "__interrupt__" not in values
        assert not memory.path.exists()


def supervisor_policy(request):
    if is_handoff_request(request):
        return SUMMARY
    last = request.messages[-1]
    if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
        return "noted: " + last.text.split("Result: ", 1)[-1]
    if isinstance(last, ToolMessage):
        return "started it"
    if "research" in last.text:
        return {"tool_calls": [{"name": "start_async_task",
                                "args": {"subagent_type": "researcher", "description": "Research tea"}}]}
    return "reply"


def deep_agent_with_handoff(tmp_path, latency: float):
    from backchannel.deep_agent import create_deep_agent
    from backchannel.subagents import SubAgent

    supervisor = ScriptedModel([supervisor_policy], loop=True)
    researcher = ScriptedModel(["Tea began in China."], loop=True, latency=latency)
    return create_deep_agent(supervisor, subagents=[SubAgent("researcher", "Researches", model=researcher,
                                                             background=True)],
                             middleware=[HandoffMiddleware(supervisor, tmp_path / "agent.md")], name="agent")


def texts(values) -> list[str]:
    return [m["content"] for m in values["messages"]]


async def test_a_result_arriving_after_a_handoff_follows_into_the_new_thread(tmp_path):
    agent = deep_agent_with_handoff(tmp_path, latency=1.0)
    async with LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents={"agent": agent}) as rt:
        parent = (await rt.threads.create(graph_id="agent"))["thread_id"]
        await chat(rt, parent, "please research tea")
        [task_id] = (await rt.threads.get_state(parent))["values"]["async_tasks"]
        result = await propose_handoff(rt, parent, "agent", apply=True)
        child = result.child_thread_id
        carried = (await rt.threads.get_state(child))["values"]["async_tasks"]
        assert carried[task_id]["status"] in ("pending", "running")  # the child knows of the task

        async def child_has_the_answer():
            return "noted: Tea began in China." in texts((await rt.threads.get_state(child))["values"])

        await wait_until(child_has_the_answer, timeout=20)
        child_messages = (await rt.threads.get_state(child))["values"]["messages"]
        note = next(m for m in child_messages if "task_notification" in (m.get("additional_kwargs") or {}))
        assert note["additional_kwargs"]["task_notification"]["task_id"] == task_id
        assert note["additional_kwargs"]["handed_off_from"] == parent
        await settles(rt, parent)
        parent_values = (await rt.threads.get_state(parent))["values"]
        assert not any(t.startswith("noted:") for t in texts(parent_values))  # the old thread did not answer it
        assert (await rt.threads.get_state(child))["values"]["async_tasks"][task_id]["status"] == "success"


async def test_a_result_stays_in_the_old_thread_once_the_person_went_on_there(tmp_path):
    agent = deep_agent_with_handoff(tmp_path, latency=1.5)
    async with LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents={"agent": agent}) as rt:
        parent = (await rt.threads.create(graph_id="agent"))["thread_id"]
        await chat(rt, parent, "please research tea")
        result = await propose_handoff(rt, parent, "agent", apply=True)
        await chat(rt, parent, "one more thing here")

        async def parent_has_the_answer():
            return "noted: Tea began in China." in texts((await rt.threads.get_state(parent))["values"])

        await wait_until(parent_has_the_answer, timeout=20)
        assert not (await rt.threads.get_state(result.child_thread_id))["values"].get("messages")


async def settles(rt, thread_id) -> None:
    """The thread goes idle and stays so: no run keeps waking it (the result it passed on is not taken up again)."""
    async def idle():
        return (await rt.threads.get(thread_id))["status"] == "idle"

    await wait_until(idle, timeout=10)
    runs = len(await rt.runs.list(thread_id, limit=100))
    await asyncio.sleep(1.0)
    assert len(await rt.runs.list(thread_id, limit=100)) == runs and await idle()


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_result_arriving_while_the_person_decides_keeps_the_proposal_waiting(tmp_path, decision):
    agent = deep_agent_with_handoff(tmp_path, latency=0.5)
    async with LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents={"agent": agent}) as rt:
        parent = (await rt.threads.create(graph_id="agent"))["thread_id"]
        await chat(rt, parent, "please research tea")
        [task_id] = (await rt.threads.get_state(parent))["values"]["async_tasks"]
        proposal = await propose_handoff(rt, parent, "agent")

        async def task_ended():
            return any(r["status"] == "success" for r in await rt.runs.list(task_id))

        await wait_until(task_ended, timeout=20)
        await asyncio.sleep(0.5)  # its notification is delivered meanwhile
        waiting = await pending_handoff(rt, parent)
        assert waiting is not None and waiting.handoff_id == proposal.handoff_id  # still waiting
        assert not any(t.startswith("noted:") for t in texts((await rt.threads.get_state(parent))["values"]))
        result = await decide_handoff(rt, parent, "agent", {"type": decision})
        answered_in = parent if decision == "reject" else result.child_thread_id  # the old thread, or the new

        async def answered():
            return "noted: Tea began in China." in texts((await rt.threads.get_state(answered_in))["values"])

        await wait_until(answered, timeout=20)
        if decision == "approve":
            assert not any(t.startswith("noted:") for t in texts((await rt.threads.get_state(parent))["values"]))
        await settles(rt, parent)
