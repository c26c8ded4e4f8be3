"""execute: commands run in the sandbox's root, bounded in time and output, approved by a person by default."""

import asyncio
import time

from subagent_helpers import call

from backchannel import ScriptedModel, create_agent
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.workspace import FilesystemMiddleware, LocalShellBackend


async def test_commands_run_in_the_root_with_a_timeout_and_an_output_cap(tmp_path):
    backend = LocalShellBackend(tmp_path, timeout=5, max_output_bytes=1000)
    assert (await backend.execute("pwd && echo out && echo err >&2")).output == f"{tmp_path}\nout\nerr\n"
    failed = await backend.execute("exit 3")
    assert failed.exit_code == 3
    started = time.monotonic()
    slow = await backend.execute("sleep 30; echo never", timeout=1)
    assert time.monotonic() - started < 5
    assert slow.exit_code == 124 and "timed out after 1 seconds" in slow.output and "never" not in slow.output
    big = await backend.execute("yes 0123456789 | head -c 50000")
    assert big.truncated and len(big.output) == 1000
    assert (await backend.execute("echo $HOME-${SECRET_FOR_TEST:-unset}")).output.endswith("-unset\n")


async def test_a_cancelled_run_kills_its_command(tmp_path):
    backend = LocalShellBackend(tmp_path)
    task = asyncio.create_task(backend.execute("sleep 1; touch survived"))
    await asyncio.sleep(0.3)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await asyncio.sleep(1.5)
    assert not (tmp_path / "survived").exists()


async def test_the_execute_tool_reports_exit_codes_as_deepagents_does(tmp_path):
    model = ScriptedModel([{"tool_calls": [call("execute", {"command": "echo hi"}, "ok"),
                                           call("execute", {"command": "echo no; exit 2"}, "bad"),
                                           call("execute", {"command": "true", "timeout": 0}, "zero")]}, "done"])
    agent = create_agent(model, middleware=[FilesystemMiddleware(backend=LocalShellBackend(tmp_path))])
    state = await agent.ainvoke("run")
    results = {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}
    assert results["ok"].text == "hi\n\n[Command succeeded with exit code 0]"
    assert results["bad"].text == "no\n\n[Command failed with exit code 2]" and results["bad"].status == "success"
    assert results["zero"].status == "error" and "timeout must be between 1 and" in results["zero"].text


async def test_a_deep_agent_asks_before_each_command_unless_told_not_to(tmp_path):
    script = [{"tool_calls": [call("execute", {"command": "touch approved.txt"}, "x1")]},
              {"tool_calls": [call("execute", {"command": "touch rejected.txt"}, "x2")]}, "done"]
    agent = create_deep_agent(ScriptedModel(script), backend=LocalShellBackend(tmp_path), general_purpose=False)
    async with LocalRuntime("memory", agents={"shell": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "shell", input="make files")
        waiting = await rt.threads.get(thread)
        [[pending]] = waiting["interrupts"].values()
        assert pending["value"]["action_requests"][0]["name"] == "execute"
        assert not (tmp_path / "approved.txt").exists()
        await rt.runs.wait(thread, "shell", command={"resume": {"decisions": [{"type": "approve"}]}})
        assert (tmp_path / "approved.txt").exists()
        await rt.runs.wait(thread, "shell", command={"resume": {"decisions": [{"type": "reject",
                                                                                "message": "no"}]}})
        assert not (tmp_path / "rejected.txt").exists()
        assert (await rt.threads.get(thread))["status"] == "idle"

    trusted = create_deep_agent(ScriptedModel([{"tool_calls": [call("execute", {"command": "touch t"}, "x")]},
                                               "done"]),
                                backend=LocalShellBackend(tmp_path), interrupt_on={"execute": False},
                                general_purpose=False)
    await trusted.ainvoke("go")
    assert (tmp_path / "t").exists()


async def test_interrupt_on_asks_before_any_named_tool_and_a_rejected_write_writes_nothing():
    script = [{"tool_calls": [call("write_file", {"file_path": "/plan.md", "content": "draft"}, "w1")]},
              {"tool_calls": [call("write_file", {"file_path": "/plan.md", "content": "final"}, "w2")]}, "done"]
    agent = create_deep_agent(ScriptedModel(script), interrupt_on={"write_file": {"allowed_decisions": ["approve",
                                                                                                         "reject"]}},
                              general_purpose=False)
    async with LocalRuntime("memory", agents={"writer": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread, "writer", input="write")
        [[pending]] = (await rt.threads.get(thread))["interrupts"].values()
        assert pending["value"]["review_configs"] == [{"action_name": "write_file",
                                                       "allowed_decisions": ["approve", "reject"]}]
        await rt.runs.wait(thread, "writer", command={"resume": {"decisions": [{"type": "reject"}]}})
        values = (await rt.threads.get_state(thread))["values"]
        assert "files" not in values or "/plan.md" not in values["files"]
        await rt.runs.wait(thread, "writer", command={"resume": {"decisions": [{"type": "approve"}]}})
        values = (await rt.threads.get_state(thread))["values"]
    assert values["files"]["/plan.md"]["content"] == "final"
