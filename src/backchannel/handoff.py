"""Handoff: continue a long thread in a fresh one, seeded with a short summary a person approved.

The flow (seed 004), in the agent's run so it works the same embedded and on a server:

1. A run whose input is ``{"handoff_request": {...}}`` selects the thread's
   high-signal messages (:func:`select_messages`: recent first, an AI message
   with its tool results, the top 25 of the last 120, trimmed to 4,000
   tokens), and has a model summarise them in about 300 tokens
   (:func:`generate_summary`), structured as ``{title, body (3-6), tldr}``
   (:func:`structure_summary`) plus Markdown (:func:`render_summary`).
2. The run pauses with an interrupt named ``handoff_summary`` whose payload
   carries ``handoff_id``, ``summary_json``, ``summary_md``, ``assistant_id``
   and ``parent_thread_id``.
3. It resumes with ``{"decisions": [decision]}``: ``{"type": "approve"}``,
   ``{"type": "approve", "args": {"summary_md"?, "title"?}}``, ``{"type":
   "edit", "args": {...}}`` or ``{"type": "reject"}``. Nothing changes before.
4. On approval: the Markdown goes atomically into the ``<current_thread_summary>``
   block of the agent's memory file; a child thread is created with
   ``parent_thread_id``, ``handoff_pending`` and ``handoff_source_thread_id``;
   the parent thread records ``last_handoff`` (handoff id, child, model,
   tokens used); and the summary is mirrored into the store under
   ``(assistant_id, "thread_summaries")``, keyed by ``handoff_id``.
5. The memory middleware shows the block to the child's first model call;
   after the child's first complete turn the block is reset and the flag cleared.

:class:`HandoffMiddleware` does the agent's part (put it with an
:class:`~backchannel.memory.AgentMemoryMiddleware` on the same file);
:func:`propose_handoff` and :func:`decide_handoff` drive it through a
runtime's ``runs`` and ``threads``, so a client needs nothing else.
A store that is down never blocks a handoff (:class:`SummaryMirror`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, TypedDict

from backchannel._clock import now_iso
from backchannel.errors import HandoffError, NotFoundError
from backchannel.hitl import check_resume, decision_args
from backchannel.interrupts import interrupt
from backchannel.memory import MemoryFile, write_atomic
from backchannel.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from backchannel.middleware import Middleware
from backchannel.models import init_model
from backchannel.summarization import CHARS_PER_TOKEN, ask_for_summary, message_tokens

__all__ = [
    "HANDOFF_ACTION",
    "HANDOFF_PROMPT",
    "GeneratedSummary",
    "HandoffError",
    "HandoffMiddleware",
    "HandoffProposal",
    "HandoffResult",
    "HandoffState",
    "MirrorStats",
    "SummaryMirror",
    "apply_edits",
    "decide_handoff",
    "generate_summary",
    "pending_handoff",
    "propose_handoff",
    "render_summary",
    "select_messages",
    "structure_summary",
]

HANDOFF_ACTION = "handoff_summary"
WINDOW = 120
TOP_N = 25
MAX_INPUT_TOKENS = 4000
MAX_SUMMARY_TOKENS = 300
MIN_BULLETS, MAX_BULLETS = 3, 6
_TOOL_RESULT_CHARS = 1200

HANDOFF_PROMPT = """<role>
Handoff Summary Assistant
</role>

<primary_objective>
Summarise the conversation below so that a fresh thread can pick up the work without re-reading it.
</primary_objective>

<instructions>
Keep only what the next thread needs: the goal, facts established, decisions made, work done, and what remains.
Use at most about 200 words, in exactly this format:
Title: <a short title for the thread, at most 8 words>
- <3 to 6 bullets>
TL;DR: <one sentence>
</instructions>

