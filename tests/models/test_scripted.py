"""ScriptedModel: the deterministic model tests and the offline demo rely on."""

import asyncio
import json
import time

import pytest

from backchannel import AIMessage, HumanMessage, ModelError, ModelRequest, ScriptedModel, init_model
from backchannel.models.base import (
    ChatModel,
    FinishDelta,
    TextDelta,
    ToolCallDelta,
    accumulate,
    parse_tool_arguments,
)


def request(model, text="hi"):
    return ModelRequest(model, [HumanMessage(text)])


async def test_replies_in_script_order_then_runs_out_with_a_clear_error():
    model = ScriptedModel(["one", "two"])
    assert (await model.generate(request(model))).text == "one"
    assert (await model.generate(request(model))).text == "two"
    with pytest.raises(ModelError, match="ran out of replies.*2 item"):
        await model.generate(request(model))
    assert model.calls == 3


async def test_loop_starts_the_script_over():
    model = ScriptedModel(["a", "b"], loop=True)
    texts = [(await model.generate(request(model))).text for _ in range(5)]
    assert texts == ["a", "b", "a", "b", "a"]


async def test_ai_message_items_are_fresh_copies():
    item = AIMessage("same", usage_metadata={"input_tokens": 1, "output_tokens": 1, "total_tokens": 2})
    model = ScriptedModel([item], loop=True)
    first = await model.generate(request(model))
    second = await model.generate(request(model))
    assert first.text == second.text == "same"
    assert first.id != second.id and first is not item
    assert first.usage_metadata == item.usage_metadata


