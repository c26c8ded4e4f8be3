"""Checkpoints: each step's state change, recorded as a delta.

A checkpoint stores only what its step changed (the new messages, the updated
keys) and the stage the run continues at. A thread's state at a checkpoint is
the fold of the deltas along the parent links, from the thread's first
checkpoint or from the nearest *whole* one, which stores the whole state: so
storage grows linearly with the conversation, and reading a state costs about
what it returns. A whole checkpoint is written where the changes a read would
fold outweigh the state they make (messages replaced or removed, a key rewritten
at every step): the state's own size is looked at each time that fold has
doubled, so looking costs little. Deleting a run's checkpoints makes the
checkpoints that followed them whole, so every other state stays as it was.

Every so many checkpoints a *base* stores the thread's messages as JSON text
(those since the previous base, as their steps wrote them), and so does a step
that did more than append messages or that forked: the steps after a base only
append, so a state is its bases' texts joined and the few deltas since, and a
read of a long thread folds a bounded number of deltas. A caller that only
encodes a state (the server) gets that text unparsed, as ``orjson.Fragment``s.

The newest state of recently used threads is kept in memory, so a run never
refolds a thread it just wrote. Reads that only render (history, a state at a
checkpoint) fold JSON values and build no message objects.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson

from backchannel._clock import now_iso
from backchannel._collector import collector_paused
from backchannel.errors import ConflictError, NotFoundError
from backchannel.events import Event, EventBus
from backchannel.messages import (
    REMOVE_ALL_MESSAGES,
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_input,
    new_id,
)
from backchannel.runtime._readonly import read_only
from backchannel.runtime.rows import CheckpointBase, CheckpointRow, CheckpointWrite, Delta, RunClaim, delta_text
from backchannel.runtime.storage import CheckpointStorage
from backchannel.serde import dumps, loads, to_jsonable
from backchannel.state import MessageList, Reducer, apply_update, snapshot

__all__ = ["Checkpointer", "Recorder", "ThreadState"]

IDLE_STATES_KEPT = 512  # newest states cached beyond those of the runs executing
_LOOK_FROM = 64 * 1024  # bytes: below this, a state's fold is cheap whatever it holds
_DELETE_TRIES = 5  # a run's checkpoints deleted while others are written after them: tries
_FOLD_SLICE = 512  # checkpoints folded between two chances for other tasks to run
_COUNTS_KEPT = 128  # newest checkpoints whose message counts a cached state keeps
_BASE_EVERY = 64  # checkpoints between two bases: what a read of a long thread folds at most


@dataclass(slots=True)
class ThreadState:
    """A thread's state at one checkpoint (``head`` is ``None`` for a thread with no checkpoints)."""

    values: dict[str, Any]
    head: CheckpointRow | None
    newest: bool = False  # known to be the thread's newest state: a write appends after its head
    folded: int = 0  # bytes a read of this state folds: its nearest whole checkpoint and the deltas since
    looked: int = 0  # ``folded`` when the state's own size was last compared with it
    rendered: dict[str, tuple[AnyMessage, dict[str, Any]]] | None = None  # by message id, once a read renders one
    counts: dict[str, int] = field(default_factory=dict)  # messages at its latest checkpoints (by id), oldest first
    base_id: str | None = None  # the checkpoint of the nearest base on its chain, when the steps since only appended
    base_count: int = 0  # messages at that base
    since_base: int = 0  # checkpoints since that base (or since where its read started, without one)
    texts: list[str] | None = None  # the JSON texts of the messages written since that base, when known

    def count(self, row: CheckpointRow) -> None:
        """Note how many messages the state holds at ``row`` (what a history taken back from it needs)."""
        self.counts[row.checkpoint_id] = len(self.values.get("messages") or ())
        if len(self.counts) > _COUNTS_KEPT:
            del self.counts[next(iter(self.counts))]

    @property
    def next_stage(self) -> str:
        return self.head.next if self.head is not None else ""

    @property
    def seq(self) -> int:
        return self.head.seq if self.head is not None else 0


def empty_state() -> dict[str, Any]:
    return {"messages": MessageList()}


