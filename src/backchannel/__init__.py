"""backchannel: a fast harness for deep agents.

The public API, re-exported from the modules that own it.
"""

from backchannel._version import __version__ as __version__
from backchannel.agent import Agent, create_agent
from backchannel.context import RunContext
from backchannel.errors import (
    BackchannelError,
    ConflictError,
    InvalidRequestError,
    MaxIterationsError,
    MiddlewareError,
    ModelError,
    NotFoundError,
)
from backchannel.events import Event, EventBus
from backchannel.interrupts import Interrupt, interrupt
from backchannel.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    message_from_dict,
    message_to_dict,
    tool_call,
)
from backchannel.middleware import (
    Middleware,
    ToolCallRequest,
    after_agent,
    after_model,
    after_tool_call,
    before_agent,
    before_model,
    wrap_model_call,
    wrap_tool_call,
)
from backchannel.models import ChatModel, ModelRequest, ScriptedModel, init_model
from backchannel.result import RunResult
from backchannel.streaming import AgentStream, SubagentHandle
from backchannel.tools import Tool, ToolError, ToolResult, ToolRuntime, tool
from backchannel.tracing import configure_tracing

# The higher layers load on first use, so ``import backchannel`` stays light.
_LAZY = {
    "LocalRuntime": "backchannel.runtime",
    "create_deep_agent": "backchannel.deep_agent",
    "SubAgent": "backchannel.subagents",
    "HumanInTheLoop": "backchannel.hitl",
    "CompletionNotifier": "backchannel.notifier",
    "SummarizationMiddleware": "backchannel.summarization",
    "AgentMemoryMiddleware": "backchannel.memory",
    "HandoffMiddleware": "backchannel.handoff",
    "propose_handoff": "backchannel.handoff",
    "decide_handoff": "backchannel.handoff",
    "StateBackend": "backchannel.workspace",
    "FilesystemBackend": "backchannel.workspace",
    "StoreBackend": "backchannel.workspace",
    "CompositeBackend": "backchannel.workspace",
    "LocalShellBackend": "backchannel.workspace",
    "FilesystemMiddleware": "backchannel.workspace",
    "TodoListMiddleware": "backchannel.workspace",
    "MemoryMiddleware": "backchannel.workspace",
    "SkillsMiddleware": "backchannel.workspace",
    "MCPClient": "backchannel.mcp",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'backchannel' has no attribute {name!r}")

__all__ = [
    "CompositeBackend",
    "FilesystemBackend",
    "FilesystemMiddleware",
    "LocalShellBackend",
    "MCPClient",
    "MemoryMiddleware",
    "SkillsMiddleware",
    "StateBackend",
    "StoreBackend",
    "TodoListMiddleware",
    "AIMessage",
    "AgentMemoryMiddleware",
    "HandoffMiddleware",
    "SummarizationMiddleware",
    "decide_handoff",
    "propose_handoff",
    "CompletionNotifier",
    "HumanInTheLoop",
    "LocalRuntime",
    "SubAgent",
    "create_deep_agent",
    "Agent",
    "AgentStream",
    "AnyMessage",
    "BackchannelError",
    "ChatModel",
    "ConflictError",
    "Event",
    "EventBus",
    "HumanMessage",
    "Interrupt",
    "InvalidRequestError",
    "MaxIterationsError",
    "Middleware",
    "MiddlewareError",
    "ModelError",
    "ModelRequest",
    "NotFoundError",
    "RemoveMessage",
    "RunContext",
    "RunResult",
    "ScriptedModel",
    "SubagentHandle",
    "SystemMessage",
    "Tool",
    "ToolCall",
    "ToolCallRequest",
    "ToolError",
    "ToolMessage",
    "ToolResult",
    "ToolRuntime",
    "after_agent",
    "after_model",
    "after_tool_call",
    "before_agent",
    "before_model",
    "configure_tracing",
    "create_agent",
    "init_model",
    "interrupt",
    "message_from_dict",
    "message_to_dict",
    "tool",
    "tool_call",
    "wrap_model_call",
    "wrap_tool_call",
]
