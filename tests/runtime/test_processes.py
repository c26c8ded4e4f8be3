"""Several processes on one Postgres database, one of them killed with SIGKILL mid-run.

Each worker process opens a ``LocalRuntime`` on the same database and queues
runs on threads that all the workers share. The test reads only the database
and the workers' tool log (every tool call, with its pid and time).
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime

import pytest
from subagent_helpers import wait_until

from backchannel.runtime import open_storage
from backchannel.runtime.checkpoints import Checkpointer

STEPS = 3
LEASE = 5.0  # a live worker on a loaded machine can miss beats for a second or two: never taken for dead
WORKER = textwrap.dedent('''
    import asyncio, faulthandler, json, os, signal, sys, time

    from backchannel import HumanMessage, ScriptedModel, create_agent, tool
    from backchannel.runtime import LocalRuntime

    url, workdir, name, plan = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    STEPS, LEASE = {steps}, {lease}
    faulthandler.register(signal.SIGUSR1)  # the test asks for stacks when a worker seems stuck


    def log(line):
        with open(os.path.join(workdir, "tools.log"), "a") as f:
            f.write(line + "\\n")


    @tool
    async def step(i: int, turn: str) -> str:
        """One step of work."""
        log(f"{{os.getpid()}} start {{turn}} {{i}} {{time.time()}}")
        await asyncio.sleep(0.05)
        log(f"{{os.getpid()}} end {{turn}} {{i}} {{time.time()}}")
        return f"step {{i}} ok"


    def reply(request):
        done = 0
        for m in reversed(request.messages):
            if isinstance(m, HumanMessage):
                turn = m.text
                break
            done += m.type == "tool"
        if done < STEPS:
            return {{"tool_calls": [{{"name": "step", "args": {{"i": done + 1, "turn": turn}},
                                     "id": f"call_{{turn}}_{{done + 1}}"}}]}}
        return f"finished {{turn}}"


    async def main():
        agent = create_agent(ScriptedModel([reply], loop=True, latency=0.01), [step], max_iterations=20)
        async with LocalRuntime(url, agents={{"agent": agent}}, heartbeat_interval=0.2, lease=LEASE) as rt:
            runs = []
            for thread_id, text in plan:
                await rt.threads.create(thread_id=thread_id, if_exists="do_nothing")
                run = await rt.runs.create(thread_id, "agent",
                                           input={{"messages": [{{"role": "user", "content": text}}]}},
                                           multitask_strategy="enqueue")
                runs.append(run["run_id"])
            with open(os.path.join(workdir, name + ".json"), "w") as f:
                json.dump(runs, f)
            await asyncio.Event().wait()  # work until killed


    asyncio.run(main())
''').format(steps=STEPS, lease=LEASE)


def _start(tmp_path, url, name, plan, source=WORKER):
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    err = tmp_path / f"{name}.err"
    with open(err, "w") as stderr:
        proc = subprocess.Popen([sys.executable, str(script), url, str(tmp_path), name, json.dumps(plan)],
                                stdout=subprocess.DEVNULL, stderr=stderr)
    proc.stderr_path = err
    return proc


def _log(tmp_path):
    path = tmp_path / "tools.log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), what, turn, int(i), float(at)) for pid, what, turn, i, at in (line.split() for line in lines)]


async def _wait(condition, timeout, what, procs=(), interval=0.05):
    """Poll ``condition`` (sync or async) without blocking the event loop; returns its truthy value.

    On timeout, fails with what the workers were doing."""
    try:
        return await wait_until(condition, timeout, interval, what)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}{_stacks(procs)}") from None


def _stacks(procs):
    """What the live workers are doing, and what they printed."""
    report = ""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGUSR1)
    time.sleep(0.5)
    for proc in procs:
        proc.kill()
        proc.wait(5)
        report += f"\n--- worker {proc.pid} (exit {proc.returncode}):\n{proc.stderr_path.read_text()[-4000:]}"
    return report


async def test_a_killed_process_s_runs_finish_on_the_others_once_each_in_order(tmp_path, postgres_url):
    threads = [f"thread-{j}" for j in range(4)]
    names = ["w0", "w1", "w2"]
    plans = {name: [(t, f"{name}-{t}-{k}") for k in range(2) for t in threads] for name in names}
    procs = {name: _start(tmp_path, postgres_url, name, plans[name]) for name in names}
    try:
        await _wait(lambda: all((tmp_path / f"{n}.json").exists() for n in names), 30,
                    "the workers to queue their runs", procs.values())
        doomed = procs["w0"]
        await _wait(lambda: sum(pid == doomed.pid and what == "start" for pid, what, *_ in _log(tmp_path)) >= 2, 20,
              "the first worker to be mid-run", procs.values())
        # Stopped while the test looks at what it has in hand, so none of it ends between the look and the kill.
        doomed.send_signal(signal.SIGSTOP)
        storage = open_storage(postgres_url)
        await storage.open()
        try:
            run_ids = {n: json.loads((tmp_path / f"{n}.json").read_text()) for n in names}
            every = [r for ids in run_ids.values() for r in ids]
            # what the doomed worker has in hand: queued or running, for nobody but it (a write it sent before
            # it stopped may still end a run: then at an updated_at before the kill)
            dead_worker = next(w for w, (info, _) in (await storage.workers()).items() if info["pid"] == doomed.pid)
            in_hand = [r for r in every if (row := await storage.get_run(r)).worker_id == dead_worker
                       and row.status in ("pending", "running")]
            killed = datetime.now(UTC).isoformat()
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(5)
            killed_at = time.monotonic()
            rows = {}

            async def all_succeeded():
                rows.update({r: await storage.get_run(r) for r in every})
                return all(row.status == "success" for row in rows.values())

            await _wait(all_succeeded, LEASE + 60, "every run to succeed", procs.values(), interval=0.1)
            assert Counter(row.status for row in rows.values()) == Counter({"success": len(every)})
            took = time.monotonic() - killed_at
            survivors = {w for w, (info, _) in (await storage.workers()).items() if info["pid"] != doomed.pid}
            assert len(survivors) == 2 and dead_worker not in survivors
            # the dead worker's runs finished on the others (but those it finished before it died)
            assert all(rows[r].worker_id in survivors or rows[r].updated_at <= killed for r in in_hand)
            assert any(rows[r].worker_id in survivors for r in in_hand)
            orders = {t: [r.run_id for r in reversed(await storage.list_runs(t, limit=100))] for t in threads}
            texts = {}
            for t in threads:
                state = await Checkpointer(storage).latest(t, {})
                texts[t] = [(m.type, m.text) for m in state.values["messages"]
                            if m.type in ("human", "tool") or (m.type == "ai" and not m.tool_calls)]
        finally:
            await storage.close()
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(5)

    created = {r: text for n in names for r, (_, text) in zip(run_ids[n], plans[n])}
    for t in threads:
        # per thread, the runs ran in the order they were queued, each answered once, each step's result once
        expected = []
        for run_id in orders[t]:
            expected += [("human", created[run_id]), *(("tool", f"step {i} ok") for i in range(1, STEPS + 1)),
                         ("ai", f"finished {created[run_id]}")]
        assert texts[t] == expected
    log = _log(tmp_path)
    # Every step ran to its end. The survivors ran each step at most once, and again only a step the doomed
    # worker had in flight: the last it started in a run, cut short by the kill or ended just before it (its
    # result not yet stored, so the run resumed before it).
    in_flight: dict[str, int] = {}
    for pid, what, turn, i, _ in log:
        if pid == doomed.pid and what == "start":
            in_flight[turn] = max(i, in_flight.get(turn, 0))
    ends = Counter((turn, i) for _, what, turn, i, _ in log if what == "end")
    assert set(ends) == {(text, i) for text in created.values() for i in range(1, STEPS + 1)}
    starts = Counter((turn, i) for _, what, turn, i, _ in log if what == "start")
    redone = {key for key, n in starts.items() if n > 1}
    assert redone <= set(in_flight.items()) and all(n <= 2 for n in starts.values())
    assert all(n == 1 or key in redone for key, n in ends.items())
    # one run at a time per thread, across processes
    spans = defaultdict(list)
    begun = {}
    for pid, what, turn, i, at in sorted(log, key=lambda entry: entry[4]):
        if what == "start":
            begun[(pid, turn, i)] = at
        elif (pid, turn, i) in begun:
            spans[turn.split("-", 1)[1].rsplit("-", 1)[0]].append((begun[(pid, turn, i)], at, turn))
    for thread, intervals in spans.items():
        intervals.sort()
        for (_, end, turn), (start, _, other) in zip(intervals, intervals[1:]):
            assert turn == other or start >= end, f"{thread}: {turn} and {other} overlap"
    assert took < LEASE + 20  # taken over about a lease after the kill


@pytest.mark.parametrize("n", [3])
async def test_every_run_queued_by_several_processes_runs_exactly_once(tmp_path, postgres_url, n):
    threads = [f"thread-{j}" for j in range(10)]
    names = [f"w{i}" for i in range(n)]
    plans = {name: [(t, f"{name}-{t}-0") for t in threads] for name in names}
    procs = {name: _start(tmp_path, postgres_url, name, plans[name]) for name in names}
    try:
        await _wait(lambda: all((tmp_path / f"{name}.json").exists() for name in names), 30, "the workers to queue",
              procs.values())
        total = len(threads) * n * STEPS
        await _wait(lambda: sum(what == "end" for _, what, *_ in _log(tmp_path)) >= total, 60, "every step",
              procs.values())
        await asyncio.sleep(0.3)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(5)
    ends = Counter((turn, i) for _, what, turn, i, _ in _log(tmp_path) if what == "end")
    assert len(ends) == len(threads) * n * STEPS and set(ends.values()) == {1}
    # each run executed in the process that queued it (runs belong to their creator while it lives)
    by_pid = {proc.pid: name for name, proc in procs.items()}
    assert all(turn.startswith(by_pid[pid]) for pid, _, turn, _, _ in _log(tmp_path))


SUPERVISOR_WORKER = textwrap.dedent('''
    import asyncio, faulthandler, json, os, signal, sys

    sys.path.insert(0, {tests_dir!r})
    from subagent_helpers import relay_supervisor, start

    from backchannel import ScriptedModel
    from backchannel.deep_agent import create_deep_agent
    from backchannel.runtime import LocalRuntime
    from backchannel.subagents import SubAgent

    url, workdir, name, parents = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    faulthandler.register(signal.SIGUSR1)


    async def main():
        starts = [start("researcher", f"question {{i}}", f"call_{{i}}") for i in range({tasks})]
        agent = create_deep_agent(
            relay_supervisor(starts),
            subagents=[SubAgent("researcher", "Researches things.", background=True,
                                model=ScriptedModel(["The answer is 42."], loop=True, latency=0.4))],
            general_purpose=False)
        async with LocalRuntime(url, agents={{"supervisor": agent}}, heartbeat_interval=0.2, lease={lease}) as rt:
            for thread_id in parents:
                await rt.threads.create(thread_id=thread_id)
                await rt.runs.create(thread_id, "supervisor",
                                     input={{"messages": [{{"role": "user", "content": "go"}}]}})
            with open(os.path.join(workdir, name + ".json"), "w") as f:
                json.dump(parents, f)
            await asyncio.Event().wait()


    asyncio.run(main())
''')


async def test_no_notification_is_lost_or_doubled_when_the_process_running_the_subagents_dies(tmp_path,
                                                                                                postgres_url):
    tasks = 3
    script = SUPERVISOR_WORKER.format(tests_dir=os.path.dirname(os.path.dirname(__file__)), tasks=tasks,
                                      lease=LEASE)
    parents = [f"parent-{j}" for j in range(4)]
    procs = {name: _start(tmp_path, postgres_url, name, parents if name == "w0" else [], script)
             for name in ("w0", "w1", "w2")}
    storage = open_storage(postgres_url)
    await storage.open()
    try:
        async def children_running():
            async with storage.pool.connection() as conn:
                found = await (await conn.execute("SELECT count(*) FROM runs WHERE status = 'running' "
                                                  "AND thread_id NOT LIKE 'parent-%'")).fetchone()
            return found[0] > 0

        await _wait(lambda: (tmp_path / "w0.json").exists() and children_running(), 30, "the subagents to start",
                    procs.values(), interval=0.02)
        procs["w0"].send_signal(signal.SIGKILL)
        procs["w0"].wait(5)

        async def reported():
            notes = {}
            for parent in parents:
                state = await Checkpointer(storage).latest(parent, {})
                notes[parent] = [m for m in state.values.get("messages", ())
                                 if m.type == "human" and "task_notification" in m.additional_kwargs]
            active = [r for p in parents for r in await storage.active_runs(p)]
            return notes if not active and all(len(n) >= tasks for n in notes.values()) else None

        notes = await _wait(reported, LEASE + 60, "every notification to arrive", procs.values(), interval=0.1)
        await asyncio.sleep(2 * LEASE)  # nothing more arrives later
        assert await reported() == notes
        for parent in parents:
            task_ids = [m.additional_kwargs["task_notification"]["task_id"] for m in notes[parent]]
            assert len(task_ids) == tasks == len(set(task_ids)), (parent, task_ids)
            assert all("The answer is 42." in m.text for m in notes[parent])
            for task_id in task_ids:
                assert [r.status for r in await storage.list_runs(task_id)] == ["success"]
        survivors = {w for w, (info, _) in (await storage.workers()).items() if info["pid"] != procs["w0"].pid}
        async with storage.pool.connection() as conn:
            executors = {w for (w,) in await (await conn.execute(
                "SELECT DISTINCT worker_id FROM runs WHERE thread_id NOT LIKE 'parent-%'")).fetchall()}
        assert executors & survivors  # the survivors took subagent runs over
    finally:
        await storage.close()
        for proc in procs.values():
            proc.kill()
            proc.wait(5)
