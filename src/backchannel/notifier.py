"""Completion notifications: a background subagent tells its supervisor how its run ended.

:class:`CompletionNotifier` sits in the subagent's own middleware. It reads
the parent context (``parent_thread_id``, ``parent_assistant_id``,
``task_id``) from the subagent's state, where ``start_async_task`` put it in
the input, so the context survives interrupts and follow-up runs. When a run
ends with a result, an error or a question, it delivers one message to the
parent thread::

    [task_id=<id>][subagent=<name>] Completed. Result: <summary>
    [task_id=<id>][subagent=<name>] Error: <generic message>
    [task_id=<id>][subagent=<name>] Waiting for input: <question>

Each task run notifies once: the message's idempotency key is
``<task_id>:<run_id>``, and the parent's inbox keeps one message per key.
A supervisor on another server (``parent_url``) gets the message over HTTP,
through this runtime's outbox (:mod:`backchannel.runtime.outbox`). Without a
parent context the notifier does nothing.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from backchannel.agent import RunResult
from backchannel.context import RunContext
from backchannel.errors import NotFoundError
from backchannel.messages import AIMessage, HumanMessage
from backchannel.middleware import Middleware
from backchannel.tracing import trace_context

__all__ = ["CompletionNotifier", "ParentContext", "format_notification", "notification_message"]

SUMMARY_LIMIT = 500

logger = logging.getLogger("backchannel")


def _keep(current: Any, new: Any) -> Any:
    # Parent context is written once, by the first input; later inputs don't erase it.
    return current if current else new


class ParentContext(TypedDict, total=False):
    """The state keys a background subagent's input carries about its supervisor."""

    parent_thread_id: Annotated[str, _keep]
    parent_assistant_id: Annotated[str, _keep]
    task_id: Annotated[str, _keep]
    parent_url: Annotated[str, _keep]  # the supervisor's server, when it is not this runtime


def format_notification(task_id: str, subagent: str, status: str, detail: str) -> str:
    """The notification text for a task that ended ``success``, ``waiting``, ``error`` or ``timeout``."""
    head = f"[task_id={task_id}][subagent={subagent}]"
    if status == "success":
        if len(detail) > SUMMARY_LIMIT:
            detail = (detail[:SUMMARY_LIMIT] + f"… [truncated; call check_async_task(task_id=\"{task_id}\") "
                      "for the full result]")
        return f"{head} Completed. Result: {detail}"
    if status == "waiting":
        return f"{head} Waiting for input: {detail}"
    return f"{head} Error: {detail}"


def notification_message(task_id: str, subagent: str, status: str, detail: str, run_id: str,
                         trace: Mapping[str, str] | None = None) -> HumanMessage:
    """The user message that carries a notification, with a marker UIs can render specially.

    Its id derives from the idempotency key, so a redelivered copy replaces itself. ``trace`` is
    the W3C trace context of the task's run, for the supervisor's trace to link to.
    """
    key = f"{task_id}:{run_id}"
    marker: dict[str, Any] = {"task_id": task_id, "subagent": subagent, "status": status, "run_id": run_id}
    if trace:
        marker["trace_context"] = dict(trace)
    return HumanMessage(
        format_notification(task_id, subagent, status, detail),
        id=f"task-notification-{hashlib.sha1(key.encode()).hexdigest()[:24]}",
        additional_kwargs={"task_notification": marker},
    )


class CompletionNotifier(Middleware):
    """Notify the supervisor's thread when this (background) subagent's run ends."""

    state_schema = ParentContext

    async def on_end(self, state: Mapping[str, Any], ctx: RunContext, result: RunResult) -> None:
        """When the run ends with a result, an error or a question: deliver one notification."""
        parent, task_id = state.get("parent_thread_id"), state.get("task_id")
        if not parent or not task_id or ctx.runtime is None or ctx.parent is not None:
            return
        status, detail = _outcome(result)
        if status is None:
            return
        message = notification_message(task_id, ctx.agent, status, detail, ctx.run_id, trace_context())
        key, assistant_id = f"{task_id}:{ctx.run_id}", state.get("parent_assistant_id")
        url = state.get("parent_url")
        if url and url != getattr(ctx.runtime, "public_url", None):
            await ctx.runtime.outbox.put(key, url=url, thread_id=parent, assistant_id=assistant_id, message=message)
            return
        try:
            await ctx.runtime.deliver(parent, message, key=key, assistant_id=assistant_id)
        except NotFoundError:  # the supervisor's thread was deleted: nobody is left to tell
            logger.info("task %s ended after its supervisor's thread %s was deleted", task_id, parent)


def _outcome(result: RunResult) -> tuple[str | None, str]:
    """The notification status and detail for how a run ended (``None``: nothing to report)."""
    if result.status == "success":
        return "success", final_answer(result.state)
    if result.status == "interrupted":
        return "waiting", describe_question([i.value for i in result.interrupts])
    if result.status == "timeout":
        # An Error line, but the marker keeps the status, so the tracked task reads "timeout".
        return "timeout", "the task ran out of time before it finished."
    if result.status == "error":
        # Generic on purpose: exception text can hold internals the supervisor's model should not see.
        return "error", "the task failed before it finished."
    return None, ""


def final_answer(state: Mapping[str, Any]) -> str:
    """The text of the last AI message of a state ("" if there is none)."""
    for message in reversed(state.get("messages") or ()):
        if isinstance(message, AIMessage):
            return message.text
    return ""


def describe_question(values: list[Any]) -> str:
    """What a paused subagent is asking, in one line per interrupt."""
    lines = []
    for value in values:
        if isinstance(value, str):
            lines.append(value)
        elif isinstance(value, Mapping) and "action_requests" in value:
            lines += [f"approve {a['name']}({json.dumps(a['args'], default=str)})?" for a in value["action_requests"]]
        else:
            lines.append(json.dumps(value, default=str))
    return "; ".join(lines)
