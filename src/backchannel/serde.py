"""Turning state into JSON and back: messages become their LangChain dicts.

JSON text is written by orjson, several times faster than the standard
library on the small objects a step stores. NaN and infinities become
``null``, as JSON has no other spelling for them.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import orjson

from backchannel.messages import AIMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage, message_to_dict

__all__ = ["dumps", "json_text", "loads", "loads_exact", "to_jsonable"]

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


# Dataclasses go to ``default`` like other objects: messages have their own dict form.
_ORJSON_OPTIONS = orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_NON_STR_KEYS
# For what orjson refuses (integers past 64 bits): one encoder, json.dumps with options makes one each call.
_FALLBACK = json.JSONEncoder(separators=(",", ":"), default=_default, ensure_ascii=False)


def json_text(value: Any, default: Callable[[Any], Any], fallback: json.JSONEncoder) -> str:
    """Compact JSON of ``value`` by orjson, calling ``default`` for other objects; ``fallback``
    encodes what orjson cannot (and raises the error ``default`` gives)."""
    try:
        return orjson.dumps(value, default=default, option=_ORJSON_OPTIONS).decode()
    except TypeError:  # orjson.JSONEncodeError
        return fallback.encode(value)


def dumps(value: Any) -> str:
    """Compact JSON of ``value``, with messages and other known objects converted."""
    return json_text(value, _default, _FALLBACK)


def loads(text: str) -> Any:
    """JSON text parsed by orjson (several times faster on a long state), or by the standard library for
    what orjson refuses and :func:`dumps` may have written (integers past 64 bits)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_NUMBER = b"0" * 19  # every integer past 64 bits is written with 19 digits or more


def loads_exact(text: str) -> Any:
    """Short JSON text (a row's field) parsed by orjson, whose decoded keys are the same string objects from text to
    text (a thousand running runs each hold their row's), or by the standard library where orjson would not read it
    exactly: a run of 19 digits may be an integer past 64 bits, which orjson reads as a float. The digits are looked
    for at about a third of orjson's cost on a short text, twice it on a long one (so :func:`loads` does not)."""
    if _LONG_NUMBER in text.encode().translate(_DIGITS_AS_ZERO):
        return json.loads(text)
    return loads(text)

