"""Summarization: when a conversation outgrows its budget, older messages become one summary.

:class:`SummarizationMiddleware` counts the conversation's tokens (an
approximate count: about four characters a token) before every model call.
Past ``max_tokens_before_summary`` (170,000 by default, as deepagents uses)
it asks a model to summarise everything but the last ``messages_to_keep``
(6), and replaces those messages with the summary. An AI message and the tool
results answering it stay together: the cut moves back rather than split them.
It works the same on a supervisor and on its subagents.

A run whose input is ``{"compact": True}`` summarises now, whatever the count,
and ends without calling the agent's model (what the CLI's ``/compact`` sends).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.messages import (
    REMOVE_ALL_MESSAGES,
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    messages_from_input,
)
from backchannel.middleware import Middleware
from backchannel.models import init_model
from backchannel.models.base import ModelRequest
from backchannel.state import MessageList

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_SUMMARY_PROMPT",
    "SUMMARY_PREFIX",
    "SummarizationMiddleware",
    "ask_for_summary",
    "count_tokens_approximately",
    "message_tokens",
    "render_transcript",
    "safe_cutoff",
]

# LangChain's summarization prompt, so summaries read the same as with LangChain agents.
DEFAULT_SUMMARY_PROMPT = """<role>
Context Extraction Assistant
</role>

<primary_objective>
Your sole objective in this task is to extract the highest quality/most relevant context from the conversation history below.
</primary_objective>

<objective_information>
You're nearing the total number of input tokens you can accept, so you must extract the highest quality/most relevant pieces of information from your conversation history.
This context will then overwrite the conversation history presented below. Because of this, ensure the context you extract is only the most important information to your overall goal.
</objective_information>

<instructions>
The conversation history below will be replaced with the context you extract in this step. Because of this, you must do your very best to extract and record all of the most important context from the conversation history.
You want to ensure that you don't repeat any actions you've already completed, so the context you extract from the conversation history should be focused on the most important information to your overall goal.
</instructions>

The user will message you with the full message history you'll be extracting context from, to then replace. Carefully read over it all, and think deeply about what information is most important to your overall goal that should be saved:

With all of this in mind, please carefully read over the entire conversation history, and extract the most important and relevant context to replace it so that you can free up space in the conversation history.
Respond ONLY with the extracted context. Do not include any additional information, or text before or after the extracted context.

<messages>
Messages to summarize:
{messages}
</messages>"""

SUMMARY_PREFIX = "Here is a summary of the conversation to date:"

CHARS_PER_TOKEN = 4.0  # the approximate count: about four characters a token
_TOKENS_PER_MESSAGE = 3.0
_ROLES = {"human": "Human", "ai": "AI", "system": "System", "tool": "Tool"}


_JSON = json.JSONEncoder(default=str)  # built once: json.dumps with options builds one per call


def message_tokens(message: AnyMessage) -> float:
    """About how many tokens one message costs: its text, tool calls and name at ~4 characters a token."""
    content = message.content
    chars = len(content) if isinstance(content, str) else len(_JSON.encode(content))
    if isinstance(message, AIMessage) and message.tool_calls:
        chars += len(repr(message.tool_calls))  # as LangChain counts them
    if isinstance(message, ToolMessage):
        chars += len(message.tool_call_id)
    chars += len(message.name or "") + len(message.type)
    return chars / CHARS_PER_TOKEN + _TOKENS_PER_MESSAGE


def count_tokens_approximately(messages: Sequence[Any]) -> int:
    """About how many tokens ``messages`` (objects or dicts) cost, counted as LangChain's helper does."""
    return math.ceil(sum(message_tokens(m) for m in messages_from_input(list(messages))
                         if not isinstance(m, RemoveMessage)))


def render_transcript(messages: Sequence[AnyMessage], *, max_chars_per_message: int | None = None) -> str:
    """Messages as a plain transcript for a summarising model: one ``Role: text`` block each."""
    lines = []
    for m in messages:
        role = _ROLES[m.type] if not isinstance(m, ToolMessage) else f"Tool ({m.name or 'tool'})"
        text = m.text
        if isinstance(m, AIMessage) and m.tool_calls:
            calls = "; ".join(f"{c['name']}({json.dumps(c['args'], ensure_ascii=False, default=str)})"
                              for c in m.tool_calls)
            text = f"{text}\n[called {calls}]".strip()
        if max_chars_per_message is not None and len(text) > max_chars_per_message:
            text = text[:max_chars_per_message] + " […]"
        lines.append(f"{role}: {text}")
    return "\n\n".join(lines)


async def ask_for_summary(model: Any, prompt: str, messages: Sequence[AnyMessage], *,
                          follow_up: Sequence[AnyMessage] = (), **settings: Any) -> AIMessage:
    """The reply of ``model`` (initialised) to ``prompt``, with the transcript of ``messages`` for ``{messages}``
    (and ``follow_up`` after it: an earlier answer and what to change in it)."""
    request = ModelRequest(model, [HumanMessage(prompt.replace("{messages}", render_transcript(messages))),
                                   *follow_up], settings=settings)
    return await model.generate(request)


