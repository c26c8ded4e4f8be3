"""Middleware: hooks around every part of an agent run.

Subclass :class:`Middleware` and override the hooks you need; the others are
no-ops and cost nothing (the agent only calls hooks a class overrides).

Order: ``before_*`` hooks run in registration order, ``after_*`` hooks in
reverse, and for ``wrap_*`` hooks the first registered is the outermost.
``after_tool_call`` sees a tool call's result once the ``wrap_tool_call``
chain has returned it; unlike a wrapper it keeps no frame waiting while the
tool runs (a thousand subagents waiting on tools would hold a thousand).
A hook that raises stops the remaining handlers and fails the run
(:class:`~backchannel.errors.MiddlewareError` names the middleware and hook).

State hooks may return a dict of state updates. Include ``"jump_to"`` to
redirect the run: ``"end"`` from ``before_agent``/``before_model``/
``after_model``, ``"model"`` from ``after_model``/``after_agent``.

For a one-hook middleware, decorate a function instead::

    @before_model
    async def trim(state, ctx):
        ...
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from backchannel.messages import AIMessage, ToolCall, ToolMessage
from backchannel.models.base import ModelRequest
from backchannel.result import RunResult
from backchannel.tools import Tool, ToolResult

if TYPE_CHECKING:
    from backchannel.agent import Agent
    from backchannel.context import RunContext

__all__ = [
    "Middleware",
    "ModelHandler",
    "StateUpdate",
    "ToolCallRequest",
    "ToolHandler",
    "after_agent",
    "after_model",
    "after_tool_call",
    "before_agent",
    "before_model",
    "on_end",
    "wrap_model_call",
    "wrap_tool_call",
]

StateUpdate = dict[str, Any] | None


@dataclass(slots=True)
class ToolCallRequest:
    """One tool call on its way to the tool: the call, the tool (``None`` if unknown), the run."""

    call: ToolCall
    tool: Tool | None
    state: Mapping[str, Any]
    ctx: RunContext

    def override(self, **changes: Any) -> ToolCallRequest:
        """A copy of this request with some fields replaced (e.g. ``call`` with new args)."""
        return replace(self, **changes)


ModelHandler = Callable[[ModelRequest], Awaitable[AIMessage]]
ToolHandler = Callable[[ToolCallRequest], Awaitable[ToolMessage | ToolResult]]

HOOKS = ("before_agent", "before_model", "wrap_model_call", "after_model", "wrap_tool_call", "after_tool_call",
         "after_agent", "on_end")

# Where each hook may send the run with "jump_to".
JUMPS: dict[str, frozenset[str]] = {
    "before_agent": frozenset({"end"}),
    "before_model": frozenset({"end"}),
    "after_model": frozenset({"model", "end"}),
    "after_agent": frozenset({"model"}),
}


class Middleware:
    """Base class of middleware: async hooks with no-op defaults.

    Class attributes a middleware may set: ``tools`` it adds to the agent,
    ``state_schema`` (a TypedDict whose ``Annotated[T, reducer]`` keys extend
    the state), ``system_prompt`` text appended to the agent's, and
    ``on_end_stores_last_step``.
    """

    tools: Sequence[Tool] = ()
    state_schema: ClassVar[type | None] = None
    system_prompt: str | None = None
    # A run's last step is stored with its end; before ``on_end`` is called, the run stores it (a hook that tells
    # others what the run did must tell what is stored), unless the middleware says its ``on_end`` does so itself
    # (``await ctx.recorder.flush()``) before whatever it does that others see, and only when it does something.
    on_end_stores_last_step: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """How errors and events name this middleware (the class name by default)."""
        return type(self).__name__

    async def before_agent(self, state: Mapping[str, Any], ctx: RunContext) -> StateUpdate:
        """Once per run, before anything else (not again when a run resumes from an interrupt)."""
        return None

    async def before_model(self, state: Mapping[str, Any], ctx: RunContext) -> StateUpdate:
        """Before every model call, after waiting messages (task notifications) are added."""
        return None

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """Around every model call; call ``await handler(request)`` to proceed."""
        return await handler(request)

    async def after_model(self, state: Mapping[str, Any], ctx: RunContext) -> StateUpdate:
        """After every model reply is added to the state, before its tool calls run."""
        return None

    async def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | ToolResult:
        """Around every tool call, including unknown tools and bad arguments."""
        return await handler(request)

    async def after_tool_call(self, request: ToolCallRequest,
                              result: ToolMessage | ToolResult) -> ToolMessage | ToolResult:
        """After every tool call, with the result the wrap_tool_call chain returned: return it or a replacement."""
        return result

    async def after_agent(self, state: Mapping[str, Any], ctx: RunContext) -> StateUpdate:
        """Once, when the run succeeds: a final answer, a return-direct tool, or a jump to the end.

        Not called when the run fails, is cancelled, exceeds its iteration
        limit, or is interrupted (it is called when the resumed run succeeds).
        """
        return None

    async def on_end(self, state: Mapping[str, Any], ctx: RunContext, result: RunResult) -> None:
        """Once, as the run ends, whatever the outcome (``result.status``): for reporting and cleanup."""
        return None

    def runtime_agents(self) -> Sequence[Agent]:
        """The agents this middleware runs on its agent's runtime (registered there with its agent)."""
        return ()


def overrides(middleware: Middleware, hook: str) -> bool:
    """Whether ``middleware`` does something in ``hook`` (not the base no-op)."""
    return getattr(type(middleware), hook) is not getattr(Middleware, hook)


def _as_async(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    if inspect.iscoroutinefunction(fn):
        return fn

    async def call(*args: Any) -> Any:
        result = fn(*args)
        # A sync wrap_* function returns ``handler(request)``, an awaitable: finish it here.
        return await result if inspect.isawaitable(result) else result

    return call


def _function_middleware(hook: str) -> Callable[..., Any]:
    """The decorator that turns one function into a middleware overriding ``hook``."""

    def decorate(fn: Callable[..., Any] | None = None, *, name: str | None = None) -> Any:
        def build(f: Callable[..., Any]) -> Middleware:
            call = _as_async(f)

            async def method(self: Middleware, *args: Any) -> Any:
                return await call(*args)

            cls = type(name or f.__name__, (Middleware,), {hook: method, "__doc__": f.__doc__})
            return cls()

        return build(fn) if fn is not None else build

    decorate.__name__ = hook
    decorate.__doc__ = f"Make a middleware whose ``{hook}`` is the decorated function."
    return decorate


before_agent = _function_middleware("before_agent")
before_model = _function_middleware("before_model")
wrap_model_call = _function_middleware("wrap_model_call")
after_model = _function_middleware("after_model")
wrap_tool_call = _function_middleware("wrap_tool_call")
after_tool_call = _function_middleware("after_tool_call")
after_agent = _function_middleware("after_agent")
on_end = _function_middleware("on_end")
