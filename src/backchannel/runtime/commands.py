"""The v2 protocol's commands on a thread: ``run.start``, ``input.respond``, ``agent.getTree``.

``client.threads.stream(...)`` in ``langgraph_sdk`` (and ``RemoteGraph.stream_events(version="v3")``, the JS
SDK's ``client.threads.stream``) starts runs with commands and follows them on the thread's v2 stream
(:mod:`~backchannel.runtime.threadlog`). ``run.start`` starts a run on the thread (made if new), or resumes
it when it waits for an answer and the command gives an input; ``input.respond`` answers pending interrupts
by id; ``agent.getTree`` tells the current run's agents and their status. A run started this way streams
every mode, subagents included, and keeps its events for subscribers that join late (as LangGraph's do).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from backchannel.errors import InvalidRequestError
from backchannel.runtime.clients import RunsClient, ThreadsClient
from backchannel.runtime.queue import RunQueue
from backchannel.runtime.storage import Storage
from backchannel.runtime.threadlog import ThreadLogs
from backchannel.runtime.wire import MULTITASK_STRATEGIES

__all__ = ["STREAM_MODES", "CommandError", "ThreadCommands"]

# What a run started by a command streams: every mode the protocol has a channel for.
STREAM_MODES = ["values", "updates", "messages-tuple", "tools", "lifecycle", "custom", "tasks", "checkpoints"]
_SETTLE = 5.0  # seconds to wait for a run that paused for a person to record its pause


class CommandError(InvalidRequestError):
    """A command the protocol refuses, with the protocol's error ``code`` (``invalid_argument``, ``no_such_run``,
    ``no_such_interrupt``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class ThreadCommands:
    """Runs the protocol's commands against the runtime's runs and threads."""

    def __init__(self, runs: RunsClient, threads: ThreadsClient, storage: Storage, queue: RunQueue,
                 logs: ThreadLogs) -> None:
        self.runs = runs
        self.threads = threads
        self.storage = storage
        self.queue = queue
        self.logs = logs

    async def run_start(self, thread_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Start a run (``{"run_id"}``): a new one with ``params["input"]``, or, on a thread waiting for an
        answer, the run that resumes it with that input as the answer."""
        assistant_id = params.get("assistant_id")
        if not isinstance(assistant_id, str) or not assistant_id:
            raise CommandError("invalid_argument", "run.start requires an assistant_id")
        config = _mapping(params, "config")
        strategy = params.get("multitaskStrategy", params.get("multitask_strategy")) or "enqueue"
        if strategy not in MULTITASK_STRATEGIES:
            raise CommandError("invalid_argument", f"unknown multitaskStrategy {strategy!r}; use one of "
                                                   f"{list(MULTITASK_STRATEGIES)}")
        value = params.get("input")
        options: dict[str, Any] = {"input": value}
        if value is not None and await self._waits_for_answer(thread_id):
            options = {"command": {"resume": value}}
        checkpoint_id = ((config or {}).get("configurable") or {}).get("checkpoint_id")
        if checkpoint_id is not None:
            options["checkpoint_id"] = checkpoint_id
        run = await self._start(thread_id, assistant_id, options, config=config, metadata=_mapping(params, "metadata"),
                                multitask_strategy=strategy)
        return {"run_id": run["run_id"]}

    async def input_respond(self, thread_id: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Answer interrupts the thread waits on (one ``interrupt_id``/``response``, or ``responses``), in one
        run that resumes the thread (with the optional ``update`` and ``goto``)."""
        answers = _answers(params)
        thread = await self.storage.get_thread(thread_id)
        if thread is None:
            raise CommandError("no_such_run", f"thread {thread_id} has no run waiting for an answer")
        if thread.status == "busy":  # its run may have paused a moment ago and not recorded it yet
            await self._settle(thread_id)
            thread = await self.storage.get_thread(thread_id) or thread
        pending = {i["id"] for i in thread.interrupts}
        unknown = [i for i in answers if i not in pending]
        if unknown:
            raise CommandError("no_such_interrupt", f"unknown or already answered interrupt: {unknown[0]}")
        assistant_id = thread.metadata.get("assistant_id") or thread.metadata.get("graph_id")
        if not assistant_id:
            raise CommandError("no_such_run", f"thread {thread_id} has no run waiting for an answer")
        command: dict[str, Any] = {"resume": answers}
        for key in ("update", "goto"):
            if params.get(key) is not None:
                command[key] = params[key]
        await self._start(thread_id, assistant_id, {"command": command}, config=_mapping(params, "config"),
                          metadata=_mapping(params, "metadata"), multitask_strategy="enqueue")
        return {}

    def agent_tree(self, thread_id: str) -> dict[str, Any]:
        """The current run's agents: ``{"tree": {namespace, status, graph_name, children}}``."""
        tree = self.logs.get(thread_id).tree()
        if tree is None:
            raise CommandError("no_such_run", f"no run of thread {thread_id} has been seen on its stream")
        return {"tree": tree}

    async def _start(self, thread_id: str, assistant_id: str, options: dict[str, Any], **more: Any) -> dict[str, Any]:
        log = self.logs.get(thread_id)  # first: the thread's stream sees the run from its first event
        started: dict[str, Any] = await self.runs.create(
            thread_id, assistant_id, **options, **{k: v for k, v in more.items() if v is not None},
            stream_mode=STREAM_MODES, stream_subgraphs=True, stream_resumable=True, if_not_exists="create")
        log.commanded(started["run_id"])
        return started

    async def _waits_for_answer(self, thread_id: str) -> bool:
        """Whether the thread waits for a person's answer (settling first if its run has just paused)."""
        thread = await self.storage.get_thread(thread_id)
        if thread is not None and thread.status == "busy":
            await self._settle(thread_id)
            thread = await self.storage.get_thread(thread_id)
        return thread is not None and thread.status == "interrupted" and bool(thread.interrupts)

    async def _settle(self, thread_id: str) -> None:
        """Wait (a while) for the thread's run to record its end when its stream says it paused for a person:
        the pause is streamed a moment before it is stored."""
        current = self.logs.get(thread_id).current
        if current is None or not current.interrupted:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_SETTLE):
                await self.queue.wait_for(current.run_id)


def _mapping(params: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise CommandError("invalid_argument", f"{key} must be an object")
    return dict(value)


def _answers(params: Mapping[str, Any]) -> dict[str, Any]:
    """``{interrupt_id: response}`` from ``input.respond``'s one answer or its ``responses``."""
    responses = params.get("responses")
    if responses is None:
        responses = [params]
    elif not isinstance(responses, list) or not responses:
        raise CommandError("invalid_argument", "input.respond needs responses: a non-empty array")
    answers: dict[str, Any] = {}
    for entry in responses:
        interrupt_id = entry.get("interrupt_id") if isinstance(entry, Mapping) else None
        if not isinstance(interrupt_id, str):
            raise CommandError("invalid_argument", "input.respond requires an interrupt_id")
        namespace = entry.get("namespace", [])
        if not isinstance(namespace, list) or not all(isinstance(s, str) for s in namespace):
            raise CommandError("invalid_argument", "input.respond requires namespace to be a list of strings")
        answers[interrupt_id] = entry.get("response")
    return answers
