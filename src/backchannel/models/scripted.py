"""A deterministic model that replies from a script: for tests, benchmarks and the offline demo."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeAlias

from backchannel.errors import ModelError
from backchannel.messages import AIMessage, ToolCall, new_id
from backchannel.models.base import ChatModel, FinishDelta, ModelDelta, ModelRequest, TextDelta, ToolCallDelta

__all__ = ["ScriptedModel", "ScriptItem"]

ScriptItem: TypeAlias = "str | AIMessage | dict[str, Any] | BaseException | Callable[[ModelRequest], Any]"


class ScriptedModel(ChatModel):
    """Replies with the next item of its script, in order.

    An item is a string (a text answer), an :class:`AIMessage`, a dict like
    ``{"content": "...", "tool_calls": [{"name": "add", "args": {...}}]}``, an
    exception (raised, as a provider error would be), or a function of the
    request returning any of those. ``latency`` (seconds) is slept before each
    reply; ``loop=True`` starts the script over when it runs out.
    """

    def __init__(self, script: Sequence[Any], *, latency: float = 0.0, loop: bool = False,
                 name: str = "scripted", chunk_size: int = 1) -> None:
        self.script = list(script)
        self.latency = latency
        self.loop = loop
        self.name = name
        self.chunk_size = chunk_size
        self.calls = 0
        self.requests: list[ModelRequest] = []
        self.record = False

    def _next(self, request: ModelRequest) -> AIMessage:
        index = self.calls
        self.calls += 1
        if self.record:
            # A snapshot: the request's messages are the run's live list, which keeps growing.
            self.requests.append(request.override(messages=list(request.messages)))
        if index >= len(self.script):
            if not self.loop or not self.script:
                raise ModelError(f"ScriptedModel ran out of replies: its script has {len(self.script)} "
                                 f"item(s) and this is call {index + 1}")
            index %= len(self.script)
        item = self.script[index]
        if callable(item) and not isinstance(item, BaseException):
            item = item(request)
        return self._to_message(item, index)

    def _to_message(self, item: Any, index: int) -> AIMessage:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str):
            return AIMessage(item)
        if isinstance(item, AIMessage):
            # A fresh copy each time, so a looping script never repeats a message id.
            return AIMessage(item.content, list(item.tool_calls), list(item.invalid_tool_calls),
                             item.usage_metadata, dict(item.response_metadata))
        if isinstance(item, dict):
            calls: list[ToolCall] = [
                {"name": c["name"], "args": c.get("args", {}), "id": c.get("id") or f"call_{self.calls}_{i}",
                 "type": "tool_call"}
                for i, c in enumerate(item.get("tool_calls", ()))
            ]
            return AIMessage(item.get("content", ""), calls, list(item.get("invalid_tool_calls", ())),
                             item.get("usage"))
        raise TypeError(f"ScriptedModel cannot reply with {type(item).__name__}: {item!r}")

    async def generate(self, request: ModelRequest) -> AIMessage:
        if self.latency:
            await asyncio.sleep(self.latency)
        return self._next(request)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        if self.latency:
            await asyncio.sleep(self.latency)
        message = self._next(request)
        words = message.text.split(" ") if message.text else []
        for i in range(0, len(words), self.chunk_size):
            piece = " ".join(words[i : i + self.chunk_size])
            yield TextDelta(piece if i + self.chunk_size >= len(words) else piece + " ")
            await asyncio.sleep(0)
        for i, call in enumerate(message.tool_calls):
            args = json.dumps(call["args"])
            half = len(args) // 2
            yield ToolCallDelta(i, call["id"], call["name"], args[:half])
            yield ToolCallDelta(i, None, None, args[half:])
        for j, bad in enumerate(message.invalid_tool_calls, start=len(message.tool_calls)):
            yield ToolCallDelta(j, bad.get("id") or new_id(), bad.get("name"), bad.get("args") or "")
        yield FinishDelta(message.usage_metadata, "tool_calls" if message.tool_calls else "stop",
                          {"model_name": self.name}, message.id)
