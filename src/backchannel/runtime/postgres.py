"""Postgres storage: one database shared by any number of runtimes, on any number of machines.

``LocalRuntime("postgresql://user:pass@host/db")``, with psycopg 3 (async, a
small connection pool) from the ``postgres`` extra. Tables live in the first schema of
the connection's ``search_path``, so several deployments can share a database
(``?options=-csearch_path%3Dmyapp``).

Claims are safe between processes: a run is claimed under ``FOR UPDATE SKIP
LOCKED``, and its thread (and concurrency key) under a transaction-scoped
advisory lock, so two workers never start runs of one thread at once; a
partial unique index makes that a database invariant too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import logging
import uuid
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, TypeVar

import psycopg
from psycopg import AsyncConnection, sql

from backchannel._clock import now_iso
from backchannel._ids import new_id
from backchannel.errors import LostRunError, NotFoundError, StorageUnavailableError
from backchannel.messages import AnyMessage
from backchannel.runtime._migrations import VERSION_TABLE, to_apply
from backchannel.runtime._pgpool import ConnectionPool, unavailable
from backchannel.runtime._rows import (
    ASSISTANT_COLUMNS,
    BASE_COLUMNS,
    COUNTED_AS,
    SEP,
    THREAD_SORT_SQL,
    THREAD_TABLES,
    CronSQL,
    assistant_order,
    assistant_row,
    assistant_values,
    base_chain,
    base_values,
    chain_is_whole,
    checkpoint_chain,
    checkpoint_row,
    checkpoint_values,
    cron_row,
    dump,
    inbox_message,
    item_row,
    matching_namespaces,
    run_row,
    run_values,
    thread_changes,
    thread_count,
    thread_row,
    thread_values,
)
from backchannel.runtime.rows import (
    AssistantRow,
    CancelAction,
    CheckpointBase,
    CheckpointRow,
    CheckpointWrite,
    CronRow,
    ItemRow,
    PruneStrategy,
    RunClaim,
    RunEnd,
    RunRow,
    RunStatus,
    ThreadRow,
    ThreadStatus,
    ThreadTTL,
    delta_text,
    epoch_of,
    thread_order,
)
from backchannel.runtime.storage import MISSED, Coordinator, Notice, ParentGoneError, RunStart, Storage, StoredRun
from backchannel.serde import dumps

__all__ = ["PostgresCoordinator", "PostgresStorage", "scratch_schema"]

logger = logging.getLogger("backchannel")

T = TypeVar("T")

_ASSISTANT_TABLE = ("assistant_id TEXT NOT NULL, graph_id TEXT NOT NULL, version INTEGER NOT NULL, "
                    "created_at TEXT NOT NULL, updated_at TEXT NOT NULL, config TEXT NOT NULL, context TEXT NOT NULL, "
                    "metadata JSONB NOT NULL, name TEXT NOT NULL, description TEXT")

_COUNTS_LOCK = 0x6263_0004  # who sums the thread counts' rows (an advisory lock's first key; see the others below)
_CHANGES_SUMMED = 500  # thread status changes between two sums of the counts' rows

# The nearest base at or before a seq as one whole base: its own and the messages of those it extends joined in
# one text (one large value comes in a few reads of the socket, many rows in one read each), and the previous
# base of the oldest found (NULL when none is missing). The links are followed first, then the texts read (a
# recursive query would copy each text it carries).
_BASES = ("WITH RECURSIVE b(checkpoint_id, seq, prev_id, depth) AS ("
          "(SELECT checkpoint_id, seq, prev_id, 0 FROM checkpoint_bases "
          "WHERE thread_id = %(thread)s AND seq <= %(seq)s ORDER BY seq DESC LIMIT 1) "
          "UNION ALL SELECT c.checkpoint_id, c.seq, c.prev_id, b.depth + 1 "
          "FROM b JOIN checkpoint_bases c ON c.thread_id = %(thread)s AND c.checkpoint_id = b.prev_id "
          "AND c.seq < b.seq) "
          "SELECT (array_agg(c.checkpoint_id ORDER BY b.depth))[1], (array_agg(c.seq ORDER BY b.depth))[1], "
          "(array_agg(c.prev_id ORDER BY b.depth DESC))[1], "
          "coalesce(string_agg(c.messages, ',' ORDER BY b.depth DESC) FILTER (WHERE c.messages <> ''), ''), "
          "(array_agg(c.rest ORDER BY b.depth))[1], 0 FROM b "
          "JOIN checkpoint_bases c ON c.thread_id = %(thread)s AND c.checkpoint_id = b.checkpoint_id")

# Forward migrations, one tuple of statements per schema version (see _migrations.py).
_LISTENER_LOCK = 0x6263_0004  # a topic's channel's: shared while a message is sent to it, alone as one listens


def _threads_counted(counted_as: str) -> str:
    """The function of the thread count triggers, ``counted_as`` the status a thread is counted under ({0}: its
    row): one row a change (concurrent writers never wait for one counter's lock), all summed now and then."""
    old, new = counted_as.format("OLD"), counted_as.format("NEW")
    return f"""CREATE OR REPLACE FUNCTION threads_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN INSERT INTO thread_counts VALUES ({new}, 1);
            ELSIF TG_OP = 'DELETE' THEN INSERT INTO thread_counts VALUES ({old}, -1);
            ELSE INSERT INTO thread_counts VALUES ({old}, -1), ({new}, 1);
            END IF;
            IF nextval('thread_count_changes') % {_CHANGES_SUMMED} = 0
               AND pg_try_advisory_xact_lock({_COUNTS_LOCK}, 0) THEN
                WITH gone AS (DELETE FROM thread_counts RETURNING status, n)
                INSERT INTO thread_counts SELECT status, sum(n) FROM gone GROUP BY status;
            END IF;
            RETURN NULL;
        END $$"""


# The trigger counting a thread again when what it is counted under changes (its WHEN: no function call otherwise).
_THREADS_RECOUNTED = ("CREATE TRIGGER threads_recounted AFTER UPDATE OF status ON threads "
                      "FOR EACH ROW WHEN ({old} IS DISTINCT FROM {new}) EXECUTE FUNCTION threads_counted()")

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE threads (
            thread_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
            metadata JSONB NOT NULL, status TEXT NOT NULL, interrupts TEXT NOT NULL, error TEXT,
            seq BIGINT GENERATED ALWAYS AS IDENTITY)""",
        """CREATE TABLE runs (
            run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, assistant_id TEXT NOT NULL,
            created_at TEXT NOT NULL, updated_at TEXT NOT NULL, status TEXT NOT NULL, metadata TEXT NOT NULL,
            kwargs TEXT NOT NULL, multitask_strategy TEXT NOT NULL, worker_id TEXT, scheduled_at TEXT NOT NULL,
            error TEXT, concurrency_key TEXT, concurrency_limit INTEGER,
            seq BIGINT GENERATED ALWAYS AS IDENTITY)""",
        "CREATE INDEX runs_by_thread ON runs(thread_id, status)",
        "CREATE INDEX runs_pending ON runs(seq) WHERE status = 'pending'",
        "CREATE INDEX runs_by_worker ON runs(worker_id) WHERE status IN ('pending', 'running')",
        # One running run per thread, whatever process runs it.
        "CREATE UNIQUE INDEX one_running_run_per_thread ON runs(thread_id) WHERE status = 'running'",
        """CREATE TABLE checkpoints (
            thread_id TEXT NOT NULL, seq INTEGER NOT NULL, checkpoint_id TEXT NOT NULL, parent_id TEXT,
            run_id TEXT, delta TEXT NOT NULL, next TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL,
            PRIMARY KEY (thread_id, seq))""",
        "CREATE UNIQUE INDEX checkpoints_by_id ON checkpoints(thread_id, checkpoint_id)",
        """CREATE TABLE pending_writes (
            thread_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (thread_id, key))""",
        """CREATE TABLE inbox (
            thread_id TEXT NOT NULL, key TEXT NOT NULL, message TEXT NOT NULL, created_at TEXT NOT NULL,
            delivered BOOLEAN NOT NULL DEFAULT FALSE, seq BIGINT GENERATED ALWAYS AS IDENTITY,
            PRIMARY KEY (thread_id, key))""",
        "CREATE INDEX inbox_undelivered ON inbox(thread_id) WHERE NOT delivered",
        """CREATE TABLE items (
            namespace TEXT NOT NULL, key TEXT NOT NULL, value JSONB NOT NULL, created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL, PRIMARY KEY (namespace, key))""",
        """CREATE TABLE workers (
            worker_id TEXT PRIMARY KEY, info TEXT NOT NULL, heartbeat_at TEXT NOT NULL)""",
    ),
    (  # messages between processes too big for a NOTIFY payload
        """CREATE TABLE notifications (
            id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, payload TEXT NOT NULL,
            created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    ),
    (  # what an ended run used and did: its token usage in its row, its spans (a timeline's data) apart
        "ALTER TABLE runs ADD COLUMN usage TEXT",
        "CREATE TABLE run_spans (run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, spans TEXT NOT NULL)",
        "CREATE INDEX run_spans_by_thread ON run_spans(thread_id)",
    ),
    (  # a run's claims: attempts that did not end, the current one's token (its writes carry it), its agent
        "ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0, ADD COLUMN claim TEXT, "
        "ADD COLUMN agent_digest TEXT",
    ),
    (  # crons: schedules that start runs, each tick fired by whoever moves next_run_date past it first
        """CREATE TABLE crons (
            cron_id TEXT PRIMARY KEY, assistant_id TEXT NOT NULL, thread_id TEXT, schedule TEXT NOT NULL,
            timezone TEXT, end_time TEXT, payload TEXT NOT NULL, metadata JSONB NOT NULL, on_run_completed TEXT,
            enabled BOOLEAN NOT NULL, next_run_date TEXT NOT NULL, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
            seq BIGINT GENERATED ALWAYS AS IDENTITY)""",
        "CREATE INDEX crons_due ON crons(next_run_date) WHERE enabled",
        "CREATE INDEX crons_by_thread ON crons(thread_id)",
    ),
    (  # retention: threads' own times to live, and store items' (in minutes; expiry in epoch seconds)
        "CREATE TABLE thread_ttl (thread_id TEXT PRIMARY KEY, strategy TEXT NOT NULL, "
        "minutes DOUBLE PRECISION NOT NULL)",
        "ALTER TABLE items ADD COLUMN ttl_minutes DOUBLE PRECISION, ADD COLUMN expires_at DOUBLE PRECISION",
        "CREATE INDEX items_expiring ON items(expires_at) WHERE expires_at IS NOT NULL",
    ),
    (  # a worker's queue in order: its claims read only the runs they take, however many wait
        "CREATE INDEX pending_by_worker ON runs(worker_id, seq) WHERE status = 'pending'",
    ),
    (  # a checkpoint may hold its thread's whole state (a state is folded from the nearest one)
        "ALTER TABLE checkpoints ADD COLUMN whole BOOLEAN NOT NULL DEFAULT FALSE",
    ),
    (  # thread search and count without reading every thread: in either time's order, and by metadata
        # (containment); none on status, which changes at every run
        "CREATE INDEX threads_by_updated ON threads(updated_at, seq)",
        "CREATE INDEX threads_by_created ON threads(created_at, seq)",
        "CREATE INDEX threads_by_metadata ON threads USING gin (metadata jsonb_path_ops)",
    ),
    (  # assistants made or changed through the API, and every version each had (its times: the version's)
        f"CREATE TABLE assistants ({_ASSISTANT_TABLE}, PRIMARY KEY (assistant_id))",
        f"CREATE TABLE assistant_versions ({_ASSISTANT_TABLE}, PRIMARY KEY (assistant_id, version))",
    ),
    (  # thread counts without visiting the threads, per status: kept by triggers in the transaction of every write
        # that changes one (whichever code or process writes), each change a row of its own so concurrent writers
        # never wait for one counter's lock, summed into one row per status now and then. A metadata search or
        # count reads the GIN index: new threads go into it at once, not into a list of pending entries that
        # every search scans until a vacuum merges it (8 ms a search after 100,000 new threads, 2 ms merged).
        "CREATE TABLE thread_counts (status TEXT NOT NULL, n BIGINT NOT NULL)",
        "CREATE SEQUENCE thread_count_changes",
        _threads_counted("{0}.status"),
        "CREATE TRIGGER threads_counted AFTER INSERT OR DELETE ON threads "
        "FOR EACH ROW EXECUTE FUNCTION threads_counted()",
        _THREADS_RECOUNTED.format(old="OLD.status", new="NEW.status"),
        "INSERT INTO thread_counts SELECT status, count(*) FROM threads GROUP BY status",
        "ALTER INDEX threads_by_metadata SET (fastupdate = off)",
        "SELECT gin_clean_pending_list('threads_by_metadata'::regclass)",
    ),
    (  # a thread's messages as JSON text every so many checkpoints (see checkpoints.py): a read of a long thread
        # joins these texts and folds the few deltas since, instead of parsing every delta from the first
        "CREATE TABLE checkpoint_bases (thread_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, seq BIGINT NOT NULL, "
        "prev_id TEXT, messages TEXT NOT NULL, rest TEXT NOT NULL, PRIMARY KEY (thread_id, checkpoint_id))",
        "CREATE INDEX checkpoint_bases_by_seq ON checkpoint_bases(thread_id, seq)",
    ),
    (  # who listens to a topic's channel (a listening connection's backend): a topic's message is sent only to
        # a channel somebody listens to, looked for after a lock its listeners take as they begin (see
        # PostgresCoordinator), so one that begins as it is sent either hears it or sees what it said
        "CREATE TABLE listeners (channel TEXT NOT NULL, pid INTEGER NOT NULL, PRIMARY KEY (channel, pid))",
        f"""CREATE FUNCTION notify_listeners(target TEXT, payload TEXT) RETURNS void LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            PERFORM pg_advisory_xact_lock_shared({_LISTENER_LOCK}, hashtext(target));
            IF EXISTS (SELECT 1 FROM listeners WHERE channel = target) THEN
                PERFORM pg_notify(target, payload);
            END IF;
        END $$""",
    ),
    (  # the transaction that made each run: a thread's follower reads back the runs made since it noted where
        # they began (a snapshot, see PostgresStorage.runs_since), exactly, whatever the processes' clocks say.
        # Older runs have none (made before any follower noted where). No default in the ADD: no table rewrite.
        "ALTER TABLE runs ADD COLUMN made_in xid8",
        "ALTER TABLE runs ALTER COLUMN made_in SET DEFAULT pg_current_xact_id()",
    ),
    (  # the runs running under a concurrency key (every background subagent's run has one), counted at a claim
        # without reading every running run
        "CREATE INDEX runs_running_by_key ON runs(concurrency_key) WHERE status = 'running' "
        "AND concurrency_key IS NOT NULL",
    ),
    (  # whether a thread has mail waiting, read with a snapshot of its own (VOLATILE): a run's end calls it once
        # its statement holds the thread's row, and sees the mail stored before it took the lock
        """CREATE FUNCTION undelivered_mail(thread TEXT) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
            RETURN EXISTS (SELECT 1 FROM inbox WHERE thread_id = thread AND NOT delivered);
        END $$""",
    ),
    (  # no thread count trigger for a run's idle -> busy -> idle (two calls of the function a run, each ~20 us of
        # the backend's CPU): busy threads are counted with the idle ones (COUNTED_AS), and read from an index of the
        # busy ones when asked for (as many as the runs under way). Dropping the trigger first locks the threads
        # against writers (until this commits), so the counts relabelled are all there are.
        "DROP TRIGGER threads_recounted ON threads",
        _threads_counted(COUNTED_AS),
        _THREADS_RECOUNTED.format(old=COUNTED_AS.format("OLD"), new=COUNTED_AS.format("NEW")),
        "UPDATE thread_counts SET status = 'idle' WHERE status = 'busy'",
        "CREATE INDEX threads_busy ON threads(thread_id) WHERE status = 'busy'",
    ),
)
_ASSISTANT_SELECT = ASSISTANT_COLUMNS.replace("metadata", "metadata::text")
_ASSISTANT_VALUES = "%s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s, %s"

