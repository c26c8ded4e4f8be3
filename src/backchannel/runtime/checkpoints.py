"""Checkpoints: each step's state change, recorded as a delta.

A checkpoint stores only what its step changed (the new messages, the updated
keys) and the stage the run continues at. A thread's state at a checkpoint is
the fold of the deltas from its first checkpoint along the parent links, so
storage grows linearly with the conversation. The newest state of recently
used threads is kept in memory, so a run never refolds a thread it just wrote.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from backchannel._clock import now_iso
from backchannel.errors import NotFoundError
from backchannel.events import Event, EventBus
from backchannel.messages import new_id
from backchannel.runtime.rows import CheckpointRow, RunClaim
from backchannel.runtime.storage import CheckpointStorage
from backchannel.state import MessageList, Reducer, apply_update, snapshot

__all__ = ["Checkpointer", "Recorder", "ThreadState"]

IDLE_STATES_KEPT = 512  # newest states cached beyond those of the runs executing


@dataclass(slots=True)
class ThreadState:
    """A thread's state at one checkpoint (``head`` is ``None`` for a thread with no checkpoints)."""

    values: dict[str, Any]
    head: CheckpointRow | None
    newest: bool = False  # known to be the thread's newest state: a write appends after its head

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
        state = await self.at(thread_id, head.checkpoint_id, reducers) if head else ThreadState(empty_state(), None)
        state.newest = True
        self._remember(thread_id, state)
        return state

    async def at(self, thread_id: str, checkpoint_id: str, reducers: Mapping[str, Reducer]) -> ThreadState:
        """The thread's state at ``checkpoint_id`` (a fresh copy, folded from the deltas)."""
        chain = await self.storage.checkpoint_chain(thread_id, checkpoint_id)
        if not chain:
            raise NotFoundError(f"thread {thread_id!r} has no checkpoint {checkpoint_id!r}")
        values = empty_state()
        for row in chain:
            apply_update(values, row.delta, reducers)
        return ThreadState(values, chain[-1])

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
        whole = CheckpointRow(thread_id, head.checkpoint_id, None, head.seq, head.run_id, snapshot(state.values),
                              head.next, head.metadata, head.created_at)
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
        if apply:
            apply_update(state.values, update, reducers)
        seq = state.seq + 1
        if not state.newest:
            # A fork from an earlier checkpoint: append after the newest.
            newest = await self.storage.head_checkpoint(thread_id)
            seq = max(seq, newest.seq + 1) if newest is not None else seq
        row = CheckpointRow(
            thread_id, new_id(), state.head.checkpoint_id if state.head else None, seq, run_id,
            update, next_stage, {"source": source, "step": step}, now_iso())
        await self.storage.put_checkpoint(row, claim)
        state.head = row
        state.newest = True
        self._remember(thread_id, state)
        return row


class Recorder:
    """The :class:`~backchannel.context.StepRecorder` of one run: every agent step becomes a checkpoint."""

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
        self._pending = pending  # tool results of a parallel batch are stored and not yet checkpointed

    async def step(self, node: str, update: Mapping[str, Any], next_stage: str) -> None:
        # The agent has already merged the update into the (shared) state.
        self.step_count += 1
        parent = self.state.head
        row = await self.checkpointer.write(self.thread_id, self.state, update, next_stage=next_stage,
                                            source="loop", run_id=self.run_id, step=self.step_count,
                                            reducers=self.reducers, apply=False, claim=self.claim)
        if self._pending:
            # Safe after the checkpoint: a resumed run only looks up results of unanswered calls.
            await self.checkpointer.storage.clear_pending_writes(self.thread_id, self.claim)
            self._pending = False
        if self.bus is not None and self.bus.wants_values and self.bus.listeners:
            payload = _checkpoint_payload(row, parent, self.state.values)
            if self.node_at is not None and row.next:
                payload["next"] = [self.node_at(row.next)]
            self.bus.publish(Event("checkpoint", payload, (), "", self.thread_id, self.run_id))

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
