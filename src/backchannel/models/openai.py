"""OpenAI Chat Completions adapter (also Azure OpenAI, Ollama, vLLM and other compatible servers).

Uses the official ``openai`` SDK's async client. Request settings go to
``chat.completions.create``: those the SDK knows as keyword arguments, any
others inside ``extra_body``, so provider-specific options still reach the
server.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

from openai import APIError, AsyncAzureOpenAI, AsyncOpenAI
from openai.resources.chat.completions import AsyncCompletions
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessageToolCallUnion,
)

from backchannel.errors import MissingAPIKeyError, ModelError
from backchannel.messages import (
    AIMessage,
    AnyMessage,
    HumanMessage,
    InvalidToolCall,
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
    parse_tool_arguments,
    provider_errors,
)
from backchannel.tools import Tool

__all__ = ["OpenAIModel"]

_CREATE_PARAMS = frozenset(inspect.signature(AsyncCompletions.create).parameters) - {
    "self",
    "messages",
    "model",
    "stream",
}
# Options that only make sense alongside tools; the API rejects them in a call without tools.
_TOOL_ONLY_SETTINGS = ("tool_choice", "parallel_tool_calls")


class OpenAIModel(ChatModel):
    """A chat model served by the OpenAI Chat Completions API or a compatible server.

    ``extra`` keywords that the SDK client accepts (``organization``,
    ``default_headers``, ``api_version``, ...) configure the client; the rest
    are default request settings, like ``temperature`` and ``max_tokens``.
    With ``azure=True`` the model is the deployment name and ``base_url`` the
    Azure endpoint (default: ``AZURE_OPENAI_ENDPOINT``). Without an API key
    (``api_key``, else ``OPENAI_API_KEY`` or ``AZURE_OPENAI_API_KEY``) it raises
    :class:`~backchannel.errors.MissingAPIKeyError` naming the variable.
    ``provider`` names the service in errors (``"ollama"``, ...).
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        azure: bool = False,
        client: AsyncOpenAI | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout: float | None = None,
        max_retries: int = 2,
        provider: str | None = None,
        **extra: Any,
    ) -> None:
        self.model = model
        self.name = model
        self.provider = provider or ("azure" if azure else "openai")
        self._key_env = "AZURE_OPENAI_API_KEY" if azure else "OPENAI_API_KEY"
        client_params = _constructor_params(AsyncAzureOpenAI if azure else AsyncOpenAI)
        client_options = {k: v for k, v in extra.items() if k in client_params}
        defaults = {
            "temperature": temperature,
            "max_tokens": max_tokens,
            **{k: v for k, v in extra.items() if k not in client_options},
        }
        self.default_settings: dict[str, Any] = {k: v for k, v in defaults.items() if v is not None}
        if client is None and api_key is None and not _has_credentials(azure, client_options):
            raise MissingAPIKeyError(self.provider, self._key_env, model)
        self.client = client or _make_client(
            azure, base_url, api_key, timeout, max_retries, client_options
        )

    async def generate(self, request: ModelRequest) -> AIMessage:
        with provider_errors(self.provider, APIError, key_env=self._key_env):
            response = await self.client.chat.completions.create(**self._create_arguments(request))
        return _message_from_completion(response)

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelDelta]:
        arguments = self._create_arguments(request)
        arguments["stream_options"] = {
            "include_usage": True,
            **(arguments.get("stream_options") or {}),
        }
        finish = FinishDelta()
        with provider_errors(self.provider, APIError, key_env=self._key_env):
            chunks = await self.client.chat.completions.create(**arguments, stream=True)
            async with chunks:
                async for chunk in chunks:
                    for delta in _deltas_from_chunk(chunk, finish):
                        yield delta
        yield finish

    def _create_arguments(self, request: ModelRequest) -> dict[str, Any]:
        settings = {**self.default_settings, **request.settings}
        arguments: dict[str, Any] = {"model": self.model, "messages": _openai_messages(request)}
        if request.tools:
            arguments["tools"] = [_openai_tool(t) for t in request.tools]
        else:
            for key in _TOOL_ONLY_SETTINGS:
                settings.pop(key, None)
        return {**arguments, **_split_settings(settings)}


def _has_credentials(azure: bool, client_options: Mapping[str, Any]) -> bool:
    """Whether the SDK client will find a key (or, on Azure, an Entra ID token) on its own."""
    if azure:
        return bool(os.environ.get("AZURE_OPENAI_API_KEY") or os.environ.get("AZURE_OPENAI_AD_TOKEN")
                    or client_options.get("azure_ad_token") or client_options.get("azure_ad_token_provider"))
    return bool(os.environ.get("OPENAI_API_KEY"))


def _constructor_params(client_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(client_class).parameters)


