"""State as JSON text: what storage writes for checkpoints, pending writes and mail."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pydantic import BaseModel

from backchannel.messages import AIMessage, HumanMessage, ToolMessage, message_to_dict, tool_call
from backchannel.runtime._rows import dump
from backchannel.serde import dumps


def test_messages_are_written_as_their_langchain_dicts():
    reply = AIMessage("", tool_calls=[tool_call("search", {"q": "ü"}, "call_1")])
    update = {"messages": [HumanMessage("hi"), reply, ToolMessage("found", tool_call_id="call_1")]}

    written = json.loads(dumps(update))

    assert written == {"messages": [message_to_dict(m) for m in update["messages"]]}
    assert "ü" in dumps(update)  # text as UTF-8, not escaped


def test_other_objects_are_converted_or_named_in_the_error():
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class Settings(BaseModel):
        depth: int = 2

    written = json.loads(dumps({"point": Point(1, 2), "settings": Settings(), "tags": {"a"}, 3: "three"}))

    assert written == {"point": {"x": 1, "y": 2}, "settings": {"depth": 2}, "tags": ["a"], "3": "three"}
    with pytest.raises(TypeError, match="cannot save a object in the state"):
        dumps({"handle": object()})


def test_integers_of_any_size_survive():
    huge = {"n": 2**70, "m": -(2**80), "list": [10**30]}

    assert json.loads(dumps(huge)) == huge
    assert json.loads(dump(huge)) == huge


def test_values_json_cannot_spell_become_null():
    assert json.loads(dumps({"x": float("nan"), "y": float("inf")})) == {"x": None, "y": None}


def test_row_fields_save_unknown_objects_as_text():
    class Token:
        def __str__(self) -> str:
            return "token-1"

    assert json.loads(dump({"token": Token(), "n": 2**65})) == {"token": "token-1", "n": 2**65}

