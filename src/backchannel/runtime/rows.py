"""What the runtime keeps: threads, runs, checkpoints and store items, as small dataclasses.

Every storage backend stores and returns these rows (see :mod:`backchannel.runtime.storage`);
nothing above the backends knows how they are kept. Statuses are ``Literal`` types, so a
typo in one is a type error rather than a run that never matches a query.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any, Literal, NamedTuple, TypeVar, get_args

from backchannel.serde import dumps, loads

__all__ = ["ACTIVE", "ASSISTANT_SORT", "CRON_SORT", "TERMINAL", "AssistantChange", "AssistantRow", "CancelAction",
           "CheckpointBase", "CheckpointRow", "CheckpointWrite", "CronRow", "Delta", "ItemRow", "PruneStrategy",
           "RunClaim", "RunEnd", "RunRow", "RunStatus", "ThreadRow", "ThreadStatus", "ThreadTTL", "assistant_sort_key",
           "cron_order", "delta_text", "epoch_of", "replaced", "thread_order"]

ThreadStatus = Literal["idle", "busy", "interrupted", "error"]
# A run's own "interrupted" means it was cancelled; a run that paused for a human succeeded (its thread waits).
RunStatus = Literal["pending", "running", "success", "error", "timeout", "interrupted"]
CancelAction = Literal["interrupt", "rollback"]  # keep the cancelled run's finished steps, or delete the run
# What pruning (or a thread's TTL running out) does: delete the thread, or keep it with its newest checkpoint only.
PruneStrategy = Literal["delete", "keep_latest"]

R = TypeVar("R")

ACTIVE: tuple[RunStatus, ...] = ("pending", "running")  # a thread with such a run is busy
TERMINAL: frozenset[RunStatus] = frozenset(get_args(RunStatus)) - frozenset(ACTIVE)


@dataclass(slots=True)
class ThreadRow:
    thread_id: str
    created_at: str
    updated_at: str
    metadata: dict[str, Any] = field(default_factory=dict)
    status: ThreadStatus = "idle"
    interrupts: list[dict[str, Any]] = field(default_factory=list)
    error: dict[str, Any] | None = None


class ThreadTTL(NamedTuple):
    """A thread's time to live: ``minutes`` after its last update (a run, a change), ``strategy`` applies."""

    strategy: PruneStrategy
    minutes: float


@dataclass(slots=True)
class RunRow:
    run_id: str
    thread_id: str
    assistant_id: str
    created_at: str
    updated_at: str
    status: RunStatus = "pending"
    metadata: dict[str, Any] = field(default_factory=dict)
    kwargs: dict[str, Any] = field(default_factory=dict)
    multitask_strategy: str = "reject"
    worker_id: str | None = None
    scheduled_at: str = ""
    error: dict[str, Any] | None = None
    concurrency_key: str | None = None  # runs sharing a key run at most concurrency_limit at a time
    concurrency_limit: int | None = None
    usage: dict[str, Any] | None = None  # the tokens it used (backchannel.usage), once it has ended
    attempts: int = 0  # times it was claimed without ending or being handed back (a crash mid-run counts)
    claim: str | None = None  # the token of the claim it runs under: its writes carry it (see RunClaim)
    agent_digest: str | None = None  # which agent it is for, beyond a name (see Registry.digest_of)


class RunClaim(NamedTuple):
    """A running run as one claim of it: its writes change storage only while this claim holds.

    A claim holds from :meth:`~backchannel.runtime.storage.RunStorage.claim_runs` until the run
    ends, is handed back, or is taken over by another process (which claims it anew).
    """

    run_id: str
    token: str


class Delta(Mapping[str, Any]):
    """What a checkpoint stores, with its JSON text: encoded once when written, parsed on first use when read
    back (most reads of a checkpoint never look inside it)."""

    __slots__ = ("_text", "_data", "_json")

    def __init__(self, text: str | None = None, data: Mapping[str, Any] | None = None) -> None:
        if text is None and data is None:
            raise ValueError("a delta needs its text or its data")
        self._text = text
        self._data = data  # as written (messages as objects), or as parsed from the text
        self._json: Mapping[str, Any] | None = None  # as parsed from the text

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Delta:
        """A delta written now: ``data`` encoded at once (the storage and the size accounting both need it)."""
        return cls(dumps(data), data)

    @property
    def text(self) -> str:
        """The JSON text, as stored."""
        if self._text is None:
            self._text = dumps(self._data)
        return self._text

    def kept_in_memory(self) -> Mapping[str, Any]:
        """What a store in memory keeps of it: the data only (its text is encoded again when asked: the data's
        messages are the live state's own, so the text would be a second copy of them), without this wrapper. The
        text is forgotten here too (the writer's state keeps this delta with its newest checkpoint)."""
        data = self._data
        if data is None:
            return self
        self._text = None
        return data

    def as_json(self) -> Mapping[str, Any]:
        """The data as JSON values (messages as dicts), parsed from the text once."""
        if self._json is None:
            self._json = loads(self.text)
        return self._json

    def _parsed(self) -> Mapping[str, Any]:
        if self._data is None:
            self._data = self._json = loads(self.text)
        return self._data

    def __getitem__(self, key: str) -> Any:
        return self._parsed()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())


