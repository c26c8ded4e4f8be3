"""AnthropicModel through the real anthropic SDK against a fake Messages API server on loopback."""

from __future__ import annotations

import importlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import pytest
from provider_fakes import (
    CLAUDE,
    FakeServer,
    Pause,
    SseReply,
    anthropic_error,
    anthropic_event,
    anthropic_message,
    anthropic_stream,
    anthropic_usage,
    block_start,
    block_stop,
    json_delta,
    message_delta,
    message_start,
    text_block,
    text_delta,
    tool_use_block,
)

from backchannel.errors import (
    MissingAPIKeyError,
    ModelAuthenticationError,
    ModelRateLimitError,
    ModelRequestError,
    ModelServerError,
)
from backchannel.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, tool_call
from backchannel.models import (
    FinishDelta,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    accumulate,
    init_model,
)
from backchannel.models.anthropic import AnthropicModel
from backchannel.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def search(query: str) -> str:
    """Search the web."""
    return query


@pytest.fixture
async def model(server: FakeServer) -> AsyncIterator[AnthropicModel]:
    # Without prompt caching, so the tests of the translation see it alone (the caching test turns it on).
    model = AnthropicModel(CLAUDE, base_url=server.url, api_key="test-key", max_retries=0, prompt_caching=False)
    yield model
    await model.client.close()


def make_request(model: AnthropicModel, *messages: Any, **fields: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=list(messages) or [HumanMessage("hi")], **fields)


async def test_generate_text_reply(server: FakeServer, model: AnthropicModel) -> None:
    server.reply(
        anthropic_message(
            text_block("Hello"),
            text_block(" there!"),
            usage=anthropic_usage(12, 4, cache_read=100),
            message_id="msg_abc",
        )
    )

    reply = await model.generate(
        make_request(
            model,
            SystemMessage("Answer in English."),
            HumanMessage("hi"),
            system_prompt="Be brief.",
        )
    )

    assert reply.text == "Hello there!"
    assert reply.id == "msg_abc"
    assert reply.usage_metadata == {"input_tokens": 112, "output_tokens": 4, "total_tokens": 116}
    assert reply.response_metadata == {"model_name": CLAUDE, "finish_reason": "end_turn"}
    sent = server.requests[-1]
    assert sent.path == "/v1/messages"
    # SDK releases differ in how they send the key: x-api-key, or a bearer token
    assert "test-key" in (
        sent.headers.get("x-api-key"),
        sent.headers.get("authorization", "").removeprefix("Bearer "),
    )
    assert "anthropic-version" in sent.headers
    assert sent.body == {
        "model": CLAUDE,
        "max_tokens": 4096,
        "system": "Be brief.\n\nAnswer in English.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


async def test_generate_two_parallel_tool_calls(server: FakeServer, model: AnthropicModel) -> None:
    server.reply(
        anthropic_message(
            text_block("Let me check."),
            tool_use_block("toolu_1", "add", {"a": 1, "b": 2}),
            tool_use_block("toolu_2", "search", {"query": "weather"}),
            stop_reason="tool_use",
        )
    )

    reply = await model.generate(make_request(model, tools=[add, search]))

    assert reply.text == "Let me check."
    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "toolu_1"),
        tool_call("search", {"query": "weather"}, "toolu_2"),
    ]
    assert reply.response_metadata["finish_reason"] == "tool_use"
    assert server.last_body["tools"] == [
        {"name": "add", "description": "Add two integers.", "input_schema": add.parameters},
        {"name": "search", "description": "Search the web.", "input_schema": search.parameters},
    ]


async def test_history_is_sent_in_anthropic_form(server: FakeServer, model: AnthropicModel) -> None:
    server.reply(anthropic_message(text_block("done")))
    history = [
        HumanMessage(
            [
                "Look:",
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ]
        ),
        AIMessage(
            "Checking.",
            tool_calls=[tool_call("add", {"a": 1, "b": 2}, "toolu_1")],
            invalid_tool_calls=[
                {
                    "name": "search",
                    "args": '{"query": ',
                    "id": "toolu_2",
                    "error": "bad JSON",
                    "type": "invalid_tool_call",
                }
            ],
        ),
        ToolMessage("3", tool_call_id="toolu_1"),
        ToolMessage("invalid arguments", tool_call_id="toolu_2", status="error"),
        SystemMessage("Be brief."),
        HumanMessage("and now?"),
        AIMessage(""),  # an empty reply carries nothing and the API would reject it
        HumanMessage("hello?"),
    ]

    await model.generate(make_request(model, *history, tools=[add, search]))

    assert server.last_body["system"] == "Be brief."
    assert server.last_body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
                {"type": "tool_use", "id": "toolu_2", "name": "search", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "invalid arguments",
                    "is_error": True,
                },
                {"type": "text", "text": "and now?"},
                {"type": "text", "text": "hello?"},
            ],
        },
    ]


