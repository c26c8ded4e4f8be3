"""The chat-model protocol every adapter implements.

A model takes a :class:`ModelRequest` and either returns the whole reply
(``generate``) or yields it in pieces (``stream``). Adapters implement one or
both; :class:`ChatModel` derives the other.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeAlias, runtime_checkable

from backchannel.errors import (
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
    ModelRateLimitError,
    ModelRequestError,
    ModelServerError,
)
from backchannel.messages import AIMessage, AnyMessage, InvalidToolCall, ToolCall, Usage
from backchannel.tools import Tool

__all__ = [
    "ChatModel",
    "FinishDelta",
    "ModelDelta",
    "ModelRequest",
    "SupportsChat",
    "TextDelta",
    "ToolCallDelta",
    "accumulate",
    "model_error",
    "parse_tool_arguments",
    "provider_errors",
]


@dataclass(slots=True)
class ModelRequest:
    """One model call: what the model sees, plus the run it belongs to (for middleware).

    ``messages`` is the run's own list: replace it (``request.override(messages=...)``),
    don't mutate it in place.
    """

    model: SupportsChat
    messages: Sequence[AnyMessage]
    system_prompt: str | None = None
    tools: Sequence[Tool] = ()
    settings: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    ctx: Any = None

    def override(self, **changes: Any) -> ModelRequest:
        """A copy of this request with some fields replaced."""
        return replace(self, **changes)


@dataclass(slots=True)
class TextDelta:
    """A piece of the reply's text."""

    text: str


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one tool call; ``index`` says which call, ``args`` is a fragment of its JSON."""

    index: int
    id: str | None = None
    name: str | None = None
    args: str = ""


@dataclass(slots=True)
class FinishDelta:
    """The end of the reply: usage, stop reason and provider metadata."""

    usage: Usage | None = None
    finish_reason: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None


ModelDelta: TypeAlias = TextDelta | ToolCallDelta | FinishDelta


@runtime_checkable
class SupportsChat(Protocol):
    """What the agent needs of a model."""

    name: str

    async def generate(self, request: ModelRequest) -> AIMessage: ...

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]: ...


class ChatModel:
    """Base class for adapters: implement ``generate`` or ``stream`` (or both)."""

    name: str = "model"

    async def generate(self, request: ModelRequest) -> AIMessage:
        """The whole reply; by default, the accumulated stream."""
        if type(self).stream is ChatModel.stream:
            raise NotImplementedError(f"{type(self).__name__} implements neither generate nor stream")
        return await accumulate(self.stream(request))

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        """The reply in pieces; by default, the whole reply as one piece of each kind."""
        message = await self.generate(request)
        if message.text:
            yield TextDelta(message.text)
        for i, call in enumerate(message.tool_calls):
            yield ToolCallDelta(i, call["id"], call["name"], json.dumps(call["args"]))
        for j, bad in enumerate(message.invalid_tool_calls, start=len(message.tool_calls)):
            yield ToolCallDelta(j, bad["id"], bad["name"], bad["args"] or "")
        yield FinishDelta(message.usage_metadata, message.response_metadata.get("finish_reason"),
                          message.response_metadata, message.id)


class Accumulator:
    """Builds an :class:`AIMessage` from deltas."""

    __slots__ = ("text", "calls", "finish")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, list[Any]] = {}
        self.finish = FinishDelta()

    def add(self, delta: ModelDelta) -> None:
        if type(delta) is TextDelta:
            self.text.append(delta.text)
        elif type(delta) is ToolCallDelta:
            call = self.calls.setdefault(delta.index, [None, None, []])
            call[0] = call[0] or delta.id
            call[1] = call[1] or delta.name
            call[2].append(delta.args)
        elif isinstance(delta, FinishDelta):
            self.finish = delta

    def message(self) -> AIMessage:
        tool_calls: list[ToolCall] = []
        invalid: list[InvalidToolCall] = []
        for index in sorted(self.calls):
            call_id, name, fragments = self.calls[index]
            call_id = call_id or f"call_{index}"
            raw = "".join(fragments)
            args, error = parse_tool_arguments(raw)
            if error is None and name:
                tool_calls.append({"name": name, "args": args, "id": call_id, "type": "tool_call"})
            else:
                invalid.append({"name": name, "args": raw, "id": call_id,
                                "error": error or "the tool call has no name", "type": "invalid_tool_call"})
        metadata = dict(self.finish.metadata)
        if self.finish.finish_reason:
            metadata["finish_reason"] = self.finish.finish_reason
        message = AIMessage("".join(self.text), tool_calls, invalid, self.finish.usage, metadata)
        if self.finish.message_id:
            message.id = self.finish.message_id
        return message


def parse_tool_arguments(raw: str | None) -> tuple[dict[str, Any], str | None]:
    """Parse a tool call's JSON arguments; returns ``(args, None)`` or ``({}, error)``."""
    if not raw or not raw.strip():
        return {}, None
    try:
        args = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, f"the arguments are not valid JSON ({exc.msg} at position {exc.pos})"
    if not isinstance(args, dict):
        return {}, f"the arguments must be a JSON object, got {type(args).__name__}"
    return args, None


