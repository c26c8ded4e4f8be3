"""Memory storage: everything in Python dicts, for tests and throwaway runtimes (``store="memory"``).

Nothing is serialised: checkpoints keep the state updates and messages as
they are (the runtime never mutates them after recording). Rows handed out
are copies, so callers cannot change stored data by accident; but a claimed
run's row is handed to its executor as it is stored (a thousand runs executing
would each keep a second copy), and the store never changes a run's row in
place: it stores a changed copy (see ``_changing``).
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from backchannel._ids import new_id
from backchannel.errors import LostRunError, NotFoundError
from backchannel.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage, ToolMessage
from backchannel.runtime.rows import (
    ACTIVE,
    AssistantRow,
    CancelAction,
    CheckpointBase,
    CheckpointRow,
    CronRow,
    Delta,
    ItemRow,
    PruneStrategy,
    RunClaim,
    RunEnd,
    RunRow,
    RunStatus,
    ThreadRow,
    ThreadStatus,
    ThreadTTL,
    assistant_sort_key,
    cron_order,
    epoch_of,
    thread_order,
)
from backchannel.runtime.storage import Notice, ParentGoneError, Storage, pick_claims

__all__ = ["MemoryStorage"]

_MESSAGE_CLASSES = frozenset({AIMessage, HumanMessage, SystemMessage, ToolMessage})
_FIELDS = {cls: operator.attrgetter(*(f.name for f in fields(cls))) for cls in (ThreadRow, RunRow, ItemRow, CronRow)}


def _copy(row: Any) -> Any:
    """A copy of a row (five times as fast as dataclasses.replace; rows are copied on every read)."""
    return type(row)(*_FIELDS[type(row)](row))


class MemoryStorage(Storage):
    """Storage in this process's memory; gone when the process ends."""

    def __init__(self) -> None:
        self._threads: dict[str, ThreadRow] = {}
        self._runs: dict[str, RunRow] = {}
        self._runs_of: dict[str, list[str]] = {}  # thread -> its run ids, oldest first
        self._spans: dict[str, list[dict[str, Any]]] = {}  # run -> the spans it recorded
        self._order: dict[str, int] = {}  # run -> creation order (ties in timestamps happen)
        self._pending: dict[str, None] = {}  # pending run ids, in creation order
        self._running_thread: dict[str, str] = {}  # thread -> its running run
        self._running_keys: Counter[str] = Counter()  # concurrency key -> running runs
        # thread -> checkpoint id -> its row, in the order written (one table: a thousand live threads each keep one)
        self._checkpoints: dict[str, dict[str, _Kept]] = {}
        self._pending_writes: dict[str, dict[str, Mapping[str, Any]]] = {}
        self._inbox: dict[str, dict[str, list[Any]]] = {}  # thread -> key -> [message, delivered]
        self._items: dict[tuple[tuple[str, ...], str], ItemRow] = {}
        self._item_ttl: dict[tuple[tuple[str, ...], str], tuple[float, float]] = {}  # item -> (minutes, expires)
        self._thread_ttl: dict[str, ThreadTTL] = {}
        self._workers: dict[str, tuple[dict[str, Any], str]] = {}
        self._crons: dict[str, CronRow] = {}
        self._assistants: dict[str, AssistantRow] = {}
        self._assistant_versions: dict[str, dict[int, AssistantRow]] = {}  # assistant -> version -> row

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    # -- threads

    async def create_thread(self, row: ThreadRow) -> bool:
        if row.thread_id in self._threads:
            return False
        self._threads[row.thread_id] = _copy(row)
        return True

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        row = self._threads.get(thread_id)
        return _copy(row) if row else None

    async def update_thread(self, thread_id: str, *, status: ThreadStatus | None = None,
                            metadata: dict[str, Any] | None = None, interrupts: list[dict[str, Any]] | None = None,
                            updated_at: str | None = None) -> None:
        row = self._threads.get(thread_id)
        if row is None:
            return
        if status is not None:
            row.status = status
        if metadata is not None:
            row.metadata = metadata
        if interrupts is not None:
            row.interrupts = interrupts
        if updated_at is not None:
            row.updated_at = updated_at

    async def delete_thread(self, thread_id: str) -> bool:
        for run_id in list(self._runs_of.get(thread_id, ())):
            await self.delete_run(run_id)
        for table in (self._runs_of, self._checkpoints, self._pending_writes, self._inbox,
                      self._thread_ttl):
            table.pop(thread_id, None)
        for cron in [c for c in self._crons.values() if c.thread_id == thread_id]:
            del self._crons[cron.cron_id]
        return self._threads.pop(thread_id, None) is not None

    def _busy(self, thread_id: str) -> bool:
        return any(self._runs[r].status in ACTIVE for r in self._runs_of.get(thread_id, ()))

    def _tasking_parents(self) -> set[str]:
        """The threads whose background tasks (threads naming them their parent) have a run pending or running."""
        return {parent for r in self._runs.values() if r.status in ACTIVE and r.thread_id in self._threads
                and (parent := self._threads[r.thread_id].metadata.get("parent_thread_id"))}

    async def delete_idle_thread(self, thread_id: str) -> bool:
        if thread_id not in self._threads or self._busy(thread_id) or thread_id in self._tasking_parents() \
                or thread_id in self._with_mail():
            return False
        return await self.delete_thread(thread_id)

    async def set_thread_ttl(self, thread_id: str, ttl: ThreadTTL) -> None:
        if thread_id in self._threads:
            self._thread_ttl[thread_id] = ttl

    async def thread_ttl(self, thread_id: str) -> ThreadTTL | None:
        return self._thread_ttl.get(thread_id)

    async def expired_threads(self, now: str, default: ThreadTTL | None, limit: int) -> list[tuple[str, PruneStrategy]]:
        found: list[tuple[str, PruneStrategy]] = []
        at = epoch_of(now)
        waiting = self._tasking_parents() | set(self._with_mail())
        for thread_id, row in self._threads.items():
            ttl = self._thread_ttl.get(thread_id, default)
            if ttl is None or epoch_of(row.updated_at) + ttl.minutes * 60 > at or self._busy(thread_id) \
                    or thread_id in waiting:
                continue
            if ttl.strategy == "keep_latest" and len(self._checkpoints.get(thread_id, ())) < 2:
                continue
            found.append((thread_id, ttl.strategy))
            if len(found) == limit:
                break
        return found

    def _matching_threads(self, metadata: dict[str, Any] | None, status: ThreadStatus | None,
                          ids: Sequence[str] | None = None) -> list[ThreadRow]:
        rows = [self._threads[i] for i in ids if i in self._threads] if ids is not None else self._threads.values()
        return [r for r in rows if (status is None or r.status == status)
                and all(r.metadata.get(k) == v for k, v in (metadata or {}).items())]

    async def search_threads(self, *, metadata: dict[str, Any] | None = None, status: ThreadStatus | None = None,
                             ids: Sequence[str] | None = None, limit: int = 10, offset: int = 0,
                             sort_by: str = "created_at", sort_order: str = "desc") -> list[ThreadRow]:
        sort_by, order = thread_order(sort_by, sort_order)
        position = {thread_id: i for i, thread_id in enumerate(self._threads)}
        rows = sorted(self._matching_threads(metadata, status, ids),
                      key=lambda r: (self._sort_key(r, sort_by), position[r.thread_id]),
                      reverse=order == "DESC")
        return [_copy(r) for r in rows[offset: offset + limit]]

    def _sort_key(self, row: ThreadRow, sort_by: str) -> str:
        if sort_by == "state_updated_at":  # when the state last changed: its newest checkpoint's time
            newest = self._newest_checkpoint(row.thread_id)
            return newest.created_at if newest is not None else row.updated_at
        return str(getattr(row, sort_by))

    async def count_threads(self, *, metadata: dict[str, Any] | None = None,
                            status: ThreadStatus | None = None) -> int:
        return len(self._matching_threads(metadata, status))

    # -- runs

    async def create_run(self, row: RunRow, *, notice: Notice | None = None) -> bool:
        if row.thread_id not in self._threads:
            return False
        row = _copy(row)
        self._runs[row.run_id] = row
        self._runs_of.setdefault(row.thread_id, []).append(row.run_id)
        self._order[row.run_id] = len(self._order)
        self._index(row)
        return True

    async def get_run(self, run_id: str) -> RunRow | None:
        row = self._runs.get(run_id)
        return _copy(row) if row else None

    def _changing(self, row: RunRow) -> RunRow:
        """A copy of a run's row, stored in its place, to change: the row it replaces may be a claim's, which its
        executor holds as it was claimed (what its exactly-once checks compare with)."""
        row = self._runs[row.run_id] = _copy(row)
        return row

    def _set_status(self, row: RunRow, status: RunStatus, updated_at: str) -> None:
        """Change a run's status, keeping the pending and running indexes in step."""
        if status != row.status:
            self._unindex(row)
            row.status = status
            self._index(row)
        row.updated_at = updated_at

    def _index(self, row: RunRow) -> None:
        if row.status == "pending":
            self._pending[row.run_id] = None
        elif row.status == "running":
            self._running_thread[row.thread_id] = row.run_id
            if row.concurrency_key:
                self._running_keys[row.concurrency_key] += 1

    def _unindex(self, row: RunRow) -> None:
        if row.status == "pending":
            self._pending.pop(row.run_id, None)
        elif row.status == "running":
            self._running_thread.pop(row.thread_id, None)
            if row.concurrency_key:
                self._running_keys[row.concurrency_key] -= 1

    async def delete_run(self, run_id: str) -> bool:
        row = self._runs.get(run_id)
        if row is None:
            return False
        self._unindex(row)
        del self._runs[run_id]
        self._spans.pop(run_id, None)
        self._order.pop(run_id, None)
        self._runs_of[row.thread_id].remove(run_id)
        return True

    async def list_runs(self, thread_id: str, *, status: RunStatus | None = None, limit: int = 10,
                        offset: int = 0) -> list[RunRow]:
        rows = [self._runs[r] for r in reversed(self._runs_of.get(thread_id, ()))]
        rows = [r for r in rows if status is None or r.status == status]
        return [_copy(r) for r in rows[offset: offset + limit]]

    async def count_runs_by_status(self) -> dict[RunStatus, int]:
        return dict(Counter(row.status for row in self._runs.values()))

    async def runs_with_status(self, statuses: Sequence[RunStatus]) -> list[RunRow]:
        found = [r for r in self._runs.values() if r.status in statuses]
        return [_copy(r) for r in sorted(found, key=lambda r: self._order[r.run_id])]

    async def active_runs(self, thread_id: str) -> list[RunRow]:
        return [_copy(self._runs[r]) for r in self._runs_of.get(thread_id, ()) if self._runs[r].status in ACTIVE]

    async def claim_runs(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        due = (row for row in map(self._runs.__getitem__, self._pending)
               if row.worker_id == worker_id and row.scheduled_at <= now and row.thread_id not in self._running_thread)
        claimed = pick_claims(due, self._running_keys, limit)
        token = new_id()
        rows = [self._changing(row) for row in claimed]
        for row in rows:
            self._set_status(row, "running", now)
            row.attempts += 1
            row.claim = token
        return rows  # not copied: the store never changes them (see _changing)

    def _held(self, claim: RunClaim | None) -> None:
        """Raise LostRunError unless the run is running under ``claim`` (no claim: nothing to check)."""
        if claim is None:
            return
        row = self._runs.get(claim.run_id)
        if row is None or row.status != "running" or row.claim != claim.token:
            raise LostRunError(f"run {claim.run_id} is no longer this process's to run")

    async def release_run(self, claim: RunClaim, now: str) -> bool:
        try:
            self._held(claim)
        except LostRunError:
            return False
        row = self._changing(self._runs[claim.run_id])
        self._set_status(row, "pending", now)
        row.attempts, row.claim = max(row.attempts - 1, 0), None
        self._pending = dict.fromkeys(sorted(self._pending, key=self._order.__getitem__))
        return True

    async def finish_run(self, end: RunEnd) -> bool:
        if end.claim is not None:
            self._held(RunClaim(end.run_id, end.claim))
        last = end.checkpoint
        if last is not None and not await self.put_checkpoint(last.row, parent_seq=last.parent_seq):
            raise ParentGoneError(f"checkpoint {last.row.checkpoint_id} has no parent any more")
        run = self._runs.get(end.run_id)
        if run is not None:
            run = self._changing(run)
            run.error, run.usage = end.error, end.usage
            self._set_status(run, end.status, end.updated_at)
            if end.spans is not None:
                self._spans[end.run_id] = end.spans
        thread = self._threads.get(end.thread_id)
        if thread is not None:
            busy = any(self._runs[r].status in ACTIVE for r in self._runs_of.get(end.thread_id, ()))
            thread.status = "busy" if busy else end.thread_status
            thread.error = end.thread_error
            thread.updated_at = end.updated_at
            if end.interrupts is not None:
                thread.interrupts = end.interrupts
        if end.checkpoint_next is not None:
            await self.set_checkpoint_next(end.thread_id, *end.checkpoint_next)
        return any(not entry[1] for entry in self._inbox.get(end.thread_id, {}).values())

    async def run_spans(self, thread_id: str) -> dict[str, list[dict[str, Any]]]:
        return {r: self._spans[r] for r in self._runs_of.get(thread_id, ()) if r in self._spans}

    async def drop_pending_run(self, run_id: str, action: CancelAction, now: str) -> bool:
        row = self._runs.get(run_id)
        if row is None or row.status != "pending":
            return False
        if action == "rollback":
            await self.delete_run(run_id)
        else:
            self._set_status(self._changing(row), "interrupted", now)
        thread = self._threads.get(row.thread_id)
        if thread is not None and thread.status == "busy" and not await self.active_runs(row.thread_id):
            thread.status = "interrupted" if thread.interrupts else "idle"
        return True

    async def requeue_orphans(self, alive_workers: Sequence[str], new_worker_id: str,
                              agents: Mapping[str, str], *, limit: int | None = None) -> list[str]:
        alive = set(alive_workers)
        digests = set(agents.values())
        orphans = sorted((r for r in self._runs.values() if r.status in ACTIVE and r.worker_id not in alive
                          and r.worker_id not in self._workers
                          and (r.agent_digest in digests if r.agent_digest else r.assistant_id in agents)),
                         key=lambda r: self._order[r.run_id])[:limit]
        for row in map(self._changing, orphans):
            self._unindex(row)
            row.status, row.worker_id, row.claim = "pending", new_worker_id, None
            self._index(row)
            thread = self._threads.get(row.thread_id)
            if thread is not None:
                thread.status = "busy"
        self._pending = dict.fromkeys(sorted(self._pending, key=self._order.__getitem__))
        return [row.run_id for row in orphans]

    # -- workers

    async def heartbeat(self, worker_id: str, info: dict[str, Any], now: str) -> bool:
        known = worker_id in self._workers
        self._workers[worker_id] = (self._workers.get(worker_id, (info, now))[0], now)
        return known

    async def workers(self) -> dict[str, tuple[dict[str, Any], str]]:
        return dict(self._workers)

    async def forget_worker(self, worker_id: str) -> None:
        self._workers.pop(worker_id, None)

    # -- checkpoints

    async def put_checkpoint(self, row: CheckpointRow, claim: RunClaim | None = None, *,
                             parent_seq: int | None = None, base: CheckpointBase | None = None) -> bool:
        # No base kept: a state in memory is folded from objects, with no text to parse.
        self._held(claim)
        by_id = self._checkpoints.setdefault(row.thread_id, {})
        if parent_seq is not None and row.parent_id not in by_id:
            return False
        by_id[row.checkpoint_id] = self._kept(row)
        return True

    def _kept(self, row: CheckpointRow) -> _Kept:
        delta = row.delta.kept_in_memory() if isinstance(row.delta, Delta) else row.delta
        return _Kept(row.thread_id, row.checkpoint_id, row.parent_id, row.seq, row.run_id, _packed_delta(delta),
                     row.next, row.metadata, row.created_at, row.whole)

    def _row(self, kept: _Kept) -> CheckpointRow:
        delta = kept.delta
        return CheckpointRow(kept.thread_id, kept.checkpoint_id, kept.parent_id, kept.seq, kept.run_id,
                             {"messages": [delta]} if type(delta) in _MESSAGE_CLASSES else delta, kept.next,
                             kept.metadata, kept.created_at, kept.whole)

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointRow | None:
        kept = self._checkpoints.get(thread_id, {}).get(checkpoint_id)
        return self._row(kept) if kept else None

    async def head_checkpoint(self, thread_id: str) -> CheckpointRow | None:
        kept = self._newest_checkpoint(thread_id)
        return self._row(kept) if kept else None

    def _newest_checkpoint(self, thread_id: str) -> _Kept | None:
        rows = self._checkpoints.get(thread_id)
        return next(reversed(rows.values())) if rows else None

    async def list_checkpoints(self, thread_id: str, *, limit: int | None = None,
                               before_seq: int | None = None) -> list[CheckpointRow]:
        rows = [r for r in reversed(self._checkpoints.get(thread_id, {}).values())
                if before_seq is None or r.seq < before_seq]
        return [self._row(r) for r in rows[:limit]]

    async def checkpoint_chain(self, thread_id: str, checkpoint_id: str, seq: int | None = None, *,
                               since: int | None = None) -> list[CheckpointRow]:
        by_id = self._checkpoints.get(thread_id, {})
        chain: list[CheckpointRow] = []
        current: str | None = checkpoint_id if checkpoint_id in by_id else None
        while current is not None:
            kept = by_id[current]
            chain.append(self._row(kept))
            current = kept.parent_id if not kept.whole and kept.parent_id in by_id else None
            if current is not None and since is not None and by_id[current].seq < since:
                current = None
        chain.reverse()
        return chain

    async def checkpoint_bases(self, thread_id: str, seq: int) -> list[CheckpointBase]:
        return []

    async def set_checkpoint_next(self, thread_id: str, checkpoint_id: str, next: str) -> None:
        kept = self._checkpoints.get(thread_id, {}).get(checkpoint_id)
        if kept is not None:
            kept.next = next

    async def children_of_run(self, thread_id: str, run_id: str) -> list[CheckpointRow]:
        rows = self._checkpoints.get(thread_id, {}).values()
        ids = {r.checkpoint_id for r in rows if r.run_id == run_id}
        return [self._row(r) for r in rows if r.run_id != run_id and not r.whole and r.parent_id in ids]

    async def delete_checkpoints_of_run(self, thread_id: str, run_id: str,
                                        whole: Sequence[CheckpointRow] = ()) -> bool:
        replaced = {r.checkpoint_id: r for r in whole}
        if {r.checkpoint_id for r in await self.children_of_run(thread_id, run_id)} - replaced.keys():
            return False
        kept = [self._kept(replaced[r.checkpoint_id]) if r.checkpoint_id in replaced else r
                for r in self._checkpoints.get(thread_id, {}).values() if r.run_id != run_id]
        self._checkpoints[thread_id] = {r.checkpoint_id: r for r in kept}
        return True

    async def keep_only_checkpoint(self, row: CheckpointRow) -> bool:
        newest = self._newest_checkpoint(row.thread_id)
        if newest is None or newest.checkpoint_id != row.checkpoint_id or self._busy(row.thread_id):
            return False
        self._checkpoints[row.thread_id] = {row.checkpoint_id: self._kept(row)}
        return True

    async def copy_checkpoints(self, thread_id: str, new_thread_id: str) -> None:
        for kept in list(self._checkpoints.get(thread_id, {}).values()):
            await self.put_checkpoint(replace(self._row(kept), thread_id=new_thread_id))

    async def put_pending_write(self, thread_id: str, key: str, value: Mapping[str, Any],
                                claim: RunClaim | None = None) -> None:
        self._held(claim)
        self._pending_writes.setdefault(thread_id, {})[key] = value

    async def pending_writes(self, thread_id: str) -> dict[str, Mapping[str, Any]]:
        return dict(self._pending_writes.get(thread_id, {}))

    async def clear_pending_writes(self, thread_id: str, claim: RunClaim | None = None) -> None:
        self._held(claim)
        self._pending_writes.pop(thread_id, None)

    # -- inbox

    async def put_inbox(self, thread_id: str, key: str, message: AnyMessage, now: str) -> bool:
        if thread_id not in self._threads:
            raise NotFoundError(f"thread {thread_id!r} not found")
        box = self._inbox.setdefault(thread_id, {})
        if key in box:
            return False
        box[key] = [message, False]
        return True

    async def inbox(self, thread_id: str) -> list[tuple[str, AnyMessage]]:
        return [(key, entry[0]) for key, entry in self._inbox.get(thread_id, {}).items() if not entry[1]]

    async def ack_inbox(self, thread_id: str, keys: Sequence[str], claim: RunClaim | None = None) -> None:
        self._held(claim)
        box = self._inbox.get(thread_id, {})
        for key in keys:
            if key in box:
                box[key][1] = True

    async def threads_with_mail(self) -> list[str]:
        return self._with_mail()

    def _with_mail(self) -> list[str]:
        return [t for t, box in self._inbox.items() if any(not entry[1] for entry in box.values())]

    # -- assistants

    async def create_assistant(self, row: AssistantRow) -> bool:
        if row.assistant_id in self._assistants:
            return False
        self._assistants[row.assistant_id] = copy.deepcopy(row)
        self._assistant_versions[row.assistant_id] = {row.version: copy.deepcopy(row)}
        return True

    async def get_assistant(self, assistant_id: str) -> AssistantRow | None:
        return copy.deepcopy(self._assistants.get(assistant_id))

    async def update_assistant(self, row: AssistantRow, seen: AssistantRow) -> AssistantRow | None:
        current = self._assistants.get(row.assistant_id)
        if current is None or (current.version, current.updated_at) != (seen.version, seen.updated_at):
            return None
        versions = self._assistant_versions[row.assistant_id]
        new = replace(copy.deepcopy(row), version=max(versions) + 1)
        versions[new.version] = replace(copy.deepcopy(new), created_at=new.updated_at)
        self._assistants[row.assistant_id] = new
        return copy.deepcopy(new)

    async def set_assistant_version(self, assistant_id: str, version: int, now: str) -> AssistantRow | None:
        current = self._assistants.get(assistant_id)
        found = self._assistant_versions.get(assistant_id, {}).get(version)
        if current is None or found is None:
            return None
        self._assistants[assistant_id] = replace(copy.deepcopy(found), created_at=current.created_at, updated_at=now)
        return copy.deepcopy(self._assistants[assistant_id])

    async def delete_assistant(self, assistant_id: str) -> bool:
        self._assistant_versions.pop(assistant_id, None)
        return self._assistants.pop(assistant_id, None) is not None

    def _matching_assistants(self, graph_ids: Sequence[str], ids: Sequence[str] | None, graph_id: str | None,
                             name: str | None, metadata: dict[str, Any] | None) -> list[AssistantRow]:
        return [a for a in self._assistants.values() if a.graph_id in graph_ids
                and (ids is None or a.assistant_id in ids) and (graph_id is None or a.graph_id == graph_id)
                and (name is None or name.lower() in a.name.lower())
                and all(a.metadata.get(k) == v for k, v in (metadata or {}).items())]

    async def search_assistants(self, *, graph_ids: Sequence[str], ids: Sequence[str] | None = None,
                                graph_id: str | None = None, name: str | None = None,
                                metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                                sort_by: str = "created_at", sort_order: str = "desc") -> list[AssistantRow]:
        rows = sorted(self._matching_assistants(graph_ids, ids, graph_id, name, metadata),
                      key=assistant_sort_key(sort_by), reverse=sort_order.lower() != "asc")
        return copy.deepcopy(rows[offset: offset + limit])

    async def count_assistants(self, *, graph_ids: Sequence[str], graph_id: str | None = None,
                               name: str | None = None, metadata: dict[str, Any] | None = None) -> int:
        return len(self._matching_assistants(graph_ids, None, graph_id, name, metadata))

    async def assistant_versions(self, assistant_id: str, *, metadata: dict[str, Any] | None = None,
                                 limit: int = 10, offset: int = 0) -> list[AssistantRow]:
        versions = self._assistant_versions.get(assistant_id, {})
        found = [v for _, v in sorted(versions.items(), reverse=True)
                 if all(v.metadata.get(k) == value for k, value in (metadata or {}).items())]
        return copy.deepcopy(found[offset: offset + limit])

    # -- items

    async def put_item(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], now: str,
                       ttl: float | None = None) -> None:
        existing = self._items.get((namespace, key))
        created = existing.created_at if existing else now
        self._items[(namespace, key)] = ItemRow(namespace, key, dict(value), created, now)
        if ttl is None:
            self._item_ttl.pop((namespace, key), None)
        else:
            self._item_ttl[(namespace, key)] = (ttl, epoch_of(now) + ttl * 60)

    def _live(self, address: tuple[tuple[str, ...], str], now: str | None, refresh: bool) -> bool:
        """Whether the item is unexpired at ``now`` (refreshing its time to live if asked)."""
        ttl = self._item_ttl.get(address)
        if ttl is None or now is None:
            return True
        at = epoch_of(now)
        if ttl[1] <= at:
            return False
        if refresh:
            self._item_ttl[address] = (ttl[0], at + ttl[0] * 60)
        return True

    async def get_item(self, namespace: tuple[str, ...], key: str, *, now: str | None = None,
                       refresh: bool = False) -> ItemRow | None:
        row = self._items.get((namespace, key))
        return _copy(row) if row and self._live((namespace, key), now, refresh) else None

    async def delete_item(self, namespace: tuple[str, ...], key: str) -> None:
        self._items.pop((namespace, key), None)
        self._item_ttl.pop((namespace, key), None)

    async def search_items(self, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, now: str | None = None,
                           refresh: bool = False) -> list[ItemRow]:
        rows = [r for (ns, key), r in self._items.items() if ns[: len(prefix)] == prefix
                and all(r.value.get(k) == v for k, v in (filter or {}).items()) and self._live((ns, key), now, False)]
        rows.sort(key=lambda r: r.updated_at, reverse=True)
        found = rows[offset: offset + limit]
        for row in found:
            self._live((row.namespace, row.key), now, refresh)
        return [_copy(r) for r in found]

    async def delete_expired_items(self, now: str) -> int:
        at = epoch_of(now)
        expired = [address for address, (_, expires) in self._item_ttl.items() if expires <= at]
        for address in expired:
            await self.delete_item(*address)
        return len(expired)

    async def list_namespaces(self, *, prefix: tuple[str, ...] = (), suffix: tuple[str, ...] = (),
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> list[tuple[str, ...]]:
        found = {ns[:max_depth] if max_depth is not None else ns for ns, _ in self._items
                 if ns[: len(prefix)] == prefix and (not suffix or ns[-len(suffix):] == suffix)}
        return sorted(found)[offset: offset + limit]

    # -- crons

    async def create_cron(self, row: CronRow) -> None:
        self._crons[row.cron_id] = _copy(row)

    async def get_cron(self, cron_id: str) -> CronRow | None:
        row = self._crons.get(cron_id)
        return _copy(row) if row else None

    async def update_cron(self, row: CronRow, *, reschedule: bool) -> bool:
        stored = self._crons.get(row.cron_id)
        if stored is None:
            return False
        self._crons[row.cron_id] = replace(row, created_at=stored.created_at,
                                           next_run_date=row.next_run_date if reschedule else stored.next_run_date)
        return True

    async def delete_cron(self, cron_id: str) -> bool:
        return self._crons.pop(cron_id, None) is not None

    def _matching_crons(self, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
                        metadata: dict[str, Any] | None) -> list[CronRow]:
        return [c for c in self._crons.values() if (assistant_id is None or c.assistant_id == assistant_id)
                and (thread_id is None or c.thread_id == thread_id) and (enabled is None or c.enabled == enabled)
                and all(c.metadata.get(k) == v for k, v in (metadata or {}).items())]

    async def search_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                           enabled: bool | None = None, metadata: dict[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, sort_by: str = "created_at", sort_order: str = "desc") -> list[CronRow]:
        sort_by, order = cron_order(sort_by, sort_order)
        position = {cron_id: i for i, cron_id in enumerate(self._crons)}
        rows = sorted(self._matching_crons(assistant_id, thread_id, enabled, metadata),
                      key=lambda c: (getattr(c, sort_by) or "", position[c.cron_id]), reverse=order == "DESC")
        return [_copy(c) for c in rows[offset: offset + limit]]

    async def count_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                          metadata: dict[str, Any] | None = None) -> int:
        return len(self._matching_crons(assistant_id, thread_id, None, metadata))

    async def due_crons(self, before: str, limit: int, assistant_ids: Sequence[str]) -> list[CronRow]:
        due = [c for c in self._crons.values() if c.enabled and c.next_run_date <= before
               and (c.end_time is None or c.next_run_date <= c.end_time) and c.assistant_id in assistant_ids]
        return [_copy(c) for c in sorted(due, key=lambda c: c.next_run_date)[:limit]]

    async def claim_cron_tick(self, cron_id: str, tick: str, next_tick: str) -> bool:
        row = self._crons.get(cron_id)
        if row is None or row.next_run_date != tick:
            return False
        row.next_run_date = next_tick
        return True


@dataclass(slots=True)
class _Kept:
    """A checkpoint as this store keeps it, its row made again when read (a thousand live threads keep several
    each): the delta of a step that wrote one message is that message, bare (no dict and list around it)."""

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    seq: int
    run_id: str | None
    delta: Any
    next: str
    metadata: dict[str, Any]
    created_at: str
    whole: bool


def _packed_delta(delta: Mapping[str, Any]) -> Any:
    """``delta`` as :class:`_Kept` holds it: ``{"messages": [message]}`` as the message object itself (a message
    given as a dict, or of a class of its own, stays in its delta)."""
    if type(delta) is dict and len(delta) == 1:
        messages = delta.get("messages")
        if type(messages) is list and len(messages) == 1 and type(messages[0]) in _MESSAGE_CLASSES:
            return messages[0]
    return delta

