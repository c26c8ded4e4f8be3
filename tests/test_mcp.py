"""MCP tools from a real MCP server (tests/mcp_server.py, built with the ``mcp`` package), over stdio and HTTP."""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from subagent_helpers import call, policy, wait_until

from backchannel import ScriptedModel, ToolMessage, create_agent
from backchannel.deep_agent import create_deep_agent
from backchannel.mcp import MCPClient, MCPMiddleware
from backchannel.runtime import LocalRuntime

SERVER = str(Path(__file__).with_name("mcp_server.py"))
STDIO = {"transport": "stdio", "command": sys.executable, "args": [SERVER, "stdio"]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server():
    """A function that starts the server over streamable HTTP (again, on the same port); stopped at the end."""
    port = free_port()
    processes = []

    def start():
        processes.append(subprocess.Popen([sys.executable, SERVER, "http", str(port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return {"transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp",
                        "headers": {"x-test": "yes"}}
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("the MCP test server did not start")

    yield start
    for p in processes:
        p.kill()
        p.wait()


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def results(state):
    return {m.tool_call_id: m for m in state["messages"] if isinstance(m, ToolMessage)}


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_tools_are_listed_called_and_errors_and_a_dead_server_become_error_results(transport, http_server):
    client = MCPClient({"test": STDIO if transport == "stdio" else http_server()})
    try:
        tools = {t.name: t for t in await client.get_tools()}
        assert set(tools) == {"add", "fail", "server_pid", "slow", "crash"}
        assert tools["add"].description == "Add two numbers."
        assert tools["add"].parameters["required"] == ["a", "b"]
        model = ScriptedModel([
            {"tool_calls": [call("add", {"a": 2, "b": 40}, "add"), call("fail", {"reason": "no such city"}, "fail"),
                            call("add", {"a": "two"}, "bad_args")]},
            {"tool_calls": [call("crash", {}, "crash")]},
            "done"])
        started = time.monotonic()
        state = await create_agent(model, list(tools.values())).ainvoke("use the tools")
        found = results(state)
        assert found["add"].status == "success" and found["add"].text == "42"
        assert found["fail"].status == "error" and "no such city" in found["fail"].text
        assert found["bad_args"].status == "error"
        assert found["crash"].status == "error" and "MCP server 'test' failed" in found["crash"].text
        assert time.monotonic() - started < 10  # the dead server is noticed, not waited for
        if transport == "stdio":  # a new server process is started for the next call
            again = await create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1}, "a")]}, "ok"]),
                                       list(tools.values())).ainvoke("again")
            assert results(again)["a"].text == "2"
    finally:
        await client.aclose()


async def test_an_http_server_that_is_down_is_an_error_result_until_it_is_back(http_server):
    client = MCPClient({"remote": http_server()}, connect_timeout=5)
    tools = {t.name: t for t in await client.get_tools()}
    agent = create_agent(policy(lambda r: "ok" if isinstance(r.messages[-1], ToolMessage) else
                                {"tool_calls": [call("add", {"a": 1, "b": 2}, "a")]}), [tools["add"], tools["crash"]])
    crashed = await create_agent(ScriptedModel([{"tool_calls": [call("crash", {}, "c")]}, "ok"]),
                                 [tools["crash"]]).ainvoke("crash it")
    assert results(crashed)["c"].status == "error"
    down = await agent.ainvoke("add")
    assert results(down)["a"].status == "error" and "remote" in results(down)["a"].text
    http_server()  # back on the same port
    back = await agent.ainvoke("add")
    assert results(back)["a"].text == "3"
    await client.aclose()


async def test_a_connection_is_reused_across_runs_and_closed_with_the_runtime():
    client = MCPClient({"test": STDIO})
    agent = create_agent(ScriptedModel([{"tool_calls": [call("server_pid", {}, "p")]}, "ok"], loop=True),
                         middleware=[MCPMiddleware(client)])
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        pids = []
        for _ in range(3):
            state = await agent.ainvoke("pid?", thread_id=(await rt.threads.create())["thread_id"])
            pids.append(int(results(state)["p"].text))
        assert len(set(pids)) == 1 and alive(pids[0])
    await wait_until(lambda: not alive(pids[0]), timeout=10)  # the server went with the runtime


async def test_cancelling_a_run_cancels_its_call_and_the_server_keeps_serving():
    client = MCPClient({"test": STDIO})
    agent = create_agent(policy(lambda r: "ok" if isinstance(r.messages[-1], ToolMessage) else
                                {"tool_calls": [call("slow", {"seconds": 30}, "s")]
                                 if "slow" in r.messages[-1].text else [call("add", {"a": 1, "b": 1}, "a")]}),
                         middleware=[MCPMiddleware(client)])
    async with LocalRuntime("memory", agents={"agent": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        run = await rt.runs.create(thread, "agent", input="be slow")
        await wait_until(lambda: rt.streams.get(run["run_id"]) is not None, timeout=10)
        await asyncio.sleep(2.0)  # the server is started and the call is under way
        started = time.monotonic()
        await rt.runs.cancel(thread, run["run_id"], wait=True)
        assert time.monotonic() - started < 5
        assert (await rt.runs.get(thread, run["run_id"]))["status"] == "interrupted"
        state = await agent.ainvoke("add", thread_id=(await rt.threads.create())["thread_id"])
        assert results(state)["a"].text == "2"


async def test_a_deep_agent_gets_the_tools_of_its_mcp_servers_and_leaves_out_one_that_is_down():
    seen = []

    def model(request):
        seen.append(sorted(t.name for t in request.tools))
        if isinstance(request.messages[-1], ToolMessage):
            return f"sum: {request.messages[-1].text}"
        return {"tool_calls": [call("add", {"a": 20, "b": 22}, "a")]}

    agent = create_deep_agent(policy(model), general_purpose=False, mcp_servers={
        "test": STDIO, "broken": {"transport": "stdio", "command": sys.executable, "args": ["-c", "pass"]}})
    state = await agent.ainvoke("add")
    assert state["messages"][-1].text == "sum: 42"
    assert {"add", "crash", "fail", "server_pid", "slow", "read_file"} <= set(seen[0])
    for middleware in agent.middleware:
        if isinstance(middleware, MCPMiddleware):
            await middleware.client.aclose()


def test_a_bad_server_spec_is_refused_with_its_name():
    with pytest.raises(ValueError, match="'x': a stdio server needs 'command'"):
        MCPClient({"x": {"transport": "stdio"}})
    with pytest.raises(ValueError, match="'y': unknown transport 'carrier-pigeon'"):
        MCPClient({"y": {"transport": "carrier-pigeon", "url": "http://x"}})
