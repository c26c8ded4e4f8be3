"""Crash recovery: a process running a run is SIGKILLed; the next runtime on the file finishes the run.

The agent definition is a module written to ``tmp_path`` and imported by both the
doomed subprocess and this test. Its scripted model is a function of the request
(how many tool rounds the conversation already has), so a fresh process continues
exactly where the checkpoints say the run was. Every tool call and model call is
logged to a file with the pid that made it.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from subagent_helpers import wait_until

from backchannel.runtime import LocalRuntime
from backchannel.runtime.sqlite import SQLiteStorage

ROUNDS = 5  # tool rounds before the final answer
KILL_AT = 3  # the process dies during round KILL_AT + 1

AGENT_MODULE = textwrap.dedent('''
    """The agent both processes run."""
    import asyncio
    import os
    import time

    from backchannel import AIMessage, HumanMessage, ScriptedModel, create_agent, tool

    ROUNDS = {rounds}
    KILL_AT = {kill_at}


    def log(workdir, name, line):
        with open(os.path.join(workdir, name), "a") as f:
            f.write(f"{{os.getpid()}} {{line}}\\n")
            f.flush()
            os.fsync(f.fileno())


    def mark(workdir):
        # Written aside and renamed: the test reads the pid as soon as the marker exists.
        with open(os.path.join(workdir, "marker.tmp"), "w") as f:
            f.write(str(os.getpid()))
        os.replace(os.path.join(workdir, "marker.tmp"), os.path.join(workdir, "marker"))


    def build(workdir, scenario, doomed):
        """``scenario``: where the doomed process dies (model, tool or parallel)."""

        @tool
        async def step(i: int, turn: int, part: int = 0) -> str:
            """One step of work."""
            log(workdir, "tools.log", f"start {{turn}} {{i}} {{part}}")
            if doomed and turn == 1 and i == KILL_AT + 1:
                if scenario == "tool" or (scenario == "parallel" and part == 3):
                    await asyncio.sleep(0.3)  # let the other calls of the batch finish and be recorded
                    mark(workdir)
                    await asyncio.sleep(60)
            log(workdir, "tools.log", f"end {{turn}} {{i}} {{part}}")
            return f"step {{i}}.{{part}} ok"

        def reply(request):
            tail = []
            for m in reversed(request.messages):
                if isinstance(m, HumanMessage):
                    break
                tail.append(m)
            rounds = sum(isinstance(m, AIMessage) for m in tail)
            turn = sum(isinstance(m, HumanMessage) for m in request.messages)
            log(workdir, "model.log", f"call {{turn}} {{rounds}}")
            if doomed and scenario == "model" and turn == 1 and rounds == KILL_AT:
                mark(workdir)
                time.sleep(60)  # blocks the whole process, as a hung provider call might
            if rounds >= ROUNDS:
                return f"finished after {{rounds}} rounds"
            r = rounds + 1
            if scenario == "parallel" and r == KILL_AT + 1:
                return {{"tool_calls": [{{"name": "step", "args": {{"i": r, "turn": turn, "part": p}},
                                         "id": f"c{{turn}}_{{r}}_{{p}}"}} for p in (1, 2, 3)]}}
            return {{"tool_calls": [{{"name": "step", "args": {{"i": r, "turn": turn}}, "id": f"c{{turn}}_{{r}}"}}]}}

        return create_agent(ScriptedModel([reply], loop=True, latency=0.01), [step], max_iterations=50)
''').format(rounds=ROUNDS, kill_at=KILL_AT)

DOOMED_SCRIPT = textwrap.dedent('''
    import asyncio
    import json
    import sys

    sys.path.insert(0, sys.argv[1])
    from recovery_agent import build

    from backchannel.runtime import LocalRuntime


    async def main():
        workdir, db, scenario, thread_id = sys.argv[1:5]
        rt = LocalRuntime(store=f"sqlite:///{db}", agents={"agent": build(workdir, scenario, doomed=True)})
        await rt.open()
        await rt.threads.create(thread_id=thread_id, metadata={"who": "doomed"})
        first = await rt.runs.create(thread_id, "agent", input={"messages": [{"role": "user", "content": "go"}]})
        second = await rt.runs.create(thread_id, "agent", input={"messages": [{"role": "user", "content": "again"}]},
                                      multitask_strategy="enqueue")
        with open(f"{workdir}/runs.json", "w") as f:
            json.dump([first["run_id"], second["run_id"]], f)
        await asyncio.sleep(3600)


    asyncio.run(main())
''')


def _read_log(path):
    if not path.exists():
        return []
    return [line.split() for line in path.read_text().splitlines()]


def _start_doomed(tmp_path, scenario, thread_id):
    (tmp_path / "recovery_agent.py").write_text(AGENT_MODULE)
    (tmp_path / "doomed.py").write_text(DOOMED_SCRIPT)
    db = tmp_path / "state.db"
    proc = subprocess.Popen([sys.executable, str(tmp_path / "doomed.py"), str(tmp_path), str(db), scenario, thread_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 20
    while not (tmp_path / "marker").exists():
        if proc.poll() is not None:
            raise AssertionError(f"the doomed process exited early:\n{proc.stderr.read().decode()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the doomed process never reached the kill point")
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(5)  # reaped, so its pid is really gone
    assert proc.returncode == -signal.SIGKILL
    return db, int((tmp_path / "marker").read_text()), json.loads((tmp_path / "runs.json").read_text())


@pytest.mark.parametrize("scenario", ["model", "tool", "parallel"])
async def test_a_run_whose_process_was_killed_finishes_on_restart(tmp_path, scenario):
    thread_id = str(uuid.uuid4())
    db, dead_pid, (first_id, second_id) = _start_doomed(tmp_path, scenario, thread_id)
    me = os.getpid()
    tools_before = _read_log(tmp_path / "tools.log")
    assert {pid for pid, *_ in tools_before} == {str(dead_pid)}

    # the dead process left its run running and the next one queued
    storage = SQLiteStorage(str(db))
    await storage.open()
    assert [(await storage.get_run(r)).status for r in (first_id, second_id)] == ["running", "pending"]
    assert (await storage.get_thread(thread_id)).status == "busy"
    await storage.close()

    build = _import_agent_module(tmp_path)
    async with LocalRuntime(store=f"sqlite:///{db}", agents={"agent": build(str(tmp_path), scenario, False)}) as rt:
        first = await _join(rt, thread_id, first_id)
        second = await _join(rt, thread_id, second_id)
        assert (await rt.runs.get(thread_id, first_id))["status"] == "success"
        assert (await rt.runs.get(thread_id, second_id))["status"] == "success"
        thread = await rt.threads.get(thread_id)
        history = await rt.threads.get_history(thread_id, limit=1000)

    assert thread["status"] == "idle"
    assert thread["metadata"]["who"] == "doomed"
    messages = thread["values"]["messages"]
    assert first["messages"] == messages[:len(first["messages"])]
    assert second["messages"] == messages

    # no message twice, and every step's messages exactly once, in order
    ids = [m["id"] for m in messages]
    assert len(ids) == len(set(ids))
    turn = messages[:len(first["messages"])]
    expected_calls = []
    for r in range(1, ROUNDS + 1):
        if scenario == "parallel" and r == KILL_AT + 1:
            expected_calls += [f"c1_{r}_{p}" for p in (1, 2, 3)]
        else:
            expected_calls.append(f"c1_{r}")
    assert [m["type"] for m in turn][:1] == ["human"] and turn[0]["content"] == "go"
    assert [c["id"] for m in turn if m["type"] == "ai" for c in m["tool_calls"]] == expected_calls
    assert [m["tool_call_id"] for m in turn if m["type"] == "tool"] == expected_calls
    assert all(m["status"] == "success" for m in turn if m["type"] == "tool")
    assert turn[-1]["content"] == f"finished after {ROUNDS} rounds"
    assert [m["content"] for m in messages if m["type"] == "human"] == ["go", "again"]
    assert messages[-1]["content"] == f"finished after {ROUNDS} rounds"

    # completed steps were not executed again; only the step the process died in was redone
    tools = _read_log(tmp_path / "tools.log")
    first_turn_ends = [(pid, i, part) for pid, what, turn, i, part in tools if what == "end" and turn == "1"]
    by_step = {}
    for pid, i, part in first_turn_ends:
        by_step.setdefault((int(i), int(part)), []).append(int(pid))
    assert all(len(pids) == 1 for pids in by_step.values()), by_step
    assert len(by_step) == len(expected_calls)
    dead_did = {k for k, pids in by_step.items() if pids == [dead_pid]}
    if scenario == "parallel":  # the two calls of the batch that finished before the crash are not run again
        assert dead_did == {(r, 0) for r in range(1, KILL_AT + 1)} | {(KILL_AT + 1, 1), (KILL_AT + 1, 2)}
    else:
        assert dead_did == {(r, 0) for r in range(1, KILL_AT + 1)}
    starts_here = [(int(i), int(part)) for pid, what, turn, i, part in tools
                   if what == "start" and turn == "1" and int(pid) == me]
    assert not set(starts_here) & dead_did
    if scenario != "model":  # the call the process died in was started there and is run again here
        cut_short = (KILL_AT + 1, 3 if scenario == "parallel" else 0)
        starts_dead = [(int(i), int(part)) for pid, what, turn, i, part in tools
                       if what == "start" and int(pid) == dead_pid]
        assert cut_short in starts_dead and starts_here.count(cut_short) == 1

    # the restarted model call continued from the last checkpoint instead of starting over
    model_calls = _read_log(tmp_path / "model.log")
    resumed = [int(n) for pid, _, turn, n in model_calls if int(pid) == me and turn == "1"]
    assert resumed[0] == (KILL_AT if scenario == "model" else KILL_AT + 1)

    # one checkpoint per step, numbered without gaps
    steps = [h["metadata"]["step"] for h in reversed(history)]
    assert steps == list(range(-1, len(steps) - 1))
    assert len({h["checkpoint_id"] for h in history}) == len(history)


async def _join(rt, thread_id, run_id):
    return await asyncio.wait_for(rt.runs.join(thread_id, run_id), 10)


def _import_agent_module(tmp_path):
    (tmp_path / "recovery_agent.py").write_text(AGENT_MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        from recovery_agent import build
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("recovery_agent", None)
    return build


async def test_a_runtime_closed_mid_run_resumes_it_at_the_next_open(tmp_path):
    build = _import_agent_module(tmp_path)
    url = f"sqlite:///{tmp_path}/state.db"
    slow = build(str(tmp_path), "none", False)
    slow.model.latency = 0.05
    rt = LocalRuntime(store=url, agents={"agent": slow})
    thread = await rt.threads.create()
    tid = thread["thread_id"]
    run = await rt.runs.create(tid, "agent", input={"messages": [{"role": "user", "content": "go"}]})
    while len(_read_log(tmp_path / "tools.log")) < 4:  # two tool calls done
        await asyncio.sleep(0.01)
    await rt.close()
    done_before = {line[3] for line in _read_log(tmp_path / "tools.log") if line[1] == "end"}

    async with LocalRuntime(store=url, agents={"agent": build(str(tmp_path), "none", False)}) as again:
        result = await asyncio.wait_for(again.runs.join(tid, run["run_id"]), 10)
        assert (await again.runs.get(tid, run["run_id"]))["status"] == "success"
    assert result["messages"][-1]["content"] == f"finished after {ROUNDS} rounds"
    ids = [m["id"] for m in result["messages"]]
    assert len(ids) == len(set(ids))
    ends = [line[3] for line in _read_log(tmp_path / "tools.log") if line[1] == "end"]
    assert sorted(ends) == [str(r) for r in range(1, ROUNDS + 1)]  # each step once
    assert done_before <= set(ends)


async def test_heartbeats_go_on_while_waking_threads_with_mail_is_slow(tmp_path):
    """Waking the threads whose mail waits for a run (after each heartbeat, and all of them once the database
    is back from an outage) can be slow: at load 12 it took 1.5 s, and a heartbeat loop that waited for it
    missed a 2 s lease, so the other processes took this live one for dead and ran its runs again."""
    async with LocalRuntime(store=f"sqlite:///{tmp_path}/state.db", heartbeat_interval=0.05) as rt:
        answered = asyncio.Event()

        async def slow_wakes() -> None:  # the database slow to answer
            await answered.wait()

        rt.mail.retry_wakes = slow_wakes
        beats: set[str] = set()

        async def beating() -> bool:
            beats.add((await rt.storage.workers())[rt.worker_id][1])
            return len(beats) >= 4

        try:
            await wait_until(beating, 10, 0.02, "heartbeats while the wake-ups wait")
        finally:
            answered.set()


LAST_STEP_AGENT = textwrap.dedent('''
    """An agent whose one model call is logged with the pid that made it."""
    import os

    from backchannel import ScriptedModel, create_agent


    def build(workdir):
        def reply(request):
            with open(os.path.join(workdir, "model.log"), "a") as f:
                f.write(f"{os.getpid()}\\n")
            return "the answer"

        return create_agent(ScriptedModel([reply], loop=True))
''')

KILLED_AT_THE_END = textwrap.dedent('''
    import asyncio
    import os
    import sys
    import time

    sys.path.insert(0, sys.argv[1])
    from last_step_agent import build

    from backchannel.runtime import LocalRuntime
    from backchannel.runtime.sqlite import SQLiteStorage

    workdir, db, thread_id = sys.argv[1:4]
    finish_run = SQLiteStorage.finish_run


    async def stalled_finish_run(self, end):
        # The run's last step is done and its end is about to be recorded: the process dies here.
        with open(os.path.join(workdir, "marker.tmp"), "w") as f:
            f.write(end.run_id)
        os.replace(os.path.join(workdir, "marker.tmp"), os.path.join(workdir, "marker"))
        time.sleep(60)
        return await finish_run(self, end)


    SQLiteStorage.finish_run = stalled_finish_run


    async def main():
        async with LocalRuntime(store=f"sqlite:///{db}", agents={"agent": build(workdir)}) as rt:
            await rt.runs.create(thread_id, "agent", input={"messages": [{"role": "user", "content": "hi"}]},
                                 if_not_exists="create")
            await asyncio.sleep(3600)


    asyncio.run(main())
''')


async def _killed_at_its_marker(tmp_path, script: str, db, thread_id: str) -> tuple[int, str]:
    """Run ``script`` (with :data:`LAST_STEP_AGENT`) on ``db`` and kill it with SIGKILL once it has written its marker
    (a run's id); returns its pid and that run id."""
    (tmp_path / "last_step_agent.py").write_text(LAST_STEP_AGENT)
    (tmp_path / "killed.py").write_text(script)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "killed.py"), str(tmp_path), str(db), thread_id],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        await wait_until(lambda: (tmp_path / "marker").exists() or proc.poll() is not None, timeout=20)
        assert (tmp_path / "marker").exists(), proc.stderr.read().decode() if proc.poll() is not None else ""
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(5)
    return proc.pid, (tmp_path / "marker").read_text()


