"""The LangChain bridge, with a real ``ChatOpenAI`` talking to the fake OpenAI server."""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from langchain_core.tools import tool as langchain_tool
from langchain_openai import ChatOpenAI
from provider_fakes import (
    MODEL,
    FakeServer,
    Pause,
    openai_chunk,
    openai_completion,
    openai_error,
    openai_stream,
    openai_tool_call,
    openai_tool_call_chunk,
    openai_usage_chunk,
)

from backchannel.errors import ModelRequestError
from backchannel.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, tool_call
from backchannel.models import ModelRequest, TextDelta, ToolCallDelta, accumulate, init_model
from backchannel.models.langchain import LangChainModel, tool_from_langchain
from backchannel.tools import Tool, tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def search(query: str) -> str:
    """Search the web."""
    return query


@pytest.fixture
async def chat_openai(server: FakeServer) -> AsyncIterator[ChatOpenAI]:
    chat = ChatOpenAI(
        model=MODEL, base_url=f"{server.url}/v1", api_key="x", max_retries=0, stream_usage=True
    )
    yield chat
    await chat.root_async_client.close()


@pytest.fixture
def model(chat_openai: ChatOpenAI) -> LangChainModel:
    return LangChainModel(chat_openai)


def make_request(model: LangChainModel, *messages: Any, **fields: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=list(messages) or [HumanMessage("hi")], **fields)


async def test_ainvoke_text_reply(server: FakeServer, model: LangChainModel) -> None:
    server.reply(openai_completion("Hello there!", usage=(12, 3), completion_id="chatcmpl-abc"))

    reply = await model.generate(
        make_request(
            model,
            SystemMessage("Answer in English."),
            HumanMessage("hi"),
            system_prompt="Be brief.",
            settings={"temperature": 0.2},
        )
    )

    assert isinstance(reply, AIMessage)
    assert reply.text == "Hello there!"
    assert reply.usage_metadata == {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
    assert reply.response_metadata["model_name"] == MODEL
    assert reply.response_metadata["finish_reason"] == "stop"
    assert model.name == MODEL
    body = server.last_body
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in English."},
        {"role": "user", "content": "hi"},
    ]
    assert body["temperature"] == 0.2 and not body.get("stream")


async def test_ainvoke_two_parallel_tool_calls_with_bound_tools(
    server: FakeServer, model: LangChainModel
) -> None:
    server.reply(
        openai_completion(
            None,
            [
                openai_tool_call("call_1", "add", '{"a": 1, "b": 2}'),
                openai_tool_call("call_2", "search", '{"query": "weather"}'),
            ],
            finish_reason="tool_calls",
        )
    )

    reply = await model.generate(
        make_request(model, tools=[add, search], settings={"tool_choice": "required"})
    )

    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "call_1"),
        tool_call("search", {"query": "weather"}, "call_2"),
    ]
    body = server.last_body
    assert body["tools"] == [
        {"type": "function", "function": add.schema()},
        {"type": "function", "function": search.schema()},
    ]
    assert body["tool_choice"] == "required"


async def test_history_round_trips_through_langchain_messages(
    server: FakeServer, model: LangChainModel
) -> None:
    server.reply(openai_completion("done"))
    history = [
        HumanMessage("add 1 and 2, then search"),
        AIMessage(
            "",
            tool_calls=[tool_call("add", {"a": 1, "b": 2}, "call_1")],
            invalid_tool_calls=[
                {
                    "name": "search",
                    "args": '{"query": ',
                    "id": "call_2",
                    "error": "bad JSON",
                    "type": "invalid_tool_call",
                }
            ],
        ),
        ToolMessage("3", tool_call_id="call_1"),
        ToolMessage("invalid arguments", tool_call_id="call_2", status="error"),
    ]

    await model.generate(make_request(model, *history, tools=[add, search]))

    user, assistant, first_result, second_result = server.last_body["messages"]
    assert user == {"role": "user", "content": "add 1 and 2, then search"}
    assert assistant["role"] == "assistant" and not assistant.get("content")
    assert assistant["tool_calls"] == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
        },
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "search", "arguments": '{"query": '},
        },
    ]
    assert first_result == {"role": "tool", "tool_call_id": "call_1", "content": "3"}
    assert second_result == {
        "role": "tool",
        "tool_call_id": "call_2",
        "content": "invalid arguments",
    }


async def test_ainvoke_malformed_tool_arguments_become_invalid_tool_calls(
    server: FakeServer, model: LangChainModel
) -> None:
    server.reply(
        openai_completion(
            None,
            [
                openai_tool_call("call_ok", "add", '{"a": 1, "b": 2}'),
                openai_tool_call("call_bad", "add", '{"a": 1,'),
            ],
            finish_reason="tool_calls",
        )
    )

    reply = await model.generate(make_request(model, tools=[add]))

    assert reply.tool_calls == [tool_call("add", {"a": 1, "b": 2}, "call_ok")]
    [bad] = reply.invalid_tool_calls
    assert (bad["id"], bad["name"], bad["args"], bad["type"]) == (
        "call_bad",
        "add",
        '{"a": 1,',
        "invalid_tool_call",
    )
    assert bad["error"]