_THREAD_COLUMNS = "thread_id, created_at, updated_at, metadata::text, status, interrupts, error"
_RUN_COLUMNS = ("run_id, thread_id, assistant_id, created_at, updated_at, status, metadata, kwargs, "
                "multitask_strategy, worker_id, scheduled_at, error, concurrency_key, concurrency_limit, usage, "
                "attempts, claim, agent_digest")
# What claiming a run changes in its row (index in the run's values, and column).
_CLAIMED = tuple((_RUN_COLUMNS.split(", ").index(column), column) for column in ("status", "attempts", "claim"))
# A run's write under a claim (see the fencing rule): the claim's run row, locked against a take-over until
# the write commits (FOR SHARE; FOR UPDATE by the run's end); a take-over that committed first makes it empty.
_HELD = "SELECT 1 FROM runs WHERE run_id = %(run)s AND claim = %(claim)s AND status = 'running'"
_CHECKPOINT_COLUMNS = "thread_id, seq, checkpoint_id, parent_id, run_id, delta, next, metadata, created_at, whole"
# The checkpoints of other runs (or of none) whose parent a run wrote.
_CHILDREN_OF_RUN = ("thread_id = %(thread)s AND run_id IS DISTINCT FROM %(run)s AND NOT whole AND parent_id IN "
                    "(SELECT checkpoint_id FROM checkpoints WHERE thread_id = %(thread)s AND run_id = %(run)s)")
_ITEM_COLUMNS = "namespace, key, value::text, created_at, updated_at, ttl_minutes"
_ACTIVE_RUN = "SELECT 1 FROM runs WHERE thread_id = %s AND status IN ('pending', 'running')"

# Keys of the advisory locks (the first of their two int4 keys): who migrates, who claims a thread or key.
_MIGRATION_LOCK = 0x6263_0001
_THREAD_LOCK = 0x6263_0002
_KEY_LOCK = 0x6263_0003
_RETRY_FIRST, _RETRY_MAX = 0.05, 1.0  # seconds between attempts to reach the database again
_NOTIFY_LIMIT = 7900  # bytes: Postgres refuses a NOTIFY payload of 8000 or more
# The threads whose background tasks (threads naming them their parent) have a run pending or running: their
# reports are still to come, so their TTL waits (the report's wake-up run starts it again).
_NOTHING_TO_COME = ("t.thread_id NOT IN (SELECT c.metadata ->> 'parent_thread_id' FROM runs r JOIN threads c "
                    "ON c.thread_id = r.thread_id WHERE r.status IN ('pending', 'running') "
                    "AND c.metadata ->> 'parent_thread_id' IS NOT NULL) "
                    "AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.thread_id = t.thread_id AND NOT i.delivered)")
_NOTIFY = "SELECT pg_notify(%s, %s)"
# A run's insert, on a thread that exists (its row locked, shared: a delete of the thread waits for this commit and
# then deletes the run too, or has committed already and the run is not inserted).
_CREATE_RUN = (f"INSERT INTO runs ({_RUN_COLUMNS}) SELECT {', '.join(['%s'] * 18)} "
               "WHERE EXISTS (SELECT 1 FROM threads WHERE thread_id = %s FOR SHARE)")
# A topic's: sent only if somebody listens to its channel. The function is VOLATILE: its look for listeners sees
# what committed once its lock is granted (a statement's own snapshot is taken before it waits).
_NOTIFY_LISTENERS = "SELECT notify_listeners(%s, %s)"
_TIDY_EVERY = 60.0  # seconds between deletions of old big payloads
_CRONS = CronSQL("%s", metadata_equals=lambda key, value: (_json_equals("metadata"), [key, dump(value)]),
                 any_of=lambda column, values: (f"{column} = ANY(%s)", list(values)), insertion_order="seq")


@contextmanager
def scratch_schema(url: str, prefix: str = "scratch") -> Iterator[str]:
    """A URL whose tables go to a new schema of the database at ``url``, dropped afterwards (tests, benchmarks)."""
    schema = f"{prefix}_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


