"""The chat's configuration file (``~/.backchannel/config.toml``) and the agent it describes.

Every key is optional::

    agent = "agent"                    # the assistant's name; its memory is ~/.backchannel/agents/<agent>/agent.md
    model = "openai:gpt-4o-mini"       # provider:name, or module:attribute for a model object
    system_prompt = "You are ..."
    tools = ["mypackage.tools:search"] # module:attribute, a tool (function) or a list of them
    approve_tools = ["send_email"]     # tools that wait for your approval (approve, edit or reject)
    completion = "notify"              # or "wait": stay in the run until background tasks report
    database = "sqlite:///~/.backchannel/state.db"   # or postgresql://... (``store`` is an older name for it)
    summarize_after = 170000           # tokens before older messages are summarised
    workspace = "~/notes"              # the file tools work in this directory (default: in the thread's state)
    shell = false                      # with workspace: `execute` runs commands there, each approved by you
    memory = ["/AGENTS.md"]            # memory files in the workspace, in the prompt of every model call
    skills = ["/skills/"]              # skill directories in the workspace
    todos = true                       # the agent plans with write_todos; the plan shows in the panel

    [[subagents]]
    name = "researcher"
    description = "Researches one subject"
    system_prompt = "..."
    model = "anthropic:claude-3-5-haiku-latest"   # default: the agent's
    tools = ["mypackage.tools:search"]            # default: the agent's
    background = true                  # run with start_async_task, report back when done
    timeout = 300
    url = "http://host:8123"           # a subagent served elsewhere, with graph_id

    [[mcp_servers]]                    # MCP servers whose tools the agent gets (pip install "backchannel[mcp]")
    name = "files"
    command = "npx"                    # a server run over stdio; or url = "http://host/mcp" (streamable HTTP)
    args = ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]

A bad file is refused with a :class:`ConfigError` naming the file and the key.
Without any model configured, the chat and ``run`` use the offline model
(:mod:`backchannel.models.offline`) with an offline researcher subagent.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from backchannel._imports import import_object
from backchannel.agent import Agent
from backchannel.errors import ConfigError
from backchannel.messages import AIMessage
from backchannel.middleware import Middleware, ModelHandler
from backchannel.models import _PROVIDERS, init_model
from backchannel.models.base import ModelRequest
from backchannel.models.offline import OFFLINE, OFFLINE_LABEL, OfflineModel, search_notes

__all__ = ["ChatConfig", "ConfigError", "MCPServerConfig", "ModelChoice", "SubagentConfig", "build_chat_agent",
           "config_path", "is_offline", "load_config", "load_model", "model_label", "resolve_model"]

_NAME = r"^[A-Za-z0-9_-]+$"


class SubagentConfig(BaseModel):
    """One ``[[subagents]]`` table."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str = Field(pattern=_NAME)
    description: str
    system_prompt: str | None = None
    model: str | None = None
    tools: list[str] | None = None
    background: bool = False
    timeout: float | None = Field(default=None, gt=0)
    url: str | None = None
    graph_id: str | None = None


