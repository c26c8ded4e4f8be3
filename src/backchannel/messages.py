"""Message types and their LangChain/LangGraph dict form.

Messages are slotted dataclasses: cheap to create, cheap to keep. They
serialise to the dict shape LangChain and the LangGraph API use
(``{"type": "ai", "content": ..., "tool_calls": [...], "id": ...}``) and are
read back from it, from OpenAI-style ``{"role": "user", ...}`` dicts, from
``("user", "text")`` tuples and from plain strings.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, TypedDict

from backchannel._ids import new_id

__all__ = [
    "REMOVE_ALL_MESSAGES",
    "AIMessage",
    "AnyMessage",
    "HumanMessage",
    "InvalidToolCall",
    "RemoveMessage",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "Usage",
    "message_from_dict",
    "message_to_dict",
    "messages_from_input",
    "new_id",
    "pending_tool_calls",
    "text_of",
    "tool_call",
]

Content: TypeAlias = str | list[Any]


class ToolCall(TypedDict):
    """A tool call as LangChain writes it: ``{"name", "args", "id", "type"}``."""

    name: str
    args: dict[str, Any]
    id: str
    type: Literal["tool_call"]


class InvalidToolCall(TypedDict):
    """A tool call whose arguments could not be parsed; ``args`` is the raw text."""

    name: str | None
    args: str | None
    id: str
    error: str | None
    type: Literal["invalid_tool_call"]


class Usage(TypedDict, total=False):
    """Token usage of one model call, in LangChain's ``usage_metadata`` shape."""

    input_tokens: int
    output_tokens: int
    total_tokens: int