class PostgresStorage(Storage):
    """Storage in a Postgres database, through a pool of async psycopg connections."""

    batches_reads = True  # (see _fetch)

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = _psycopg_url(url)
        self.max_connections = max_connections
        self._pool: ConnectionPool | None = None
        self._writes: list[_Statement] = []  # queued for the next batch
        self._reads: list[_Statement] = []  # made in this tick, sent together once it ends
        self._writer: asyncio.Task[None] | None = None
        self._readers: set[asyncio.Task[None]] = set()

    @property
    def pool(self) -> ConnectionPool:
        if self._pool is None:
            raise RuntimeError("the storage is not open")
        return self._pool

    async def open(self) -> None:
        if self._pool is not None:
            return
        # A first connection of its own: an unreachable database fails here with its real error
        # (the pool would retry until a timeout), and the schema is migrated before any use.
        async with await AsyncConnection.connect(self.url, autocommit=True) as conn:
            await _migrate(conn, _describe(self.url))
        self._pool = ConnectionPool(self.url, self.max_connections)

    async def close(self) -> None:
        if self._writer is not None:
            await asyncio.wait([self._writer])  # the writes already made
        if self._readers:
            await asyncio.wait(self._readers)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()

    # Reads may be cut off by a cancellation (their connection is then dropped). Writes are batched:
    # those made in one event-loop tick go to the database together, in one transaction (one commit,
    # and a round trip for all), one batch after the other so they apply in the order they were made.
    # A writer gets its answer once its batch is committed; a cancelled writer's write still happens.

    async def _one(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *,
                   batched: bool = True) -> tuple[Any, ...] | None:
        """One row, by key (batched with the tick's other reads: see _fetch), or a count (not batched)."""
        return await self._fetch(sql, params, "one", batched)

    async def _all(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = (), *,
                   batched: bool = False) -> list[tuple[Any, ...]]:
        """Rows: lists and searches go alone (a slow one holds no other read), a few rows by key may be batched."""
        return await self._fetch(sql, params, "all", batched)

    async def _write(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        """Run one statement; returns how many rows it changed."""
        return await self._queue(sql, params, "rowcount")

    async def _write_one(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> tuple[Any, ...] | None:
        """Run one statement that changes rows and returns one."""
        return await self._queue(sql, params, "one")

    def _queue(self, sql: str, params: Sequence[Any] | Mapping[str, Any], what: str) -> asyncio.Future[Any]:
        if self._pool is None:
            raise RuntimeError("the storage is not open")
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._writes.append(_Statement(sql, params, what, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write_batches())
        return done

    async def _write_batches(self) -> None:
        while self._writes:
            await asyncio.sleep(0)  # the rest of this tick's writes join the batch
            batch, self._writes = self._writes, []
            try:
                async with self.pool.connection() as conn:
                    await _run_batch(conn, batch)
            except BaseException as exc:  # no connection (or the storage closed): every write of the batch fails
                _fail_all(batch, exc if isinstance(exc, Exception) else
                             StorageUnavailableError("the storage closed before the write was made"))
                if not isinstance(exc, Exception):
                    raise

    async def _fetch(self, sql: str, params: Sequence[Any] | Mapping[str, Any], what: str,
                     batched: bool = False) -> Any:
        if not batched:
            async with self.pool.connection() as conn:
                return await _result(await conn.execute(sql, params), what)
        # Quick reads made in one tick go together, pipelined on one connection (a round trip for all of them;
        # concurrent requests' reads often come in one tick, woken by one commit or one socket read).
        if self._pool is None:
            raise RuntimeError("the storage is not open")
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._reads.append(_Statement(sql, params, what, done))
        if len(self._reads) == 1:
            asyncio.get_running_loop().call_soon(self._send_reads)
        return await done

    async def _fetch_together(self, *reads: tuple[str, Sequence[Any] | Mapping[str, Any], str]) -> list[Any]:
        """Reads that belong together, pipelined on a connection of their own (not batched with the tick's point
        reads: they may be slow): one round trip, one snapshot."""
        futures = [asyncio.get_running_loop().create_future() for _ in reads]
        async with self.pool.connection() as conn:
            await _run_batch(conn, [_Statement(sql, params, what, done) for (sql, params, what), done
                                    in zip(reads, futures)])
        return await asyncio.gather(*futures)

    def _send_reads(self) -> None:
        batch, self._reads = self._reads, []
        task = asyncio.ensure_future(self._read_batch(batch))
        self._readers.add(task)
        task.add_done_callback(self._readers.discard)

    async def _read_batch(self, batch: list[_Statement]) -> None:
        try:
            async with self.pool.connection() as conn:
                await _run_batch(conn, batch)
        except BaseException as exc:  # no connection (or the storage closed): every read of the batch fails
            _fail_all(batch, exc if isinstance(exc, Exception) else
                         StorageUnavailableError("the storage closed before the read was made"))
            if not isinstance(exc, Exception):
                raise

    # -- threads

    async def create_thread(self, row: ThreadRow) -> bool:
        return bool(await self._write(
            "INSERT INTO threads VALUES (%s, %s, %s, %s::jsonb, %s, %s, %s) ON CONFLICT (thread_id) DO NOTHING",
            thread_values(row)))

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        found = await self._one(f"SELECT {_THREAD_COLUMNS} FROM threads WHERE thread_id = %s", (thread_id,))
        return thread_row(found) if found else None

    async def update_thread(self, thread_id: str, *, status: ThreadStatus | None = None,
                            metadata: dict[str, Any] | None = None, interrupts: list[dict[str, Any]] | None = None,
                            updated_at: str | None = None) -> None:
        changes = thread_changes(status=status, metadata=metadata, interrupts=interrupts, updated_at=updated_at)
        if changes:
            columns = ", ".join(f"{column} = %s::jsonb" if column == "metadata" else f"{column} = %s"
                                for column in changes)
            await self._write(f"UPDATE threads SET {columns} WHERE thread_id = %s", (*changes.values(), thread_id))

    async def delete_thread(self, thread_id: str) -> bool:
        return await _whole(_again_if_deadlocked(lambda: self._delete_thread(thread_id)))

    async def _delete_thread(self, thread_id: str) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            deleted = (await conn.execute("DELETE FROM threads WHERE thread_id = %s", (thread_id,))).rowcount
            for table in THREAD_TABLES:
                await conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))
        return bool(deleted)

    async def delete_idle_thread(self, thread_id: str) -> bool:
        return await _whole(_again_if_deadlocked(lambda: self._delete_idle_thread(thread_id)))

    async def _delete_idle_thread(self, thread_id: str) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            if not await self._lock_idle_thread(conn, thread_id):
                return False
            waiting = f"SELECT 1 FROM threads t WHERE t.thread_id = %(thread)s AND NOT ({_NOTHING_TO_COME})"
            if await (await conn.execute(waiting, {"thread": thread_id})).fetchone() is not None:
                return False
            await conn.execute("DELETE FROM threads WHERE thread_id = %s", (thread_id,))
            for table in THREAD_TABLES:
                await conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (thread_id,))
        return True

    @staticmethod
    async def _lock_idle_thread(conn: AsyncConnection[Any], thread_id: str) -> bool:
        """Lock the thread's row (a run queued on it waits for the transaction) and say whether it exists with no
        pending or running run; the second statement sees runs committed while the lock was awaited."""
        if await (await conn.execute("SELECT 1 FROM threads WHERE thread_id = %s FOR UPDATE",
                                     (thread_id,))).fetchone() is None:
            return False
        return await (await conn.execute(_ACTIVE_RUN, (thread_id,))).fetchone() is None

    async def set_thread_ttl(self, thread_id: str, ttl: ThreadTTL) -> None:
        await self._write("INSERT INTO thread_ttl SELECT thread_id, %s, %s FROM threads WHERE thread_id = %s "
                          "ON CONFLICT (thread_id) DO UPDATE SET strategy = excluded.strategy, "
                          "minutes = excluded.minutes", (ttl.strategy, ttl.minutes, thread_id))

    async def thread_ttl(self, thread_id: str) -> ThreadTTL | None:
        found = await self._one("SELECT strategy, minutes FROM thread_ttl WHERE thread_id = %s", (thread_id,))
        return ThreadTTL(found[0], found[1]) if found else None

    async def expired_threads(self, now: str, default: ThreadTTL | None, limit: int) -> list[tuple[str, PruneStrategy]]:
        strategy, minutes = default or (None, None)
        rows = await self._fetch(
            "SELECT t.thread_id, coalesce(x.strategy, %(strategy)s) FROM threads t "
            "LEFT JOIN thread_ttl x ON x.thread_id = t.thread_id "
            "WHERE extract(epoch FROM t.updated_at::timestamptz) + coalesce(x.minutes, %(minutes)s) * 60 <= %(now)s "
            "AND t.status <> 'busy' "
            f"AND NOT EXISTS ({_ACTIVE_RUN.replace('%s', 't.thread_id')}) "
            f"AND {_NOTHING_TO_COME} "
            "AND (coalesce(x.strategy, %(strategy)s) = 'delete' "
            "     OR EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id AND c.parent_id IS NOT NULL)) "
            "LIMIT %(limit)s", {"strategy": strategy, "minutes": minutes, "now": epoch_of(now), "limit": limit}, "all")
        return [(thread_id, found) for thread_id, found in rows]

    def _thread_filter(self, metadata: dict[str, Any] | None, status: ThreadStatus | None,
                       ids: Sequence[str] | None = None) -> tuple[str, list[Any]]:
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        for key, value in (metadata or {}).items():
            if value is not None:  # implied by the equality below, and answered by the index on metadata
                clauses.append("metadata @> jsonb_build_object(%s::text, %s::jsonb)")
                params += [key, dump(value)]
            clauses.append(_json_equals("metadata"))
            params += [key, dump(value)]
        if status is not None:
            clauses.append("status = %s")
            params.append(status)
        if ids is not None:
            clauses.append("thread_id = ANY(%s)")
            params.append(list(ids))
        return " AND ".join(clauses), params

    async def search_threads(self, *, metadata: dict[str, Any] | None = None, status: ThreadStatus | None = None,
                             ids: Sequence[str] | None = None, limit: int = 10, offset: int = 0,
                             sort_by: str = "created_at", sort_order: str = "desc") -> list[ThreadRow]:
        sort_by, order = thread_order(sort_by, sort_order)
        where, params = self._thread_filter(metadata, status, ids)
        rows = await self._all(f"SELECT {_THREAD_COLUMNS} FROM threads WHERE {where} "
                               f"ORDER BY {THREAD_SORT_SQL.get(sort_by, sort_by)} {order}, seq {order} "
                               "LIMIT %s OFFSET %s", (*params, limit, offset))
        return [thread_row(r) for r in rows]

    async def count_threads(self, *, metadata: dict[str, Any] | None = None,
                            status: ThreadStatus | None = None) -> int:
        if metadata:
            where, params = self._thread_filter(metadata, status)
            found = await self._one(f"SELECT count(*) FROM threads WHERE {where}", params, batched=False)
        else:  # the counts kept per status
            found = await self._one(*thread_count(status, "%s"), batched=False)
        assert found is not None
        return int(found[0])

    # -- assistants

    async def create_assistant(self, row: AssistantRow) -> bool:
        values = assistant_values(row)
        return bool(await self._write(
            f"WITH a AS (INSERT INTO assistants VALUES ({_ASSISTANT_VALUES}) ON CONFLICT (assistant_id) DO NOTHING "
            f"RETURNING 1) INSERT INTO assistant_versions SELECT {_ASSISTANT_VALUES} WHERE EXISTS (SELECT 1 FROM a)",
            (*values, *values)))

    async def get_assistant(self, assistant_id: str) -> AssistantRow | None:
        found = await self._one(f"SELECT {_ASSISTANT_SELECT} FROM assistants WHERE assistant_id = %s", (assistant_id,))
        return assistant_row(found) if found else None

    async def update_assistant(self, row: AssistantRow, seen: AssistantRow) -> AssistantRow | None:
        # The assistant's row locked as seen (a concurrent update that came first leaves nothing to lock):
        # the version after its newest is then its own.
        found = await self._write_one(
            "WITH seen AS (SELECT assistant_id FROM assistants WHERE assistant_id = %(id)s AND version = %(seen)s "
            "  AND updated_at = %(seen_at)s FOR UPDATE), "
            "n AS (SELECT coalesce(max(version), 0) + 1 AS version FROM assistant_versions "
            "  WHERE assistant_id = %(id)s), "
            "a AS (UPDATE assistants SET graph_id = %(graph)s, version = (SELECT version FROM n), "
            "  created_at = %(created)s, updated_at = %(at)s, config = %(config)s, context = %(context)s, "
            "  metadata = %(metadata)s::jsonb, name = %(name)s, description = %(description)s "
            "  WHERE assistant_id IN (SELECT assistant_id FROM seen) RETURNING version) "
            "INSERT INTO assistant_versions SELECT %(id)s, %(graph)s, version, %(at)s, %(at)s, %(config)s, "
            "  %(context)s, %(metadata)s::jsonb, %(name)s, %(description)s FROM a RETURNING version",
            {"id": row.assistant_id, "seen": seen.version, "seen_at": seen.updated_at, "graph": row.graph_id,
             "created": row.created_at, "at": row.updated_at, "config": dump(row.config),
             "context": dump(row.context), "metadata": dump(row.metadata), "name": row.name,
             "description": row.description})
        return replace(row, version=found[0]) if found else None

    async def set_assistant_version(self, assistant_id: str, version: int, now: str) -> AssistantRow | None:
        found = await self._write_one(
            "UPDATE assistants a SET graph_id = v.graph_id, version = v.version, updated_at = %s, config = v.config, "
            "  context = v.context, metadata = v.metadata, name = v.name, description = v.description "
            "FROM assistant_versions v WHERE a.assistant_id = %s AND v.assistant_id = a.assistant_id "
            f"  AND v.version = %s RETURNING {', '.join('a.' + c for c in _ASSISTANT_SELECT.split(', '))}",
            (now, assistant_id, version))
        return assistant_row(found) if found else None

    async def delete_assistant(self, assistant_id: str) -> bool:
        return bool(await self._write(
            "WITH v AS (DELETE FROM assistant_versions WHERE assistant_id = %(id)s) "
            "DELETE FROM assistants WHERE assistant_id = %(id)s", {"id": assistant_id}))

    def _assistant_filter(self, graph_ids: Sequence[str], ids: Sequence[str] | None, graph_id: str | None,
                          name: str | None, metadata: dict[str, Any] | None) -> tuple[str, list[Any]]:
        clauses: list[str] = ["graph_id = ANY(%s)"]
        params: list[Any] = [list(graph_ids)]
        if ids is not None:
            clauses.append("assistant_id = ANY(%s)")
            params.append(list(ids))
        if graph_id is not None:
            clauses.append("graph_id = %s")
            params.append(graph_id)
        if name is not None:
            clauses.append("strpos(lower(name), lower(%s)) > 0")
            params.append(name)
        for key, value in (metadata or {}).items():
            clauses.append(_json_equals("metadata"))
            params += [key, dump(value)]
        return " AND ".join(clauses), params

    async def search_assistants(self, *, graph_ids: Sequence[str], ids: Sequence[str] | None = None,
                                graph_id: str | None = None, name: str | None = None,
                                metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                                sort_by: str = "created_at", sort_order: str = "desc") -> list[AssistantRow]:
        order = assistant_order(sort_by, sort_order)
        where, params = self._assistant_filter(graph_ids, ids, graph_id, name, metadata)
        rows = await self._all(f"SELECT {_ASSISTANT_SELECT} FROM assistants WHERE {where} ORDER BY {order} "
                               "LIMIT %s OFFSET %s", (*params, limit, offset))
        return [assistant_row(r) for r in rows]

    async def count_assistants(self, *, graph_ids: Sequence[str], graph_id: str | None = None,
                               name: str | None = None, metadata: dict[str, Any] | None = None) -> int:
        where, params = self._assistant_filter(graph_ids, None, graph_id, name, metadata)
        found = await self._one(f"SELECT count(*) FROM assistants WHERE {where}", params, batched=False)
        assert found is not None
        return int(found[0])

    async def assistant_versions(self, assistant_id: str, *, metadata: dict[str, Any] | None = None,
                                 limit: int = 10, offset: int = 0) -> list[AssistantRow]:
        clauses, params = ["assistant_id = %s"], [assistant_id]
        for key, value in (metadata or {}).items():
            clauses.append(_json_equals("metadata"))
            params += [key, dump(value)]
        rows = await self._all(f"SELECT {_ASSISTANT_SELECT} FROM assistant_versions WHERE {' AND '.join(clauses)} "
                               "ORDER BY version DESC LIMIT %s OFFSET %s", (*params, limit, offset))
        return [assistant_row(r) for r in rows]

    # -- runs

    claims_on_insert = True

    async def create_run(self, row: RunRow, *, notice: Notice | None = None) -> bool:
        params = (*run_values(row), row.thread_id)
        if notice is None:
            return bool(await self._write(_CREATE_RUN, params))
        found = await self._write_one(f"WITH i AS ({_CREATE_RUN} RETURNING 1), {_notified('i')} "
                                      "SELECT (SELECT count(*) FROM i), (SELECT count(*) FROM n)", (*params, *notice))
        return bool(found and found[0])

    async def create_claimed_run(self, row: RunRow, claim: str, *, thread: ThreadRow | None = None,
                                 start: RunStart | None = None, notice: Notice | None = None) -> StoredRun | None:
        # Queued with the tick's other writes: no claim transaction of its own. On a thread that exists, running
        # only if it is busy (as this run's writes made it, earlier in the batch) with no other run, and its claim
        # lock is free (no claim of it under way); a run made running elsewhere meanwhile makes the insert
        # conflict (one running run per thread), and it goes pending. The thread's row is locked (shared) as
        # create_run locks it: a delete of the thread waits for this commit, or has committed and nothing goes in.
        # A thread made here has nothing else (no run or mail is stored for a thread before it exists, and its
        # deletion took its checkpoints; looked at all the same), so its run is claimed, with its first checkpoint;
        # one made meanwhile by another request is made busy here instead, and its run goes pending.
        running = replace(row, status="running", attempts=1, claim=claim)
        # The run's pending insert takes the claimed one's values but those the claim sets: 48 parameters at most,
        # under psycopg's limit for caching a statement's parsing (50; it parsed this one at every run).
        params: dict[str, Any] = {"thread": row.thread_id, "lock": _THREAD_LOCK,
                                  **{f"r{i}": v for i, v in enumerate(run_values(running))},
                                  **{f"p{i}": getattr(row, column) for i, column in _CLAIMED}}
        if thread is not None:
            params.update({f"t{i}": v for i, v in enumerate(thread_values(thread))})
        # The run's first checkpoint, only on a thread made here (with the run claimed). A thread that exists is not
        # looked at: its start would be made before the statement, on the state this process holds, which a run of
        # the thread executing here (or another start) may share, and changed whether or not it is written.
        written = start() if start is not None and thread is not None and start.parent is None else None
        if written is not None:
            params.update({f"c{i}": v for i, v in enumerate(checkpoint_values(written.row))})
            if written.base is not None:
                params.update({f"b{i}": v for i, v in enumerate(base_values(written.base))})
        if notice is not None:
            params["nc"], params["np"] = notice
        found = await self._write_one(_claim_on_insert(thread is not None, written is not None,
                                                       written is not None and written.base is not None,
                                                       notice is not None), params)
        if thread is not None and found and not any(found):
            # Made by another request whose commit this statement waited for: not in the statement's view, so
            # the run goes in after it, as on any thread that exists.
            stored, _ = await asyncio.gather(self.create_run(row, notice=notice), self.update_thread(
                thread.thread_id, status="busy", metadata=thread.metadata, updated_at=thread.updated_at))
            return StoredRun("pending", known=False) if stored else None
        if not found or not (found[0] or found[1]):
            return None
        # Claimed on a thread that exists only where it was busy with no other run: not looked at for being blank.
        return StoredRun("running", known=thread is not None and start is not None and start.parent is None) \
            if found[0] else StoredRun("pending", known=False)

    async def get_run(self, run_id: str) -> RunRow | None:
        found = await self._one(f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = %s", (run_id,))
        return run_row(found) if found else None

    async def delete_run(self, run_id: str) -> bool:
        return bool(await self._write_one(
            "WITH s AS (DELETE FROM run_spans WHERE run_id = %(run)s) "
            "DELETE FROM runs WHERE run_id = %(run)s RETURNING 1", {"run": run_id}))

    async def list_runs(self, thread_id: str, *, status: RunStatus | None = None, limit: int = 10,
                        offset: int = 0) -> list[RunRow]:
        where, params = "thread_id = %s", [thread_id]
        if status is not None:
            where += " AND status = %s"
            params.append(status)
        rows = await self._all(f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where} ORDER BY seq DESC LIMIT %s OFFSET %s",
                               (*params, limit, offset))
        return [run_row(r) for r in rows]

    async def count_runs_by_status(self) -> dict[RunStatus, int]:
        return {status: count for status, count in await self._all("SELECT status, count(*) FROM runs GROUP BY status",
                                                                    ())}

    async def run_position(self) -> str:
        # The database's snapshot: a run made in a transaction it does not see was made after it, whenever that
        # transaction began and whatever the clocks of the processes involved.
        found = await self._one("SELECT pg_current_snapshot()::text")
        assert found is not None
        return str(found[0])

    async def runs_since(self, thread_id: str, position: str | None) -> tuple[list[RunRow], str | None]:
        # The runs and the snapshot they were read in, in one statement: one made after it is made after this read.
        found = await self._all(
            f"SELECT {_RUN_COLUMNS}, s.position::text FROM (SELECT pg_current_snapshot() AS position) s "
            "LEFT JOIN runs ON thread_id = %(thread)s AND (status IN ('pending', 'running') "
            "OR NOT pg_visible_in_snapshot(made_in, %(since)s::pg_snapshot)) ORDER BY seq",
            {"thread": thread_id, "since": position})
        return [run_row(r[:-1]) for r in found if r[0] is not None], found[0][-1]

    async def runs_with_status(self, statuses: Sequence[RunStatus]) -> list[RunRow]:
        rows = await self._all(f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = ANY(%s) ORDER BY seq",
                               (list(statuses),))
        return [run_row(r) for r in rows]

    async def active_runs(self, thread_id: str) -> list[RunRow]:
        rows = await self._all(f"SELECT {_RUN_COLUMNS} FROM runs WHERE thread_id = %s "
                               "AND status IN ('pending', 'running') ORDER BY seq", (thread_id,))
        return [run_row(r) for r in rows]

    async def claim_runs(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        if limit <= 0:
            return []
        return await _whole(self._claim(worker_id, limit, now))

    async def _claim(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        async with self.pool.connection() as conn, conn.transaction():
            # This worker's runs that are the oldest due run of their thread (whichever worker queued
            # the others), on threads with none running; runs another worker is claiming right now are
            # locked, and skipped.
            # Each look at the thread's other runs is an equality on runs_by_thread, and the scan goes in queue
            # order on pending_by_worker: a claim reads about as many runs as it takes, however long the queue.
            candidates = [run_row(r) for r in await (await conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs r WHERE status = 'pending' AND worker_id = %(me)s "
                "AND scheduled_at <= %(now)s AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.thread_id = r.thread_id "
                "AND x.status = 'running') AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.thread_id = r.thread_id "
                "AND x.status = 'pending' AND x.seq < r.seq AND x.scheduled_at <= %(now)s)"
                " ORDER BY seq LIMIT %(limit)s FOR UPDATE SKIP LOCKED",
                {"me": worker_id, "now": now, "limit": limit})).fetchall()]
            if not candidates:
                return []
            claimed = await _lock_claims(conn, candidates)
            if not claimed:
                return []
            # Under the locks, a fresh look: a run another worker claimed and committed meanwhile shows now.
            token = new_id()
            taken = dict(await (await conn.execute(
                "UPDATE runs SET status = 'running', updated_at = %s, attempts = attempts + 1, claim = %s "
                "WHERE run_id = ANY(%s) AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.thread_id = runs.thread_id "
                "AND x.status = 'running') RETURNING run_id, attempts",
                (now, token, [r.run_id for r in claimed]))).fetchall())
        claimed = [r for r in claimed if r.run_id in taken]
        for row in claimed:
            row.status, row.updated_at, row.attempts, row.claim = "running", now, taken[row.run_id], token
        return claimed

    async def release_run(self, claim: RunClaim, now: str) -> bool:
        return bool(await self._write(
            "UPDATE runs SET status = 'pending', claim = NULL, attempts = greatest(attempts - 1, 0), updated_at = %s "
            "WHERE run_id = %s AND claim = %s AND status = 'running'", (now, *claim)))

    async def finish_run(self, end: RunEnd) -> bool:
        # The updates in one statement (its parts see the database as it was before it, hence "run_id <>
        # the run"); it locks the thread's row, as put_inbox does. The mail is looked for once the thread's row
        # is updated (so locked), by a function that reads with a snapshot of its own (the statement's was taken
        # before it waited for the lock): mail stored before the lock was taken is seen there, and whoever stores
        # mail after it was released sees the run ended (and wakes the thread).
        checkpoint_id, stage = end.checkpoint_next or (None, None)
        # Under a claim, every part is conditional on the claim holding (the run's row locked meanwhile), and
        # with the run's last step, on its checkpoint going in (its parent there).
        held, holds = ((f"held AS ({_HELD} FOR UPDATE), ", " AND EXISTS (SELECT 1 FROM held)") if end.claim
                       else ("", ""))
        last, written = "", ""
        params: dict[str, Any] = {}
        if end.checkpoint is not None:
            ctes, params = _checkpoint_ctes(end.checkpoint, "held" if end.claim else "")
            last, holds, written = f"{ctes}, ", f"{holds} AND EXISTS (SELECT 1 FROM i)", ", (SELECT count(*) FROM i)"
        found = await self._write_one(
            f"WITH {held}{last}r AS (UPDATE runs SET status = %(status)s, error = %(error)s, updated_at = %(at)s, "
            f"  usage = %(usage)s WHERE run_id = %(run)s{holds}), "
            "s AS (INSERT INTO run_spans SELECT %(run)s, %(thread)s, %(spans)s::text WHERE %(spans)s::text IS NOT NULL "
            f"  {holds} ON CONFLICT (run_id) DO UPDATE SET spans = excluded.spans), "
            "t AS (UPDATE threads SET status = CASE WHEN EXISTS (SELECT 1 FROM runs WHERE thread_id = %(thread)s "
            "  AND run_id <> %(run)s AND status IN ('pending', 'running')) THEN 'busy' ELSE %(thread_status)s END, "
            "  error = %(thread_error)s, updated_at = %(at)s, interrupts = coalesce(%(interrupts)s, interrupts) "
            f"  WHERE thread_id = %(thread)s{holds} RETURNING thread_id), "
            "c AS (UPDATE checkpoints SET next = %(stage)s WHERE thread_id = %(thread)s "
            f"  AND checkpoint_id = %(checkpoint)s{holds}) "
            f"SELECT {'(SELECT count(*) FROM held)' if end.claim else '1'}, "
            f"(SELECT bool_or(undelivered_mail(thread_id)) FROM t){written}",
            {**params, "status": end.status, "error": dump(end.error) if end.error else None, "at": end.updated_at,
             "run": end.run_id, "thread": end.thread_id, "thread_status": end.thread_status,
             "thread_error": dump(end.thread_error) if end.thread_error else None,
             "interrupts": None if end.interrupts is None else dump(end.interrupts),
             "stage": stage, "checkpoint": checkpoint_id, "usage": dump(end.usage) if end.usage else None,
             "spans": None if end.spans is None else dump(end.spans), "claim": end.claim})
        if not (found and found[0]):
            raise LostRunError(f"run {end.run_id} is no longer this process's to run: its end was not recorded")
        if end.checkpoint is not None and not found[2]:
            raise ParentGoneError(f"checkpoint {end.checkpoint.row.checkpoint_id} has no parent any more")
        return bool(found[1])

    async def run_spans(self, thread_id: str) -> dict[str, list[dict[str, Any]]]:
        rows = await self._all("SELECT run_id, spans FROM run_spans WHERE thread_id = %s", (thread_id,))
        return {run_id: json.loads(spans) for run_id, spans in rows}

    async def _fenced(self, claim: RunClaim | None, sql: str, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """Run a statement of a run's, its parameters by name; under a claim, ``sql`` names ``held`` (see
        :data:`_HELD`, whose parameters are added), and returns a row whose first column is its count of rows (the
        row is returned)."""
        if claim is None:
            await self._write(sql, params)
            return None
        found = await self._write_one(sql, {**params, "run": claim.run_id, "claim": claim.token})
        if not (found and found[0]):
            raise LostRunError(f"run {claim.run_id} is no longer this process's to run")
        return found

    async def drop_pending_run(self, run_id: str, action: CancelAction, now: str) -> bool:
        # The thread's update sees the runs as they were before the statement, the dropped one still
        # pending: hence "run_id <> the run".
        drop = ("DELETE FROM runs WHERE run_id = %(run)s AND status = 'pending' RETURNING thread_id"
                if action == "rollback" else
                "UPDATE runs SET status = 'interrupted', updated_at = %(now)s WHERE run_id = %(run)s "
                "AND status = 'pending' RETURNING thread_id")
        dropped = await self._write_one(
            f"WITH d AS ({drop}), "
            "t AS (UPDATE threads SET status = CASE WHEN interrupts = '[]' THEN 'idle' ELSE 'interrupted' END "
            "  WHERE thread_id IN (SELECT thread_id FROM d) "
            "  AND status = 'busy' AND NOT EXISTS (SELECT 1 FROM runs WHERE thread_id IN (SELECT thread_id FROM d) "
            "  AND run_id <> %(run)s AND status IN ('pending', 'running'))) "
            "SELECT count(*) FROM d", {"run": run_id, "now": now})
        return bool(dropped and dropped[0])

    async def requeue_orphans(self, alive_workers: Sequence[str], new_worker_id: str,
                              agents: Mapping[str, str], *, limit: int | None = None) -> list[str]:
        def orphaned(runs: str) -> str:
            return (f"{runs}.status IN ('pending', 'running') AND ({runs}.worker_id IS NULL OR (NOT "
                    f"{runs}.worker_id = ANY(%(alive)s) AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.worker_id = "
                    f"{runs}.worker_id))) AND ({runs}.agent_digest = ANY(%(digests)s) OR ({runs}.agent_digest IS NULL "
                    f"AND {runs}.assistant_id = ANY(%(assistants)s)))")

        params = {"new": new_worker_id, "alive": list(alive_workers), "digests": list(agents.values()),
                  "assistants": list(agents), "limit": limit}
        oldest = ""
        if limit is not None:
            # Looked up first and handed over by id: as a subquery of the update, the planner (misled by
            # statistics from before the queue filled) compared every queued run with every one taken, 3 s
            # with 10,000 queued. The update checks each row again, so runs another server took meanwhile
            # stay its own.
            params["ids"] = [run_id for (run_id,) in await self._all(
                f"SELECT o.run_id FROM runs o WHERE {orphaned('o')} ORDER BY o.seq LIMIT %(limit)s", params)]
            oldest = " AND run_id = ANY(%(ids)s)"
        rows = await self._queue(
            f"WITH r AS (UPDATE runs SET status = 'pending', worker_id = %(new)s, claim = NULL WHERE "
            f"{orphaned('runs')}{oldest} RETURNING seq, run_id, thread_id), "
            "t AS (UPDATE threads SET status = 'busy' WHERE status <> 'busy' AND thread_id IN "
            "(SELECT thread_id FROM r)) SELECT run_id FROM r ORDER BY seq", params, "all")
        return [run_id for (run_id,) in rows]

    def coordinator(self) -> PostgresCoordinator:
        return PostgresCoordinator(self)

    # -- workers

    # Heartbeats are stamped and aged by the database's clock, so the machines sharing it need not agree
    # on the time: a worker's age is handed to the caller as a time on the caller's own clock.

    async def heartbeat(self, worker_id: str, info: dict[str, Any], now: str) -> bool:
        # Not queued behind this process's other writes: one waiting on another process's lock held every
        # heartbeat after it, and others took this process for dead.
        found = await self._fetch(
            "INSERT INTO workers VALUES (%s, %s, now()::text) ON CONFLICT (worker_id) DO UPDATE "
            "SET heartbeat_at = excluded.heartbeat_at RETURNING xmax <> 0", (worker_id, dump(info)), "one")
        return bool(found and found[0])  # xmax is set on a row the upsert updated, not on one it inserted

    async def workers(self) -> dict[str, tuple[dict[str, Any], str]]:
        rows = await self._all("SELECT worker_id, info, extract(epoch FROM now() - heartbeat_at::timestamptz) "
                               "FROM workers")
        here = datetime.now(UTC)
        return {w: (json.loads(info), (here - timedelta(seconds=float(age))).isoformat()) for w, info, age in rows}

    async def forget_worker(self, worker_id: str) -> None:
        await self._write("DELETE FROM workers WHERE worker_id = %s", (worker_id,))

    # -- checkpoints

    async def put_checkpoint(self, row: CheckpointRow, claim: RunClaim | None = None, *,
                             parent_seq: int | None = None, base: CheckpointBase | None = None) -> bool:
        ctes, params = _checkpoint_ctes(CheckpointWrite(row, parent_seq, base), "held" if claim else "")
        if claim is None:
            found = await self._write_one(f"WITH {ctes} SELECT 1, count(*) FROM i", params)
        else:
            found = await self._fenced(claim, f"WITH held AS ({_HELD} FOR SHARE), {ctes} "
                                       "SELECT (SELECT count(*) FROM held), (SELECT count(*) FROM i)", params)
        return bool(found and found[1])

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointRow | None:
        found = await self._one(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints "
                                "WHERE thread_id = %s AND checkpoint_id = %s", (thread_id, checkpoint_id))
        return checkpoint_row(found) if found else None

    async def head_checkpoint(self, thread_id: str) -> CheckpointRow | None:
        found = await self._one(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = %s "
                                "ORDER BY seq DESC LIMIT 1", (thread_id,))
        return checkpoint_row(found) if found else None

    async def list_checkpoints(self, thread_id: str, *, limit: int | None = None,
                               before_seq: int | None = None) -> list[CheckpointRow]:
        where = "thread_id = %s"
        params: list[Any] = [thread_id]
        if before_seq is not None:
            where += " AND seq < %s"
            params.append(before_seq)
        rows = await self._all(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE {where} "
                               "ORDER BY seq DESC LIMIT %s", (*params, limit))
        return [checkpoint_row(r) for r in rows]

    async def checkpoint_chain(self, thread_id: str, checkpoint_id: str, seq: int | None = None, *,
                               since: int | None = None) -> list[CheckpointRow]:
        target = "%(seq)s" if seq is not None else (
            "(SELECT seq FROM checkpoints WHERE thread_id = %(thread)s AND checkpoint_id = %(id)s)")
        params = {"thread": thread_id, "id": checkpoint_id, "seq": seq, "since": since}
        first = ("%(since)s" if since is not None else "coalesce((SELECT seq FROM checkpoints WHERE thread_id = "
                 f"%(thread)s AND whole AND seq <= {target} ORDER BY seq DESC LIMIT 1), 0)")
        rows = await self._all(
            f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = %(thread)s AND seq <= {target} "
            f"AND seq >= {first} ORDER BY seq", params)
        chain = checkpoint_chain(rows, checkpoint_id)
        if since is None and not chain_is_whole(chain):  # a fork from before that whole one: read back to the first
            rows = await self._all(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = %(thread)s "
                                   f"AND seq <= {target} ORDER BY seq", params)
            chain = checkpoint_chain(rows, checkpoint_id)
        return chain

    async def checkpoint_bases(self, thread_id: str, seq: int) -> list[CheckpointBase]:
        found = await self._one(_BASES, {"thread": thread_id, "seq": seq}, batched=False)
        return base_chain(thread_id, [found] if found and found[0] is not None else [])

    async def based_chain(self, thread_id: str, checkpoint_id: str,
                          seq: int) -> tuple[list[CheckpointBase], list[CheckpointRow]]:
        # Both in one round trip (and one snapshot): the chain's start is the nearest base's seq, found in its query.
        params = {"thread": thread_id, "id": checkpoint_id, "seq": seq}
        base, rows = await self._fetch_together(
            (_BASES, params, "one"),
            (f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE thread_id = %(thread)s AND seq <= %(seq)s "
             "AND seq >= (SELECT max(seq) FROM checkpoint_bases WHERE thread_id = %(thread)s AND seq <= %(seq)s) "
             "ORDER BY seq",
             params, "all"))
        bases = base_chain(thread_id, [base] if base and base[0] is not None else [])
        return bases, checkpoint_chain(rows, checkpoint_id) if bases else []

    async def set_checkpoint_next(self, thread_id: str, checkpoint_id: str, next: str) -> None:
        await self._write("UPDATE checkpoints SET next = %s WHERE thread_id = %s AND checkpoint_id = %s",
                          (next, thread_id, checkpoint_id))

    async def children_of_run(self, thread_id: str, run_id: str) -> list[CheckpointRow]:
        rows = await self._all(f"SELECT {_CHECKPOINT_COLUMNS} FROM checkpoints WHERE {_CHILDREN_OF_RUN} "
                               "ORDER BY seq", {"thread": thread_id, "run": run_id})
        return [checkpoint_row(r) for r in rows]

    async def delete_checkpoints_of_run(self, thread_id: str, run_id: str,
                                        whole: Sequence[CheckpointRow] = ()) -> bool:
        return await _whole(self._delete_checkpoints_of_run(thread_id, run_id, whole))

    async def _delete_checkpoints_of_run(self, thread_id: str, run_id: str, whole: Sequence[CheckpointRow]) -> bool:
        params = {"thread": thread_id, "run": run_id}
        try:
            async with self.pool.connection() as conn, conn.transaction():
                # Deleted first: a checkpoint being written after one of these holds its row until it commits,
                # and is then among the children found below.
                deleted = [r[0] for r in await (await conn.execute(
                    "DELETE FROM checkpoints WHERE thread_id = %(thread)s AND run_id = %(run)s "
                    "RETURNING checkpoint_id", params)).fetchall()]
                await conn.execute("DELETE FROM checkpoint_bases WHERE thread_id = %s", (thread_id,))
                children = await (await conn.execute(
                    "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND NOT whole "
                    "AND parent_id = ANY(%s)", (thread_id, deleted))).fetchall()
                if {c for (c,) in children} - {r.checkpoint_id for r in whole}:
                    raise _ChildrenChanged
                for row in whole:
                    await conn.execute("UPDATE checkpoints SET delta = %s, whole = TRUE WHERE thread_id = %s "
                                       "AND checkpoint_id = %s", (delta_text(row.delta), thread_id, row.checkpoint_id))
        except _ChildrenChanged:
            return False
        return True

    async def keep_only_checkpoint(self, row: CheckpointRow) -> bool:
        return await _whole(self._keep_only_checkpoint(row))

    async def _keep_only_checkpoint(self, row: CheckpointRow) -> bool:
        async with self.pool.connection() as conn, conn.transaction():
            if not await self._lock_idle_thread(conn, row.thread_id):
                return False
            head = await (await conn.execute("SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s "
                                             "ORDER BY seq DESC LIMIT 1", (row.thread_id,))).fetchone()
            if head is None or head[0] != row.checkpoint_id:
                return False
            await conn.execute("DELETE FROM checkpoints WHERE thread_id = %s", (row.thread_id,))
            await conn.execute("DELETE FROM checkpoint_bases WHERE thread_id = %s", (row.thread_id,))
            values = checkpoint_values(row)
            placeholders = ", ".join(["%s"] * len(values))
            await conn.execute(f"INSERT INTO checkpoints ({_CHECKPOINT_COLUMNS}) VALUES ({placeholders})", values)
        return True

    async def copy_checkpoints(self, thread_id: str, new_thread_id: str) -> None:
        await self._write(f"WITH c AS (INSERT INTO checkpoints ({_CHECKPOINT_COLUMNS}) SELECT %(new)s, seq, "
                          "checkpoint_id, parent_id, run_id, delta, next, metadata, created_at, whole FROM checkpoints "
                          f"WHERE thread_id = %(old)s) INSERT INTO checkpoint_bases ({BASE_COLUMNS}) SELECT %(new)s, "
                          "checkpoint_id, seq, prev_id, messages, rest FROM checkpoint_bases WHERE thread_id = %(old)s",
                          {"new": new_thread_id, "old": thread_id})

    async def put_pending_write(self, thread_id: str, key: str, value: Mapping[str, Any],
                                claim: RunClaim | None = None) -> None:
        upsert = ("INSERT INTO pending_writes {} ON CONFLICT (thread_id, key) DO UPDATE SET value = excluded.value")
        params = {"thread": thread_id, "key": key, "value": dumps(value)}
        if claim is None:
            await self._write(upsert.format("VALUES (%(thread)s, %(key)s, %(value)s)"), params)
        else:
            await self._fenced(claim, f"WITH held AS ({_HELD} FOR SHARE), i AS ("
                               f"{upsert.format('SELECT %(thread)s, %(key)s, %(value)s FROM held')}) "
                               "SELECT count(*) FROM held", params)

    async def pending_writes(self, thread_id: str) -> dict[str, Mapping[str, Any]]:
        rows = await self._all("SELECT key, value FROM pending_writes WHERE thread_id = %s", (thread_id,))
        return {key: json.loads(value) for key, value in rows}

    async def clear_pending_writes(self, thread_id: str, claim: RunClaim | None = None) -> None:
        if claim is None:
            await self._write("DELETE FROM pending_writes WHERE thread_id = %s", (thread_id,))
        else:
            await self._fenced(claim, f"WITH held AS ({_HELD} FOR SHARE), d AS (DELETE FROM pending_writes WHERE "
                               "thread_id = %(thread)s AND EXISTS (SELECT 1 FROM held)) SELECT count(*) FROM held",
                               {"thread": thread_id})

    # -- inbox

    async def put_inbox(self, thread_id: str, key: str, message: AnyMessage, now: str) -> bool:
        # Under the lock of the thread's row, as finish_run: a run ending meanwhile either sees this
        # message, or has ended before the caller looks for an active run to give it to. A deletion that
        # held the lock first (the TTL sweep's) leaves no row to lock: the message is not stored then.
        found = await self._write_one(
            "WITH t AS (SELECT 1 FROM threads WHERE thread_id = %(thread)s FOR UPDATE), "
            "i AS (INSERT INTO inbox (thread_id, key, message, created_at) "
            "SELECT %(thread)s, %(key)s, %(message)s, %(now)s FROM t "
            "ON CONFLICT (thread_id, key) DO NOTHING RETURNING 1) "
            "SELECT (SELECT count(*) FROM t), (SELECT count(*) FROM i)",
            {"thread": thread_id, "key": key, "message": dumps(message), "now": now})
        if not (found and found[0]):
            raise NotFoundError(f"thread {thread_id!r} not found")
        return bool(found[1])

    async def inbox(self, thread_id: str) -> list[tuple[str, AnyMessage]]:
        rows = await self._all("SELECT key, message FROM inbox WHERE thread_id = %s AND NOT delivered "
                               "ORDER BY created_at, seq", (thread_id,), batched=True)
        return [(key, inbox_message(message)) for key, message in rows]

    async def ack_inbox(self, thread_id: str, keys: Sequence[str], claim: RunClaim | None = None) -> None:
        if not keys:
            return
        if claim is None:
            await self._write("UPDATE inbox SET delivered = TRUE WHERE thread_id = %s AND key = ANY(%s)",
                              (thread_id, list(keys)))
        else:
            await self._fenced(claim, f"WITH held AS ({_HELD} FOR SHARE), u AS (UPDATE inbox SET delivered = TRUE "
                               "WHERE thread_id = %(thread)s AND key = ANY(%(keys)s) AND EXISTS (SELECT 1 FROM held)) "
                               "SELECT count(*) FROM held", {"thread": thread_id, "keys": list(keys)})

    async def threads_with_mail(self) -> list[str]:
        return [r[0] for r in await self._all("SELECT DISTINCT thread_id FROM inbox WHERE NOT delivered")]

    # -- items

    async def put_item(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], now: str,
                       ttl: float | None = None) -> None:
        expires = epoch_of(now) + ttl * 60 if ttl is not None else None
        await self._write("INSERT INTO items (namespace, key, value, created_at, updated_at, ttl_minutes, expires_at) "
                          "VALUES (%s, %s, %s::jsonb, %s, %s, %s, %s) ON CONFLICT (namespace, key) "
                          "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at, "
                          "ttl_minutes = excluded.ttl_minutes, expires_at = excluded.expires_at",
                          (SEP.join(namespace), key, dump(value), now, now, ttl, expires))

    async def get_item(self, namespace: tuple[str, ...], key: str, *, now: str | None = None,
                       refresh: bool = False) -> ItemRow | None:
        rows = await self._items("namespace = %s AND key = %s", [SEP.join(namespace), key], "", now, refresh)
        return rows[0] if rows else None

    async def _items(self, where: str, params: list[Any], tail: str, now: str | None, refresh: bool) -> list[ItemRow]:
        """Items matching ``where`` (then ``tail``: order, limit); with ``now``, unexpired ones only, and with
        ``refresh`` their time to live started again at ``now`` in the same statement."""
        if now is None:
            rows = await self._all(f"SELECT {_ITEM_COLUMNS} FROM items WHERE {where} {tail}", params)
            return [item_row(r) for r in rows]
        at = epoch_of(now)
        found = f"SELECT {_ITEM_COLUMNS} FROM items WHERE {where} AND (expires_at IS NULL OR expires_at > %s) {tail}"
        if not refresh:
            return [item_row(r) for r in await self._all(found, [*params, at])]
        rows = await self._all(f"WITH found AS ({found}), touched AS (UPDATE items i SET expires_at = %s + "
                               "i.ttl_minutes * 60 FROM found f WHERE i.namespace = f.namespace AND i.key = f.key "
                               "AND i.ttl_minutes IS NOT NULL) SELECT * FROM found", [*params, at, at])
        return [item_row(r) for r in rows]

    async def delete_item(self, namespace: tuple[str, ...], key: str) -> None:
        await self._write("DELETE FROM items WHERE namespace = %s AND key = %s", (SEP.join(namespace), key))

    async def search_items(self, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, now: str | None = None,
                           refresh: bool = False) -> list[ItemRow]:
        clauses: list[str] = ["TRUE"]
        params: list[Any] = []
        if prefix:
            joined = SEP.join(prefix)
            clauses.append("(namespace = %s OR starts_with(namespace, %s))")
            params += [joined, joined + SEP]
        for key, value in (filter or {}).items():
            clauses.append(_json_equals("value"))
            params += [key, dump(value)]
        return await self._items(" AND ".join(clauses), [*params], "ORDER BY updated_at DESC, namespace, key "
                                 f"LIMIT {int(limit)} OFFSET {int(offset)}", now, refresh)

    async def delete_expired_items(self, now: str) -> int:
        return await self._write("DELETE FROM items WHERE expires_at <= %s", (epoch_of(now),))

    async def list_namespaces(self, *, prefix: tuple[str, ...] = (), suffix: tuple[str, ...] = (),
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> list[tuple[str, ...]]:
        rows = await self._all("SELECT DISTINCT namespace FROM items")
        return matching_namespaces((joined for (joined,) in rows), prefix, suffix, max_depth, limit, offset)

    # -- crons

    async def create_cron(self, row: CronRow) -> None:
        await self._write(*_CRONS.insert(row))

    async def get_cron(self, cron_id: str) -> CronRow | None:
        found = await self._one(*_CRONS.get(cron_id))
        return cron_row(found) if found else None

    async def update_cron(self, row: CronRow, *, reschedule: bool) -> bool:
        return bool(await self._write(*_CRONS.update(row, reschedule=reschedule)))

    async def delete_cron(self, cron_id: str) -> bool:
        return bool(await self._write(*_CRONS.delete(cron_id)))

    async def search_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                           enabled: bool | None = None, metadata: dict[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, sort_by: str = "created_at", sort_order: str = "desc") -> list[CronRow]:
        query = _CRONS.search(assistant_id, thread_id, enabled, metadata, limit, offset, sort_by, sort_order)
        return [cron_row(r) for r in await self._all(*query)]

    async def count_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                          metadata: dict[str, Any] | None = None) -> int:
        found = await self._one(*_CRONS.count(assistant_id, thread_id, metadata), batched=False)
        assert found is not None
        return found[0]

    async def due_crons(self, before: str, limit: int, assistant_ids: Sequence[str]) -> list[CronRow]:
        return [cron_row(r) for r in await self._all(*_CRONS.due(before, limit, assistant_ids))]

    async def claim_cron_tick(self, cron_id: str, tick: str, next_tick: str) -> bool:
        return bool(await self._write(*_CRONS.claim_tick(cron_id, tick, next_tick)))


class PostgresCoordinator(Coordinator):
    """Messages over ``LISTEN/NOTIFY``: to all on one channel per schema, on a topic on a channel of its own that
    only the processes subscribed to the topic listen to (the others' servers hear nothing of it); a payload too
    big for NOTIFY goes through the ``notifications`` table and its id through NOTIFY."""

    def __init__(self, storage: PostgresStorage) -> None:
        self.storage = storage
        self.channel = ""
        self._queue: list[tuple[str | None, str]] = []  # (topic, message as JSON), to send
        self._queued = asyncio.Event()
        self._subscribed: dict[str, int] = {}  # topic -> subscriptions here
        self._heard: dict[str, asyncio.Future[None]] = {}  # topic -> done once it is listened to
        self._topics_changed = asyncio.Event()
        self._received: asyncio.Queue[str | None] = asyncio.Queue()  # payloads heard (None: some may be missed)
        self._tasks: list[asyncio.Task[None]] = []
        self._receive: Callable[[dict[str, Any]], None] = lambda message: None

    async def start(self, receive: Callable[[dict[str, Any]], None]) -> None:
        self._receive = receive
        found = await self.storage._one("SELECT current_schema()")
        self.channel = f"backchannel:{found[0] if found else 'public'}"[:63]
        listening: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._tasks = [asyncio.create_task(self._listen_forever(listening)),
                       asyncio.create_task(self._deliver_forever()),
                       asyncio.create_task(self._send_forever())]
        await listening  # from here on, what any process sends reaches this one

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for heard in self._heard.values():
            heard.cancel()  # nothing more will be heard
        await self._send_queued()

    def publish(self, message: dict[str, Any], topic: str | None = None) -> None:
        self._queue.append((topic, dump(message)))
        self._queued.set()

    def notice(self, message: dict[str, Any], topic: str) -> Notice | None:
        payload = f"[{dump(message)}]"  # a pack of one
        return Notice(self._channel_of(topic), payload) if len(payload.encode()) <= _NOTIFY_LIMIT else None

    async def subscribe(self, topic: str) -> None:
        self._subscribed[topic] = self._subscribed.get(topic, 0) + 1
        heard = self._heard.get(topic)
        if heard is None:
            heard = self._heard[topic] = asyncio.get_running_loop().create_future()
            self._topics_changed.set()
        try:
            await asyncio.shield(heard)
        except BaseException:
            self.unsubscribe(topic)
            raise

    def unsubscribe(self, topic: str) -> None:
        left = self._subscribed.get(topic, 0) - 1
        if left > 0:
            self._subscribed[topic] = left
            return
        self._subscribed.pop(topic, None)
        self._heard.pop(topic, None)
        self._topics_changed.set()

    def _channel_of(self, topic: str | None) -> str:
        # A topic's own channel, within an identifier's 63 bytes whatever the topic (a thread id is the user's).
        if topic is None:
            return self.channel
        return "backchannel:" + hashlib.blake2b(f"{self.channel}\0{topic}".encode(), digest_size=16).hexdigest()

    async def _send_forever(self) -> None:
        tidied = asyncio.get_running_loop().time()
        delay = _RETRY_FIRST
        while True:
            await self._queued.wait()
            self._queued.clear()
            if await self._send_queued():
                delay = _RETRY_FIRST
            else:  # the database is away: the messages wait for it, in order
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
                self._queued.set()
                continue
            if asyncio.get_running_loop().time() - tidied > _TIDY_EVERY:
                tidied = asyncio.get_running_loop().time()
                with contextlib.suppress(StorageUnavailableError):
                    await self.storage._write("DELETE FROM notifications WHERE created_at < now() - "
                                              "interval '10 minutes'")

    async def _send_queued(self) -> bool:
        """Send the queued messages; ``False`` (and they stay queued) if the database could not be reached."""
        batch, self._queue = self._queue, []
        if batch:
            try:
                await _whole(self._notify([(self._channel_of(topic), text) for topic, text in batch]))
            except StorageUnavailableError as exc:
                self._queue[:0] = batch
                logger.debug("%d messages for the other processes wait for the database: %s", len(batch), exc)
                return False
            except Exception:  # schedulers and followers also look at the database now and then
                logger.exception("could not send %d messages to the other processes", len(batch))
        return True

    async def _notify(self, batch: list[tuple[str, str]]) -> None:
        # The messages go packed, as JSON arrays: one notification, which every process listening to its channel
        # (this one too) receives and parses, for all the messages of a batch rather than one for each.
        if not any(len(text.encode()) > _NOTIFY_LIMIT for _, text in batch):
            # Without a payload to store, a statement a pack (one a channel, nearly always: no array of texts to
            # quote), sent with the writes of the tick (or of the next batch): no round trip of its own. Sent as
            # the batch commits, in the order queued.
            await asyncio.gather(*(self.storage._write(self._sql_for(channel), (channel, pack))
                                   for channel, pack in _packed(batch)))
            return
        async with self.storage.pool.connection() as conn, conn.transaction():
            payloads = []
            for channel, text in batch:
                if len(text.encode()) > _NOTIFY_LIMIT:
                    cursor = await conn.execute("INSERT INTO notifications (payload) VALUES (%s) RETURNING id", (text,))
                    text = json.dumps({"ref": (await cursor.fetchone())[0]})  # type: ignore[index]
                payloads.append((channel, text))
            for channel, pack in _packed(payloads):
                await conn.execute(self._sql_for(channel), (channel, pack))

    def _sql_for(self, channel: str) -> str:
        return _NOTIFY if channel == self.channel else _NOTIFY_LISTENERS

    async def _listen_forever(self, listening: asyncio.Future[None]) -> None:
        delay = _RETRY_FIRST
        while True:
            try:
                async with await AsyncConnection.connect(self.storage.url, autocommit=True) as conn:
                    listened: set[str] = set()
                    await conn.execute(sql.SQL("LISTEN {}; {}").format(sql.Identifier(self.channel),
                                                                       sql.SQL(_GONE_LISTENERS)))
                    await self._listen_to_topics(conn, listened)
                    if listening.done():  # back after a lost connection: what was sent meanwhile was missed
                        logger.info("listening to the other processes again")
                        self._received.put_nowait(None)
                    else:
                        listening.set_result(None)
                    delay = _RETRY_FIRST
                    await self._hear(conn, listened)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not listening.done():
                    listening.set_exception(exc)
                    return
                if delay == _RETRY_FIRST:
                    logger.warning("lost the connection listening to other processes (%s); reconnecting",
                                   str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)

    async def _hear(self, conn: AsyncConnection[Any], listened: set[str]) -> None:
        """Queue what the connection hears, for ever; listen to topics as they are subscribed to, and no more to
        those that are not (psycopg's ``notifies()`` holds the connection: it is stopped to change them)."""
        while True:
            if self._topics_changed.is_set():
                await self._listen_to_topics(conn, listened)
            reading = asyncio.ensure_future(self._read(conn))
            changed = asyncio.ensure_future(self._topics_changed.wait())
            try:
                await asyncio.wait((reading, changed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                reading.cancel()
                changed.cancel()
                await asyncio.gather(reading, changed, return_exceptions=True)
            error = None if reading.cancelled() else reading.exception()
            if error is not None:
                raise error

    async def _read(self, conn: AsyncConnection[Any]) -> None:
        # What has come (kept by psycopg if it came with a command), then a wait for the socket. Not notifies()'s
        # own wait: it wakes ten times a second to look (2.4 ms/s of CPU for a process doing nothing). Stopped
        # (cancelled) only while waiting, so nothing read is lost.
        loop = asyncio.get_running_loop()
        while True:
            async for note in conn.notifies(timeout=0):
                self._received.put_nowait(note.payload)
            readable = loop.create_future()
            loop.add_reader(conn.fileno(), _set_once, readable)
            try:
                await readable
            finally:
                loop.remove_reader(conn.fileno())

    async def _listen_to_topics(self, conn: AsyncConnection[Any], listened: set[str]) -> None:
        """LISTEN to the channels of the topics subscribed to, UNLISTEN to the others'; tell the subscribers."""
        self._topics_changed.clear()
        wanted = {self._channel_of(topic): topic for topic in self._subscribed}
        gone = listened - wanted.keys()
        if gone:
            await conn.execute(sql.SQL("DELETE FROM listeners WHERE pid = pg_backend_pid() AND channel IN ({}); {}")
                               .format(sql.SQL(", ").join(map(sql.Literal, gone)),
                                       sql.SQL("; ").join(sql.SQL("UNLISTEN {}").format(sql.Identifier(c))
                                                          for c in gone)))
            listened -= gone
        for channel in wanted.keys() - listened:
            # A transaction a channel (it holds the channel's lock alone: waiting for another's with one held
            # could deadlock with a sender's batch), its LISTEN in effect as it commits, with its row.
            await conn.execute(sql.SQL(
                "SELECT pg_advisory_xact_lock({lock}, hashtext({channel})); "
                "INSERT INTO listeners VALUES ({channel}, pg_backend_pid()) ON CONFLICT DO NOTHING; LISTEN {name}")
                .format(lock=sql.Literal(_LISTENER_LOCK), channel=sql.Literal(channel), name=sql.Identifier(channel)))
            listened.add(channel)
        for topic in wanted.values():
            heard = self._heard.get(topic)
            if heard is not None and not heard.done():
                heard.set_result(None)

    async def _deliver_forever(self) -> None:
        while True:
            payload = await self._received.get()
            if payload is None:
                self._receive(MISSED)
                continue
            try:
                await self._deliver(payload)
            except StorageUnavailableError:  # a big message's payload could not be read
                self._receive(MISSED)
            except Exception:
                logger.exception("cannot read a message from another process: %r", payload[:200])

    async def _deliver(self, payload: str) -> None:
        found = json.loads(payload)
        for message in found if isinstance(found, list) else [found]:  # a pack, or a message alone
            if set(message) == {"ref"}:
                stored = await self.storage._one("SELECT payload FROM notifications WHERE id = %s", (message["ref"],))
                if stored is None:
                    continue
                message = json.loads(stored[0])
            self._receive(message)


# Listeners whose connection is gone (their process died): messages to their channels are sent for nothing.
_GONE_LISTENERS = "DELETE FROM listeners l WHERE NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = l.pid)"


def _set_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _packed(messages: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """``messages`` (channel, JSON text within the limit) joined as JSON arrays of at most ``_NOTIFY_LIMIT``
    bytes, each of one channel's messages in a row (their order kept)."""
    packs: list[tuple[str, str]] = []
    pack: list[str] = []
    size = 2
    last = ""
    for channel, text in messages:
        length = len(text.encode()) + 1
        if pack and (size + length > _NOTIFY_LIMIT or channel != last):
            packs.append((last, f"[{','.join(pack)}]"))
            pack, size = [], 2
        pack.append(text)
        size += length
        last = channel
    if pack:
        packs.append((last, f"[{','.join(pack)}]"))
    return packs


class _ChildrenChanged(Exception):
    """A checkpoint was written after one of a run's being deleted: the deletion is rolled back."""


class _Statement(NamedTuple):
    sql: str
    params: Sequence[Any] | Mapping[str, Any]
    what: str  # "rowcount", "one" or "all"
    done: asyncio.Future[Any]


async def _run_batch(conn: AsyncConnection[Any], batch: list[_Statement]) -> None:
    """Run a batch of statements pipelined, in one transaction; if one fails, each on its own (only it fails)."""
    if len(batch) > 1:
        try:
            # The statements up to the pipeline's one Sync are one (implicit) transaction: all commit or none.
            # psycopg's transaction() in a pipeline would sync after BEGIN and around COMMIT, each a round trip.
            async with conn.pipeline():
                cursors = [await conn.execute(w.sql, w.params) for w in batch]
            results = [await _result(c, w.what) for c, w in zip(cursors, batch)]
        except psycopg.Error:
            # The database skipped what followed the failed statement, the preparing of one (at its sixth use)
            # too, which psycopg takes as done: each of its later uses on this connection would fail. So the
            # statements go again unprepared, and the connection is closed after them (a new one has none).
            await _run_each(conn, batch, prepare=False)
            await conn.close()
            return
        for write, result in zip(batch, results):
            if not write.done.done():
                write.done.set_result(result)
        return
    await _run_each(conn, batch)


async def _run_each(conn: AsyncConnection[Any], batch: list[_Statement], *, prepare: bool | None = None) -> None:
    for write in batch:
        try:
            result = await _result(await conn.execute(write.sql, write.params, prepare=prepare), write.what)
        except Exception as exc:
            if not write.done.done():
                write.done.set_exception(unavailable(conn, exc))
        else:
            if not write.done.done():
                write.done.set_result(result)


def _fail_all(batch: list[_Statement], exc: Exception) -> None:
    for write in batch:
        if not write.done.done():
            write.done.set_exception(exc)


async def _result(cursor: Any, what: str) -> Any:
    if what == "rowcount":
        return cursor.rowcount
    return await (cursor.fetchone() if what == "one" else cursor.fetchall())


async def _again_if_deadlocked(transaction: Callable[[], Coroutine[Any, Any, T]], tries: int = 5) -> T:
    """Run ``transaction`` again if Postgres broke a deadlock by failing it (rolled back whole).

    A thread's delete locks the thread's row, then its runs'; a run's end writes its row, then its thread's:
    met halfway, the delete (which waited first, so is found in the cycle first) is the one failed.
    """
    for _ in range(tries - 1):
        try:
            return await transaction()
        except psycopg.errors.DeadlockDetected:
            logger.info("a deadlock failed a transaction; trying it again")
    return await transaction()


async def _whole(operation: Coroutine[Any, Any, T]) -> T:
    """Await a database operation that a cancellation cannot cut short.

    A cancelled caller still gets its ``CancelledError``, but only once the
    statement has finished: a write cut off mid-flight might otherwise land
    after writes the caller makes next (a cancelled run's "busy" after its
    "interrupted"), and the connection would be left mid-query.
    """
    task = asyncio.ensure_future(operation)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait([task])
        raise


async def _migrate(conn: AsyncConnection, database: str) -> None:
    """Bring the schema up to date in one transaction; concurrent openers wait on an advisory lock."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (_MIGRATION_LOCK,))
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} "
                           "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        found = await (await conn.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}")).fetchone()
        assert found is not None
        for version, statements in to_apply(found[0], _MIGRATIONS, database):
            for statement in statements:
                await conn.execute(statement)
            await conn.execute(f"INSERT INTO {VERSION_TABLE} VALUES (%s, %s)", (version, now_iso()))


async def _lock_claims(conn: AsyncConnection, candidates: list[RunRow]) -> list[RunRow]:
    """The candidates whose thread (and concurrency key) this transaction could lock, within key limits."""
    threads = [r.thread_id for r in candidates]
    locked = {r[0] for r in await (await conn.execute(
        "SELECT t FROM unnest(%s::text[]) AS t WHERE pg_try_advisory_xact_lock(%s, hashtext(t))",
        (threads, _THREAD_LOCK))).fetchall()}
    claimable = [r for r in candidates if r.thread_id in locked]
    keys = sorted({r.concurrency_key for r in claimable if r.concurrency_key})
    if not keys:
        return claimable
    locked_keys = [r[0] for r in await (await conn.execute(
        "SELECT k FROM unnest(%s::text[]) AS k WHERE pg_try_advisory_xact_lock(%s, hashtext(k))",
        (keys, _KEY_LOCK))).fetchall()]
    # Counted after locking, in a statement of its own, so claims committed meanwhile are seen.
    running = dict.fromkeys(locked_keys, 0) | dict(await (await conn.execute(
        "SELECT concurrency_key, count(*) FROM runs WHERE status = 'running' AND concurrency_key = ANY(%s) "
        "GROUP BY concurrency_key", (locked_keys,))).fetchall())
    claimed = []
    for row in claimable:
        key = row.concurrency_key
        if key:
            if key not in running or running[key] >= (row.concurrency_limit or 1):
                continue
            running[key] += 1
        claimed.append(row)
    return claimed


@functools.cache  # made for every run: its text once
def _claim_on_insert(made: bool, written: bool, based: bool, notified: bool) -> str:
    """The statement of :meth:`PostgresStorage.create_claimed_run`: on a thread that exists, or that it ``made``
    (then with the run's first checkpoint if ``written``, and its base if ``based``); sending a notice (``%(nc)s``,
    ``%(np)s``) if ``notified`` and the run is stored."""
    existing = "SELECT 1 FROM threads WHERE thread_id = %(thread)s"
    lock = "pg_try_advisory_xact_lock(%(lock)s, hashtext(%(thread)s))"
    if not made:
        thread, there = "", f"EXISTS ({existing} FOR SHARE)"
        free = (f"EXISTS ({existing} AND status = 'busy' FOR SHARE) AND NOT EXISTS (SELECT 1 FROM runs WHERE "
                f"thread_id = %(thread)s AND status IN ('pending', 'running')) AND {lock}")
    else:
        thread = (f"t AS (INSERT INTO threads VALUES ({_named('t', 3)}, %(t3)s::jsonb, {_named('t', 7, 4)}) "
                  "ON CONFLICT (thread_id) DO NOTHING RETURNING 1), ")
        free = (f"EXISTS (SELECT 1 FROM t) AND NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %(thread)s) "
                f"AND NOT EXISTS (SELECT 1 FROM inbox WHERE thread_id = %(thread)s) AND {lock}")  # left by none
        there = f"(EXISTS (SELECT 1 FROM t) OR EXISTS ({existing} FOR SHARE))"
    first = (f"c AS (INSERT INTO checkpoints ({_CHECKPOINT_COLUMNS}) SELECT {_named('c', 10)} FROM i RETURNING 1), "
             if written else "")
    if based:
        first += f"cb AS (INSERT INTO checkpoint_bases ({BASE_COLUMNS}) SELECT {_named('b', 6)} FROM c), "
    busy = (", u AS (UPDATE threads SET status = 'busy', metadata = %(t3)s::jsonb, updated_at = %(t2)s "
            "WHERE thread_id = %(thread)s AND NOT EXISTS (SELECT 1 FROM t) AND EXISTS (SELECT 1 FROM p))"
            if made else "")
    notify = ", " + _notified("(SELECT 1 FROM i UNION ALL SELECT 1 FROM p) s", "%(nc)s", "%(np)s") if notified else ""
    claimed, claims = _named("r", 18), dict(_CLAIMED)
    pending = ", ".join(f"%(p{i})s" if i in claims else f"%(r{i})s" for i in range(18))
    return (f"WITH {thread}free AS (SELECT 1 WHERE {free}), "
            f"i AS (INSERT INTO runs ({_RUN_COLUMNS}) SELECT {claimed} FROM free ON CONFLICT DO NOTHING "
            f"  RETURNING 1), {first}"
            f"p AS (INSERT INTO runs ({_RUN_COLUMNS}) SELECT {pending} WHERE NOT EXISTS (SELECT 1 FROM i) "
            f"  AND {there} RETURNING 1){busy}{notify} "
            f"SELECT (SELECT count(*) FROM i), (SELECT count(*) FROM p){', (SELECT count(*) FROM t)' if made else ''}"
            f"{', (SELECT count(*) FROM n)' if notified else ''}")


def _notified(rows: str, channel: str = "%s", payload: str = "%s") -> str:
    """A CTE ``n`` sending a :class:`Notice` once for each of ``rows`` (the inserted run): the statement's final SELECT
    must read it (a CTE that changes nothing runs only as far as it is read)."""
    return f"n AS (SELECT notify_listeners({channel}, {payload}) FROM {rows})"


@functools.cache  # statements that use it are made for every run
def _named(prefix: str, count: int, start: int = 0) -> str:
    """Placeholders ``%(<prefix><start>)s, …`` up to ``count`` (excluded), for values passed by those names."""
    return ", ".join(f"%({prefix}{i})s" for i in range(start, count))


def _json_equals(column: str) -> str:
    """A filter clause: the JSON value at a key equals a given JSON value (a missing key counts as null)."""
    return f"coalesce({column} -> %s, 'null'::jsonb) = %s::jsonb"


def _psycopg_url(url: str) -> str:
    """A connection URL psycopg takes (SQLAlchemy's ``postgresql+psycopg://`` spelling too)."""
    scheme, sep, rest = url.partition("://")
    return f"{scheme.split('+', 1)[0]}{sep}{rest}"


def _describe(url: str) -> str:
    """The URL without its password, for error messages."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = conninfo_to_dict(url)
    except Exception:
        return "(Postgres)"
    return f"postgresql://{params.get('user', '')}@{params.get('host', '')}/{params.get('dbname', '')}"


def _checkpoint_ctes(write: CheckpointWrite, source: str) -> tuple[str, dict[str, Any]]:
    """A checkpoint's insert as the CTE ``i`` (a row if it went in), selecting from the CTE ``source`` if one is
    named (nothing inserted when it is empty), only while its parent is there if the write checks it; and its
    base's insert as ``b``; with their parameters by name. The parent's row is locked until this commits, so a
    deletion of its run waits and then sees this one."""
    values = checkpoint_values(write.row)  # thread_id, seq, checkpoint_id, parent_id, ...
    params = {f"c{i}": value for i, value in enumerate(values)}
    parent = ("TRUE" if write.parent_seq is None else
              "EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %(c0)s AND checkpoint_id = %(c3)s FOR KEY SHARE)")
    ctes = (f"i AS (INSERT INTO checkpoints ({_CHECKPOINT_COLUMNS}) SELECT {', '.join(f'%({k})s' for k in params)}"
            f"{' FROM ' + source if source else ''} WHERE {parent} RETURNING 1)")
    if write.base is not None:  # written only with the checkpoint, in its statement
        based = {f"b{i}": value for i, value in enumerate(base_values(write.base))}
        ctes += (f", b AS (INSERT INTO checkpoint_bases ({BASE_COLUMNS}) SELECT "
                 f"{', '.join(f'%({k})s' for k in based)} FROM i)")
        params.update(based)
    return ctes, params
