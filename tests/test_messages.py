"""Messages: the types, their LangChain/LangGraph dict form, and what users may pass as input."""

import copy
import dataclasses
import json
import pickle

import pytest

from backchannel import (
    AIMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
    message_from_dict,
    message_to_dict,
    tool_call,
)
from backchannel.messages import messages_from_input, text_of

# -- the types -------------------------------------------------------------------


def test_each_type_has_its_langchain_type_and_a_fresh_id():
    msgs = [SystemMessage("be brief"), HumanMessage("hi"), AIMessage("hello"), ToolMessage("42", "call_1")]
    assert [m.type for m in msgs] == ["system", "human", "ai", "tool"]
    assert len({m.id for m in msgs}) == 4
    assert all(m.id for m in msgs)


def test_text_joins_text_blocks_and_skips_other_blocks():
    content = [{"type": "text", "text": "Hello "}, {"type": "image_url", "image_url": "x"}, "world"]
    assert HumanMessage(content).text == "Hello world"
    assert text_of("plain") == "plain"


def test_tool_call_builder_has_langchain_shape_and_generates_an_id():
    call = tool_call("add", {"a": 1})
    assert call["name"] == "add" and call["args"] == {"a": 1} and call["type"] == "tool_call"
    assert call["id"].startswith("call_")
    assert tool_call("add", id="c1")["id"] == "c1"
    assert tool_call("noargs")["args"] == {}


def test_tool_message_defaults_to_success():
    assert ToolMessage("ok", "call_1").status == "success"


# -- to the LangChain dict -----------------------------------------------------------


def test_ai_message_to_dict_has_the_langchain_shape():
    msg = AIMessage("thinking", [tool_call("search", {"q": "x"}, "call_1")],
                    usage_metadata={"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}, id="ai-1")
    data = message_to_dict(msg)
    assert data["type"] == "ai"
    assert data["content"] == "thinking"
    assert data["id"] == "ai-1"
    assert data["tool_calls"] == [{"name": "search", "args": {"q": "x"}, "id": "call_1", "type": "tool_call"}]
    assert data["invalid_tool_calls"] == []
    assert data["usage_metadata"] == {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5}
    assert {"additional_kwargs", "response_metadata", "name"} <= data.keys()
    json.dumps(data)  # the dict form is plain JSON


def test_tool_message_to_dict_has_tool_call_id_and_status():
    data = message_to_dict(ToolMessage("boom", "call_9", name="t", status="error", id="tm-1"))
    assert data["type"] == "tool"
    assert data["tool_call_id"] == "call_9"
    assert data["status"] == "error"
    assert data["name"] == "t"


def test_human_and_system_to_dict():
    assert message_to_dict(HumanMessage("hi", id="h"))["type"] == "human"
    assert message_to_dict(SystemMessage("rules", id="s"))["type"] == "system"
    assert "tool_calls" not in message_to_dict(HumanMessage("hi"))


# -- from dicts -------------------------------------------------------------------


@pytest.mark.parametrize(
    "message",
    [
        SystemMessage("be brief", name="sys"),
        HumanMessage("hi", name="bob", additional_kwargs={"k": 1}),
        AIMessage("sure", [tool_call("add", {"a": 1, "b": 2}, "call_1")],
                  usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
                  response_metadata={"finish_reason": "tool_calls"}),
        AIMessage("", invalid_tool_calls=[{"name": "add", "args": "{bad", "id": "call_2", "error": "bad json",
                                           "type": "invalid_tool_call"}]),
        ToolMessage("3", "call_1", name="add", status="error", artifact={"raw": 3}),
    ],
    ids=["system", "human", "ai", "ai-invalid", "tool"],
)
def test_round_trip_keeps_type_fields_and_id(message):
    data = message_to_dict(message)
    back = message_from_dict(json.loads(json.dumps(data)))
    assert type(back) is type(message)
    assert back.id == message.id
    assert message_to_dict(back) == data


def test_round_trip_keeps_tool_call_ids():
    msg = AIMessage("", [tool_call("a", {}, "call_A"), tool_call("b", {"x": 1}, "call_B")])
    back = message_from_dict(message_to_dict(msg))
    assert [c["id"] for c in back.tool_calls] == ["call_A", "call_B"]


@pytest.mark.parametrize(
    ("role", "cls"),
    [("user", HumanMessage), ("human", HumanMessage), ("assistant", AIMessage), ("ai", AIMessage),
     ("system", SystemMessage), ("developer", SystemMessage)],
)
def test_openai_roles_are_read(role, cls):
    msg = message_from_dict({"role": role, "content": "text"})
    assert type(msg) is cls
    assert msg.text == "text"


def test_openai_assistant_with_function_tool_calls():
    msg = message_from_dict({
        "role": "assistant", "content": None,
        "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}],
    })
    assert isinstance(msg, AIMessage)
    assert msg.content == ""
    assert msg.tool_calls == [{"name": "add", "args": {"a": 1, "b": 2}, "id": "call_1", "type": "tool_call"}]


def test_openai_tool_role_message():
    msg = message_from_dict({"role": "tool", "content": "3", "tool_call_id": "call_1"})
    assert isinstance(msg, ToolMessage)
    assert msg.tool_call_id == "call_1"
    assert msg.status == "success"


def test_remove_dict_is_a_remove_message():
    msg = message_from_dict({"type": "remove", "id": "m1"})
    assert isinstance(msg, RemoveMessage) and msg.id == "m1"


_USAGE = {"input_tokens": 3, "output_tokens": 1, "total_tokens": 4}
_INVALID = {"name": "f", "args": "{bad", "id": "c2", "error": "bad json", "type": "invalid_tool_call"}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"type": "human", "content": "hi", "id": "h1", "name": "ann", "additional_kwargs": {"k": [1]},
          "response_metadata": {}}, HumanMessage("hi", id="h1", name="ann", additional_kwargs={"k": [1]})),
        ({"role": "user", "content": "", "id": 7}, HumanMessage("", id="7")),
        ({"type": "system", "content": [{"type": "text", "text": "x"}], "id": "s1", "additional_kwargs": None},
         SystemMessage([{"type": "text", "text": "x"}], id="s1")),
        ({"type": "ai", "content": [], "id": "a1", "name": None, "additional_kwargs": {}, "response_metadata": {"m": 1},
          "tool_calls": [{"name": "f", "args": None, "id": "c1", "type": "tool_call", "extra": 1}],
          "invalid_tool_calls": [_INVALID], "usage_metadata": _USAGE},
         AIMessage("", [tool_call("f", {}, "c1")], [_INVALID], _USAGE, {"m": 1}, id="a1")),
        ({"role": "assistant", "content": None, "id": "a2", "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "g", "arguments": '{"x": 1}'}}]},
         AIMessage("", [tool_call("g", {"x": 1}, "c3")], id="a2")),
        ({"type": "tool", "content": "", "tool_call_id": "c1", "status": None, "artifact": [1], "id": "t1",
          "name": "f"}, ToolMessage("", "c1", name="f", artifact=[1], id="t1")),
        ({"role": "tool", "content": "3", "tool_call_id": "c1", "status": "error", "id": "t2"},
         ToolMessage("3", "c1", status="error", id="t2")),
        ({"type": "remove", "id": "m1"}, RemoveMessage("m1")),
    ],
    ids=["human", "user-int-id", "system-blocks", "ai-stored", "ai-openai", "tool-stored", "tool-openai", "remove"],
)
def test_a_dict_reads_as_exactly_its_message_with_containers_of_its_own(data, expected):
    read = message_from_dict(data)
    assert type(read) is type(expected) and read == expected and repr(read) == repr(expected)
    if isinstance(read, RemoveMessage):
        return
    assert read.additional_kwargs is not data.get("additional_kwargs")
    read.additional_kwargs["changed"] = True
    assert "changed" not in (data.get("additional_kwargs") or {})
    if isinstance(read, AIMessage):
        assert read.response_metadata is not data.get("response_metadata")
        assert read.invalid_tool_calls is not data.get("invalid_tool_calls")
        assert all(a is not b for a, b in zip(read.tool_calls, data["tool_calls"]))


