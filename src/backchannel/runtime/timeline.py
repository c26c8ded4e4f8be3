"""A thread's timeline: its runs and its background tasks' runs, each with the spans it recorded.

Built on request from what runs keep when they end (their usage in their
rows, their spans beside them), so running an agent pays nothing for it::

    {"thread_id": ..., "usage": {...},        # the thread's tokens, its tasks' included (and by subagent)
     "threads": [                             # the thread, then its tasks' threads (and theirs), oldest first
        {"thread_id", "name", "parent_thread_id", "tool_call_id", "status", "usage",
         "runs": [{"run_id", "status", "created_at", "updated_at", "usage", "error", "spans": [...]}]}]}

A task's thread names the subagent (``name``) and the tool call that started
it (``tool_call_id``); spans are :meth:`backchannel.tracing.Trace.span_dicts`.
"""

from __future__ import annotations

from typing import Any, Protocol

from backchannel.errors import NotFoundError
from backchannel.runtime.rows import ThreadRow
from backchannel.runtime.storage import RunStorage, ThreadStorage
from backchannel.usage import add_total, empty_usage, sum_usage

__all__ = ["MAX_TASK_THREADS", "MAX_RUNS", "thread_timeline"]

MAX_TASK_THREADS = 500  # task threads shown at most (a thread's own and its tasks', breadth first)
MAX_RUNS = 1_000  # runs shown per thread at most (its newest)


class TimelineStorage(ThreadStorage, RunStorage, Protocol):
    """What a timeline reads: threads and runs."""


async def thread_timeline(storage: TimelineStorage, thread_id: str, *, spans: bool = True) -> dict[str, Any]:
    """The timeline of ``thread_id`` (:class:`NotFoundError` if there is no such thread); with ``spans=False``
    its runs' usage without their spans (the thread's token usage is its ``usage``)."""
    root = await storage.get_thread(thread_id)
    if root is None:
        raise NotFoundError(f"Thread with ID {thread_id} not found")
    lanes = [await _lane(storage, root, root.metadata.get("graph_id") or "agent", spans)]
    queue = [thread_id]
    while queue and len(lanes) <= MAX_TASK_THREADS:
        parent = queue.pop(0)
        for task in await storage.search_threads(metadata={"parent_thread_id": parent}, limit=MAX_TASK_THREADS,
                                                 sort_by="created_at", sort_order="asc"):
            lanes.append(await _lane(storage, task, task.metadata.get("subagent") or "task", spans))
            queue.append(task.thread_id)
    usage = empty_usage()
    add_total(usage, lanes[0]["usage"])
    for lane in lanes[1:]:
        add_total(usage, lane["usage"], lane["name"])
    return {"thread_id": thread_id, "usage": usage, "threads": lanes[: MAX_TASK_THREADS + 1]}


async def _lane(storage: TimelineStorage, thread: ThreadRow, name: str, with_spans: bool) -> dict[str, Any]:
    """One thread's row of the timeline: its runs, oldest first, with their spans."""
    runs = list(reversed(await storage.list_runs(thread.thread_id, limit=MAX_RUNS)))
    spans = await storage.run_spans(thread.thread_id) if with_spans else {}
    return {"thread_id": thread.thread_id, "name": name, "parent_thread_id": thread.metadata.get("parent_thread_id"),
            "tool_call_id": thread.metadata.get("tool_call_id"), "status": thread.status,
            "usage": sum_usage(r.usage for r in runs),
            "runs": [{"run_id": r.run_id, "status": r.status, "created_at": r.created_at, "updated_at": r.updated_at,
                      "usage": r.usage, "error": r.error, "spans": spans.get(r.run_id, [])} for r in runs]}
