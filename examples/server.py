# examples/server.py: the server's app in this process, driven by the official LangGraph client and RemoteRuntime
import asyncio
import os

import uvicorn
from langgraph_sdk import get_client

from backchannel import LocalRuntime, create_deep_agent
from backchannel.runtime.remote import RemoteRuntime
from backchannel.server import create_app, served

PORT = int(os.environ.get("PORT", "8123"))
supervisor = create_deep_agent("offline", name="supervisor")  # or "openai:gpt-4o-mini", ...
# The same agent from a shell: backchannel serve --agents server:supervisor   (run in this directory)


async def main() -> None:
    runtime = LocalRuntime("memory", agents={"supervisor": served(supervisor)})
    server = uvicorn.Server(uvicorn.Config(create_app(runtime), port=PORT, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)

    client = get_client(url=f"http://127.0.0.1:{PORT}")  # the official LangGraph client, unchanged
    thread = await client.threads.create()
    async for part in client.runs.stream(thread["thread_id"], "supervisor",
                                         input={"messages": [{"role": "user", "content": "hello"}]},
                                         stream_mode="updates"):  # also "messages-tuple", "values", ...
        print(part.event, part.data)

    async with RemoteRuntime(f"http://127.0.0.1:{PORT}") as rt:  # LocalRuntime's surface, over HTTP
        thread = await rt.threads.create()
        values = await rt.runs.wait(thread["thread_id"], "supervisor", input="hi")
        print(values["messages"][-1]["content"])

    server.should_exit = True
    await serving


asyncio.run(main())
