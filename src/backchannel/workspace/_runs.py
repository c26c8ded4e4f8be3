"""A :class:`~backchannel.tools.ToolRuntime` for a hook, so middleware bind backends as tools do."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.context import RunContext
from backchannel.tools import ToolRuntime


def hook_runtime(state: Mapping[str, Any], ctx: RunContext | None, tool_call_id: str = "") -> ToolRuntime:
    """What a tool of this run would see, for backends bound from a middleware hook."""
    if ctx is None:
        return ToolRuntime(None, None, "agent", tool_call_id, state)
    return ToolRuntime(ctx.thread_id, ctx.run_id, ctx.agent, tool_call_id, state, ctx.context, ctx.store,
                       ctx.emit_custom, ctx)
