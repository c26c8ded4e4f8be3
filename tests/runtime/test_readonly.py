"""The read-only renderings of a thread's messages that callers of get_state, history and runs.wait share:
every change refused with a TypeError that says what to do; copies, pickles, JSON and == as plain data."""

from __future__ import annotations

import copy
import json
import pickle

import orjson
import pytest

from backchannel.runtime._readonly import read_only

MESSAGE = {"type": "ai", "content": [{"type": "text", "text": "hi"}], "additional_kwargs": {},
           "tool_calls": [{"name": "step", "args": {"i": 1}, "id": "c1", "type": "tool_call"}], "usage_metadata": None}


@pytest.mark.parametrize("change", [
    lambda m: m.update(content="x"), lambda m: m.__setitem__("content", "x"), lambda m: m.pop("content"),
    lambda m: m.setdefault("new", 1), lambda m: m.clear(), lambda m: m.__delitem__("type"),
    lambda m: m["tool_calls"].append({}), lambda m: m["tool_calls"][0]["args"].update(i=2),
    lambda m: m["content"][0].__setitem__("text", "x"), lambda m: m["tool_calls"].sort(),
    lambda m: m["additional_kwargs"].update(a=1), lambda m: m["tool_calls"].__iadd__([1]),
], ids=range(12))
def test_every_change_at_any_depth_is_refused_and_the_message_stays_as_it_was(change):
    shared = read_only(MESSAGE)
    with pytest.raises(TypeError, match=r"copy\.deepcopy"):
        change(shared)
    assert shared == MESSAGE


def test_copies_and_pickles_are_plain_and_changeable_and_encoders_see_plain_json():
    shared = read_only(MESSAGE)
    for plain in (copy.deepcopy(shared), pickle.loads(pickle.dumps(shared))):
        plain["tool_calls"][0]["args"]["i"] = 2
        plain["content"].append({"type": "text", "text": "more"})
        assert shared == MESSAGE
    shallow = copy.copy(shared)
    shallow["content"] = "x"
    assert type(shallow) is dict and shared["content"] == MESSAGE["content"]
    assert json.loads(json.dumps(shared)) == orjson.loads(orjson.dumps(shared)) == MESSAGE


def test_the_original_stays_its_own():
    original = copy.deepcopy(MESSAGE)
    shared = read_only(original)
    original["tool_calls"][0]["args"]["i"] = 5  # the message's own data changing later does not reach the rendering
    assert shared["tool_calls"][0]["args"]["i"] == 1
