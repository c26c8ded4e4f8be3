"""Tools that misbehave: whatever a tool raises is an error result, and hung sync tools starve nothing.

Issue 15, items 1 (the tool part) and 8. Run alone with ``pytest tests/faults``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx

from backchannel import ScriptedModel, create_agent, tool
from backchannel.runtime import LocalRuntime

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))
from server_helpers import ProcessServer, user  # noqa: E402


def _tool_messages(run_values):
    return [m for m in run_values["messages"] if m["type"] == "tool"]


def test_a_tool_raising_system_exit_or_keyboard_interrupt_leaves_the_server_serving(tmp_path):
    """argparse's SystemExit, KeyboardInterrupt and an async sys.exit() in tools become error results;
    the server process survives, serves the next run, and a restart re-runs nothing."""
    db = f"sqlite:///{tmp_path}/state.db"
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "server")])}
    agents = ["faulty=tool_fault_agents:faulty"]
    with ProcessServer(agents, db, env=env, log=tmp_path / "serve.log") as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        for attempt in range(2):
            thread = http.post("/threads", json={}).json()["thread_id"]
            values = http.post(f"/threads/{thread}/runs/wait",
                               json={"assistant_id": "faulty", "input": user("go")}).json()
            statuses = {m["name"]: m["status"] for m in _tool_messages(values)}
            assert statuses == {"convert": "error", "interrupted": "error", "exits": "error",
                                "fine": "success"}, (attempt, values)
            texts = {m["name"]: m["content"] for m in _tool_messages(values)}
            assert "SystemExit" in texts["convert"] and "KeyboardInterrupt" in texts["interrupted"]
            assert values["messages"][-1]["content"] == \
                "after: convert=error, interrupted=error, exits=error, fine=success"
            [run] = http.get(f"/threads/{thread}/runs").json()
            assert run["status"] == "success"
        assert server.process.poll() is None and http.get("/ok").status_code == 200
        assert server.stop() in (0, -signal.SIGTERM)  # stopped by us, not by the tools' exit codes
    with ProcessServer(agents, db, env=env, log=tmp_path / "serve.log") as server, \
            httpx.Client(base_url=server.url, timeout=30) as http:
        runs = [r for t in http.post("/threads/search", json={"limit": 10}).json()
                for r in http.get(f"/threads/{t['thread_id']}/runs").json()]
        assert [r["status"] for r in runs] == ["success", "success"]


async def test_a_quick_sync_tool_runs_at_once_behind_50_hung_ones():
    release = threading.Event()
    entered = threading.Semaphore(0)
    finished: list[str] = []

    @tool
    def hang() -> str:
        """Block until released (a call to a server that never answers)."""
        entered.release()
        release.wait(120)
        finished.append(threading.current_thread().name)
        return "released"

    @tool
    def quick() -> str:
        """Return at once."""
        return "quick"

    def one_call(name):  # every run: one call of the tool, then "done"
        return ScriptedModel([lambda request: "done" if request.messages[-1].type == "tool" else
                              {"tool_calls": [{"name": name, "args": {}, "id": "c1"}]}], loop=True)

    hung_agent = create_agent(one_call("hang"), [hang], name="hung")
    quick_agent = create_agent(one_call("quick"), [quick], name="quick")
    try:
        async with LocalRuntime("memory", agents={"hung": hung_agent, "quick": quick_agent}) as rt:
            hung_runs = []
            for i in range(50):
                await rt.threads.create(thread_id=f"hung-{i}")
                hung_runs.append(await rt.runs.create(f"hung-{i}", "hung", input="go"))
            deadline = time.monotonic() + 30
            for _ in range(50):  # every hung tool is in its thread, blocked
                while not entered.acquire(blocking=False):
                    assert time.monotonic() < deadline, "the 50 hung tools did not all start"
                    await asyncio.sleep(0.01)

            async def quick_run(thread_id):
                await rt.threads.create(thread_id=thread_id)
                started = time.monotonic()
                values = await asyncio.wait_for(rt.runs.wait(thread_id, "quick", input="go"), 10)
                assert [m["content"] for m in _tool_messages(values)] == ["quick"]
                return time.monotonic() - started

            assert await quick_run("quick-1") < 1.0  # "at once": milliseconds when the machine is quiet

            # Cancelling the hung runs ends them at once; their threads stay blocked in the tool
            # (Python cannot stop a thread) but still starve nobody.
            for run in hung_runs:
                await rt.runs.cancel(run["thread_id"], run["run_id"])
            for run in hung_runs:
                ended = await asyncio.wait_for(rt.runs.join(run["thread_id"], run["run_id"]), 10)
                assert not _tool_messages(ended)
            assert await quick_run("quick-2") < 1.0

            # Released, the abandoned calls return into nothing: the cancelled runs stay as they ended.
            release.set()
            deadline = time.monotonic() + 10
            while len(finished) < 50:
                assert time.monotonic() < deadline, "the released tools did not return"
                await asyncio.sleep(0.01)
            for run in hung_runs:
                after = await rt.runs.get(run["thread_id"], run["run_id"])
                assert after["status"] not in ("success", "running", "pending")
                assert not _tool_messages((await rt.threads.get_state(run["thread_id"]))["values"])
    finally:
        release.set()
