"""The LangGraph API's shapes: rows rendered as its dicts, and its arguments read and checked.

Pure functions, shared by the runtime's clients, its executor and the HTTP
server, so a thread, run, state or error looks the same whichever way it is
reached (``langgraph_sdk`` against the server, or a ``LocalRuntime`` directly).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from backchannel.errors import InvalidRequestError
from backchannel.hitl import check_resume
from backchannel.messages import messages_from_input
from backchannel.runtime.rows import AssistantRow, CheckpointRow, CronRow, ItemRow, RunRow, ThreadRow
from backchannel.runtime.run_options import check_delay, check_stream_modes

__all__ = ["BUSY", "MULTITASK_STRATEGIES", "MultitaskStrategy", "check_namespace", "check_run_arguments",
           "checkpoint_id_of", "checkpoint_metadata", "input_update", "render_assistant", "render_cron",
           "render_error", "render_item", "render_run", "render_state", "render_thread", "resume_map", "run_kwargs"]

MultitaskStrategy = Literal["reject", "interrupt", "rollback", "enqueue"]
MULTITASK_STRATEGIES: tuple[str, ...] = get_args(MultitaskStrategy)
BUSY = "Thread is already running a task. Wait for it to finish or choose a different multitask strategy."

# Keys of a run's stored kwargs that are the runtime's own, not the run's options.
_INTERNAL_KWARGS = ("resume_map", "wake")
# The arguments a run row keeps only when given (readers take each with .get): a thousand live runs each keep their
# row, and a dict of three keys takes a third of one of fourteen. render_run lists them all again (LangGraph does).
_KWARGS_LEFT_OUT = frozenset({"command", "context", "stream_subgraphs", "stream_resumable", "checkpoint_id",
                              "temporary", "timeout", "wake", "webhook", "interrupt_before", "interrupt_after"})


# -- reading arguments ----------------------------------------------------------------------------


def check_run_arguments(modes: Sequence[str], strategy: str | None, if_not_exists: str | None,
                        on_completion: str | None, after_seconds: float | None) -> None:
    """Raise :class:`InvalidRequestError` naming the first of a run's options that LangGraph would refuse
    (its input and command: :mod:`~backchannel.runtime.run_options`)."""
    check_stream_modes(modes)
    check_delay(after_seconds)
    if strategy is not None and strategy not in MULTITASK_STRATEGIES:
        raise InvalidRequestError(f"unknown multitask_strategy {strategy!r}; use one of {list(MULTITASK_STRATEGIES)}")
    if if_not_exists not in (None, "reject", "create"):
        raise InvalidRequestError(f"if_not_exists must be 'reject' or 'create', not {if_not_exists!r}")
    if on_completion not in (None, "delete", "keep"):
        raise InvalidRequestError(f"on_completion must be 'delete' or 'keep', not {on_completion!r}")


def input_update(value: Any) -> dict[str, Any]:
    """A run's input as a state update: ``{"messages": [...], ...}`` (messages read from any accepted form)."""
    if isinstance(value, Mapping):
        update = dict(value)
        if "messages" in update:
            update["messages"] = messages_from_input(update["messages"])
        return update
    return {"messages": messages_from_input(value)}


def resume_map(thread: ThreadRow, resume: Any) -> dict[str, Any]:
    """Which pending interrupt each resume value answers: ``{interrupt_id: value}``.

    Raises :class:`InvalidRequestError` when the value cannot answer the
    thread's interrupts (none pending, ambiguous, or a malformed HITL decision).
    """
    pending = {i["id"]: i["value"] for i in thread.interrupts}
    if isinstance(resume, Mapping) and resume and set(resume) <= set(pending):
        answers = dict(resume)
    elif len(pending) == 1:
        answers = {next(iter(pending)): resume}
    elif not pending:
        if thread.status != "interrupted":
            raise InvalidRequestError(f"thread {thread.thread_id} has no pending interrupt to resume")
        return {}
    else:
        raise InvalidRequestError(f"thread {thread.thread_id} has {len(pending)} pending interrupts; resume with "
                                  f"a map {{interrupt_id: value}} for ids {sorted(pending)}")
    for interrupt_id, value in answers.items():
        check_resume(pending[interrupt_id], value)
    return answers