def delta_text(delta: Mapping[str, Any]) -> str:
    """A checkpoint's delta as stored: its JSON text (its size is what reading it back costs)."""
    return delta.text if isinstance(delta, Delta) else dumps(delta)


@dataclass(slots=True)
class CheckpointRow:
    """One recorded step: the state change (``delta``) and the stage the run continues at.

    A ``whole`` checkpoint stores the thread's whole state instead of a change: reading a state
    starts from the nearest one, and one is written where folding the changes since the last
    would cost much more than reading the state itself (see :mod:`backchannel.runtime.checkpoints`).
    """

    thread_id: str
    checkpoint_id: str
    parent_id: str | None
    seq: int
    run_id: str | None
    delta: Mapping[str, Any]  # the state update (or the whole state); messages as objects or as their dicts
    next: str  # the stage to continue at; "" when the run ended there
    metadata: dict[str, Any]
    created_at: str
    whole: bool = False


@dataclass(slots=True)
class CheckpointBase:
    """A thread's messages at one checkpoint as stored JSON text, so a read folds no more than the few deltas since.

    ``messages`` holds the JSON of the messages appended since the base ``prev_id`` (each message's text joined
    by commas, no brackets), or of all of them when ``prev_id`` is ``None``; ``rest`` the JSON object of the
    state's other keys at the checkpoint. The steps after a base only append messages (a step that does more has
    a base of its own), so a state is its bases' texts joined, then its deltas' messages.
    """

    thread_id: str
    checkpoint_id: str
    seq: int
    prev_id: str | None
    messages: str
    rest: str


@dataclass(slots=True)
class CheckpointWrite:
    """A checkpoint as :meth:`~backchannel.runtime.storage.CheckpointStorage.put_checkpoint` writes it: the row, the
    seq of its parent as the writer read it (``None``: not checked) and the base written with it, if any."""

    row: CheckpointRow
    parent_seq: int | None = None
    base: CheckpointBase | None = None


@dataclass(slots=True)
class RunEnd:
    """How a run ended: what :meth:`~backchannel.runtime.storage.RunStorage.finish_run` records in one write."""

    run_id: str
    thread_id: str
    status: RunStatus  # success, error, timeout or interrupted
    thread_status: ThreadStatus  # idle, interrupted or error; busy instead while another run of the thread is active
    updated_at: str
    error: dict[str, Any] | None = None  # the run's error
    thread_error: dict[str, Any] | None = None  # the thread's error, in LangGraph's shape
    interrupts: list[dict[str, Any]] | None = None  # the thread's pending interrupts (None: unchanged)
    checkpoint_next: tuple[str, str] | None = None  # (checkpoint_id, stage): where the thread continues
    checkpoint: CheckpointWrite | None = None  # the run's last step, written with its end (in its transaction)
    usage: dict[str, Any] | None = None  # the tokens the run used (backchannel.usage)
    spans: list[dict[str, Any]] | None = None  # what it did (backchannel.tracing.Trace.span_dicts)
    claim: str | None = None  # the token of the claim the run ran under: recorded only while it holds


def replaced(row: R, **changes: Any) -> R:
    """A copy of ``row`` (a slots dataclass whose fields its ``__init__`` takes, in order) with ``changes``, as
    ``dataclasses.replace`` makes it at about a quarter of its cost (which reads each field's flags, then binds every
    field by keyword): a run's row is copied as it is claimed and as it ends."""
    kind: type[Any] = type(row)
    values = _VALUES.get(kind)
    if values is None:
        values = _VALUES[kind] = operator.attrgetter(*(f.name for f in fields(kind)))
    new: R = kind(*values(row))
    for name, value in changes.items():
        setattr(new, name, value)  # (a field it does not have: AttributeError, the slots allowing no other)
    return new


