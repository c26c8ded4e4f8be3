"""``select``: the fields of each returned dict a LangGraph client asked for."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from backchannel.errors import InvalidRequestError

__all__ = ["ASSISTANT_FIELDS", "CRON_FIELDS", "RUN_FIELDS", "STATE_FIELDS", "THREAD_FIELDS", "selected"]

ASSISTANT_FIELDS = ("assistant_id", "graph_id", "name", "description", "config", "context", "created_at",
                    "updated_at", "metadata", "version")
THREAD_FIELDS = ("thread_id", "created_at", "updated_at", "state_updated_at", "metadata", "config", "context",
                 "status", "values", "interrupts", "error")
RUN_FIELDS = ("run_id", "thread_id", "assistant_id", "created_at", "updated_at", "status", "metadata", "kwargs",
              "multitask_strategy", "cancel_reason")
CRON_FIELDS = ("cron_id", "assistant_id", "thread_id", "on_run_completed", "end_time", "schedule", "timezone",
               "created_at", "updated_at", "user_id", "payload", "next_run_date", "metadata", "enabled")
STATE_FIELDS = ("values", "next", "tasks", "checkpoint", "metadata", "created_at", "parent_checkpoint",
                "interrupts", "checkpoint_id", "parent_checkpoint_id")  # and values.<key>


def selected(items: Iterable[dict[str, Any]], select: Sequence[str] | None, fields: Sequence[str],
             what: str) -> list[dict[str, Any]]:
    """Each of ``items`` with only the ``select``-ed fields (all when none); 422 for a field ``what`` has not.

    For a state, ``values.<key>`` keeps one key of its values.
    """
    items = list(items)
    if not select:
        return items
    keys, value_keys = set(), set()
    for field in select:
        if field in fields:
            keys.add(field)
        elif what == "state" and isinstance(field, str) and field.startswith("values."):
            value_keys.add(field.removeprefix("values."))
        else:
            raise InvalidRequestError(f"cannot select {field!r:.80} of a {what}; use any of {list(fields)}")
    return [_pick(item, keys, value_keys) for item in items]


def _pick(item: dict[str, Any], keys: set[str], value_keys: set[str]) -> dict[str, Any]:
    picked = {k: v for k, v in item.items() if k in keys}
    if value_keys and "values" not in keys:
        values = item.get("values") or {}
        picked["values"] = {k: values[k] for k in value_keys if k in values}
    return picked