def checkpoint_id_of(checkpoint: Mapping[str, Any] | None) -> str | None:
    """The id in a checkpoint config (``{"checkpoint_id"}`` or ``{"configurable": {"checkpoint_id"}}``)."""
    if not checkpoint:
        return None
    found: str | None = (checkpoint["checkpoint_id"] if "checkpoint_id" in checkpoint
                         else (checkpoint.get("configurable") or {}).get("checkpoint_id"))
    return found


def check_namespace(namespace: Sequence[str], *, allow_empty: bool = False) -> tuple[str, ...]:
    """A store namespace as a tuple; :class:`InvalidRequestError` for one LangGraph refuses."""
    ns = tuple(namespace)
    if not ns and not allow_empty:
        raise InvalidRequestError("a namespace needs at least one label")
    for label in ns:
        # "." joins labels in the API's query strings, control characters in storage: either would alias
        if not isinstance(label, str) or not label or "." in label or not label.isprintable():
            raise InvalidRequestError(f"Namespace label {label!r} must be a non-empty string without periods "
                                      "or control characters")
    return ns


# -- rendering ------------------------------------------------------------------------------------


def render_error(error: Mapping[str, Any]) -> dict[str, Any]:
    """A run's stored error (``{"type", "message"}``) in LangGraph's shape: ``{"error", "message"}``.

    An error LangGraph has its own name for is named as LangGraph names it, so clients recognise it.
    """
    kind = error.get("type", "Error")
    return {"error": _LANGGRAPH_ERRORS.get(kind, kind), "message": error.get("message", "")}


_LANGGRAPH_ERRORS = {"MaxIterationsError": "GraphRecursionError"}


def render_assistant(row: AssistantRow, *, as_version: bool = False) -> dict[str, Any]:
    """An assistant as LangGraph returns it; ``as_version``: one of its versions (which has no ``updated_at``)."""
    found = {"assistant_id": row.assistant_id, "graph_id": row.graph_id, "config": row.config,
             "context": row.context, "metadata": row.metadata, "name": row.name, "description": row.description,
             "version": row.version, "created_at": row.created_at}
    if not as_version:
        found["updated_at"] = row.updated_at
    return found


def run_kwargs(given: Mapping[str, Any]) -> dict[str, Any]:
    """A run's arguments as its row keeps them: ``given`` without those of :data:`_KWARGS_LEFT_OUT` that are
    ``None`` or ``False`` (what reading them with .get gives)."""
    return {k: v for k, v in given.items() if (v is not None and v is not False) or k not in _KWARGS_LEFT_OUT}


def render_run(row: RunRow) -> dict[str, Any]:
    """A run as LangGraph returns it: every argument listed, those its row leaves out as they were given."""
    kwargs: dict[str, Any] = {
        "input": None, "command": None, "config": {}, "context": None, "stream_mode": ["values"],
        "stream_subgraphs": False, "stream_resumable": False, "checkpoint_id": None, "temporary": False,
        "timeout": None, "webhook": None, "interrupt_before": None, "interrupt_after": None}
    for k, v in row.kwargs.items():
        if k not in _INTERNAL_KWARGS:
            kwargs[k] = v
    return {"run_id": row.run_id, "thread_id": row.thread_id, "assistant_id": row.assistant_id,
            "metadata": row.metadata, "status": row.status, "kwargs": kwargs,
            "multitask_strategy": row.multitask_strategy, "created_at": row.scheduled_at or row.created_at,
            "updated_at": row.updated_at, "usage": row.usage}


