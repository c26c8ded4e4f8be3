"""MCP tools: the tools of Model Context Protocol servers, offered to an agent like any other.

Servers are given as langchain-mcp-adapters' ``MultiServerMCPClient`` takes them::

    client = MCPClient({
        "files": {"transport": "stdio", "command": "python", "args": ["server.py"]},
        "search": {"transport": "streamable_http", "url": "http://127.0.0.1:8000/mcp",
                   "headers": {"Authorization": "Bearer ..."}},
    })
    agent = create_agent(model, await client.get_tools())          # or
    agent = create_deep_agent(model, mcp_servers={...})             # tools listed at the first model call

A tool's schema is the server's; a result the server marks as an error, a
server that fails, times out or dies mid-call become error results the model
reads, and the next call connects again. Cancelling the run cancels the call.
A connection is opened at the first call and reused by later calls and runs;
one opened by a run on a runtime (``LocalRuntime``) closes with that runtime,
the others with the event loop or :meth:`MCPClient.aclose`. It needs the
official ``mcp`` SDK: ``pip install "backchannel[mcp]"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

try:
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError('MCP tools need the mcp package: pip install "backchannel[mcp]"') from exc

from backchannel.messages import AIMessage, ToolMessage
from backchannel.middleware import Middleware, ModelHandler, ToolCallRequest, ToolHandler
from backchannel.models.base import ModelRequest
from backchannel.tools import Tool, ToolError, ToolResult, ToolRuntime

__all__ = ["MCPClient", "MCPMiddleware"]

logger = logging.getLogger("backchannel.mcp")

_TRANSPORTS = {"stdio": "stdio", "streamable_http": "http", "streamable-http": "http", "http": "http"}
_RUNTIME_PARAM = "_mcp_runtime"  # the tool function's runtime parameter: a name no server's argument has


class MCPClient:
    """Connections to MCP servers, by name; their tools as backchannel :class:`~backchannel.tools.Tool` s.

    ``connections`` maps a server's name to ``{"transport": "stdio", "command",
    "args", "env", "cwd"}`` or ``{"transport": "streamable_http", "url",
    "headers"}``. ``connect_timeout`` bounds starting a server, ``call_timeout``
    each call (seconds; ``None``: no bound).
    """

    def __init__(self, connections: Mapping[str, Mapping[str, Any]], *, connect_timeout: float = 30.0,
                 call_timeout: float | None = 300.0) -> None:
        self.connections = {name: _checked(name, dict(spec)) for name, spec in connections.items()}
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self._sessions: dict[tuple[str, Any, Any], _Session] = {}
        self._tools: dict[str, list[Tool]] = {}

    def __repr__(self) -> str:
        return f"MCPClient({sorted(self.connections)})"

    async def get_tools(self, *, server_name: str | None = None, runtime: Any = None) -> list[Tool]:
        """The tools of every server (or of ``server_name``), listed once and kept."""
        names = [server_name] if server_name is not None else list(self.connections)
        tools: list[Tool] = []
        for name in names:
            if name not in self._tools:
                session = await self._session(name, runtime)
                listed = await self._request(name, runtime, session.list_tools())
                self._tools[name] = [self._tool(name, t) for t in listed.tools]
            tools.extend(self._tools[name])
        return tools

    def listed_tool(self, name: str) -> Tool | None:
        """The tool called ``name`` among those listed so far (``None`` if there is none)."""
        for tools in self._tools.values():
            for tool in tools:
                if tool.name == name:
                    return tool
        return None

    async def call_tool(self, server_name: str, tool_name: str, arguments: Mapping[str, Any],
                        runtime: Any = None) -> Any:
        """Call one tool; an error result or a failing server raises :class:`~backchannel.tools.ToolError`."""
        session = await self._session(server_name, runtime)
        result = await self._request(server_name, runtime,
                                     session.call_tool(tool_name, dict(arguments),
                                                       read_timeout_seconds=self.call_timeout))
        text = _result_text(result)
        if result.is_error:
            raise ToolError(text or f"the tool {tool_name!r} of MCP server {server_name!r} failed")
        return text

    async def aclose(self) -> None:
        """Close every connection."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    async def __aenter__(self) -> MCPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- connections -------------------------------------------------------------

    async def _session(self, name: str, runtime: Any) -> ClientSession:
        """The open session with ``name`` for ``runtime`` (this event loop's when there is none)."""
        if name not in self.connections:
            raise ToolError(f"no MCP server named {name!r}; known: {', '.join(self.connections)}")
        key = (name, runtime, asyncio.get_running_loop())
        connection = self._sessions.get(key)
        if connection is None or connection.closed:
            connection = self._sessions[key] = _Session(name, self.connections[name])
            connection.start(runtime, done=lambda: self._forget(key, connection))
        try:
            return await asyncio.wait_for(connection.opened(), self.connect_timeout)
        except TimeoutError:
            await connection.close()
            raise ToolError(f"MCP server {name!r} did not start within {self.connect_timeout} s") from None

    def _forget(self, key: tuple[str, Any, Any], connection: _Session) -> None:
        if self._sessions.get(key) is connection:
            del self._sessions[key]

    async def _request(self, name: str, runtime: Any, request: Any) -> Any:
        """Await a request to ``name``; a failure closes the connection (the next call opens a new one)."""
        try:
            return await request
        except (ToolError, asyncio.CancelledError):
            raise
        except Exception as exc:
            key = (name, runtime, asyncio.get_running_loop())
            connection = self._sessions.pop(key, None)
            if connection is not None:
                await connection.close()
            raise ToolError(f"MCP server {name!r} failed: {_describe(exc)}") from exc

    def _tool(self, server_name: str, spec: Any) -> Tool:
        async def call(**arguments: Any) -> Any:
            runtime: ToolRuntime | None = arguments.pop(_RUNTIME_PARAM, None)
            ctx = runtime.ctx if runtime is not None else None
            return await self.call_tool(server_name, spec.name, arguments,
                                        runtime=getattr(ctx, "runtime", None))

        call.__annotations__ = {_RUNTIME_PARAM: ToolRuntime}
        call.__signature__ = _signature_with_runtime()  # type: ignore[attr-defined]
        tool = Tool(call, name=spec.name, description=spec.description or spec.name,
                    args_schema=dict(spec.input_schema or {"type": "object", "properties": {}}))
        tool.mcp_server = server_name  # type: ignore[attr-defined]
        return tool