class MCPServerConfig(BaseModel):
    """One ``[[mcp_servers]]`` table: a stdio server (``command``) or a streamable HTTP one (``url``)."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    name: str = Field(pattern=_NAME)
    command: str | None = None
    args: list[str] = []
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_transport(self) -> MCPServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (a stdio server) or url (a streamable HTTP server)")
        return self

    def connection(self) -> dict[str, Any]:
        """The server as :class:`~backchannel.mcp.MCPClient` takes it."""
        if self.url:
            return {"transport": "streamable_http", "url": self.url, "headers": self.headers}
        return {"transport": "stdio", "command": self.command, "args": self.args, "env": self.env, "cwd": self.cwd}


class ChatConfig(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    agent: str = Field(default="agent", pattern=_NAME)
    model: str | None = None
    system_prompt: str | None = None
    tools: list[str] = []
    approve_tools: list[str] = []
    completion: Literal["notify", "wait"] = "notify"
    database: str | None = Field(default=None, validation_alias=AliasChoices("database", "store"))
    summarize_after: int | None = Field(default=170_000, gt=0)
    subagents: list[SubagentConfig] = []
    workspace: str | None = None
    shell: bool = False
    memory: list[str] = []
    skills: list[str] = []
    todos: bool = False
    mcp_servers: list[MCPServerConfig] = []


def config_path() -> Path:
    """Where the configuration lives: ``~/.backchannel/config.toml``."""
    return Path.home() / ".backchannel" / "config.toml"


def load_config(path: str | os.PathLike[str] | None = None) -> ChatConfig:
    """The configuration in ``path`` (default :func:`config_path`; a missing default file means defaults)."""
    file = Path(path).expanduser() if path is not None else config_path()
    if not file.exists():
        if path is not None:
            raise ConfigError(f"{file}: no such file")
        return ChatConfig()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    try:
        return ChatConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{file}: {_describe(exc)}") from None


def _describe(exc: ValidationError) -> str:
    """The first problem of a validation error, with the key written as in the file (``subagents[0].timeout``)."""
    error = exc.errors()[0]
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"]).lstrip(".")
    if error["type"] == "extra_forbidden":
        owner = SubagentConfig if "subagents" in key else MCPServerConfig if "mcp_servers" in key else ChatConfig
        return f"unknown key {key!r} (known keys: {', '.join(owner.model_fields)})"
    if error["type"] == "string_pattern_mismatch":
        return f"{key}: {error['input']!r} must be a plain name (letters, digits, '-' and '_')"
    return f"{key}: {error['msg']} (got {error['input']!r})"


def resolve_model(flag: str | None, configured: str | None = None) -> str | None:
    """The model to use: the flag, ``BACKCHANNEL_MODEL``, the configured one, or a provider whose API key is set
    (``None``: nothing configured, the commands then use the offline model)."""
    for choice in (flag, os.environ.get("BACKCHANNEL_MODEL"), configured):
        if choice:
            return choice
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-3-5-haiku-latest"
    return None


def load_object(reference: str, what: str) -> Any:
    """The object ``module:attribute`` names; a :class:`ConfigError` saying which setting if it names nothing."""
    try:
        return import_object(reference)
    except ValueError:
        raise ConfigError(f"{what} {reference!r} should be 'module:attribute'") from None
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} {reference!r} cannot be loaded: {exc}") from None


def is_offline(model: Any) -> bool:
    """Whether ``model`` (a setting or a model object) is the offline stand-in."""
    return model == OFFLINE or isinstance(model, OfflineModel)


def model_label(spec: str | None) -> str:
    """How the commands name a model setting to the person: the offline model says so, and when it is used
    because nothing was configured (``spec`` is ``None``), how to configure one."""
    if spec is None:
        return f"{OFFLINE_LABEL} (no model configured: pass --model, or set model in ~/.backchannel/config.toml)"
    return OFFLINE_LABEL if spec == OFFLINE else spec


def load_model(spec: str) -> Any:
    """A model setting: ``"provider:name"`` or ``"offline"`` as it is, or the model object ``module:attribute``
    names (a callable that is not a model is called to make one)."""
    provider = spec.partition(":")[0]
    if provider in _PROVIDERS or spec == OFFLINE:
        return spec
    try:
        found = load_object(spec, "model")
    except ConfigError as exc:
        raise ConfigError(f"model {spec!r}: unknown provider {provider!r} (known: {', '.join(_PROVIDERS)}), "
                          f"and not a model object either ({exc})") from None
    return found() if callable(found) and not hasattr(found, "generate") else found


def _tools(references: Sequence[str]) -> list[Any]:
    tools: list[Any] = []
    for reference in references:
        found = load_object(reference, "tool")
        tools.extend(found if isinstance(found, (list, tuple)) else [found])
    return tools


class ModelChoice(Middleware):
    """Use the model a run names in its context (``context={"model": "provider:name"}``): the chat's ``/model``.

    Only ``provider:name`` models: a run's context comes from whoever starts the
    run (on a server, any client), so it never makes the agent import code.
    """

    def __init__(self) -> None:
        self._models: dict[str, Any] = {}

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """Every model call of a run whose context names a model: that model instead."""
        context = request.ctx.context if request.ctx is not None else None
        name = context.get("model") if isinstance(context, Mapping) else None
        if not name:
            return await handler(request)
        if name not in self._models:
            self._models[name] = init_model(str(name))
        return await handler(request.override(model=self._models[name]))


def build_chat_agent(config: ChatConfig, model: Any, *, home: str | os.PathLike[str] | None = None,
                     completion: Literal["notify", "wait"] | None = None) -> Agent:
    """The agent the configuration describes: a deep agent with its subagents, memory and handoff.

    On the offline model, a configuration without subagents gets an offline ``researcher`` in the
    background, so the chat's background tasks can be tried at once. ``completion`` overrides the
    configuration's (``run`` waits for its tasks).
    """
    from backchannel.deep_agent import create_deep_agent
    from backchannel.handoff import HandoffMiddleware
    from backchannel.memory import AgentMemoryMiddleware, MemoryFile, agent_memory_path
    from backchannel.subagents import SubAgent

    memory = MemoryFile(agent_memory_path(config.agent, home))
    subagents = [SubAgent(s.name, s.description, system_prompt=s.system_prompt,
                          tools=None if s.tools is None else _tools(s.tools),
                          model=load_model(s.model) if s.model else None, background=s.background,
                          timeout=s.timeout, url=s.url, graph_id=s.graph_id) for s in config.subagents]
    if not subagents and is_offline(model):
        subagents = [SubAgent("researcher", "Researches one subject in the offline notes and reports the facts.",
                              tools=[search_notes], model=OfflineModel(latency=1.0), background=True, timeout=120)]
    return create_deep_agent(
        model, _tools(config.tools), subagents=subagents, system_prompt=config.system_prompt, name=config.agent,
        completion=completion or config.completion, max_tokens_before_summary=config.summarize_after,
        middleware=[HandoffMiddleware(model, memory), AgentMemoryMiddleware(memory), ModelChoice()],
        interrupt_on={t: True for t in config.approve_tools}, backend=_backend(config),
        memory=config.memory or None, skills=config.skills or None, todos=config.todos,
        mcp_servers={s.name: s.connection() for s in config.mcp_servers} or None)


def _backend(config: ChatConfig) -> Any:
    """Where the file tools work: the configured directory (with a shell if asked), else the thread's state."""
    from backchannel.workspace import FilesystemBackend, LocalShellBackend

    if config.workspace is None:
        if config.shell:
            raise ConfigError("shell: needs workspace = \"<directory>\" to run commands in")
        return None
    root = Path(config.workspace).expanduser()
    if not root.is_dir():
        raise ConfigError(f"workspace: {str(root)!r} is not a directory")
    return LocalShellBackend(root) if config.shell else FilesystemBackend(root)