async def test_astream_text_deltas_arrive_in_order_as_sent(
    server: FakeServer, model: LangChainModel
) -> None:
    pause = Pause()
    server.reply(
        openai_stream(
            openai_chunk({"role": "assistant", "content": ""}),
            openai_chunk({"content": "Hel"}),
            pause,
            openai_chunk({"content": "lo"}),
            openai_chunk({"content": " world"}),
            openai_chunk({}, finish_reason="stop"),
            openai_usage_chunk(9, 3),
        )
    )

    deltas = []
    async for delta in model.stream(make_request(model)):
        deltas.append(delta)
        pause.release()  # the rest is only sent once the first piece has reached us

    assert not pause.timed_out, "the first delta was held back until the stream ended"
    texts = [d for d in deltas if isinstance(d, TextDelta)]
    assert texts == [TextDelta("Hel"), TextDelta("lo"), TextDelta(" world")]
    finish = deltas[-1]
    assert finish.usage == {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12}
    assert finish.finish_reason == "stop" and finish.metadata["model_name"] == MODEL
    assert server.last_body["stream"] is True


async def test_astream_tool_call_fragments_reassemble(
    server: FakeServer, model: LangChainModel
) -> None:
    server.reply(
        openai_stream(
            openai_chunk({"role": "assistant", "content": None}),
            openai_tool_call_chunk(0, "", "call_1", "add"),
            openai_tool_call_chunk(0, '{"a": 1'),
            openai_tool_call_chunk(0, ', "b": 2}'),
            openai_tool_call_chunk(1, '{"query"', "call_2", "search"),
            openai_tool_call_chunk(1, ': "weather"}'),
            openai_chunk({}, finish_reason="tool_calls"),
            openai_usage_chunk(20, 11),
        )
    )

    deltas = [d async for d in model.stream(make_request(model, tools=[add, search]))]

    calls = [d for d in deltas if isinstance(d, ToolCallDelta)]
    assert calls == [
        ToolCallDelta(0, "call_1", "add", ""),
        ToolCallDelta(0, None, None, '{"a": 1'),
        ToolCallDelta(0, None, None, ', "b": 2}'),
        ToolCallDelta(1, "call_2", "search", '{"query"'),
        ToolCallDelta(1, None, None, ': "weather"}'),
    ]
    reply = await accumulate(_replay(deltas))
    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "call_1"),
        tool_call("search", {"query": "weather"}, "call_2"),
    ]
    assert reply.usage_metadata == {"input_tokens": 20, "output_tokens": 11, "total_tokens": 31}
    assert reply.response_metadata["finish_reason"] == "tool_calls"


async def test_astream_malformed_tool_arguments_become_invalid_tool_calls(
    server: FakeServer, model: LangChainModel
) -> None:
    server.reply(
        openai_stream(
            openai_tool_call_chunk(0, '{"a": 1,', "call_1", "add"),
            openai_tool_call_chunk(0, ' "b": }'),
            openai_chunk({}, finish_reason="tool_calls"),
            openai_usage_chunk(5, 5),
        )
    )

    reply = await accumulate(model.stream(make_request(model, tools=[add])))

    assert reply.tool_calls == []
    [bad] = reply.invalid_tool_calls
    assert (bad["id"], bad["name"], bad["args"]) == ("call_1", "add", '{"a": 1, "b": }')
    assert "not valid JSON" in bad["error"]


@pytest.mark.parametrize("streamed", [False, True], ids=["ainvoke", "astream"])
async def test_a_provider_http_error_is_a_typed_model_error(
    server: FakeServer, model: LangChainModel, streamed: bool
) -> None:
    server.reply(openai_error("Invalid value for 'temperature'.", 400))

    with pytest.raises(ModelRequestError, match="Invalid value for 'temperature'") as caught:
        if streamed:
            await accumulate(model.stream(make_request(model)))
        else:
            await model.generate(make_request(model))

    assert caught.value.status == 400 and not caught.value.retryable
    assert isinstance(caught.value.__cause__, openai.BadRequestError)


def test_init_model_wraps_a_langchain_chat_model(chat_openai: ChatOpenAI) -> None:
    model = init_model(chat_openai)

    assert isinstance(model, LangChainModel) and model.model is chat_openai


async def test_tool_from_langchain_wraps_a_decorated_function() -> None:
    @langchain_tool
    def multiply(a: int, b: int = 2) -> int:
        """Multiply two integers."""
        return a * b

    wrapped = tool_from_langchain(multiply)

    assert isinstance(wrapped, Tool)
    assert wrapped.schema() == {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "required": ["a"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 2}},
        },
    }
    assert await wrapped.ainvoke({"a": 3, "b": 4}) == 12
    assert await wrapped.ainvoke({"a": 5}) == 10


async def test_tool_from_langchain_wraps_an_async_tool_and_checks_required_arguments() -> None:
    @langchain_tool
    async def shout(text: str) -> str:
        """Say it louder."""
        return text.upper()

    wrapped = tool_from_langchain(shout)

    assert await wrapped.ainvoke({"text": "hi"}) == "HI"
    with pytest.raises(ValueError, match="missing required argument"):
        await wrapped.ainvoke({})


def test_missing_langchain_core_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "langchain_core", None)
    monkeypatch.delitem(sys.modules, "backchannel.models.langchain")

    with pytest.raises(ImportError, match=r'pip install "backchannel\[langchain\]"'):
        importlib.import_module("backchannel.models.langchain")


async def _replay(deltas: list[Any]) -> AsyncIterator[Any]:
    for delta in deltas:
        yield delta
