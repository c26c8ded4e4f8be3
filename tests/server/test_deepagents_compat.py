"""deepagents' own async subagents, pointed at this server: start, check, update, list and cancel work unchanged.

The supervisor is built with ``deepagents.create_deep_agent`` on a scripted LangChain chat model; its
async subagents are assistants of the server under test, reached over HTTP by ``langgraph_sdk``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest

deepagents = pytest.importorskip("deepagents")

from langchain_core.language_models import BaseChatModel  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.outputs import ChatGeneration, ChatResult  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402

_COMMAND = re.compile(r"^(start_async_task|check_async_task|update_async_task|cancel_async_task|list_async_tasks) ")


class CommandModel(BaseChatModel):
    """Answers a user's "<tool> [args as JSON]" with that tool call, and a tool result with its text."""

    @property
    def _llm_type(self) -> str:
        return "command-model"

    def _generate(self, messages: Sequence[Any], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        answered = max((i for i, m in enumerate(messages) if isinstance(m, AIMessage)), default=-1)
        tail = messages[answered + 1:]  # deepagents may add its own task updates here: ignore them
        results = [m for m in tail if isinstance(m, ToolMessage)]
        commands = [m for m in tail if isinstance(m, HumanMessage) and isinstance(m.content, str)
                    and _COMMAND.match(m.content)]
        if results:
            reply = AIMessage(content=f"[{results[-1].name}] {results[-1].content}")
        elif commands:
            name, _, args = commands[-1].content.partition(" ")
            reply = AIMessage(content="", tool_calls=[{"name": name, "args": json.loads(args or "{}"),
                                                       "id": f"call_{len(messages)}"}])
        else:
            reply = AIMessage(content="noted")
        return ChatResult(generations=[ChatGeneration(message=reply)])

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def started_task(said: str) -> str:
    """The task id in start_async_task's answer ("Launched async subagent. task_id: ...")."""
    return re.search(r"task_id: (\S+)", said).group(1)


@pytest.fixture
def supervisor(server):
    agent = deepagents.create_deep_agent(model=CommandModel(), checkpointer=InMemorySaver(), subagents=[
        {"name": "echoer", "description": "Echoes", "graph_id": "echo", "url": server.url},
        {"name": "ponderer", "description": "Takes its time", "graph_id": "glacial", "url": server.url},
        {"name": "mailer", "description": "Sends email, with approval", "graph_id": "mailer", "url": server.url}])
    config = {"configurable": {"thread_id": "deepagents-supervisor"}}

    async def say(command: str, **args: Any) -> tuple[str, dict[str, Any]]:
        state = await agent.ainvoke({"messages": [HumanMessage(f"{command} {json.dumps(args)}")]}, config)
        return state["messages"][-1].content, state.get("async_tasks", {})

    return say


async def test_start_check_update_list_and_cancel(supervisor, client):
    said, tasks = await supervisor("start_async_task", description="hello there", subagent_type="echoer")
    echo_id = started_task(said)
    await client.runs.join(echo_id, tasks[echo_id]["run_id"])
    said, tasks = await supervisor("check_async_task", task_id=echo_id)
    assert tasks[echo_id]["status"] == "success"
    assert "echo: hello there" in said

    said, tasks = await supervisor("start_async_task", description="the meaning of life", subagent_type="ponderer")
    slow_id = started_task(said)
    first_run = tasks[slow_id]["run_id"]
    said, tasks = await supervisor("check_async_task", task_id=slow_id)
    assert tasks[slow_id]["status"] in ("pending", "running")
    said, tasks = await supervisor("update_async_task", task_id=slow_id, message="focus on 42")
    assert tasks[slow_id]["run_id"] != first_run
    assert (await client.runs.get(slow_id, first_run))["status"] == "interrupted"  # the update interrupted it
    said, tasks = await supervisor("list_async_tasks")
    assert echo_id in said and slow_id in said
    said, tasks = await supervisor("cancel_async_task", task_id=slow_id)
    assert said.startswith("[cancel_async_task] Cancelled async subagent task")
    assert tasks[slow_id]["status"] == "cancelled"
    assert (await client.runs.get(slow_id, tasks[slow_id]["run_id"]))["status"] == "interrupted"
    thread = await client.threads.get(slow_id)
    assert [m["content"] for m in thread["values"]["messages"]] == ["the meaning of life", "focus on 42"]
    assert thread["metadata"]["subagent_name"] == "ponderer"


async def test_a_subagent_waiting_for_approval_is_waiting_not_cancelled(supervisor, client):
    said, tasks = await supervisor("start_async_task", description="hi Ada", subagent_type="mailer")
    task_id = started_task(said)
    await client.runs.join(task_id, tasks[task_id]["run_id"])
    said, tasks = await supervisor("check_async_task", task_id=task_id)
    assert tasks[task_id]["status"] == "waiting"
    assert "send_email" in said


# -- seed 000's notification, taken by a deepagents supervisor ----------------------------------------


class SupervisorHost:
    """A deepagents supervisor graph behind the Agent Server routes a subagent's wake-up uses, as a LangGraph
    server answers them: ``GET /threads/{id}`` (status; metadata with the assistant that runs on it) and
    ``POST /threads/{id}/runs`` (a run of the graph on that thread; 409 with ``reject`` while one is going)."""

    def __init__(self, graph: Any) -> None:
        import asyncio

        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route

        self.graph = graph
        self.busy = asyncio.Lock()  # one run at a time per thread, as a server queues them
        self.pushed: list[dict[str, Any]] = []  # the runs others created here
        self._tasks: set[Any] = set()

        async def get_thread(request: Any) -> Any:
            return JSONResponse({"thread_id": request.path_params["thread_id"],
                                 "status": "busy" if self.busy.locked() else "idle",
                                 "metadata": {"assistant_id": "supervisor", "graph_id": "supervisor"}})

        async def create_run(request: Any) -> Any:
            body = await request.json()
            thread_id = request.path_params["thread_id"]
            if body.get("multitask_strategy") == "reject" and self.busy.locked():
                return JSONResponse({"detail": "thread is busy"}, status_code=409)
            self.pushed.append(body)
            task = asyncio.create_task(self.invoke(body["input"], thread_id))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return JSONResponse({"run_id": f"run-{len(self.pushed)}", "thread_id": thread_id,
                                 "assistant_id": body["assistant_id"], "status": "pending", "metadata": {}})

        self.app = Starlette(routes=[Route("/threads/{thread_id}", get_thread),
                                     Route("/threads/{thread_id}/runs", create_run, methods=["POST"])])

    async def invoke(self, input: Any, thread_id: str = "supervisor-thread") -> dict[str, Any]:
        async with self.busy:
            return await self.graph.ainvoke(input, {"configurable": {"thread_id": thread_id}})

    async def settled(self) -> dict[str, Any]:
        """The supervisor's state once no run is going or about to start."""
        import asyncio

        for _ in range(3):
            while self._tasks or self.busy.locked():
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # room for a late push
        return (await self.graph.aget_state({"configurable": {"thread_id": "supervisor-thread"}})).values


class LoopServer:
    """uvicorn serving ``app`` on a free loopback port, on the running event loop."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))

    async def __aenter__(self) -> str:
        import asyncio

        self.task = asyncio.create_task(self.server.serve())
        while not self.server.started:
            await asyncio.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        await self.task


def _notifications(messages: Sequence[Any], task_id: str) -> list[Any]:
    return [m for m in messages
            if (m.additional_kwargs or {}).get("deepagents_notification", {}).get("task_id") == task_id]


async def test_a_deepagents_supervisor_is_woken_by_our_notification_once(tmp_path):
    from server_agents import echo, slow
    from server_helpers import ThreadServer

    from backchannel.notifier import CompletionNotifier
    from backchannel.runtime import LocalRuntime
    from backchannel.server import create_app, served

    host = SupervisorHost(None)
    async with LoopServer(host.app) as supervisor_url:
        # deepagents tells a subagent on another server its supervisor's thread, not where it is.
        notifier = CompletionNotifier(supervisor_url=supervisor_url)
        agents = {name: served(agent.copy(middleware=[*agent.middleware, notifier]))
                  for name, agent in (("echo", echo), ("slow", slow))}
        with ThreadServer(create_app(LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents))) as subagents:
            host.graph = deepagents.create_deep_agent(model=CommandModel(), checkpointer=InMemorySaver(), subagents=[
                {"name": "echoer", "description": "Echoes", "graph_id": "echo", "url": subagents.url},
                {"name": "ponderer", "description": "Takes a moment", "graph_id": "slow", "url": subagents.url}])

            async def say(command: str, **args: Any) -> dict[str, Any]:
                return await host.invoke({"messages": [HumanMessage(f"{command} {json.dumps(args)}")]})

            # The slow task ends after the supervisor's run: our notification wakes it.
            state = await say("start_async_task", description="the meaning of life", subagent_type="ponderer")
            slow_id = started_task(state["messages"][-1].content)
            slow_run = state["async_tasks"][slow_id]["run_id"]
            assert state["async_tasks"][slow_id]["status"] in ("pending", "running")
            state = await host.settled()
            [woken] = host.pushed
            assert woken["assistant_id"] == "supervisor"  # read from the supervisor's thread, as its server has it
            [note] = _notifications(state["messages"], slow_id)
            assert note.additional_kwargs["deepagents_notification"] == {
                "task_id": slow_id, "agent_name": "ponderer", "status": "success", "run_id": slow_run}
            assert note.additional_kwargs["task_notification"]["task_id"] == slow_id  # ours, kept
            assert note.content.startswith(f"[task_id={slow_id}][subagent=ponderer] Completed. Result: ")
            assert state["async_tasks"][slow_id]["status"] == "success"  # its middleware took it as its own
            assert state["messages"][-1].content == "noted"  # and its model answered, unprompted

            # The echo task may end while the supervisor still runs (it then finds the result itself and
            # we don't wake it) or after: either way the supervisor hears of it once.
            state = await say("start_async_task", description="hello there", subagent_type="echoer")
            [echo_id] = set(state["async_tasks"]) - {slow_id}
            await host.settled()
            state = await say("list_async_tasks")  # and checking its tasks again finds nothing new
            state = await host.settled()
            assert state["async_tasks"][echo_id]["status"] == "success"
            assert len(_notifications(state["messages"], echo_id)) == 1
            assert len(_notifications(state["messages"], slow_id)) == 1
            assert len(host.pushed) in (1, 2)
