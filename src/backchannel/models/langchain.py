"""The LangChain bridge: any LangChain chat model as a backchannel model, LangChain tools as ours.

``LangChainModel`` converts messages both ways, binds tools with
``bind_tools`` and passes request settings as call keyword arguments (the
provider request's parameters, for most LangChain chat models).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

try:
    from langchain_core import messages as lc
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages.tool import ToolCallChunk
    from langchain_core.runnables import Runnable
    from langchain_core.tools import BaseTool
    from langchain_core.utils.function_calling import convert_to_openai_tool
except ImportError as exc:
    raise ImportError(
        "the LangChain bridge needs langchain-core: "
        'install with pip install "backchannel[langchain]"'
    ) from exc

from backchannel.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    new_id,
    text_of,
    tool_call,
)
from backchannel.models.base import (
    ChatModel,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    provider_errors,
)
from backchannel.tools import Tool

__all__ = ["LangChainModel", "tool_from_langchain"]


class LangChainModel(ChatModel):
    """Wraps a LangChain ``BaseChatModel`` (``ChatOpenAI``, ``ChatAnthropic``, ...).

    Provider errors that carry an HTTP status, and connection failures, are raised as
    :class:`~backchannel.errors.ModelError` subclasses, like the native adapters'.
    """

    def __init__(self, model: BaseChatModel, *, name: str | None = None) -> None:
        self.model = model
        self.name = (
            name
            or getattr(model, "model_name", None)
            or getattr(model, "model", None)
            or type(model).__name__
        )
        self.provider = str(getattr(model, "_llm_type", None) or "langchain")

    async def generate(self, request: ModelRequest) -> AIMessage:
        runnable, kwargs = self._runnable(request)
        with provider_errors(self.provider):
            reply = await runnable.ainvoke(_langchain_messages(request), **kwargs)
        return _message_from_langchain(reply)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        runnable, kwargs = self._runnable(request)
        finish = _StreamFinish()
        call_indexes = _ToolCallIndexes()
        with provider_errors(self.provider):
            async for chunk in runnable.astream(_langchain_messages(request), **kwargs):
                text = text_of(chunk.content)
                if text:
                    yield TextDelta(text)
                for call in chunk.tool_call_chunks:
                    yield ToolCallDelta(
                        call_indexes.index_of(call),
                        call.get("id"),
                        call.get("name"),
                        call.get("args") or "",
                    )
                finish.add(chunk)
        yield finish.delta()

    def _runnable(self, request: ModelRequest) -> tuple[Runnable[Any, Any], dict[str, Any]]:
        """The model (with the request's tools bound) and the keyword arguments to call it with."""
        kwargs = dict(request.settings)
        if not request.tools:
            return self.model, kwargs
        bind_options = {"tool_choice": kwargs.pop("tool_choice")} if "tool_choice" in kwargs else {}
        tools = [{"type": "function", "function": t.schema()} for t in request.tools]
        return self.model.bind_tools(tools, **bind_options), kwargs


def tool_from_langchain(lc_tool: BaseTool) -> Tool:
    """A LangChain tool as a :class:`Tool`: same name, description and argument schema."""
    # convert_to_openai_tool reads tool_call_schema (args_schema minus injected arguments)
    # and copes with pydantic v1/v2 models and plain JSON schemas alike.
    function = convert_to_openai_tool(lc_tool)["function"]

    async def run_langchain_tool(**args: Any) -> Any:
        return await lc_tool.ainvoke(args)

    return Tool(
        run_langchain_tool,
        name=lc_tool.name,
        description=lc_tool.description or function.get("description"),
        return_direct=lc_tool.return_direct,
        args_schema=function.get("parameters") or {"type": "object", "properties": {}},
    )


def _langchain_messages(request: ModelRequest) -> list[lc.BaseMessage]:
    messages: list[lc.BaseMessage] = (
        [lc.SystemMessage(request.system_prompt)] if request.system_prompt else []
    )
    messages.extend(_langchain_message(m) for m in request.messages)
    return messages


def _langchain_message(message: AnyMessage) -> lc.BaseMessage:
    if isinstance(message, SystemMessage):
        return lc.SystemMessage(message.content, id=message.id, name=message.name)
    if isinstance(message, HumanMessage):
        return lc.HumanMessage(message.content, id=message.id, name=message.name)
    if isinstance(message, AIMessage):
        return lc.AIMessage(
            message.content,
            id=message.id,
            name=message.name,
            tool_calls=list(message.tool_calls),
            invalid_tool_calls=list(message.invalid_tool_calls),
            response_metadata=dict(message.response_metadata),
        )
    if isinstance(message, ToolMessage):
        return lc.ToolMessage(
            message.content,
            tool_call_id=message.tool_call_id,
            id=message.id,
            name=message.name,
            status=message.status,
            artifact=message.artifact,
        )
    raise TypeError(f"cannot send {type(message).__name__} to a LangChain model: {message!r}")


def _message_from_langchain(reply: lc.AIMessage) -> AIMessage:
    return AIMessage(
        content=reply.content,
        tool_calls=[_tool_call(c) for c in reply.tool_calls],
        invalid_tool_calls=[_invalid_tool_call(c) for c in reply.invalid_tool_calls],
        usage_metadata=_usage(reply.usage_metadata),
        response_metadata=dict(reply.response_metadata),
        id=reply.id or new_id(),
    )


def _tool_call(call: Mapping[str, Any]) -> ToolCall:
    return tool_call(call["name"], call.get("args"), call.get("id"))


def _invalid_tool_call(call: Mapping[str, Any]) -> InvalidToolCall:
    return {
        "name": call.get("name"),
        "args": call.get("args"),
        "id": call.get("id") or new_id(),
        "error": call.get("error"),
        "type": "invalid_tool_call",
    }


def _usage(usage: Mapping[str, Any] | None) -> Usage | None:
    if not usage:
        return None
    return {
        "input_tokens": usage.get("input_tokens") or 0,
        "output_tokens": usage.get("output_tokens") or 0,
        "total_tokens": usage.get("total_tokens") or 0,
    }


class _ToolCallIndexes:
    """Dense tool-call indexes (0, 1, ...) from a provider's chunk indexes.

    Some providers index tool-call chunks by content block (so text takes
    index 0), and some send no index at all, only an id on each call's first chunk.
    """

    def __init__(self) -> None:
        self.by_key: dict[Any, int] = {}
        self.last_key: Any = None

    def index_of(self, chunk: ToolCallChunk) -> int:
        key: Any = chunk.get("index")
        if key is None:
            key = chunk.get("id") or self.last_key
        self.last_key = key
        return self.by_key.setdefault(key, len(self.by_key))


class _StreamFinish:
    """What the final delta reports, gathered from the chunks: usage is summed, metadata merged."""

    def __init__(self) -> None:
        self.usage: Usage | None = None
        self.metadata: dict[str, Any] = {}
        self.message_id: str | None = None

    def add(self, chunk: lc.AIMessageChunk) -> None:
        usage = _usage(chunk.usage_metadata)
        if usage:
            self.usage = _add_usage(self.usage, usage)
        self.metadata.update(chunk.response_metadata)
        self.message_id = self.message_id or chunk.id

    def delta(self) -> FinishDelta:
        finish_reason = self.metadata.get("finish_reason") or self.metadata.get("stop_reason")
        return FinishDelta(self.usage, finish_reason, self.metadata, self.message_id)


def _add_usage(total: Usage | None, more: Usage) -> Usage:
    if total is None:
        return more
    return {
        "input_tokens": total["input_tokens"] + more["input_tokens"],
        "output_tokens": total["output_tokens"] + more["output_tokens"],
        "total_tokens": total["total_tokens"] + more["total_tokens"],
    }
