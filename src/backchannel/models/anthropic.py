"""Anthropic Messages API adapter, on the official ``anthropic`` SDK's async client.

System prompts become the ``system`` parameter, tool results travel as
``tool_result`` blocks in user messages, and the OpenAI-style settings the
rest of backchannel uses (``tool_choice="required"``, ``stop``,
``parallel_tool_calls``) are translated. Settings the SDK does not name are
sent in ``extra_body``.

Prompt caching is on by default: the tools, the system prompt and the
conversation so far carry ``cache_control`` breakpoints, so each step of an
agent reads the prefix the previous step wrote instead of paying for it again
(``prompt_caching=False`` turns that off).
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

try:
    from anthropic import APIError, AsyncAnthropic
    from anthropic.resources.messages import AsyncMessages
    from anthropic.types import Message
except ImportError as exc:
    raise ImportError(
        "the Anthropic adapter needs the anthropic package: "
        'install with pip install "backchannel[anthropic]"'
    ) from exc

from backchannel.errors import MissingAPIKeyError
from backchannel.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
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

__all__ = ["AnthropicModel"]

_CREATE_PARAMS = frozenset(inspect.signature(AsyncMessages.create).parameters) - {
    "self",
    "messages",
    "model",
    "stream",
}
_TOOL_CHOICE_BY_NAME = {
    "auto": {"type": "auto"},
    "none": {"type": "none"},
    "any": {"type": "any"},
    "required": {"type": "any"},
}
_EPHEMERAL = {"type": "ephemeral"}


class AnthropicModel(ChatModel):
    """A Claude model served by the Anthropic Messages API.

    ``extra`` keywords that the SDK client accepts (``default_headers``,
    ``auth_token``, ...) configure the client; the rest are default request
    settings, like ``top_p`` or ``thinking``. Without a key (``api_key``, else
    ``ANTHROPIC_API_KEY``; or an auth token) it raises
    :class:`~backchannel.errors.MissingAPIKeyError` naming the variable.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        temperature: float | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
        prompt_caching: bool = True,
        **extra: Any,
    ) -> None:
        self.model = model
        self.name = model
        self.prompt_caching = prompt_caching
        client_params = frozenset(inspect.signature(AsyncAnthropic).parameters)
        client_options = {k: v for k, v in extra.items() if k in client_params}
        defaults = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            **{k: v for k, v in extra.items() if k not in client_options},
        }
        self.default_settings: dict[str, Any] = {k: v for k, v in defaults.items() if v is not None}
        if client is None:
            if api_key is None and not _has_credentials(client_options):
                raise MissingAPIKeyError("anthropic", "ANTHROPIC_API_KEY", model)
            options: dict[str, Any] = {
                "api_key": api_key,
                "base_url": base_url,
                "max_retries": max_retries,
                **client_options,
            }
            # None would mean "no timeout" to the SDK; here it means "the SDK's default".
            if timeout is not None:
                options["timeout"] = timeout
            client = AsyncAnthropic(**options)
        self.client = client

    async def generate(self, request: ModelRequest) -> AIMessage:
        with provider_errors("anthropic", APIError, key_env="ANTHROPIC_API_KEY"):
            response = await self.client.messages.create(**self._create_arguments(request))
        return _message_from_response(response)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        translator = _StreamTranslator()
        with provider_errors("anthropic", APIError, key_env="ANTHROPIC_API_KEY"):
            events = await self.client.messages.create(**self._create_arguments(request), stream=True)
            async with events:
                async for event in events:
                    for delta in translator.deltas(event):
                        yield delta
        yield translator.finish()

    def _create_arguments(self, request: ModelRequest) -> dict[str, Any]:
        settings = _translate_settings(
            {**self.default_settings, **request.settings}, bool(request.tools)
        )
        arguments: dict[str, Any] = {
            "model": self.model,
            "messages": _anthropic_messages(request.messages),
        }
        system = _system_text(request)
        if system:
            arguments["system"] = system
        if request.tools:
            arguments["tools"] = [_anthropic_tool(t) for t in request.tools]
        if self.prompt_caching:
            _mark_cache_breakpoints(arguments)
        known = {k: v for k, v in settings.items() if k in _CREATE_PARAMS}
        unknown = {k: v for k, v in settings.items() if k not in _CREATE_PARAMS}
        if unknown:
            known["extra_body"] = {**unknown, **(known.get("extra_body") or {})}
        return {**arguments, **known}


