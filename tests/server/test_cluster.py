"""Three ``backchannel serve`` processes on one Postgres database, driven by the official ``langgraph_sdk`` client.

500 runs over 100 threads go to all three servers at once; one server is
killed with SIGKILL mid-way. Every run executes once, each thread's runs in
the order they were queued, the killed server's runs finish on the others, and
every background task's notification reaches its supervisor exactly once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import httpx
import psycopg
from langgraph_sdk import get_client
from server_helpers import ProcessServer, user

from backchannel.runtime import open_storage

SERVERS = 3
THREADS = 100
RUNS = 500
LEASE = 3.0
KILL_AFTER = 150  # runs submitted before one server dies
# what a server has in hand: queued or running, for nobody but it
IN_HAND = "SELECT run_id FROM runs WHERE worker_id = %s AND status IN ('pending', 'running')"


def turn_of(message: dict) -> str | None:
    notification = (message.get("additional_kwargs") or {}).get("task_notification")
    return None if notification or message["type"] != "human" else message["content"]


async def test_three_servers_share_500_runs_and_survive_losing_one(tmp_path, postgres_url):
    servers = [ProcessServer(["cluster_agents:supervisor"], postgres_url, extra=["--lease", str(LEASE)],
                             log=tmp_path / f"server-{i}.log") for i in range(SERVERS)]
    storage = open_storage(postgres_url)
    try:
        for server in servers:
            server.start()
        await storage.open()
        clients = [get_client(url=s.url) for s in servers]
        threads = [(await clients[0].threads.create())["thread_id"] for _ in range(THREADS)]
        alive = list(range(SERVERS))
        gate = asyncio.Semaphore(24)

        async def submit(i: int) -> None:
            thread = threads[i % THREADS]
            async with gate:
                for attempt in range(SERVERS * 2):
                    client = clients[alive[(i + attempt) % len(alive)]]
                    try:
                        await client.runs.create(thread, "supervisor", metadata={"turn": i},
                                                 input={"messages": [{"role": "user", "content": f"turn {i}"}]},
                                                 multitask_strategy="enqueue")
                        return
                    except (httpx.HTTPError, OSError):
                        # The server died: the run may have been stored before the answer was lost. Looked for in
                        # the database, not through another server (under load that request failed too, once: an
                        # httpx ReadError from a live server's pooled connection, the test failing for it).
                        if await _sql(storage, "SELECT 1 FROM runs WHERE thread_id = %s "
                                      "AND metadata::jsonb ->> 'turn' = %s", (thread, str(i))):
                            return
                raise AssertionError(f"turn {i} could not be submitted")

        submitted = [asyncio.create_task(submit(i)) for i in range(KILL_AFTER)]
        await asyncio.gather(*submitted)
        doomed = servers[0]
        doomed_worker = next(w for w, (info, _) in (await storage.workers()).items()
                             if info["pid"] == doomed.process.pid)
        rest = [asyncio.create_task(submit(i)) for i in range(KILL_AFTER, RUNS)]
        # it dies with runs in hand (a fixed wait could find it with none, on a loaded machine): looked at while
        # it is stopped, so none of them ends between the look and the kill (its runs take milliseconds)
        assert doomed.process is not None
        deadline = time.monotonic() + 60
        while True:
            doomed.process.send_signal(signal.SIGSTOP)
            orphans = {r for (r,) in await _sql(storage, IN_HAND, (doomed_worker,))}
            if len(orphans) >= 5:
                break
            doomed.process.send_signal(signal.SIGCONT)
            assert time.monotonic() < deadline, "the doomed server never had five runs in hand"
            await asyncio.sleep(0.05)
        alive = [1, 2]
        killed = datetime.now(UTC).isoformat()
        doomed.stop(signal.SIGKILL)
        await asyncio.gather(*rest)

        async def settled() -> bool:
            (active,) = (await _sql(storage, "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')"))[0]
            return active == 0

        deadline = time.monotonic() + 120
        while not await settled():
            assert time.monotonic() < deadline, "the runs did not all finish" + _logs(servers)
            await asyncio.sleep(0.2)
        survivor = clients[1]

        turns_done: list[int] = []
        for thread in threads:
            runs = list(reversed(await _runs(survivor, thread)))  # oldest first
            submitted_runs = [r for r in runs if "turn" in r["metadata"]]
            failed = [(r["run_id"], (await storage.get_run(r["run_id"])).error) for r in runs
                      if r["status"] != "success"]
            assert not failed, f"{failed}{_logs(servers)}"
            order = [f"turn {r['metadata']['turn']}" for r in submitted_runs]
            state = await survivor.threads.get_state(thread)
            messages = state["values"]["messages"]
            # every run executed once, in the order the runs were queued
            assert [t for t in map(turn_of, messages) if t] == order
            answers = [m["content"] for m in messages if m["type"] == "ai" and not m.get("tool_calls")]
            assert answers.count("started") == len(order)
            # one task per turn, and each task's notification exactly once
            tasks = state["values"]["async_tasks"]
            assert sorted(t["description"] for t in tasks.values()) == sorted(order)
            notes = Counter(m["additional_kwargs"]["task_notification"]["task_id"] for m in messages
                            if (m.get("additional_kwargs") or {}).get("task_notification"))
            if notes != Counter(tasks.keys()):
                missing = list(Counter(tasks.keys()) - notes)
                inbox = await _sql(storage, "SELECT key, delivered, created_at FROM inbox WHERE thread_id = %s",
                                   (thread,))
                child_runs = [await _sql(storage, "SELECT run_id, status, worker_id, updated_at FROM runs "
                                                  "WHERE thread_id = %s", (t,)) for t in missing]
                parent_runs = await _sql(storage, "SELECT run_id, status, worker_id, kwargs, updated_at FROM runs "
                                                  "WHERE thread_id = %s ORDER BY seq", (thread,))
                raise AssertionError(f"{thread}: extra {notes - Counter(tasks.keys())}, missing {missing}\n"
                                     f"inbox {inbox}\nchild runs {child_runs}\nparent runs {parent_runs}\n"
                                     f"tasks {tasks}\nmessages {[(m['type'], m['content'][:60]) for m in messages]}")
            turns_done += [r["metadata"]["turn"] for r in submitted_runs]
        assert sorted(turns_done) == list(range(RUNS))
        # the killed server's runs finished on the others (but those it finished before it died)
        ended = [await storage.get_run(run_id) for run_id in orphans]
        assert all(row.status == "success" and (row.worker_id != doomed_worker or row.updated_at <= killed)
                   for row in ended)
        assert any(row.worker_id != doomed_worker for row in ended), "the killed server had no runs in hand"
    finally:
        await storage.close()
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait()


async def _runs(client, thread: str) -> list[dict]:
    return await client.runs.list(thread, limit=1000)


async def _sql(storage, statement: str, params: tuple = ()) -> list[tuple]:
    async with storage.pool.connection() as conn:
        return await (await conn.execute(statement, params)).fetchall()


def _logs(servers: list[ProcessServer]) -> str:
    return "".join(f"\n--- {s.url}:\n{s.log.read_text()[-3000:]}" for s in servers if s.log and s.log.exists())


async def test_a_thread_follower_on_one_server_sees_every_run_made_on_another(tmp_path, postgres_url):
    """Two servers on one database, the follower's machine's clock ten minutes ahead of the other's: a client that
    follows a thread on one sees every run made on the other, in order, one made and ended as it attached while
    its server could not hear the others (its listening connection cut) too."""
    skewed = tmp_path / "skewed"
    skewed.mkdir()
    (skewed / "sitecustomize.py").write_text("import time\n_time = time.time\ntime.time = lambda: _time() + 600\n")
    behind = ProcessServer(["server_agents:echo"], postgres_url, log=tmp_path / "behind.log",
                           env={"PYTHONPATH": os.pathsep.join([str(skewed), str(Path(__file__).parent),
                                                               os.environ.get("PYTHONPATH", "")])})
    maker = ProcessServer(["server_agents:echo"], postgres_url, log=tmp_path / "maker.log")
    done: list[str] = []
    try:
        async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as db:
            channel = f"backchannel:{(await (await db.execute('SELECT current_schema()')).fetchone())[0]}"
            behind.start()  # alone: the backend listening on the schema's channel is its
            listener = [pid for pid, in await (await db.execute(
                "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN ' || quote_ident(%s) || '%%'",
                (channel,))).fetchall()]
            assert len(listener) == 1, listener
            maker.start()
            ahead, there = get_client(url=behind.url), get_client(url=maker.url)
            tid = (await there.threads.create())["thread_id"]
            async with db.transaction():
                # Reconnecting, the follower's server first tidies the listeners table: held off meanwhile.
                await db.execute("LOCK TABLE listeners IN EXCLUSIVE MODE")
                await db.execute("SELECT pg_terminate_backend(%s)", (listener[0],))
                follower = asyncio.create_task(_follow_runs(ahead, tid, done))
                await asyncio.sleep(3)  # the client has attached (its server cannot hear yet)
                made = [(await there.runs.create(tid, "echo", input=user("meanwhile")))["run_id"]]
                await there.runs.join(tid, made[0])
            later = []
            for i in range(2):
                later.append((await there.runs.create(tid, "echo", input=user(f"later {i}")))["run_id"])
                await there.runs.join(tid, later[-1])
            deadline = time.monotonic() + 30
            while len(done) < 3:
                assert time.monotonic() < deadline, f"runs seen {done} of {[*made, *later]}{_logs([behind, maker])}"
                await asyncio.sleep(0.05)
            follower.cancel()
        assert done == [*made, *later]
    finally:
        for server in (behind, maker):
            if server.process is not None and server.process.poll() is None:
                server.process.kill()
                server.process.wait()


async def _follow_runs(client, thread: str, done: list[str]) -> None:
    """Add the id of each run the client following the thread sees to its end to ``done``."""
    async for part in await client.threads.join_stream(thread):  # langgraph_sdk awaits, then iterates
        if part.event == "metadata" and part.data.get("status") == "run_done":
            done.append(part.data["run_id"])
