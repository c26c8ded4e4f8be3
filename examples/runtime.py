# examples/runtime.py: threads, runs and checkpoints in SQLite, through the langgraph_sdk client's surface
import asyncio
import tempfile

from backchannel import LocalRuntime, ScriptedModel, create_agent

model = ScriptedModel(["2 + 3 = 5", "4 + 4 = 8"], loop=True)  # or "openai:gpt-4o-mini", ...
agent = create_agent(model, system_prompt="You are a calculator.", name="calc")


async def main() -> None:
    database = f"sqlite:///{tempfile.mkdtemp()}/chat.db"  # or "memory", or "postgresql://..."
    async with LocalRuntime(database, agents={"calc": agent}) as rt:
        thread = await rt.threads.create(metadata={"user": "ada"})
        async for part in rt.runs.stream(thread["thread_id"], "calc",
                                         input={"messages": [{"role": "user", "content": "2+3?"}]},
                                         stream_mode=["updates", "messages-tuple"]):
            print(part.event, part.data)
        await agent.ainvoke("and 4+4?", thread_id=thread["thread_id"])  # continues the conversation
        state = await rt.threads.get_state(thread["thread_id"])
        history = await rt.threads.get_history(thread["thread_id"])  # one checkpoint per step, newest first
        print([m["content"] for m in state["values"]["messages"]], f"{len(history)} checkpoints")


asyncio.run(main())