def _has_credentials(client_options: Mapping[str, Any]) -> bool:
    """Whether the SDK client will find an API key or an auth token on its own."""
    return bool(os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")
                or client_options.get("auth_token"))


def _translate_settings(settings: Mapping[str, Any], has_tools: bool) -> dict[str, Any]:
    """OpenAI-style settings in Anthropic's terms; Anthropic-style ones pass unchanged."""
    translated = dict(settings)
    if "stop" in translated:
        stop = translated.pop("stop")
        translated["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop or ())
    parallel = translated.pop("parallel_tool_calls", None)
    choice = translated.pop("tool_choice", None)
    if not has_tools:  # the API rejects tool_choice in a call without tools
        return translated
    choice = _tool_choice(choice)
    if parallel is False:
        choice = {**(choice or {"type": "auto"}), "disable_parallel_tool_use": True}
    if choice is not None:
        translated["tool_choice"] = choice
    return translated


def _tool_choice(choice: str | bool | dict[str, Any] | None) -> dict[str, Any] | None:
    """A tool choice in Anthropic's form, from OpenAI's or Anthropic's."""
    if isinstance(choice, dict):
        if choice.get("type") == "function":  # {"type": "function", "function": {"name": ...}}
            return {"type": "tool", "name": choice["function"]["name"]}
        return choice
    if choice is None or choice is False:
        return None
    if choice is True:
        return {"type": "any"}
    return _TOOL_CHOICE_BY_NAME.get(choice, {"type": "tool", "name": choice})


def _mark_cache_breakpoints(arguments: dict[str, Any]) -> None:
    """``cache_control`` at the end of the tools, of the system prompt and of the conversation.

    The API caches the prompt up to each breakpoint, in that order; the conversation only grows,
    so the next call finds this one's prefix cached. Three of the four breakpoints allowed.
    """
    tools = arguments.get("tools")
    if tools:
        tools[-1] = {**tools[-1], "cache_control": _EPHEMERAL}
    if arguments.get("system"):
        arguments["system"] = [{"type": "text", "text": arguments["system"], "cache_control": _EPHEMERAL}]
    messages = arguments["messages"]
    if messages and messages[-1]["content"]:
        last = messages[-1]
        messages[-1] = {**last, "content": [*last["content"][:-1], {**last["content"][-1],
                                                                    "cache_control": _EPHEMERAL}]}


def _anthropic_tool(tool: Tool) -> dict[str, Any]:
    return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}


def _system_text(request: ModelRequest) -> str:
    # The Messages API has one system prompt, so system messages anywhere in the history join it.
    parts = [request.system_prompt] if request.system_prompt else []
    parts += [m.text for m in request.messages if isinstance(m, SystemMessage) and m.text]
    return "\n\n".join(parts)


def _anthropic_messages(messages: Sequence[AnyMessage]) -> list[dict[str, Any]]:
    """The conversation as alternating user/assistant messages of content blocks."""
    wire: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, SystemMessage):
            continue  # joined into the system parameter
        role, blocks = _role_and_blocks(message)
        if not blocks:
            # The API rejects empty messages; a reply with neither text nor calls carries nothing.
            continue
        if wire and wire[-1]["role"] == role:
            wire[-1]["content"].extend(
                blocks
            )  # e.g. the results of parallel calls share one user message
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def _role_and_blocks(message: AnyMessage) -> tuple[str, list[dict[str, Any]]]:
    if isinstance(message, HumanMessage):
        return "user", _content_blocks(message.content)
    if isinstance(message, ToolMessage):
        return "user", [_tool_result_block(message)]
    if isinstance(message, AIMessage):
        return "assistant", _assistant_blocks(message)
    raise TypeError(f"cannot send {type(message).__name__} to Anthropic: {message!r}")


def _tool_result_block(message: ToolMessage) -> dict[str, Any]:
    content = (
        message.content if isinstance(message.content, str) else _content_blocks(message.content)
    )
    block = {"type": "tool_result", "tool_use_id": message.tool_call_id, "content": content}
    return {**block, "is_error": True} if message.status == "error" else block


