"""SQLite storage: one file in WAL mode, the embedded default.

Calls run inline on the event loop: SQLite answers in microseconds, far less
than handing each call to a thread would cost. Writes of one event-loop tick
share a transaction, committed at the end of the tick, and each write returns
only once that commit is done (a group commit: see :meth:`SQLiteStorage._write`).
So whatever a caller acknowledges after a write survives a crash, and a commit
that fails (a full disk, the file deleted under the process) is a
:class:`~backchannel.errors.StorageUnavailableError` for every write it carried.
WAL lets several processes open the same file; ``busy_timeout`` makes a writer
wait for another's lock.

Copying the WAL back into the database (a checkpoint, with two fsyncs) is the
slowest thing a commit can do. SQLite does it inside the commit that takes the
WAL past a size; here that size is raised to ``_WAL_LIMIT_PAGES`` and the copy
is made when writes pause instead (see :meth:`SQLiteStorage._checkpoint_when_quiet`),
off the path of a burst of steps.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import sqlite3
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import IO, Any

from backchannel._clock import now_iso
from backchannel._ids import new_id
from backchannel.errors import ConflictError, LostRunError, NotFoundError, StorageUnavailableError
from backchannel.messages import AnyMessage
from backchannel.runtime._migrations import VERSION_TABLE, to_apply
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
from backchannel.runtime.storage import Notice, ParentGoneError, RunStart, Storage, StoredRun, pick_claims
from backchannel.serde import dumps

try:
    import fcntl
except ImportError:  # Windows: a second server on one file is not detected
    fcntl = None  # type: ignore[assignment]

__all__ = ["SQLiteStorage"]

logger = logging.getLogger("backchannel")

# The threads whose background tasks (threads naming them their parent) have a run pending or running: their
# reports are still to come, so their TTL waits (the report's wake-up run starts it again).
_NOTHING_TO_COME = ("t.thread_id NOT IN (SELECT json_extract(c.metadata, '$.parent_thread_id') FROM runs r "
                    "JOIN threads c ON c.thread_id = r.thread_id WHERE r.status IN ('pending', 'running') "
                    "AND json_extract(c.metadata, '$.parent_thread_id') IS NOT NULL) "
                    "AND NOT EXISTS (SELECT 1 FROM inbox i WHERE i.thread_id = t.thread_id AND NOT i.delivered)")
# A run of this thread's may be claimed as it is stored (create_claimed_run): the thread is busy (its run's writes
# made it so) with no other run waiting or running. What its run would read: its newest checkpoint, and whether mail
# waits for it.
_FREE_THREAD = ("SELECT EXISTS (SELECT 1 FROM threads WHERE thread_id = ? AND status = 'busy') AND NOT EXISTS "
                "(SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('pending', 'running'))")
_THREAD_AS_IT_IS = ("SELECT (SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY seq DESC LIMIT 1), "
                    "EXISTS (SELECT 1 FROM inbox WHERE thread_id = ? AND NOT delivered)")
# A run stored only on a thread that exists (its values, then its thread_id, follow as parameters).
_RUN_ON_ITS_THREAD = (f"INSERT INTO runs SELECT {','.join('?' * 18)} "
                      "WHERE EXISTS (SELECT 1 FROM threads WHERE thread_id = ?)")
# A run's claim holds (its run_id and token follow as parameters).
_HELD = "EXISTS (SELECT 1 FROM runs WHERE run_id = ? AND claim = ? AND status = 'running')"
# A checkpoint's insert, while its writer's claim holds ({held}), and while its parent is there (the variant with
# its thread_id, seq and checkpoint_id as parameters after the row's values).
_PUT_CHECKPOINT = "INSERT INTO checkpoints SELECT ?,?,?,?,?,?,?,?,?,? WHERE {held}"
_PUT_CHILD_CHECKPOINT = ("INSERT INTO checkpoints SELECT ?,?,?,?,?,?,?,?,?,? WHERE EXISTS (SELECT 1 FROM checkpoints "
                         "WHERE thread_id = ? AND seq = ? AND checkpoint_id = ?) AND {held}")
_CHAIN_SLICE = 500  # checkpoint rows read per query: a long chain's read yields to other requests between
_CRONS = CronSQL("?", metadata_equals=lambda key, value: ("json_extract(metadata, ?) IS json_extract(?, '$')",
                                                         [f'$."{key}"', dump(value)]),
                 any_of=lambda column, values: (f"{column} IN (SELECT value FROM json_each(?))", dump(list(values))),
                 insertion_order="rowid")

_ASSISTANT_TABLE = ("assistant_id TEXT NOT NULL, graph_id TEXT NOT NULL, version INTEGER NOT NULL, "
                    "created_at TEXT NOT NULL, updated_at TEXT NOT NULL, config TEXT NOT NULL, context TEXT NOT NULL, "
                    "metadata TEXT NOT NULL, name TEXT NOT NULL, description TEXT")
_SET_ASSISTANT = ("UPDATE assistants SET graph_id = ?, version = ?, created_at = ?, updated_at = ?, config = ?, "
                  "context = ?, metadata = ?, name = ?, description = ? WHERE assistant_id = ?")


def _count_in(status: str) -> str:
    """A trigger's statement counting one more thread under ``status`` (an SQL expression)."""
    return f"INSERT INTO thread_counts VALUES ({status}, 1) ON CONFLICT (status) DO UPDATE SET n = n + 1"


_LOOKED_UP_CHARS = 256  # the longest string metadata value kept by key (longer ones are filtered by reading)
# A thread's metadata values that an equality filter can look up by key (a null, a list or an object cannot: their
# atom is null). Not m.type IN (...): SQLite builds that list's lookup table at each trigger's run (half its cost).
_SCALARS = ("json_each({0}.metadata) AS m WHERE m.atom IS NOT NULL "
            f"AND (m.type <> 'text' OR length(m.atom) <= {_LOOKED_UP_CHARS})")
_ADD_METADATA = f"INSERT INTO thread_metadata SELECT m.key, m.value, {{0}}.thread_id FROM {_SCALARS}"
_REMOVE_METADATA = (f"DELETE FROM thread_metadata WHERE {{0}}.metadata <> '{{{{}}}}' AND (key, value, thread_id) IN "
                    f"(SELECT m.key, m.value, {{0}}.thread_id FROM {_SCALARS})")