def test_a_dict_without_an_id_or_with_a_call_without_one_reads_with_fresh_ones():
    first, second = (message_from_dict({"type": "ai", "content": "x", "id": "",
                                        "tool_calls": [{"name": "f", "args": {}, "id": None}]}) for _ in range(2))
    assert first.id and second.id and first.id != second.id
    assert first.tool_calls[0]["id"].startswith("call_") and first.tool_calls[0]["id"] != second.tool_calls[0]["id"]


def test_given_id_is_kept_and_missing_id_is_generated():
    assert message_from_dict({"type": "human", "content": "x", "id": "keep-me"}).id == "keep-me"
    assert message_from_dict({"role": "user", "content": "x"}).id


# -- bad input ----------------------------------------------------------------------


def test_missing_type_and_role_is_a_clear_error():
    with pytest.raises(ValueError, match="needs a 'type'.*or a 'role'"):
        message_from_dict({"content": "hi"})


def test_unknown_role_is_a_clear_error():
    with pytest.raises(ValueError, match="'role'"):
        message_from_dict({"role": "wizard", "content": "hi"})


def test_tool_message_without_tool_call_id_is_a_clear_error():
    with pytest.raises(ValueError, match="tool_call_id"):
        message_from_dict({"role": "tool", "content": "3"})


def test_missing_content_is_a_clear_error_except_for_ai():
    with pytest.raises(ValueError, match="'content' is missing"):
        message_from_dict({"role": "user"})
    assert message_from_dict({"type": "ai", "tool_calls": []}).content == ""


def test_unreadable_input_is_a_type_error():
    with pytest.raises(TypeError, match="cannot read a message from int"):
        messages_from_input(42)


# -- what users pass as input ----------------------------------------------------------


def test_plain_string_is_a_user_message():
    [msg] = messages_from_input("hi")
    assert isinstance(msg, HumanMessage) and msg.content == "hi"


