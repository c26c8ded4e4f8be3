"""State: the messages reducer (append, replace by id, remove) and per-key reducers."""

import copy
import operator
from typing import Annotated, TypedDict

import pytest

from backchannel import AIMessage, HumanMessage, RemoveMessage
from backchannel.messages import REMOVE_ALL_MESSAGES
from backchannel.state import MessageList, add_messages, apply_update, reducers_of


def test_add_messages_appends_and_accepts_user_input_forms():
    msgs = add_messages([], [HumanMessage("a", id="1")])
    msgs = add_messages(msgs, "b")
    msgs = add_messages(msgs, ("assistant", "c"))
    assert [m.text for m in msgs] == ["a", "b", "c"]
    assert [m.type for m in msgs] == ["human", "human", "ai"]


def test_add_messages_replaces_by_id_in_place():
    msgs = add_messages(None, [HumanMessage("a", id="1"), AIMessage("old", id="2"), HumanMessage("c", id="3")])
    msgs = add_messages(msgs, AIMessage("new", id="2"))
    assert [m.text for m in msgs] == ["a", "new", "c"]
    assert len(msgs) == 3


def test_remove_message_deletes_and_keeps_positions_consistent():
    msgs = MessageList([HumanMessage("a", id="1"), HumanMessage("b", id="2"), HumanMessage("c", id="3")])
    add_messages(msgs, RemoveMessage("1"))
    assert [m.id for m in msgs] == ["2", "3"]
    # replacing by id after a removal must still hit the right message
    add_messages(msgs, HumanMessage("C", id="3"))
    assert [m.text for m in msgs] == ["b", "C"]


def test_remove_all_then_add():
    msgs = MessageList([HumanMessage("a"), HumanMessage("b")])
    add_messages(msgs, [RemoveMessage(REMOVE_ALL_MESSAGES), HumanMessage("fresh")])
    assert [m.text for m in msgs] == ["fresh"]


def test_removing_an_unknown_id_is_a_clear_error():
    with pytest.raises(ValueError, match="no message has that id"):
        add_messages([HumanMessage("a")], RemoveMessage("nope"))


def test_copy_of_message_list_is_independent():
    msgs = MessageList([HumanMessage("a", id="1")])
    other = copy.copy(msgs)
    other.add(HumanMessage("b", id="2"))
    assert len(msgs) == 1 and len(other) == 2
    assert isinstance(other, MessageList)


class Schema(TypedDict):
    notes: Annotated[list[str], operator.add]
    count: int


def test_reducers_of_reads_annotated_reducers():
    assert reducers_of(Schema) == {"notes": operator.add}
    assert reducers_of(None) == {}


def test_apply_update_uses_reducer_last_value_and_messages():
    state = {"messages": MessageList()}
    reducers = reducers_of(Schema)
    apply_update(state, {"notes": ["a"], "count": 1, "messages": ["hi"]}, reducers)
    apply_update(state, {"notes": ["b"], "count": 2}, reducers)
    assert state["notes"] == ["a", "b"]
    assert state["count"] == 2
    assert [m.text for m in state["messages"]] == ["hi"]
