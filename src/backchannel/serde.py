"""Turning state into JSON and back: messages become their LangChain dicts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from backchannel.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage, message_to_dict

__all__ = ["dumps", "to_jsonable"]

_MESSAGE_TYPES = (SystemMessage, HumanMessage, AIMessage, ToolMessage)


_SCALARS = (str, int, float, bool, type(None))


def to_jsonable(value: Any) -> Any:
    """``value`` with messages, dataclasses and pydantic models turned into plain dicts."""
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, _MESSAGE_TYPES):
        return message_to_dict(value)  # already plain: its parts need no further conversion
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return _default(value)


def _default(value: Any) -> Any:
    if isinstance(value, _MESSAGE_TYPES):
        return message_to_dict(value)
    if isinstance(value, RemoveMessage):
        return {"type": "remove", "id": value.id}
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, (set, frozenset)):
        return list(value)
    raise TypeError(f"cannot save a {type(value).__name__} in the state: state values must be "
                    "JSON-serializable (or messages, dataclasses, pydantic models)")


# One encoder for every call: json.dumps with options builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), default=_default, ensure_ascii=False)


def dumps(value: Any) -> str:
    """Compact JSON of ``value``, with messages and other known objects converted."""
    return _ENCODER.encode(value)