# Forward migrations, one tuple of statements per schema version (see _migrations.py). Version 1
# creates the tables with IF NOT EXISTS, so files made before versions were recorded take it as is.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE IF NOT EXISTS threads (
            thread_id TEXT PRIMARY KEY, created_at TEXT NOT NULL, updated_at TEXT NOT NULL,
            metadata TEXT NOT NULL, status TEXT NOT NULL, interrupts TEXT NOT NULL, error TEXT)""",
        """CREATE TABLE IF NOT EXISTS runs (
            run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, assistant_id TEXT NOT NULL,
            created_at TEXT NOT NULL, updated_at TEXT NOT NULL, status TEXT NOT NULL, metadata TEXT NOT NULL,
            kwargs TEXT NOT NULL, multitask_strategy TEXT NOT NULL, worker_id TEXT, scheduled_at TEXT NOT NULL,
            error TEXT, concurrency_key TEXT, concurrency_limit INTEGER)""",
        "CREATE INDEX IF NOT EXISTS runs_by_thread ON runs(thread_id, status)",
        "CREATE INDEX IF NOT EXISTS runs_by_status ON runs(status, worker_id)",
        """CREATE TABLE IF NOT EXISTS checkpoints (
            thread_id TEXT NOT NULL, seq INTEGER NOT NULL, checkpoint_id TEXT NOT NULL, parent_id TEXT,
            run_id TEXT, delta TEXT NOT NULL, next TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL,
            PRIMARY KEY (thread_id, seq)) WITHOUT ROWID""",
        "CREATE UNIQUE INDEX IF NOT EXISTS checkpoints_by_id ON checkpoints(thread_id, checkpoint_id)",
        """CREATE TABLE IF NOT EXISTS pending_writes (
            thread_id TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (thread_id, key))""",
        """CREATE TABLE IF NOT EXISTS inbox (
            thread_id TEXT NOT NULL, key TEXT NOT NULL, message TEXT NOT NULL, created_at TEXT NOT NULL,
            delivered INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (thread_id, key))""",
        """CREATE TABLE IF NOT EXISTS items (
            namespace TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL, PRIMARY KEY (namespace, key))""",
        """CREATE TABLE IF NOT EXISTS workers (
            worker_id TEXT PRIMARY KEY, info TEXT NOT NULL, heartbeat_at TEXT NOT NULL)""",
    ),
    (
        # Checkpoints in a rowid table, appended in the order they are written, found through a
        # (thread_id, seq) index: with many threads writing at once, a table keyed by thread moved
        # whole rows around its B-tree at every insert (three times the cost of a step's write).
        "ALTER TABLE checkpoints RENAME TO checkpoints_v1",
        "DROP INDEX checkpoints_by_id",
        """CREATE TABLE checkpoints (
            thread_id TEXT NOT NULL, seq INTEGER NOT NULL, checkpoint_id TEXT NOT NULL, parent_id TEXT,
            run_id TEXT, delta TEXT NOT NULL, next TEXT NOT NULL, metadata TEXT NOT NULL, created_at TEXT NOT NULL)""",
        "INSERT INTO checkpoints SELECT * FROM checkpoints_v1 ORDER BY thread_id, seq",
        "DROP TABLE checkpoints_v1",
        "CREATE UNIQUE INDEX checkpoints_by_seq ON checkpoints(thread_id, seq)",
        "CREATE UNIQUE INDEX checkpoints_by_id ON checkpoints(thread_id, checkpoint_id)",
    ),
    (
        # Every step's checkpoint also went into this index, which only lookups by id used: those
        # find the checkpoints through (thread_id, seq) instead, and a step writes a third less.
        "DROP INDEX checkpoints_by_id",
    ),
    (
        # What an ended run used and did: its token usage in its row, its spans (a timeline's data,
        # only read for one) in a table of their own.
        "ALTER TABLE runs ADD COLUMN usage TEXT",
        "CREATE TABLE run_spans (run_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, spans TEXT NOT NULL)",
        "CREATE INDEX run_spans_by_thread ON run_spans(thread_id)",
    ),
    (
        # A run's claims: how many did not end (a run that keeps killing its process stops being retried),
        # the token of the current one (every write of the run carries it), and the agent it is for.
        "ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN claim TEXT",
        "ALTER TABLE runs ADD COLUMN agent_digest TEXT",
    ),
    (
        # Crons: schedules that start runs, each tick fired by whoever moves next_run_date past it first.
        """CREATE TABLE crons (
            cron_id TEXT PRIMARY KEY, assistant_id TEXT NOT NULL, thread_id TEXT, schedule TEXT NOT NULL,
            timezone TEXT, end_time TEXT, payload TEXT NOT NULL, metadata TEXT NOT NULL, on_run_completed TEXT,
            enabled INTEGER NOT NULL, next_run_date TEXT NOT NULL, created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL)""",
        "CREATE INDEX crons_due ON crons(next_run_date) WHERE enabled",
        "CREATE INDEX crons_by_thread ON crons(thread_id)",
    ),
    (
        # Retention: threads' own times to live, and store items' (in minutes; expiry in epoch seconds).
        "CREATE TABLE thread_ttl (thread_id TEXT PRIMARY KEY, strategy TEXT NOT NULL, minutes REAL NOT NULL)",
        "ALTER TABLE items ADD COLUMN ttl_minutes REAL",
        "ALTER TABLE items ADD COLUMN expires_at REAL",
        "CREATE INDEX items_expiring ON items(expires_at) WHERE expires_at IS NOT NULL",
    ),
    (
        # A checkpoint may hold its thread's whole state (a state is folded from the nearest one).
        "ALTER TABLE checkpoints ADD COLUMN whole INTEGER NOT NULL DEFAULT 0",
    ),
    (
        # Thread search and count without reading every thread: in either time's order, and by status.
        "CREATE INDEX threads_by_updated ON threads(updated_at)",
        "CREATE INDEX threads_by_created ON threads(created_at)",
        "CREATE INDEX threads_by_status ON threads(status, updated_at)",
    ),
    (
        # Assistants made or changed through the API (a graph's own is stored once changed), and every
        # version each had: the same columns, a version's times being when it was made.
        f"CREATE TABLE assistants ({_ASSISTANT_TABLE}, PRIMARY KEY (assistant_id))",
        f"CREATE TABLE assistant_versions ({_ASSISTANT_TABLE}, PRIMARY KEY (assistant_id, version))",
    ),
    (
        # Thread counts without visiting the threads: the number of threads in each status, kept by triggers in
        # the transaction of every write that changes it (whichever code or process writes), and each thread's
        # scalar metadata values by key (what a metadata equality filter matches), read through their key.
        "CREATE TABLE thread_counts (status TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID",
        "INSERT INTO thread_counts SELECT status, count(*) FROM threads GROUP BY status",
        f"""CREATE TRIGGER thread_counted AFTER INSERT ON threads BEGIN {_count_in("NEW.status")}; END""",
        "CREATE TRIGGER thread_uncounted AFTER DELETE ON threads BEGIN "
        "UPDATE thread_counts SET n = n - 1 WHERE status = OLD.status; END",
        "CREATE TRIGGER thread_recounted AFTER UPDATE OF status ON threads WHEN OLD.status IS NOT NEW.status BEGIN "
        f"UPDATE thread_counts SET n = n - 1 WHERE status = OLD.status; {_count_in('NEW.status')}; END",
        "CREATE TABLE thread_metadata (key TEXT NOT NULL, value NOT NULL, thread_id TEXT NOT NULL, "
        "PRIMARY KEY (key, value, thread_id)) WITHOUT ROWID",
        f"INSERT INTO thread_metadata SELECT m.key, m.value, t.thread_id FROM threads t, {_SCALARS.format('t')}",
        f"CREATE TRIGGER thread_metadata_added AFTER INSERT ON threads BEGIN {_ADD_METADATA.format('NEW')}; END",
        "CREATE TRIGGER thread_metadata_removed AFTER DELETE ON threads BEGIN "
        f"{_REMOVE_METADATA.format('OLD')}; END",
        "CREATE TRIGGER thread_metadata_changed AFTER UPDATE OF metadata ON threads "
        "WHEN OLD.metadata IS NOT NEW.metadata BEGIN "
        f"{_REMOVE_METADATA.format('OLD')}; {_ADD_METADATA.format('NEW')}; END",
    ),
    (
        # A thread's messages as JSON text every so many checkpoints (see checkpoints.py): a read of a long thread
        # joins these texts and folds the few deltas since, instead of parsing every delta from the first.
        "CREATE TABLE checkpoint_bases (thread_id TEXT NOT NULL, checkpoint_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "prev_id TEXT, messages TEXT NOT NULL, rest TEXT NOT NULL)",
        "CREATE UNIQUE INDEX checkpoint_bases_by_id ON checkpoint_bases(thread_id, checkpoint_id)",
        "CREATE INDEX checkpoint_bases_by_seq ON checkpoint_bases(thread_id, seq)",
    ),
    (
        # The runs running under a concurrency key, counted at a claim without reading every running run.
        "CREATE INDEX runs_running_by_key ON runs(concurrency_key) WHERE status = 'running' "
        "AND concurrency_key IS NOT NULL",
    ),
    (
        # A run's writes without trigger statements where none is needed (each fired trigger cost about as much as
        # the write that fired it). The busy threads are counted with the idle ones (COUNTED_AS) and read from
        # threads_by_status when asked for, so a run's idle -> busy -> idle leaves the counters alone; a thread's
        # metadata values are kept by key only where there are some; recounted here from the threads.
        "DROP TRIGGER thread_counted",
        "DROP TRIGGER thread_uncounted",
        "DROP TRIGGER thread_recounted",
        "DELETE FROM thread_counts",
        f"INSERT INTO thread_counts SELECT {COUNTED_AS.format('t')}, count(*) FROM threads t GROUP BY 1",
        f"CREATE TRIGGER thread_counted AFTER INSERT ON threads BEGIN {_count_in(COUNTED_AS.format('NEW'))}; END",
        "CREATE TRIGGER thread_uncounted AFTER DELETE ON threads BEGIN "
        f"UPDATE thread_counts SET n = n - 1 WHERE status = {COUNTED_AS.format('OLD')}; END",
        "CREATE TRIGGER thread_recounted AFTER UPDATE OF status ON threads "
        f"WHEN {COUNTED_AS.format('OLD')} IS NOT {COUNTED_AS.format('NEW')} BEGIN "
        f"UPDATE thread_counts SET n = n - 1 WHERE status = {COUNTED_AS.format('OLD')}; "
        f"{_count_in(COUNTED_AS.format('NEW'))}; END",
        "DROP TRIGGER thread_metadata_added",
        "DROP TRIGGER thread_metadata_removed",
        "DROP TRIGGER thread_metadata_changed",
        "CREATE TRIGGER thread_metadata_added AFTER INSERT ON threads WHEN NEW.metadata <> '{}' BEGIN "
        f"{_ADD_METADATA.format('NEW')}; END",
        "CREATE TRIGGER thread_metadata_removed AFTER DELETE ON threads WHEN OLD.metadata <> '{}' BEGIN "
        f"{_REMOVE_METADATA.format('OLD')}; END",
        "CREATE TRIGGER thread_metadata_changed AFTER UPDATE OF metadata ON threads "
        "WHEN OLD.metadata IS NOT NEW.metadata BEGIN "
        f"{_REMOVE_METADATA.format('OLD')}; {_ADD_METADATA.format('NEW')}; END",
    ),
)

_ITEM_COLUMNS = "namespace, key, value, created_at, updated_at, ttl_minutes, expires_at"
# The nearest base at or before a seq (thread {0}, seq {1}), then each it extends, with their depth: the links
# followed first, then the texts read (a recursive query would copy each text it carries).
_BASES = ("WITH RECURSIVE b(checkpoint_id, seq, prev_id, depth) AS ("
          "SELECT * FROM (SELECT checkpoint_id, seq, prev_id, 0 FROM checkpoint_bases "
          "WHERE thread_id = {0} AND seq <= {1} ORDER BY seq DESC LIMIT 1) "
          "UNION ALL SELECT c.checkpoint_id, c.seq, c.prev_id, b.depth + 1 "
          "FROM b JOIN checkpoint_bases c ON c.thread_id = {0} AND c.checkpoint_id = b.prev_id AND c.seq < b.seq) "
          "SELECT c.checkpoint_id, c.seq, c.prev_id, c.messages, c.rest, b.depth FROM b "
          "JOIN checkpoint_bases c ON c.thread_id = {0} AND c.checkpoint_id = b.checkpoint_id")
_ACTIVE_RUN = "SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('pending', 'running')"

_OPEN: dict[str, weakref.WeakSet[SQLiteStorage]] = {}  # this process's open storages, by file

_WAL_LIMIT_PAGES = 10_000  # 40 MiB: SQLite checkpoints inside a commit past this (its default: 1,000 pages)
_QUIET_SECONDS = 0.2  # writes paused this long: time to checkpoint
_CHANGES_PER_CHECKPOINT = 1_000  # rows written since the last checkpoint that make one worth its fsyncs
_LOG_EVERY = 60.0  # seconds: a failing database is logged at most this often
# SQLite errors that say the database cannot take writes now (rather than that a statement is wrong).
_UNAVAILABLE = ("SQLITE_FULL", "SQLITE_IOERR", "SQLITE_READONLY", "SQLITE_BUSY", "SQLITE_LOCKED", "SQLITE_CANTOPEN",
                "SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_NOMEM", "SQLITE_PROTOCOL")


_PLAIN = re.compile(r'[ !#-\[\]-~]*')  # printable ASCII but '"' and '\\': a string JSON writes as it is

# The checkpoints of other runs (or of none) whose parent a run wrote: thread and run, twice.
_CHILDREN_OF_RUN = ("thread_id = ? AND run_id IS NOT ? AND NOT whole AND parent_id IN "
                    "(SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? AND run_id = ?)")


class _RunningByKey(Mapping[str, int]):
    """The running runs of each concurrency key, counted when a claim first asks (for its candidates' keys): counting
    every key's at each claim read every running run, a claim's cost growing with the runs under way."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._counts: dict[str, int] = {}

    def __getitem__(self, key: str) -> int:
        count = self._counts.get(key)
        if count is None:
            count = self._counts[key] = self._db.execute(
                "SELECT count(*) FROM runs WHERE status = 'running' AND concurrency_key = ?", (key,)).fetchone()[0]
        return count

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class _Unavailable:
    """A ``with`` block turning SQLite's "cannot write now" errors into :class:`StorageUnavailableError` (made by
    ``failed``). One per storage, for every block: a generator's context manager costs several times more, in each
    of a run's writes."""

    __slots__ = ("_failed",)

    def __init__(self, failed: Callable[[BaseException], StorageUnavailableError]) -> None:
        self._failed = failed

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, trace: Any) -> None:
        if isinstance(exc, sqlite3.Error) and str(getattr(exc, "sqlite_errorname", "")).startswith(_UNAVAILABLE):
            raise self._failed(exc) from exc


