"""Assistants: each served graph's own, and those made from a graph with a config and a context of their own.

As in LangGraph, an assistant is a graph with a config, a context and metadata,
and it has versions: an update adds one, and any version can be made the current
one again. A registered graph's own assistant (its id derived from the graph id)
exists as registered without being stored, until it is changed. Assistants of
graphs this runtime does not serve (another program's, on a shared database)
are not shown. Runs of an assistant get its config and context under their own
(:func:`run_config`, :func:`run_context`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from backchannel._clock import now_iso
from backchannel._ids import assistant_id_for
from backchannel.errors import ConflictError, InvalidRequestError, NotFoundError
from backchannel.runtime.registry import Registry
from backchannel.runtime.rows import AssistantChange, AssistantRow, assistant_sort_key
from backchannel.runtime.run_options import iteration_limit
from backchannel.runtime.storage import AssistantStorage

__all__ = ["AssistantCatalog", "run_config", "run_context"]

_MANY = 1_000_000  # no limit
_UPDATE_TRIES = 20  # an update that keeps meeting concurrent ones gives up (each retry re-reads the assistant)


class AssistantCatalog:
    """The assistants of the graphs a runtime serves: found, made, changed, set back, listed and deleted."""

    def __init__(self, storage: AssistantStorage, registry: Registry) -> None:
        self._storage = storage
        self._registry = registry
        self._started_at = now_iso()  # when the graphs' own assistants came to be, as this runtime knows them

    def own(self, graph_id: str) -> AssistantRow:
        """The graph's own assistant, as registered."""
        agent = self._registry.graphs[graph_id]
        return AssistantRow(assistant_id_for(graph_id), graph_id, 1, self._started_at, self._started_at,
                            metadata={"created_by": "system"}, name=agent.name or graph_id)

    def is_own(self, row: AssistantRow) -> bool:
        """Whether ``row`` is a graph's own assistant (made by registering the graph, not through the API)."""
        return self._registry.own_graph_of(row.assistant_id) is not None

    async def served_ids(self) -> list[str]:
        """The ids of the assistants whose runs this runtime makes: the graphs' own, and those made from them."""
        graphs = list(self._registry.graphs)
        made = await self._storage.search_assistants(graph_ids=graphs, limit=_MANY)
        return sorted({*(assistant_id_for(g) for g in graphs), *(r.assistant_id for r in made)})

    async def resolve(self, assistant_id: str) -> AssistantRow:
        """The assistant an id (or a served graph's id) names, at its current version; :class:`NotFoundError`
        unless its graph is served here."""
        graph_id = self._registry.own_graph_of(assistant_id)
        stored = await self._storage.get_assistant(assistant_id_for(graph_id) if graph_id else assistant_id)
        if stored is not None and stored.graph_id in self._registry.graphs:
            return stored
        if stored is None and graph_id is not None:
            return self.own(graph_id)
        known = ", ".join(sorted(self._registry.graphs)) or "none registered"
        raise NotFoundError(f"assistant {assistant_id!r} not found; the graphs served here: {known}")

    async def create(self, graph_id: str, *, config: Mapping[str, Any] | None, context: Mapping[str, Any] | None,
                     metadata: Mapping[str, Any] | None, assistant_id: str | None, if_exists: str | None,
                     name: str | None, description: str | None) -> AssistantRow:
        """A new assistant of a served graph (``if_exists="do_nothing"``: the one with that id, if there is)."""
        if if_exists not in (None, "raise", "do_nothing"):
            raise InvalidRequestError(f"if_exists must be 'raise' or 'do_nothing', not {if_exists!r}")
        self._check_graph(graph_id)
        change = _checked_change(config=config, context=context, metadata=metadata, name=name or "Untitled",
                                 description=description)
        if assistant_id is not None:
            _check_uuid(assistant_id)
        now = now_iso()
        row = change.applied_to(AssistantRow(assistant_id or str(uuid.uuid4()), graph_id, 1, now, now), now)
        if self._registry.own_graph_of(row.assistant_id) is None and await self._storage.create_assistant(row):
            return row
        if if_exists == "do_nothing":
            return await self.resolve(row.assistant_id)
        raise ConflictError(f"Assistant {row.assistant_id} already exists")

    async def update(self, assistant_id: str, change: AssistantChange) -> AssistantRow:
        """A new version of the assistant, its current one: ``change`` applied to the current."""
        if change.graph_id is not None:
            self._check_graph(change.graph_id)
        _checked_change(config=change.config, context=change.context)
        for _ in range(_UPDATE_TRIES):
            current = await self._stored(assistant_id)
            updated = await self._storage.update_assistant(change.applied_to(current, now_iso()), current)
            if updated is not None:
                return updated
        raise ConflictError(f"assistant {assistant_id!r} kept changing while this update was made; try again")

    async def set_latest(self, assistant_id: str, version: int) -> AssistantRow:
        """Make one of the assistant's versions its current one again."""
        current = await self.resolve(assistant_id)
        found = await self._storage.set_assistant_version(current.assistant_id, version, now_iso())
        if found is None and not (self.is_own(current) and version == current.version == 1):
            raise NotFoundError(f"Version {version} not found for assistant {current.assistant_id}")
        return found or current

    def check_deletable(self, row: AssistantRow) -> None:
        """:class:`ConflictError` for a graph's own assistant: only those made through the API can be deleted."""
        if self.is_own(row):
            raise ConflictError(f"assistant {row.assistant_id} is the graph {row.graph_id!r}'s own: it cannot be "
                                "deleted (update it, or create assistants of your own)")

    async def delete(self, row: AssistantRow) -> None:
        """Delete an assistant made through the API, with its versions."""
        self.check_deletable(row)
        if not await self._storage.delete_assistant(row.assistant_id):
            raise NotFoundError(f"Assistant with ID {row.assistant_id} not found")

    async def versions(self, assistant_id: str, *, metadata: Mapping[str, Any] | None, limit: int,
                       offset: int) -> list[AssistantRow]:
        """The assistant's versions whose metadata contains ``metadata``, newest first."""
        current = await self.resolve(assistant_id)
        found = await self._storage.assistant_versions(current.assistant_id, metadata=dict(metadata or {}),
                                                       limit=limit, offset=offset)
        if found or not self.is_own(current) or await self._storage.get_assistant(current.assistant_id):
            return found
        return [r for r in [current] if _matches(r, None, metadata)][offset: offset + limit]  # never changed

    async def search(self, *, graph_id: str | None, name: str | None, metadata: Mapping[str, Any] | None,
                     limit: int, offset: int, sort_by: str, sort_order: str) -> list[AssistantRow]:
        """Assistants of the graphs served here (of ``graph_id``, whose name contains ``name`` in any case,
        whose metadata contains ``metadata``), sorted; ``ValueError`` for a field that is not sortable."""
        key = assistant_sort_key(sort_by)
        stored = await self._storage.search_assistants(
            graph_ids=list(self._registry.graphs), graph_id=graph_id, name=name, metadata=dict(metadata or {}),
            limit=offset + limit, offset=0, sort_by=sort_by, sort_order=sort_order)
        found = sorted([*stored, *await self._unstored_own(graph_id, name, metadata)], key=key,
                       reverse=sort_order.lower() != "asc")
        return found[offset: offset + limit]

    async def count(self, *, graph_id: str | None, name: str | None, metadata: Mapping[str, Any] | None) -> int:
        """How many assistants :meth:`search` finds without a limit."""
        stored = await self._storage.count_assistants(graph_ids=list(self._registry.graphs), graph_id=graph_id,
                                                      name=name, metadata=dict(metadata or {}))
        return stored + len(await self._unstored_own(graph_id, name, metadata))

    async def _unstored_own(self, graph_id: str | None, name: str | None,
                            metadata: Mapping[str, Any] | None) -> list[AssistantRow]:
        """The graphs' own assistants that match and were never changed (so not stored)."""
        own = [self.own(g) for g in self._registry.graphs if graph_id is None or g == graph_id]
        own = [r for r in own if _matches(r, name, metadata)]
        if not own:
            return []
        stored = await self._storage.search_assistants(graph_ids=list(self._registry.graphs),
                                                       ids=[r.assistant_id for r in own], limit=len(own))
        changed = {r.assistant_id for r in stored}
        return [r for r in own if r.assistant_id not in changed]

    async def _stored(self, assistant_id: str) -> AssistantRow:
        """The assistant as stored: a graph's own is stored as registered when it is first changed."""
        current = await self.resolve(assistant_id)
        if self.is_own(current) and await self._storage.get_assistant(current.assistant_id) is None:
            await self._storage.create_assistant(current)  # (or another process did, just now)
            current = await self.resolve(assistant_id)
        return current

    def _check_graph(self, graph_id: str) -> None:
        if graph_id not in self._registry.graphs:
            raise NotFoundError(f"Graph {graph_id!r} not found. Expected one of: {sorted(self._registry.graphs)}")