class _Session:
    """One connection: a task that opens the transport and session, and holds them until closed.

    The SDK's transports are scoped to the task that opens them, so one task owns
    each connection; calls from any task use its session. Started on a runtime, the
    task is the runtime's, cancelled (and the server closed) when the runtime closes.
    """

    def __init__(self, name: str, spec: Mapping[str, Any]) -> None:
        self.name = name
        self.spec = spec
        self.session: ClientSession | None = None
        self.error: BaseException | None = None
        self.closed = False
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, runtime: Any, *, done: Any) -> None:
        spawn = getattr(runtime, "spawn", None)
        self._task = spawn(self._serve()) if spawn is not None else asyncio.create_task(self._serve())
        self._task.add_done_callback(lambda _: done())

    async def opened(self) -> ClientSession:
        await self._ready.wait()
        if self.session is None:
            error = self.error
            raise ToolError(f"could not connect to MCP server {self.name!r}: "
                            f"{_describe(error) if error else 'it closed'}")
        return self.session

    async def _serve(self) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(_transport(self.spec))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.session = session
                self._ready.set()
                await self._stop.wait()
        except Exception as exc:
            self.error = exc
            logger.warning("MCP server %r: %s", self.name, _describe(exc))
        finally:
            self.session = None
            self.closed = True
            self._ready.set()

    async def close(self) -> None:
        self.closed = True
        self._stop.set()
        if self._task is not None and self._task.get_loop() is asyncio.get_running_loop():
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self._task), 5.0)
            if not self._task.done():
                self._task.cancel()


