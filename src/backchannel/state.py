"""Agent state: a dict of channels, each merged by its reducer.

``messages`` appends, or replaces the message with the same id, or removes
one (:class:`RemoveMessage`). Other keys take the last value unless a state
schema names a reducer (``Annotated[list[str], operator.add]``).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from backchannel.messages import REMOVE_ALL_MESSAGES, AnyMessage, RemoveMessage, messages_from_input

__all__ = ["MessageList", "Reducer", "add_messages", "apply_update", "reducers_of", "snapshot"]

Reducer = Callable[[Any, Any], Any]


class MessageList(list[AnyMessage]):
    """A list of messages that knows where each id is, so replacing by id costs O(1)."""

    __slots__ = ("positions", "token_tally", "__weakref__")

    def __init__(self, messages: Iterable[AnyMessage | RemoveMessage] = ()) -> None:
        super().__init__()
        self.positions: dict[str, int] = {}
        # A running count of the list's tokens, kept by whoever counts them (summarization) so that each step
        # counts only the new messages: with the list, rather than in a table that must watch it die.
        self.token_tally: Any = None
        for m in messages:
            self.add(m)

    def add(self, message: AnyMessage | RemoveMessage) -> None:
        """Append ``message``, replace the one with its id, or apply a removal."""
        if isinstance(message, RemoveMessage):
            self._remove(message.id)
            return
        at = self.positions.get(message.id)
        if at is None:
            self.positions[message.id] = len(self)
            self.append(message)
        else:
            self[at] = message

    def _remove(self, message_id: str) -> None:
        if message_id == REMOVE_ALL_MESSAGES:
            self.clear()
            self.positions.clear()
            return
        at = self.positions.pop(message_id, None)
        if at is None:
            raise ValueError(f"cannot remove message {message_id!r}: no message has that id")
        del self[at]
        for i in range(at, len(self)):
            self.positions[self[i].id] = i

    def __copy__(self) -> MessageList:
        return MessageList(self)


def add_messages(current: Any, new: Any) -> MessageList:
    """The ``messages`` reducer: append new messages, replace by id, apply removals."""
    messages = current if isinstance(current, MessageList) else MessageList(current or ())
    for m in messages_from_input(new):
        messages.add(m)
    return messages


def reducers_of(schema: type | None) -> dict[str, Reducer]:
    """The reducers a TypedDict-style schema declares with ``Annotated[T, reducer]``."""
    if schema is None:
        return {}
    reducers: dict[str, Reducer] = {}
    for key, hint in typing.get_type_hints(schema, include_extras=True).items():
        if typing.get_origin(hint) is typing.Annotated:
            for meta in hint.__metadata__:
                if callable(meta):
                    reducers[key] = meta
    return reducers


def snapshot(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the state that later steps won't change (lists copied; messages are never mutated)."""
    return {k: list(v) if isinstance(v, list) else v for k, v in state.items()}


def apply_update(state: dict[str, Any], update: Mapping[str, Any], reducers: Mapping[str, Reducer]) -> None:
    """Merge ``update`` into ``state`` in place, key by key."""
    for key, value in update.items():
        if key == "messages":
            state["messages"] = add_messages(state.get("messages"), value)
        elif key in reducers and key in state:
            state[key] = reducers[key](state[key], value)
        else:
            state[key] = value