def run_config(assistant: AssistantRow, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """A run's config over its assistant's: the run's keys win, ``configurable`` merged key by key."""
    merged = {**assistant.config, **(config or {})}
    configurable = {**assistant.config.get("configurable", {}), **(config or {}).get("configurable", {})}
    if configurable:
        merged["configurable"] = configurable
    return merged


def run_context(assistant: AssistantRow, context: Any) -> Any:
    """A run's context over its assistant's: the run's keys win (a run's context that is not an object, whole)."""
    if not assistant.context or (context is not None and not isinstance(context, Mapping)):
        return context
    return {**assistant.context, **(context or {})}


def _checked_change(*, config: Mapping[str, Any] | None, context: Mapping[str, Any] | None,
                    **fields: Any) -> AssistantChange:
    """An assistant's config and context as given, checked: :class:`InvalidRequestError` naming what is wrong."""
    for label, value in (("config", config), ("context", context)):
        if value is not None and not isinstance(value, Mapping):
            raise InvalidRequestError(f"an assistant's {label} must be an object, not {type(value).__name__}")
    if config and config.get("configurable") and context:
        raise InvalidRequestError("give the assistant a context or a config with configurable, not both "
                                  "(context replaces configurable)")
    iteration_limit(config)  # a bad recursion_limit is refused now, not at each run
    return AssistantChange(config=dict(config) if config is not None else None,
                           context=dict(context) if context is not None else None, **fields)


def _check_uuid(assistant_id: str) -> None:
    try:
        uuid.UUID(assistant_id)
    except ValueError:
        raise InvalidRequestError(f"Invalid assistant ID {assistant_id!r:.80}: must be a UUID") from None


def _matches(row: AssistantRow, name: str | None, metadata: Mapping[str, Any] | None) -> bool:
    return ((name is None or name.lower() in row.name.lower())
            and all(row.metadata.get(k) == v for k, v in (metadata or {}).items()))