def safe_cutoff(messages: Sequence[AnyMessage], cutoff: int) -> int:
    """The nearest cut at or before ``cutoff`` that keeps each AI message with its tool results."""
    cutoff = max(0, min(cutoff, len(messages)))
    while 0 < cutoff < len(messages) and isinstance(messages[cutoff], ToolMessage):
        cutoff -= 1
    return cutoff


class _Tally:
    """A running token count of one message list, so each step counts only the new messages."""

    __slots__ = ("counted", "last", "total")

    def __init__(self) -> None:
        self.counted = 0
        self.last: AnyMessage | None = None
        self.total = 0.0

    def count(self, messages: list[AnyMessage]) -> float:
        n = len(messages)
        # Messages are replaced or removed rarely (an edit, a summary): then the prefix changed, recount.
        if n < self.counted or (self.counted and messages[self.counted - 1] is not self.last):
            self.counted, self.total = 0, 0.0
        for i in range(self.counted, n):
            self.total += message_tokens(messages[i])
        self.counted = n
        self.last = messages[n - 1] if n else None
        return self.total


class SummarizationMiddleware(Middleware):
    """Replace older messages with a summary once the conversation passes a token threshold.

    ``model`` writes the summaries (a model object or ``"provider:name"``);
    ``max_tokens_before_summary`` is the threshold (``None``: only on request);
    ``messages_to_keep`` recent messages stay as they are; at most
    ``trim_tokens_to_summarize`` tokens of the older messages (the most recent
    ones) go to the summariser (``None``: all of them).
    """

    def __init__(self, model: Any, *, max_tokens_before_summary: int | None = 170_000,
                 messages_to_keep: int = 6, summary_prompt: str = DEFAULT_SUMMARY_PROMPT,
                 trim_tokens_to_summarize: int | None = 4000, summary_prefix: str = SUMMARY_PREFIX) -> None:
        if messages_to_keep < 0:
            raise ValueError(f"messages_to_keep must be 0 or more, got {messages_to_keep}")
        if "{messages}" not in summary_prompt:
            raise ValueError("summary_prompt must contain '{messages}', where the conversation goes")
        self.model = model
        self.max_tokens_before_summary = max_tokens_before_summary
        self.messages_to_keep = messages_to_keep
        self.summary_prompt = summary_prompt
        self.trim_tokens_to_summarize = trim_tokens_to_summarize
        self.summary_prefix = summary_prefix
        self._chat_model: Any = None

    async def before_agent(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """A run asked to compact (``{"compact": True}``): summarise now and end the run."""
        if not state.get("compact"):
            return None
        update = await self.summarize(state["messages"]) or {}
        return {**update, "compact": False, "jump_to": "end"}

    async def before_model(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """Before each model call: summarise the older messages if the conversation is too long."""
        if self.max_tokens_before_summary is None:
            return None
        messages = state["messages"]
        if self._tokens(messages) < self.max_tokens_before_summary:
            return None
        return await self.summarize(messages)

    async def summarize(self, messages: Sequence[AnyMessage]) -> dict[str, Any] | None:
        """The state update that replaces all but the recent messages with a summary (``None``: nothing to do)."""
        cutoff = safe_cutoff(messages, len(messages) - self.messages_to_keep)
        older = [m for m in messages[:cutoff] if not isinstance(m, SystemMessage)]
        if not older:
            return None
        summary = await self._summary_of(_trim(older, self.trim_tokens_to_summarize))
        message = HumanMessage(f"{self.summary_prefix}\n\n{summary}",
                               additional_kwargs={"summary": {"summarized_messages": len(older)}})
        return {"messages": [RemoveMessage(REMOVE_ALL_MESSAGES), message, *messages[cutoff:]]}

    async def _summary_of(self, messages: Sequence[AnyMessage]) -> str:
        if self._chat_model is None:
            self._chat_model = init_model(self.model)
        reply = await ask_for_summary(self._chat_model, self.summary_prompt, messages)
        return reply.text.strip() or "(the summariser returned nothing)"

    def _tokens(self, messages: list[AnyMessage]) -> float:
        if not isinstance(messages, MessageList):  # a plain list keeps no tally: counted whole each time
            return _Tally().count(messages)
        tally = messages.token_tally
        if not isinstance(tally, _Tally):  # kept with the list, and gone with it
            tally = messages.token_tally = _Tally()
        return tally.count(messages)


def _trim(messages: Sequence[AnyMessage], max_tokens: int | None) -> Sequence[AnyMessage]:
    """The most recent messages that fit ``max_tokens``, never starting on an orphaned tool result."""
    if max_tokens is None:
        return messages
    total, start = 0.0, len(messages)
    while start > 0 and total + message_tokens(messages[start - 1]) <= max_tokens:
        start -= 1
        total += message_tokens(messages[start])
    while start < len(messages) and isinstance(messages[start], ToolMessage):
        start += 1
    return messages[start:] or messages[-1:]
