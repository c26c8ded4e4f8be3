"""Background subagents: tasks that run while the supervisor keeps working.

A task is a run on a child thread of the supervisor's runtime (thread
metadata: ``parent_thread_id``, ``subagent``); its ``task_id`` is that
thread's id. The supervisor's model manages tasks with five tools, named and
shaped as deepagents names them so prompts carry over::

    start_async_task(description, subagent_type)   check_async_task(task_id)
    update_async_task(task_id, message)            cancel_async_task(task_id)
    list_async_tasks(status_filter)

Statuses: pending, running, success, error, cancelled, timeout, waiting
(paused for human input). Tracked tasks live in the supervisor's state under
``async_tasks``, so they survive restarts. A finished task notifies the
supervisor (:mod:`backchannel.notifier`): into its next model call while it
runs, or by waking it with a new run. With ``completion="wait"`` the
supervisor's run does not end while tasks are pending: it waits for the next
notifications (those arriving within :data:`COALESCE_GAP` of each other, for at
most :data:`COALESCE_MAX`, are taken together) and goes back to the model. Such
wake-ups don't count towards the agent's ``max_iterations``. Once the last
pending task has been heard, the supervisor's stream gets a ``task`` event
``{"event": "drained", "tasks": {task_id: status}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

from backchannel._clock import now_iso
from backchannel.agent import Agent
from backchannel.context import Inbox, RunContext, forward_events
from backchannel.errors import BackchannelError, NotFoundError, RemoteError
from backchannel.hitl import is_review_request
from backchannel.messages import AIMessage, HumanMessage, text_of
from backchannel.middleware import Middleware
from backchannel.notifier import CompletionNotifier, describe_question, notification_message
from backchannel.protocols import HostRuntime, Runtime
from backchannel.subagents import Delegates, SubAgent
from backchannel.tools import Tool, ToolError, ToolResult, ToolRuntime
from backchannel.workspace.state import FILES_KEY, files_written_since

if TYPE_CHECKING:
    from backchannel.runtime.remote import RemoteRuntime

__all__ = ["AsyncSubAgentMiddleware", "AsyncTaskState", "TASK_STATUSES", "task_status"]

TASK_STATUSES = ("pending", "running", "success", "error", "cancelled", "timeout", "waiting")
_ACTIVE = frozenset({"pending", "running"})
_TASKS = uuid.UUID("9a3c4f9e-52b1-4c8e-8f43-2d1f6a0b7c11")  # namespace of the task ids derived from tool calls
_RECHECK_SECONDS = 1.0
COALESCE_GAP = 0.01  # wait mode: results this close together go to the model in one call...
COALESCE_MAX = 0.1  # ...holding the first for at most this long


def merge_tasks(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """The ``async_tasks`` reducer: update the given tasks' fields, keep the others."""
    merged = dict(current or {})
    for task_id, fields in new.items():
        merged[task_id] = {**merged.get(task_id, {}), **fields}
    return merged


class AsyncTaskState(TypedDict, total=False):
    async_tasks: Annotated[dict[str, dict[str, Any]], merge_tasks]


async def task_status(runtime: Runtime, task: Mapping[str, Any]) -> str:
    """A task's live status, from its latest run and its thread.

    As LangGraph reports them: a run cancelled is ``interrupted``; a run that paused for a
    human ``success``, with its thread ``interrupted`` (then the task is ``waiting``).
    """
    status, _ = await _status_and_thread(runtime, task)
    return status


