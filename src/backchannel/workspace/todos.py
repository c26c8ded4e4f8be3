"""Planning: the ``write_todos`` tool and the todo list it keeps in the state.

As in LangChain's ``TodoListMiddleware`` (which deepagents uses): the model
writes the whole list each time, each item ``{"content", "status"}`` with a
status of ``pending``, ``in_progress`` or ``completed``. The list is the
state's ``todos`` key, so it is checkpointed, streamed as a state update and
shown by the chat's live panel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from typing_extensions import TypedDict  # pydantic reads its fields on Python 3.11 too

from backchannel.messages import AIMessage, ToolMessage
from backchannel.middleware import Middleware, ToolCallRequest, ToolHandler
from backchannel.tools import Tool, ToolResult

__all__ = ["TODO_STATUSES", "Todo", "TodoListMiddleware"]

TODO_STATUSES = ("pending", "in_progress", "completed")


class Todo(TypedDict):
    """One item of the plan."""

    content: str
    status: Literal["pending", "in_progress", "completed"]


WRITE_TODOS_DESCRIPTION = (
    "Use this tool to create and manage a structured task list for your current work session. It "
    "helps you track progress and organize complex tasks.\n"
    "\n"
    "Use it for work of 3 or more distinct steps, when the user gives several tasks, or asks for a "
    "todo list. Skip it for a single straightforward or conversational request.\n"
    "\n"
    "Each call replaces the whole list. Mark a task in_progress BEFORE you begin it and completed as "
    "soon as it is done (don't batch completions); add follow-up tasks as you discover them and "
    "remove ones that no longer matter. Unless all tasks are completed, keep at least one "
    "in_progress. Only mark a task completed when it is fully done.\n"
    "\n"
    "Statuses: pending (not started), in_progress (being worked on), completed (done).\n"
    "\n"
    "The list tracks your work; it does not answer the user: write the answer in a message after "
    "your last write_todos call."
)

WRITE_TODOS_SYSTEM_PROMPT = (
    "## `write_todos`\n"
    "\n"
    "You have the `write_todos` tool to plan and track complex objectives: break them into steps, "
    "mark each step in_progress when you start it and completed as soon as it is done. For simple "
    "requests, just do the work. Never call `write_todos` more than once in one reply."
)


class TodoListMiddleware(Middleware):
    """Adds ``write_todos``; the list lives in the state's ``todos`` key."""

    def __init__(self, *, system_prompt: str | None = None, tool_description: str | None = None) -> None:
        self.system_prompt = WRITE_TODOS_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.tools = [Tool(write_todos, name="write_todos", description=tool_description or WRITE_TODOS_DESCRIPTION,
                           inline=True)]

    async def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | ToolResult:
        """Refuse several ``write_todos`` calls in one reply: which list would win is anyone's guess."""
        call = request.call
        if call["name"] == "write_todos" and _calls_in_reply(request.state, "write_todos") > 1:
            return ToolMessage("Error: The `write_todos` tool should never be called multiple times in parallel. "
                               "Please call it only once per model invocation to update the todo list.",
                               call["id"], "write_todos", status="error")
        return await handler(request)


def write_todos(todos: list[Todo]) -> ToolResult:
    """Create or update the todo list.

    Args:
        todos: The whole list: each item has `content` (what to do) and `status` (pending, in_progress or completed).
    """
    items = [dict(t) for t in todos]
    return ToolResult(f"Updated todo list to {items}", update={"todos": items})


def _calls_in_reply(state: Mapping[str, Any], name: str) -> int:
    messages = state.get("messages") or ()
    reply = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
    return sum(1 for c in reply.tool_calls if c["name"] == name) if reply is not None else 0
