"""Subagents: named agents a supervisor delegates to, and the synchronous ``task`` tool.

A :class:`SubAgent` describes one: its name and description (what the
supervisor's model reads to choose), and its prompt, tools, model and
middleware (inherited from the supervisor when left out). ``background=True``
makes it a background subagent, started with ``start_async_task``
(:mod:`backchannel.async_tasks`); otherwise ``task`` runs it to completion
and returns its final answer.

A subagent run from a tool reports in the supervisor's event stream under its
own name, with the tool call as its cause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from backchannel.agent import Agent, create_agent
from backchannel.messages import AnyMessage, HumanMessage, pending_tool_calls
from backchannel.middleware import Middleware
from backchannel.notifier import final_answer
from backchannel.tools import Tool, ToolError, ToolResult, ToolRuntime
from backchannel.workspace.state import FILES_KEY, changed_files

__all__ = ["GENERAL_PURPOSE", "Delegates", "SubAgent", "SubAgentMiddleware", "as_subagent", "build_subagent"]


@dataclass(slots=True)
class SubAgent:
    """How to build (or which prebuilt ``agent`` is) one subagent.

    ``tools``/``model`` ``None`` means the supervisor's. ``fork=True`` starts
    a synchronous subagent on a copy of the supervisor's conversation rather
    than a fresh one. ``timeout`` (seconds) bounds each of its tasks, in the background or with ``task``.
    ``url`` and ``graph_id`` declare a subagent served by another server (a
    background task there, reached with ``headers``, e.g. ``{"x-api-key": ...}``).
    ``workspace="shared"`` (the default) starts the subagent with the
    supervisor's files in the state and brings back the files it writes;
    ``"isolated"`` gives it an empty workspace of its own. (Files on disk or
    in the store are where they are, for both.)
    """

    name: str
    description: str
    system_prompt: str | None = None
    tools: Sequence[Any] | None = None
    model: Any = None
    middleware: Sequence[Middleware] = ()
    background: bool = False
    fork: bool = False
    timeout: float | None = None
    agent: Agent | None = None
    url: str | None = None
    graph_id: str | None = None
    headers: Mapping[str, str] | None = None
    max_iterations: int = 50
    workspace: Literal["shared", "isolated"] = "shared"
    extra: dict[str, Any] = field(default_factory=dict)


GENERAL_PURPOSE = SubAgent(
    name="general-purpose",
    description=("General-purpose agent for researching complex questions, searching for information and "
                 "carrying out multi-step tasks. It has the same tools as you. Use it to keep your own "
                 "context small: give it the whole task, and get back only its answer."),
    system_prompt=("You are a capable assistant completing one task for a supervisor. Do the task fully, "
                   "then answer with the result alone: concise, complete, and without asking questions."),
)


def as_subagent(spec: SubAgent | Mapping[str, Any]) -> SubAgent:
    """A :class:`SubAgent` from itself or from a dict in deepagents' form (``runnable`` = a prebuilt agent)."""
    if isinstance(spec, SubAgent):
        return spec
    data = dict(spec)
    if "runnable" in data:
        data["agent"] = data.pop("runnable")
    try:
        return SubAgent(**data)
    except TypeError as exc:
        raise ValueError(f"not a subagent spec: {spec!r} ({exc})") from None


def build_subagent(spec: SubAgent, model: Any, tools: Sequence[Any],
                   extra_middleware: Sequence[Middleware] = ()) -> Agent:
    """The agent a spec describes, inheriting the supervisor's model and tools where it gives none.

    A prebuilt agent runs as a copy named after the spec (so it reports as that subagent) with
    ``extra_middleware`` added; the original is left as it is.
    """
    if spec.agent is not None:
        return spec.agent.copy(name=spec.name, middleware=[*spec.agent.middleware, *extra_middleware])
    return create_agent(spec.model or model, tools if spec.tools is None else spec.tools,
                        system_prompt=spec.system_prompt, middleware=[*spec.middleware, *extra_middleware],
                        name=spec.name, max_iterations=spec.max_iterations)


