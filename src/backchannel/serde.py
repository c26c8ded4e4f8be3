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

__all__ = ["dumps", "json_bytes", "json_text", "loads", "loads_exact", "to_jsonable"]

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


def json_bytes(value: Any, default: Callable[[Any], Any] | None = None) -> bytes:
    """Compact JSON bytes of ``value`` by orjson (calling ``default`` for objects it does not know), or by the
    standard library for what orjson refuses: integers past 64 bits, which JSON allows and Python clients send
    (a lone surrogate is then written escaped)."""
    try:
        return orjson.dumps(value, default=default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value, default=default, separators=(",", ":")).encode()


def dumps(value: Any) -> str:
    """Compact JSON of ``value``, with messages and other known objects converted."""
    return json_text(value, _default, _FALLBACK)


_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
# orjson reads an integer past 64 bits as a float: such an integer has 20 digits, or 19 after a minus sign.
_LONG_POSITIVE = b"0" * 20
_LONG_NEGATIVE = b"-" + b"0" * 19


def _may_hold_long_integer(text: str | bytes) -> bool:
    """Whether JSON text has a run of digits that may be an integer past 64 bits (or a string's digits: those
    only cost the slower parse). Looked for at about a sixth of orjson's parse of a long state."""
    raw = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    digits = raw.translate(_DIGITS_AS_ZERO)
    return _LONG_POSITIVE in digits or _LONG_NEGATIVE in digits


def loads_exact(text: str | bytes) -> Any:
    """JSON text parsed by orjson (several times faster on a long state, and its decoded keys are the same
    string objects from text to text), or by the standard library where orjson would not read it exactly: an
    integer past 64 bits, which orjson reads as a float. Raises ``ValueError`` (``json.JSONDecodeError``) for
    text that is not JSON, and ``RecursionError`` for some text nested too deep."""
    if _may_hold_long_integer(text):
        return json.loads(text)
    return orjson.loads(text)


def loads(text: str) -> Any:
    """JSON that :func:`dumps` wrote, parsed exactly (:func:`loads_exact`), also where orjson refuses it."""
    try:
        return loads_exact(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
