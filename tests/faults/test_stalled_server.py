"""A server that stalls past its lease and resumes changes nothing about the runs it lost.

Issue 15.6. Two ``backchannel serve`` processes share a Postgres database; the
other takes a server for dead 3 s after its last heartbeat. One is stopped
(SIGSTOP) while it runs its eight runs, just after a heartbeat, so that when it
resumes its runs' next steps come before its next heartbeat (which would tell it
it lost them); it stays stopped (8 s at least) until the other has taken the runs
over and finished them, however long a loaded machine makes that take. The
resumed server's writes for those runs (their next checkpoints, and the ends it
records when those fail) are refused, since every write of a run is fenced by the
claim that started it: the runs stay ``success``, each step recorded once, and
the resumed server goes on serving.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import httpx

from backchannel.runtime import open_storage

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))
from server_helpers import ProcessServer, user  # noqa: E402
from stall_agents import STEPS  # noqa: E402

RUNS = 8
LEASE = 3.0  # how long the other server waits for the stalled one's heartbeat
STALLED_LEASE = 10.0  # the stalled server heartbeats every 2 s (a fifth of its own lease)
STALL = 8.0


def _serve(url: str, log: Path, lease: float) -> ProcessServer:
    return ProcessServer(["stall_agents:worker"], url, extra=["--lease", str(lease)],
                         env={"PYTHONPATH": str(HERE)}, log=log)


async def _heartbeat_at(storage, worker: str) -> str:
    async with storage.pool.connection() as conn:
        found = await (await conn.execute("SELECT heartbeat_at FROM workers WHERE worker_id = %s",
                                          (worker,))).fetchone()
    return found[0]


async def _until(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_a_server_resuming_after_losing_its_runs_changes_nothing_about_them(tmp_path, postgres_url):
    stalled = _serve(postgres_url, tmp_path / "stalled.log", STALLED_LEASE)
    other = _serve(postgres_url, tmp_path / "other.log", LEASE)
    storage = open_storage(postgres_url)
    try:
        stalled.start()
        other.start()
        await storage.open()
        async with httpx.AsyncClient(base_url=stalled.url, timeout=30) as http:
            threads = [(await http.post("/threads", json={})).json()["thread_id"] for _ in range(RUNS)]
            runs = [(await http.post(f"/threads/{t}/runs", json={"assistant_id": "worker",
                                                                  "input": user("go")})).json() for t in threads]

        async def all_mid_run() -> bool:  # every run started, and some have a step recorded
            rows = [await storage.get_run(r["run_id"]) for r in runs]
            steps = [len(await storage.list_checkpoints(t, limit=100)) for t in threads]
            return all(row.status == "running" for row in rows) and max(steps) >= 3

        await _until(all_mid_run, 60, "the runs to be mid-run")
        [worker] = [w for w, (info, _) in (await storage.workers()).items() if info["pid"] == stalled.process.pid]
        last_beat = await _heartbeat_at(storage, worker)

        async def just_beat() -> bool:
            return await _heartbeat_at(storage, worker) != last_beat

        await _until(just_beat, 30, "the stalled server's next heartbeat")
        stalled.process.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            # what it has in hand (runs ended before the stop are its own, and not what this test is about)
            in_hand = [r["run_id"] for r in runs
                       if (row := await storage.get_run(r["run_id"])).status == "running" and row.worker_id == worker]
            assert in_hand, "every run ended before the server was stopped"

            async def all_succeeded() -> bool:
                return all(row.status == "success" for row in [await storage.get_run(r["run_id"]) for r in runs])

            await _until(all_succeeded, 90, "the other server to finish the stalled server's runs")
            await asyncio.sleep(max(0.0, STALL - (time.monotonic() - stopped_at)))
        finally:
            stalled.process.send_signal(signal.SIGCONT)
        await asyncio.sleep(4.0)  # what the resumed server had in hand is done (or refused) by now

        taken_over = {(await storage.get_run(run_id)).worker_id for run_id in in_hand}
        [other_worker] = [w for w, (info, _) in (await storage.workers()).items() if info["pid"] == other.process.pid]
        async with httpx.AsyncClient(base_url=other.url, timeout=30) as http:
            for thread, run in zip(threads, runs):
                ended = (await http.get(f"/threads/{thread}/runs/{run['run_id']}")).json()
                assert ended["status"] == "success", ended
                state = (await http.get(f"/threads/{thread}")).json()
                assert state["status"] == "idle", state
                messages = state["values"]["messages"]
                assert [m["type"] for m in messages] == ["human"] + ["ai", "tool"] * STEPS + ["ai"], messages
                assert [m["content"] for m in messages if m["type"] == "tool"] == \
                    [f"step {i} done" for i in range(1, STEPS + 1)]
                assert messages[-1]["content"] == "finished"
                history = (await http.post(f"/threads/{thread}/history", json={"limit": 100})).json()
                steps = [h["metadata"]["step"] for h in reversed(history)]
                assert steps == list(range(-1, len(steps) - 1)), steps  # one checkpoint per step
        # the resumed server goes on serving
        async with httpx.AsyncClient(base_url=stalled.url, timeout=30) as http:
            thread = (await http.post("/threads", json={})).json()["thread_id"]
            answer = await http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "worker",
                                                                          "input": user("again")})
            assert answer.json()["messages"][-1]["content"] == "finished"
        log = (tmp_path / "stalled.log").read_text()
        assert "Traceback" not in log, log[-3000:]
        assert taken_over == {other_worker}  # all it had in hand taken over by the other server
    finally:
        await storage.close()
        for server in (stalled, other):
            if server.process is not None and server.process.poll() is None:
                server.process.send_signal(signal.SIGCONT)
                server.stop()