def _make_client(
    azure: bool,
    base_url: str | None,
    api_key: str | None,
    timeout: float | None,
    max_retries: int,
    client_options: dict[str, Any],
) -> AsyncOpenAI:
    options: dict[str, Any] = {"api_key": api_key, "max_retries": max_retries, **client_options}
    # None would mean "no timeout" to the SDK; here it means "the SDK's default".
    if timeout is not None:
        options["timeout"] = timeout
    if azure:
        options["azure_endpoint"] = base_url or os.environ.get("AZURE_OPENAI_ENDPOINT")
        options["api_version"] = options.get("api_version") or os.environ.get("OPENAI_API_VERSION")
        return AsyncAzureOpenAI(**options)
    return AsyncOpenAI(base_url=base_url, **options)


def _split_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Settings as ``create`` keyword arguments; those it does not name travel in ``extra_body``."""
    known = {k: v for k, v in settings.items() if k in _CREATE_PARAMS}
    unknown = {k: v for k, v in settings.items() if k not in _CREATE_PARAMS}
    if unknown:
        known["extra_body"] = {**unknown, **(known.get("extra_body") or {})}
    return known


def _openai_tool(tool: Tool) -> dict[str, Any]:
    return {"type": "function", "function": tool.schema()}


def _openai_messages(request: ModelRequest) -> list[dict[str, Any]]:
    messages = (
        [{"role": "system", "content": request.system_prompt}] if request.system_prompt else []
    )
    messages.extend(_openai_message(m) for m in request.messages)
    return messages


def _openai_message(message: AnyMessage) -> dict[str, Any]:
    if isinstance(message, SystemMessage):
        return _with_name({"role": "system", "content": message.text}, message.name)
    if isinstance(message, HumanMessage):
        return _with_name({"role": "user", "content": _user_content(message.content)}, message.name)
    if isinstance(message, AIMessage):
        return _assistant_message(message)
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.text}
    raise TypeError(f"cannot send {type(message).__name__} to OpenAI: {message!r}")


def _with_name(message: dict[str, Any], name: str | None) -> dict[str, Any]:
    return {**message, "name": name} if name else message


def _user_content(content: str | list[Any]) -> str | list[Any]:
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": block} if isinstance(block, str) else block for block in content
    ]


def _assistant_message(message: AIMessage) -> dict[str, Any]:
    calls = [_wire_call(c["id"], c["name"], json.dumps(c["args"])) for c in message.tool_calls]
    # Invalid calls go back too: the agent answers each with an error tool message, and the
    # API rejects a tool message whose call is missing from the preceding assistant message.
    calls += [
        _wire_call(c["id"], c["name"] or "", c["args"] or "") for c in message.invalid_tool_calls
    ]
    wire: dict[str, Any] = {"role": "assistant", "content": message.text}
    if calls:
        wire["tool_calls"] = calls
        wire["content"] = message.text or None
    return _with_name(wire, message.name)


def _wire_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _message_from_completion(response: ChatCompletion) -> AIMessage:
    if not response.choices:
        raise ModelError(
            f"OpenAI returned no choices for model {response.model!r} (response id {response.id})"
        )
    choice = response.choices[0]
    tool_calls, invalid = _read_tool_calls(choice.message.tool_calls or [])
    return AIMessage(
        content=choice.message.content or "",
        tool_calls=tool_calls,
        invalid_tool_calls=invalid,
        usage_metadata=_usage(response.usage),
        response_metadata={"model_name": response.model, "finish_reason": choice.finish_reason},
        id=response.id,
    )


def _read_tool_calls(
    calls: list[ChatCompletionMessageToolCallUnion],
) -> tuple[list[ToolCall], list[InvalidToolCall]]:
    """The calls whose arguments parse, and those whose arguments do not."""
    valid: list[ToolCall] = []
    invalid: list[InvalidToolCall] = []
    for call in calls:
        if call.type != "function":
            continue  # only function tools are ever sent
        name, raw = call.function.name, call.function.arguments
        args, error = parse_tool_arguments(raw)
        if error is None:
            valid.append({"name": name, "args": args, "id": call.id, "type": "tool_call"})
        else:
            invalid.append(
                {
                    "name": name,
                    "args": raw,
                    "id": call.id,
                    "error": error,
                    "type": "invalid_tool_call",
                }
            )
    return valid, invalid


def _deltas_from_chunk(chunk: ChatCompletionChunk, finish: FinishDelta) -> list[ModelDelta]:
    """The deltas in one streamed chunk; its id, model, stop reason and usage go into ``finish``."""
    finish.message_id = finish.message_id or chunk.id or None
    if chunk.model:
        finish.metadata["model_name"] = chunk.model
    if chunk.usage is not None:
        finish.usage = _usage(chunk.usage)
    if not chunk.choices:  # the usage chunk, or an Azure content-filter chunk
        return []
    choice = chunk.choices[0]
    finish.finish_reason = choice.finish_reason or finish.finish_reason
    deltas: list[ModelDelta] = [TextDelta(choice.delta.content)] if choice.delta.content else []
    for call in choice.delta.tool_calls or ():
        function = call.function
        deltas.append(
            ToolCallDelta(
                call.index,
                call.id,
                function.name if function else None,
                (function.arguments or "") if function else "",
            )
        )
    return deltas


def _usage(usage: CompletionUsage | None) -> Usage | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
