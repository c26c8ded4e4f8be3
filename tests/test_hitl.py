"""Human in the loop through the runtime: the review request, each decision, and malformed resumes."""

import copy

import pytest

from backchannel import HumanMessage, InvalidRequestError, ScriptedModel, ToolMessage, create_agent, tool
from backchannel.hitl import HumanInTheLoop, check_resume, decision_args
from backchannel.runtime import LocalRuntime


def user(text):
    return {"messages": [{"role": "user", "content": text}]}


class Fixture:
    """An agent whose model asks for gated tools on each new user message, then reports the results."""

    def __init__(self, calls):
        self.calls = calls  # the tool calls the model makes for each user message
        self.sent = []
        self.looked_up = []

        @tool
        def send_email(to: str, body: str) -> str:
            """Send an email."""
            self.sent.append({"to": to, "body": body})
            return f"sent to {to}"

        @tool
        def lookup(query: str) -> str:
            """Look something up."""
            self.looked_up.append(query)
            return f"found {query}"

        def reply(request):
            last = request.messages[-1]
            if isinstance(last, HumanMessage):
                return {"tool_calls": [dict(c) for c in self.calls]}
            results = []
            for m in reversed(request.messages):
                if not isinstance(m, ToolMessage):
                    break
                results.append(f"{m.status}: {m.text}")
            return " | ".join(reversed(results))

        self.model = ScriptedModel([reply], loop=True)
        self.agent = create_agent(self.model, [send_email, lookup], middleware=[HumanInTheLoop({
            "send_email": True,
            "lookup": {"allowed_decisions": ["approve", "reject"], "description": "Look it up?"},
        })])


EMAIL = {"name": "send_email", "args": {"to": "ana@example.com", "body": "hi"}, "id": "call_email"}
LOOKUP = {"name": "lookup", "args": {"query": "weather"}, "id": "call_lookup"}


@pytest.fixture
async def env():
    fx = Fixture([EMAIL])
    async with LocalRuntime(store="memory", agents={"agent": fx.agent}) as rt:
        fx.rt = rt
        yield fx


async def _interrupted(fx, calls=None):
    if calls is not None:
        fx.calls = calls
    thread = await fx.rt.threads.create()
    tid = thread["thread_id"]
    result = await fx.rt.runs.wait(tid, "agent", input=user("please"))
    return tid, result


async def _snapshot(rt, tid):
    thread = await rt.threads.get(tid)
    state = await rt.threads.get_state(tid)
    history = await rt.threads.get_history(tid, limit=100)
    return copy.deepcopy({"status": thread["status"], "interrupts": thread["interrupts"],
                          "values": thread["values"], "state": state, "history": len(history),
                          "runs": [(r["run_id"], r["status"]) for r in await rt.runs.list(tid)]})


# -- the review request -------------------------------------------------------------------------------


async def test_a_gated_tool_pauses_the_run_with_a_review_request(env):
    tid, result = await _interrupted(env)
    assert env.sent == []
    [pending] = result["__interrupt__"]
    assert set(pending) == {"value", "id", "response_schema"}
    assert pending["value"] == {
        "action_requests": [{"name": "send_email", "args": {"to": "ana@example.com", "body": "hi"},
                             "description": "Tool execution requires approval\n\nTool: send_email\n"
                                            "Args: {\"to\": \"ana@example.com\", \"body\": \"hi\"}"}],
        "review_configs": [{"action_name": "send_email",
                            "allowed_decisions": ["approve", "edit", "reject", "respond"]}]}
    assert [m["type"] for m in result["messages"]] == ["human", "ai"]

    run = (await env.rt.runs.list(tid))[0]
    assert run["status"] == "success"  # as in LangGraph: the run ended well; its thread waits for a human
    thread = await env.rt.threads.get(tid)
    assert thread["status"] == "interrupted"
    [(task_id, interrupts)] = thread["interrupts"].items()
    assert interrupts == [{"id": pending["id"], "value": pending["value"]}]

    state = await env.rt.threads.get_state(tid)
    assert state["next"] == ["HumanInTheLoop.after_model"]
    assert state["interrupts"] == interrupts
    [task] = state["tasks"]
    assert task["name"] == "HumanInTheLoop.after_model" and task["interrupts"] == interrupts
    assert task["id"] and task["path"] == ["__pregel_pull", "HumanInTheLoop.after_model"]