def text_of(content: Content) -> str:
    """The plain text of message content: a string, or the text blocks of a list."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(block.get("text", ""))
    return "".join(parts)


@dataclass(slots=True)
class SystemMessage:
    """Instructions for the model."""

    content: Content
    id: str = field(default_factory=new_id)
    name: str | None = None
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    type: Literal["system"] = field(default="system", init=False)

    @property
    def text(self) -> str:
        return text_of(self.content)


@dataclass(slots=True)
class HumanMessage:
    """A message from the user (LangChain type ``human``, OpenAI role ``user``)."""

    content: Content
    id: str = field(default_factory=new_id)
    name: str | None = None
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    type: Literal["human"] = field(default="human", init=False)

    @property
    def text(self) -> str:
        return text_of(self.content)


@dataclass(slots=True)
class AIMessage:
    """A model reply: text and/or tool calls, with usage when the provider reports it."""

    content: Content = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    invalid_tool_calls: list[InvalidToolCall] = field(default_factory=list)
    usage_metadata: Usage | None = None
    response_metadata: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=new_id)
    name: str | None = None
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    type: Literal["ai"] = field(default="ai", init=False)

    @property
    def text(self) -> str:
        return text_of(self.content)


@dataclass(slots=True)
class ToolMessage:
    """The result of one tool call; ``status="error"`` tells the model it failed."""

    content: Content
    tool_call_id: str
    name: str | None = None
    status: Literal["success", "error"] = "success"
    artifact: Any = None
    id: str = field(default_factory=new_id)
    additional_kwargs: dict[str, Any] = field(default_factory=dict)
    type: Literal["tool"] = field(default="tool", init=False)

    @property
    def text(self) -> str:
        return text_of(self.content)


AnyMessage: TypeAlias = SystemMessage | HumanMessage | AIMessage | ToolMessage


@dataclass(slots=True)
class RemoveMessage:
    """In a ``messages`` update: delete the message with this id (``"*"`` deletes them all)."""

    id: str
    type: Literal["remove"] = field(default="remove", init=False)


REMOVE_ALL_MESSAGES = "*"

_ROLE_TO_TYPE = {
    "user": "human",
    "human": "human",
    "assistant": "ai",
    "ai": "ai",
    "system": "system",
    "developer": "system",
    "tool": "tool",
}


def tool_call(name: str, args: dict[str, Any] | None = None, id: str | None = None) -> ToolCall:
    """Build a tool call dict (an id is generated when none is given)."""
    return {"name": name, "args": args or {}, "id": id or f"call_{uuid.uuid4().hex[:24]}", "type": "tool_call"}


def message_to_dict(message: AnyMessage) -> dict[str, Any]:
    """The LangChain/LangGraph dict form of a message."""
    data: dict[str, Any] = {
        "type": message.type,
        "content": message.content,
        "id": message.id,
        "name": message.name,
        "additional_kwargs": message.additional_kwargs,
        "response_metadata": {},
    }
    if isinstance(message, AIMessage):
        data["response_metadata"] = message.response_metadata
        data["tool_calls"] = message.tool_calls
        data["invalid_tool_calls"] = message.invalid_tool_calls
        data["usage_metadata"] = message.usage_metadata
    elif isinstance(message, ToolMessage):
        data["tool_call_id"] = message.tool_call_id
        data["status"] = message.status
        data["artifact"] = message.artifact
    return data


def message_from_dict(data: dict[str, Any]) -> AnyMessage | RemoveMessage:
    """Read a message from a LangChain dict (``type``) or an OpenAI-style dict (``role``)."""
    kind = data.get("type") or data.get("role")
    if kind == "remove" and data.get("id"):
        return RemoveMessage(str(data["id"]))
    kind = _ROLE_TO_TYPE.get(kind) if isinstance(kind, str) else None
    if kind is None:
        raise ValueError(
            f"cannot read a message from {data!r}: it needs a 'type' "
            "(human, ai, system, tool) or a 'role' (user, assistant, system, tool)"
        )
    if "content" not in data and kind != "ai":
        raise ValueError(f"cannot read a {kind} message from {data!r}: 'content' is missing")
    content = data.get("content") or ("" if kind == "ai" else data["content"])
    # Each field passed as it is read (no dict of common fields unpacked): a long thread's first run after a
    # restart reads every one of its messages.
    message_id = str(data["id"]) if data.get("id") else new_id()
    given = data.get("additional_kwargs")
    extra = dict(given) if given else {}  # copied: the message owns its containers
    if kind == "human":
        return HumanMessage(content=content, id=message_id, name=data.get("name"), additional_kwargs=extra)
    if kind == "system":
        return SystemMessage(content=content, id=message_id, name=data.get("name"), additional_kwargs=extra)
    if kind == "tool":
        if not data.get("tool_call_id"):
            raise ValueError(f"cannot read a tool message from {data!r}: 'tool_call_id' is missing")
        return ToolMessage(content=content, tool_call_id=data["tool_call_id"], name=data.get("name"),
                           status=data.get("status") or "success", artifact=data.get("artifact"), id=message_id,
                           additional_kwargs=extra)
    calls, invalid, metadata = data.get("tool_calls"), data.get("invalid_tool_calls"), data.get("response_metadata")
    return AIMessage(content=content, tool_calls=[_read_tool_call(c) for c in calls] if calls else [],
                     invalid_tool_calls=list(invalid) if invalid else [], usage_metadata=data.get("usage_metadata"),
                     response_metadata=dict(metadata) if metadata else {}, id=message_id, name=data.get("name"),
                     additional_kwargs=extra)


def _read_tool_call(call: dict[str, Any]) -> ToolCall:
    # OpenAI's wire form nests name/arguments under "function"; LangChain's is flat.
    if "function" in call:
        import json

        fn = call["function"]
        args = fn.get("arguments") or "{}"
        return tool_call(fn["name"], json.loads(args) if isinstance(args, str) else args, call.get("id"))
    return tool_call(call["name"], call.get("args") or {}, call.get("id"))


def pending_tool_calls(messages: list[AnyMessage]) -> tuple[AIMessage | None, list[Any]]:
    """The last AI message and those of its tool calls (valid or not) that have no result yet."""
    answered: set[str] = set()
    for m in reversed(messages):
        if isinstance(m, AIMessage):
            calls = [*m.tool_calls, *m.invalid_tool_calls]
            return m, [c for c in calls if c["id"] not in answered]
        if isinstance(m, ToolMessage):
            answered.add(m.tool_call_id)
    return None, []


def messages_from_input(value: Any) -> list[AnyMessage | RemoveMessage]:
    """Messages from what users pass as input: a message, a dict, a tuple, a string, or a list of them."""
    if isinstance(value, (list, tuple)) and not _is_role_tuple(value):
        return [_one_message(v) for v in value]
    return [_one_message(value)]


def _is_role_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(isinstance(v, str) for v in value)


def _one_message(value: Any) -> AnyMessage | RemoveMessage:
    if isinstance(value, (SystemMessage, HumanMessage, AIMessage, ToolMessage, RemoveMessage)):
        return value
    if isinstance(value, str):
        return HumanMessage(value)
    if isinstance(value, dict):
        return message_from_dict(value)
    if _is_role_tuple(value) or (isinstance(value, list) and len(value) == 2):
        return message_from_dict({"role": value[0], "content": value[1]})
    if hasattr(value, "type") and hasattr(value, "content"):  # a LangChain message object
        return message_from_dict(value.model_dump() if hasattr(value, "model_dump") else vars(value))
    raise TypeError(f"cannot read a message from {type(value).__name__}: {value!r}")