def _last_step_agent(tmp_path):
    """The agent of :data:`LAST_STEP_AGENT`, as the killed process built it, logging to ``tmp_path``."""
    sys.path.insert(0, str(tmp_path))
    try:
        from last_step_agent import build
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("last_step_agent", None)
    return build(str(tmp_path))


async def test_a_process_killed_between_a_runs_last_step_and_its_end_leaves_neither_and_the_run_ends_once(tmp_path):
    """The last step goes in with the run's end (one commit): killed between them, neither is stored, and the next
    runtime runs that step again, as a step whose write was lost, and records the run's end once."""
    db, thread_id = tmp_path / "state.db", str(uuid.uuid4())
    pid, run_id = await _killed_at_its_marker(tmp_path, KILLED_AT_THE_END, db, thread_id)

    storage = SQLiteStorage(str(db))
    await storage.open()
    assert (await storage.get_run(run_id)).status == "running"
    [stored] = await storage.list_checkpoints(thread_id)  # the run's input, not its step
    assert (stored.metadata["step"], stored.next) == (-1, "before_agent")
    await storage.close()

    async with LocalRuntime(store=f"sqlite:///{db}", agents={"agent": _last_step_agent(tmp_path)}) as rt:
        values = await asyncio.wait_for(rt.runs.join(thread_id, run_id), 10)
        [run] = await rt.runs.list(thread_id)
        history = await rt.threads.get_history(thread_id)
        thread = await rt.threads.get(thread_id)
    assert [m["content"] for m in values["messages"]] == ["hi", "the answer"]
    assert (run["run_id"], run["status"], thread["status"]) == (run_id, "success", "idle")
    assert [h["metadata"]["step"] for h in reversed(history)] == [-1, 0]
    calls = (tmp_path / "model.log").read_text().split()
    assert calls == [str(pid), str(os.getpid())]  # the step the dead process did, done again here


