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