async def test_dict_items_with_tool_calls_get_ids():
    model = ScriptedModel([{"content": "calling", "tool_calls": [{"name": "add", "args": {"a": 1}},
                                                                 {"name": "mul", "id": "mine"}],
                            "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}}])
    msg = await model.generate(request(model))
    assert msg.text == "calling"
    assert [c["name"] for c in msg.tool_calls] == ["add", "mul"]
    assert msg.tool_calls[0]["args"] == {"a": 1} and msg.tool_calls[1]["args"] == {}
    assert msg.tool_calls[0]["id"] and msg.tool_calls[1]["id"] == "mine"
    assert all(c["type"] == "tool_call" for c in msg.tool_calls)
    assert msg.usage_metadata == {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7}


async def test_exception_items_are_raised():
    model = ScriptedModel([ModelError("429 rate limited"), "ok"])
    with pytest.raises(ModelError, match="429"):
        await model.generate(request(model))
    assert (await model.generate(request(model))).text == "ok"


async def test_callable_items_see_the_request():
    model = ScriptedModel([lambda req: f"you said {req.messages[-1].text}"])
    assert (await model.generate(request(model, "ping"))).text == "you said ping"


async def test_bad_item_is_a_type_error():
    model = ScriptedModel([42])
    with pytest.raises(TypeError, match="cannot reply with int"):
        await model.generate(request(model))


async def test_record_keeps_a_snapshot_of_each_request():
    model = ScriptedModel(["a", "b"])
    assert model.requests == []  # off by default
    await model.generate(request(model))
    assert model.requests == []
    model.record = True
    messages = [HumanMessage("first")]
    await model.generate(ModelRequest(model, messages, system_prompt="sys"))
    messages.append(HumanMessage("later"))  # the run's list keeps growing after the call
    [req] = model.requests
    assert req.system_prompt == "sys"
    assert [m.text for m in req.messages] == ["first"]


async def test_latency_is_slept_before_each_reply():
    model = ScriptedModel(["a"], latency=0.05)
    t0 = time.perf_counter()
    await model.generate(request(model))
    assert time.perf_counter() - t0 >= 0.045


async def test_latency_is_cancellable():
    model = ScriptedModel(["a"], latency=5)
    task = asyncio.create_task(model.generate(request(model)))
    await asyncio.sleep(0.01)
    task.cancel()
    t0 = time.perf_counter()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.perf_counter() - t0 < 1.0  # against 5 s of latency


# -- streaming --------------------------------------------------------------------------------


async def test_stream_yields_word_deltas_and_a_finish():
    model = ScriptedModel([{"content": "one two three", "usage": {"input_tokens": 1, "output_tokens": 3,
                                                                  "total_tokens": 4}}])
    deltas = [d async for d in model.stream(request(model))]
    texts = [d.text for d in deltas if isinstance(d, TextDelta)]
    assert texts == ["one ", "two ", "three"]
    finish = deltas[-1]
    assert isinstance(finish, FinishDelta)
    assert finish.finish_reason == "stop"
    assert finish.usage == {"input_tokens": 1, "output_tokens": 3, "total_tokens": 4}


async def test_chunk_size_groups_words():
    model = ScriptedModel(["a b c d e"], chunk_size=2)
    texts = [d.text async for d in model.stream(request(model)) if isinstance(d, TextDelta)]
    assert texts == ["a b ", "c d ", "e"]


async def test_stream_splits_tool_call_arguments_and_accumulates_back():
    model = ScriptedModel([{"tool_calls": [{"name": "search", "args": {"query": "bees", "limit": 3}, "id": "c1"}]}])
    deltas = [d async for d in model.stream(request(model))]
    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert len(calls) == 2 and calls[0].id == "c1" and calls[0].name == "search" and calls[1].id is None
    assert json.loads("".join(d.args for d in calls)) == {"query": "bees", "limit": 3}
    assert deltas[-1].finish_reason == "tool_calls"

    async def replay():
        for d in deltas:
            yield d

    msg = await accumulate(replay())
    assert msg.tool_calls == [{"name": "search", "args": {"query": "bees", "limit": 3}, "id": "c1",
                               "type": "tool_call"}]


async def test_streamed_invalid_tool_call_accumulates_to_an_invalid_call():
    bad = AIMessage("", invalid_tool_calls=[{"name": "add", "args": '{"a": ', "id": "c9", "error": None,
                                             "type": "invalid_tool_call"}])
    model = ScriptedModel([bad])
    msg = await accumulate(model.stream(request(model)))
    assert msg.tool_calls == []
    [invalid] = msg.invalid_tool_calls
    assert invalid["id"] == "c9" and invalid["args"] == '{"a": '
    assert "not valid JSON" in invalid["error"]


async def test_generate_and_stream_agree():
    item = {"content": "hello there", "tool_calls": [{"name": "t", "args": {"x": 1}, "id": "c"}]}
    a = await ScriptedModel([item]).generate(request(None))
    b = await accumulate(ScriptedModel([item]).stream(request(None)))
    assert (a.text, a.tool_calls) == (b.text, b.tool_calls)


def test_parse_tool_arguments():
    assert parse_tool_arguments('{"a": 1}') == ({"a": 1}, None)
    assert parse_tool_arguments("") == ({}, None)
    args, error = parse_tool_arguments("[1]")
    assert args == {} and "JSON object" in error
    args, error = parse_tool_arguments('{"a": ')
    assert args == {} and "not valid JSON" in error


async def test_chat_model_base_derives_generate_from_stream_and_back():
    class StreamOnly(ChatModel):
        async def stream(self, request):
            yield TextDelta("hi ")
            yield TextDelta("there")
            yield FinishDelta(finish_reason="stop")

    class GenerateOnly(ChatModel):
        async def generate(self, request):
            return AIMessage("whole", [{"name": "f", "args": {"k": "v"}, "id": "c1", "type": "tool_call"}])

    assert (await StreamOnly().generate(request(None))).text == "hi there"
    msg = await accumulate(GenerateOnly().stream(request(None)))
    assert msg.text == "whole" and msg.tool_calls[0]["args"] == {"k": "v"}

    class Neither(ChatModel):
        pass

    with pytest.raises(NotImplementedError):
        await Neither().generate(request(None))


def test_init_model_passes_model_objects_through_and_rejects_bad_strings():
    model = ScriptedModel(["x"])
    assert init_model(model) is model
    with pytest.raises(ValueError, match="provider:model-name"):
        init_model("gpt-4o")
    with pytest.raises(TypeError, match="not a chat model"):
        init_model(object())