class Delegates:
    """The subagents a middleware can start: looked up by type, each built once."""

    def __init__(self, specs: Sequence[SubAgent], *, model: Any, tools: Sequence[Any],
                 extra_middleware: Callable[[], Sequence[Middleware]] = list) -> None:
        self.specs = {s.name: s for s in specs}
        self._model = model
        self._tools = tools
        self._extra_middleware = extra_middleware
        self._agents: dict[str, Agent] = {}

    def spec(self, subagent_type: str) -> SubAgent:
        """The spec of ``subagent_type``; a :class:`ToolError` listing the valid types if there is none."""
        spec = self.specs.get(subagent_type)
        if spec is None:
            raise ToolError(f"unknown subagent_type {subagent_type!r}; valid types: {', '.join(self.specs)}")
        return spec

    def agent(self, spec: SubAgent) -> Agent:
        """The agent of ``spec``, built on first use."""
        if spec.name not in self._agents:
            self._agents[spec.name] = build_subagent(spec, self._model, self._tools, self._extra_middleware())
        return self._agents[spec.name]

    def listing(self) -> str:
        """The subagent types with their descriptions, for tool descriptions."""
        return "\n".join(f"- {s.name}: {s.description}" for s in self.specs.values())


class SubAgentMiddleware(Middleware):
    """Adds the ``task`` tool: run a subagent to completion and return its final answer."""

    def __init__(self, subagents: Sequence[SubAgent], *, model: Any, tools: Sequence[Any]) -> None:
        self.delegates = Delegates(subagents, model=model, tools=tools)
        self.tools = [Tool(self.task, name="task", description=(
            "Launch a subagent to handle a task on its own and return its final answer. Run several at once "
            "by calling this tool more than once in one reply. Each subagent starts fresh: put everything it "
            "needs in the description.\n\nAvailable subagent types:\n" + self.delegates.listing()))]
        self.system_prompt = (
            "You can delegate self-contained tasks with the `task` tool; independent tasks can run in "
            "parallel. The subagent only sees your description, and only its final answer comes back.")

    async def task(self, description: str, subagent_type: str, runtime: ToolRuntime) -> ToolResult | str:
        """Run a subagent on a task and return its answer.

        Args:
            description: The whole task, with every detail the subagent needs; it sees nothing else.
            subagent_type: Which subagent to use (one of the available types).
        """
        spec = self.delegates.spec(subagent_type)
        agent = self.delegates.agent(spec)
        history = forked_history(runtime.state.get("messages") or []) if spec.fork else []
        given: dict[str, Any] = {"messages": [*history, HumanMessage(description)]}
        files = runtime.state.get(FILES_KEY) if spec.workspace == "shared" else None
        if files:
            given[FILES_KEY] = files
        limit = asyncio.timeout(spec.timeout)
        try:
            async with limit:
                result = await agent.ainvoke(given)
        except Exception as exc:
            if isinstance(exc, TimeoutError) and limit.expired():
                raise ToolError(f"subagent {spec.name!r} timed out after {spec.timeout:g} s and was stopped") from None
            raise ToolError(f"subagent {spec.name!r} failed: {type(exc).__name__}: {exc}") from exc
        if result.get("__interrupt__"):
            raise ToolError(f"subagent {spec.name!r} stopped to ask for human input, which a task run with "
                            "`task` cannot get; declare it as a background subagent instead.")
        answer = final_answer(result) or "(the subagent finished without an answer)"
        written = changed_files(files, result.get(FILES_KEY)) if spec.workspace == "shared" else {}
        return ToolResult(answer, update={FILES_KEY: written}) if written else answer


def forked_history(messages: Sequence[AnyMessage]) -> list[AnyMessage]:
    """The supervisor's conversation for a forked subagent, without the reply that is calling tools now."""
    ai, pending = pending_tool_calls(list(messages))
    if ai is None or not pending:
        return list(messages)
    cut = next(i for i in range(len(messages) - 1, -1, -1) if messages[i] is ai)
    return list(messages[:cut])