class Checkpointer:
    """Reads and writes checkpoints through a storage backend, caching each thread's newest state."""

    def __init__(self, storage: CheckpointStorage, *, cache_size: int = IDLE_STATES_KEPT) -> None:
        self.storage = storage
        self.cache_size = cache_size
        self._latest: OrderedDict[str, ThreadState] = OrderedDict()

    async def latest(self, thread_id: str, reducers: Mapping[str, Reducer]) -> ThreadState:
        """The thread's newest state (live: a run on the thread mutates it)."""
        head = await self.storage.head_checkpoint(thread_id)
        cached = self._latest.get(thread_id)
        if cached is not None and _same(cached.head, head):
            self._latest.move_to_end(thread_id)
            return cached
        state = (await self.at(thread_id, head.checkpoint_id, reducers, seq=head.seq) if head
                 else ThreadState(empty_state(), None))
        state.newest = True
        self._remember(thread_id, state)
        return state

    @staticmethod
    def blank() -> ThreadState:
        """The state of a thread known to have no checkpoint yet (made a moment ago), without a read."""
        return ThreadState(empty_state(), None, newest=True)

    def held(self, thread_id: str) -> ThreadState | None:
        """The thread's newest state as this process holds it, without a read (``None``: none held): storage may
        have moved past it since (another process's writes), or not have its head yet (a write not made)."""
        state = self._latest.get(thread_id)
        return state if state is not None and state.newest else None

    async def at(self, thread_id: str, checkpoint_id: str, reducers: Mapping[str, Reducer], *,
                 seq: int | None = None) -> ThreadState:
        """The thread's state at ``checkpoint_id`` (a fresh copy, folded from its nearest base and the deltas since,
        or without one from the nearest whole checkpoint or the first)."""
        bases, chain = await self._start(thread_id, checkpoint_id, seq)
        if not chain:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        first = chain[0]
        folded = sum(len(delta_text(r.delta)) for r in chain[1:])
        if bases:
            with collector_paused():
                values = _whole_values(_base_json(bases))
            based = sum(len(b.messages) for b in bases) + len(bases[-1].rest)
            state = ThreadState(values, chain[-1], folded=based + folded, looked=based + folded,
                                base_id=first.checkpoint_id, base_count=len(values["messages"]),
                                since_base=len(chain) - 1)
        else:
            if first.whole:
                with collector_paused():
                    values = _whole_values(first.delta)
            else:
                values = empty_state()
                apply_update(values, first.delta, reducers)
            first_size = len(delta_text(first.delta))
            state = ThreadState(values, chain[-1], folded=first_size + folded,
                                looked=first_size if first.whole else 0, since_base=len(chain))
        counted = len(chain) - _COUNTS_KEPT
        if counted <= 0:
            state.count(first)
        for i, row in enumerate(chain[1:], 1):
            apply_update(values, row.delta, reducers)
            if i >= counted:
                state.count(row)
        return state

    async def current(self, thread_id: str, reducers: Mapping[str, Reducer], *, text: bool = False,
                      head: CheckpointRow | None | Literal["unread"] = "unread") -> tuple[dict[str, Any],
                                                                                     CheckpointRow | None]:
        """The thread's newest state as JSON values, with its checkpoint (``head``, if the caller read it):
        rendered from the cached state when there is one, else read (a read builds no message objects; with
        ``text``, see :meth:`view`)."""
        if head == "unread":
            head = await self.storage.head_checkpoint(thread_id)
        if head is None:
            return {}, None
        cached = self._latest.get(thread_id)
        if cached is not None and _same(cached.head, head):
            self._latest.move_to_end(thread_id)
            return self.jsonable(thread_id, cached.values), head
        return await self.view(thread_id, head.checkpoint_id, reducers, seq=head.seq, text=text)

    async def view(self, thread_id: str, checkpoint_id: str, reducers: Mapping[str, Reducer], *,
                   seq: int | None = None, text: bool = False) -> tuple[dict[str, Any], CheckpointRow]:
        """The thread's state at ``checkpoint_id`` as JSON values, with its checkpoint (a read: no objects built).
        With ``text``, its messages may be one ``orjson.Fragment`` of their stored JSON text, unparsed: for a
        caller that only encodes them."""
        bases, chain = await self._start(thread_id, checkpoint_id, seq)
        if not chain:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        [values] = await _fold(bases, chain, reducers, {checkpoint_id}, text)
        return values, chain[-1]

    async def history(self, thread_id: str, rows: list[CheckpointRow], reducers: Mapping[str, Reducer], *,
                      text: bool = False) -> list[tuple[CheckpointRow, dict[str, Any]]]:
        """The thread's state at each of ``rows`` (its checkpoints, newest first) as JSON values, with its row:
        taken back from the cached state while the steps between only appended messages, the others folded
        forward once along their chain, from the nearest base or whole checkpoint before them (``text``: see
        :meth:`view`). A row no longer stored (pruned since it was listed) is left out."""
        wanted = {r.checkpoint_id for r in rows}
        found = self._unfolded(thread_id, rows)
        for target in rows:
            if target.checkpoint_id not in found:
                await asyncio.sleep(0)  # each fold of a long thread's history alone: other requests run between
                bases, chain = await self._start(thread_id, target.checkpoint_id, target.seq)
                on_chain = [r.checkpoint_id for r in chain if r.checkpoint_id in wanted - found.keys()]
                found.update(zip(on_chain, await _fold(bases, chain, reducers, set(on_chain), text), strict=True))
        return [(r, found[r.checkpoint_id]) for r in rows if r.checkpoint_id in found]

    def _unfolded(self, thread_id: str, rows: list[CheckpointRow]) -> dict[str, dict[str, Any]]:
        """The states at the first of ``rows`` that the cached state gives without a read: its own (when it is the
        first), then each parent's, while the step after it only appended messages (they are dropped again)."""
        cached = self._latest.get(thread_id)
        if cached is None or cached.head is None or not rows or rows[0].checkpoint_id != cached.head.checkpoint_id:
            return {}
        values = self.jsonable(thread_id, cached.values)
        messages = values.get("messages", [])
        found, kept = {rows[0].checkpoint_id: values}, len(messages)
        for newer, older in zip(rows, rows[1:]):
            counts = cached.counts
            appended = _appended(newer, counts.get(newer.checkpoint_id), counts.get(older.checkpoint_id))
            if appended is None or newer.parent_id != older.checkpoint_id or appended > kept:
                break
            kept -= appended
            found[older.checkpoint_id] = {**values, "messages": messages[:kept]}
        return found

    async def _start(self, thread_id: str, checkpoint_id: str,
                     seq: int | None) -> tuple[list[CheckpointBase], list[CheckpointRow]]:
        """What the state at a checkpoint is folded from: the nearest base on its chain (with those it extends)
        and the checkpoints from the base's own, or without one the checkpoints from the nearest whole one or the
        first. An empty chain: no such checkpoint. A thread's first checkpoints are folded without looking for a
        base (their chain is no longer than a base spares)."""
        if seq is None:
            row = await self.storage.get_checkpoint(thread_id, checkpoint_id)
            if row is None:
                return [], []
            seq = row.seq
        if seq > _BASE_EVERY:
            bases, chain = await self.storage.based_chain(thread_id, checkpoint_id, seq)
            if bases and chain and chain[0].checkpoint_id == bases[-1].checkpoint_id:
                return bases, chain
        return [], await self.storage.checkpoint_chain(thread_id, checkpoint_id, seq)

    def jsonable(self, thread_id: str, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` (a state of the thread) as JSON-able data. Each message is rendered once while the
        thread's state is cached (messages are never changed once recorded), and its dict is shared by every
        rendering of it until then: read-only (a caller changing it would change what others see, and the
        message itself), which costs less than copying each one for each caller."""
        cached = self._latest.get(thread_id)
        rendered: dict[str, tuple[AnyMessage, dict[str, Any]]] = {}
        if cached is not None:
            if cached.rendered is None:
                cached.rendered = rendered
            rendered = cached.rendered
        out: dict[str, Any] = {}
        for key, value in values.items():
            if key == "messages" and isinstance(value, list):
                out[key] = [_rendered(m, rendered) for m in value]
            else:
                out[key] = to_jsonable(value)
        return out

    def _remember(self, thread_id: str, state: ThreadState) -> None:
        self._latest[thread_id] = state
        self._latest.move_to_end(thread_id)
        while len(self._latest) > self.cache_size:
            self._latest.popitem(last=False)

    def keep(self, thread_id: str) -> None:
        """Mark the thread's cached state as recently used: a run is about to need it."""
        if thread_id in self._latest:
            self._latest.move_to_end(thread_id)

    def forget(self, thread_id: str) -> None:
        """Drop the cached state (after a rollback or delete rewrote history)."""
        self._latest.pop(thread_id, None)

    async def keep_latest(self, thread_id: str, reducers: Mapping[str, Reducer]) -> bool:
        """Drop every checkpoint of the thread but its newest, rewritten to hold the whole state (so the thread
        reads and continues as before). ``False`` when it has none, when a run of the thread is pending or running,
        or when a step was written meanwhile."""
        head = await self.storage.head_checkpoint(thread_id)
        if head is None:
            return False
        state = await self.at(thread_id, head.checkpoint_id, reducers)
        whole = CheckpointRow(thread_id, head.checkpoint_id, None, head.seq, head.run_id, _whole_delta(state),
                              head.next, head.metadata, head.created_at, whole=True)
        if not await self.storage.keep_only_checkpoint(whole):
            return False
        self.forget(thread_id)
        return True

    async def write(self, thread_id: str, state: ThreadState, update: Mapping[str, Any], *, next_stage: str,
                    source: str, run_id: str | None, step: int, reducers: Mapping[str, Reducer],
                    apply: bool = True, claim: RunClaim | None = None) -> CheckpointRow:
        """Record ``update`` as a new checkpoint after ``state.head``; ``apply`` merges it into ``state``.

        A run writes under its ``claim``: :class:`~backchannel.errors.LostRunError` if it no longer holds.
        """
        write = await self.prepare(thread_id, state, update, next_stage=next_stage, source=source, run_id=run_id,
                                   step=step, reducers=reducers, apply=apply)
        await self.put(state, write, claim)
        return write.row

    async def prepare(self, thread_id: str, state: ThreadState, update: Mapping[str, Any], *, next_stage: str,
                      source: str, run_id: str | None, step: int, reducers: Mapping[str, Reducer],
                      apply: bool = True) -> CheckpointWrite:
        """The checkpoint recording ``update`` after ``state.head``, made ``state``'s head (``apply`` merges the
        update into it), for :meth:`put` or a run's end to write. Until it is written the state is not the thread's
        as storage has it: reads compare the cached state's head with storage's, so none takes it for stored."""
        seq = state.seq + 1
        if not state.newest:  # a fork from an earlier checkpoint: append after the newest
            newest = await self.storage.head_checkpoint(thread_id)
            seq = max(seq, newest.seq + 1) if newest is not None else seq
        write = self._prepare(thread_id, state, update, seq, next_stage=next_stage, source=source, run_id=run_id,
                              step=step, reducers=reducers, apply=apply)
        self._remember(thread_id, state)
        return write

    def prepare_next(self, thread_id: str, state: ThreadState, update: Mapping[str, Any], *, next_stage: str,
                     source: str, run_id: str, step: int, reducers: Mapping[str, Reducer]) -> CheckpointWrite:
        """:meth:`prepare` on a state known to be the thread's newest (:meth:`held`, :meth:`blank`), without a read,
        for a write that checks it is (a run's claim writing its input): the state is cached by whoever uses it once
        that write went in (:meth:`adopt`); a cached one that did not stays cached with its head unwritten, which
        no read takes for stored."""
        return self._prepare(thread_id, state, update, state.seq + 1, next_stage=next_stage, source=source,
                             run_id=run_id, step=step, reducers=reducers, apply=True)

    def _prepare(self, thread_id: str, state: ThreadState, update: Mapping[str, Any], seq: int, *, next_stage: str,
                 source: str, run_id: str | None, step: int, reducers: Mapping[str, Reducer],
                 apply: bool) -> CheckpointWrite:
        # The messages before the step: counted now, or when the state was at its head (the caller merged it).
        before = (len(state.values.get("messages") or ()) if apply else
                  0 if state.head is None else state.counts.get(state.head.checkpoint_id))
        if apply:
            apply_update(state.values, update, reducers)
        fork = not state.newest
        parent = state.head
        row, written = self._next_row(thread_id, state, update, seq, next_stage=next_stage, source=source,
                                      run_id=run_id, step=step)
        appends = _appends(update, before, state.values)
        base = None if row.whole else self._base_if_due(state, row, appends, fork, written)
        _advance(state, row, base, update, written)
        return CheckpointWrite(row, None if row.whole or parent is None else parent.seq, base)

    async def put(self, state: ThreadState, write: CheckpointWrite, claim: RunClaim | None = None) -> None:
        """Write a checkpoint :meth:`prepare` made ``state``'s head (under the run's ``claim``)."""
        row = write.row
        if not await self.storage.put_checkpoint(row, claim, base=write.base, parent_seq=write.parent_seq):
            # Its parent is gone (its run was deleted meanwhile): the state is recorded whole.
            row.delta, row.whole = _whole_delta(state), True
            _advance(state, row, None, {}, None)
            await self.storage.put_checkpoint(row, claim)

    def adopt(self, thread_id: str, state: ThreadState) -> None:
        """Cache ``state`` as the thread's newest (its head was written by the caller)."""
        self._remember(thread_id, state)

    def _next_row(self, thread_id: str, state: ThreadState, update: Mapping[str, Any], seq: int, *,
                  next_stage: str, source: str, run_id: str | None, step: int) -> tuple[CheckpointRow, str | None]:
        """The checkpoint recording ``update`` (merged into ``state`` already) after ``state.head``, and the text of
        the messages it wrote (see :func:`_encoded`)."""
        parent = state.head
        delta, written = _encoded(update)
        state.folded += len(delta.text)
        whole = self._whole_if_due(state, update)
        return CheckpointRow(
            thread_id, new_id(), parent.checkpoint_id if parent else None, seq, run_id,
            delta if whole is None else whole, next_stage, _step_metadata(source, step), now_iso(),
            whole is not None), written

    @staticmethod
    def _base_if_due(state: ThreadState, row: CheckpointRow, appends: bool, fork: bool,
                     written: str | None) -> _Base | None:
        """The base to write with ``row``: every so many checkpoints, at a step that did more than append
        messages (the steps after a base only append), and at a fork (so a read finds the nearest base before
        a checkpoint, by seq, on its own chain). It holds the messages since the previous base, their texts as
        their steps wrote them (``written``: this step's), or all of them, encoded, after such a step or without
        a base known."""
        if appends and not fork and state.since_base + 1 < _BASE_EVERY:
            return None
        messages = state.values.get("messages") or []
        prev = state.base_id if appends else None
        if prev is not None and state.texts is not None:
            text = ",".join(t for t in (*state.texts, written) if t)
        else:
            new = messages[state.base_count:] if prev is not None else messages
            text = dumps(list(new))[1:-1] if new else ""
        rest = dumps({k: v for k, v in state.values.items() if k != "messages"})
        return _Base(row.thread_id, row.checkpoint_id, row.seq, prev, text, rest, count=len(messages))

    def _whole_if_due(self, state: ThreadState, update: Mapping[str, Any]) -> Delta | None:
        """The whole state, when a read would fold more than twice its size (looked at each time the fold doubles,
        or when the update removed most messages)."""
        if state.folded < _LOOK_FROM or (state.folded < 2 * state.looked and not _removes_most(update, state.values)):
            return None
        state.looked = state.folded
        whole = _whole_delta(state)
        return whole if state.folded > 2 * len(whole.text) else None

    async def delete_run(self, thread_id: str, run_id: str, reducers: Mapping[str, Reducer]) -> None:
        """Delete the checkpoints a run wrote. The checkpoints that followed them become whole, so every other
        checkpoint keeps its state (a run's own deleted, the thread's state is its newest left, as in LangGraph)."""
        for _ in range(_DELETE_TRIES):
            children = await self.storage.children_of_run(thread_id, run_id)
            whole = [replace(child, delta=_whole_delta(await self.at(thread_id, child.checkpoint_id, reducers,
                                                                     seq=child.seq)), whole=True)
                     for child in children]
            if await self.storage.delete_checkpoints_of_run(thread_id, run_id, whole):
                self.forget(thread_id)
                return
        raise ConflictError(f"checkpoints keep being written after those of run {run_id}: try again")


def _advance(state: ThreadState, row: CheckpointRow, base: _Base | None, update: Mapping[str, Any],
             written: str | None) -> None:
    """``row`` (recording ``update``, the state as it is now, written with ``base`` if any; ``written``: the text
    of its messages) becomes the state's head."""
    if row.whole:
        state.folded = state.looked = len(delta_text(row.delta))
        state.base_id, state.since_base = None, 0  # reads start at it: the next base, whole, comes in due time
    elif base is not None:
        state.base_id, state.base_count, state.since_base, state.texts = row.checkpoint_id, base.count, 0, []
    else:
        state.since_base += 1
        if written and state.texts is not None:
            state.texts.append(written)
        elif not written and update.get("messages"):
            state.texts = None  # messages not written from objects: the next base encodes them again
    state.count(row)
    state.head = row
    state.newest = True


@functools.lru_cache(maxsize=1024)
def _step_metadata(source: str, step: int) -> dict[str, Any]:
    """A checkpoint's metadata: one dict for every checkpoint of the same source and step (a thousand live threads
    each keep theirs), which nothing changes once made (readers copy it into what they render)."""
    return {"source": source, "step": step}


def _whole_delta(state: ThreadState) -> Delta:
    """The state as a whole checkpoint stores it (encoded now: the live values keep changing)."""
    return Delta(dumps(state.values))


@dataclass(slots=True)
class _Base(CheckpointBase):
    """A base as written, with the number of messages it makes (what the next one starts after)."""

    count: int = 0


def _encoded(update: Mapping[str, Any]) -> tuple[Delta, str | None]:
    """A step's delta, and the JSON text of the messages it wrote (joined by commas, no brackets): encoded apart,
    so a base takes them as they are."""
    messages = update.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, _MESSAGES) for m in messages):
        return Delta.of(update), None  # (a message given as a dict is read back in the form a fold gives it)
    written = dumps(messages)
    rest = {k: v for k, v in update.items() if k != "messages"}
    return Delta(f'{{"messages":{written}{"," + dumps(rest)[1:] if rest else "}"}', update), written[1:-1]


def _appends(update: Mapping[str, Any], before: int | None, values: Mapping[str, Any]) -> bool:
    """Whether a step only appended messages (or left them): none removed or replaced, the state grew by as many
    as it wrote."""
    messages = update.get("messages")
    after = len(values.get("messages") or ())
    if before is None or (messages is not None and not isinstance(messages, list)):
        return False
    written = messages or []
    return after - before == len(written) and not any(isinstance(m, RemoveMessage) for m in written)


def _base_json(bases: list[CheckpointBase]) -> dict[str, Any]:
    """The values a chain of bases holds, as JSON (messages as their dicts)."""
    return {"messages": loads(_joined_messages(bases)), **loads(bases[-1].rest)}  # in the order a fold makes


def _joined_messages(bases: list[CheckpointBase]) -> str:
    """The JSON array of a chain of bases' messages."""
    return f"[{','.join(b.messages for b in bases if b.messages)}]"


def _whole_values(delta: Mapping[str, Any]) -> dict[str, Any]:
    """The values a whole checkpoint stores, with message objects."""
    values = dict(delta)
    values["messages"] = MessageList(messages_from_input(values.get("messages") or []))
    return values


def _removes_most(update: Mapping[str, Any], values: Mapping[str, Any]) -> bool:
    """Whether an update removed at least as many messages as remain (a summary that replaced the history)."""
    messages = update.get("messages")
    if not isinstance(messages, list):
        return False
    removed = [m for m in messages if isinstance(m, RemoveMessage)]
    return bool(removed) and (any(m.id == REMOVE_ALL_MESSAGES for m in removed)
                              or len(removed) >= len(values.get("messages", ())))


def _appended(row: CheckpointRow, count: int | None, parent_count: int | None) -> int | None:
    """How many messages a step appended, if that is all it did: its delta holds only messages, and the state
    grew by as many (a replacement or a removal among them would have grown it less)."""
    if row.whole or count is None or parent_count is None:
        return None
    messages = row.delta.get("messages")
    if row.delta.keys() != {"messages"} or not isinstance(messages, list) or count - parent_count != len(messages):
        return None
    return len(messages)


def _rendered(message: AnyMessage, rendered: dict[str, tuple[AnyMessage, dict[str, Any]]]) -> dict[str, Any]:
    hit = rendered.get(message.id)
    if hit is None or hit[0] is not message:
        hit = rendered[message.id] = (message, read_only(message_to_dict(message)))
    return hit[1]


_MESSAGE_TYPES = frozenset({"human", "ai", "system", "tool"})
_MESSAGES = (HumanMessage, AIMessage, SystemMessage, ToolMessage)


def _is_stored(message: Any) -> bool:
    """Whether a stored message is a message dict as written from a message object (or a removal)."""
    if not isinstance(message, dict):
        return False
    kind = message.get("type")
    return kind == "remove" or (kind in _MESSAGE_TYPES and "id" in message and "additional_kwargs" in message)


async def _fold(bases: list[CheckpointBase], chain: list[CheckpointRow], reducers: Mapping[str, Reducer],
                wanted: set[str], text: bool) -> list[dict[str, Any]]:
    """The states at the ``wanted`` checkpoints of a chain (in its order), as JSON values; with ``text``, their
    messages as stored JSON text when the chain starts at a base."""
    if bases:
        states = _fold_appends(bases, chain, reducers, wanted, text)
        if states is not None:
            return states
    return await _fold_json(bases, chain, reducers, wanted)


def _fold_appends(bases: list[CheckpointBase], chain: list[CheckpointRow], reducers: Mapping[str, Reducer],
                  wanted: set[str], text: bool) -> list[dict[str, Any]] | None:
    """The states at the ``wanted`` checkpoints of a chain that starts at the last of ``bases``, when every step
    since only appended messages in their stored form (as the steps after a base do): the bases' messages then the
    steps', joined, not folded one by one (the bases' parsed at once); ``None`` otherwise. With ``text``, the
    messages unparsed: a list of ``orjson.Fragment`` (each several messages' texts joined by commas: encoded, the
    list is the messages' array)."""
    values: dict[str, Any] = loads(bases[-1].rest)
    steps: list[list[dict[str, Any]]] = []  # each step's messages
    marks: list[tuple[int, dict[str, Any]]] = []  # at each wanted checkpoint: the steps so far, the other values
    for i, row in enumerate(chain):
        if i:
            if row.whole:
                return None
            for key, value in loads(delta_text(row.delta)).items():
                if key != "messages":
                    values[key] = (reducers[key](values[key], value) if key in reducers and key in values
                                   else value)
                elif not isinstance(value, list) or not all(_is_stored(m) and m["type"] != "remove" for m in value):
                    return None
                elif value:
                    steps.append(value)
        if row.checkpoint_id in wanted:
            marks.append((len(steps), {**values}))
    if text:
        based = [b.messages for b in bases if b.messages]
        texts = [*based, *(dumps(s)[1:-1] for s in steps)]
        return [{"messages": [orjson.Fragment(t) for t in texts[:len(based) + n]], **rest} for n, rest in marks]
    with collector_paused():
        messages: list[dict[str, Any]] = loads(_joined_messages(bases))
    states, done = [], 0
    for k, (n, rest) in enumerate(marks):
        for step in steps[done:n]:
            messages.extend(step)
        done = n
        states.append({"messages": messages if k == len(marks) - 1 else list(messages), **rest})
    return states


async def _fold_json(bases: list[CheckpointBase], chain: list[CheckpointRow], reducers: Mapping[str, Reducer],
                     wanted: set[str]) -> list[dict[str, Any]]:
    """The states at the ``wanted`` checkpoints of a chain (in its order), folded as JSON values, from the last
    of ``bases`` when there are some (the chain's first checkpoint is its own). The deltas are parsed a slice at
    a time (their texts joined: one parse), and other tasks run between slices."""
    fold = _JSONFold(reducers)
    states = []
    if bases:
        with collector_paused():
            fold.apply(_base_json(bases), whole=True)
        if chain[0].checkpoint_id in wanted:
            states.append(fold.snapshot())
        chain = chain[1:]
    for start in range(0, len(chain), _FOLD_SLICE):
        if start:
            await asyncio.sleep(0)
        rows = chain[start:start + _FOLD_SLICE]
        for row, data in zip(rows, loads(f"[{','.join(delta_text(r.delta) for r in rows)}]"), strict=True):
            fold.apply(data, whole=row.whole)
            if row.checkpoint_id in wanted:
                states.append(fold.snapshot())
    return states


class _JSONFold:
    """A state folded from checkpoints as JSON values, messages as their dicts: what a read returns, nothing more."""

    def __init__(self, reducers: Mapping[str, Reducer]) -> None:
        self.reducers = reducers
        self.values: dict[str, Any] = {"messages": []}
        self.positions: dict[str, int] = {}

    def apply(self, data: Mapping[str, Any], *, whole: bool) -> None:
        if whole:
            self.values = {**data, "messages": []}
            self.positions = {}
        for key, value in data.items():
            if key == "messages":
                for message in _json_messages(value):
                    self._add(message)
            elif whole:
                continue
            elif key in self.reducers and key in self.values:
                self.values[key] = self.reducers[key](self.values[key], value)
            else:
                self.values[key] = value

    def _add(self, message: dict[str, Any]) -> None:
        messages, positions = self.values["messages"], self.positions
        if message["type"] == "remove":
            if message["id"] == REMOVE_ALL_MESSAGES:
                messages.clear()
                positions.clear()
            elif (at := positions.pop(message["id"], None)) is not None:
                del messages[at]
                for i in range(at, len(messages)):
                    positions[messages[i]["id"]] = i
            return
        at = positions.get(message["id"])
        if at is None:
            positions[message["id"]] = len(messages)
            messages.append(message)
        else:
            messages[at] = message

    def snapshot(self) -> dict[str, Any]:
        """The values now (the message list copied: later checkpoints change it)."""
        return {**self.values, "messages": list(self.values["messages"])}


def _json_messages(value: Any) -> list[dict[str, Any]]:
    """Stored messages as message dicts (those written from message objects already are)."""
    if isinstance(value, list) and all(_is_stored(m) for m in value):
        return value
    return [{"type": "remove", "id": m.id} if isinstance(m, RemoveMessage) else message_to_dict(m)
            for m in messages_from_input(value)]


class Recorder:
    """The :class:`~backchannel.context.StepRecorder` of one run: every agent step becomes a checkpoint.

    The run's last step (nothing left to run after it) is held, not written: the run's end writes it, in its
    transaction (:attr:`held`), and then :meth:`written` shows its checkpoint to the run's stream. Until then
    nothing says it is stored; a process that dies first leaves the run to run that step again, as a step whose
    write was lost.
    """

    __slots__ = ("checkpointer", "claim", "node_at", "bus", "thread_id", "state", "run_id", "reducers", "step_count",
                 "held", "_pending", "_unshown")

    def __init__(self, checkpointer: Checkpointer, thread_id: str, state: ThreadState, run_id: str,
                 reducers: Mapping[str, Reducer], step: int, bus: EventBus | None = None, *,
                 pending: bool = False, node_at: Callable[[str], str] | None = None,
                 claim: RunClaim | None = None) -> None:
        self.checkpointer = checkpointer
        self.claim = claim  # every write of the run carries it
        self.node_at = node_at  # the agent's node for a stage, so a checkpoint's ``next`` names nodes
        self.bus = bus
        self.thread_id = thread_id
        self.state = state
        self.run_id = run_id
        self.reducers = reducers
        self.step_count = step
        self.held: CheckpointWrite | None = None  # the run's last step, for its end to write
        self._pending = pending  # tool results of a parallel batch are stored and not yet checkpointed
        self._unshown: Event | None = None  # the held step's checkpoint event, shown once it is written

    async def step(self, node: str, update: Mapping[str, Any], next_stage: str) -> None:
        # The agent has already merged the update into the (shared) state.
        self.step_count += 1
        parent = self.state.head
        write = await self.checkpointer.prepare(self.thread_id, self.state, update, next_stage=next_stage,
                                                source="loop", run_id=self.run_id, step=self.step_count,
                                                reducers=self.reducers, apply=False)
        event = self._event(write.row, parent)
        if not next_stage:  # the run's last step
            self.held, self._unshown = write, event
            return
        await self.checkpointer.put(self.state, write, self.claim)
        if self._pending:
            # Safe after the checkpoint: a resumed run only looks up results of unanswered calls.
            await self.checkpointer.storage.clear_pending_writes(self.thread_id, self.claim)
            self._pending = False
        self._show(event)

    async def flush(self) -> None:
        if self.held is not None:
            await self.checkpointer.put(self.state, self.held, self.claim)
            self.written()

    def written(self) -> None:
        """The held step was written (with the run's end, or by :meth:`flush`): its checkpoint is shown."""
        self.held = None
        self._show(self._unshown)
        self._unshown = None

    def hide(self) -> None:
        """The held step is to be written after the run's stream has ended: its checkpoint is not shown."""
        self._unshown = None

    def _show(self, event: Event | None) -> None:
        if event is not None and self.bus is not None:
            self.bus.publish(event)

    def _event(self, row: CheckpointRow, parent: CheckpointRow | None) -> Event | None:
        """The ``checkpoint`` event of a step (``None``: nobody streams them)."""
        if self.bus is None or not self.bus.wants_values or not self.bus.listeners:
            return None
        payload = _checkpoint_payload(row, parent, self.state.values)
        if self.node_at is not None and row.next:
            payload["next"] = [self.node_at(row.next)]
        return Event("checkpoint", payload, (), "", self.thread_id, self.run_id)

    async def pending(self, tool_call_id: str, update: Mapping[str, Any]) -> None:
        self._pending = True
        await self.checkpointer.storage.put_pending_write(self.thread_id, tool_call_id, update, self.claim)


def _checkpoint_payload(row: CheckpointRow, parent: CheckpointRow | None, values: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint as LangGraph's ``checkpoints`` stream mode shows it (its values made JSON when streamed:
    converting them here, at every step of every watched run, would keep a full copy of the state per step)."""

    def config(checkpoint: CheckpointRow) -> dict[str, Any]:
        return {"configurable": {"thread_id": checkpoint.thread_id, "checkpoint_ns": "",
                                 "checkpoint_id": checkpoint.checkpoint_id}}

    return {"config": config(row), "parent_config": config(parent) if parent else None,
            "values": snapshot(values), "metadata": {**row.metadata, "run_id": row.run_id, "parents": {}},
            "next": [row.next] if row.next else [], "tasks": []}


def _same(a: CheckpointRow | None, b: CheckpointRow | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.checkpoint_id == b.checkpoint_id and a.next == b.next
