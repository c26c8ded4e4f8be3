"""``create_deep_agent``: a supervisor that delegates to subagents, in the foreground or the background,
and works in a workspace of files, with a plan, memory files, skills and MCP tools."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from backchannel.agent import DEFAULT_MAX_ITERATIONS, Agent, create_agent
from backchannel.async_tasks import AsyncSubAgentMiddleware
from backchannel.hitl import HumanInTheLoop
from backchannel.middleware import Middleware
from backchannel.structured import StructuredOutput
from backchannel.subagents import GENERAL_PURPOSE, SubAgent, SubAgentMiddleware, as_subagent
from backchannel.summarization import SummarizationMiddleware
from backchannel.workspace import (
    FILE_TOOLS,
    BackendProtocol,
    FilesystemMiddleware,
    MemoryMiddleware,
    SkillsMiddleware,
    StateBackend,
    TodoListMiddleware,
    supports_execution,
)

__all__ = ["create_deep_agent"]

SUPERVISOR_PROMPT = ("You are a supervisor that gets work done by delegating to subagents and combining "
                     "their results. Plan briefly, delegate independent pieces, and answer the user clearly.")


def create_deep_agent(model: Any, tools: Sequence[Any] = (), *,
                      subagents: Sequence[SubAgent | Mapping[str, Any]] = (),
                      middleware: Sequence[Middleware] = (), system_prompt: str | None = None,
                      name: str | None = None, completion: Literal["notify", "wait"] = "notify",
                      general_purpose: bool = True, max_concurrent_tasks: int = 16,
                      max_iterations: int = DEFAULT_MAX_ITERATIONS,
                      model_settings: Mapping[str, Any] | None = None,
                      max_tokens_before_summary: int | None = 170_000,
                      backend: BackendProtocol | None = None, memory: Sequence[str] | None = None,
                      skills: Sequence[str] | None = None, todos: bool = False,
                      interrupt_on: Mapping[str, bool | Mapping[str, Any]] | None = None,
                      response_format: type | Mapping[str, Any] | None = None,
                      mcp_servers: Mapping[str, Any] | None = None) -> Agent:
    """A supervisor agent with ``task`` for its subagents and, for background ones, the async task tools.

    ``subagents`` are :class:`~backchannel.subagents.SubAgent` specs (or
    deepagents-style dicts). A ``general-purpose`` subagent with the
    supervisor's tools is added unless one is given or ``general_purpose=False``.
    ``completion="notify"`` (default) lets the supervisor's run end while
    background tasks run, and wakes it when each finishes; ``"wait"`` keeps
    its run going until every task has reported back.
    ``max_concurrent_tasks`` bounds this supervisor's running background
    tasks; the rest wait as ``pending``.
    Past ``max_tokens_before_summary`` tokens (about), the supervisor's and
    each subagent's older messages are summarised by its own model, the last 6
    kept (:class:`~backchannel.summarization.SummarizationMiddleware`); ``None``
    turns that off.
    """
    specs = [as_subagent(s) for s in subagents]
    names = [s.name for s in specs]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise ValueError(f"two subagents are named {sorted(duplicates)[0]!r}")
    if general_purpose and GENERAL_PURPOSE.name not in names:
        specs.insert(0, GENERAL_PURPOSE)
    if max_tokens_before_summary is not None:
        specs = [_summarizing(s, model, max_tokens_before_summary) for s in specs]
    backend = backend if backend is not None else StateBackend()
    approvals = dict(interrupt_on or {})
    if supports_execution(backend):
        approvals.setdefault("execute", True)  # a shell on the user's machine: a person approves each command
    specs = [_in_workspace(s, backend, approvals, skills) for s in specs]
    foreground = [s for s in specs if not (s.background or s.url)]
    background = [s for s in specs if s.background or s.url]  # a subagent on another server runs there
    delegation: list[Middleware] = []
    if foreground:
        delegation.append(SubAgentMiddleware(foreground, model=model, tools=tools))
    if background:
        delegation.append(AsyncSubAgentMiddleware(background, model=model, tools=tools, completion=completion,
                                                  max_concurrent=max_concurrent_tasks))
    summarizing = ([SummarizationMiddleware(model, max_tokens_before_summary=max_tokens_before_summary)]
                   if max_tokens_before_summary is not None else [])
    workspace: list[Middleware] = [*([TodoListMiddleware()] if todos else []), FilesystemMiddleware(backend=backend)]
    extras: list[Middleware] = []
    if mcp_servers:
        from backchannel.mcp import MCPClient, MCPMiddleware

        extras.append(MCPMiddleware(MCPClient(mcp_servers)))
    if skills:
        extras.append(SkillsMiddleware(backend=backend, sources=skills))
    if memory:
        extras.append(MemoryMiddleware(backend=backend, sources=memory))
    if response_format is not None:
        extras.append(StructuredOutput(response_format))
    if any(v is not False for v in approvals.values()):
        extras.append(HumanInTheLoop(approvals))
    return create_agent(model, tools, system_prompt=system_prompt or SUPERVISOR_PROMPT,
                        middleware=[*workspace, *delegation, *middleware, *extras, *summarizing], name=name,
                        max_iterations=max_iterations, model_settings=model_settings)


def _in_workspace(spec: SubAgent, backend: BackendProtocol, approvals: Mapping[str, Any],
                  skills: Sequence[str] | None) -> SubAgent:
    """The spec with the workspace's file tools (prebuilt and remote agents as they are).

    A background subagent asks for the same approvals as the supervisor. A synchronous one cannot
    pause for a person, so it gets no tool that would need one: no ``execute`` that needs approval.
    """
    if spec.agent is not None or spec.url is not None:
        return spec
    added: list[Middleware] = []
    if spec.background:
        added.append(FilesystemMiddleware(backend=backend))
        gated = {k: v for k, v in approvals.items() if v is not False}
        if gated:
            added.append(HumanInTheLoop(gated))
    else:
        unapproved = "execute" not in approvals or approvals["execute"] is False
        file_tools = None if unapproved else [t for t in FILE_TOOLS if t != "execute"]
        added.append(FilesystemMiddleware(backend=backend, tools=file_tools))
    if skills and spec.name == GENERAL_PURPOSE.name:
        added.append(SkillsMiddleware(backend=backend, sources=skills))
    return replace(spec, middleware=[*added, *spec.middleware])


def _summarizing(spec: SubAgent, model: Any, threshold: int) -> SubAgent:
    """The spec with a summarization middleware on its own model (prebuilt and remote agents as they are)."""
    if spec.agent is not None or spec.url is not None:
        return spec
    summarizer = SummarizationMiddleware(spec.model or model, max_tokens_before_summary=threshold)
    return replace(spec, middleware=[*spec.middleware, summarizer])