<messages>
{messages}
</messages>"""

# What an approval may change, checked when the run is resumed (an HITL review's args_schema).
_EDIT_SCHEMA = {"type": "object", "additionalProperties": False,
                "properties": {"summary_md": {"type": "string", "minLength": 1},
                               "title": {"type": "string", "minLength": 1}}}
_CHILD_IDS = uuid.UUID("0b2c7d1e-5f4a-4c8e-9d3b-6a1f2e7c9b40")

logger = logging.getLogger("backchannel.handoff")


# -- 1. selecting messages --------------------------------------------------------------------


def select_messages(messages: Sequence[AnyMessage], *, window: int = WINDOW, top_n: int = TOP_N,
                    max_tokens: int = MAX_INPUT_TOKENS) -> list[AnyMessage]:
    """The high-signal messages to summarise, oldest first.

    Of the last ``window`` messages, the best ``top_n`` by score (what people
    and the assistant said outrank tool traffic; recent outranks old), an AI
    message always with its tool results; then the most recent of those that
    fit ``max_tokens``, starting on a human message where possible. Long tool
    results are shortened; a single message too long for the budget is cut.
    """
    units = _units(list(messages[-window:]))
    ranked = sorted(range(len(units)), key=lambda i: _score(units[i], i, len(units)), reverse=True)
    chosen, count = [], 0
    for i in ranked:
        if count + len(units[i]) <= top_n:
            chosen.append(i)
            count += len(units[i])
    kept = _fit([units[i] for i in sorted(chosen)], max_tokens)
    return [m for unit in kept for m in unit]


def _units(messages: list[AnyMessage]) -> list[list[AnyMessage]]:
    """Messages grouped so an AI message and its tool results stay together (system messages dropped)."""
    units: list[list[AnyMessage]] = []
    for m in messages:
        if isinstance(m, SystemMessage):
            continue
        if isinstance(m, ToolMessage):
            owner = units[-1] if units else None
            if owner and isinstance(owner[0], AIMessage) and any(c["id"] == m.tool_call_id
                                                                  for c in owner[0].tool_calls):
                owner.append(_shortened(m))
            continue  # a result whose call fell outside the window says little on its own
        units.append([m])
    return units


def _shortened(m: ToolMessage) -> ToolMessage:
    text = m.text
    return m if len(text) <= _TOOL_RESULT_CHARS else replace(m, content=text[:_TOOL_RESULT_CHARS] + " […]")


def _score(unit: list[AnyMessage], index: int, total: int) -> float:
    first = unit[0]
    if isinstance(first, HumanMessage):
        weight = 2.0 if "task_notification" in first.additional_kwargs else 3.0
    elif isinstance(first, AIMessage) and first.tool_calls:
        weight = 1.5
    else:
        weight = 3.0
    return weight + 2.0 * (index + 1) / total


def _fit(units: list[list[AnyMessage]], max_tokens: int) -> list[list[AnyMessage]]:
    """The most recent units within ``max_tokens``; the newest message alone is cut to fit if it must be."""
    kept: list[list[AnyMessage]] = []
    total = 0.0
    for unit in reversed(units):
        cost = sum(message_tokens(m) for m in unit)
        if total + cost > max_tokens:
            if not kept:
                kept.append([_cut(unit[0], max_tokens)])
            break
        kept.append(unit)
        total += cost
    kept.reverse()
    starts = [i for i, unit in enumerate(kept) if isinstance(unit[0], HumanMessage)]
    return kept[starts[0]:] if starts else kept


def _cut(m: AnyMessage, max_tokens: int) -> AnyMessage:
    limit = max(0, int(max_tokens * CHARS_PER_TOKEN) - 64)
    return replace(m, content=m.text[:limit] + " […]") if len(m.text) > limit else m


# -- 2. summarising and structuring --------------------------------------------------------------


@dataclass(slots=True)
class GeneratedSummary:
    """A model's summary text, with the model that wrote it and what it cost."""

    text: str
    model: str
    tokens_used: int = 0
    model_run_id: str | None = None


async def generate_summary(model: Any, messages: Sequence[AnyMessage], *, max_tokens: int = MAX_SUMMARY_TOKENS,
                           prompt: str = HANDOFF_PROMPT, revise: tuple[str, str] | None = None) -> GeneratedSummary:
    """Have ``model`` summarise ``messages`` in about ``max_tokens`` tokens (the reply is cut if longer).

    ``revise`` is ``(an earlier summary, what to change)``: the model sees its
    earlier answer and is asked to rewrite it.
    """
    chat = init_model(model)
    follow_up: list[AnyMessage] = [AIMessage(revise[0]), HumanMessage(revise[1])] if revise else []
    reply = await ask_for_summary(chat, prompt, messages, follow_up=follow_up, max_tokens=max_tokens)
    usage = reply.usage_metadata or {}
    tokens = usage.get("total_tokens") or usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
    return GeneratedSummary(_bounded(reply.text.strip(), max_tokens),
                            str(reply.response_metadata.get("model_name") or getattr(chat, "name", "model")),
                            int(tokens), reply.response_metadata.get("id") or reply.id)


def _bounded(text: str, max_tokens: int) -> str:
    """``text`` cut, at a line break where possible, to about ``max_tokens`` tokens (models may ignore the cap)."""
    limit = int(max_tokens * CHARS_PER_TOKEN)
    if len(text) <= limit:
        return text
    cut = text[:limit]
    return cut[: cut.rfind("\n")] if "\n" in cut else cut


_TITLE = re.compile(r"^(?:#{1,6}\s+|[*_]*title[*_]*\s*[:\-–][*_]*\s*)(?P<text>.+)$", re.I)
_TLDR = re.compile(r"^[*_]*\s*tl;?\s*dr[*_]*\s*[:\-–][*_]*\s*(?P<text>.*)$", re.I)
_BULLET = re.compile(r"^(?:[-*•+]|\d+[.)])\s+(?P<text>.+)$")