def _assistant_blocks(message: AIMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": message.text}] if message.text else []
    blocks += [
        {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}
        for c in message.tool_calls
    ]
    # Invalid calls go back too (their raw arguments cannot: tool_use input must be an object),
    # because the API rejects a tool_result whose tool_use is missing.
    blocks += [
        {"type": "tool_use", "id": c["id"], "name": c["name"] or "", "input": {}}
        for c in message.invalid_tool_calls
    ]
    return blocks


def _content_blocks(content: str | list[Any]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return [_content_block(block) for block in content if block]


def _content_block(block: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(block, str):
        return {"type": "text", "text": block}
    if block.get("type") == "image_url":  # OpenAI's image part
        return _image_block(
            block["image_url"]["url"]
            if isinstance(block["image_url"], dict)
            else block["image_url"]
        )
    return block


def _image_block(url: str) -> dict[str, Any]:
    if url.startswith("data:"):
        media_type, _, data = url.removeprefix("data:").partition(";base64,")
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }
    return {"type": "image", "source": {"type": "url", "url": url}}


def _message_from_response(response: Message) -> AIMessage:
    text: list[str] = []
    tool_calls: list[ToolCall] = []
    for block in response.content:
        if block.type == "text":
            text.append(block.text)
        elif block.type == "tool_use":  # a whole response's tool input is always a parsed object
            tool_calls.append(
                {"name": block.name, "args": block.input, "id": block.id, "type": "tool_call"}
            )
    return AIMessage(
        content="".join(text),
        tool_calls=tool_calls,
        usage_metadata=_usage(response.usage.model_dump()),
        response_metadata={"model_name": response.model, "finish_reason": response.stop_reason},
        id=response.id,
    )


def _usage(counts: Mapping[str, Any]) -> Usage:
    # Cached input tokens are input tokens too; Anthropic reports them apart.
    input_tokens = sum(
        counts.get(k) or 0
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    output_tokens = counts.get("output_tokens") or 0
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "total_tokens": input_tokens + output_tokens,
    }


class _StreamTranslator:
    """Turns the raw Messages stream events into deltas, keeping what the final delta reports."""

    def __init__(self) -> None:
        self.tool_index_by_block: dict[int, int] = {}
        self.usage_counts: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self.model_name: str | None = None
        self.message_id: str | None = None

    def deltas(self, event: Any) -> Iterator[ModelDelta]:
        if event.type == "message_start":
            self.message_id = event.message.id
            self.model_name = event.message.model
            self.usage_counts.update(event.message.usage.model_dump(exclude_none=True))
        elif event.type == "content_block_start":
            yield from self._block_start(event.index, event.content_block)
        elif event.type == "content_block_delta":
            yield from self._block_delta(event.index, event.delta)
        elif event.type == "message_delta":
            self.stop_reason = event.delta.stop_reason or self.stop_reason
            # message_delta counts are cumulative, so they replace message_start's
            self.usage_counts.update(event.usage.model_dump(exclude_none=True))

    def _block_start(self, index: int, block: Any) -> Iterator[ModelDelta]:
        if block.type == "text" and block.text:
            yield TextDelta(block.text)
        elif block.type == "tool_use":
            call_index = len(self.tool_index_by_block)
            self.tool_index_by_block[index] = call_index
            # The input arrives as input_json_delta fragments; a non-empty start input is whole.
            yield ToolCallDelta(call_index, block.id, block.name, _json_or_empty(block.input))

    def _block_delta(self, index: int, delta: Any) -> Iterator[ModelDelta]:
        if delta.type == "text_delta":
            yield TextDelta(delta.text)
        elif delta.type == "input_json_delta" and index in self.tool_index_by_block:
            yield ToolCallDelta(self.tool_index_by_block[index], args=delta.partial_json)

    def finish(self) -> FinishDelta:
        usage = _usage(self.usage_counts) if self.usage_counts else None
        return FinishDelta(
            usage, self.stop_reason, {"model_name": self.model_name}, self.message_id
        )


def _json_or_empty(value: Any) -> str:
    return json.dumps(value) if value else ""
