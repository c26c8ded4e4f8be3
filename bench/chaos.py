"""Fault soak from outside: ``backchannel serve`` killed with SIGKILL at random moments while the official
``langgraph_sdk`` client drives it, restarted on the same database each time; then the invariants users rely on.

The server serves ``bench/_chaos_agents.py``: a ``worker`` (a model call, a tool, an answer) and a
``supervisor`` that starts a background ``researcher`` subagent on each turn and is woken by its completion
notification. Clients submit turns all along, as ``runs.create`` on supervisor threads (``enqueue``),
``runs.wait`` and ``runs.create`` with ``if_not_exists="create"`` on worker threads; each round the server is
killed with SIGKILL after a random (seeded) time and started again on the same file. After the last round, a
final server drains everything, and the soak checks:

* every run the server acknowledged (a 2xx answer) exists; every run in the database (the submitted ones, the
  subagents' and the supervisors' wakes) ended exactly once, in ``success``; a submission whose answer was lost
  to the kill is counted as submitted if its run is there (its turn in the run's metadata), and checked the same;
* every thread's final state holds each of its runs' inputs exactly once and each run's final answer exactly
  once (no missing or doubled last step), and nothing else of those kinds;
* each background subagent's completion notification reached its supervisor's thread exactly once, and was
  answered (``noted <id>``) exactly once;
* ``get_history`` of every thread is one chain: each checkpoint's parent is in it, exactly one has none.

Usage::

    python bench/chaos.py [--rounds N] [--seed S] [--kill-after MIN MAX] [--postgres URL] [--keep DIR]

It exits 1 if an invariant failed, printing each violation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from langgraph_sdk import get_client
from langgraph_sdk.errors import APIStatusError, NotFoundError

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from server import free_port, wait_until_up  # noqa: E402  (a sibling script)

SUPERVISOR_THREADS = 8
CLIENTS = 6  # concurrent submitters
ACTIVE = "SELECT count(*) FROM runs WHERE status IN ('pending', 'running')"
UNDELIVERED = "SELECT count(*) FROM inbox WHERE NOT delivered"


@dataclass
class Submission:
    turn: str
    thread_id: str
    assistant: str
    how: str
    acknowledged: bool = False
    answer: Any = None  # what runs.wait returned


@dataclass
class Soak:
    database: str
    workdir: Path
    rng: random.Random
    submissions: list[Submission] = field(default_factory=list)
    supervisor_threads: list[str] = field(default_factory=list)
    kills: int = 0
    refusals: list[str] = field(default_factory=list)  # 4xx/5xx answers to submissions
    process: subprocess.Popen[bytes] | None = None
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH), os.environ.get("PYTHONPATH", "")]),
               "LANGSMITH_TRACING": "false"}
        with open(self.workdir / "serve.log", "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "backchannel.cli", "serve", "--port", str(self.port), "--database",
                 self.database, "--agents", "worker=_chaos_agents:worker", "supervisor=_chaos_agents:supervisor"],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        wait_until_up(self.url, self.process, self.workdir / "serve.log", 60)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.kills += 1

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def log(self) -> str:
        return (self.workdir / "serve.log").read_text()[-4000:]


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


def sql(database: str, statement: str) -> list[tuple[Any, ...]]:
    """``statement``'s rows, read from outside the server."""
    if database.startswith("sqlite:///"):
        conn = sqlite3.connect(database.removeprefix("sqlite:///"), timeout=30)
        try:
            return conn.execute(statement).fetchall()
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(database, autocommit=True) as pg:
        return pg.execute(statement).fetchall()


# -- the load ------------------------------------------------------------------------------------