def render_cron(row: CronRow) -> dict[str, Any]:
    """A cron as LangGraph returns it."""
    return {"cron_id": row.cron_id, "assistant_id": row.assistant_id, "thread_id": row.thread_id,
            "on_run_completed": row.on_run_completed, "end_time": row.end_time, "schedule": row.schedule,
            "timezone": row.timezone, "created_at": row.created_at, "updated_at": row.updated_at,
            "payload": row.payload, "user_id": None, "next_run_date": row.next_run_date,
            "metadata": row.metadata, "enabled": row.enabled}


def render_thread(row: ThreadRow, values: dict[str, Any] | None, head: CheckpointRow | None) -> dict[str, Any]:
    """A thread as LangGraph returns it, with its state's ``values`` (JSON-able; ``None`` before its first
    checkpoint)."""
    return {"thread_id": row.thread_id, "created_at": row.created_at, "updated_at": row.updated_at,
            "state_updated_at": head.created_at if head else row.updated_at, "metadata": row.metadata,
            "status": row.status, "config": {},
            "values": values if head is not None else None,
            "interrupts": _interrupts_by_task(row), "error": row.error}


def render_state(row: ThreadRow, values: dict[str, Any], head: CheckpointRow | None,
                 next_nodes: list[str]) -> dict[str, Any]:
    """A thread's state at checkpoint ``head`` as LangGraph returns it (a ThreadState), its ``values``
    JSON-able; ``next_nodes`` are the agent's nodes the run continues at."""
    if head is None:
        return {"values": {}, "next": [], "tasks": [], "metadata": None, "created_at": None, "checkpoint": None,
                "parent_checkpoint": None, "interrupts": [], "checkpoint_id": None, "parent_checkpoint_id": None}
    is_latest = row.interrupts and head.next and row.status == "interrupted"
    interrupts = [{"id": i["id"], "value": i["value"]} for i in row.interrupts] if is_latest else []
    tasks = [{"id": _task_id(row.thread_id, head.checkpoint_id, node), "name": node,
              "path": ["__pregel_pull", node], "error": None, "interrupts": interrupts, "checkpoint": None,
              "state": None, "result": None} for node in next_nodes]
    ref = {"checkpoint_id": head.checkpoint_id, "thread_id": row.thread_id, "checkpoint_ns": ""}
    parent = ({"checkpoint_id": head.parent_id, "thread_id": row.thread_id, "checkpoint_ns": ""}
              if head.parent_id else None)
    return {"values": values, "next": next_nodes, "tasks": tasks,
            "metadata": checkpoint_metadata(row, head), "created_at": head.created_at,
            "checkpoint": ref, "parent_checkpoint": parent, "interrupts": interrupts,
            "checkpoint_id": head.checkpoint_id, "parent_checkpoint_id": head.parent_id}


def checkpoint_metadata(row: ThreadRow, checkpoint: CheckpointRow) -> dict[str, Any]:
    """A checkpoint's metadata as LangGraph shows it: the thread's, the step's, and the run's id."""
    meta = {**row.metadata, **checkpoint.metadata, "thread_id": row.thread_id, "parents": {}}
    if checkpoint.run_id:
        meta["run_id"] = checkpoint.run_id
    return meta


def render_item(row: ItemRow) -> dict[str, Any]:
    """A store item as LangGraph returns it."""
    return {"namespace": list(row.namespace), "key": row.key, "value": row.value, "created_at": row.created_at,
            "updated_at": row.updated_at}


def _task_id(thread_id: str, checkpoint_id: str, node: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_OID, f"{thread_id}:{checkpoint_id}:{node}"))


def _interrupts_by_task(row: ThreadRow) -> dict[str, list[dict[str, Any]]]:
    if not row.interrupts:
        return {}
    return {_task_id(row.thread_id, "interrupt", "pending"): [{"id": i["id"], "value": i["value"]}
                                                              for i in row.interrupts]}
