"""The offline model: a scripted stand-in that needs no key and no network, to try the chat, ``run`` and the demo.

It is not a language model: it follows a few rules on what it is given, so
that every part of backchannel can be tried before a real model is set up.

- Asked to research something, it starts a background subagent with
  ``start_async_task`` (the ``researcher`` if there is one).
- Given a search tool (named ``*search*`` or ``*lookup*``, taking one string:
  ``search_notes``, a small offline knowledge base, or your own) and no
  subagents, it calls it with what it was asked and reports the result.
- When a task reports back, it passes the result on.
- Asked to summarise (a handoff, a compaction), it summarises the thread from
  its messages: a title, 3 to 6 bullets, a TL;DR.
- Asked "where were we?", it reads the handoff summary in its memory.
- Otherwise it says what it is and how to use a real model.

Use it with ``--model offline`` (the CLI's default when no model is
configured), ``init_model("offline")`` or :class:`OfflineModel`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
from backchannel.models.base import ModelRequest
from backchannel.models.scripted import ScriptedModel
from backchannel.tools import tool

__all__ = ["OFFLINE", "OFFLINE_LABEL", "OfflineModel", "search_notes"]

OFFLINE = "offline"
OFFLINE_LABEL = "offline scripted model"

NOTES = {
    "tea": "Tea was first drunk in China, about 2700 BC. Dutch traders brought it to Europe around 1610.",
    "coffee": "Coffee was first brewed in Yemen in the 15th century. Venice had Europe's first coffee house, "
              "in 1645.",
    "lebron": "LeBron James: 4 NBA titles, 4 Finals MVPs, 4 regular-season MVPs, 20 All-Star selections, "
              "the NBA's all-time leading scorer (40,000+ points), 10 Finals appearances.",
    "jordan": "Michael Jordan: 6 NBA titles in 6 Finals (6 Finals MVPs), 5 regular-season MVPs, 10 scoring "
              "titles, Defensive Player of the Year 1988, highest career points per game (30.1).",
    "criteria": "Common GOAT criteria: peak dominance, longevity, championships and Finals record, "
                "individual awards, statistical production, two-way impact, and influence on the game.",
}
_ALIASES = {"goat": "criteria"}
_RESEARCH = re.compile(r"\b(research|look up|look into|find out|investigate)\b", re.I)
_POLITE = re.compile(r"^(?:please|can you|could you|would you)\s+", re.I)
_ROLE = re.compile(r"^(Human|AI|System|Tool \([^)]*\)): ", re.M)
_NOTE = re.compile(r"^\[task_id=[^\]]+\]\[subagent=([^\]]+)\] (?:Completed\. Result: |Error: |Waiting for input: )",
                   re.S)
_HOW_TO_CONFIGURE = ("For real answers, set a model: --model openai:gpt-4o-mini (with OPENAI_API_KEY set), "
                     'or model = "..." in ~/.backchannel/config.toml.')


@tool(inline=True)
def search_notes(query: str) -> str:
    """Look up facts in the research notes (an offline knowledge base).

    Args:
        query: What to look up, e.g. a subject, a person's name or "criteria".
    """
    words = set(re.findall(r"[a-z]+", query.lower()))
    keys = [key for key in NOTES if key in words or any(_ALIASES.get(w) == key for w in words)]
    if not keys:
        return f"No offline notes match {query!r}; the notes cover: {', '.join(NOTES)}."
    return "\n".join(NOTES[key] for key in keys)


class OfflineModel(ScriptedModel):
    """The offline stand-in for a model (see the module's documentation); ``latency`` is its time per reply."""

    def __init__(self, *, latency: float = 0.0, name: str = OFFLINE) -> None:
        super().__init__([_reply], loop=True, latency=latency, name=name)


def _reply(request: ModelRequest) -> Any:
    messages = request.messages
    if not messages:
        return _introduction()
    if len(messages) == 1 and messages[0].text.lstrip().startswith("<role>"):
        return summarise(messages[0].text)
    last = messages[-1]
    tools = {t.name for t in request.tools}
    lookup = _lookup_tool(request) if "start_async_task" not in tools else None
    if lookup is not None:
        return _look_up(lookup, last)
    if isinstance(last, ToolMessage):
        return _after_tool(last, messages)
    if isinstance(last, HumanMessage) and "task_notification" in last.additional_kwargs:
        return _relay(last)
    text = last.text.strip()
    if _RESEARCH.search(text) and "start_async_task" in tools:
        return _start_research(text, request)
    if re.search(r"where were we|what do you remember", text, re.I):
        return _recall(request.system_prompt or "")
    if not any(isinstance(m, AIMessage) for m in messages):
        return _introduction()
    return f"You said: {text}"


def _introduction() -> str:
    return ("Hello! I am the offline scripted model: I follow a few rules rather than think. Try \"please "
            "research the history of tea\" (a researcher works in the background and reports back by itself), "
            f"then /handoff, or /help. {_HOW_TO_CONFIGURE}")


def _lookup_tool(request: ModelRequest) -> tuple[str, str] | None:
    """``(tool, parameter)`` of the first search tool taking one string: what a researcher looks things up with."""
    for t in request.tools:
        properties = t.parameters.get("properties") or {}
        if (("search" in t.name or "lookup" in t.name) and len(properties) == 1
                and next(iter(properties.values())).get("type") == "string"):
            return t.name, next(iter(properties))
    return None


def _look_up(lookup: tuple[str, str], last: AnyMessage) -> Any:
    """A subagent's turn: look up what it was asked, then report what it found."""
    if isinstance(last, ToolMessage):
        return last.text
    name, parameter = lookup
    return {"tool_calls": [{"name": name, "args": {parameter: last.text}}]}


def _start_research(text: str, request: ModelRequest) -> Any:
    subagents = _background_subagents(request)
    if not subagents:
        return f"I have no background subagent to send on that. {_HOW_TO_CONFIGURE}"
    subagent = "researcher" if "researcher" in subagents else subagents[0]
    subject = _POLITE.sub("", text).rstrip(" ?.!")
    return {"tool_calls": [{"name": "start_async_task", "args": {
        "subagent_type": subagent, "description": subject[:1].upper() + subject[1:]}}]}


def _background_subagents(request: ModelRequest) -> list[str]:
    """The subagent types ``start_async_task`` offers (its description lists them as ``- name: ...``)."""
    starter = next(t for t in request.tools if t.name == "start_async_task")
    return re.findall(r"^- ([\w-]+): ", starter.description, re.M)


def _after_tool(last: ToolMessage, messages: Sequence[AnyMessage]) -> str:
    if last.name == "start_async_task" and last.status != "error":
        call = _call_of(last, messages)
        who = call["args"].get("subagent_type", "subagent") if call else "subagent"
        return f"I started a {who} on it in the background; its result will come here by itself."
    return f"The {last.name or 'tool'} tool said: {last.text}"


def _call_of(result: ToolMessage, messages: Sequence[AnyMessage]) -> Mapping[str, Any] | None:
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            return next((c for c in message.tool_calls if c["id"] == result.tool_call_id), None)
    return None


def _relay(note: HumanMessage) -> str:
    status = note.additional_kwargs["task_notification"].get("status")
    subagent = note.additional_kwargs["task_notification"].get("subagent", "task")
    detail = _NOTE.sub("", note.text)
    if status == "success":
        return f"The {subagent} reports: {detail}"
    if status == "waiting":
        return f"The {subagent} needs your input: {detail}"
    return f"The {subagent} could not finish: {detail}"


def _recall(system_prompt: str) -> str:
    found = re.search(r"<current_thread_summary>(.*?)</current_thread_summary>", system_prompt, re.S)
    title = re.search(r"^### (.+)$", found.group(1), re.M) if found else None
    tldr = re.search(r"\*\*TL;DR:\*\* (.+)$", found.group(1), re.M) if found else None
    if title is None:
        return "I have no notes about an earlier thread."
    return f"From my notes: {title.group(1)}." + (f" {tldr.group(1)}" if tldr else "")


# -- summaries --------------------------------------------------------------------------------------


def summarise(prompt: str) -> str:
    """A summary in the handoff format (``Title:``, 3 to 6 bullets, ``TL;DR:``) of the transcript in ``prompt``."""
    turns = _turns(prompt.split("<messages>", 1)[-1].split("</messages>", 1)[0])
    asked = [text for role, text in turns if role == "Human" and not _NOTE.match(text)]
    reports = [(m.group(1), _NOTE.sub("", text)) for role, text in turns
               if role == "Human" and (m := _NOTE.match(text))]
    answers = [text for role, text in turns if role == "AI" and text and not text.startswith("[called")]
    bullets = [f"The user asked: {_short(_POLITE.sub('', text), 100)}" for text in asked[-3:]]
    bullets += [f"The {who} found: {_short(text, 120)}" for who, text in reports[-2:]]
    if answers and not reports:
        bullets.append(f"The last answer: {_short(answers[-1], 120)}")
    bullets.append("Next: pick up where the thread left off.")
    while len(bullets) < 3:
        bullets.insert(-1, f"The thread had {len(turns)} message{'s' * (len(turns) != 1)}.")
    title = _title(asked[0] if asked else "the conversation")
    tldr = _short(_first_sentence(reports[-1][1] if reports else answers[-1] if answers else title), 100)
    return "\n".join([f"Title: {title}", *(f"- {b}" for b in bullets[-6:]), f"TL;DR: {tldr}"])


def _turns(transcript: str) -> list[tuple[str, str]]:
    """``(role, text)`` of each message in a transcript of ``Role: text`` blocks."""
    parts = _ROLE.split(transcript)
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def _title(request: str) -> str:
    words = _POLITE.sub("", request).rstrip(" ?.!").split()
    title = " ".join(words[:7]) + (" …" if len(words) > 7 else "")
    return title[:1].upper() + title[1:]


def _first_sentence(text: str) -> str:
    return re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]


def _short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " …"
