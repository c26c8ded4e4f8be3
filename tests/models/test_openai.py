"""OpenAIModel through the real openai SDK against a fake Chat Completions server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
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

from backchannel.errors import (
    MissingAPIKeyError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelError,
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
from backchannel.models.openai import OpenAIModel
from backchannel.tools import tool


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first addend.
        b: The second addend.
    """
    return a + b


@tool
def search(query: str) -> str:
    """Search the web."""
    return query


@pytest.fixture
async def model(server: FakeServer) -> AsyncIterator[OpenAIModel]:
    model = OpenAIModel(MODEL, base_url=f"{server.url}/v1", api_key="test-key", max_retries=0)
    yield model
    await model.client.close()


def make_request(model: OpenAIModel, *messages: Any, **fields: Any) -> ModelRequest:
    return ModelRequest(model=model, messages=list(messages) or [HumanMessage("hi")], **fields)


async def test_generate_text_reply(server: FakeServer, model: OpenAIModel) -> None:
    server.reply(openai_completion("Hello there!", usage=(12, 3), completion_id="chatcmpl-abc"))

    reply = await model.generate(
        make_request(
            model,
            SystemMessage("Answer in English."),
            HumanMessage("hi"),
            system_prompt="Be brief.",
        )
    )

    assert reply.text == "Hello there!"
    assert reply.id == "chatcmpl-abc"
    assert reply.tool_calls == [] and reply.invalid_tool_calls == []
    assert reply.usage_metadata == {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
    assert reply.response_metadata == {"model_name": MODEL, "finish_reason": "stop"}
    sent = server.requests[-1]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer test-key"
    assert sent.body == {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "system", "content": "Answer in English."},
            {"role": "user", "content": "hi"},
        ],
    }


async def test_settings_pass_through_over_constructor_defaults(server: FakeServer) -> None:
    model = OpenAIModel(
        MODEL,
        base_url=f"{server.url}/v1",
        api_key="k",
        temperature=0.5,
        max_tokens=100,
        seed=7,
        default_headers={"X-Team": "core"},
    )
    server.reply(openai_completion("ok"))
    settings = {
        "temperature": 0.1,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "stop": ["END"],
        "response_format": {"type": "json_object"},
        "top_k": 40,
    }

    await model.generate(make_request(model, tools=[add], settings=settings))
    await model.client.close()

    sent = server.requests[-1]
    assert sent.headers["x-team"] == "core"  # a client option among the extra keywords
    body = sent.body
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.1, 100, 7)
    assert body["tool_choice"] == "required" and body["parallel_tool_calls"] is False
    assert body["stop"] == ["END"] and body["response_format"] == {"type": "json_object"}
    assert body["top_k"] == 40  # unknown to the SDK, sent through extra_body


async def test_tool_only_settings_are_dropped_without_tools(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.reply(openai_completion("ok"))

    await model.generate(
        make_request(model, settings={"tool_choice": "auto", "parallel_tool_calls": True})
    )

    assert "tool_choice" not in server.last_body and "parallel_tool_calls" not in server.last_body
    assert "tools" not in server.last_body


async def test_generate_two_parallel_tool_calls(server: FakeServer, model: OpenAIModel) -> None:
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

    reply = await model.generate(make_request(model, tools=[add, search]))

    assert reply.text == ""
    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "call_1"),
        tool_call("search", {"query": "weather"}, "call_2"),
    ]
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    assert server.last_body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two integers.",
                "parameters": {
                    "type": "object",
                    "required": ["a", "b"],
                    "properties": {
                        "a": {"type": "integer", "description": "The first addend."},
                        "b": {"type": "integer", "description": "The second addend."},
                    },
                },
            },
        },
        {"type": "function", "function": search.schema()},
    ]


