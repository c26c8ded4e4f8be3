"""SIGTERM: no new work, short runs finish within the grace period, the rest resume at the next start, once."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime

from server_helpers import ProcessServer, free_port

from backchannel.runtime.remote import RemoteRuntime


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_sigterm_finishes_short_runs_and_resumes_the_rest_once(tmp_path):
    journal = tmp_path / "journal.txt"
    port, database = free_port(), f"sqlite:///{tmp_path}/state.db"

    def server() -> ProcessServer:
        return ProcessServer(["server_agents:AGENTS", "server_agents:journaler"], database, port=port,
                             extra=["--grace", "1"], env={"JOURNAL": str(journal)}, log=tmp_path / "server.log")

    first = server().start()
    async with RemoteRuntime(first.url, api_key=None) as rt:
        long_thread = (await rt.threads.create())["thread_id"]
        long_run = await rt.runs.create(long_thread, "journaler", input="the entry")
        await until(lambda: asyncio.to_thread(journal.exists))  # its side effect is done; its last model call runs
        queued = await rt.runs.create(long_thread, "echo", input="after", multitask_strategy="enqueue")
        short_thread = (await rt.threads.create())["thread_id"]
        short_run = await rt.runs.create(short_thread, "slow", input="quick")

        async def short_is_running() -> bool:
            return (await rt.runs.get(short_thread, short_run["run_id"]))["status"] == "running"

        await until(short_is_running)
    assert first.stop() in (0, -signal.SIGTERM)
    stopped = datetime.now(UTC)

    second = server().start()
    try:
        async with RemoteRuntime(second.url, api_key=None) as rt:
            short = await rt.runs.get(short_thread, short_run["run_id"])
            assert short["status"] == "success"  # finished within the grace period, before the first server stopped
            assert datetime.fromisoformat(short["updated_at"]) < stopped
            values = await rt.runs.join(long_thread, queued["run_id"])
            assert [m["content"] for m in values["messages"]] == [
                "the entry", "", "wrote the entry", "journaled: wrote the entry", "after", "echo: after"]
            resumed = await rt.runs.get(long_thread, long_run["run_id"])
            assert resumed["status"] == "success" and datetime.fromisoformat(resumed["updated_at"]) > stopped
            assert (await rt.threads.get_state(short_thread))["values"]["messages"][-1]["content"] == "echo: quick"
    finally:
        second.stop()
    assert journal.read_text() == "the entry\n"  # resumed after its side effect, not run again