async def test_settings_are_translated_and_passed_through(server: FakeServer) -> None:
    model = AnthropicModel(
        CLAUDE, base_url=server.url, api_key="k", max_tokens=512, temperature=0.5, top_k=20
    )
    server.reply(anthropic_message(text_block("ok")))
    settings = {
        "temperature": 0.1,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": "END",
        "thinking": {"type": "disabled"},
    }

    await model.generate(make_request(model, tools=[add], settings=settings))
    await model.client.close()

    body = server.last_body
    assert (body["max_tokens"], body["temperature"], body["top_k"]) == (512, 0.1, 20)
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["stop_sequences"] == ["END"] and "stop" not in body
    assert body["thinking"] == {"type": "disabled"}


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("add", {"type": "tool", "name": "add"}),
        ({"type": "function", "function": {"name": "add"}}, {"type": "tool", "name": "add"}),
        ({"type": "tool", "name": "add"}, {"type": "tool", "name": "add"}),
    ],
)
async def test_tool_choice_in_openai_or_anthropic_form(
    server: FakeServer, model: AnthropicModel, choice: Any, sent: dict[str, Any]
) -> None:
    server.reply(anthropic_message(text_block("ok")))

    await model.generate(make_request(model, tools=[add], settings={"tool_choice": choice}))

    assert server.last_body["tool_choice"] == sent


async def test_tool_choice_is_dropped_without_tools(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.reply(anthropic_message(text_block("ok")))

    await model.generate(
        make_request(model, settings={"tool_choice": "auto", "parallel_tool_calls": False})
    )

    assert "tool_choice" not in server.last_body and "tools" not in server.last_body


async def test_stream_text_deltas_arrive_in_order_as_sent(
    server: FakeServer, model: AnthropicModel
) -> None:
    pause = Pause()
    server.reply(
        anthropic_stream(
            message_start(input_tokens=25, cache_read=5),
            block_start(0, text_block("")),
            text_delta(0, "Hel"),
            pause,
            text_delta(0, "lo"),
            text_delta(0, " world"),
            block_stop(0),
            message_delta("end_turn", output_tokens=7),
        )
    )

    deltas = []
    async for delta in model.stream(make_request(model)):
        deltas.append(delta)
        pause.release()  # the rest is only sent once the first piece has reached us

    assert not pause.timed_out, "the first delta was held back until the stream ended"
    assert deltas == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" world"),
        FinishDelta(
            {"input_tokens": 30, "output_tokens": 7, "total_tokens": 37},
            "end_turn",
            {"model_name": CLAUDE},
            "msg_stream",
        ),
    ]
    assert server.last_body["stream"] is True


async def test_stream_tool_use_fragments_are_passed_on_and_reassemble(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.reply(
        anthropic_stream(
            message_start(input_tokens=40),
            block_start(0, text_block("")),
            text_delta(0, "Checking."),
            block_stop(0),
            block_start(1, tool_use_block("toolu_1", "add", {})),
            json_delta(1, ""),
            json_delta(1, '{"a": 1'),
            json_delta(1, ', "b": 2}'),
            block_stop(1),
            block_start(2, tool_use_block("toolu_2", "search", {})),
            json_delta(2, '{"query": "weather"}'),
            block_stop(2),
            message_delta("tool_use", output_tokens=30),
        )
    )

    deltas = [d async for d in model.stream(make_request(model, tools=[add, search]))]

    assert deltas[:7] == [
        TextDelta("Checking."),
        ToolCallDelta(0, "toolu_1", "add", ""),
        ToolCallDelta(0, None, None, ""),
        ToolCallDelta(0, None, None, '{"a": 1'),
        ToolCallDelta(0, None, None, ', "b": 2}'),
        ToolCallDelta(1, "toolu_2", "search", ""),
        ToolCallDelta(1, None, None, '{"query": "weather"}'),
    ]
    reply = await accumulate(_replay(deltas))
    assert reply.text == "Checking."
    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "toolu_1"),
        tool_call("search", {"query": "weather"}, "toolu_2"),
    ]
    assert reply.usage_metadata == {"input_tokens": 40, "output_tokens": 30, "total_tokens": 70}
    assert reply.response_metadata == {"model_name": CLAUDE, "finish_reason": "tool_use"}


