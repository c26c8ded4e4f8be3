"""The agents the tracing tests watch: a supervisor with a sync subagent, two background ones and a failing
tool, on scripted models that report token usage (tests/test_tracing.py, tests/server/test_timeline_page.py)."""

from __future__ import annotations

from subagent_helpers import call, is_note, policy, start

from backchannel import AIMessage, HumanMessage, ScriptedModel, ToolMessage, tool
from backchannel.deep_agent import create_deep_agent
from backchannel.subagents import SubAgent


@tool
def flaky(x: int) -> int:
    """Fail, always.

    Args:
        x: Anything.
    """
    raise ValueError(f"flaky failed on {x}")


USAGE = {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}


def supervisor_model():
    """On the user's message: a sync subagent, two background ones and a failing tool, at once; then an answer."""
    def reply(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage) and is_note(last):
            return AIMessage(f"noted {last.additional_kwargs['task_notification']['subagent']}", usage_metadata=USAGE)
        if isinstance(last, HumanMessage):
            return AIMessage("", [
                {**call("task", {"description": "sum it", "subagent_type": "researcher"}, "call_sync"),
                 "type": "tool_call"},
                {**start("analyst", "analyse", "call_analyst"), "type": "tool_call"},
                {**start("writer", "write", "call_writer"), "type": "tool_call"},
                {**call("flaky", {"x": 7}, "call_flaky"), "type": "tool_call"},
            ], usage_metadata=USAGE)
        assert isinstance(last, ToolMessage)
        return AIMessage("all started", usage_metadata=USAGE)

    return policy(reply)


def answering(text, latency=0.0):
    return ScriptedModel([AIMessage(text, usage_metadata={"input_tokens": 3, "output_tokens": 2,
                                                            "total_tokens": 5})], loop=True, latency=latency)


def supervisor():
    return create_deep_agent(supervisor_model(), [flaky], general_purpose=False, subagents=[
        SubAgent("researcher", "Researches.", model=answering("42")),
        SubAgent("analyst", "Analyses.", background=True, model=answering("analysis", 0.3)),
        SubAgent("writer", "Writes.", background=True, model=answering("draft", 0.6)),
    ])


def counts(input_tokens, output_tokens, calls):
    return {"input_tokens": input_tokens, "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens, "model_calls": calls}


# The supervisor's three calls report 10 + 5 each; the researcher's one 3 + 2 (see the models above).
SUPERVISOR_RUN_USAGE = {**counts(3 * 10 + 3, 3 * 5 + 2, 4), "subagents": {"researcher": counts(3, 2, 1)}}


def sync_only_supervisor():
    """A sync subagent, then a failing tool, then the answer."""
    def reply(request):
        last = request.messages[-1]
        if isinstance(last, HumanMessage):
            calls = [call("task", {"description": "sum it", "subagent_type": "researcher"}, "c1")]
        elif last.tool_call_id == "c1":
            calls = [call("flaky", {"x": 1}, "c2")]
        else:
            return AIMessage("done", usage_metadata=USAGE)
        return AIMessage("", [{**c, "type": "tool_call"} for c in calls], usage_metadata=USAGE)

    return create_deep_agent(policy(reply), [flaky], general_purpose=False,
                             subagents=[SubAgent("researcher", "Researches.", model=answering("42"))])
