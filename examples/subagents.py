# examples/subagents.py: a supervisor with a researcher in the background and a critic in the foreground
import asyncio

from mytools import search  # a tool that looks things up in a few notes

from backchannel import LocalRuntime, SubAgent, create_deep_agent

supervisor = create_deep_agent(
    "offline",  # a scripted stand-in that needs no key; or "openai:gpt-4o-mini", "anthropic:...", ...
    subagents=[
        SubAgent("researcher", "Researches one subject", tools=[search], background=True, timeout=300),
        SubAgent("critic", "Reviews a draft"),  # run synchronously by `task`
    ],
    completion="wait",  # the supervisor's run waits for every result; "notify": each result wakes it
    name="supervisor",
)


async def main() -> None:
    async with LocalRuntime("memory", agents={"supervisor": supervisor}) as rt:
        thread_id = (await rt.threads.create())["thread_id"]
        stream = supervisor.astream("Please research the history of tea", thread_id=thread_id)
        async for sub in stream.subagents:
            print(sub.name, sub.cause, sub.status)
            async for event in sub.events():  # the subagent's own events, until it ends
                if event.type == "tool":
                    print("  ", event.data["tool_name"], event.data["event"])
        print((await stream.wait())["messages"][-1].text)  # The researcher reports: Tea was first drunk ...


asyncio.run(main())