def structure_summary(text: str) -> dict[str, Any]:
    """``{"title", "body" (3-6 items where the text allows), "tldr"}`` from a summary's text.

    Reads the ``Title:`` / bullets / ``TL;DR:`` format the prompt asks for (and
    :func:`render_summary`'s Markdown); falls back on sentences for text in any
    other shape. Bullets beyond the sixth are left out of ``body`` and listed
    under ``omitted``, so what was cut can be shown.
    """
    title = tldr = None
    body: list[str] = []
    prose: list[str] = []
    for raw in text.strip().splitlines():
        line = raw.strip()
        if not line:
            continue
        if (m := _TLDR.match(line)) and tldr is None:
            tldr = _plain(m["text"])
        elif (m := _TITLE.match(line)) and title is None and not body:
            title = _plain(m["text"])
        elif m := _BULLET.match(line):
            body.append(_plain(m["text"]))
        else:
            prose.append(_plain(line))
    if not body:
        source = prose[1:] if title is None and len(prose) > 1 else prose
        body = [s for line in source for s in _sentences(line)]
    if title is None:
        first = prose[0] if prose else body[0] if body else "Thread summary"
        title = _short(_sentences(first)[0], 80)
    while 0 < len(body) < 3 and any(len(_sentences(b)) > 1 for b in body):
        i = next(i for i, b in enumerate(body) if len(_sentences(b)) > 1)
        body[i:i + 1] = _sentences(body[i])
    body = [b for b in body if b]
    if not tldr:
        tldr = body[0] if body else title
    summary: dict[str, Any] = {"title": title, "body": body[:MAX_BULLETS], "tldr": tldr}
    if len(body) > MAX_BULLETS:
        summary["omitted"] = body[MAX_BULLETS:]
    return summary


def _bullet_count(summary: Mapping[str, Any]) -> int:
    return len(summary["body"]) + len(summary.get("omitted", ()))


def _bullets_request(count: int) -> str:
    """What to tell a model whose summary has ``count`` bullets, outside the 3 to 6 the format needs."""
    return (f"Your summary has {count} bullet{'s' * (count != 1)}; the format needs {MIN_BULLETS} to "
            f"{MAX_BULLETS}. Rewrite it in the same format (Title:, {MIN_BULLETS} to {MAX_BULLETS} bullets, "
            "TL;DR:), keeping what matters most for the next thread.")


def render_summary(summary: Mapping[str, Any]) -> str:
    """The Markdown of a structured summary: what goes in the memory file's block."""
    bullets = "\n".join(f"- {b}" for b in summary["body"])
    return f"### {summary['title']}\n\n{bullets}\n\n**TL;DR:** {summary['tldr']}".replace("\n\n\n", "\n\n")


def apply_edits(proposal: Mapping[str, Any], args: Mapping[str, Any] | None) -> tuple[dict[str, Any], str]:
    """The summary and Markdown after a person's edits: new Markdown (kept as written, re-read for the
    structured fields) and/or a new title."""
    summary = dict(proposal["summary_json"])
    md = proposal["summary_md"]
    args = args or {}
    if args.get("summary_md"):
        md = args["summary_md"].strip()  # kept as the person wrote it, every bullet
        summary = {**summary, **structure_summary(md)}
        summary.pop("omitted", None)
    if args.get("title"):
        summary["title"] = args["title"].strip()
        if not args.get("summary_md"):
            md = render_summary(summary)
    return summary, md


def _plain(text: str) -> str:
    return text.strip().strip("*_").strip()


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]


def _short(text: str, limit: int) -> str:
    text = text.rstrip(".")
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + "…"


# -- 6. mirroring into a store ---------------------------------------------------------------------


@dataclass(slots=True)
class MirrorStats:
    """What the store mirror has done: writes that landed, retries, failed attempts and fallbacks."""

    mirrored: int = 0
    retries: int = 0
    failures: int = 0
    fallbacks: int = 0
    pending: int = 0