KILLED_AFTER_THE_CLAIM = textwrap.dedent('''
    import asyncio
    import os
    import sys
    import time

    sys.path.insert(0, sys.argv[1])
    from last_step_agent import build

    from backchannel.runtime import LocalRuntime
    from backchannel.runtime.sqlite import SQLiteStorage

    workdir, db, thread_id = sys.argv[1:4]
    create_claimed_run = SQLiteStorage.create_claimed_run


    async def stalled_create_claimed_run(self, row, claim, **kwargs):
        # The thread's second run is stored and claimed: the process dies before the run takes its first step.
        stored = await create_claimed_run(self, row, claim, **kwargs)
        if row.kwargs["input"]["messages"][0]["content"] == "again":
            with open(os.path.join(workdir, "marker.tmp"), "w") as f:
                f.write(row.run_id)
            os.replace(os.path.join(workdir, "marker.tmp"), os.path.join(workdir, "marker"))
            time.sleep(60)
        return stored


    SQLiteStorage.create_claimed_run = stalled_create_claimed_run


    async def main():
        async with LocalRuntime(store=f"sqlite:///{db}", agents={"agent": build(workdir)}) as rt:
            for content in ("hi", "again"):
                await rt.runs.wait(thread_id, "agent", input={"messages": [{"role": "user", "content": content}]},
                                   if_not_exists="create")
            await asyncio.sleep(3600)


    asyncio.run(main())
''')


