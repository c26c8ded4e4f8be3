"""Structured output: the run's answer as an object of a given schema, in the state's ``structured_response``.

As LangChain's ``create_agent(response_format=...)`` does with its tool
strategy: the model gets one more tool, named after the schema (a pydantic
model, or a JSON schema with a ``title``), and must call a tool on every
turn; calling that one with valid arguments ends the run with them in
``structured_response`` (a model instance for a pydantic schema, a dict for a
JSON schema). Invalid arguments come back to the model as an error to fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backchannel.messages import AIMessage
from backchannel.middleware import Middleware, ModelHandler
from backchannel.models.base import ModelRequest
from backchannel.tools import Tool, ToolResult

__all__ = ["StructuredOutput"]

_KEY = "structured_response"


class StructuredOutput(Middleware):
    """Make the run end with an answer of ``schema`` in ``structured_response``."""

    def __init__(self, schema: type | Mapping[str, Any], *, tool_message_content: str | None = None) -> None:
        if isinstance(schema, Mapping):
            self.name_of_tool = str(schema.get("title") or "StructuredResponse")
            description = str(schema.get("description") or f"Answer with a {self.name_of_tool}.")
            args_schema: Any = {"type": "object", **{k: v for k, v in schema.items() if k not in ("title",)}}
            make: Any = dict
        elif isinstance(schema, type) and hasattr(schema, "model_validate"):
            self.name_of_tool = schema.__name__
            description = (schema.__doc__ or "").strip() or f"Answer with a {schema.__name__}."
            args_schema = schema
            make = schema
        else:
            raise TypeError(f"response_format must be a pydantic model class or a JSON schema dict, got {schema!r}")
        self.schema = schema
        self.content = tool_message_content

        def respond(**fields: Any) -> ToolResult:
            value = make(**fields)
            text = self.content or f"Returning structured response: {value!r}"
            return ToolResult(text, update={_KEY: value}, return_direct=True)

        self.tools = [Tool(respond, name=self.name_of_tool, args_schema=args_schema, inline=True,
                           description=f"{description}\n\nCall this tool to give your final answer.")]
        self.system_prompt = (f"When you have the answer, give it by calling the `{self.name_of_tool}` tool; "
                              "that ends your turn.")

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """The model must call a tool: the answer comes through the schema's tool."""
        return await handler(request.override(settings={**request.settings, "tool_choice": "required"}))
