"""Read-only dicts and lists: renderings of a thread's messages that every caller of ``get_state``, history and
``runs.wait`` shares, so that one caller changing what it was handed cannot change what the next one sees, nor
the messages the agent itself holds (a rendering shares their ``content``, ``tool_calls`` and the rest).

A change raises ``TypeError``; ``copy.deepcopy``, ``copy.copy``, ``dict(...)`` and ``list(...)`` give plain,
changeable copies, and JSON encoders and ``==`` see plain dicts and lists.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

__all__ = ["ReadOnlyDict", "ReadOnlyList", "read_only"]

_REFUSAL = "a thread's state as returned is shared and read-only: change a copy (copy.deepcopy(...) or dict(...))"


def _refuse(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(_REFUSAL)


class ReadOnlyDict(dict[str, Any]):
    """A dict that refuses changes."""

    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = setdefault = clear = _refuse

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {key: copy.deepcopy(value, memo) for key, value in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)


class ReadOnlyList(list[Any]):
    """A list that refuses changes."""

    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
    append = extend = insert = pop = remove = clear = sort = reverse = _refuse

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(value, memo) for value in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


_ATOMS = frozenset({str, int, float, bool, type(None)})
_EMPTY_DICT = ReadOnlyDict()  # shared: nobody can change them
_EMPTY_LIST = ReadOnlyList()
_set_item, _set_index = dict.__setitem__, list.__setitem__  # a rendering's own filling in, past its refusals


def read_only(value: Any) -> Any:
    """``value`` with its dicts and lists (at any depth) as read-only copies; anything else as it is."""
    kind = type(value)
    if kind is dict:
        return _read_only_dict(value) if value else _EMPTY_DICT
    if kind is list:
        return _read_only_list(value) if value else _EMPTY_LIST
    if isinstance(value, dict):  # a subclass: copied as a plain dict first
        return read_only(dict(value))
    if isinstance(value, list):
        return read_only(list(value))
    return value


# Copied whole at C speed, then the dicts and lists inside replaced by their renderings: most values are atoms.
def _read_only_dict(value: dict[str, Any]) -> ReadOnlyDict:
    rendered = ReadOnlyDict(value)
    for key, item in value.items():
        if type(item) not in _ATOMS:
            _set_item(rendered, key, read_only(item))
    return rendered


def _read_only_list(value: list[Any]) -> ReadOnlyList:
    rendered = ReadOnlyList(value)
    for index, item in enumerate(value):
        if type(item) not in _ATOMS:
            _set_index(rendered, index, read_only(item))
    return rendered