class MCPMiddleware(Middleware):
    """Offer the tools of an :class:`MCPClient`'s servers, listed at the first model call.

    A server that cannot be reached is left out (and tried again at the next
    model call) rather than failing the run.
    """

    def __init__(self, client: MCPClient, *, retry_after: float = 30.0) -> None:
        self.client = client
        self.retry_after = retry_after
        self._down_until: dict[str, float] = {}  # servers that failed, and when to try them again

    def __repr__(self) -> str:
        return f"MCPMiddleware({self.client!r})"

    async def _tools(self, runtime: Any) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        now = asyncio.get_running_loop().time()
        for name in self.client.connections:
            if self._down_until.get(name, 0.0) > now:
                continue
            try:
                listed = await self.client.get_tools(server_name=name, runtime=runtime)
            except ToolError as exc:
                logger.warning("leaving out the tools of MCP server %r for %s s: %s", name, self.retry_after, exc)
                self._down_until[name] = now + self.retry_after
                continue
            tools.update((t.name, t) for t in listed)
        return tools

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """Every model call: the servers' tools beside the agent's own."""
        tools = await self._tools(getattr(request.ctx, "runtime", None))
        own = {t.name for t in request.tools}
        extra = [t for name, t in tools.items() if name not in own]
        return await handler(request.override(tools=[*request.tools, *extra]) if extra else request)

    async def wrap_tool_call(self, request: ToolCallRequest, handler: ToolHandler) -> ToolMessage | ToolResult:
        """A call of a server's tool goes to the server."""
        found = self.client.listed_tool(request.call["name"]) if request.tool is None else None
        return await handler(request.override(tool=found) if found is not None else request)


@contextlib.asynccontextmanager
async def _transport(spec: Mapping[str, Any]) -> Any:
    """The read and write streams of a server's transport."""
    if _TRANSPORTS[spec["transport"]] == "stdio":
        params = StdioServerParameters(command=spec["command"], args=list(spec.get("args") or ()),
                                       env=spec.get("env"), cwd=spec.get("cwd"))
        async with stdio_client(params) as streams:
            yield streams[0], streams[1]
        return
    http_client = None
    if spec.get("headers"):
        import httpx2

        http_client = httpx2.AsyncClient(headers=dict(spec["headers"]),
                                         timeout=httpx2.Timeout(30.0, read=300.0))
    async with contextlib.AsyncExitStack() as stack:
        if http_client is not None:
            await stack.enter_async_context(http_client)
        streams = await stack.enter_async_context(streamable_http_client(spec["url"], http_client=http_client))
        yield streams[0], streams[1]


def _checked(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A connection spec, or a ``ValueError`` naming the server and what is missing."""
    transport = spec.setdefault("transport", "stdio" if "command" in spec else "streamable_http")
    if transport not in _TRANSPORTS:
        raise ValueError(f"MCP server {name!r}: unknown transport {transport!r}; use 'stdio' or 'streamable_http'")
    needed = "command" if _TRANSPORTS[transport] == "stdio" else "url"
    if not spec.get(needed):
        raise ValueError(f"MCP server {name!r}: a {transport} server needs {needed!r}")
    return spec


def _signature_with_runtime() -> Any:
    import inspect

    return inspect.Signature([
        inspect.Parameter(_RUNTIME_PARAM, inspect.Parameter.KEYWORD_ONLY, annotation=ToolRuntime),
        inspect.Parameter("arguments", inspect.Parameter.VAR_KEYWORD)])


def _result_text(result: Any) -> str:
    """A call result's content as text: text blocks as they are, the rest described."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and getattr(block.resource, "text", None) is not None:
            parts.append(block.resource.text)
        else:
            mime = getattr(block, "mime_type", None) or getattr(block, "mimeType", None) or "?"
            parts.append(f"[{kind or 'content'} ({mime}) not shown]")
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False, default=str))
    return "\n".join(parts)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