class SQLiteStorage(Storage):
    """Storage in one SQLite database file (or in memory with ``":memory:"``)."""

    def __init__(self, path: str) -> None:
        self.path = path if path == ":memory:" else os.path.expanduser(path)
        self._db: sqlite3.Connection | None = None
        self._finalizer: weakref.finalize[[sqlite3.Connection], SQLiteStorage] | None = None
        self._last_commit = 0.0
        self._checkpointed_changes = 0  # the connection's total_changes at the last checkpoint
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._waiters: list[asyncio.Future[None]] = []  # writes of the open transaction, answered at its end
        self._file: tuple[int, int] | None = None  # (device, inode) of the file opened
        self._failure_logged = False  # a failure was logged, and no commit has worked since
        self._failure_logged_at = -_LOG_EVERY
        self._refused: StorageUnavailableError | None = None  # the file is gone: no more writes
        self._served: IO[str] | None = None  # the lock this process's server holds on the file
        self._guard = _Unavailable(self._failed)

    @property
    def db(self) -> sqlite3.Connection:
        """The connection, for reads (they see this process's writes not yet committed)."""
        if self._db is None:
            raise RuntimeError("the storage is not open")
        return self._db

    def _begin(self) -> sqlite3.Connection:
        """The connection inside this tick's transaction, begun (and its commit scheduled) by the tick's first write.

        Writes made in one event-loop tick share one transaction, committed at
        the end of the tick: a commit costs more than the writes it carries.
        Without an event loop each statement commits by itself.
        """
        if self._refused is not None:
            raise self._refused
        db = self.db
        if not db.in_transaction:
            # Another storage of this process on the same file would hold the write lock until its
            # commit, which waits for this very thread: commit it first. (Looked for only if there is one: a
            # WeakSet's iteration is a generator of Python calls, at each transaction.)
            others = _OPEN.get(self.path)
            if others is not None and len(others) > 1:
                for other in others:
                    if other is not self:
                        other._commit()
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop: autocommit
                return db
            with self._unavailable():
                db.execute("BEGIN IMMEDIATE")
            loop.call_soon(self._commit)
        return db

    async def _write(self, sql: str, params: Sequence[Any] = ()) -> int:
        """Run one statement in this tick's transaction and return, once it is committed, the rows it changed."""
        db = self._begin()
        with self._unavailable():
            changed = db.execute(sql, params).rowcount
        await self._committed()
        return changed

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """Statements that must apply together, within this tick's transaction (then await :meth:`_committed`).

        A savepoint undoes them alone when they fail, unless they began the tick's transaction: it then holds
        only them (no caller awaits inside), and a rollback undoes them, two statements fewer for the first
        operation of a tick (each operation of a run that comes alone).
        """
        began = not self.db.in_transaction
        db = self._begin()
        alone = began and db.in_transaction  # not so without an event loop: the savepoint is the transaction
        with self._unavailable():
            if not alone:
                db.execute("SAVEPOINT operation")
            try:
                yield db
            except BaseException:
                if db.in_transaction:  # SQLite may have rolled the whole transaction back already
                    db.execute("ROLLBACK" if alone else "ROLLBACK TO operation")
                    if not alone:
                        db.execute("RELEASE operation")
                raise
            if not alone:
                db.execute("RELEASE operation")

    async def _committed(self) -> None:
        """Wait for the commit of this tick's transaction (:class:`StorageUnavailableError` if it failed).

        A cancelled caller's write is still committed with the others.
        """
        if self._db is not None and self._db.in_transaction:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    def _unavailable(self) -> _Unavailable:
        """A block turning SQLite's "cannot write now" errors into :class:`StorageUnavailableError`."""
        return self._guard

    def _commit(self) -> None:
        db = self._db
        if db is None or not db.in_transaction:
            self._answer(None)
            return
        try:
            self._check_file()
            db.execute("COMMIT")
        except (sqlite3.Error, StorageUnavailableError) as exc:
            self._failed(exc)
            return
        self._last_commit = time.monotonic()
        if self._failure_logged:
            logger.warning("writes to %s work again", self.path)
            self._failure_logged = False
        self._answer(None)
        if self._checkpoint_timer is None and self.path != ":memory:" and self._worth_a_checkpoint():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop: SQLite's own limit applies
                return
            self._checkpoint_timer = loop.call_later(_QUIET_SECONDS, self._checkpoint_when_quiet)

    def _failed(self, exc: BaseException) -> StorageUnavailableError:
        """A write or commit failed: roll the transaction back, fail its writers, say so once in the log."""
        error = exc if isinstance(exc, StorageUnavailableError) else StorageUnavailableError(
            f"could not write to the database {self.path}: {exc}")
        db = self._db
        if db is not None and db.in_transaction:
            with suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        self._answer(error)
        now = time.monotonic()
        if now - self._failure_logged_at >= _LOG_EVERY:  # once, not once per write (a full disk may last)
            logger.error("%s (every write fails until this is fixed)", error)
            self._failure_logged, self._failure_logged_at = True, now
        return error

    def _answer(self, error: StorageUnavailableError | None) -> None:
        """Tell the writers waiting for the transaction how it ended."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if waiter.done():  # its caller was cancelled
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def _check_file(self) -> None:
        """Refuse to commit into a file no longer at its path (deleted or replaced): its writes would be lost."""
        if self._file is None:
            return
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            how = "deleted"
        else:
            if (found.st_dev, found.st_ino) == self._file:
                return
            how = "replaced by another file"
        self._refused = StorageUnavailableError(
            f"the database file {self.path} was {how} while this process had it open: it takes no more writes "
            "(restart to open the file now at that path)")
        raise self._refused

    def _worth_a_checkpoint(self) -> bool:
        assert self._db is not None
        return self._db.total_changes - self._checkpointed_changes >= _CHANGES_PER_CHECKPOINT

    def _checkpoint_when_quiet(self) -> None:
        """Copy the WAL into the database once no commit came for ``_QUIET_SECONDS`` (passive: it
        never waits for other connections)."""
        self._checkpoint_timer = None
        db = self._db
        if db is None:
            return
        quiet = time.monotonic() - self._last_commit
        if quiet < _QUIET_SECONDS or db.in_transaction:
            delay = max(_QUIET_SECONDS - quiet, 0.01)
            self._checkpoint_timer = asyncio.get_running_loop().call_later(delay, self._checkpoint_when_quiet)
            return
        try:
            db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.OperationalError:  # another process holds a lock it needs: a later pause will do
            return
        self._checkpointed_changes = db.total_changes

    def serve_alone(self, url: str) -> None:
        # A lock on a file beside the database, held while this process lives: the kernel releases it
        # when the process ends, however it ends.
        if self.path == ":memory:" or fcntl is None or self._served is not None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        lock = open(f"{self.path}.server", "a+")  # noqa: SIM115 (held open for the life of the server)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            try:
                first = json.loads(lock.read())
            except ValueError:
                first = {}
            lock.close()
            raise ConflictError(
                f"another backchannel server (pid {first.get('pid', '?')}, {first.get('url', '?')}) serves "
                f"{self.path}: two servers on one SQLite file could not cancel, follow or take over each "
                "other's runs. Use that server, another file, or a Postgres database (which several servers "
                "share)") from None
        lock.truncate(0)
        lock.write(json.dumps({"pid": os.getpid(), "url": url}))
        lock.flush()
        self._served = lock

    async def open(self) -> None:
        if self._db is not None:
            return
        if self.path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA busy_timeout = 10000")
        if self.path != ":memory:":
            db.execute("PRAGMA journal_mode = WAL")
            db.execute("PRAGMA synchronous = NORMAL")
            db.execute(f"PRAGMA wal_autocheckpoint = {_WAL_LIMIT_PAGES}")
        for other in _OPEN.get(self.path, ()):  # their open transaction would lock the migration out
            other._commit()
        _migrate(db, self.path, _MIGRATIONS)
        if self.path != ":memory:":
            found = os.stat(self.path)
            self._file = (found.st_dev, found.st_ino)
        self._db = db
        self._refused = None
        _OPEN.setdefault(self.path, weakref.WeakSet()).add(self)
        # A program that never closes the storage still keeps its last writes.
        self._finalizer = weakref.finalize(self, _commit_and_close, db)

    async def close(self) -> None:
        if self._db is not None:
            assert self._finalizer is not None
            self._commit()  # the writes of this tick, answered
            _OPEN[self.path].discard(self)
            if self._checkpoint_timer is not None:
                self._checkpoint_timer.cancel()
                self._checkpoint_timer = None
            self._finalizer()  # closing the last connection to the file checkpoints it
            self._db = None
        if self._served is not None:
            self._served.close()  # the next server may take the file
            self._served = None

    # -- threads

    async def create_thread(self, row: ThreadRow) -> bool:
        try:
            await self._write("INSERT INTO threads VALUES (?,?,?,?,?,?,?)", thread_values(row))
        except sqlite3.IntegrityError:
            return False
        return True

    async def get_thread(self, thread_id: str) -> ThreadRow | None:
        found = self.db.execute("SELECT * FROM threads WHERE thread_id = ?", (thread_id,)).fetchone()
        return thread_row(found) if found else None

    async def update_thread(self, thread_id: str, *, status: ThreadStatus | None = None,
                            metadata: dict[str, Any] | None = None, interrupts: list[dict[str, Any]] | None = None,
                            updated_at: str | None = None) -> None:
        changes = thread_changes(status=status, metadata=metadata, interrupts=interrupts, updated_at=updated_at)
        if changes:
            columns = ", ".join(f"{column} = ?" for column in changes)
            await self._write(f"UPDATE threads SET {columns} WHERE thread_id = ?", (*changes.values(), thread_id))

    async def delete_thread(self, thread_id: str) -> bool:
        with self._transaction() as db:
            deleted = db.execute("DELETE FROM threads WHERE thread_id = ?", (thread_id,)).rowcount
            for table in THREAD_TABLES:
                db.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
        await self._committed()
        return bool(deleted)

    async def delete_idle_thread(self, thread_id: str) -> bool:
        with self._transaction() as db:
            deleted = db.execute(f"DELETE FROM threads AS t WHERE t.thread_id = ? AND NOT EXISTS "
                                 f"({_ACTIVE_RUN.replace('?', 't.thread_id')}) AND {_NOTHING_TO_COME}",
                                 (thread_id,)).rowcount
            if deleted:
                for table in THREAD_TABLES:
                    db.execute(f"DELETE FROM {table} WHERE thread_id = ?", (thread_id,))
        await self._committed()
        return bool(deleted)

    async def set_thread_ttl(self, thread_id: str, ttl: ThreadTTL) -> None:
        await self._write("INSERT OR REPLACE INTO thread_ttl SELECT thread_id, ?, ? FROM threads WHERE thread_id = ?",
                          (ttl.strategy, ttl.minutes, thread_id))

    async def thread_ttl(self, thread_id: str) -> ThreadTTL | None:
        found = self.db.execute("SELECT strategy, minutes FROM thread_ttl WHERE thread_id = ?", (thread_id,)).fetchone()
        return ThreadTTL(found[0], found[1]) if found else None

    async def expired_threads(self, now: str, default: ThreadTTL | None, limit: int) -> list[tuple[str, PruneStrategy]]:
        strategy, minutes = default or (None, None)
        rows = self.db.execute(
            "SELECT t.thread_id, coalesce(x.strategy, ?) AS strategy FROM threads t "
            "LEFT JOIN thread_ttl x ON x.thread_id = t.thread_id "
            "WHERE (julianday(t.updated_at) - 2440587.5) * 86400.0 + coalesce(x.minutes, ?) * 60 <= ? "
            "AND t.status <> 'busy' "
            f"AND NOT EXISTS ({_ACTIVE_RUN.replace('?', 't.thread_id')}) "
            f"AND {_NOTHING_TO_COME} "
            "AND (coalesce(x.strategy, ?) = 'delete' "
            "     OR EXISTS (SELECT 1 FROM checkpoints c WHERE c.thread_id = t.thread_id AND c.parent_id IS NOT NULL)) "
            "LIMIT ?", (strategy, minutes, epoch_of(now), strategy, limit)).fetchall()
        return [(thread_id, found) for thread_id, found in rows]

    def _thread_filter(self, metadata: dict[str, Any] | None, status: ThreadStatus | None,
                       ids: Sequence[str] | None = None) -> tuple[str, list[Any]]:
        clauses: list[str] = ["1"]
        params: list[Any] = []
        for key, value in (metadata or {}).items():
            if isinstance(value, str) and _PLAIN.fullmatch(value):  # its text is in any JSON that holds it
                clauses.append("instr(metadata, ?)")  # much cheaper than the JSON look-up it spares most rows
                params.append(f'"{value}"')
            clauses.append("json_extract(metadata, ?) IS json_extract(?, '$')")
            params += [f'$."{key}"', dump(value)]
        if status is not None:
            clauses.append("status = ?")
            params.append(status)
        if ids is not None:
            clauses.append(f"thread_id IN ({','.join('?' * len(ids))})")
            params += list(ids)
        return " AND ".join(clauses), params

    async def search_threads(self, *, metadata: dict[str, Any] | None = None, status: ThreadStatus | None = None,
                             ids: Sequence[str] | None = None, limit: int = 10, offset: int = 0,
                             sort_by: str = "created_at", sort_order: str = "desc") -> list[ThreadRow]:
        sort_by, order = thread_order(sort_by, sort_order)
        where, params = self._thread_filter(metadata, status, ids)
        rows = self.db.execute(
            f"SELECT * FROM threads WHERE {where} ORDER BY {THREAD_SORT_SQL.get(sort_by, sort_by)} {order}, "
            f"rowid {order} LIMIT ? OFFSET ?",
            (*params, limit, offset)).fetchall()
        return [thread_row(r) for r in rows]

    async def count_threads(self, *, metadata: dict[str, Any] | None = None,
                            status: ThreadStatus | None = None) -> int:
        if not metadata:  # the counts kept per status
            return int(self.db.execute(*thread_count(status, "?")).fetchone()[0])
        looked_up = next(((k, v) for k, v in metadata.items() if _looked_up_by_key(v)), None)
        if looked_up is None:
            where, params = self._thread_filter(metadata, status)
            return int(self.db.execute(f"SELECT count(*) FROM threads WHERE {where}", params).fetchone()[0])
        if len(metadata) == 1 and status is None:  # the look-up is the filter (the same SQL values compared)
            return int(self.db.execute("SELECT count(*) FROM thread_metadata WHERE key = ? AND value = ?",
                                       looked_up).fetchone()[0])
        where, params = self._thread_filter(metadata, status)
        # CROSS JOIN: the threads with that value first, each then filtered (not every thread in a status)
        return int(self.db.execute(
            "SELECT count(*) FROM thread_metadata m CROSS JOIN threads t ON t.thread_id = m.thread_id "
            f"WHERE m.key = ? AND m.value = ? AND {where}", (*looked_up, *params)).fetchone()[0])

    # -- assistants

    async def create_assistant(self, row: AssistantRow) -> bool:
        try:
            with self._transaction() as db:
                db.execute("INSERT INTO assistants VALUES (?,?,?,?,?,?,?,?,?,?)", assistant_values(row))
                db.execute("INSERT INTO assistant_versions VALUES (?,?,?,?,?,?,?,?,?,?)", assistant_values(row))
        except sqlite3.IntegrityError:
            return False
        await self._committed()
        return True

    async def get_assistant(self, assistant_id: str) -> AssistantRow | None:
        found = self.db.execute(f"SELECT {ASSISTANT_COLUMNS} FROM assistants WHERE assistant_id = ?",
                                (assistant_id,)).fetchone()
        return assistant_row(found) if found else None

    async def update_assistant(self, row: AssistantRow, seen: AssistantRow) -> AssistantRow | None:
        with self._transaction() as db:
            if db.execute("SELECT 1 FROM assistants WHERE assistant_id = ? AND version = ? AND updated_at = ?",
                          (seen.assistant_id, seen.version, seen.updated_at)).fetchone() is None:
                return None
            (newest,) = db.execute("SELECT max(version) FROM assistant_versions WHERE assistant_id = ?",
                                   (row.assistant_id,)).fetchone()
            new = replace(row, version=newest + 1)
            db.execute(_SET_ASSISTANT, (*assistant_values(new)[1:], new.assistant_id))
            db.execute("INSERT INTO assistant_versions VALUES (?,?,?,?,?,?,?,?,?,?)",
                       assistant_values(replace(new, created_at=new.updated_at)))
        await self._committed()
        return new

    async def set_assistant_version(self, assistant_id: str, version: int, now: str) -> AssistantRow | None:
        with self._transaction() as db:
            found = db.execute(f"SELECT {ASSISTANT_COLUMNS} FROM assistant_versions WHERE assistant_id = ? "
                               "AND version = ?", (assistant_id, version)).fetchone()
            current = db.execute("SELECT created_at FROM assistants WHERE assistant_id = ?", (assistant_id,)).fetchone()
            if found is None or current is None:
                return None
            row = replace(assistant_row(found), created_at=current[0], updated_at=now)
            db.execute(_SET_ASSISTANT, (*assistant_values(row)[1:], assistant_id))
        await self._committed()
        return row

    async def delete_assistant(self, assistant_id: str) -> bool:
        with self._transaction() as db:
            db.execute("DELETE FROM assistant_versions WHERE assistant_id = ?", (assistant_id,))
            deleted = db.execute("DELETE FROM assistants WHERE assistant_id = ?", (assistant_id,)).rowcount
        await self._committed()
        return bool(deleted)

    def _assistant_filter(self, graph_ids: Sequence[str], ids: Sequence[str] | None, graph_id: str | None,
                          name: str | None, metadata: dict[str, Any] | None) -> tuple[str, list[Any]]:
        clauses = [f"graph_id IN ({','.join('?' * len(graph_ids))})"]
        params: list[Any] = list(graph_ids)
        if ids is not None:
            clauses.append(f"assistant_id IN ({','.join('?' * len(ids))})")
            params += list(ids)
        if graph_id is not None:
            clauses.append("graph_id = ?")
            params.append(graph_id)
        if name is not None:
            clauses.append("instr(lower(name), lower(?)) > 0")
            params.append(name)
        for key, value in (metadata or {}).items():
            clauses.append("json_extract(metadata, ?) IS json_extract(?, '$')")
            params += [f'$."{key}"', dump(value)]
        return " AND ".join(clauses), params

    async def search_assistants(self, *, graph_ids: Sequence[str], ids: Sequence[str] | None = None,
                                graph_id: str | None = None, name: str | None = None,
                                metadata: dict[str, Any] | None = None, limit: int = 10, offset: int = 0,
                                sort_by: str = "created_at", sort_order: str = "desc") -> list[AssistantRow]:
        order = assistant_order(sort_by, sort_order)
        where, params = self._assistant_filter(graph_ids, ids, graph_id, name, metadata)
        rows = self.db.execute(f"SELECT {ASSISTANT_COLUMNS} FROM assistants WHERE {where} ORDER BY {order} "
                               "LIMIT ? OFFSET ?", (*params, limit, offset)).fetchall()
        return [assistant_row(r) for r in rows]

    async def count_assistants(self, *, graph_ids: Sequence[str], graph_id: str | None = None,
                               name: str | None = None, metadata: dict[str, Any] | None = None) -> int:
        where, params = self._assistant_filter(graph_ids, None, graph_id, name, metadata)
        return int(self.db.execute(f"SELECT count(*) FROM assistants WHERE {where}", params).fetchone()[0])

    async def assistant_versions(self, assistant_id: str, *, metadata: dict[str, Any] | None = None,
                                 limit: int = 10, offset: int = 0) -> list[AssistantRow]:
        clauses, params = ["assistant_id = ?"], [assistant_id]
        for key, value in (metadata or {}).items():
            clauses.append("json_extract(metadata, ?) IS json_extract(?, '$')")
            params += [f'$."{key}"', dump(value)]
        rows = self.db.execute(f"SELECT {ASSISTANT_COLUMNS} FROM assistant_versions WHERE {' AND '.join(clauses)} "
                               "ORDER BY version DESC LIMIT ? OFFSET ?", (*params, limit, offset)).fetchall()
        return [assistant_row(r) for r in rows]

    # -- runs

    async def create_run(self, row: RunRow, *, notice: Notice | None = None) -> bool:
        return bool(await self._write(_RUN_ON_ITS_THREAD, (*run_values(row), row.thread_id)))

    claims_on_insert = True  # a claim of its own is a transaction and a commit when runs come one at a time

    async def create_claimed_run(self, row: RunRow, claim: str, *, thread: ThreadRow | None = None,
                                 start: RunStart | None = None, notice: Notice | None = None) -> StoredRun | None:
        # One transaction: SQLite has one writer, so what it reads here holds until it commits, as claim_runs's
        # reads do. A thread made here has nothing to read unless a checkpoint or mail was left without it; one
        # there already given as ``thread`` (made meanwhile by another request) is made busy instead, with this
        # run's metadata, and the run goes pending, as on Postgres. A thread that exists is looked at too (one made
        # by POST /threads before its first run, or the thread of a chat's next turn whose state this process
        # holds), so its run's input goes in with the claim.
        thread_id = row.thread_id
        with self._transaction() as db:
            made = thread is not None and db.execute(
                "INSERT INTO threads VALUES (?,?,?,?,?,?,?) ON CONFLICT (thread_id) DO NOTHING",
                thread_values(thread)).rowcount == 1
            if thread is not None and not made:
                db.execute("UPDATE threads SET status = 'busy', metadata = ?, updated_at = ? WHERE thread_id = ?",
                           (dump(thread.metadata), thread.updated_at, thread_id))
            free = made or (thread is None and db.execute(_FREE_THREAD, (thread_id, thread_id)).fetchone()[0] == 1)
            head, mail = db.execute(_THREAD_AS_IT_IS, (thread_id, thread_id)).fetchone() if free else (None, True)
            if made and (head is not None or mail):  # claimed only on a thread made here with nothing else
                free = False
            known = free and start is not None and head == start.parent and not mail
            if free:
                running = replace(row, status="running", attempts=1, claim=claim)
                db.execute(f"INSERT INTO runs VALUES ({','.join('?' * 18)})", run_values(running))
                written = start() if start is not None and known else None
                if written is not None:  # after the head just read, under the claim made just now
                    sql, params, then = _checkpoint_statements(written)
                    db.execute(sql.format(held="1"), params)
                    if then is not None:
                        db.execute(*then)
                stored: StoredRun | None = StoredRun("running", known=known)
            else:
                stored = StoredRun("pending", known=False) if db.execute(
                    _RUN_ON_ITS_THREAD, (*run_values(row), thread_id)).rowcount else None
        await self._committed()
        return stored

    async def get_run(self, run_id: str) -> RunRow | None:
        found = self.db.execute("SELECT * FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return run_row(found) if found else None

    async def delete_run(self, run_id: str) -> bool:
        with self._transaction() as db:
            db.execute("DELETE FROM run_spans WHERE run_id = ?", (run_id,))
            deleted = db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,)).rowcount
        await self._committed()
        return bool(deleted)

    async def list_runs(self, thread_id: str, *, status: RunStatus | None = None, limit: int = 10,
                        offset: int = 0) -> list[RunRow]:
        where, params = "thread_id = ?", [thread_id]
        if status is not None:
            where += " AND status = ?"
            params.append(status)
        rows = self.db.execute(f"SELECT * FROM runs WHERE {where} ORDER BY rowid DESC LIMIT ? OFFSET ?",
                               (*params, limit, offset)).fetchall()
        return [run_row(r) for r in rows]

    async def count_runs_by_status(self) -> dict[RunStatus, int]:
        return {status: count for status, count in self.db.execute("SELECT status, count(*) FROM runs GROUP BY status")}

    async def runs_with_status(self, statuses: Sequence[RunStatus]) -> list[RunRow]:
        rows = self.db.execute("SELECT * FROM runs WHERE status IN (SELECT value FROM json_each(?)) ORDER BY rowid",
                               (dump(list(statuses)),)).fetchall()
        return [run_row(r) for r in rows]

    async def active_runs(self, thread_id: str) -> list[RunRow]:
        rows = self.db.execute(
            "SELECT * FROM runs WHERE thread_id = ? AND status IN ('pending', 'running') ORDER BY rowid",
            (thread_id,)).fetchall()
        return [run_row(r) for r in rows]

    async def claim_runs(self, worker_id: str, limit: int, now: str) -> list[RunRow]:
        with self._transaction() as db:
            running = _RunningByKey(db)
            # Read only as far as the claims go (the index gives rowid order): a long queue is not read
            # whole at every claim.
            candidates = db.execute(
                "SELECT * FROM runs r WHERE status = 'pending' AND worker_id = ? AND scheduled_at <= ? "
                "AND NOT EXISTS (SELECT 1 FROM runs x WHERE x.thread_id = r.thread_id AND x.status = 'running') "
                "ORDER BY rowid", (worker_id, now))
            claimed = pick_claims(map(run_row, candidates), running, limit)
            candidates.close()
            token = new_id()
            db.execute("UPDATE runs SET status = 'running', updated_at = ?, attempts = attempts + 1, claim = ? "
                       "WHERE run_id IN (SELECT value FROM json_each(?))",
                       (now, token, dump([r.run_id for r in claimed])))
        await self._committed()
        for row in claimed:
            row.status, row.attempts, row.claim = "running", row.attempts + 1, token
        return claimed

    @staticmethod
    def _hold(db: sqlite3.Connection, claim: RunClaim | None) -> None:
        """Within the tick's transaction (no other process writes meanwhile): raise LostRunError unless the
        run is running under ``claim``."""
        if claim is not None and db.execute(f"SELECT {_HELD}", claim).fetchone()[0] == 0:
            raise LostRunError(f"run {claim.run_id} is no longer this process's to run")

    async def _fenced(self, claim: RunClaim | None, sql: str, params: Sequence[Any],
                      then: tuple[str, Sequence[Any]] | None = None) -> int:
        """Run one statement of a run's, if its claim holds; returns the rows it changed. ``then``, a statement
        made in the same transaction when it changed some.

        ``sql`` ends in a condition ``{held}``: the claim's check, so check and write are one statement
        (atomic by itself, no savepoint). Only when it changed nothing is the claim read again, to tell a
        lost run from a write with nothing to change.
        """
        if claim is None and then is None:
            return await self._write(sql.format(held="1"), params)
        db = self._begin()
        with self._unavailable():
            changed = db.execute(sql.format(held=_HELD if claim else "1"), (*params, *(claim or ()))).rowcount
            if changed == 0 and claim is not None:
                self._hold(db, claim)
            if changed and then is not None:
                db.execute(*then)
        await self._committed()
        return changed

    async def release_run(self, claim: RunClaim, now: str) -> bool:
        changed = await self._write(
            "UPDATE runs SET status = 'pending', claim = NULL, attempts = max(attempts - 1, 0), updated_at = ? "
            "WHERE run_id = ? AND claim = ? AND status = 'running'", (now, *claim))
        return bool(changed)

    async def finish_run(self, end: RunEnd) -> bool:
        with self._transaction() as db:
            # The claim's check is the run's own update (its first write: nothing to undo when it fails).
            ended = db.execute("UPDATE runs SET status = ?, error = ?, updated_at = ?, usage = ? WHERE run_id = ? "
                               "AND (? IS NULL OR (claim = ? AND status = 'running'))",
                               (end.status, dump(end.error) if end.error else None, end.updated_at,
                                dump(end.usage) if end.usage else None, end.run_id, end.claim, end.claim))
            if ended.rowcount == 0 and end.claim is not None:
                raise LostRunError(f"run {end.run_id} is no longer this process's to run")
            if end.checkpoint is not None:  # its last step: under the claim just checked
                sql, params, then = _checkpoint_statements(end.checkpoint)
                if db.execute(sql.format(held="1"), params).rowcount == 0:
                    raise ParentGoneError(f"checkpoint {end.checkpoint.row.checkpoint_id} has no parent any more")
                if then is not None:
                    db.execute(*then)
            if end.spans is not None:
                db.execute("INSERT OR REPLACE INTO run_spans VALUES (?, ?, ?)",
                           (end.run_id, end.thread_id, dump(end.spans)))
            db.execute(
                "UPDATE threads SET status = CASE WHEN EXISTS (SELECT 1 FROM runs WHERE thread_id = ? AND status IN "
                "('pending', 'running')) THEN 'busy' ELSE ? END, error = ?, updated_at = ?, "
                "interrupts = coalesce(?, interrupts) WHERE thread_id = ?",
                (end.thread_id, end.thread_status, dump(end.thread_error) if end.thread_error else None,
                 end.updated_at, None if end.interrupts is None else dump(end.interrupts), end.thread_id))
            if end.checkpoint_next is not None:
                db.execute("UPDATE checkpoints SET next = ? WHERE thread_id = ? AND checkpoint_id = ?",
                           (end.checkpoint_next[1], end.thread_id, end.checkpoint_next[0]))
            found = db.execute("SELECT EXISTS (SELECT 1 FROM inbox WHERE thread_id = ? AND delivered = 0)",
                               (end.thread_id,))
            has_mail = bool(found.fetchone()[0])
        await self._committed()
        return has_mail

    async def run_spans(self, thread_id: str) -> dict[str, list[dict[str, Any]]]:
        rows = self.db.execute("SELECT run_id, spans FROM run_spans WHERE thread_id = ?", (thread_id,))
        return {run_id: json.loads(spans) for run_id, spans in rows.fetchall()}

    async def drop_pending_run(self, run_id: str, action: CancelAction, now: str) -> bool:
        with self._transaction() as db:
            found = db.execute("SELECT thread_id FROM runs WHERE run_id = ? AND status = 'pending'", (run_id,))
            row = found.fetchone()
            if row is None:
                return False
            if action == "rollback":
                db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            else:
                db.execute("UPDATE runs SET status = 'interrupted', updated_at = ? WHERE run_id = ?", (now, run_id))
            db.execute("UPDATE threads SET status = CASE WHEN interrupts = '[]' THEN 'idle' ELSE 'interrupted' END "
                       "WHERE thread_id = ? AND status = 'busy' AND NOT EXISTS "
                       "(SELECT 1 FROM runs WHERE thread_id = ? AND status IN ('pending', 'running'))",
                       (row[0], row[0]))
        await self._committed()
        return True

    async def requeue_orphans(self, alive_workers: Sequence[str], new_worker_id: str,
                              agents: Mapping[str, str], *, limit: int | None = None) -> list[str]:
        marks = ",".join("?" * len(alive_workers))
        orphaned = (f"status IN ('pending', 'running') AND (worker_id IS NULL OR (worker_id NOT IN ({marks}) "
                    "AND worker_id NOT IN (SELECT worker_id FROM workers))) AND (agent_digest IN "
                    "(SELECT value FROM json_each(?)) OR (agent_digest IS NULL AND assistant_id IN "
                    "(SELECT value FROM json_each(?))))")
        served = (*alive_workers, dump(list(agents.values())), dump(list(agents)))
        oldest = f"SELECT rowid FROM runs WHERE {orphaned} ORDER BY rowid LIMIT ?"
        with self._transaction() as db:
            rows = db.execute(f"UPDATE runs SET status = 'pending', worker_id = ?, claim = NULL WHERE rowid IN "
                              f"({oldest}) RETURNING rowid, run_id, thread_id",
                              (new_worker_id, *served, -1 if limit is None else limit)).fetchall()
            rows.sort()  # RETURNING's order is SQLite's to choose
            db.execute("UPDATE threads SET status = 'busy' WHERE status <> 'busy' AND thread_id IN "
                       "(SELECT value FROM json_each(?))", (dump(sorted({row[2] for row in rows})),))
        await self._committed()
        return [run_id for _, run_id, _ in rows]

    # -- workers

    async def heartbeat(self, worker_id: str, info: dict[str, Any], now: str) -> bool:
        with self._transaction() as db:
            renewed = db.execute("UPDATE workers SET heartbeat_at = ? WHERE worker_id = ?", (now, worker_id))
            known = bool(renewed.rowcount)
            if not known:
                db.execute("INSERT INTO workers VALUES (?,?,?)", (worker_id, dump(info), now))
        await self._committed()
        return known

    async def workers(self) -> dict[str, tuple[dict[str, Any], str]]:
        rows = self.db.execute("SELECT worker_id, info, heartbeat_at FROM workers").fetchall()
        return {w: (json.loads(info), at) for w, info, at in rows}

    async def forget_worker(self, worker_id: str) -> None:
        await self._write("DELETE FROM workers WHERE worker_id = ?", (worker_id,))

    # -- checkpoints

    async def put_checkpoint(self, row: CheckpointRow, claim: RunClaim | None = None, *,
                             parent_seq: int | None = None, base: CheckpointBase | None = None) -> bool:
        sql, params, then = _checkpoint_statements(CheckpointWrite(row, parent_seq, base))
        changed = await self._fenced(claim, sql, params, then)
        return parent_seq is None or bool(changed)

    async def get_checkpoint(self, thread_id: str, checkpoint_id: str) -> CheckpointRow | None:
        found = self.db.execute("SELECT * FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
                                (thread_id, checkpoint_id)).fetchone()
        return checkpoint_row(found) if found else None

    async def head_checkpoint(self, thread_id: str) -> CheckpointRow | None:
        found = self.db.execute("SELECT * FROM checkpoints WHERE thread_id = ? ORDER BY seq DESC LIMIT 1",
                                (thread_id,)).fetchone()
        return checkpoint_row(found) if found else None

    async def list_checkpoints(self, thread_id: str, *, limit: int | None = None,
                               before_seq: int | None = None) -> list[CheckpointRow]:
        where = "thread_id = ?"
        params: list[Any] = [thread_id]
        if before_seq is not None:
            where += " AND seq < ?"
            params.append(before_seq)
        rows = self.db.execute(f"SELECT * FROM checkpoints WHERE {where} ORDER BY seq DESC LIMIT ?",
                               (*params, -1 if limit is None else limit)).fetchall()
        return [checkpoint_row(r) for r in rows]

    async def checkpoint_chain(self, thread_id: str, checkpoint_id: str, seq: int | None = None, *,
                               since: int | None = None) -> list[CheckpointRow]:
        db = self.db
        if seq is None:
            found = db.execute("SELECT seq FROM checkpoints WHERE thread_id = ? AND checkpoint_id = ?",
                               (thread_id, checkpoint_id)).fetchone()
            if found is None:
                return []
            seq = int(found[0])
        if since is not None:
            return checkpoint_chain(await self._checkpoint_rows(thread_id, since, seq), checkpoint_id)
        start = db.execute("SELECT seq FROM checkpoints WHERE thread_id = ? AND seq <= ? AND whole "
                           "ORDER BY seq DESC LIMIT 1", (thread_id, seq)).fetchone()
        chain = checkpoint_chain(await self._checkpoint_rows(thread_id, start[0] if start else 0, seq), checkpoint_id)
        if not chain_is_whole(chain):  # a fork from before that whole checkpoint: read back to the first
            chain = checkpoint_chain(await self._checkpoint_rows(thread_id, 0, seq), checkpoint_id)
        return chain

    async def checkpoint_bases(self, thread_id: str, seq: int) -> list[CheckpointBase]:
        rows = self.db.execute(_BASES.format("?1", "?2"), (thread_id, seq)).fetchall()
        return base_chain(thread_id, rows)

    async def _checkpoint_rows(self, thread_id: str, first: int, last: int) -> list[tuple[Any, ...]]:
        """A thread's checkpoint rows with seq in [first, last], read in slices (each a whole query, so no
        cursor stays open across the yields) so a long chain's read leaves the loop to other requests between."""
        rows: list[tuple[Any, ...]] = []
        while True:
            found = self.db.execute("SELECT * FROM checkpoints WHERE thread_id = ? AND seq BETWEEN ? AND ? "
                                    "ORDER BY seq LIMIT ?", (thread_id, first, last, _CHAIN_SLICE)).fetchall()
            rows += found
            if len(found) < _CHAIN_SLICE:
                return rows
            first = int(found[-1][1]) + 1
            await asyncio.sleep(0)

    async def set_checkpoint_next(self, thread_id: str, checkpoint_id: str, next: str) -> None:
        await self._write("UPDATE checkpoints SET next = ? WHERE thread_id = ? AND checkpoint_id = ?",
                          (next, thread_id, checkpoint_id))

    async def children_of_run(self, thread_id: str, run_id: str) -> list[CheckpointRow]:
        rows = self.db.execute(f"SELECT * FROM checkpoints WHERE {_CHILDREN_OF_RUN} ORDER BY seq",
                               (thread_id, run_id, thread_id, run_id)).fetchall()
        return [checkpoint_row(r) for r in rows]

    async def delete_checkpoints_of_run(self, thread_id: str, run_id: str,
                                        whole: Sequence[CheckpointRow] = ()) -> bool:
        replaced = {r.checkpoint_id for r in whole}
        with self._transaction() as db:
            children = db.execute(f"SELECT checkpoint_id FROM checkpoints WHERE {_CHILDREN_OF_RUN}",
                                  (thread_id, run_id, thread_id, run_id)).fetchall()
            if {c for (c,) in children} - replaced:
                return False
            for row in whole:
                db.execute("UPDATE checkpoints SET delta = ?, whole = 1 WHERE thread_id = ? AND checkpoint_id = ?",
                           (delta_text(row.delta), thread_id, row.checkpoint_id))
            db.execute("DELETE FROM checkpoints WHERE thread_id = ? AND run_id = ?", (thread_id, run_id))
            db.execute("DELETE FROM checkpoint_bases WHERE thread_id = ?", (thread_id,))  # a step's own come again
        await self._committed()
        return True

    async def keep_only_checkpoint(self, row: CheckpointRow) -> bool:
        with self._transaction() as db:
            head = db.execute("SELECT checkpoint_id FROM checkpoints WHERE thread_id = ? ORDER BY seq DESC LIMIT 1",
                              (row.thread_id,)).fetchone()
            busy = db.execute(f"SELECT EXISTS ({_ACTIVE_RUN})", (row.thread_id,)).fetchone()[0]
            kept = head is not None and head[0] == row.checkpoint_id and not busy
            if kept:
                db.execute("DELETE FROM checkpoints WHERE thread_id = ?", (row.thread_id,))
                db.execute("DELETE FROM checkpoint_bases WHERE thread_id = ?", (row.thread_id,))
                values = checkpoint_values(row)
                db.execute(f"INSERT INTO checkpoints VALUES ({','.join('?' * len(values))})", values)
        await self._committed()
        return kept

    async def copy_checkpoints(self, thread_id: str, new_thread_id: str) -> None:
        with self._transaction() as db:
            db.execute("INSERT INTO checkpoints SELECT ?, seq, checkpoint_id, parent_id, run_id, delta, next, "
                       "metadata, created_at, whole FROM checkpoints WHERE thread_id = ?", (new_thread_id, thread_id))
            db.execute(f"INSERT INTO checkpoint_bases ({BASE_COLUMNS}) SELECT ?, checkpoint_id, seq, prev_id, "
                       "messages, rest FROM checkpoint_bases WHERE thread_id = ?", (new_thread_id, thread_id))
        await self._committed()

    async def put_pending_write(self, thread_id: str, key: str, value: Mapping[str, Any],
                                claim: RunClaim | None = None) -> None:
        await self._fenced(claim, "INSERT OR REPLACE INTO pending_writes SELECT ?,?,? WHERE {held}",
                           (thread_id, key, dumps(value)))

    async def pending_writes(self, thread_id: str) -> dict[str, Mapping[str, Any]]:
        rows = self.db.execute("SELECT key, value FROM pending_writes WHERE thread_id = ?", (thread_id,))
        return {key: json.loads(value) for key, value in rows.fetchall()}

    async def clear_pending_writes(self, thread_id: str, claim: RunClaim | None = None) -> None:
        await self._fenced(claim, "DELETE FROM pending_writes WHERE thread_id = ? AND {held}", (thread_id,))

    # -- inbox

    async def put_inbox(self, thread_id: str, key: str, message: AnyMessage, now: str) -> bool:
        # Only for a thread that exists (in the same statement: a deletion commits wholly before or after it).
        if await self._write("INSERT OR IGNORE INTO inbox SELECT ?,?,?,?,0 WHERE EXISTS "
                             "(SELECT 1 FROM threads WHERE thread_id = ?)",
                             (thread_id, key, dumps(message), now, thread_id)) == 1:
            return True
        if self.db.execute("SELECT 1 FROM threads WHERE thread_id = ?", (thread_id,)).fetchone() is None:
            raise NotFoundError(f"thread {thread_id!r} not found")
        return False

    async def inbox(self, thread_id: str) -> list[tuple[str, AnyMessage]]:
        rows = self.db.execute("SELECT key, message FROM inbox WHERE thread_id = ? AND delivered = 0 "
                               "ORDER BY created_at, rowid", (thread_id,))
        return [(key, inbox_message(message)) for key, message in rows.fetchall()]

    async def ack_inbox(self, thread_id: str, keys: Sequence[str], claim: RunClaim | None = None) -> None:
        await self._fenced(claim, "UPDATE inbox SET delivered = 1 WHERE thread_id = ? AND key IN "
                           "(SELECT value FROM json_each(?)) AND {held}", (thread_id, dump(list(keys))))

    async def threads_with_mail(self) -> list[str]:
        rows = self.db.execute("SELECT DISTINCT thread_id FROM inbox WHERE delivered = 0")
        return [r[0] for r in rows.fetchall()]

    # -- items

    async def put_item(self, namespace: tuple[str, ...], key: str, value: dict[str, Any], now: str,
                       ttl: float | None = None) -> None:
        expires = epoch_of(now) + ttl * 60 if ttl is not None else None
        await self._write(f"INSERT INTO items ({_ITEM_COLUMNS}) VALUES (?,?,?,?,?,?,?) ON CONFLICT(namespace, key) "
                          "DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at, "
                          "ttl_minutes = excluded.ttl_minutes, expires_at = excluded.expires_at",
                          (SEP.join(namespace), key, dump(value), now, now, ttl, expires))

    async def get_item(self, namespace: tuple[str, ...], key: str, *, now: str | None = None,
                       refresh: bool = False) -> ItemRow | None:
        params: list[Any] = [SEP.join(namespace), key]
        where = "namespace = ? AND key = ?"
        if now is not None:
            where += " AND (expires_at IS NULL OR expires_at > ?)"
            params.append(epoch_of(now))
        found = self.db.execute(f"SELECT {_ITEM_COLUMNS} FROM items WHERE {where}", params).fetchone()
        if found is not None and refresh and now is not None and found[5] is not None:
            await self._refresh_items([found], now)
        return item_row(found) if found else None

    async def _refresh_items(self, rows: Sequence[tuple[Any, ...]], now: str) -> None:
        """Start the time to live of the items (rows as selected) again at ``now``."""
        at = epoch_of(now)
        with self._transaction() as db:
            db.executemany("UPDATE items SET expires_at = ? + ttl_minutes * 60 WHERE namespace = ? AND key = ? "
                           "AND ttl_minutes IS NOT NULL", [(at, r[0], r[1]) for r in rows if r[5] is not None])
        await self._committed()

    async def delete_item(self, namespace: tuple[str, ...], key: str) -> None:
        await self._write("DELETE FROM items WHERE namespace = ? AND key = ?", (SEP.join(namespace), key))

    async def search_items(self, prefix: tuple[str, ...], *, filter: dict[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, now: str | None = None,
                           refresh: bool = False) -> list[ItemRow]:
        clauses: list[str] = ["1"]
        params: list[Any] = []
        if prefix:
            joined = SEP.join(prefix)
            clauses.append("(namespace = ? OR substr(namespace, 1, ?) = ?)")
            params += [joined, len(joined) + 1, joined + SEP]
        for key, value in (filter or {}).items():
            clauses.append("json_extract(value, ?) IS json_extract(?, '$')")
            params += [f'$."{key}"', dump(value)]
        if now is not None:
            clauses.append("(expires_at IS NULL OR expires_at > ?)")
            params.append(epoch_of(now))
        rows = self.db.execute(f"SELECT {_ITEM_COLUMNS} FROM items WHERE {' AND '.join(clauses)} "
                               "ORDER BY updated_at DESC LIMIT ? OFFSET ?", (*params, limit, offset)).fetchall()
        if refresh and now is not None and any(r[5] is not None for r in rows):
            await self._refresh_items(rows, now)
        return [item_row(r) for r in rows]

    async def delete_expired_items(self, now: str) -> int:
        return await self._write("DELETE FROM items WHERE expires_at <= ?", (epoch_of(now),))

    async def list_namespaces(self, *, prefix: tuple[str, ...] = (), suffix: tuple[str, ...] = (),
                              max_depth: int | None = None, limit: int = 100,
                              offset: int = 0) -> list[tuple[str, ...]]:
        rows = self.db.execute("SELECT DISTINCT namespace FROM items")
        return matching_namespaces((joined for (joined,) in rows), prefix, suffix, max_depth, limit, offset)

    # -- crons

    async def create_cron(self, row: CronRow) -> None:
        await self._write(*_CRONS.insert(row))

    async def get_cron(self, cron_id: str) -> CronRow | None:
        found = self.db.execute(*_CRONS.get(cron_id)).fetchone()
        return cron_row(found) if found else None

    async def update_cron(self, row: CronRow, *, reschedule: bool) -> bool:
        return bool(await self._write(*_CRONS.update(row, reschedule=reschedule)))

    async def delete_cron(self, cron_id: str) -> bool:
        return bool(await self._write(*_CRONS.delete(cron_id)))

    async def search_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                           enabled: bool | None = None, metadata: dict[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, sort_by: str = "created_at", sort_order: str = "desc") -> list[CronRow]:
        query = _CRONS.search(assistant_id, thread_id, enabled, metadata, limit, offset, sort_by, sort_order)
        return [cron_row(r) for r in self.db.execute(*query).fetchall()]

    async def count_crons(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                          metadata: dict[str, Any] | None = None) -> int:
        return int(self.db.execute(*_CRONS.count(assistant_id, thread_id, metadata)).fetchone()[0])

    async def due_crons(self, before: str, limit: int, assistant_ids: Sequence[str]) -> list[CronRow]:
        return [cron_row(r) for r in self.db.execute(*_CRONS.due(before, limit, assistant_ids)).fetchall()]

    async def claim_cron_tick(self, cron_id: str, tick: str, next_tick: str) -> bool:
        return bool(await self._write(*_CRONS.claim_tick(cron_id, tick, next_tick)))


def _looked_up_by_key(value: Any) -> bool:
    """Whether a thread metadata value is kept by key (see ``_SCALARS``): an equality filter on it reads no thread."""
    return isinstance(value, int | float) or (isinstance(value, str) and len(value) <= _LOOKED_UP_CHARS)


def _migrate(db: sqlite3.Connection, path: str, migrations: Sequence[Sequence[str]]) -> None:
    """Bring the file's schema up to date, one transaction for all steps (other processes wait)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute(f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} "
                   "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)")
        current = db.execute(f"SELECT coalesce(max(version), 0) FROM {VERSION_TABLE}").fetchone()[0]
        for version, statements in to_apply(current, migrations, path):
            for statement in statements:
                db.execute(statement)
            db.execute(f"INSERT INTO {VERSION_TABLE} VALUES (?, ?)", (version, now_iso()))
    except BaseException:
        db.execute("ROLLBACK")
        db.close()
        raise
    db.execute("COMMIT")


def _commit_and_close(db: sqlite3.Connection) -> None:
    if db.in_transaction:
        db.execute("COMMIT")
    db.close()


def _checkpoint_statements(write: CheckpointWrite) -> tuple[str, tuple[Any, ...], tuple[str, tuple[Any, ...]] | None]:
    """A checkpoint's insert (its claim's check left as ``{held}``; no row inserted: its parent is gone) with its
    parameters, and its base's insert to make with it, if any."""
    row, values = write.row, checkpoint_values(write.row)
    then = None if write.base is None else (
        f"INSERT OR REPLACE INTO checkpoint_bases ({BASE_COLUMNS}) VALUES (?,?,?,?,?,?)", base_values(write.base))
    if write.parent_seq is None:
        return _PUT_CHECKPOINT, values, then
    return _PUT_CHILD_CHECKPOINT, (*values, row.thread_id, write.parent_seq, row.parent_id), then
