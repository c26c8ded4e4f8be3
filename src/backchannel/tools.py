"""Tools: plain Python functions the model can call.

``@tool`` turns a sync or async function into a :class:`Tool`. Its JSON schema
comes from the type hints and the docstring (Google ``Args:`` or Sphinx
``:param x:`` style), and the model's arguments are validated against it
before the function runs. The schema and validator are built on first use, so
decorating is cheap and ``import backchannel`` does not import pydantic.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import typing
import warnings
from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, overload

from backchannel._threads import run_in_thread
from backchannel.errors import ToolArgumentsError, ToolDefinitionError, ToolError
from backchannel.protocols import StoreAPI

if TYPE_CHECKING:
    from backchannel.context import RunContext

__all__ = ["Tool", "ToolArgumentsError", "ToolDefinitionError", "ToolDefinitionWarning", "ToolError", "ToolResult",
           "ToolRuntime", "tool"]


@dataclass(slots=True)
class ToolRuntime:
    """What a tool sees of the run it is called from; declare a parameter of this type to get it."""

    thread_id: str | None
    run_id: str | None
    agent_name: str
    tool_call_id: str
    state: Mapping[str, Any]
    context: Any = None
    store: StoreAPI | None = None
    emit: Callable[[Any], None] = field(default=lambda data: None)
    ctx: RunContext | None = None  # the whole RunContext, for framework tools that start runs of their own


@dataclass(slots=True)
class ToolResult:
    """A tool's return value when it needs more than content.

    ``update`` is merged into the agent's state (``messages`` are appended
    after the tool message); ``return_direct`` ends the run with this result.
    """

    content: Any = ""
    update: dict[str, Any] | None = None
    return_direct: bool | None = None
    artifact: Any = None


class ToolDefinitionWarning(UserWarning):
    """A tool works, but models will use it poorly (no description, an argument without a type)."""


# What OpenAI and Anthropic accept as a tool (function) name.
_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_SPHINX_PARAM = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+):\s*(.*)$")
_GOOGLE_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-parameter descriptions."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        sphinx = _SPHINX_PARAM.match(line)
        heading = _GOOGLE_SECTION.match(line)
        if sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif heading:
            section, current = heading.group(1).lower(), None
        elif section in ("args", "arguments", "parameters"):
            entry = re.match(r"^\s{0,8}(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if entry and not line.startswith(" " * 8):
                current = entry.group(1).lstrip("*")
                params[current] = entry.group(2).strip()
            elif current and line.strip():
                params[current] = f"{params[current]} {line.strip()}".strip()
        elif section is None:
            description.append(line)
        elif section == "sphinx" and current and line.strip() and not line.lstrip().startswith(":"):
            params[current] = f"{params[current]} {line.strip()}"
    return "\n".join(description).strip(), params


_ValidationError: Any = None  # pydantic's, once a tool's model is built (pydantic loads on first use)


class Tool:
    """A callable the model can use: a name, a description, a JSON schema and a function.

    A sync function runs in a worker thread, or on the event loop with ``inline=True`` (see :func:`tool`).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        return_direct: bool = False,
        args_schema: type | dict[str, Any] | None = None,
        inline: bool = False,
    ) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.return_direct = return_direct
        self.is_async = inspect.iscoroutinefunction(fn)
        self.inline = inline
        self._description = description
        self._args_schema = args_schema
        self._check_definition()

    def __repr__(self) -> str:
        return f"Tool(name={self.name!r})"

    @cached_property
    def _docs(self) -> tuple[str, dict[str, str]]:
        return parse_docstring(self.fn.__doc__)

    @cached_property
    def description(self) -> str:
        return self._description or self._docs[0] or self.name

    @cached_property
    def _signature(self) -> tuple[list[inspect.Parameter], dict[str, Any], str | None]:
        """The parameters the model fills, their type hints, and the runtime parameter's name."""
        hints = typing.get_type_hints(self.fn, include_extras=True)
        params: list[inspect.Parameter] = []
        runtime_param = None
        for p in inspect.signature(self.fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if hints.get(p.name) is ToolRuntime:
                runtime_param = p.name
            else:
                params.append(p)
        return params, hints, runtime_param

    def _check_definition(self) -> None:
        """Refuse what no model can call; warn about what models will call badly. Each message says the fix."""
        if not _TOOL_NAME.match(self.name):
            raise ToolDefinitionError(
                f"{self.name!r} is not a valid tool name: models accept 1-64 letters, digits, '_' or '-'; "
                "pass name='...' (e.g. @tool(name='lookup'))")
        if self._description is None and not self._docs[0]:
            _warn(f"tool {self.name!r} has no docstring, so the model only sees its name: add one saying what "
                  "it does (and an Args: section for its parameters), or pass description='...'")
        if self._args_schema is not None:
            return
        params = [p for p in inspect.signature(self.fn).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        names = [p.name for p in params]
        unknown = [name for name in self._docs[1] if name not in names]
        if unknown:
            raise ToolDefinitionError(
                f"the docstring of tool {self.name!r} describes {unknown[0]!r}, but the function has no such "
                f"parameter (parameters: {', '.join(names) or 'none'}); fix the name in its Args: section")
        for p in params:
            if p.annotation is inspect.Parameter.empty:
                _warn(f"parameter {p.name!r} of tool {self.name!r} has no type hint, so the model may pass any "
                      f"JSON (often a string): annotate it, e.g. `{p.name}: int` or `{p.name}: str`")

    @property
    def runtime_param(self) -> str | None:
        return self._signature[2]

    @cached_property
    def _model(self) -> Any:
        """A pydantic model of the arguments (or ``None`` when a JSON schema was given)."""
        global _ValidationError
        from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

        _ValidationError = ValidationError

        if isinstance(self._args_schema, type) and issubclass(self._args_schema, BaseModel):
            return self._args_schema
        if isinstance(self._args_schema, dict):
            return None
        params, hints, _ = self._signature
        docs = self._docs[1]
        fields: dict[str, Any] = {}
        for p in params:
            annotation = hints.get(p.name, Any)
            default = ... if p.default is inspect.Parameter.empty else p.default
            fields[p.name] = (annotation, Field(default, description=docs.get(p.name)))
        config = ConfigDict(arbitrary_types_allowed=True)
        return create_model(f"{self.name}_args", __config__=config, **fields)

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """The JSON schema of the arguments, as sent to the model."""
        if isinstance(self._args_schema, dict):
            return self._args_schema
        schema = self._model.model_json_schema()
        _drop_titles(schema)
        schema.setdefault("properties", {})
        return schema

    def schema(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}``: the tool as models see it."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def validate(self, args: Any) -> dict[str, Any]:
        """The arguments to call the function with, or :class:`ToolArgumentsError` saying what is wrong."""
        if not isinstance(args, dict):
            raise ToolArgumentsError(f"arguments must be a JSON object, got {type(args).__name__}")
        model = self._model
        if model is None:
            missing = [k for k in self.parameters.get("required", []) if k not in args]
            if missing:
                raise ToolArgumentsError("missing required argument(s): " + ", ".join(missing))
            return dict(args)  # a copy: the caller adds the runtime to it, and these are the model's args
        try:
            validated = model.model_validate(args)
        except _ValidationError as exc:
            raise ToolArgumentsError(_describe_validation_error(exc)) from None
        return dict(validated.__dict__)

    async def ainvoke(self, args: dict[str, Any], runtime: ToolRuntime | None = None) -> Any:
        """Validate ``args`` and run the function (a sync one in a worker thread, unless ``inline``)."""
        return await self.start(args, runtime)

    def start(self, args: dict[str, Any], runtime: ToolRuntime | None = None) -> Awaitable[Any]:
        """Validate ``args`` and start the function: what it returns, to await (an async function's own
        coroutine, with no frame of this method around it while it runs; an ``inline`` sync one has run)."""
        kwargs = self.validate(args)
        if self.runtime_param is not None:
            kwargs[self.runtime_param] = runtime
        if self.is_async:
            return self.fn(**kwargs)
        if self.inline:
            return _Ready(self.fn(**kwargs))
        return run_in_thread(self.fn, kwargs)


class _Ready:
    """An inline sync tool's result, awaitable like an async one's."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __await__(self) -> Generator[Any, None, Any]:
        return self.value
        yield  # a generator that returns at once


def _warn(message: str) -> None:
    """A :class:`ToolDefinitionWarning` pointing at the code that defined the tool, not at this module."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1  # type: ignore[assignment]
    warnings.warn(message, ToolDefinitionWarning, stacklevel=level)


def _drop_titles(schema: Any) -> None:
    # pydantic adds "title" everywhere; providers don't need it and it costs tokens.
    if isinstance(schema, dict):
        schema.pop("title", None)
        for key, value in schema.items():
            if key == "properties" and isinstance(value, dict):
                for prop in value.values():
                    _drop_titles(prop)
            elif key != "properties":
                _drop_titles(value)
    elif isinstance(schema, list):
        for item in schema:
            _drop_titles(item)


def _describe_validation_error(exc: Any) -> str:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        got = "" if err["type"] == "missing" else f" (got {json.dumps(err.get('input'), default=str)[:80]})"
        problems.append(f"'{where}': {err['msg']}{got}")
    return "; ".join(problems)


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
    args_schema: type | dict[str, Any] | None = None,
    inline: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...
def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    return_direct: bool = False,
    args_schema: type | dict[str, Any] | None = None,
    inline: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a :class:`Tool` from a function: ``@tool`` or ``@tool(name=..., return_direct=True)``.

    An ``async def`` function runs on the event loop. A plain ``def`` function
    runs in a worker thread, so a slow or blocking one (a network call, a file,
    a subprocess) never stalls the other runs and subagents sharing the loop;
    the hop to the thread and back costs 30-150 µs. ``inline=True`` runs
    a sync function on the event loop instead, for one that returns at once
    (pure computation, no I/O, no sleeping): it then costs about as much as an
    async tool. An inline function that blocks, blocks every run in the process.
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        return Tool(f, name=name, description=description, return_direct=return_direct, args_schema=args_schema,
                    inline=inline)

    return wrap(fn) if fn is not None else wrap


def as_tool(obj: Any) -> Tool:
    """A :class:`Tool` from a Tool or a plain function."""
    if isinstance(obj, Tool):
        return obj
    if callable(obj):
        return Tool(obj)
    raise TypeError(f"not a tool: {obj!r} (use @tool on a function, or pass a Tool)")