async def submit(soak: Soak, client: Any, round_no: int, n: int) -> None:
    """One turn, in one of the three ways, chosen by the soak's random generator."""
    turn = f"turn {round_no}-{n}"
    how = soak.rng.choice(["supervisor", "supervisor", "wait", "create"])
    if how == "supervisor":
        sub = Submission(turn, soak.rng.choice(soak.supervisor_threads), "supervisor", how)
    else:
        sub = Submission(turn, str(uuid.uuid4()), "worker", how)
    soak.submissions.append(sub)
    meta = {"turn": turn}
    if how == "wait":
        sub.answer = await client.runs.wait(sub.thread_id, "worker", input=user(turn), metadata=meta,
                                            if_not_exists="create", multitask_strategy="enqueue")
    else:
        await client.runs.create(sub.thread_id, sub.assistant, input=user(turn), metadata=meta,
                                 multitask_strategy="enqueue",
                                 if_not_exists="create" if how == "create" else None)
    sub.acknowledged = True


async def load(soak: Soak, round_no: int, until: float) -> int:
    """Submit turns from ``CLIENTS`` concurrent clients until ``until`` (monotonic) or the server dies."""
    client = get_client(url=soak.url)
    counter = iter(range(1_000_000))

    async def one_client() -> None:
        while time.monotonic() < until:
            try:
                await submit(soak, client, round_no, next(counter))
            except APIStatusError as error:  # an answer, not a lost one: the server refused
                soak.refusals.append(f"{error.response.status_code} {error.response.text[:200]}")
            except (httpx.HTTPError, OSError):  # the SDK's connection errors are httpx's too
                return  # the server is gone (or going): this submission's answer was lost

    tasks = [asyncio.create_task(one_client()) for _ in range(CLIENTS)]
    await asyncio.sleep(max(0.0, until - time.monotonic()))
    soak.kill()
    # A request the dead server cannot answer is lost: the SDK's runs.wait would retry its join for long.
    await asyncio.sleep(0.5)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return next(counter)