async def test_history_is_sent_in_openai_form(server: FakeServer, model: OpenAIModel) -> None:
    server.reply(openai_completion("done"))
    history = [
        HumanMessage(
            ["Look at this:", {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}],
            name="ann",
        ),
        AIMessage(
            "Checking.",
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
        ToolMessage("3", tool_call_id="call_1", name="add"),
        ToolMessage(
            [{"type": "text", "text": "invalid arguments"}], tool_call_id="call_2", status="error"
        ),
        AIMessage("", tool_calls=[tool_call("search", {"query": "x"}, "call_3")]),
        ToolMessage("found", tool_call_id="call_3"),
    ]

    await model.generate(make_request(model, *history, tools=[add, search]))

    assert server.last_body["messages"] == [
        {
            "role": "user",
            "name": "ann",
            "content": [
                {"type": "text", "text": "Look at this:"},
                {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
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
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "invalid arguments"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_3",
                    "type": "function",
                    "function": {"name": "search", "arguments": '{"query": "x"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_3", "content": "found"},
    ]


async def test_malformed_tool_arguments_become_invalid_tool_calls(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.reply(
        openai_completion(
            None,
            [
                openai_tool_call("call_ok", "add", '{"a": 1, "b": 2}'),
                openai_tool_call("call_bad", "add", '{"a": 1, "b": '),
                openai_tool_call("call_list", "search", '["weather"]'),
            ],
            finish_reason="tool_calls",
        )
    )

    reply = await model.generate(make_request(model, tools=[add, search]))

    assert reply.tool_calls == [tool_call("add", {"a": 1, "b": 2}, "call_ok")]
    bad, listed = reply.invalid_tool_calls
    assert (bad["id"], bad["name"], bad["args"], bad["type"]) == (
        "call_bad",
        "add",
        '{"a": 1, "b": ',
        "invalid_tool_call",
    )
    assert bad["error"].startswith("the arguments are not valid JSON")
    assert listed["args"] == '["weather"]'
    assert listed["error"] == "the arguments must be a JSON object, got list"


async def test_stream_text_deltas_arrive_in_order_as_sent(
    server: FakeServer, model: OpenAIModel
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
    async for delta in model.stream(make_request(model, settings={"temperature": 0})):
        deltas.append(delta)
        pause.release()  # the rest is only sent once the first piece has reached us

    assert not pause.timed_out, "the first delta was held back until the stream ended"
    assert deltas == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" world"),
        FinishDelta(
            {"input_tokens": 9, "output_tokens": 3, "total_tokens": 12},
            "stop",
            {"model_name": MODEL},
            "chatcmpl-stream",
        ),
    ]
    body = server.last_body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0


async def test_stream_tool_call_fragments_are_passed_on_and_reassemble(
    server: FakeServer, model: OpenAIModel
) -> None:
    server.reply(
        openai_stream(
            openai_chunk({"role": "assistant", "content": None}),
            openai_tool_call_chunk(0, "", "call_1", "add"),
            openai_tool_call_chunk(0, '{"a": 1'),
            openai_tool_call_chunk(0, ', "b": 2}'),
            openai_tool_call_chunk(1, "", "call_2", "search"),
            openai_tool_call_chunk(1, '{"query"'),
            openai_tool_call_chunk(1, ': "weather"}'),
            openai_chunk({}, finish_reason="tool_calls"),
            openai_usage_chunk(20, 11),
        )
    )

    deltas = [d async for d in model.stream(make_request(model, tools=[add, search]))]

    assert deltas[:6] == [
        ToolCallDelta(0, "call_1", "add", ""),
        ToolCallDelta(0, None, None, '{"a": 1'),
        ToolCallDelta(0, None, None, ', "b": 2}'),
        ToolCallDelta(1, "call_2", "search", ""),
        ToolCallDelta(1, None, None, '{"query"'),
        ToolCallDelta(1, None, None, ': "weather"}'),
    ]
    reply = await accumulate(_replay(deltas))
    assert reply.tool_calls == [
        tool_call("add", {"a": 1, "b": 2}, "call_1"),
        tool_call("search", {"query": "weather"}, "call_2"),
    ]
    assert reply.usage_metadata == {"input_tokens": 20, "output_tokens": 11, "total_tokens": 31}
    assert reply.response_metadata == {"model_name": MODEL, "finish_reason": "tool_calls"}
    assert reply.id == "chatcmpl-stream"


async def test_stream_malformed_tool_arguments_become_invalid_tool_calls(
    server: FakeServer, model: OpenAIModel
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


@pytest.mark.parametrize("streamed", [False, True], ids=["generate", "stream"])
async def test_a_provider_http_error_is_a_typed_model_error(
    server: FakeServer, model: OpenAIModel, streamed: bool
) -> None:
    server.reply(openai_error("Invalid value for 'temperature'.", 400))

    with pytest.raises(ModelRequestError, match="Invalid value for 'temperature'") as caught:
        if streamed:
            await accumulate(model.stream(make_request(model)))
        else:
            await model.generate(make_request(model))

    error = caught.value
    assert (error.status, error.provider, error.retryable) == (400, "openai", False)
    assert isinstance(error.__cause__, openai.BadRequestError)  # the SDK's error stays reachable


@pytest.mark.parametrize(
    ("status", "kind", "expected", "retryable"),
    [
        (401, "invalid_request_error", ModelAuthenticationError, False),
        (404, "invalid_request_error", ModelRequestError, False),
        (429, "rate_limit_error", ModelRateLimitError, True),
        (500, "server_error", ModelServerError, True),
        (503, "server_error", ModelServerError, True),
    ],
)
async def test_each_status_maps_to_its_error_type(
    server: FakeServer, model: OpenAIModel, status: int, kind: str, expected: type, retryable: bool
) -> None:
    server.reply(openai_error("it went wrong", status, kind))

    with pytest.raises(expected) as caught:
        await model.generate(make_request(model))

    assert (caught.value.status, caught.value.retryable) == (status, retryable)
    assert isinstance(caught.value, ModelError) and "it went wrong" in str(caught.value)
    assert len(server.requests) == 1  # max_retries=0: the adapter itself does not retry


async def test_a_rejected_key_names_the_variable_to_check(server: FakeServer, model: OpenAIModel) -> None:
    server.reply(openai_error("Incorrect API key provided: sk-bad.", 401))

    with pytest.raises(ModelAuthenticationError, match="OPENAI_API_KEY"):
        await model.generate(make_request(model))


async def test_an_unreachable_server_is_a_retryable_connection_error() -> None:
    model = OpenAIModel(MODEL, base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0, timeout=5)

    with pytest.raises(ModelConnectionError) as caught:
        await model.generate(make_request(model))

    assert caught.value.retryable and caught.value.status is None and caught.value.provider == "openai"


def test_a_missing_key_names_the_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(MissingAPIKeyError, match="OPENAI_API_KEY is not set") as caught:
        init_model("openai:gpt-4o-mini")

    assert caught.value.env_var == "OPENAI_API_KEY" and caught.value.provider == "openai"
    assert "api_key" not in str(caught.value).split("OPENAI_API_KEY is not set")[0]  # no SDK internals first
    assert isinstance(init_model("ollama:llama3.1"), OpenAIModel)  # local servers need no key


async def test_init_model_builds_an_openai_adapter(server: FakeServer) -> None:
    model = init_model(f"openai:{MODEL}", base_url=f"{server.url}/v1", api_key="k", temperature=0.3)
    server.reply(openai_completion("hi"))

    reply = await model.generate(make_request(model))
    await model.client.close()

    assert isinstance(model, OpenAIModel) and model.name == MODEL
    assert reply.text == "hi"
    assert (server.last_body["model"], server.last_body["temperature"]) == (MODEL, 0.3)


def test_init_model_local_providers_point_at_their_servers() -> None:
    ollama = init_model("ollama:llama3.2")
    vllm = init_model("vllm:qwen")

    assert (
        isinstance(ollama, OpenAIModel)
        and str(ollama.client.base_url) == "http://localhost:11434/v1/"
    )
    assert (
        isinstance(vllm, OpenAIModel) and str(vllm.client.base_url) == "http://localhost:8000/v1/"
    )


async def test_azure_uses_endpoint_and_api_version_from_the_environment(
    server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.url)
    monkeypatch.setenv("OPENAI_API_VERSION", "2024-10-21")
    model = init_model("azure:my-deployment", api_key="azure-key")
    server.reply(openai_completion("from azure"))

    reply = await model.generate(make_request(model))
    await model.client.close()

    assert isinstance(model.client, openai.AsyncAzureOpenAI)
    assert reply.text == "from azure"
    sent = server.requests[-1]
    assert sent.path == "/openai/deployments/my-deployment/chat/completions?api-version=2024-10-21"
    assert sent.headers["api-key"] == "azure-key"


async def _replay(deltas: list[Any]) -> AsyncIterator[Any]:
    for delta in deltas:
        yield delta
