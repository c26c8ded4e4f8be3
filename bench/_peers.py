"""Peer code shared by the benchmarks: scripted LangChain chat models (imported only when needed).

``step_overhead.py``'s ``_langchain_kit`` has a cursor-driven model (one agent at a time).
Many agents sharing one model at once need a reply that depends on the request, not on a
shared cursor: :func:`reply_chat_model` builds such a model, with simulated latency.
:func:`token_chat_model` streams a reply token by token at a model's pace (``streams.py``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["reply_chat_model", "token_chat_model"]


@functools.cache
def _reply_model_class() -> type:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.outputs import ChatGeneration, ChatResult

    class ReplyChatModel(BaseChatModel):
        """Sleeps ``latency`` seconds, then answers with ``reply(messages)`` (an ``AIMessage``)."""

        reply: Any
        latency: float = 0.0

        @property
        def _llm_type(self) -> str:
            return "scripted-reply"

        def _result(self, messages: Sequence[Any]) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=self.reply(messages))])

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            raise NotImplementedError("this scripted model is async only")

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                             **kwargs: Any) -> ChatResult:
            if self.latency:
                await asyncio.sleep(self.latency)
            return self._result(messages)

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    return ReplyChatModel


def reply_chat_model(reply: Callable[[Sequence[Any]], Any], latency: float = 0.0) -> Any:
    """A LangChain chat model whose reply is ``reply(messages)``, after ``latency`` seconds."""
    return _reply_model_class()(reply=reply, latency=latency)


@functools.cache
def _token_model_class() -> type:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessageChunk
    from langchain_core.outputs import ChatGenerationChunk, ChatResult

    class TokenChatModel(BaseChatModel):
        """Streams ``tokens`` tokens, one each ``interval`` seconds, each ``@<time.monotonic_ns()> ``: the
        moment the model yielded it, for the client to time its delivery."""

        tokens: int = 200
        interval: float = 0.02

        @property
        def _llm_type(self) -> str:
            return "scripted-tokens"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            raise NotImplementedError("this scripted model is async only")

        async def _astream(self, messages: Any, stop: Any = None, run_manager: Any = None,
                           **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            due = loop.time()
            for _ in range(self.tokens):
                due += self.interval
                await asyncio.sleep(due - loop.time())
                chunk = ChatGenerationChunk(message=AIMessageChunk(content=f"@{time.monotonic_ns()} "))
                if run_manager is not None:
                    await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
                yield chunk

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                             **kwargs: Any) -> ChatResult:
            from langchain_core.language_models.chat_models import agenerate_from_stream

            return await agenerate_from_stream(self._astream(messages, stop, run_manager, **kwargs))

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

    return TokenChatModel


def token_chat_model(tokens: int, interval: float) -> Any:
    """A LangChain chat model streaming ``tokens`` timestamped tokens, one each ``interval`` seconds."""
    return _token_model_class()(tokens=tokens, interval=interval)
