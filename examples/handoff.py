# examples/handoff.py: memory, and a handoff that continues a long thread in a fresh one
import asyncio
import tempfile
from pathlib import Path

from backchannel import (
    AgentMemoryMiddleware,
    HandoffMiddleware,
    LocalRuntime,
    create_deep_agent,
    decide_handoff,
    propose_handoff,
)

memory = Path(tempfile.mkdtemp()) / "agent.md"  # the chat uses ~/.backchannel/agents/<name>/agent.md
memory.write_text("# Notes\nAnswer briefly.\n")
model = "offline"  # or "openai:gpt-4o-mini", ...
agent = create_deep_agent(model, name="agent",
                          middleware=[HandoffMiddleware(model, memory), AgentMemoryMiddleware(memory)])


async def main() -> None:
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        thread_id = (await rt.threads.create(graph_id="agent"))["thread_id"]
        for question in ("Which came first, tea or coffee?", "Tea, by about four thousand years?"):
            await rt.runs.wait(thread_id, "agent", input=question)

        proposal = await propose_handoff(rt, thread_id, "agent")  # interrupt "handoff_summary"
        print(proposal.summary_md)  # {title, 3-6 bullets, tldr}, ~300 tokens
        result = await decide_handoff(rt, thread_id, "agent", {"type": "approve"})
        # or {"type": "approve", "args": {"title": ...}}, {"type": "edit", "args": {"summary_md": ...}},
        # {"type": "reject"}
        print(memory.read_text())  # the summary, in the memory file's <current_thread_summary> block

        child = result.child_thread_id  # metadata: parent_thread_id, handoff_pending, handoff_source_thread_id
        reply = await rt.runs.wait(child, "agent", input="Where were we?")
        print(reply["messages"][-1]["content"])  # From my notes: ...; after this reply the block is cleared


asyncio.run(main())