async def test_stream_malformed_tool_input_becomes_invalid_tool_call(
    server: FakeServer, model: AnthropicModel
) -> None:
    server.reply(
        anthropic_stream(
            message_start(input_tokens=10),
            block_start(0, tool_use_block("toolu_1", "add", {})),
            json_delta(0, '{"a": 1, "b"'),
            block_stop(0),
            message_delta("max_tokens", output_tokens=8),
        )
    )

    reply = await accumulate(model.stream(make_request(model, tools=[add])))

    assert reply.tool_calls == []
    [bad] = reply.invalid_tool_calls
    assert (bad["id"], bad["name"], bad["args"]) == ("toolu_1", "add", '{"a": 1, "b"')
    assert "not valid JSON" in bad["error"]
    assert reply.response_metadata["finish_reason"] == "max_tokens"


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_a_provider_http_error_is_a_typed_model_error(
    server: FakeServer, model: AnthropicModel, streamed: bool
) -> None:
    server.reply(anthropic_error("max_tokens: must be positive", 400))

    with pytest.raises(ModelRequestError, match="max_tokens: must be positive") as caught:
        if streamed:
            await accumulate(model.stream(make_request(model)))
        else:
            await model.generate(make_request(model))

    error = caught.value
    assert (error.status, error.provider, error.retryable) == (400, "anthropic", False)
    assert isinstance(error.__cause__, anthropic.BadRequestError)


@pytest.mark.parametrize(
    ("status", "kind", "expected", "retryable"),
    [
        (401, "authentication_error", ModelAuthenticationError, False),
        (429, "rate_limit_error", ModelRateLimitError, True),
        (500, "api_error", ModelServerError, True),
        (529, "overloaded_error", ModelServerError, True),
    ],
)
async def test_each_status_maps_to_its_error_type(
    server: FakeServer, model: AnthropicModel, status: int, kind: str, expected: type, retryable: bool
) -> None:
    server.reply(anthropic_error("it went wrong", status, kind))

    with pytest.raises(expected) as caught:
        await model.generate(make_request(model))

    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert len(server.requests) == 1


async def test_an_overloaded_error_mid_stream_is_a_retryable_server_error(
    server: FakeServer, model: AnthropicModel
) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.reply(SseReply([anthropic_event(message_start(input_tokens=5)), anthropic_event(error)]))

    with pytest.raises(ModelServerError, match="Overloaded") as caught:
        await accumulate(model.stream(make_request(model)))

    assert caught.value.retryable and caught.value.provider == "anthropic"


def test_a_missing_key_names_the_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)

    with pytest.raises(MissingAPIKeyError, match="ANTHROPIC_API_KEY is not set") as caught:
        init_model(f"anthropic:{CLAUDE}")

    assert caught.value.env_var == "ANTHROPIC_API_KEY"


async def test_init_model_builds_an_anthropic_adapter(server: FakeServer) -> None:
    model = init_model(f"anthropic:{CLAUDE}", base_url=server.url, api_key="k", max_tokens=100)
    server.reply(anthropic_message(text_block("hi")))

    reply = await model.generate(make_request(model))
    await model.client.close()

    assert isinstance(model, AnthropicModel) and model.name == CLAUDE
    assert reply.text == "hi"
    assert (server.last_body["model"], server.last_body["max_tokens"]) == (CLAUDE, 100)


def test_missing_sdk_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    monkeypatch.delitem(sys.modules, "backchannel.models.anthropic")

    with pytest.raises(ImportError, match=r'pip install "backchannel\[anthropic\]"'):
        importlib.import_module("backchannel.models.anthropic")


async def _replay(deltas: list[Any]) -> AsyncIterator[Any]:
    for delta in deltas:
        yield delta


async def test_prompt_caching_marks_the_tools_the_system_prompt_and_the_conversation(server: FakeServer) -> None:
    model = AnthropicModel(CLAUDE, base_url=server.url, api_key="k", max_retries=0)  # caching is the default
    ephemeral = {"type": "ephemeral"}
    server.reply(anthropic_message(text_block("ok")), anthropic_message(text_block("ok")))
    history = [HumanMessage("first"), AIMessage("", tool_calls=[tool_call("add", {"a": 1, "b": 2}, "toolu_1")]),
               ToolMessage("3", tool_call_id="toolu_1")]
    await model.generate(make_request(model, *history, tools=[add, search], system_prompt="Be brief."))
    body = server.last_body
    assert body["tools"][0] == {"name": "add", "description": "Add two integers.", "input_schema": add.parameters}
    assert body["tools"][-1]["cache_control"] == ephemeral
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": ephemeral}]
    assert body["messages"][-1] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "3", "cache_control": ephemeral}]}
    assert "cache_control" not in body["messages"][0]["content"][0]  # one breakpoint, at the end
    # The next step sends the same prefix: only the breakpoint at the end of the conversation moved.
    await model.generate(make_request(model, *history, AIMessage("done"), HumanMessage("next"),
                                      tools=[add, search], system_prompt="Be brief."))
    second = server.last_body
    assert second["messages"][2]["content"] == [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3"}]
    assert second["messages"][-1]["content"] == [{"type": "text", "text": "next", "cache_control": ephemeral}]
    assert second["tools"] == body["tools"] and second["system"] == body["system"]
    await model.client.close()
