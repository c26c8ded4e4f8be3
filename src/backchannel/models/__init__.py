"""Chat models: the protocol, the scripted model, and ``init_model`` for providers.

Provider adapters are imported on first use, so their SDKs cost nothing until needed.
"""

from __future__ import annotations

from typing import Any

from backchannel.models.base import (
    ChatModel,
    FinishDelta,
    ModelDelta,
    ModelRequest,
    SupportsChat,
    TextDelta,
    ToolCallDelta,
    accumulate,
)
from backchannel.models.scripted import ScriptedModel

__all__ = [
    "ChatModel",
    "FinishDelta",
    "ModelDelta",
    "ModelRequest",
    "ScriptedModel",
    "SupportsChat",
    "TextDelta",
    "ToolCallDelta",
    "accumulate",
    "init_model",
]

# provider prefix -> (module, class, extra keyword arguments)
_PROVIDERS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "openai": ("backchannel.models.openai", "OpenAIModel", {}),
    "azure": ("backchannel.models.openai", "OpenAIModel", {"azure": True}),
    "ollama": ("backchannel.models.openai", "OpenAIModel",
               {"base_url": "http://localhost:11434/v1", "api_key": "ollama", "provider": "ollama"}),
    "vllm": ("backchannel.models.openai", "OpenAIModel",
             {"base_url": "http://localhost:8000/v1", "api_key": "EMPTY", "provider": "vllm"}),
    "anthropic": ("backchannel.models.anthropic", "AnthropicModel", {}),
}


def init_model(model: str | Any, **kwargs: Any) -> SupportsChat:
    """A model from ``"provider:model-name"`` (openai, azure, ollama, vllm, anthropic), or ``"offline"``:
    the offline stand-in (:class:`~backchannel.models.offline.OfflineModel`), no key or network needed.

    A model object passes through; a LangChain chat model is wrapped by the
    LangChain bridge. Keyword arguments go to the adapter (``base_url``,
    ``api_key``, ``temperature``, ...).
    """
    if not isinstance(model, str):
        # LangChain models also have generate/stream (sync ones), so they are recognised first.
        if hasattr(model, "ainvoke") and hasattr(model, "bind_tools"):
            from backchannel.models.langchain import LangChainModel

            return LangChainModel(model)
        if isinstance(model, SupportsChat):
            return model
        raise TypeError(f"not a chat model: {model!r}")
    if model == "offline":
        from backchannel.models.offline import OfflineModel

        return OfflineModel(**kwargs)
    provider, sep, name = model.partition(":")
    if not sep or not name:
        raise ValueError(f"model {model!r} should be 'provider:model-name', e.g. 'openai:gpt-4o-mini', or "
                         f"'offline'; providers: {', '.join(_PROVIDERS)}")
    if provider not in _PROVIDERS:
        raise ValueError(f"unknown model provider {provider!r} in {model!r}; known: {', '.join(_PROVIDERS)}")
    import importlib

    module, cls, defaults = _PROVIDERS[provider]
    return getattr(importlib.import_module(module), cls)(name, **{**defaults, **kwargs})
