"""Background subagents on another server: started there, reported back here, once, also across a restart."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from remote_agents import make_supervisor
from server_helpers import ProcessServer, free_port

from backchannel.runtime import LocalRuntime
from backchannel.runtime.remote import RemoteRuntime


async def replies_of(rt, thread_id: str) -> list[str]:
    state = await rt.threads.get_state(thread_id)
    return [m["content"] for m in state["values"]["messages"] if m["type"] == "ai" and m["content"]]


async def until_reported(rt, thread_id: str, timeout: float = 30.0) -> list[dict]:
    """Waits until the supervisor has answered a notification; returns the thread's notifications."""
    deadline = time.monotonic() + timeout
    while not any(r.startswith("the researcher reported") for r in await replies_of(rt, thread_id)):
        assert time.monotonic() < deadline, await replies_of(rt, thread_id)
        await asyncio.sleep(0.1)
    messages = (await rt.threads.get_state(thread_id))["values"]["messages"]
    return [m for m in messages if "task_notification" in (m.get("additional_kwargs") or {})]


@pytest.fixture
def researcher_server(tmp_path):
    with ProcessServer(["remote_agents:researcher"], f"sqlite:///{tmp_path}/researcher.db",
                       env={"RESEARCHER_LATENCY": "1.5"}, log=tmp_path / "researcher.log") as server:
        yield server


async def test_the_result_comes_back_to_the_supervisors_server_once(tmp_path, researcher_server):
    with ProcessServer(["remote_agents:supervisor"], f"sqlite:///{tmp_path}/supervisor.db",
                       env={"RESEARCHER_URL": researcher_server.url}, log=tmp_path / "supervisor.log") as server:
        async with RemoteRuntime(server.url, api_key=None) as rt:
            thread = await rt.threads.create()
            values = await rt.runs.wait(thread["thread_id"], "supervisor", input="LeBron James")
            assert values["messages"][-1]["content"] == "started the research"
            task = next(iter(values["async_tasks"].values()))
            assert task["url"] == researcher_server.url and task["status"] == "pending"
            (note,) = await until_reported(rt, thread["thread_id"])
    assert note["additional_kwargs"]["task_notification"]["task_id"] == task["task_id"]
    assert note["content"] == (f"[task_id={task['task_id']}][subagent=researcher] Completed. Result: "
                               "findings about LeBron James")
    async with RemoteRuntime(researcher_server.url, api_key=None) as there:
        child = await there.threads.get(task["task_id"])
        assert child["metadata"]["parent_thread_id"] == thread["thread_id"]
        assert child["values"]["parent_url"] == server.url


async def test_a_supervisor_server_that_was_down_gets_the_result_when_it_is_back(tmp_path, researcher_server):
    port, database = free_port(), f"sqlite:///{tmp_path}/supervisor.db"
    supervisor = ProcessServer(["remote_agents:supervisor"], database, port=port, log=tmp_path / "supervisor.log",
                               env={"RESEARCHER_URL": researcher_server.url}).start()
    try:
        async with RemoteRuntime(supervisor.url, api_key=None) as rt:
            thread = await rt.threads.create()
            values = await rt.runs.wait(thread["thread_id"], "supervisor", input="Michael Jordan")
            task = next(iter(values["async_tasks"].values()))
        assert supervisor.stop() in (0, -signal.SIGTERM)  # SIGTERM while the task runs: a clean stop
        assert "Application shutdown complete" in (tmp_path / "supervisor.log").read_text()
        async with RemoteRuntime(researcher_server.url, api_key=None) as there:
            run = await there.runs.join(task["task_id"], task["run_id"])
            assert run["messages"][-1]["content"] == "findings about Michael Jordan"
            waiting = await there.store.search_items(["backchannel", "outbox"])
            assert len(waiting["items"]) == 1  # kept until the supervisor's server takes it
        supervisor = ProcessServer(["remote_agents:supervisor"], database, port=port, log=tmp_path / "supervisor.log",
                                   env={"RESEARCHER_URL": researcher_server.url}).start()
        async with RemoteRuntime(supervisor.url, api_key=None) as rt:
            notes = await until_reported(rt, thread["thread_id"])
            assert len(notes) == 1 and notes[0]["additional_kwargs"]["task_notification"]["task_id"] == task["task_id"]
            await asyncio.sleep(1.0)  # a duplicate would have arrived by now
            assert len(await until_reported(rt, thread["thread_id"])) == 1
        async with RemoteRuntime(researcher_server.url, api_key=None) as there:
            assert (await there.store.search_items(["backchannel", "outbox"]))["items"] == []
    finally:
        supervisor.stop()


async def test_an_embedded_supervisor_watches_its_remote_tasks(researcher_server):
    async with LocalRuntime("memory", {"supervisor": make_supervisor(researcher_server.url)}) as rt:
        thread = await rt.threads.create()
        values = await rt.runs.wait(thread["thread_id"], "supervisor", input="Larry Bird")
        task = next(iter(values["async_tasks"].values()))
        (note,) = await until_reported(rt, thread["thread_id"])
    assert note["content"].endswith("Completed. Result: findings about Larry Bird")
    async with RemoteRuntime(researcher_server.url, api_key=None) as there:
        child = await there.threads.get(task["task_id"])
        assert "parent_url" not in child["values"]  # nobody to call back: the supervisor watched instead


async def test_an_unreachable_subagent_server_is_an_error_the_model_sees(tmp_path):
    async with LocalRuntime("memory", {"supervisor": make_supervisor(f"http://127.0.0.1:{free_port()}")}) as rt:
        thread = await rt.threads.create()
        values = await rt.runs.wait(thread["thread_id"], "supervisor", input="anyone?")
    tool_result = next(m for m in values["messages"] if m["type"] == "tool")
    assert tool_result["status"] == "error"
    assert "could not start the 'researcher' task on http://127.0.0.1:" in tool_result["content"]
