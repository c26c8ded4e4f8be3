"""Rows as SQL backends store them: JSON text columns, namespaces joined into one label string.

Shared by the SQLite and Postgres backends, which store and select their
columns in the same order: rows become parameters and come back here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from backchannel.messages import AnyMessage, RemoveMessage, message_from_dict
from backchannel.runtime.rows import (
    ASSISTANT_SORT,
    AssistantRow,
    CheckpointBase,
    CheckpointRow,
    CronRow,
    Delta,
    ItemRow,
    RunRow,
    ThreadRow,
    ThreadStatus,
    cron_order,
    delta_text,
)
from backchannel.serde import json_text, loads_exact

__all__ = ["ASSISTANT_COLUMNS", "BASE_COLUMNS", "CRON_COLUMNS", "SEP", "THREAD_SORT_SQL", "THREAD_TABLES",
           "COUNTED_AS", "assistant_order", "assistant_row", "assistant_values", "base_chain", "base_values",
           "chain_is_whole", "checkpoint_chain", "checkpoint_row", "checkpoint_values", "CronSQL", "cron_row",
           "cron_values", "dump", "inbox_message", "item_row", "matching_namespaces", "run_row", "run_values",
           "thread_changes", "thread_count", "thread_row", "thread_values"]

SEP = "\x1f"  # joins namespace labels; cannot appear in a label a user types
THREAD_TABLES = ("runs", "run_spans", "checkpoints", "checkpoint_bases", "pending_writes", "inbox",  # what else
                 "crons", "thread_ttl")  # a thread owns
BASE_COLUMNS = "thread_id, checkpoint_id, seq, prev_id, messages, rest"
# What SQL sorts threads by for each sortable name: a column, or when the state last changed (the
# newest checkpoint's time; the thread's own for a thread without one).
THREAD_SORT_SQL = {"state_updated_at": "coalesce((SELECT c.created_at FROM checkpoints c WHERE c.thread_id = "
                                       "threads.thread_id ORDER BY c.seq DESC LIMIT 1), threads.updated_at)"}

# The status a thread is counted under in thread_counts (kept by triggers, see the backends' migrations), for its row
# {0} (NEW or OLD): a busy thread (a run of it pending or running) with the idle ones, so that a run's two changes
# (idle -> busy -> idle) leave the counters alone. The busy threads, as many as the runs under way, are counted
# from an index on their status when asked for (see thread_count).
COUNTED_AS = "CASE {0}.status WHEN 'busy' THEN 'idle' ELSE {0}.status END"


def thread_count(status: ThreadStatus | None, mark: str) -> tuple[str, list[Any]]:
    """The query of how many threads there are (in ``status``, if given; ``mark`` a parameter's placeholder), from
    the counts kept per status (one statement: one snapshot, so exact whoever writes meanwhile)."""
    busy = "SELECT count(*) FROM threads WHERE status = 'busy'"
    if status is None:
        return "SELECT coalesce(sum(n), 0) FROM thread_counts", []
    if status == "busy":
        return busy, []
    counted = f"SELECT coalesce(sum(n), 0) FROM thread_counts WHERE status = {mark}"
    if status == "idle":  # counted with the busy ones
        return f"SELECT ({counted}) - ({busy})", [status]
    return counted, [status]


CRON_COLUMNS = ("cron_id, assistant_id, thread_id, schedule, timezone, end_time, payload, metadata, on_run_completed, "
                "enabled, next_run_date, created_at, updated_at")
# An assistant's columns, in the assistants table and in its versions' (where the times are the version's).
ASSISTANT_COLUMNS = ("assistant_id, graph_id, version, created_at, updated_at, config, context, metadata, name, "
                     "description")


def assistant_order(sort_by: str, sort_order: str) -> str:
    """The ORDER BY of an assistant search (names and graph ids in any case, ties by id); ``ValueError`` for
    a field that is not sortable."""
    if sort_by not in ASSISTANT_SORT:
        raise ValueError(f"cannot sort assistants by {sort_by!r}; use one of {list(ASSISTANT_SORT)}")
    order = "ASC" if sort_order.lower() == "asc" else "DESC"
    column = f"lower({sort_by})" if sort_by in ("name", "graph_id") else sort_by
    return f"{column} {order}, assistant_id {order}"


_FALLBACK = json.JSONEncoder(separators=(",", ":"), default=str)  # one for all calls: json.dumps makes one each


def dump(value: Any) -> str:
    """JSON text of a row's field; objects JSON has no form for are saved as their ``str()``."""
    return json_text(value, str, _FALLBACK)


def thread_values(row: ThreadRow) -> tuple[Any, ...]:
    return (row.thread_id, row.created_at, row.updated_at, dump(row.metadata), row.status, dump(row.interrupts),
            dump(row.error) if row.error else None)


def run_values(row: RunRow) -> tuple[Any, ...]:
    return (row.run_id, row.thread_id, row.assistant_id, row.created_at, row.updated_at, row.status,
            dump(row.metadata), dump(row.kwargs), row.multitask_strategy, row.worker_id, row.scheduled_at,
            dump(row.error) if row.error else None, row.concurrency_key, row.concurrency_limit,
            dump(row.usage) if row.usage else None, row.attempts, row.claim, row.agent_digest)


def assistant_values(row: AssistantRow) -> tuple[Any, ...]:
    return (row.assistant_id, row.graph_id, row.version, row.created_at, row.updated_at, dump(row.config),
            dump(row.context), dump(row.metadata), row.name, row.description)


def assistant_row(row: tuple[Any, ...]) -> AssistantRow:
    return AssistantRow(row[0], row[1], row[2], row[3], row[4], json.loads(row[5]), json.loads(row[6]),
                        json.loads(row[7]), row[8], row[9])


def checkpoint_values(row: CheckpointRow) -> tuple[Any, ...]:
    return (row.thread_id, row.seq, row.checkpoint_id, row.parent_id, row.run_id, delta_text(row.delta), row.next,
            dump(row.metadata), row.created_at, row.whole)


def thread_changes(*, status: ThreadStatus | None, metadata: dict[str, Any] | None,
                   interrupts: list[dict[str, Any]] | None, updated_at: str | None) -> dict[str, Any]:
    """The columns an update of a thread sets (those given), with their parameters (JSON as text)."""
    changes: dict[str, Any] = {}
    if status is not None:
        changes["status"] = status
    if metadata is not None:
        changes["metadata"] = dump(metadata)
    if interrupts is not None:
        changes["interrupts"] = dump(interrupts)
    if updated_at is not None:
        changes["updated_at"] = updated_at
    return changes


def thread_row(row: tuple[Any, ...]) -> ThreadRow:
    return ThreadRow(row[0], row[1], row[2], json.loads(row[3]), row[4], json.loads(row[5]),
                     json.loads(row[6]) if row[6] else None)


def run_row(row: tuple[Any, ...]) -> RunRow:
    # Its metadata and kwargs with keys shared from row to row: a thousand running runs each hold their claimed row.
    return RunRow(row[0], row[1], row[2], row[3], row[4], row[5], loads_exact(row[6]), loads_exact(row[7]),
                  row[8], row[9], row[10], json.loads(row[11]) if row[11] else None, row[12], row[13],
                  json.loads(row[14]) if row[14] else None, row[15], row[16], row[17])


def inbox_message(text: str) -> AnyMessage:
    """A message stored in a thread's inbox (only messages go there, never removals)."""
    message = message_from_dict(json.loads(text))
    if isinstance(message, RemoveMessage):
        raise ValueError(f"an inbox holds messages, not a removal: {text[:200]}")
    return message


def checkpoint_row(row: tuple[Any, ...]) -> CheckpointRow:
    # The metadata is the checkpointer's own small dict ({"source", "step"}): orjson reads it exactly.
    return CheckpointRow(row[0], row[2], row[3], row[1], row[4], Delta(row[5]), row[6], orjson.loads(row[7]),
                         row[8], bool(row[9]))


def item_row(row: tuple[Any, ...]) -> ItemRow:
    return ItemRow(tuple(row[0].split(SEP)), row[1], json.loads(row[2]), row[3], row[4])


def checkpoint_chain(rows: Iterable[tuple[Any, ...]], checkpoint_id: str) -> list[CheckpointRow]:
    """From a thread's checkpoint rows, the chain to ``checkpoint_id`` following parents, back to the nearest
    whole checkpoint (or the first, or as far as ``rows`` go: see :func:`chain_is_whole`)."""
    by_id = {r[2]: r for r in rows}
    chain: list[CheckpointRow] = []
    current: str | None = checkpoint_id if checkpoint_id in by_id else None
    while current is not None:
        row = checkpoint_row(by_id[current])
        chain.append(row)
        current = row.parent_id if not row.whole and row.parent_id in by_id else None
    chain.reverse()
    return chain


def base_values(base: CheckpointBase) -> tuple[Any, ...]:
    return (base.thread_id, base.checkpoint_id, base.seq, base.prev_id, base.messages, base.rest)


def base_chain(thread_id: str, rows: Iterable[tuple[Any, ...]]) -> list[CheckpointBase]:
    """Bases read as ``(checkpoint_id, seq, prev_id, messages, rest, depth)`` (0 the newest), oldest first; empty
    unless each extends the next and the oldest is whole (one they extend is gone after a deletion)."""
    bases = [CheckpointBase(thread_id, r[0], int(r[1]), r[2], r[3], r[4]) for r in sorted(rows, key=lambda r: r[5])]
    linked = all(newer.prev_id == older.checkpoint_id for newer, older in zip(bases, bases[1:]))
    if not bases or not linked or bases[-1].prev_id is not None:
        return []
    bases.reverse()
    return bases


def chain_is_whole(chain: list[CheckpointRow]) -> bool:
    """Whether a chain starts at a whole checkpoint or the thread's first (not where the rows read ran out)."""
    return not chain or chain[0].whole or chain[0].parent_id is None


def matching_namespaces(joined: Iterable[str], prefix: tuple[str, ...], suffix: tuple[str, ...],
                        max_depth: int | None, limit: int, offset: int) -> list[tuple[str, ...]]:
    """The distinct stored namespaces with this prefix and suffix, cut at ``max_depth``, sorted."""
    found: set[tuple[str, ...]] = set()
    for labels in joined:
        ns = tuple(labels.split(SEP))
        if ns[: len(prefix)] != prefix or (suffix and ns[-len(suffix):] != suffix):
            continue
        found.add(ns[:max_depth] if max_depth is not None else ns)
    return sorted(found)[offset: offset + limit]


def cron_values(row: CronRow) -> tuple[Any, ...]:
    return (row.cron_id, row.assistant_id, row.thread_id, row.schedule, row.timezone, row.end_time, dump(row.payload),
            dump(row.metadata), row.on_run_completed, row.enabled, row.next_run_date, row.created_at, row.updated_at)


def cron_row(found: Sequence[Any]) -> CronRow:
    (cron_id, assistant_id, thread_id, schedule, timezone, end_time, payload, metadata, on_run_completed, enabled,
     next_run_date, created_at, updated_at) = found
    return CronRow(cron_id, assistant_id, thread_id, schedule, timezone, end_time, _json(payload), _json(metadata),
                   on_run_completed, bool(enabled), next_run_date, created_at, updated_at)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value  # Postgres hands JSONB back decoded


Statement = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class CronSQL:
    """The crons table's statements, for a backend's placeholder and SQL dialect (what differs is given)."""

    param: str  # the placeholder: "?" or "%s"
    metadata_equals: Callable[[str, Any], tuple[str, list[Any]]]  # a key of the metadata equals a value: clause, params
    any_of: Callable[[str, Sequence[str]], tuple[str, Any]]  # a column is one of the values: clause, its parameter
    insertion_order: str  # the column that breaks ties in the order crons were stored

    def insert(self, row: CronRow) -> Statement:
        return f"INSERT INTO crons ({CRON_COLUMNS}) VALUES ({', '.join([self.param] * 13)})", cron_values(row)

    def get(self, cron_id: str) -> Statement:
        return f"SELECT {CRON_COLUMNS} FROM crons WHERE cron_id = {self.param}", (cron_id,)

    def update(self, row: CronRow, *, reschedule: bool) -> Statement:
        """Storing a changed cron (see ``CronStorage.update_cron``)."""
        values = dict(zip(CRON_COLUMNS.split(", "), cron_values(row)))
        columns = [c for c in values if c not in ("cron_id", "created_at") and (reschedule or c != "next_run_date")]
        sql = f"UPDATE crons SET {', '.join(f'{c} = {self.param}' for c in columns)} WHERE cron_id = {self.param}"
        return sql, (*(values[c] for c in columns), row.cron_id)

    def delete(self, cron_id: str) -> Statement:
        return f"DELETE FROM crons WHERE cron_id = {self.param}", (cron_id,)

    def search(self, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
               metadata: dict[str, Any] | None, limit: int, offset: int, sort_by: str, sort_order: str) -> Statement:
        column, order = cron_order(sort_by, sort_order)
        where, params = self._where(assistant_id, thread_id, enabled, metadata)
        return (f"SELECT {CRON_COLUMNS} FROM crons WHERE {where} ORDER BY {column} {order}, "
                f"{self.insertion_order} {order} LIMIT {self.param} OFFSET {self.param}", (*params, limit, offset))

    def count(self, assistant_id: str | None, thread_id: str | None, metadata: dict[str, Any] | None) -> Statement:
        where, params = self._where(assistant_id, thread_id, None, metadata)
        return f"SELECT count(*) FROM crons WHERE {where}", params

    def due(self, before: str, limit: int, assistant_ids: Sequence[str]) -> Statement:
        # ticks are fixed-width UTC text: they compare as text under any collation
        clause, ids = self.any_of("assistant_id", assistant_ids)
        return (f"SELECT {CRON_COLUMNS} FROM crons WHERE enabled AND next_run_date <= {self.param} "
                f"AND (end_time IS NULL OR next_run_date <= end_time) AND {clause} "
                f"ORDER BY next_run_date LIMIT {self.param}", (before, ids, limit))

    def claim_tick(self, cron_id: str, tick: str, next_tick: str) -> Statement:
        # One statement: of the processes trying at once, the first to update the row wins; the others
        # find next_run_date no longer equal to the tick.
        return (f"UPDATE crons SET next_run_date = {self.param} WHERE cron_id = {self.param} "
                f"AND next_run_date = {self.param}", (next_tick, cron_id, tick))

    def _where(self, assistant_id: str | None, thread_id: str | None, enabled: bool | None,
               metadata: dict[str, Any] | None) -> tuple[str, tuple[Any, ...]]:
        given = [(c, v) for c, v in (("assistant_id", assistant_id), ("thread_id", thread_id), ("enabled", enabled))
                 if v is not None]
        clauses, params = ["1 = 1", *(f"{column} = {self.param}" for column, _ in given)], [v for _, v in given]
        for key, value in (metadata or {}).items():
            clause, values = self.metadata_equals(key, value)
            clauses.append(clause)
            params += values
        return " AND ".join(clauses), tuple(params)