_VALUES: dict[type[Any], Callable[[Any], tuple[Any, ...]]] = {}  # a kind of row's field values, in order


@dataclass(slots=True)
class AssistantRow:
    """An assistant (a served graph with a config, a context and metadata of its own) at one of its versions.

    As a version, ``created_at`` and ``updated_at`` are when that version was made.
    """

    assistant_id: str
    graph_id: str
    version: int
    created_at: str
    updated_at: str
    config: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    description: str | None = None


@dataclass(slots=True)
class AssistantChange:
    """What an update of an assistant changes (``None``: as it was); ``metadata`` is merged into the assistant's."""

    graph_id: str | None = None
    config: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    name: str | None = None
    description: str | None = None

    def applied_to(self, current: AssistantRow, now: str) -> AssistantRow:
        """The assistant's next version: ``current`` changed; the config's ``configurable`` and the context
        kept equal, as LangGraph keeps them (whichever of the two was given sets the other)."""
        config = dict(self.config if self.config is not None else current.config)
        context = dict(self.context if self.context is not None else current.context)
        if self.config is not None and self.config.get("configurable"):
            context = dict(self.config["configurable"])
        elif self.context:
            config["configurable"] = dict(self.context)
        return AssistantRow(
            current.assistant_id, self.graph_id or current.graph_id, current.version, current.created_at, now,
            config, context, {**current.metadata, **(self.metadata or {})},
            self.name if self.name is not None else current.name,
            self.description if self.description is not None else current.description)


@dataclass(slots=True)
class ItemRow:
    namespace: tuple[str, ...]
    key: str
    value: dict[str, Any]
    created_at: str
    updated_at: str


@dataclass(slots=True)
class CronRow:
    """A schedule that starts runs: on its thread (stateful), or each on a new thread (stateless)."""

    cron_id: str
    assistant_id: str
    thread_id: str | None  # None: each run gets a thread of its own
    schedule: str  # a cron expression (five fields, or six with seconds last)
    timezone: str | None  # IANA name the schedule is read in; None: UTC
    end_time: str | None  # ISO 8601: no run starts after it
    payload: dict[str, Any]  # the runs' options (input, config, ...), as runs.create takes them
    metadata: dict[str, Any]
    on_run_completed: str | None  # stateless: "delete" or "keep" each run's thread
    enabled: bool
    next_run_date: str  # the next tick, UTC ISO 8601 (fixed width: ticks compare as text)
    created_at: str
    updated_at: str


def epoch_of(timestamp: str) -> float:
    """Seconds since the epoch of an ISO 8601 time as rows store them (expiry is computed in seconds)."""
    return datetime.fromisoformat(timestamp).timestamp()


ASSISTANT_SORT = ("assistant_id", "graph_id", "name", "created_at", "updated_at")


def assistant_sort_key(sort_by: str) -> Any:
    """How assistants sort by ``sort_by`` (names and graph ids in any case), ties by id; ``ValueError`` for a
    field that is not sortable."""
    if sort_by not in ASSISTANT_SORT:
        raise ValueError(f"cannot sort assistants by {sort_by!r}; use one of {list(ASSISTANT_SORT)}")
    if sort_by in ("name", "graph_id"):
        return lambda row: (getattr(row, sort_by).lower(), row.assistant_id)
    return lambda row: (getattr(row, sort_by), row.assistant_id)


_THREAD_SORT = frozenset({"thread_id", "status", "created_at", "updated_at", "state_updated_at"})


def thread_order(sort_by: str, sort_order: str) -> tuple[str, Literal["ASC", "DESC"]]:
    """The column and direction to sort threads by; ``ValueError`` for a column that is not sortable."""
    if sort_by not in _THREAD_SORT:
        raise ValueError(f"cannot sort threads by {sort_by!r}; use one of {sorted(_THREAD_SORT)}")
    return sort_by, "ASC" if sort_order.lower() == "asc" else "DESC"


CRON_SORT = ("cron_id", "assistant_id", "thread_id", "next_run_date", "end_time", "created_at", "updated_at")


def cron_order(sort_by: str, sort_order: str) -> tuple[str, Literal["ASC", "DESC"]]:
    """The column and direction to sort crons by; ``ValueError`` for a column that is not sortable."""
    if sort_by not in CRON_SORT:
        raise ValueError(f"cannot sort crons by {sort_by!r}; use one of {list(CRON_SORT)}")
    return sort_by, "ASC" if sort_order.lower() == "asc" else "DESC"