async def _status_and_thread(runtime: Runtime, task: Mapping[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """:func:`task_status`, with the thread it read to tell ``success`` from ``waiting`` (else ``None``).

    The thread carries its values and interrupts, so callers read the result or the question
    from it instead of reading the thread again.
    """
    run = await runtime.runs.get(task["task_id"], task["run_id"])
    status = run["status"]
    if status == "interrupted":
        return "cancelled", None
    if status != "success":
        return status, None
    thread = await runtime.threads.get(task["task_id"])
    return ("waiting" if thread["status"] == "interrupted" and thread["interrupts"] else "success"), thread


def _questions(thread: Mapping[str, Any]) -> list[Any]:
    """The values of a thread's pending interrupts."""
    return [i["value"] for v in thread["interrupts"].values() for i in v]


_DETAIL_KEYS = {"success": "result", "waiting": "question", "error": "error", "timeout": "error"}


async def task_outcome(runtime: Runtime, task: Mapping[str, Any]) -> tuple[str, str | None]:
    """A task's status and what there is to say about it: its result, its question, or that it failed."""
    status, thread = await _status_and_thread(runtime, task)
    if status == "success" and thread is not None:
        values = thread["values"] or {}  # None: the thread has no checkpoint yet
        answers = [m for m in values.get("messages", []) if m["type"] == "ai"]
        return status, text_of(answers[-1]["content"]) if answers else ""
    if status == "waiting" and thread is not None:
        return status, describe_question(_questions(thread))
    if status in ("error", "timeout"):
        return status, "the task timed out" if status == "timeout" else "the task failed before it finished"
    return status, None


async def watch_remote_run(rt: HostRuntime, home: Runtime, subagent: str, task_id: str, run_id: str,
                           parent_thread_id: str, parent_assistant_id: str | None, *,
                           done: Callable[[], None]) -> None:
    """Wait for a task's run on another server to end, then notify its supervisor on ``rt`` (once per run)."""
    delay = 0.5
    try:
        while True:
            try:
                await home.runs.join(task_id, run_id)
                status, detail = await task_outcome(home, {"task_id": task_id, "run_id": run_id})
                break
            except RemoteError:  # the server is away: wait for it
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
            except NotFoundError:
                return  # the task's thread or run is gone
        if detail is None:
            return  # cancelled: nothing to report
        message = notification_message(task_id, subagent, status, detail, run_id)
        await rt.deliver(parent_thread_id, message, key=f"{task_id}:{run_id}", assistant_id=parent_assistant_id)
    finally:
        done()


class AsyncSubAgentMiddleware(Middleware):
    """Adds the background-task tools for ``subagents`` and keeps their status in the state."""

    state_schema = AsyncTaskState

    def __init__(self, subagents: Sequence[SubAgent], *, model: Any, tools: Sequence[Any],
                 completion: Literal["notify", "wait"] = "notify", max_concurrent: int = 16) -> None:
        if completion not in ("notify", "wait"):
            raise ValueError(f"completion must be 'notify' or 'wait', not {completion!r}")
        self.delegates = Delegates(subagents, model=model, tools=tools,
                                   extra_middleware=lambda: [CompletionNotifier()])
        self.completion = completion
        self.max_concurrent = max_concurrent
        self._remotes: dict[str, RemoteRuntime] = {}  # per remote subagent
        self._watched: set[str] = set()  # remote task runs watched from this process
        self.tools = [
            Tool(self.start_async_task, name="start_async_task", description=(
                "Start a subagent on a task in the background and return its task_id at once. Keep working or "
                "answer the user meanwhile: you will be notified when it finishes.\n\nAvailable subagent "
                "types:\n" + self.delegates.listing())),
            Tool(self.check_async_task, name="check_async_task"),
            Tool(self.update_async_task, name="update_async_task"),
            Tool(self.cancel_async_task, name="cancel_async_task"),
            Tool(self.list_async_tasks, name="list_async_tasks"),
        ]
        self.system_prompt = (
            "You can run subagents in the background with `start_async_task`. It returns at once with a "
            "task_id; the task's result arrives later as a message starting with [task_id=...]. Meanwhile keep "
            "working or answer the user. Use check_async_task, update_async_task, cancel_async_task and "
            "list_async_tasks to manage tasks. Don't poll: wait for the notification.")

    # -- tools ---------------------------------------------------------------

    async def start_async_task(self, description: str, subagent_type: str, runtime: ToolRuntime) -> ToolResult:
        """Start a subagent on a task in the background; returns its task_id at once.

        Args:
            description: The whole task, with every detail the subagent needs; it sees nothing else.
            subagent_type: Which subagent to use (one of the available types).
        """
        ctx, rt = _runtime_of(runtime)
        spec = self.delegates.spec(subagent_type)
        home = self._home(rt, spec.name)
        local = home is rt
        # The id of the task's thread, created with its first run. Here it is derived from the tool call,
        # so the call made again after a crash (its result was not recorded) finds the task it started.
        task_id = str(uuid.uuid5(_TASKS, f"{ctx.thread_id}:{ctx.run_id}:{runtime.tool_call_id}") if local
                      else uuid.uuid4())
        with _remote_errors(spec, "start"):
            # once: on this runtime, the call made again after a crash gets the run it started before
            run = await self._start_run(home, ctx, spec, task_id, runtime.tool_call_id, once=local,
                                        if_not_exists="create",
                                        metadata={"parent_thread_id": ctx.thread_id, "subagent": spec.name,
                                                  "tool_call_id": runtime.tool_call_id},
                                        input={"messages": [HumanMessage(description)],
                                               **self._parent_context(rt, ctx, spec, task_id),
                                               **self._shared_files(runtime, spec)})
        now = now_iso()
        task = {"task_id": task_id, "subagent": spec.name, "description": description, "status": "pending",
                "run_id": run["run_id"], "tool_call_id": runtime.tool_call_id, "created_at": now, "updated_at": now}
        if spec.url is not None:
            task["url"] = spec.url
        ctx.emit("task", {**task})
        return ToolResult(f"Started task {task_id} ({spec.name}) in the background. Its result will arrive as a "
                          "message; keep working or answer the user meanwhile.",
                          update={"async_tasks": {task_id: task}})

    async def check_async_task(self, task_id: str, runtime: ToolRuntime) -> ToolResult:
        """A background task's status and, once it has finished, its full result.

        Args:
            task_id: The id start_async_task returned.
        """
        ctx, rt = _runtime_of(runtime)
        task = _tracked(runtime, task_id)
        home = self._home(rt, task["subagent"])
        with _remote_errors(self.delegates.spec(task["subagent"]), "check"):
            status, detail = await task_outcome(home, task)
        report: dict[str, Any] = {"task_id": task_id, "subagent": task["subagent"], "status": status}
        if detail is not None:
            report[_DETAIL_KEYS[status]] = detail
        return self._report(ctx, task, status, json.dumps(report, ensure_ascii=False))

    async def update_async_task(self, task_id: str, message: str, runtime: ToolRuntime) -> ToolResult:
        """Send a follow-up to a background task: new instructions, or the answer it is waiting for.

        A task waiting for approval of a tool call takes "approve", or any other text to reject it.

        Args:
            task_id: The id start_async_task returned.
            message: What to tell the task.
        """
        ctx, rt = _runtime_of(runtime)
        task = _tracked(runtime, task_id)
        spec = self.delegates.spec(task["subagent"])
        home = self._home(rt, spec.name)
        with _remote_errors(spec, "update"):
            status, thread = await _status_and_thread(home, task)
            if status == "waiting" and thread is not None:
                run = await self._start_run(home, ctx, spec, task_id, runtime.tool_call_id,
                                            command={"resume": resume_value(message, _questions(thread))})
            else:
                strategy = "interrupt" if status in _ACTIVE else "enqueue"
                run = await self._start_run(home, ctx, spec, task_id, runtime.tool_call_id,
                                            input={"messages": [HumanMessage(message)]}, multitask_strategy=strategy)
        task = {**task, "run_id": run["run_id"]}
        return self._report(ctx, task, "pending", f"Sent to task {task_id}; it is working on it again.")

    async def cancel_async_task(self, task_id: str, runtime: ToolRuntime) -> ToolResult:
        """Stop a background task.

        Args:
            task_id: The id start_async_task returned.
        """
        ctx, rt = _runtime_of(runtime)
        task = _tracked(runtime, task_id)
        home = self._home(rt, task["subagent"])
        with _remote_errors(self.delegates.spec(task["subagent"]), "cancel"):
            status = await task_status(home, task)
            if status in _ACTIVE:
                await home.runs.cancel(task_id, task["run_id"], wait=True)
                status = "cancelled"
        return self._report(ctx, task, status, f"Task {task_id} is {status}.")

    async def list_async_tasks(self, runtime: ToolRuntime, status_filter: str = "all") -> ToolResult:
        """Every background task of this conversation, with its live status.

        Args:
            status_filter: "all", or one status: pending, running, success, error, cancelled, timeout, waiting.
        """
        ctx, rt = _runtime_of(runtime)
        if status_filter != "all" and status_filter not in TASK_STATUSES:
            raise ToolError(f"unknown status_filter {status_filter!r}; use 'all' or one of {', '.join(TASK_STATUSES)}")
        tasks = runtime.state.get("async_tasks") or {}
        updates, lines = {}, []
        for task in tasks.values():
            try:
                status = await task_status(self._home(rt, task["subagent"]), task)
            except RemoteError:  # its server is unreachable: say so, keep listing the others
                status = "unknown"
            updates[task["task_id"]] = {"status": status, "updated_at": now_iso()}
            if status_filter in ("all", status):
                lines.append(f"- {task['task_id']} [{task['subagent']}] {status}: {task['description'][:80]}")
        return ToolResult("\n".join(lines) or "No tasks.", update={"async_tasks": updates})

    # -- hooks ---------------------------------------------------------------

    async def before_agent(self, state: Mapping[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """Watch remote tasks again after a restart, if their servers cannot report back here."""
        if ctx.runtime is not None and ctx.runtime.public_url is None:
            for task in (state.get("async_tasks") or {}).values():
                if task.get("url") and task.get("status") in _ACTIVE and task["subagent"] in self.delegates.specs:
                    spec = self.delegates.spec(task["subagent"])
                    self._watch(ctx.runtime, self._home(ctx.runtime, spec.name), spec, task["task_id"],
                                task["run_id"], ctx)
        return None

    async def before_model(self, state: Mapping[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """Record the status carried by notifications that just arrived, and take back the files
        that finished tasks sharing the workspace wrote; once the last pending task has been heard,
        say so with a ``drained`` task event."""
        tasks = state.get("async_tasks") or {}
        updates: dict[str, Any] = {}
        files: dict[str, Any] = {}
        for message in _new_notifications(state["messages"]):
            note = message.additional_kwargs["task_notification"]
            task = tasks.get(note["task_id"])
            if task is None or task.get("status") == note["status"] and task.get("run_id") == note["run_id"]:
                continue
            updates[note["task_id"]] = {"status": note["status"], "updated_at": now_iso()}
            ctx.emit("task", {**task, **updates[note["task_id"]]})
            if note["status"] == "success" and note.get("files", True):  # a task without files: nothing to read
                files.update(await self._files_of(ctx, task, {**(state.get(FILES_KEY) or {}), **files}))
        if not updates:
            return None
        statuses = {task_id: updates.get(task_id, task)["status"] for task_id, task in tasks.items()}
        if not _ACTIVE.intersection(statuses.values()):
            ctx.emit("task", {"event": "drained", "tasks": statuses})
        return {"async_tasks": updates, **({FILES_KEY: files} if files else {})}

    async def after_agent(self, state: Mapping[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """In ``wait`` mode, don't end while tasks are pending: wait for the next results, then go on."""
        if self.completion != "wait" or ctx.inbox is None or ctx.runtime is None:
            return None
        pending = [t for t in (state.get("async_tasks") or {}).values() if t.get("status") in _ACTIVE]
        while pending:
            try:
                await asyncio.wait_for(ctx.inbox.wait(), _RECHECK_SECONDS)
            except TimeoutError:
                # A task may have ended without a notification (cancelled from elsewhere). One that ended with
                # a result delivered it before its status changed, so the inbox is looked at after the statuses:
                # a notification that came as the wait timed out is not left behind.
                pending = [t for t in pending if await self._still_active(ctx.runtime, t)]
                if not ctx.inbox.drain():
                    continue
            await _coalesce(ctx.inbox)
            return {"jump_to": "model"}
        return None

    # -- helpers ---------------------------------------------------------------

    async def _start_run(self, home: Runtime, ctx: RunContext, spec: SubAgent, task_id: str, tool_call_id: str, *,
                         once: bool = False, **kwargs: Any) -> dict[str, Any]:
        """A run of the subagent on its task thread, its events shown in the supervisor's stream.

        On a remote subagent's server the run is that server's to schedule and stream; unless
        the subagent can report back to this runtime's URL, it is watched from here.
        """
        host = ctx.runtime
        if host is None:
            raise ToolError("background tasks need a runtime")
        if spec.url is not None:
            run = await home.runs.create(task_id, spec.graph_id or spec.name, **kwargs)
            if host.public_url is None:
                self._watch(host, home, spec, task_id, run["run_id"], ctx)
            return run
        graph_id = host.graph_id_for_agent(self.delegates.agent(spec))
        create = host.runs.create_once if once else host.runs.create
        run = await create(task_id, graph_id, timeout=spec.timeout, concurrency_key=f"tasks:{ctx.thread_id}",
                           concurrency_limit=self.max_concurrent, **kwargs)
        events = host.run_events(run["run_id"])
        if events is not None and ctx.bus is not None and ctx.bus.listeners:
            forward_events(events, ctx, f"{spec.name}:{tool_call_id}", tool_call_id)
        return run

    def _home(self, rt: HostRuntime, subagent: str) -> Runtime:
        """The runtime a subagent's tasks run on: this one, or its own server's."""
        spec = self.delegates.spec(subagent)
        if spec.url is None:
            return rt
        if spec.name not in self._remotes:
            from backchannel.runtime.remote import RemoteRuntime

            self._remotes[spec.name] = RemoteRuntime(spec.url, headers=spec.headers)
        return self._remotes[spec.name]

    @staticmethod
    def _parent_context(rt: HostRuntime, ctx: RunContext, spec: SubAgent, task_id: str) -> dict[str, Any]:
        """What the task's input says about its supervisor, so its notifier can report back.

        A remote task gets it only if this runtime has a URL to call back; otherwise it is watched.
        """
        if spec.url is not None and rt.public_url is None:
            return {"task_id": task_id}
        context = {"task_id": task_id, "parent_thread_id": ctx.thread_id,
                   "parent_assistant_id": ctx.metadata.get("graph_id")}
        if spec.url is not None:
            context["parent_url"] = rt.public_url
        return context

    def _shared_files(self, runtime: ToolRuntime, spec: SubAgent) -> dict[str, Any]:
        """The supervisor's files for a task that shares its workspace (on this runtime)."""
        files = runtime.state.get(FILES_KEY)
        return {FILES_KEY: files} if files and spec.workspace == "shared" and spec.url is None else {}

    async def _files_of(self, ctx: RunContext, task: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
        """The files a finished task sharing the workspace wrote, newer than the supervisor's copies."""
        spec = self.delegates.specs.get(task["subagent"])
        if spec is None or spec.workspace != "shared" or spec.url is not None or ctx.runtime is None:
            return {}
        try:
            thread = await ctx.runtime.threads.get_state(task["task_id"])
        except NotFoundError:
            return {}
        return files_written_since((thread.get("values") or {}).get(FILES_KEY), ours, task["created_at"])

    def _watch(self, rt: HostRuntime, home: Runtime, spec: SubAgent, task_id: str, run_id: str,
               ctx: RunContext) -> None:
        """Notify the supervisor when a remote run ends (for a runtime that other servers cannot call)."""
        key = f"{task_id}:{run_id}"
        if key not in self._watched and ctx.thread_id is not None:  # without a thread there is no one to tell
            self._watched.add(key)
            rt.spawn(watch_remote_run(rt, home, spec.name, task_id, run_id, ctx.thread_id,
                                      ctx.metadata.get("graph_id"), done=lambda: self._watched.discard(key)))

    async def _still_active(self, rt: HostRuntime, task: Mapping[str, Any]) -> bool:
        try:
            return await task_status(self._home(rt, task["subagent"]), task) in _ACTIVE
        except RemoteError:
            return True  # unreachable for now: keep waiting for it

    def runtime_agents(self) -> list[Agent]:
        """The agents whose runs this middleware starts on the runtime (registered with the supervisor)."""
        return [self.delegates.agent(s) for s in self.delegates.specs.values() if s.url is None]

    def _report(self, ctx: RunContext, task: Mapping[str, Any], status: str, content: str) -> ToolResult:
        fields = {"status": status, "run_id": task["run_id"], "updated_at": now_iso()}
        ctx.emit("task", {**task, **fields})
        return ToolResult(content, update={"async_tasks": {task["task_id"]: fields}})


_APPROVALS = frozenset({"approve", "approved", "yes", "y", "ok", "okay", "accept", "go ahead"})


def resume_value(message: str, pending: Sequence[Any]) -> Any:
    """How a follow-up answers a waiting task: a JSON object or list as written; for a tool-approval
    review, "approve" (yes, ok) approves its actions and any other text rejects them with that text as
    the reason; otherwise the message itself."""
    try:
        value = json.loads(message)
    except ValueError:
        value = None
    if isinstance(value, (dict, list)):
        return value
    if len(pending) == 1 and is_review_request(pending[0]):
        count = len(pending[0]["action_requests"])
        if message.strip().rstrip(".!").lower() in _APPROVALS:
            return {"decisions": [{"type": "approve"}] * count}
        return {"decisions": [{"type": "reject", "message": message}] * count}
    return message


@contextlib.contextmanager
def _remote_errors(spec: SubAgent, action: str) -> Iterator[None]:
    """A remote subagent's server failing becomes a tool error the model reads (its local errors pass)."""
    if spec.url is None:
        yield
        return
    try:
        yield
    except BackchannelError as exc:
        raise ToolError(f"could not {action} the {spec.name!r} task on {spec.url}: {exc}") from exc


def _runtime_of(runtime: ToolRuntime) -> tuple[RunContext, HostRuntime]:
    ctx = runtime.ctx
    if ctx is None or ctx.runtime is None or ctx.thread_id is None:
        raise ToolError("background tasks need a runtime: run the supervisor on a thread of a LocalRuntime "
                        "(agent.ainvoke(..., thread_id=...) or runtime.runs.create(...))")
    return ctx, ctx.runtime


async def _coalesce(inbox: Inbox) -> None:
    """Let results that arrive close together gather, so the model takes them in one call: wait while
    another arrives within :data:`COALESCE_GAP` seconds of the last, up to :data:`COALESCE_MAX` in all."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + COALESCE_MAX
    waiting = len(inbox.drain())
    while loop.time() < deadline:
        await asyncio.sleep(COALESCE_GAP)
        now = len(inbox.drain())
        if now == waiting:
            return
        waiting = now


def _tracked(runtime: ToolRuntime, task_id: str) -> dict[str, Any]:
    tasks = runtime.state.get("async_tasks") or {}
    if task_id not in tasks:
        known = ", ".join(tasks) or "none"
        raise ToolError(f"no task {task_id!r} in this conversation; known task ids: {known}")
    return tasks[task_id]


def _new_notifications(messages: Sequence[Any]) -> list[HumanMessage]:
    """The task notifications at the end of the conversation (those since the last AI message)."""
    found = []
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            break
        if isinstance(message, HumanMessage) and "task_notification" in message.additional_kwargs:
            found.append(message)
    found.reverse()
    return found