async def test_a_custom_description_and_allowed_decisions(env):
    _, result = await _interrupted(env, [LOOKUP])
    value = result["__interrupt__"][0]["value"]
    assert value["action_requests"][0]["description"] == "Look it up?"
    assert value["review_configs"] == [{"action_name": "lookup", "allowed_decisions": ["approve", "reject"]}]


# -- decisions ----------------------------------------------------------------------------------------


async def test_approve_runs_the_tool(env):
    tid, _ = await _interrupted(env)
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "approve"}]}})
    assert env.sent == [{"to": "ana@example.com", "body": "hi"}]
    assert result["messages"][-1]["content"] == "success: sent to ana@example.com"
    assert "__interrupt__" not in result
    thread = await env.rt.threads.get(tid)
    assert thread["status"] == "idle" and thread["interrupts"] == {}
    assert (await env.rt.threads.get_state(tid))["next"] == []
    assert [r["status"] for r in await env.rt.runs.list(tid)] == ["success", "success"]


async def test_edit_runs_the_tool_with_the_edited_arguments(env):
    tid, _ = await _interrupted(env)
    edited = {"name": "send_email", "args": {"to": "bo@example.com", "body": "edited"}}
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [
        {"type": "edit", "edited_action": edited}]}})
    assert env.sent == [{"to": "bo@example.com", "body": "edited"}]
    tool_message = [m for m in result["messages"] if m["type"] == "tool"][-1]
    assert tool_message["tool_call_id"] == "call_email"
    assert "sent to bo@example.com" in tool_message["content"]


async def test_reject_skips_the_tool_and_tells_the_model_why(env):
    tid, _ = await _interrupted(env)
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [
        {"type": "reject", "message": "not today"}]}})
    assert env.sent == []
    tool_message = [m for m in result["messages"] if m["type"] == "tool"][-1]
    assert tool_message["status"] == "error"
    assert tool_message["tool_call_id"] == "call_email"
    assert tool_message["content"] == "User rejected the tool call for `send_email` with reason: not today"
    assert result["messages"][-1]["content"].startswith("error: User rejected")


async def test_reject_without_a_message(env):
    tid, _ = await _interrupted(env)
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "reject"}]}})
    tool_message = [m for m in result["messages"] if m["type"] == "tool"][-1]
    assert tool_message["status"] == "error"
    assert "The tool was not executed" in tool_message["content"]
    assert env.sent == []


async def test_respond_makes_the_message_the_tool_result(env):
    tid, _ = await _interrupted(env)
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [
        {"type": "respond", "message": "I sent it myself"}]}})
    assert env.sent == []
    tool_message = [m for m in result["messages"] if m["type"] == "tool"][-1]
    assert tool_message["content"] == "I sent it myself" and tool_message["status"] == "success"
    assert result["messages"][-1]["content"] == "success: I sent it myself"


async def test_two_gated_calls_take_two_decisions_in_order(env):
    tid, result = await _interrupted(env, [EMAIL, LOOKUP])
    value = result["__interrupt__"][0]["value"]
    assert [a["name"] for a in value["action_requests"]] == ["send_email", "lookup"]
    assert [c["action_name"] for c in value["review_configs"]] == ["send_email", "lookup"]
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [
        {"type": "reject", "message": "no mail"}, {"type": "approve"}]}})
    assert env.sent == [] and env.looked_up == ["weather"]
    tools = {m["tool_call_id"]: m for m in result["messages"] if m["type"] == "tool"}
    assert tools["call_email"]["status"] == "error" and "no mail" in tools["call_email"]["content"]
    assert tools["call_lookup"]["content"] == "found weather"
    assert (await env.rt.threads.get(tid))["status"] == "idle"


async def test_resume_by_interrupt_id(env):
    tid, result = await _interrupted(env)
    interrupt_id = result["__interrupt__"][0]["id"]
    await env.rt.runs.wait(tid, "agent", command={"resume": {interrupt_id: {"decisions": [{"type": "approve"}]}}})
    assert len(env.sent) == 1