class SummaryMirror:
    """Copies accepted summaries into a store, without ever letting the store hold a handoff up.

    Each write gets ``attempts`` tries of at most ``timeout`` seconds, with
    exponential backoff from ``backoff`` seconds. If all fail, the handoff goes
    on: the failure is logged and counted (``stats.fallbacks``), the summary
    waits in ``outbox`` (a JSON file, so a restart keeps it), and a background
    task keeps retrying, backing off up to ``max_backoff``, until the store is
    back. Writes are keyed by ``handoff_id``, so a repeated one changes nothing.
    """

    def __init__(self, outbox: str | os.PathLike[str] | None = None, *, attempts: int = 3,
                 backoff: float = 0.1, timeout: float = 2.0, max_backoff: float = 60.0) -> None:
        self.outbox = Path(outbox).expanduser() if outbox is not None else None
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self.timeout = timeout
        self.max_backoff = max_backoff
        self.stats = MirrorStats()
        self.pending: dict[str, dict[str, Any]] = self._load()
        self.stats.pending = len(self.pending)
        self._catching_up: asyncio.Task[None] | None = None

    async def mirror(self, store: Any, namespace: Sequence[str], key: str, value: Mapping[str, Any]) -> bool:
        """Write ``value`` (and anything still waiting); returns whether this one reached the store."""
        item = {"namespace": list(namespace), "value": dict(value)}
        # The store first: the outbox (a file written with fsync) is only for what the store could not take.
        # A crash before the write lands loses nothing: the resumed run repeats its handoff steps, this one too.
        if not await self._write_with_retries(store, key, item):
            self._remember(key, item)
            self.stats.fallbacks += 1
            logger.warning("handoff %s: the store is unavailable; the summary waits in %s and will be mirrored "
                           "when the store is back (%d waiting)", key, self.outbox or "memory", len(self.pending))
            self.catch_up(store)
            return False
        for waiting in list(self.pending):  # the store is up: send what waits too
            if not await self._write_with_retries(store, waiting):
                self.catch_up(store)
                break
        return True

    def catch_up(self, store: Any) -> None:
        """Start retrying waiting writes in the background, if any wait and no retry loop runs yet."""
        if self.pending and store is not None and (self._catching_up is None or self._catching_up.done()):
            self._catching_up = asyncio.get_running_loop().create_task(self._retry_forever(store))

    async def _retry_forever(self, store: Any) -> None:
        delay = self.backoff
        while self.pending:
            await asyncio.sleep(delay)
            for key in list(self.pending):
                if not await self._write_once(store, key):
                    break
            delay = min(delay * 2, self.max_backoff)
        logger.info("handoff mirror caught up: every summary is in the store")

    async def _write_with_retries(self, store: Any, key: str, item: Mapping[str, Any] | None = None) -> bool:
        for attempt in range(self.attempts):
            if attempt:
                self.stats.retries += 1
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            if await self._write_once(store, key, item):
                return True
        return False

    async def _write_once(self, store: Any, key: str, item: Mapping[str, Any] | None = None) -> bool:
        """Write ``item``, or the write waiting under ``key`` (none left: another attempt wrote it)."""
        item = item or self.pending.get(key)
        if item is None:
            return True
        try:
            await asyncio.wait_for(store.put_item(item["namespace"], key=key, value=item["value"]), self.timeout)
        except Exception as exc:  # any failure of the store: it must not reach the handoff
            self.stats.failures += 1
            logger.debug("handoff %s: store write failed: %s: %s", key, type(exc).__name__, exc)
            return False
        self.stats.mirrored += 1
        if self.pending.pop(key, None) is not None:
            self._save()
        return True

    def _remember(self, key: str, item: dict[str, Any]) -> None:
        self.pending[key] = item
        self._save()

    def _load(self) -> dict[str, dict[str, Any]]:
        if self.outbox is None or not self.outbox.exists():
            return {}
        try:
            return dict(json.loads(self.outbox.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            logger.warning("cannot read the handoff outbox %s (%s); starting with an empty one", self.outbox, exc)
            return {}

    def _save(self) -> None:
        self.stats.pending = len(self.pending)
        if self.outbox is None:
            return
        if self.pending:
            write_atomic(self.outbox, json.dumps(self.pending, ensure_ascii=False, default=str))
        elif self.outbox.exists():
            self.outbox.unlink()


# -- 3-5. the agent's part ------------------------------------------------------------------------


def _latest(old: Any, new: Any) -> Any:
    return new


class HandoffState(TypedDict, total=False):
    """The state keys of a handoff: the request being answered and the latest handoff's record.

    Declared so that a runtime's ``assistants.get_schemas`` shows which assistants take a handoff request.
    """

    handoff_request: Annotated[dict[str, Any] | None, _latest]
    handoff: Annotated[dict[str, Any] | None, _latest]


class HandoffMiddleware(Middleware):
    """Propose, approve and apply handoffs in the agent's runs; clear the summary after the child's first turn.

    ``model`` writes the summaries; ``memory`` is the agent's memory file (a
    :class:`~backchannel.memory.MemoryFile` or a path, the one its
    :class:`~backchannel.memory.AgentMemoryMiddleware` reads). Summaries are
    mirrored into ``store`` (default: the runtime's store) unless
    ``mirror=False``; summaries the store could not take wait in ``outbox``
    (default: ``handoff_outbox.json`` beside the memory file).
    Register it first, so a handoff run skips the other middleware's hooks.

    Background tasks still running at a handoff follow the person: they are
    carried into the new thread's tasks, and when one reports back to the old
    thread (and nobody has gone on talking there), the report is passed on to
    the new thread, whose assistant answers it there.
    """

    state_schema = HandoffState

    def __init__(self, model: Any, memory: MemoryFile | str | os.PathLike[str], *, store: Any = None,
                 mirror: bool | SummaryMirror = True, outbox: str | os.PathLike[str] | None = None,
                 window: int = WINDOW, top_n: int = TOP_N, max_input_tokens: int = MAX_INPUT_TOKENS,
                 max_summary_tokens: int = MAX_SUMMARY_TOKENS, prompt: str = HANDOFF_PROMPT) -> None:
        self.model = model
        self._summarizer: Any = None
        self.memory = memory if isinstance(memory, MemoryFile) else MemoryFile(memory)
        self.store = store
        if isinstance(mirror, SummaryMirror):
            self.mirror: SummaryMirror | None = mirror
        else:
            self.mirror = SummaryMirror(outbox or self.memory.path.parent / "handoff_outbox.json") if mirror else None
        self.window, self.top_n, self.max_input_tokens = window, top_n, max_input_tokens
        self.max_summary_tokens = max_summary_tokens
        self.prompt = prompt

    async def before_agent(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """A handoff request: select, summarise and record a proposal (a stale request is dropped)."""
        if self.mirror is not None and self.mirror.pending:
            self.mirror.catch_up(self.store or ctx.store)
        request = state.get("handoff_request")
        if not request:
            return None
        if request.get("run_id"):  # an earlier run's request, still waiting for a decision
            proposal = state.get("handoff") or {}
            arriving = [*state["messages"], *(ctx.inbox.drain() if ctx.inbox is not None else ())]  # drain peeks
            if proposal.get("status") == "proposed" and _only_results_since(proposal, arriving):
                return None  # a task result arrived while the person decides: the proposal keeps waiting
            return {"handoff_request": None, "handoff": {**proposal, "status": "abandoned"}}  # the thread moved on
        base = {"request_id": request.get("request_id"), "assistant_id": _assistant_id(ctx),
                "parent_thread_id": ctx.thread_id}
        selected = select_messages(state["messages"], window=self.window, top_n=self.top_n,
                                   max_tokens=self.max_input_tokens)
        if not selected:
            return {"handoff_request": None, "handoff": {**base, "status": "empty"}, "jump_to": "end"}
        generated, summary = await self._summarise(selected)
        omitted = summary.pop("omitted", [])
        proposal = {**base, "status": "proposed", "handoff_id": str(uuid.uuid4()), "summary_json": summary,
                    "summary_md": render_summary(summary), "omitted": omitted, "model": generated.model,
                    "tokens_used": generated.tokens_used, "model_run_id": generated.model_run_id,
                    "messages_summarized": len(selected), "message_count": len(state["messages"]),
                    "created_at": now_iso()}
        logger.info("handoff %s proposed for thread %s: model=%s tokens_used=%d", proposal["handoff_id"],
                    ctx.thread_id, generated.model, generated.tokens_used)
        ctx.emit_custom({"handoff": {k: proposal[k] for k in ("handoff_id", "status", "model", "tokens_used")}})
        return {"handoff_request": {**request, "run_id": ctx.run_id}, "handoff": proposal}

    async def _summarise(self, selected: Sequence[AnyMessage]) -> tuple[GeneratedSummary, dict[str, Any]]:
        """The summary of ``selected``; a model that gives fewer than 3 or more than 6 bullets is asked once more."""
        if self._summarizer is None:
            self._summarizer = init_model(self.model)
        generated = await generate_summary(self._summarizer, selected, max_tokens=self.max_summary_tokens,
                                           prompt=self.prompt)
        summary = structure_summary(generated.text)
        count = _bullet_count(summary)
        if MIN_BULLETS <= count <= MAX_BULLETS:
            return generated, summary
        again = await generate_summary(self._summarizer, selected, max_tokens=self.max_summary_tokens,
                                       prompt=self.prompt, revise=(generated.text, _bullets_request(count)))
        logger.info("handoff summary had %d bullets; asked again, got %d", count,
                    _bullet_count(structure_summary(again.text)))
        again.tokens_used += generated.tokens_used
        return again, structure_summary(again.text)

    async def before_model(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """A proposal waiting: pause for a person's decision (unless the request said apply), then act on it.
        After a handoff: pass task results that reach this thread on to the new one."""
        request, proposal = state.get("handoff_request"), state.get("handoff")
        if not request or not proposal or proposal.get("status") != "proposed":
            return await self._forward_results(state, ctx)
        if request.get("apply"):
            decision: Mapping[str, Any] = {"type": "approve"}
        else:
            payload = review_payload(proposal)
            decision = check_resume(payload, interrupt(payload))[0]
        # Task results that arrived while the person decided: answered here on a rejection, passed on on approval.
        waiting = _only_results_since(proposal, state["messages"])
        if decision["type"] == "reject":
            result = {**proposal, "status": "rejected", "reason": decision.get("message")}
            logger.info("handoff %s rejected", proposal["handoff_id"])
        else:
            result = await self._accept(proposal, decision_args(decision), state, ctx)
            if waiting:
                result = (await self._forward_results({**state, "handoff": result}, ctx) or {}).get("handoff", result)
        ctx.emit_custom({"handoff": {"handoff_id": result["handoff_id"], "status": result["status"],
                                     "child_thread_id": result.get("child_thread_id")}})
        if decision["type"] == "reject" and waiting:
            return {"handoff_request": None, "handoff": result}  # on to the model, which answers them
        return {"handoff_request": None, "handoff": result, "jump_to": "end"}

    async def after_agent(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """After a handoff child's first complete turn: reset the summary block and clear the flag."""
        if not ctx.metadata.get("handoff_pending"):
            return None
        messages = state.get("messages") or ()
        if not messages or not isinstance(messages[-1], AIMessage):
            return None  # no reply yet (e.g. a compaction): the summary is still needed
        handoff_id = ctx.metadata.get("handoff_id")
        try:
            if self.memory.reset_block(handoff_id=handoff_id):
                logger.info("handoff %s: summary block cleared after the first turn of thread %s", handoff_id,
                            ctx.thread_id)
            if ctx.runtime is not None and ctx.thread_id is not None:
                await ctx.runtime.threads.update(ctx.thread_id, metadata={"handoff_pending": False})
        except Exception:  # the reply stands; both steps are idempotent, so the next turn finishes the cleanup
            logger.exception("handoff %s: cleanup after the first turn of thread %s failed; retrying next turn",
                             handoff_id, ctx.thread_id)
        return None

    async def _forward_results(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """A task result that reached this thread after it was handed off goes on to the new thread.

        Only while nobody talks here any more: once the person writes in this
        thread again, its results stay here. Each result is passed on once.
        """
        handoff = state.get("handoff") or {}
        child = handoff.get("child_thread_id")
        if handoff.get("status") != "accepted" or not child or ctx.runtime is None:
            return None
        messages = state["messages"]
        since = messages[handoff.get("message_count", len(messages)):]
        if not any(_is_notification(m) for m in since) or any(
                isinstance(m, HumanMessage) and not _is_notification(m) for m in since):
            return None
        done = list(handoff.get("forwarded") or ())
        notes = [m for m in since if _is_notification(m)]
        fresh = [m for m in notes if m.id not in done]
        if fresh:
            await ctx.runtime.runs.create(child, _assistant_id(ctx), multitask_strategy="enqueue", input={
                "messages": [_passed_on(m, ctx.thread_id, child) for m in fresh]})
            logger.info("handoff %s: %d task result(s) that reached thread %s passed on to %s",
                        handoff.get("handoff_id"), len(fresh), ctx.thread_id, child)
        if ctx.inbox is not None:
            await ctx.inbox.ack(notes)  # heard: passed on, so no later run of this thread takes them up again
        return {"handoff": {**handoff, "forwarded": [*done, *(m.id for m in fresh)]}, "jump_to": "end"}

    async def _accept(self, proposal: Mapping[str, Any], args: Mapping[str, Any] | None,
                      state: Mapping[str, Any], ctx: Any) -> dict[str, Any]:
        """Write the block, create the child thread (with the tasks still running), mark the parent, mirror.
        Each step is idempotent, so a run resumed after a crash repeats them safely."""
        summary, md = apply_edits(proposal, args)
        handoff_id, parent = proposal["handoff_id"], proposal["parent_thread_id"]
        self.memory.write_block(md, handoff_id=handoff_id)
        child_id = str(uuid.uuid5(_CHILD_IDS, handoff_id))
        record = {"handoff_id": handoff_id, "assistant_id": proposal["assistant_id"], "parent_thread_id": parent,
                  "child_thread_id": child_id, **summary, "model": proposal["model"],
                  "tokens_used": proposal["tokens_used"], "created_at": proposal["created_at"]}
        rt = ctx.runtime
        if rt is None:
            raise HandoffError("a handoff needs a runtime to create the new thread in; run the agent on a thread")
        await rt.threads.create(thread_id=child_id, if_exists="do_nothing", graph_id=ctx.metadata.get("graph_id"),
                                metadata={"parent_thread_id": parent, "handoff_pending": True,
                                          "handoff_source_thread_id": parent, "handoff_id": handoff_id,
                                          "title": summary["title"]})
        carried = {task_id: task for task_id, task in (state.get("async_tasks") or {}).items()
                   if task.get("status") in _UNFINISHED}
        if carried:
            await rt.threads.update_state(child_id, {"async_tasks": carried})
        await rt.threads.update(parent, metadata={"last_handoff": {
            "handoff_id": handoff_id, "child_thread_id": child_id, "model": proposal["model"],
            "tokens_used": proposal["tokens_used"], "model_run_id": proposal.get("model_run_id"),
            "title": summary["title"], "created_at": proposal["created_at"]}})
        mirrored = None
        if self.mirror is not None and (self.store or ctx.store) is not None:
            mirrored = await self.mirror.mirror(self.store or ctx.store, (proposal["assistant_id"], "thread_summaries"),
                                                handoff_id, {"summary_json": record, "summary_md": md})
        logger.info("handoff %s accepted: thread %s continues in %s (model=%s tokens_used=%s mirrored=%s)",
                    handoff_id, parent, child_id, proposal["model"], proposal["tokens_used"], mirrored)
        return {**proposal, "status": "accepted", "summary_json": record, "summary_md": md,
                "child_thread_id": child_id, "mirrored": mirrored, "carried_tasks": sorted(carried),
                "message_count": proposal.get("message_count", len(state["messages"]))}


_UNFINISHED = ("pending", "running", "waiting")


def _is_notification(message: AnyMessage) -> bool:
    return isinstance(message, HumanMessage) and "task_notification" in message.additional_kwargs


def _only_results_since(proposal: Mapping[str, Any], messages: Sequence[AnyMessage]) -> bool:
    """Whether messages came after the proposal, all of them task results (nobody said anything)."""
    since = messages[proposal.get("message_count", len(messages)):]
    return bool(since) and all(_is_notification(m) for m in since)


def _passed_on(message: AnyMessage, parent: str | None, child: str) -> dict[str, Any]:
    """A task notification as the new thread receives it: the same text and marker, a note of where it came
    from, and an id of its own (the same each time, so passing it on twice adds it once)."""
    assert isinstance(message, HumanMessage)
    return {"type": "human", "content": message.content, "id": str(uuid.uuid5(_CHILD_IDS, f"{message.id}:{child}")),
            "additional_kwargs": {**message.additional_kwargs, "handed_off_from": parent}}


def review_payload(proposal: Mapping[str, Any]) -> dict[str, Any]:
    """The ``handoff_summary`` interrupt: the seed's action request, plus a review config for HITL UIs
    (and ``omitted``, the bullets beyond six that were cut, when there are any)."""
    args = {"handoff_id": proposal["handoff_id"], "summary_json": proposal["summary_json"],
            "summary_md": proposal["summary_md"], "assistant_id": proposal["assistant_id"],
            "parent_thread_id": proposal["parent_thread_id"]}
    if proposal.get("omitted"):
        args["omitted"] = proposal["omitted"]
    return {
        "action_requests": [{"name": HANDOFF_ACTION, "description": "Preview handoff summary for approval",
                             "args": args}],
        "review_configs": [{"action_name": HANDOFF_ACTION, "allowed_decisions": ["approve", "edit", "reject"],
                            "args_schema": _EDIT_SCHEMA}],
    }


def _assistant_id(ctx: Any) -> str:
    return str(ctx.metadata.get("graph_id") or ctx.agent)


# -- the client's part: through a runtime's surface ------------------------------------------------


@dataclass(slots=True)
class HandoffProposal:
    """A summary waiting for a person's decision (the ``handoff_summary`` interrupt's args)."""

    handoff_id: str
    summary_json: dict[str, Any]
    summary_md: str
    assistant_id: str
    parent_thread_id: str
    payload: dict[str, Any] = field(repr=False, default_factory=dict)
    omitted: list[str] = field(default_factory=list)  # bullets beyond six, left out of the summary

    @property
    def title(self) -> str:
        return str(self.summary_json.get("title", ""))


@dataclass(slots=True)
class HandoffResult:
    """How a handoff ended: ``accepted`` (with the child thread) or ``rejected``."""

    status: str
    handoff_id: str
    parent_thread_id: str
    child_thread_id: str | None
    summary_json: dict[str, Any]
    summary_md: str
    model: str | None = None
    tokens_used: int = 0
    mirrored: bool | None = None


async def propose_handoff(runtime: Any, thread_id: str, assistant_id: str, *,
                          apply: bool = False) -> HandoffProposal | HandoffResult:
    """Summarise a thread for a handoff: the proposal waiting for a decision, or with ``apply=True``
    the accepted result at once.

    ``runtime`` is a :class:`~backchannel.runtime.LocalRuntime` or any client
    with its ``runs``/``threads`` surface; ``assistant_id`` must run a
    :class:`HandoffMiddleware` (else :class:`HandoffError`, before anything
    runs). Cancelling the call cancels the summary and leaves the thread as it
    was: no run left working, no proposal left waiting.
    """
    await _check_handoff_support(runtime, assistant_id)
    request_id = str(uuid.uuid4())
    run = await runtime.runs.create(thread_id, assistant_id, multitask_strategy="enqueue",
                                    input={"handoff_request": {"request_id": request_id, "apply": apply}})
    try:
        values = await runtime.runs.join(thread_id, run["run_id"])
    except asyncio.CancelledError:
        await asyncio.shield(_withdraw(runtime, thread_id, assistant_id, run["run_id"]))
        raise
    return _outcome(values, request_id, thread_id)


async def _check_handoff_support(runtime: Any, assistant_id: str) -> None:
    """Refuse an assistant whose state has no handoff keys: a handoff request would only run a model turn."""
    schemas = await runtime.assistants.get_schemas(assistant_id)
    properties = ((schemas or {}).get("state_schema") or {}).get("properties")
    if isinstance(properties, Mapping) and "handoff_request" not in properties:
        raise HandoffError(f"assistant {assistant_id!r} has no HandoffMiddleware, so it cannot hand off a thread; "
                           "add HandoffMiddleware(model, memory_path) to its middleware")


async def _withdraw(runtime: Any, thread_id: str, assistant_id: str, run_id: str) -> None:
    """Undo a proposal nobody will see: roll its run back (its steps deleted: the request leaves no trace),
    or reject what it proposed if it had finished."""
    try:
        await runtime.runs.cancel(thread_id, run_id, wait=True, action="rollback")
    except NotFoundError:
        pass  # it ended meanwhile
    if await pending_handoff(runtime, thread_id) is not None:
        await decide_handoff(runtime, thread_id, assistant_id, {"type": "reject", "message": "cancelled"})


async def pending_handoff(runtime: Any, thread_id: str) -> HandoffProposal | None:
    """The handoff waiting for a decision on this thread, if there is one."""
    thread = await runtime.threads.get(thread_id)
    for items in (thread.get("interrupts") or {}).values():
        for item in items:
            proposal = _proposal(item.get("value"))
            if proposal is not None:
                return proposal
    return None


async def decide_handoff(runtime: Any, thread_id: str, assistant_id: str,
                         decision: Mapping[str, Any]) -> HandoffResult:
    """Answer the handoff waiting on a thread: approve (optionally with edited ``args``), edit or reject.

    A malformed decision raises :class:`~backchannel.errors.InvalidRequestError`
    before anything is sent, and the handoff keeps waiting.
    """
    await _settled(runtime, thread_id)
    proposal = await pending_handoff(runtime, thread_id)
    if proposal is None:
        raise HandoffError(f"no handoff is waiting for a decision on thread {thread_id}; propose one first "
                           "(the thread may have moved on since)")
    check_resume(proposal.payload, {"decisions": [decision]})
    values = await runtime.runs.wait(thread_id, assistant_id, command={"resume": {"decisions": [dict(decision)]}})
    outcome = _outcome(values, None, thread_id)
    if not isinstance(outcome, HandoffResult) or outcome.handoff_id != proposal.handoff_id:
        raise HandoffError(f"the decision on handoff {proposal.handoff_id} did not complete it")
    return outcome


async def _settled(runtime: Any, thread_id: str) -> None:
    """Wait for the thread's runs in progress (a task result being taken in) to end."""
    for run in await runtime.runs.list(thread_id, limit=5):
        if run["status"] in ("pending", "running"):
            await runtime.runs.join(thread_id, run["run_id"])


def _proposal(value: Any) -> HandoffProposal | None:
    if not isinstance(value, Mapping):
        return None
    for action in value.get("action_requests") or ():
        if action.get("name") == HANDOFF_ACTION:
            args = action["args"]
            return HandoffProposal(args["handoff_id"], dict(args["summary_json"]), args["summary_md"],
                                   args["assistant_id"], args["parent_thread_id"], dict(value),
                                   list(args.get("omitted") or ()))
    return None


def _outcome(values: Mapping[str, Any], request_id: str | None, thread_id: str) -> HandoffProposal | HandoffResult:
    if values.get("__error__"):
        error = values["__error__"]
        raise HandoffError(f"the handoff run failed: {error.get('error')}: {error.get('message')}")
    for item in values.get("__interrupt__") or ():
        proposal = _proposal(item.get("value"))
        if proposal is not None:
            return proposal
    handoff = values.get("handoff") or {}
    if request_id is not None and handoff.get("request_id") != request_id:
        raise HandoffError(f"the assistant did not answer the handoff request on thread {thread_id}; does it "
                           "run HandoffMiddleware?")
    status = handoff.get("status")
    if status == "empty":
        raise HandoffError("there is nothing to summarise in this thread yet")
    if status not in ("accepted", "rejected"):
        raise HandoffError(f"the handoff on thread {thread_id} ended as {status!r}")
    return HandoffResult(status, handoff["handoff_id"], handoff["parent_thread_id"], handoff.get("child_thread_id"),
                         dict(handoff["summary_json"]), handoff["summary_md"], handoff.get("model"),
                         int(handoff.get("tokens_used") or 0), handoff.get("mirrored"))
