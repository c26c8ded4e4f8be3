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

Its marker (``additional_kwargs.task_notification``) names the task, its subagent,
status and run, and says whether the task's state holds files (``files``): a
supervisor sharing its workspace reads a finished task's state for them only then.

The message also carries deepagents' marker
(``additional_kwargs.deepagents_notification``), so a deepagents supervisor's
middleware takes it as one of its own: it records the task's status and does
not report it again when it checks its tasks. deepagents names the parent in
the task thread's metadata (``parent_thread_id``, ``subagent_name``) rather
than in the input, and, from another server, not where it is: give the
notifier ``supervisor_url`` to reach such supervisors. They are woken as
deepagents wakes them: only while idle, once, without retries (a busy or
unreachable one reads the task's status itself the next time it runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from backchannel.agent import RunResult
from backchannel.context import RunContext
from backchannel.errors import BackchannelError, NotFoundError
from backchannel.messages import AIMessage, HumanMessage, message_to_dict
from backchannel.middleware import Middleware
from backchannel.protocols import HostRuntime
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
                         trace: Mapping[str, str] | None = None, *, files: bool | None = None) -> HumanMessage:
    """The user message that carries a notification, with markers UIs (ours, deepagents') render specially.

    Its id derives from the idempotency key, so a redelivered copy replaces itself. ``trace`` is
    the W3C trace context of the task's run, for the supervisor's trace to link to. ``files`` says
    whether the task's state holds files (``None``: not known), so a supervisor sharing its workspace
    reads the task's state for them only when there are some.
    """
    key = f"{task_id}:{run_id}"
    marker: dict[str, Any] = {"task_id": task_id, "subagent": subagent, "status": status, "run_id": run_id}
    if trace:
        marker["trace_context"] = dict(trace)
    if files is not None:
        marker["files"] = files
    return HumanMessage(
        format_notification(task_id, subagent, status, detail),
        id=f"task-notification-{hashlib.sha1(key.encode()).hexdigest()[:24]}",
        additional_kwargs={
            "task_notification": marker,
            "deepagents_notification": {"task_id": task_id, "agent_name": subagent, "status": status,
                                        "run_id": run_id},
        },
    )


class CompletionNotifier(Middleware):
    """Notify the supervisor's thread when this (background) subagent's run ends.

    ``supervisor_url`` is the server of supervisors that name their thread but
    not their server (deepagents' async subagents on another server), reached
    with ``supervisor_headers`` (e.g. ``{"x-api-key": ...}``); without it such a
    supervisor is taken to be on this runtime.
    """

    state_schema = ParentContext
    on_end_stores_last_step = True  # only a run that reports (a background task's) waits for it

    def __init__(self, *, supervisor_url: str | None = None,
                 supervisor_headers: Mapping[str, str] | None = None) -> None:
        self.supervisor_url = supervisor_url
        self.supervisor_headers = dict(supervisor_headers or {})

    async def on_end(self, state: Mapping[str, Any], ctx: RunContext, result: RunResult) -> None:
        """When the run ends with a result, an error or a question: deliver one notification."""
        runtime = ctx.runtime
        if runtime is None or ctx.parent is not None:
            return
        status, detail = _outcome(result)
        if status is None:
            return
        if ctx.recorder is not None and (state.get("task_id") or ctx.metadata.get("parent_thread_id")):
            await ctx.recorder.flush()  # what the supervisor is told is what the task's thread has stored
        if state.get("task_id"):  # started by backchannel: the parent context is in the input
            if state.get("parent_thread_id"):
                await self._notify(runtime, state, ctx, notification_message(
                    state["task_id"], ctx.agent, status, detail, ctx.run_id, trace_context(),
                    files=_holds_files(state)))
        elif ctx.metadata.get("parent_thread_id") and ctx.thread_id is not None:  # started by deepagents
            subagent = ctx.metadata.get("subagent_name") or ctx.agent
            await self._wake_deepagents_parent(runtime, ctx, notification_message(
                ctx.thread_id, subagent, status, detail, ctx.run_id, trace_context()))

    async def _notify(self, runtime: HostRuntime, state: Mapping[str, Any], ctx: RunContext,
                      message: HumanMessage) -> None:
        """Deliver once per task run: to this runtime, or through its outbox to the parent's server."""
        parent, task_id = state["parent_thread_id"], state["task_id"]
        key, assistant_id, url = f"{task_id}:{ctx.run_id}", state.get("parent_assistant_id"), state.get("parent_url")
        if url and url != runtime.public_url:
            await runtime.deliver_remote(url, parent, message, key=key, assistant_id=assistant_id)
            return
        try:
            await runtime.deliver(parent, message, key=key, assistant_id=assistant_id)
        except NotFoundError:  # the supervisor's thread was deleted: nobody is left to tell
            logger.info("task %s ended after its supervisor's thread %s was deleted", task_id, parent)

    async def _wake_deepagents_parent(self, runtime: HostRuntime, ctx: RunContext, message: HumanMessage) -> None:
        """Wake a deepagents supervisor as its own subagents do: with a run on its thread, only while the
        thread is idle (a busy one checks its tasks itself), and never raising."""
        parent, assistant_id = ctx.metadata["parent_thread_id"], ctx.metadata.get("parent_assistant_id")
        if self.supervisor_url is None:
            with contextlib.suppress(NotFoundError):  # a supervisor on this runtime, if there is one
                await runtime.deliver(parent, message, key=f"{ctx.thread_id}:{ctx.run_id}",
                                      assistant_id=assistant_id)
            return
        from backchannel.runtime.remote import RemoteRuntime

        try:
            async with RemoteRuntime(self.supervisor_url, api_key=None, headers=self.supervisor_headers,
                                     timeout=10.0) as remote:
                thread = await remote.threads.get(parent)
                if thread.get("status") not in ("idle", "error"):
                    return
                metadata = thread.get("metadata") or {}
                assistant_id = assistant_id or metadata.get("assistant_id") or metadata.get("graph_id") or "agent"
                await remote.runs.create(parent, assistant_id, input={"messages": [message_to_dict(message)]},
                                         multitask_strategy="reject")
        except BackchannelError as exc:  # gone, busy after all, or unreachable: it finds out when it checks
            logger.info("task %s could not wake its supervisor's thread %s: %s", ctx.thread_id, parent, exc)


def _holds_files(state: Mapping[str, Any]) -> bool:
    """Whether a task's state holds files (imported here: a server with no background subagent, which only
    they notify from, never loads the workspace)."""
    from backchannel.workspace.state import FILES_KEY

    return bool(state.get(FILES_KEY))


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