async def drain(soak: Soak, timeout: float = 300) -> None:
    """Until no run is pending or running and every notification is delivered, twice a second apart."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 2:
        assert soak.process is not None and soak.process.poll() is None, f"the server exited:\n{soak.log()}"
        if time.monotonic() > deadline:
            raise AssertionError(f"not drained in {timeout:.0f} s: {sql(soak.database, ACTIVE)} active, "
                                 f"{sql(soak.database, UNDELIVERED)} undelivered")
        busy = sql(soak.database, ACTIVE)[0][0] or sql(soak.database, UNDELIVERED)[0][0]
        quiet = 0 if busy else quiet + 1
        await asyncio.sleep(1.0)


# -- the invariants ------------------------------------------------------------------------------


def note_of(message: dict[str, Any]) -> str | None:
    notification = (message.get("additional_kwargs") or {}).get("task_notification")
    return notification["task_id"] if notification else None


def answers(messages: list[dict[str, Any]]) -> list[str]:
    """The final answers' parts (a supervisor's answer is ``started <turn> | noted <ids>``)."""
    return [part for m in messages if m["type"] == "ai" and not m.get("tool_calls")
            for part in m["content"].split(" | ")]


def inputs(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["type"] == "human" and not note_of(m)]


async def check(soak: Soak) -> tuple[dict[str, int], list[str]]:
    """The invariants (see the module's documentation): the counts seen and the violations found."""
    client = get_client(url=soak.url, timeout=60)
    problems: list[str] = [f"a submission refused: {r}" for r in soak.refusals]
    statuses = Counter(status for (status,) in sql(soak.database, "SELECT status FROM runs"))
    if set(statuses) != {"success"}:
        bad = sql(soak.database, "SELECT run_id, thread_id, assistant_id, status, error FROM runs "
                                 "WHERE status != 'success'")
        problems.append(f"runs not in success: {statuses}: {bad[:10]}")
    by_thread: dict[str, list[Submission]] = {}
    for sub in soak.submissions:
        by_thread.setdefault(sub.thread_id, []).append(sub)
    stored = 0
    for thread_id, subs in by_thread.items():
        runs = await read(client.runs.list, thread_id, limit=10_000) if await exists(client, thread_id) else []
        turns = Counter((r["metadata"] or {}).get("turn") for r in runs)
        doubled = [t for t, n in turns.items() if t is not None and n > 1]
        if doubled:
            problems.append(f"{thread_id}: a turn stored as two runs: {doubled}")
        mine = [s for s in subs if turns[s.turn]]
        stored += len(mine)
        problems += [f"{thread_id}: acknowledged {s.how} of {s.turn!r} has no run"
                     for s in subs if s.acknowledged and not turns[s.turn]]
        if not runs:
            continue
        messages = (await read(client.threads.get_state, thread_id))["values"].get("messages", [])
        expected_inputs = Counter(s.turn for s in mine)
        if Counter(inputs(messages)) != expected_inputs:
            problems.append(f"{thread_id}: inputs {Counter(inputs(messages))} != runs' {expected_inputs}")
        said = Counter(answers(messages))
        word = "started" if subs[0].assistant == "supervisor" else "done"
        expected_answers = Counter(f"{word} {s.turn}" for s in mine)
        got = Counter({a: n for a, n in said.items() if not a.startswith("noted") and a != "idle"})
        if got != expected_answers:
            problems.append(f"{thread_id}: answers {dict(got - expected_answers)} extra, "
                            f"{dict(expected_answers - got)} missing")
        for s in mine:
            if s.how == "wait" and s.acknowledged and answers(s.answer.get("messages", []))[-1:] != [f"done {s.turn}"]:
                problems.append(f"{thread_id}: runs.wait of {s.turn!r} answered {s.answer}")
        if subs[0].assistant == "supervisor":
            problems += check_notifications(thread_id, messages)
    for (thread_id,) in sql(soak.database, "SELECT thread_id FROM threads"):
        problems += await check_history(client, thread_id)
        problems += await check_no_repeats(client, thread_id)
    counts = {"submitted": len(soak.submissions), "acknowledged": sum(s.acknowledged for s in soak.submissions),
              "stored": stored, "runs": sum(statuses.values()), "threads": len(sql(soak.database,
                                                                                   "SELECT 1 FROM threads")),
              "kills": soak.kills}
    return counts, problems


async def read(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call``'s answer, asked again once if the connection broke: a read, so asking twice is harmless. Once, in a
    pass on Postgres, a get_state after a large get_history met "Server disconnected without sending a response"
    on the pooled connection; whether the server was alive was not recorded then (likely keep-alive's close racing
    the request, after the client had parsed a large history for seconds). If the server is dead, asking again
    fails too, and the soak says so with the server's exit code and log."""
    try:
        return await call(*args, **kwargs)
    except httpx.TransportError:
        return await call(*args, **kwargs)


async def exists(client: Any, thread_id: str) -> bool:
    try:
        await read(client.threads.get, thread_id)
    except NotFoundError:
        return False
    return True


async def check_no_repeats(client: Any, thread_id: str) -> list[str]:
    """No input and no final answer twice in any thread (the subagents' threads too: each is one run's)."""
    messages = (await read(client.threads.get_state, thread_id))["values"].get("messages", [])
    twice = [text for text, n in (Counter(inputs(messages)) + Counter(answers(messages))).items()
             if n > 1 and text != "idle"]
    return [f"{thread_id}: said twice: {twice}"] if twice else []


def check_notifications(thread_id: str, messages: list[dict[str, Any]]) -> list[str]:
    """Each task started on ``thread_id`` notified it exactly once, and was noted exactly once."""
    started = [m["tool_call_id"] for m in messages if m["type"] == "tool" and m.get("name") == "start_async_task"]
    notes = Counter(filter(None, map(note_of, messages)))
    noted = Counter(i for a in answers(messages) if a.startswith("noted ") for i in a.split()[1:])
    problems = [f"{thread_id}: a notification that is not a success: {m['content'][:200]}" for m in messages
                if note_of(m) and "Completed. Result: researched turn " not in m["content"]]
    if len(notes) != len(started) or any(n != 1 for n in notes.values()):
        problems.append(f"{thread_id}: {len(started)} tasks started, {len(notes)} notified, doubled "
                        f"{[i for i, n in notes.items() if n > 1]}")
    if noted != Counter(notes.keys()):
        problems.append(f"{thread_id}: notifications noted but not there {dict(noted - notes)}, "
                        f"there but not noted once {dict(Counter(notes.keys()) - noted)}")
    return problems


async def check_history(client: Any, thread_id: str) -> list[str]:
    history: list[dict[str, Any]] = []
    while True:  # a page at a time (the API's limit is 1,000)
        page = await read(client.threads.get_history, thread_id, limit=1000,
                          before=history[-1]["checkpoint"] if history else None)
        history += page
        if len(page) < 1000:
            break
    ids = {h["checkpoint"]["checkpoint_id"] for h in history}
    roots = [h for h in history if not h.get("parent_checkpoint")]
    orphans = [h["checkpoint"]["checkpoint_id"] for h in history
               if h.get("parent_checkpoint") and h["parent_checkpoint"]["checkpoint_id"] not in ids]
    parents = Counter(h["parent_checkpoint"]["checkpoint_id"] for h in history if h.get("parent_checkpoint"))
    forks = [p for p, n in parents.items() if n > 1]
    problems = []
    if history and len(roots) != 1:
        problems.append(f"{thread_id}: history has {len(roots)} roots")
    if orphans:
        problems.append(f"{thread_id}: checkpoints whose parent is not in the history: {orphans}")
    if forks:
        problems.append(f"{thread_id}: checkpoints with two children: {forks}")
    return problems


# -- the soak ------------------------------------------------------------------------------------


async def soak_on(database: str, workdir: Path, rounds: int, seed: int,
                  kill_after: tuple[float, float]) -> tuple[dict[str, int], list[str]]:
    soak = Soak(database, workdir, random.Random(seed))
    soak.start()
    try:
        client = get_client(url=soak.url)
        soak.supervisor_threads = [(await client.threads.create())["thread_id"] for _ in range(SUPERVISOR_THREADS)]
        for round_no in range(rounds):
            made = await load(soak, round_no, time.monotonic() + soak.rng.uniform(*kill_after))
            print(f"  round {round_no}: {made} submissions, killed", file=sys.stderr, flush=True)
            soak.start()
        await drain(soak)
        try:
            return await check(soak)
        except httpx.HTTPError as error:
            assert soak.process is not None
            raise RuntimeError(f"checking failed ({error!r}); the server's exit code: {soak.process.poll()}, its log:\n"
                               f"{soak.log()}") from error
    finally:
        soak.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-after", type=float, nargs=2, default=(0.5, 3.0), metavar=("MIN", "MAX"),
                        help="each round's server is killed this many seconds after it answers (uniform)")
    parser.add_argument("--postgres", help="a Postgres URL: soak a scratch schema there instead of a SQLite file")
    parser.add_argument("--keep", type=Path, help="keep the SQLite file and the server's log in this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chaos-") as tmp, ExitStack() as stack:
        workdir = Path(tmp)
        if args.postgres:
            from backchannel.runtime.postgres import scratch_schema  # psycopg only with a Postgres

            database = stack.enter_context(scratch_schema(args.postgres, "chaos"))
        else:
            database = f"sqlite:///{workdir}/state.db"
        print(f"… {args.rounds} rounds, seed {args.seed}", file=sys.stderr, flush=True)
        try:
            counts, problems = asyncio.run(soak_on(database, workdir, args.rounds, args.seed, args.kill_after))
        finally:
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                for name in ("state.db", "serve.log"):
                    if (workdir / name).exists():
                        shutil.copy(workdir / name, args.keep / name)
    print(f"{'postgres' if args.postgres else 'sqlite'}: {counts}")
    for problem in problems:
        print(f"  VIOLATION {problem}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
