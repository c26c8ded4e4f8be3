"""The agent: a model, tools and middleware, and the loop that runs them.

One run moves through stages::

    before_agent -> before_model -> (model call) -> after_model -> tools -> before_model ...
                                                                 \\-> after_agent (final answer)

Each state change is recorded with the stage the run continues at, so a run
can stop anywhere (an interrupt, a crash) and continue from its record. A
stage name may carry the index of the next hook to run (``"after_model:1"``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Coroutine, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from backchannel.context import NOTHING, Breakpoints, CallingTool, RunContext, calling_tool, forward_events
from backchannel.errors import LostRunError, MaxIterationsError, MiddlewareError, StorageUnavailableError
from backchannel.events import Event, EventBus, filter_metadata
from backchannel.interrupts import GraphInterrupt, InterruptScope, current_scope
from backchannel.messages import (
    AIMessage,
    AnyMessage,
    ToolCall,
    ToolMessage,
    messages_from_input,
    new_id,
    pending_tool_calls,
)
from backchannel.middleware import HOOKS, JUMPS, Middleware, ModelHandler, ToolCallRequest, ToolHandler, overrides
from backchannel.models import init_model
from backchannel.models.base import Accumulator, ModelRequest, SupportsChat, TextDelta, ToolCallDelta
from backchannel.protocols import HostRuntime
from backchannel.result import RunResult
from backchannel.serde import dumps
from backchannel.state import MessageList, Reducer, apply_update, reducers_of, snapshot
from backchannel.streaming import AgentStream
from backchannel.tools import Tool, ToolArgumentsError, ToolError, ToolResult, ToolRuntime, as_tool
from backchannel.tracing import Trace

__all__ = ["Agent", "RunResult", "create_agent"]

DEFAULT_MAX_ITERATIONS = 50

logger = logging.getLogger("backchannel")

_JUMP_TARGETS = {"end": "after_agent", "model": "before_model"}


@dataclass(slots=True)
class _Plan:
    """What an agent compiles to on its first run."""

    model: SupportsChat
    tools: dict[str, Tool]
    tool_list: tuple[Tool, ...]
    system_prompt: str | None
    hooks: dict[str, list[tuple[str, Any]]]
    call_model: ModelHandler
    call_tool: ToolHandler  # its outermost wrap_tool_call layer's errors are the caller's to name (see _flat_chain)
    tool_layer: str | None  # the middleware of that layer (None: no wrap_tool_call middleware)
    available: str  # the tools' names, for the model when it calls one that does not exist
    reducers: dict[str, Reducer]
    stored_before_end: bool  # the run's last step is stored before on_end hooks (see Middleware)


_NO_NODES: frozenset[str] = frozenset()  # the nodes a run pauses at, when it has no breakpoints


class Agent:
    """A model with tools and middleware. Build one with :func:`create_agent`."""

    __slots__ = ("model", "tools", "system_prompt", "middleware", "name", "max_iterations",
                 "model_settings", "state_schema", "runtime", "_plan")

    def __init__(self, model: SupportsChat | str | Any, tools: Sequence[Any] = (), *,
                 system_prompt: str | None = None, middleware: Sequence[Middleware] = (),
                 name: str | None = None, max_iterations: int = DEFAULT_MAX_ITERATIONS,
                 model_settings: Mapping[str, Any] | None = None, state_schema: type | None = None) -> None:
        if max_iterations < 1:
            raise ValueError(f"max_iterations must be at least 1, got {max_iterations}")
        self.model = model
        self.tools = tools
        self.system_prompt = system_prompt
        self.middleware = middleware
        self.name = name
        self.max_iterations = max_iterations
        self.model_settings = model_settings or {}
        self.state_schema = state_schema
        self.runtime: HostRuntime | None = None  # set by the runtime the agent is registered with
        self._plan: _Plan | None = None

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r})"

    def copy(self, **changes: Any) -> Agent:
        """A new agent like this one, with some of ``create_agent``'s arguments changed."""
        settings = {"model": self.model, "tools": self.tools, "system_prompt": self.system_prompt,
                    "middleware": self.middleware, "name": self.name, "max_iterations": self.max_iterations,
                    "model_settings": self.model_settings, "state_schema": self.state_schema, **changes}
        return Agent(**settings)

    @property
    def graph_name(self) -> str:
        """The name events and the runtime use for this agent."""
        return self.name or "agent"

    # -- compiling ---------------------------------------------------------

    def _compile(self) -> _Plan:
        tools: dict[str, Tool] = {}
        for t in [*self.tools, *(t for mw in self.middleware for t in mw.tools)]:
            t = _to_tool(t)
            if t.name in tools and tools[t.name] is not t:
                raise ValueError(f"agent {self.graph_name!r} has two tools named {t.name!r}")
            tools[t.name] = t
        hooks = {h: [(mw.name, getattr(mw, h)) for mw in self.middleware if overrides(mw, h)] for h in HOOKS}
        for h in ("after_model", "after_tool_call", "after_agent", "on_end"):
            hooks[h].reverse()
        prompts = [self.system_prompt, *(mw.system_prompt for mw in self.middleware)]
        reducers = reducers_of(self.state_schema)
        available = ", ".join(sorted(tools)) or "none"
        for mw in self.middleware:
            reducers.update(reducers_of(mw.state_schema))
        self._plan = _Plan(
            model=init_model(self.model),
            tools=tools,
            tool_list=tuple(tools.values()),
            system_prompt="\n\n".join(p for p in prompts if p) or None,
            hooks=hooks,
            call_model=_chain("wrap_model_call", hooks["wrap_model_call"], _invoke_model),
            call_tool=_flat_chain("wrap_tool_call", hooks["wrap_tool_call"], _tool_invoker(available)),
            tool_layer=hooks["wrap_tool_call"][0][0] if hooks["wrap_tool_call"] else None,
            available=available,
            reducers=reducers,
            stored_before_end=any(overrides(mw, "on_end") and not mw.on_end_stores_last_step
                                  for mw in self.middleware),
        )
        return self._plan

    def state_reducers(self) -> dict[str, Reducer]:
        """The reducers of this agent's state keys (from its and its middleware's state schemas)."""
        return (self._plan or self._compile()).reducers

    def node_names(self) -> list[str]:
        """The steps of this agent's loop, named as LangGraph names nodes (``model``, ``tools``, ``Mw.hook``)."""
        plan = self._plan or self._compile()
        hooks = plan.hooks

        def named(hook: str) -> list[str]:
            return [f"{mw_name}.{hook}" for mw_name, _ in hooks[hook]]

        return [*named("before_agent"), *named("before_model"), "model", *named("after_model"), "tools",
                *named("after_agent")]

    def tool_names(self) -> list[str]:
        """The names of the tools the model can call: the agent's own and its middleware's."""
        plan = self._plan or self._compile()
        return sorted(plan.tools)

    def node_at(self, stage: str) -> str:
        """The node a run continuing at ``stage`` runs next."""
        plan = self._plan or self._compile()
        name, _, index = stage.partition(":")
        hooks = plan.hooks.get(name, [])
        position = int(index or 0)
        if name != "tools" and position < len(hooks):
            return f"{hooks[position][0]}.{name}"
        if name == "before_agent":
            return self.node_at("before_model")
        return {"before_model": "model", "after_model": "tools", "after_agent": "__end__"}.get(name, name)

    # -- running -------------------------------------------------------------

    def run(self, state: dict[str, Any], ctx: RunContext, *,
            stage: str = "before_agent") -> Coroutine[Any, Any, RunResult]:
        """Run (or continue, from ``stage``) on ``state`` in place; the runtime's entry point (to await)."""
        # A plain function: each coroutine frame between the runtime and a tool stays suspended with every
        # run waiting on one (a thousand background subagents hold a thousand of each).
        return self._run(self._plan or self._compile(), state, ctx, stage)

    async def _run(self, plan: _Plan, state: dict[str, Any], ctx: RunContext, stage: str) -> RunResult:
        """The run, in its span when it is traced (opened and ended here: a wrapping coroutine would stay
        suspended as long as the run), and how it ended, told to the hooks and listeners."""
        span = ctx.trace.start_run(ctx, self.name, plan.model) if ctx.trace.on else None
        reports = ctx.parent is None or self.name is not None
        try:
            if reports:
                self._lifecycle(ctx, "started")
            try:
                if ctx.deadline is None:
                    await self._loop(plan, state, ctx, stage)
                else:
                    async with asyncio.timeout_at(ctx.deadline):
                        await self._loop(plan, state, ctx, stage)
            except BaseException as exc:
                result = await self._stopped(plan, state, ctx, exc, reports)
            else:
                result = await self._finished(plan, state, ctx, reports)
        except BaseException as exc:
            if span is not None:
                await ctx.trace.end_run(ctx, span, None, exc)
            raise
        if span is not None:
            await ctx.trace.end_run(ctx, span, result, None)
        return result

    async def _stopped(self, plan: _Plan, state: dict[str, Any], ctx: RunContext, exc: BaseException,
                       reports: bool) -> RunResult:
        """A run whose steps raised ``exc``: paused (its result), else ended as cancelled, failed or timed out,
        and ``exc`` raised again (unless it stops the run before its end: it continues once its runtime can)."""
        if isinstance(exc, GraphInterrupt):
            result = RunResult("interrupted", state, exc.interrupts, exc.stage)
            await self._end(plan, ctx, result)
            if reports:
                self._lifecycle(ctx, "interrupted")
            ctx.emit("interrupt", {"interrupts": exc.interrupts})
            if ctx.bus is not None and ctx.bus.wants_values:
                ctx.emit("values", {**state, "__interrupt__": exc.interrupts})
            return result
        if isinstance(exc, asyncio.CancelledError):
            if reports:
                self._lifecycle(ctx, "cancelled")
            await self._end(plan, ctx, RunResult("cancelled", state))
        elif not stops_run(exc):
            timed_out = isinstance(exc, TimeoutError) and ctx.deadline is not None
            if reports:
                self._lifecycle(ctx, "failed", error=describe_error(exc))
            await self._end(plan, ctx, RunResult("timeout" if timed_out else "error", state, error=exc))
        raise exc

    async def _finished(self, plan: _Plan, state: dict[str, Any], ctx: RunContext, reports: bool) -> RunResult:
        """A run whose steps all ran: ``on_end`` hooks told (one failing fails the run)."""
        result = RunResult("success", state)
        try:
            await self._end(plan, ctx, result, raising=True)
        except MiddlewareError as exc:
            if reports:
                self._lifecycle(ctx, "failed", error=describe_error(exc))
            raise
        if reports:
            self._lifecycle(ctx, "completed")
        return result

    async def _end(self, plan: _Plan, ctx: RunContext, result: RunResult, *, raising: bool = False) -> None:
        """Tell ``on_end`` hooks how the run ended. A failure fails a successful run; after another
        failure it is logged, since the run's own error is the one to report."""
        if plan.stored_before_end and ctx.recorder is not None:
            await ctx.recorder.flush()  # what they do (a report) follows the run's last step
        for mw_name, fn in plan.hooks["on_end"]:
            try:
                await fn(result.state, ctx, result)
            except Exception as exc:
                if raising:
                    raise MiddlewareError(mw_name, "on_end", exc) from exc
                logger.exception("middleware %r failed in on_end after the run ended %s", mw_name, result.status)

    def _lifecycle(self, ctx: RunContext, event: str, **extra: Any) -> None:
        bus = ctx.bus
        if bus is None or not bus.listeners:
            return
        data: dict[str, Any] = {"event": event, "graph_name": self.graph_name, **extra}
        if event != "started" and ctx.span is not None:
            data["usage"] = ctx.trace.usage_of(ctx.span)  # its subagents' included
        if ctx.parent is not None and ctx.namespace:  # else its own stream: the forwarder adds the cause
            data["cause"] = {"type": "toolCall", "tool_call_id": ctx.namespace[-1].partition(":")[2]}
        metadata = filter_metadata(ctx.metadata)
        if metadata:
            data["metadata"] = metadata
        ctx.emit("lifecycle", data)

    async def _loop(self, plan: _Plan, state: dict[str, Any], ctx: RunContext, stage: str) -> None:
        """The run's steps from ``stage`` on (one frame: each frame under a run stays suspended as long as it)."""
        if not stage:
            return  # resumed after its last step: only the run's end (on_end hooks) is left
        # Mail taken in from the inbox is acknowledged once a model call has heard it, or once the run
        # ends or pauses with it in its state; a run that fails or is cancelled first leaves it for the next.
        unheard: list[AnyMessage] = []
        failed = False
        try:
            name, _, index = stage.partition(":")
            start = int(index or 0)
            model_calls = 0
            woken = False  # after_agent sent a finished run back to the model
            while True:
                if name == "before_agent":
                    jump = await self._run_hooks(plan, "before_agent", state, ctx, start)
                    name = "after_agent" if jump else "before_model"
                elif name == "before_model":
                    arrived = await self._deliver_inbox(plan, state, ctx, unheard) if start == 0 and ctx.inbox else ()
                    unheard += arrived
                    if await self._run_hooks(plan, "before_model", state, ctx, start):
                        name, start = "after_agent", 0
                        continue
                    # A finished run woken by mail (task results) is not looping: only the other calls count.
                    if not (woken and arrived):
                        model_calls += 1
                        limit = ctx.max_iterations or self.max_iterations
                        if model_calls > limit:
                            raise MaxIterationsError(limit)
                    woken = False
                    if self._breaks(ctx, "before", {"model"}):
                        raise GraphInterrupt([], f"before_model:{len(plan.hooks['before_model'])}")
                    message = await self._call_model(plan, state, ctx)
                    if unheard:  # heard now
                        assert ctx.inbox is not None
                        await ctx.inbox.ack(unheard)
                        unheard.clear()
                    name = _stage_after_reply(plan, message)
                    await self._apply(plan, state, ctx, "model", {"messages": [message]}, name)
                    if not name:
                        return
                    if self._breaks(ctx, "after", {"model"}):
                        raise GraphInterrupt([], name)
                elif name == "after_model":
                    jump = await self._run_hooks(plan, "after_model", state, ctx, start)
                    if jump:
                        name = _JUMP_TARGETS[jump]
                    else:
                        last = _last_ai(state["messages"])
                        has_calls = last is not None and bool(last.tool_calls or last.invalid_tool_calls)
                        name = "tools" if has_calls else "after_agent"
                elif name == "tools":
                    called = {"tools", *_pending_tool_names(state)} if ctx.breakpoints is not None else _NO_NODES
                    if self._breaks(ctx, "before", called):
                        raise GraphInterrupt([], "tools")
                    _, calls = pending_tool_calls(state["messages"])
                    if len(calls) == 1 and not ctx.pending_tools:  # one call: awaited here (no frame between)
                        try:
                            update, direct, _ = await self._tool_call(plan, calls[0], state, ctx)
                        except GraphInterrupt as paused:
                            paused.stage = "tools"  # resume by running the call again
                            raise
                        name = "after_agent" if direct else "before_model"
                        await self._apply(plan, state, ctx, "tools", update, name)
                        del update  # not held in this frame through the next tool call (a live run waits in it)
                    else:
                        name = "after_agent" if await self._run_batch(plan, calls, state, ctx) else "before_model"
                    if self._breaks(ctx, "after", called):
                        raise GraphInterrupt([], name)
                elif name == "after_agent":
                    if not await self._run_hooks(plan, "after_agent", state, ctx, start):
                        return
                    name, woken = "before_model", True
                else:
                    raise ValueError(f"cannot continue a run at unknown stage {stage!r}")
                start = 0
        except GraphInterrupt:
            raise
        except BaseException:
            failed = True
            raise
        finally:
            if unheard and not failed:
                assert ctx.inbox is not None
                await ctx.inbox.ack(unheard)

    @staticmethod
    def _breaks(ctx: RunContext, when: str, nodes: AbstractSet[str]) -> bool:
        """Whether the run pauses ``when`` ("before" or "after") one of ``nodes``. The first check of a run
        resumed from a pause lets it through: that is where it paused."""
        points = ctx.breakpoints
        if points is None:
            return False
        if points.resumed:
            ctx.breakpoints = Breakpoints(points.before, points.after)
            return False
        marked = points.before if when == "before" else points.after
        return "*" in marked or bool(marked & nodes)

    async def _apply(self, plan: _Plan, state: dict[str, Any], ctx: RunContext, node: str,
                     update: Mapping[str, Any], next_stage: str) -> None:
        """Merge ``update`` into the state, report it, and record it with where the run goes next."""
        apply_update(state, update, plan.reducers)
        bus = ctx.bus
        if bus is not None and bus.listeners:
            ctx.emit("updates", {node: update})
            if bus.wants_values:
                ctx.emit("values", snapshot(state))
        if ctx.recorder is not None:
            await ctx.recorder.step(node, update, next_stage)

    async def _run_hooks(self, plan: _Plan, hook: str, state: dict[str, Any], ctx: RunContext,
                         start: int) -> str | None:
        """Run ``hook`` of each middleware from ``start`` on; returns a jump target or ``None``."""
        hooks = plan.hooks[hook]
        for i in range(start, len(hooks)):
            mw_name, fn = hooks[i]
            scope = current_scope.set(InterruptScope(f"{hook}:{mw_name}:{i}", _last_id(state), ctx.resume,
                                                     enclosing=current_scope.get()))
            try:
                update = await fn(state, ctx)
            except GraphInterrupt as paused:
                paused.stage = f"{hook}:{i}"
                raise
            except Exception as exc:
                raise MiddlewareError(mw_name, hook, exc) from exc
            finally:
                current_scope.reset(scope)
            if not update:
                continue
            update = dict(update)
            jump = update.pop("jump_to", None)
            if jump is not None and jump not in JUMPS[hook]:
                allowed = ", ".join(sorted(JUMPS[hook]))
                raise MiddlewareError(mw_name, hook, ValueError(
                    f"cannot jump_to {jump!r} from {hook}; allowed: {allowed}"))
            if update:
                next_stage = _JUMP_TARGETS[jump] if jump else f"{hook}:{i + 1}"
                await self._apply(plan, state, ctx, f"{mw_name}.{hook}", update, next_stage)
            if jump:
                return jump
        return None

    async def _deliver_inbox(self, plan: _Plan, state: dict[str, Any], ctx: RunContext,
                             taken: Sequence[AnyMessage]) -> Sequence[AnyMessage]:
        """Add the messages waiting in the inbox (and not ``taken`` in already) to the state; returns them.
        They are acknowledged once a model call has heard them."""
        assert ctx.inbox is not None
        seen = {m.id for m in taken}
        arrived = [m for m in ctx.inbox.drain() if m.id not in seen]
        if arrived:
            ctx.trace.took_notifications(ctx, arrived)
            await self._apply(plan, state, ctx, "inbox", {"messages": arrived}, "before_model")
        return arrived or ()  # an empty list would stay in the run's frame through its next steps

    async def _call_model(self, plan: _Plan, state: dict[str, Any], ctx: RunContext) -> AIMessage:
        request = ModelRequest(plan.model, state["messages"], plan.system_prompt, plan.tool_list,
                               self.model_settings, state, ctx)
        scope = current_scope.set(InterruptScope("model", _last_id(state), ctx.resume, enclosing=current_scope.get()))
        opened = ctx.trace.start_model(request) if ctx.trace.on else None
        try:
            message = await plan.call_model(request)  # in this frame: the tokens it streams resume one fewer
        except BaseException as exc:
            if opened is not None:
                ctx.trace.end_model(ctx, request, opened, None, exc)
            if isinstance(exc, GraphInterrupt):
                exc.stage = f"before_model:{len(plan.hooks['before_model'])}"
            raise
        finally:
            current_scope.reset(scope)
        if opened is not None:
            ctx.trace.end_model(ctx, request, opened, message, None)
        if not isinstance(message, AIMessage):
            raise TypeError(f"the model call returned {type(message).__name__}, not an AIMessage")
        if self.name and message.name is None:
            message.name = self.name
        return message

    async def _run_batch(self, plan: _Plan, calls: list[ToolCall], state: dict[str, Any],
                         ctx: RunContext) -> bool:
        """Run the last reply's unanswered tool calls at once (or those of them without a result stored before a
        crash); returns whether a return-direct tool ran."""
        results = await asyncio.gather(*(self._execute_in_batch(plan, c, state, ctx) for c in calls),
                                       return_exceptions=True)
        waiting = [r for r in results if isinstance(r, GraphInterrupt)]
        failed = [r for r in results if isinstance(r, BaseException) and not isinstance(r, GraphInterrupt)]
        if failed:
            raise failed[0]
        if waiting:
            raise GraphInterrupt([i for w in waiting for i in w.interrupts], "tools")
        merged: dict[str, Any] = {}
        direct = False
        for update, is_direct in results:  # type: ignore[misc]
            direct = direct or is_direct
            for key, value in update.items():
                if key == "messages":
                    merged.setdefault("messages", []).extend(value)
                elif key in merged and key in plan.reducers:
                    # Two updates of one step: combined by the reducer's ``merge`` if it has one (a
                    # reducer whose updates differ from its values, as ``files``' edits do), else by it.
                    reducer = plan.reducers[key]
                    merged[key] = getattr(reducer, "merge", reducer)(merged[key], value)
                else:
                    merged[key] = value
        ctx.pending_tools = NOTHING
        await self._apply(plan, state, ctx, "tools", merged, "after_agent" if direct else "before_model")
        return direct

    async def _execute_in_batch(self, plan: _Plan, call: Any, state: dict[str, Any],
                                ctx: RunContext) -> tuple[dict[str, Any], bool]:
        """One call of a parallel batch; its result is recorded as soon as it is known."""
        if call["id"] in ctx.pending_tools:
            return ctx.pending_tools[call["id"]]
        update, direct, _ = await self._tool_call(plan, call, state, ctx)
        if ctx.recorder is not None:
            await ctx.recorder.pending(call["id"], {"update": update, "direct": direct})
        return update, direct

    async def _tool_call(self, plan: _Plan, call: Any, state: dict[str, Any],
                         ctx: RunContext) -> tuple[dict[str, Any], bool, ToolMessage]:
        """Run one tool call through the middleware, in its span when the run is traced (opened and ended here, in
        the frame that awaits the tool); returns its state update, return-direct flag and result message."""
        name = call.get("name") or ""
        tool = plan.tools.get(name)
        opened = ctx.trace.start_tool(call, tool) if ctx.trace.on else None
        message: ToolMessage | None = None
        try:
            listening = ctx.bus is not None and bool(ctx.bus.listeners)
            if listening:
                ctx.emit("tool", {"event": "started", "tool_call_id": call["id"], "tool_name": name,
                                  "args": call["args"]})
            if call.get("type") == "invalid_tool_call":
                result: ToolMessage | ToolResult = _error_message(
                    call, f"the arguments for tool {name!r} could not be read: {call.get('error')}. "
                          f"Received: {call.get('args')!r}. Call the tool again with a valid JSON object.")
            else:
                # The interrupt scope covers wrap_tool_call middleware too (e.g. an approval step); a nested agent
                # started meanwhile (by the tool or a middleware) reports as this run's subagent.
                scope = current_scope.set(CallingTool(ctx, call["id"], asyncio.get_running_loop()))
                request = ToolCallRequest(call, tool, state, ctx)
                try:
                    if plan.tool_layer is None:  # no wrap_tool_call middleware: the tool is awaited in this frame
                        try:
                            output = await _started_tool(request, plan.available)
                        except BaseException as exc:
                            result = _tool_failure(request, exc)
                        else:
                            result = _tool_output(request, output)
                    else:
                        result = await plan.call_tool(request)
                except Exception as exc:  # the outermost layer's, named here (that layer has no frame of its own)
                    error = _middleware_error(plan.tool_layer, "wrap_tool_call", exc)
                    if error is None:
                        raise
                    raise error from exc
                else:
                    if plan.hooks["after_tool_call"]:
                        result = await _after_tool_call(plan.hooks["after_tool_call"], request, result)
                finally:
                    current_scope.reset(scope)
            update, direct, message = _tool_update(result, call, tool)
        except BaseException as exc:
            if opened is not None:
                ctx.trace.end_tool(ctx, call, opened, None, exc)
            raise
        if opened is not None:
            ctx.trace.end_tool(ctx, call, opened, message, None)
        if listening:
            event = "error" if message.status == "error" else "finished"
            ctx.emit("tool", {"event": event, "tool_call_id": call["id"], "tool_name": name,
                              "message": message})
        return update, direct, message

    # -- public entry points -------------------------------------------------

    def _context(self, *, bus: EventBus | None = None, context: Any = None,
                 metadata: Mapping[str, Any] | None = None) -> RunContext:
        """A context for a run started here: nested under the calling tool's run if there is one.

        A nested run on the caller's loop without a stream of its own publishes
        straight into the caller's stream. Otherwise (``astream``/``stream``, or
        ``invoke`` from a sync tool's thread) it has its own bus, relative to it,
        whose events are forwarded to the caller's stream: either way it is
        reported the same, as a subagent if it has a name.
        """
        caller = calling_tool()
        if caller is None:
            # Without a listener, nothing reads the run's spans: only OpenTelemetry's, if set up.
            return RunContext(self.graph_name, new_id(), bus=bus, context=context, metadata=dict(metadata or {}),
                              trace=Trace(kept=bus is not None))
        parent, call_id, loop = caller.run, caller.call_id, caller.loop
        segment = f"{self.name or 'tools'}:{call_id}"
        namespace: tuple[str, ...] = (*parent.namespace, segment)
        if bus is not None or loop is not asyncio.get_running_loop():
            bus = self._forwarding_bus(caller, bus)
            namespace = ()
        else:
            bus = parent.bus
        return RunContext(
            self.graph_name, parent.run_id, thread_id=parent.thread_id, namespace=namespace, bus=bus,
            context=parent.context if context is None else context, store=parent.store,
            metadata={**parent.metadata, **(metadata or {})}, resume=parent.resume,
            runtime=parent.runtime, parent=parent, trace=parent.trace,
        )

    def _forwarding_bus(self, caller: CallingTool, bus: EventBus | None = None) -> EventBus | None:
        """``bus`` (or a new one, if the caller's stream listens) whose events reach the caller's stream."""
        parent_bus = caller.run.bus
        if parent_bus is None or not parent_bus.listeners:
            return bus
        if bus is None:
            bus = EventBus(wants_values=parent_bus.wants_values, wants_deltas=parent_bus.wants_deltas)
        forward_events(bus, caller.run, f"{self.name or 'tools'}:{caller.call_id}", caller.call_id,
                       lifecycle=self.name is not None, loop=caller.loop)
        return bus

    async def ainvoke(self, input: Any, *, thread_id: str | None = None, context: Any = None,
                      metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run to the end and return the final state (``{"messages": [...], ...}``).

        With ``thread_id`` the run continues that thread's conversation in the
        runtime the agent is registered with. An interrupted run's state has
        ``"__interrupt__"``.
        """
        if thread_id is not None:
            return await self._invoke_on_thread(thread_id, input, context, metadata, None)
        state = initial_state(input)
        # A task of its own (with a copy of the caller's context), so context variables that
        # hooks set stay within this run instead of leaking into the caller and its next run.
        result = await asyncio.create_task(self.run(state, self._context(context=context, metadata=metadata)))
        if result.interrupts:
            state["__interrupt__"] = result.interrupts
        return state

    def invoke(self, input: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`ainvoke`, for code without an event loop."""
        _require_no_running_loop("invoke", "ainvoke")
        return asyncio.run(self.ainvoke(input, **kwargs))

    def astream(self, input: Any, *, thread_id: str | None = None, context: Any = None,
                metadata: Mapping[str, Any] | None = None, values: bool = False) -> AgentStream:
        """Run and yield its :class:`~backchannel.events.Event` objects as they happen.

        ``values=True`` adds a full-state ``values`` event after each step.
        """
        async def start(bus: EventBus) -> dict[str, Any]:
            if thread_id is not None:
                return await self._invoke_on_thread(thread_id, input, context, metadata, bus)
            state = initial_state(input)
            result = await self.run(state, self._context(bus=bus, context=context, metadata=metadata))
            if result.interrupts:
                state["__interrupt__"] = result.interrupts
            return state

        return AgentStream(start, values=values)

    def stream(self, input: Any, **kwargs: Any) -> Iterator[Event]:
        """:meth:`astream`, for code without an event loop."""
        _require_no_running_loop("stream", "astream")
        loop = asyncio.new_event_loop()
        events = self.astream(input, **kwargs).__aiter__()
        try:
            while True:
                try:
                    yield loop.run_until_complete(events.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            loop.run_until_complete(events.aclose())
            loop.close()

    async def _invoke_on_thread(self, thread_id: str, input: Any, context: Any,
                                metadata: Mapping[str, Any] | None, bus: EventBus | None) -> dict[str, Any]:
        """A run on a runtime thread; from inside a tool, reported in the caller's stream as a nested run."""
        runtime = self._runtime_for_threads()
        caller = calling_tool()
        if caller is not None:
            bus = self._forwarding_bus(caller, bus)
            metadata = {**filter_metadata(caller.run.metadata), **(metadata or {})}
        return await runtime.invoke(self, thread_id, input, context=context, metadata=metadata, bus=bus)

    def _runtime_for_threads(self) -> Any:
        if self.runtime is None:
            raise RuntimeError(
                f"agent {self.graph_name!r} has no runtime to keep threads in; register it first, e.g. "
                f"LocalRuntime(agents={{{self.graph_name!r}: agent}}) (SQLite by default, or store='memory')")
        return self.runtime


def create_agent(model: SupportsChat | str | Any, tools: Sequence[Any] = (), *,
                 system_prompt: str | None = None, middleware: Sequence[Middleware] = (),
                 name: str | None = None, max_iterations: int = DEFAULT_MAX_ITERATIONS,
                 model_settings: Mapping[str, Any] | None = None, state_schema: type | None = None) -> Agent:
    """An agent: ``model`` (a model object or ``"provider:name"``) with ``tools`` and ``middleware``.

    ``name`` makes it a named agent (reported as a subagent when run from a
    tool). ``max_iterations`` bounds model calls per run
    (:class:`~backchannel.errors.MaxIterationsError`). ``model_settings`` go
    to every model call (temperature, max_tokens, ...).
    """
    return Agent(model, tools, system_prompt=system_prompt, middleware=middleware, name=name,
                 max_iterations=max_iterations, model_settings=model_settings, state_schema=state_schema)


# -- helpers -------------------------------------------------------------------


def initial_state(input: Any) -> dict[str, Any]:
    """The state a run starts from: ``{"messages": ..., **other keys}`` or just messages."""
    if isinstance(input, Mapping) and ("messages" in input or not _is_message_dict(input)):
        state = dict(input)
        state["messages"] = MessageList(messages_from_input(input.get("messages") or []))
        return state
    return {"messages": MessageList(messages_from_input(input if input is not None else []))}


def _is_message_dict(value: Mapping[str, Any]) -> bool:
    """Whether ``value`` is one message (``{"role": "user", "content": ...}``) rather than a state."""
    return ("role" in value or "type" in value) and "content" in value


def stops_run(exc: BaseException | None) -> bool:
    """Whether ``exc`` (raised as is, or wrapped by a middleware) stops a run without ending it: its runtime's
    database is away, or another process took the run over."""
    while exc is not None:
        if isinstance(exc, (StorageUnavailableError, LostRunError)):
            return True
        exc = exc.__cause__
    return False


def describe_error(exc: BaseException) -> dict[str, Any]:
    """An error as events report it: type and message, plus the middleware and hook that raised."""
    info: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, MiddlewareError):
        info["middleware"] = exc.middleware
        info["hook"] = exc.hook
    return info


def _require_no_running_loop(method: str, async_method: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"Agent.{method}() cannot run inside an event loop; use `await agent.{async_method}(...)`")


def _to_tool(obj: Any) -> Tool:
    if not isinstance(obj, Tool) and hasattr(obj, "args_schema") and hasattr(obj, "ainvoke"):
        from backchannel.models.langchain import tool_from_langchain

        return tool_from_langchain(obj)
    return as_tool(obj)


def _last_id(state: Mapping[str, Any]) -> str:
    messages = state.get("messages")
    return messages[-1].id if messages else ""


def _pending_tool_names(state: Mapping[str, Any]) -> list[str]:
    """The tools the last AI message calls."""
    last = _last_ai(state["messages"])
    return [call["name"] for call in last.tool_calls] if last is not None else []


def _stage_after_reply(plan: _Plan, message: AIMessage) -> str:
    """Where the run goes after the model's reply ("" when nothing is left to run).

    Decided before the reply is recorded, so its checkpoint names the real next
    step: a final reply's checkpoint then needs no rewrite when the run ends.
    """
    if plan.hooks["after_model"]:
        return "after_model"
    if message.tool_calls or message.invalid_tool_calls:
        return "tools"
    return "after_agent" if plan.hooks["after_agent"] else ""


def _last_ai(messages: Sequence[AnyMessage]) -> AIMessage | None:
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            return m
    return None


def _error_message(call: Any, text: str) -> ToolMessage:
    return ToolMessage(f"Error: {text}", call["id"], call.get("name"), status="error")


def _content(value: Any) -> Any:
    """Tool output as message content: strings and content blocks as they are, the rest as JSON.

    Raises :class:`ToolError` for what cannot be serialised (a circular list, an object in a
    content block), so the model is told rather than the run failing when it is saved or sent.
    """
    if isinstance(value, str):
        return value
    try:
        if isinstance(value, list) and all(isinstance(b, dict) and "type" in b for b in value):
            dumps(value)
            return value
        return json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ToolError(f"the tool returned a value that cannot be serialised to JSON: {exc}") from None


def _result_message(output: Any, call: Any, name: str | None, artifact: Any = None) -> ToolMessage:
    """The tool message of a tool's output (an error message if the output cannot be serialised)."""
    try:
        return ToolMessage(_content(output), call["id"], name, artifact=artifact)
    except ToolError as exc:
        return _error_message(call, f"tool {name!r} failed: {exc}")


def _tool_update(result: ToolMessage | ToolResult, call: Any,
                 tool: Tool | None) -> tuple[dict[str, Any], bool, ToolMessage]:
    if isinstance(result, ToolMessage):
        direct = tool is not None and tool.return_direct and result.status != "error"
        return {"messages": [result]}, direct, result
    if not isinstance(result, ToolResult):
        raise TypeError(f"wrap_tool_call must return a ToolMessage or ToolResult, got {type(result).__name__}")
    message = _result_message(result.content, call, call.get("name"), result.artifact)
    if message.status == "error":
        return {"messages": [message]}, False, message
    update: dict[str, Any] = dict(result.update or {})
    update["messages"] = [message, *messages_from_input(update.get("messages") or [])]
    direct = result.return_direct if result.return_direct is not None else bool(tool and tool.return_direct)
    return update, direct, message


async def _invoke_model(request: ModelRequest) -> AIMessage:
    """The model call itself: streamed when somebody listens for deltas, else one request. Its errors are the
    model's (marked so that ``wrap_model_call`` middleware lets them through as they are)."""
    ctx: RunContext = request.ctx
    bus = ctx.bus
    try:
        if bus is None or not bus.listeners:
            return await request.model.generate(request)
        message_id = new_id()
        ctx.emit("message", {"event": "start", "message_id": message_id})
        if bus.wants_deltas:
            acc = Accumulator()
            async for delta in request.model.stream(request):
                acc.add(delta)
                if type(delta) is TextDelta:
                    ctx.emit("message", {"event": "delta", "message_id": message_id, "text": delta.text})
                elif type(delta) is ToolCallDelta:
                    ctx.emit("message", {"event": "delta", "message_id": message_id, "tool_call": {
                        "index": delta.index, "id": delta.id, "name": delta.name, "args": delta.args}})
            message = acc.message()
        else:
            message = await request.model.generate(request)
    except Exception as exc:
        _mark_passthrough(exc)
        raise
    if message.id != message_id:
        message.response_metadata.setdefault("id", message.id)
        message.id = message_id
    ctx.emit("message", {"event": "finish", "message_id": message_id, "message": message,
                         "usage": message.usage_metadata})
    return message


def _tool_invoker(available: str) -> ToolHandler:
    """The innermost tool handler under ``wrap_tool_call`` middleware: the call itself, every failure an error
    message for the model (without such middleware the agent's ``_tool_call`` does the same in its own frame)."""

    async def invoke_tool(request: ToolCallRequest) -> ToolMessage | ToolResult:
        try:
            output = await _started_tool(request, available)
        except BaseException as exc:
            return _tool_failure(request, exc)
        return _tool_output(request, output)

    return invoke_tool


def _started_tool(request: ToolCallRequest, available: str) -> Awaitable[Any]:
    """The call's tool started, to await: its arguments validated (``ToolArgumentsError``), an unknown tool a
    ``ToolError``."""
    call, tool, ctx = request.call, request.tool, request.ctx
    if tool is None:
        raise ToolError(f"there is no tool named {call['name']!r}. Available tools: {available}.")
    runtime = None
    if tool.runtime_param is not None:
        runtime = ToolRuntime(ctx.thread_id, ctx.run_id, ctx.agent, call["id"], request.state,
                              ctx.context, ctx.store, ctx.emit_custom, ctx)
    return tool.start(call["args"], runtime)


def _tool_output(request: ToolCallRequest, output: Any) -> ToolMessage | ToolResult:
    """A tool's output as its result: a message or result as it is, anything else as a message's content."""
    if isinstance(output, (ToolMessage, ToolResult)):
        return output
    return _result_message(output, request.call, _tool_name(request))


def _tool_failure(request: ToolCallRequest, exc: BaseException) -> ToolMessage:
    """What the model is told of a tool call that raised ``exc``; ``exc`` raised again when it stops the run."""
    call, name = request.call, _tool_name(request)
    if isinstance(exc, ToolArgumentsError):
        return _error_message(call, f"invalid arguments for tool {name!r}: {exc}. "
                                    "Call the tool again with arguments that match its schema.")
    if isinstance(exc, ToolError):
        return _error_message(call, str(exc))
    if isinstance(exc, (GraphInterrupt, asyncio.CancelledError, StorageUnavailableError, LostRunError)):
        # The run's own database is away, or the run is another process's now: it stops here, and
        # wrap_tool_call middleware lets it through as it is.
        _mark_passthrough(exc)
        raise exc
    # SystemExit from argparse, KeyboardInterrupt from a library: the tool failed
    return _error_message(call, f"tool {name!r} failed: {type(exc).__name__}: {exc}")


def _tool_name(request: ToolCallRequest) -> str:
    return request.tool.name if request.tool is not None else request.call["name"]


def _chain(hook: str, wrappers: list[tuple[str, Any]], innermost: Any) -> Any:
    """Compose ``wrap_*`` middleware around ``innermost``; the first registered is the outermost."""
    handler = innermost
    for mw_name, fn in reversed(wrappers):
        handler = _layer(hook, mw_name, fn, handler)
    return handler


def _flat_chain(hook: str, wrappers: list[tuple[str, Any]], innermost: Any) -> Any:
    """:func:`_chain` without the outermost layer's frame: its caller names what that middleware raises itself
    (:func:`_middleware_error`), one coroutine fewer suspended with every call (a tool's, for its whole length)."""
    if not wrappers:
        return innermost
    (_, outermost), inner = wrappers[0], _chain(hook, wrappers[1:], innermost)

    def call(request: Any) -> Any:
        return outermost(request, inner)

    return call


def _layer(hook: str, mw_name: str, fn: Any, inner: Any) -> Any:
    """``fn`` around ``inner``: what ``fn`` raises itself is a :class:`MiddlewareError` naming it. What ``inner``
    raises comes through as it is: the innermost handler marks its own errors and a layer raises only marked
    ones (or interrupts and middleware errors), so no coroutine between them stays suspended with every call."""

    async def layer(request: Any) -> Any:
        try:
            return await fn(request, inner)
        except Exception as exc:
            error = _middleware_error(mw_name, hook, exc)
            if error is None:
                raise
            raise error from exc

    return layer


async def _after_tool_call(hooks: list[tuple[str, Any]], request: ToolCallRequest,
                           result: ToolMessage | ToolResult) -> ToolMessage | ToolResult:
    """``result`` through each ``after_tool_call`` hook in turn, each getting the one before's answer."""
    for mw_name, fn in hooks:
        try:
            result = await fn(request, result)
        except Exception as exc:
            error = _middleware_error(mw_name, "after_tool_call", exc)
            if error is None:
                raise
            raise error from exc
        if not isinstance(result, (ToolMessage, ToolResult)):
            raise MiddlewareError(mw_name, "after_tool_call", TypeError(
                f"after_tool_call must return a ToolMessage or ToolResult, got {type(result).__name__}"))
    return result


def _middleware_error(mw_name: str | None, hook: str, exc: Exception) -> MiddlewareError | None:
    """The error naming the middleware ``mw_name`` that raised ``exc`` in ``hook``; ``None`` when ``exc`` passes
    through as it is (an interrupt, a middleware error, the model's or an inner layer's error; no middleware)."""
    if mw_name is None or isinstance(exc, (GraphInterrupt, MiddlewareError)) \
            or getattr(exc, "_backchannel_passthrough", False):
        return None
    return MiddlewareError(mw_name, hook, exc)


def _mark_passthrough(exc: BaseException) -> None:
    try:
        exc._backchannel_passthrough = True  # type: ignore[attr-defined]
    except AttributeError:
        pass