async def accumulate(deltas: AsyncIterator[ModelDelta]) -> AIMessage:
    """Drain a delta stream into one message."""
    acc = Accumulator()
    async for delta in deltas:
        acc.add(delta)
    return acc.message()


# -- provider errors ---------------------------------------------------------------------------

# The status an error reported inside a 200 stream stands for (Anthropic's error events name a type only).
_STATUS_OF_KIND = {"overloaded_error": 529, "api_error": 500, "rate_limit_error": 429,
                   "authentication_error": 401, "permission_error": 403, "not_found_error": 404,
                   "invalid_request_error": 400, "request_too_large": 413}


def model_error(exc: BaseException, provider: str, *, key_env: str | None = None) -> ModelError | None:
    """``exc``, a provider SDK's error, as backchannel's :class:`ModelError` subclass for what went wrong
    (``None`` when it does not look like a provider error: no HTTP status, not a connection failure).

    Works on any SDK whose errors carry ``status_code`` and ``body`` (OpenAI's and Anthropic's do);
    ``key_env`` is the variable holding the key, named when the provider refuses it.
    """
    status, detail, kind = _error_fields(exc)
    if status is not None and status < 400:  # an error event inside a successful (streamed) response
        status = _STATUS_OF_KIND.get(kind or "")
    if status is None:
        if not _is_connection_error(exc):
            return None
        return ModelConnectionError(f"{provider}: could not reach the provider: {detail}", provider=provider)
    text = f"{provider} {status}: {detail}"
    if status in (401, 403):
        hint = f" (check {key_env})" if key_env else ""
        return ModelAuthenticationError(f"{text}{hint}", provider=provider, status=status)
    if status == 429:
        return ModelRateLimitError(text, provider=provider, status=status)
    if status >= 500 or status in (408, 409):
        return ModelServerError(text, provider=provider, status=status)
    return ModelRequestError(text, provider=provider, status=status)


def _error_fields(exc: BaseException) -> tuple[int | None, str, str | None]:
    """``(status, the provider's own message, its error type)`` of an SDK error."""
    status = getattr(exc, "status_code", None)
    body = getattr(exc, "body", None)
    error = body.get("error", body) if isinstance(body, Mapping) else None
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return status, error["message"], error.get("type") if isinstance(error.get("type"), str) else None
    return status, str(getattr(exc, "message", None) or exc or type(exc).__name__), None


def _is_connection_error(exc: BaseException) -> bool:
    names = {c.__name__ for c in type(exc).__mro__}
    return bool(names & {"APIConnectionError", "APITimeoutError", "TransportError", "ConnectError",
                         "TimeoutException"}) or isinstance(exc, (ConnectionError, TimeoutError))


@contextmanager
def provider_errors(provider: str, sdk_error: type[BaseException] | None = None, *,
                    key_env: str | None = None) -> Iterator[None]:
    """Raise a provider SDK's errors in the block as :class:`ModelError` subclasses (the SDK's as ``__cause__``).

    With ``sdk_error`` (the SDK's base error class) every such error is translated; without it, only
    errors that carry an HTTP status or are connection failures, the rest passing through as they are.
    """
    try:
        yield
    except ModelError:
        raise
    except Exception as exc:
        error = model_error(exc, provider, key_env=key_env)
        if error is None and sdk_error is not None and isinstance(exc, sdk_error):
            error = ModelError(f"{provider}: {_error_fields(exc)[1]}", provider=provider)
        if error is None:
            raise
        raise error from exc