async def test_the_next_turn_pauses_again(env):
    tid, _ = await _interrupted(env)
    await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "approve"}]}})
    again = await env.rt.runs.wait(tid, "agent", input=user("once more"))
    assert "__interrupt__" in again
    assert (await env.rt.threads.get(tid))["status"] == "interrupted"
    await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "approve"}]}})
    assert len(env.sent) == 2


# -- malformed resumes --------------------------------------------------------------------------------

BAD_RESUMES = {
    "no decisions": {"decisions": []},
    "too few decisions": {"decisions": [{"type": "approve"}]},
    "too many decisions": {"decisions": [{"type": "approve"}] * 3},
    "unknown type": {"decisions": [{"type": "maybe"}, {"type": "approve"}]},
    "disallowed type": {"decisions": [{"type": "approve"}, {"type": "edit", "edited_action": {
        "name": "lookup", "args": {"query": "x"}}}]},
    "missing decisions key": {"choices": [{"type": "approve"}, {"type": "approve"}]},
    "not a dict": "yes",
    "edit without edited_action": {"decisions": [{"type": "edit"}, {"type": "approve"}]},
    "edit with bad edited_action": {"decisions": [{"type": "edit", "edited_action": {"args": {}}},
                                                  {"type": "approve"}]},
    "respond without a message": {"decisions": [{"type": "respond"}, {"type": "approve"}]},
    "decision not a dict": {"decisions": ["approve", "approve"]},
}


@pytest.mark.parametrize("case", sorted(BAD_RESUMES))
async def test_a_malformed_resume_is_refused_and_changes_nothing(env, case):
    tid, _ = await _interrupted(env, [EMAIL, LOOKUP])
    before = await _snapshot(env.rt, tid)
    assert before["status"] == "interrupted"
    bad = BAD_RESUMES[case]
    with pytest.raises(InvalidRequestError):
        await env.rt.runs.create(tid, "agent", command={"resume": bad})
    with pytest.raises(InvalidRequestError):
        await env.rt.runs.wait(tid, "agent", command={"resume": bad})
    assert await _snapshot(env.rt, tid) == before
    assert env.sent == [] and env.looked_up == []

    # a correct resume afterwards still works
    result = await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [
        {"type": "approve"}, {"type": "approve"}]}})
    assert len(env.sent) == 1 and env.looked_up == ["weather"]
    assert result["messages"][-1]["content"] == "success: sent to ana@example.com | success: found weather"
    assert (await env.rt.threads.get(tid))["status"] == "idle"


def test_an_edit_is_checked_with_the_args_it_applies():
    # A decision with both forms applies its edited_action, so that is what the args_schema checks.
    review = {"action_requests": [{"name": "count", "args": {}}],
              "review_configs": [{"action_name": "count", "allowed_decisions": ["edit"],
                                  "args_schema": {"properties": {"n": {"type": "integer"}}}}]}
    both = {"type": "edit", "edited_action": {"name": "count", "args": {"n": "two"}}, "args": {"n": 2}}
    assert decision_args(both) == {"n": "two"}
    with pytest.raises(InvalidRequestError, match="must be a integer"):
        check_resume(review, {"decisions": [both]})
    assert decision_args({"type": "edit", "args": {"n": 2}}) == {"n": 2}


async def test_resuming_a_thread_with_nothing_pending_is_refused(env):
    thread = await env.rt.threads.create()
    with pytest.raises(InvalidRequestError):
        await env.rt.runs.create(thread["thread_id"], "agent", command={"resume": {"decisions": []}})
    tid, _ = await _interrupted(env)
    await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "approve"}]}})
    with pytest.raises(InvalidRequestError):
        await env.rt.runs.wait(tid, "agent", command={"resume": {"decisions": [{"type": "approve"}]}})
    assert len(env.sent) == 1


def test_bad_configurations_are_refused():
    with pytest.raises(ValueError):
        HumanInTheLoop({"send_email": {"allowed_decisions": []}})
    with pytest.raises(ValueError):
        HumanInTheLoop({"send_email": {"allowed_decisions": ["approve", "ignore"]}})
    assert HumanInTheLoop({"send_email": False}).configs == {}