async def test_a_process_killed_after_a_runs_claim_on_a_thread_with_a_past_leaves_its_input_and_runs_it_once(tmp_path):
    """A run on a thread with a past is claimed in the commit that stores its input: killed right after it, the
    run and its input are both stored, and the next runtime runs it once, from that input, not written again."""
    db, thread_id = tmp_path / "state.db", str(uuid.uuid4())
    pid, run_id = await _killed_at_its_marker(tmp_path, KILLED_AFTER_THE_CLAIM, db, thread_id)

    storage = SQLiteStorage(str(db))
    await storage.open()
    assert (await storage.get_run(run_id)).status == "running"
    head = await storage.head_checkpoint(thread_id)  # the run's input, stored with its claim
    assert (head.run_id, head.metadata["step"], head.next) == (run_id, 1, "before_agent")
    await storage.close()

    async with LocalRuntime(store=f"sqlite:///{db}", agents={"agent": _last_step_agent(tmp_path)}) as rt:
        values = await asyncio.wait_for(rt.runs.join(thread_id, run_id), 10)
        runs = await rt.runs.list(thread_id)
        history = await rt.threads.get_history(thread_id)
    assert [m["content"] for m in values["messages"]] == ["hi", "the answer", "again", "the answer"]
    assert [(r["run_id"] == run_id, r["status"]) for r in runs] == [(True, "success"), (False, "success")]
    assert [(h["metadata"]["source"], h["metadata"]["step"]) for h in reversed(history)] == [
        ("input", -1), ("loop", 0), ("input", 1), ("loop", 2)]
    calls = (tmp_path / "model.log").read_text().split()
    assert calls == [str(pid), str(os.getpid())]  # the first run's step there, the second's here
