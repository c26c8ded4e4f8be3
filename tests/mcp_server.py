"""A real MCP server for the tests, built with the official ``mcp`` package.

``python tests/mcp_server.py stdio`` serves it over stdin/stdout;
``python tests/mcp_server.py http PORT`` over streamable HTTP on 127.0.0.1:PORT (path ``/mcp``).
"""

import asyncio
import os
import signal
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("backchannel-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def fail(reason: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(reason)


@server.tool()
def server_pid() -> int:
    """The process id of this server."""
    return os.getpid()


@server.tool()
async def slow(seconds: float) -> str:
    """Answers after a while."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


@server.tool()
async def crash() -> str:
    """Kills this server in the middle of the call."""
    await asyncio.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


if __name__ == "__main__":
    if sys.argv[1] == "stdio":
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