def test_role_tuple_is_one_message():
    [msg] = messages_from_input(("user", "hi"))
    assert isinstance(msg, HumanMessage) and msg.content == "hi"


def test_mixed_list_of_inputs():
    ai = AIMessage("a")
    msgs = messages_from_input([
        ("system", "rules"), {"role": "user", "content": "q"}, ai,
        {"type": "tool", "content": "r", "tool_call_id": "c"}, "more",
    ])
    assert [m.type for m in msgs] == ["system", "human", "ai", "tool", "human"]
    assert msgs[2] is ai  # message objects pass through untouched


def test_langchain_message_objects_are_read():
    lc = pytest.importorskip("langchain_core.messages")
    [msg] = messages_from_input([lc.AIMessage(content="hey", id="lc-1",
                                              tool_calls=[{"name": "f", "args": {"x": 1}, "id": "c1"}])])
    assert isinstance(msg, AIMessage)
    assert msg.id == "lc-1"
    assert msg.tool_calls[0]["id"] == "c1" and msg.tool_calls[0]["args"] == {"x": 1}


# A message's empty additional_kwargs, response_metadata and invalid_tool_calls are what users read, compare,
# change, copy and pickle, exactly as if each message had been given its own empty dict or list.
_EMPTY_BY_DEFAULT = [
    (lambda: HumanMessage("hi", id="m"), lambda: HumanMessage("hi", id="m", additional_kwargs={})),
    (lambda: SystemMessage("be brief", id="m"), lambda: SystemMessage("be brief", id="m", additional_kwargs={})),
    (lambda: ToolMessage("42", tool_call_id="c1", id="m"),
     lambda: ToolMessage("42", tool_call_id="c1", id="m", additional_kwargs={})),
    (lambda: AIMessage("ok", id="m"),
     lambda: AIMessage("ok", id="m", additional_kwargs={}, response_metadata={}, invalid_tool_calls=[])),
]
_EMPTY_FIELDS = ("additional_kwargs", "response_metadata", "invalid_tool_calls")


def _empty_fields(message):
    return [name for name in _EMPTY_FIELDS if name in {f.name for f in dataclasses.fields(message)}]


@pytest.mark.parametrize(("default", "explicit"), _EMPTY_BY_DEFAULT)
def test_empty_containers_read_compare_and_print_as_given_ones(default, explicit):
    message = default()
    assert repr(default()) == repr(explicit())
    assert default() == explicit() and explicit() == default() and default() == default()
    for name in _empty_fields(message):
        expected = [] if name == "invalid_tool_calls" else {}
        assert getattr(default(), name) == expected and type(getattr(default(), name)) is type(expected)
    assert message_to_dict(default()) == message_to_dict(explicit())
    assert dataclasses.asdict(default()) == dataclasses.asdict(explicit())
    assert dataclasses.replace(default(), content="changed") == dataclasses.replace(explicit(), content="changed")
    assert message_from_dict(message_to_dict(default())) == explicit()


@pytest.mark.parametrize(("default", "explicit"), _EMPTY_BY_DEFAULT)
def test_a_changed_empty_container_stays_changed_and_belongs_to_its_message(default, explicit):
    message, other = default(), default()
    assert message.additional_kwargs is message.additional_kwargs
    message.additional_kwargs["k"] = 1
    assert message.additional_kwargs == {"k": 1} and other.additional_kwargs == {}
    assert message != other and message_to_dict(message)["additional_kwargs"] == {"k": 1}
    if isinstance(message, AIMessage):
        bad = {"name": "f", "args": "{", "id": "c", "error": "bad", "type": "invalid_tool_call"}
        message.invalid_tool_calls.append(bad)
        message.response_metadata["finish_reason"] = "stop"
        assert len(message.invalid_tool_calls) == 1 and other.invalid_tool_calls == []
        assert message_to_dict(message)["response_metadata"] == {"finish_reason": "stop"}
        assert other.response_metadata == {}
    replaced = default()
    replaced.additional_kwargs = {"set": True}
    assert replaced.additional_kwargs == {"set": True}


@pytest.mark.parametrize(("default", "explicit"), _EMPTY_BY_DEFAULT)
def test_copies_and_pickles_of_a_message_with_empty_containers_are_equal_and_independent(default, explicit):
    for copied in (copy.copy(default()), copy.deepcopy(default()), pickle.loads(pickle.dumps(default()))):
        assert copied == explicit() and repr(copied) == repr(explicit())
    message = default()
    message.additional_kwargs["k"] = 1
    for copied in (copy.deepcopy(message), pickle.loads(pickle.dumps(message))):
        assert copied.additional_kwargs == {"k": 1}
        copied.additional_kwargs["k"] = 2
        assert message.additional_kwargs == {"k": 1}
    fresh = default()
    shallow = copy.copy(fresh)
    shallow.additional_kwargs["k"] = 3
    assert fresh.additional_kwargs == {"k": 3}  # a shallow copy shares its containers, the empty ones too


def test_an_unknown_attribute_of_a_message_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_field"):
        AIMessage("ok").no_such_field  # noqa: B018
    assert not hasattr(HumanMessage("hi"), "model_dump")
