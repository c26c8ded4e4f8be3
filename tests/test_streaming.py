"""AgentStream: per-subagent handles with their own events, and waiting for the result."""

import asyncio

from backchannel import ScriptedModel, SubAgent, create_deep_agent


def _task(subagent: str, description: str, call_id: str) -> dict:
    return {"name": "task", "args": {"description": description, "subagent_type": subagent}, "id": call_id}


def _supervisor() -> ScriptedModel:
    return ScriptedModel([{"tool_calls": [_task("researcher", "find facts", "r1"), _task("writer", "write it", "w1")]},
                          "all done"])


def _agent():
    return create_deep_agent(_supervisor(), general_purpose=False, subagents=[
        SubAgent("researcher", "Finds facts.", model=ScriptedModel(["facts found"], latency=0.05)),
        SubAgent("writer", "Writes.", model=ScriptedModel(["text written"], latency=0.1)),
    ])


async def test_each_subagent_handle_carries_only_its_own_events():
    stream = _agent().astream("go")
    seen: dict[str, list] = {}

    async def follow(handle):
        seen[handle.name] = [event async for event in handle.events()]

    followers = [asyncio.create_task(follow(handle)) async for handle in stream.subagents]
    await asyncio.gather(*followers)
    result = await stream.wait()

    assert result["messages"][-1].text == "all done"
    assert set(seen) == {"researcher", "writer"}
    for name, events in seen.items():
        assert all(e.namespace[0].startswith(f"{name}:") for e in events), name
        lifecycle = [e.data["event"] for e in events if e.type == "lifecycle"]
        assert lifecycle == ["started", "completed"]
        texts = [e.data["message"].text for e in events if e.type == "message" and e.data["event"] == "finish"]
        assert texts == ["facts found" if name == "researcher" else "text written"]


async def test_handles_report_status_and_cause_once_the_subagent_ends():
    stream = _agent().astream("go")
    handles = [handle async for handle in stream.subagents]
    assert {(h.name, h.cause["tool_call_id"], h.status) for h in handles} == {
        ("researcher", "r1", "success"), ("writer", "w1", "success")}
    assert stream.result["messages"][-1].text == "all done"


async def test_wait_runs_the_stream_to_the_end_without_iterating_it():
    stream = _agent().astream("go")
    result = await stream.wait()
    assert [m.text for m in result["messages"] if m.type == "tool"] == ["facts found", "text written"]
