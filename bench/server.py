"""The HTTP server: ``backchannel serve`` against ``langgraph dev``, the same one-step agent, the same client.

Each server runs in its own process on loopback; this process is the client (``httpx``, keep-alive
connections), so both servers are measured the same way. The agent answers at once ("echo: ..."):
only the server, its runtime and its storage are timed. backchannel runs on a SQLite file (its
default); ``langgraph dev`` on its in-memory runtime.

* **latency**: sequential ``POST /threads`` then ``POST /threads/{id}/runs/wait``; p50 and p90 of the pair;
* **throughput**: 32 concurrent clients, each looping ``POST /threads/{new id}/runs/wait``
  (``if_not_exists="create"``) for a few seconds: one-step runs per second. The load comes from
  ``wrk`` when it is installed (``apt-get install wrk``): a Python client on the same two cores
  spends more CPU per request than the server does, and would measure itself;
* **time to first event**: ``POST /threads/{id}/runs/stream`` until the first event after ``metadata``, p50;
* **a run reaching a thread's follower**: with ``GET /threads/{id}/stream`` open, from sending a run that
  nobody streams (a task notification's run, which wakes an idle thread on backchannel) until the follower
  gets its first event, p50;
* **v2 thread stream, first event**: with the thread's ``POST /threads/{id}/stream/events`` open (the v2
  protocol ``client.threads.stream`` uses), from sending ``run.start`` to ``/threads/{id}/commands`` until
  the stream's first event of that run (its ``lifecycle`` ``running``), p50;
* **peak RSS** of the server process (``VmHWM``) once every workload has run.

With a Postgres (``--postgres URL``, by default ``$BACKCHANNEL_TEST_POSTGRES``), a second table sets
``backchannel serve`` on a scratch schema of it beside Aegra (``aegra-api``, an open Agent Protocol server
on Postgres) on a scratch database of the same cluster, serving the same graph ``langgraph dev`` serves:
latency, runs/s, time to first event and peak RSS (Aegra has neither thread followers nor the v2 stream).
Aegra needs ``.venv-aegra`` (see README.md; or ``$AEGRA_PYTHON``, a Python that has ``aegra_api``).

Targets for backchannel on SQLite: p50 ≤ 5 ms, ≥ 1,000 runs/s, time to first event p50 ≤ 5 ms,
peak RSS ≤ 80 MiB. ``langgraph dev`` needs ``langgraph-cli[inmem]`` and ``langchain`` in
``.venv-peers`` (see README.md); without it that column says "not installed". Usage::

    python bench/server.py [--quick] [--json] [--postgres URL]
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (a sibling script, not a package)

CLIENTS = 32
TARGETS = {"latency_p50_ms": 5.0, "runs_per_second": 1000.0, "first_event_p50_ms": 5.0, "peak_rss_mib": 80.0}
SERVERS = ("backchannel", "langgraph dev")
AEGRA_VENV = BENCH.parent / ".venv-aegra"

BACKCHANNEL_AGENT = '''
from backchannel import HumanMessage, ScriptedModel, create_agent


def echo(request):
    humans = [m for m in request.messages if isinstance(m, HumanMessage)]
    return "echo: " + humans[-1].text


agent = create_agent(ScriptedModel([echo], loop=True), name="echo")
'''

LANGGRAPH_AGENT = '''
import sys
sys.path.insert(0, {bench!r})
from _peers import reply_chat_model
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage


def echo(messages):
    humans = [m for m in messages if isinstance(m, HumanMessage)]
    return AIMessage(content="echo: " + humans[-1].content)


graph = create_agent(reply_chat_model(echo), tools=[])
'''


@dataclass
class Settings:
    latency_pairs: int
    throughput_seconds: float
    first_events: int

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        return cls(100, 3.0, 50) if quick else cls(400, 8.0, 200)


@dataclass
class Result:
    latency_p50_ms: float
    latency_p90_ms: float
    runs_per_second: float
    failed_runs: int
    first_event_p50_ms: float
    follower_first_event_p50_ms: float | None  # None: the server has no such stream (Aegra)
    v2_first_event_p50_ms: float | None
    peak_rss_mib: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_up(url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 120.0, *,
                  health: str = "/ok") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}{health}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"the server did not answer within {timeout:.0f} s:\n{log.read_text()[-3000:]}")


@contextmanager
def backchannel_server(workdir: Path, database: str | None = None, log_name: str = "backchannel.log", *,
                       agents: str = BACKCHANNEL_AGENT, assistant: str = "echo",
                       options: tuple[str, ...] = ()) -> Iterator[tuple[str, int]]:
    """``backchannel serve`` of ``agents``' ``agent`` (the echo agent) as ``assistant`` on ``database`` (a SQLite
    file in ``workdir`` by default), with more ``serve`` options if given."""
    (workdir / "bench_agents.py").write_text(agents)
    port = free_port()
    log = workdir / log_name
    command = [sys.executable, "-m", "backchannel.cli", "serve", "--port", str(port), "--agents",
               f"{assistant}=bench_agents:agent", "--database", database or f"sqlite:///{workdir}/state.db",
               *options]
    with _process(command, workdir, log) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, log)
        yield url, process.pid


@contextmanager
def langgraph_server(workdir: Path, *, graph: str | None = None, assistant: str = "echo",
                     jobs: int = CLIENTS) -> Iterator[tuple[str, int]]:
    """``langgraph dev`` of ``graph``'s ``graph`` (the echo agent) as ``assistant``, running ``jobs`` runs at once."""
    cli = shutil.which("langgraph", path=os.path.dirname(sys.executable))
    if cli is None:
        raise ModuleNotFoundError("langgraph-cli is not installed here")
    (workdir / "graph.py").write_text(graph or LANGGRAPH_AGENT.format(bench=str(BENCH)))
    config = {"dependencies": ["."], "graphs": {assistant: "./graph.py:graph"}}
    (workdir / "langgraph.json").write_text(json.dumps(config))
    port = free_port()
    log = workdir / "langgraph.log"
    command = [cli, "dev", "--config", str(workdir / "langgraph.json"), "--port", str(port), "--no-browser",
               "--no-reload", "--n-jobs-per-worker", str(jobs)]
    with _process(command, workdir, log) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, log)
        yield url, process.pid


def aegra_python() -> str:
    """The Python that has ``aegra_api``: ``$AEGRA_PYTHON``, else ``.venv-aegra``'s (Aegra's pins would fight
    ``.venv-peers``'s)."""
    python = os.environ.get("AEGRA_PYTHON") or str(AEGRA_VENV / "bin" / "python")
    if not (os.path.exists(python) and subprocess.run([python, "-c", "import aegra_api"],
                                                      capture_output=True).returncode == 0):
        raise ModuleNotFoundError(f"aegra-api is not installed ({python} has no aegra_api; see bench/README.md)")
    return python


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """The URL of a new database in the cluster of ``url`` (a Postgres URL), dropped afterwards."""
    import psycopg
    from psycopg import sql

    name = f"bench_aegra_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def aegra_server(workdir: Path, database: str, *, assistant: str = "echo") -> Iterator[tuple[str, int]]:
    """Aegra (``uvicorn aegra_api.main:app``) serving ``LANGGRAPH_AGENT``'s graph as ``assistant`` on the Postgres
    ``database`` (a URL; it migrates it). Its connection pools get backchannel's size (10; Aegra's default is 2
    for its own statements, 6 for LangGraph's checkpointer), its request log is off (``LOG_LEVEL=WARNING``)."""
    python = aegra_python()
    (workdir / "graph.py").write_text(LANGGRAPH_AGENT.format(bench=str(BENCH)))
    (workdir / "aegra.json").write_text(json.dumps({"graphs": {assistant: "./graph.py:graph"}}))
    port = free_port()
    log = workdir / "aegra.log"
    env = {"DATABASE_URL": database, "AEGRA_CONFIG": str(workdir / "aegra.json"), "LOG_LEVEL": "WARNING",
           "SQLALCHEMY_POOL_SIZE": "10", "LANGGRAPH_MAX_POOL_SIZE": "10"}
    command = [python, "-m", "uvicorn", "aegra_api.main:app", "--host", "127.0.0.1", "--port", str(port),
               "--no-access-log"]
    with _process(command, workdir, log, env) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, log, health="/health")
        yield url, process.pid


@contextmanager
def _process(command: list[str], workdir: Path, log: Path,
             env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    # The agents' directory first, then the caller's PYTHONPATH (a source tree to measure instead of the installed one).
    path = os.pathsep.join(p for p in (str(workdir), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "LANGSMITH_TRACING": "false", "LANGCHAIN_TRACING_V2": "false",
           "LANGGRAPH_CLI_NO_ANALYTICS": "1", **(env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def peak_rss_mib(pid: int) -> float:
    """The high-water mark of resident memory of ``pid`` and its children (langgraph dev forks), in MiB."""
    return memory_mib(pid, "VmHWM")


def memory_mib(pid: int, field: str) -> float:
    """A memory figure of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), summed over ``pid`` and its children."""
    total = 0
    for each in [pid, *children(pid)]:
        try:
            for line in Path(f"/proc/{each}/status").read_text().splitlines():
                if line.startswith(f"{field}:"):
                    total += int(line.split()[1])
        except FileNotFoundError:
            pass
    return total / 1024


def children(pid: int) -> list[int]:
    """The processes ``pid`` started, and theirs."""
    try:
        found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except FileNotFoundError:
        return []
    return [int(c) for child in found for c in [child, *map(str, children(int(child)))]]


USER = {"messages": [{"role": "user", "content": "hello"}]}


async def measure(url: str, pid: int, settings: Settings, *, followers: bool = True) -> Result:
    """Every workload on the server at ``url``; without ``followers``, not the thread follower and v2 stream's."""
    limits = httpx.Limits(max_connections=CLIENTS * 2, max_keepalive_connections=CLIENTS * 2)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        for _ in range(20):  # warm up
            await _create_and_wait(http)
        pairs = sorted([await _create_and_wait(http) for _ in range(settings.latency_pairs)])
        load = await _throughput(http, settings.throughput_seconds)
        firsts = sorted([await _first_event(http) for _ in range(settings.first_events)])
        followed = sorted(await _follower_first_events(http, settings.first_events)) if followers else None
        v2 = sorted(await _v2_first_events(http, settings.first_events)) if followers else None
    return Result(latency_p50_ms=_pct(pairs, 50) * 1000, latency_p90_ms=_pct(pairs, 90) * 1000,
                  runs_per_second=load.runs_per_second, failed_runs=load.failed,
                  first_event_p50_ms=_pct(firsts, 50) * 1000,
                  follower_first_event_p50_ms=_pct(followed, 50) * 1000 if followed else None,
                  v2_first_event_p50_ms=_pct(v2, 50) * 1000 if v2 else None,
                  peak_rss_mib=peak_rss_mib(pid))


async def _create_and_wait(http: httpx.AsyncClient) -> float:
    started = time.perf_counter()
    thread = (await http.post("/threads", json={})).raise_for_status().json()
    response = await http.post(f"/threads/{thread['thread_id']}/runs/wait", json={"assistant_id": "echo",
                                                                                 "input": USER})
    values = response.raise_for_status().json()
    assert values["messages"][-1]["content"] == "echo: hello", values
    return time.perf_counter() - started


WRK_SCRIPT = """
local body = '{"assistant_id": "echo", "input": {"messages": [{"role": "user", "content": "hello"}]}, '
  .. '"if_not_exists": "create"}'
local headers = {["Content-Type"] = "application/json"}
local sent = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("prefix", past or string.format("%08x", math.random(0, 0x7fffffff)))
  thread:set("n", threads)
end
function request()
  sent = sent + 1  -- a new thread id per run; with a key for the past, the wrk thread's own thread each time
  return wrk.format("POST", "/threads/" .. prefix .. "-0000-4000-8000-" .. string.format("%012x", past and n or sent)
                    .. "/runs/wait", headers, body)
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH requests=%d seconds=%f connect=%d read=%d write=%d timeout=%d status=%d\\n",
    summary.requests, summary.duration / 1e6, e.connect, e.read, e.write, e.timeout, e.status))
end
"""
WRK_TIMEOUT = 5.0  # seconds: a run not answered by then counts as failed


@dataclass
class Load:
    """What the ``wrk`` processes of one measurement did: answered runs per second and the failures, by kind.

    ``timeout`` counts requests unanswered after ``WRK_TIMEOUT`` (wrk counts one again each 2 s it stays
    unanswered), ``status`` responses other than 2xx/3xx, the rest socket errors. Only requests that
    were answered in time with a 2xx/3xx count in ``runs_per_second``."""

    runs_per_second: float
    failures: dict[str, int]

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


def parse_wrk(output: str) -> tuple[int, float, dict[str, int]]:
    """Requests, seconds and failures by kind, from the ``BENCH`` line ``WRK_SCRIPT``'s ``done`` prints."""
    line = next((line for line in output.splitlines() if line.startswith("BENCH ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no summary:\n{output}")
    fields = dict(field.split("=") for field in line.split()[1:])
    failures = {kind: int(fields[kind]) for kind in ("connect", "read", "write", "timeout", "status")}
    return int(fields["requests"]), float(fields["seconds"]), failures


def wrk_load(wrk: str, urls: list[str], threads: int, connections: int, seconds: float, *,
             past: str | None = None) -> Load:
    """One ``wrk`` per URL, all at once, each looping ``WRK_SCRIPT``: answered runs per second, summed, and failures.

    Every ``wrk`` gets its own random seed: Lua's generator starts from the same one in every process, so
    parallel load generators would otherwise send the same thread ids and queue behind each other. With ``past``
    (six hex digits), each wrk thread (give one connection each) runs on one thread of its own, the same at each
    call with that key: the second and later turns of a chat, once a call has made them."""
    with ExitStack() as stack:
        loads = []
        for i, url in enumerate(urls):
            script = stack.enter_context(tempfile.NamedTemporaryFile("w", suffix=".lua"))
            key = f'past = "{past}{i:02x}"\n' if past else ""
            script.write(f"math.randomseed({random.getrandbits(31)})\n{key}{WRK_SCRIPT}")
            script.flush()
            loads.append(subprocess.Popen([wrk, f"-t{threads}", f"-c{connections}", f"-d{seconds:.0f}s",
                                           f"--timeout={WRK_TIMEOUT:.0f}s", "-s", script.name, url],
                                          stdout=subprocess.PIPE, text=True))
        outputs = [(load.communicate()[0], load.returncode) for load in loads]
    rate, failures = 0.0, dict.fromkeys(("connect", "read", "write", "timeout", "status"), 0)
    for output, returncode in outputs:
        if returncode != 0:
            raise RuntimeError(f"wrk exited {returncode}:\n{output}")
        requests, elapsed, failed = parse_wrk(output)
        rate += max(0, requests - failed["status"] - failed["timeout"]) / elapsed
        failures = {kind: failures[kind] + failed[kind] for kind in failures}
    return Load(rate, failures)


async def _throughput(http: httpx.AsyncClient, seconds: float) -> Load:
    wrk = shutil.which("wrk")
    if wrk is None:
        return await _throughput_httpx(http, seconds)
    return await asyncio.to_thread(wrk_load, wrk, [str(http.base_url).rstrip("/")], 2, CLIENTS, seconds)


async def _throughput_httpx(http: httpx.AsyncClient, seconds: float) -> Load:
    done = 0
    failures = {"error": 0, "status": 0}
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            try:
                response = await http.post(f"/threads/{uuid.uuid4()}/runs/wait", timeout=WRK_TIMEOUT, json={
                    "assistant_id": "echo", "input": USER, "if_not_exists": "create"})
            except httpx.HTTPError:
                failures["error"] += 1
                continue
            if response.is_success:
                done += 1
            else:
                failures["status"] += 1

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(CLIENTS)))
    return Load(done / (time.perf_counter() - started), failures)


async def _first_event(http: httpx.AsyncClient) -> float:
    thread = (await http.post("/threads", json={})).raise_for_status().json()
    started = time.perf_counter()
    async with http.stream("POST", f"/threads/{thread['thread_id']}/runs/stream",
                           json={"assistant_id": "echo", "input": USER, "stream_mode": "values"}) as response:
        elapsed = None
        async for line in response.aiter_lines():  # read to the end, so the connection goes back to the pool
            if elapsed is None and line.startswith("event: ") and line != "event: metadata":
                elapsed = time.perf_counter() - started
    if elapsed is None:
        raise RuntimeError("the stream ended without an event")
    return elapsed


async def _follower_first_events(http: httpx.AsyncClient, count: int) -> list[float]:
    """Each time from sending a run nobody streams until a follower of its thread gets its first event."""
    thread = (await http.post("/threads", json={})).raise_for_status().json()
    tid = thread["thread_id"]
    await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "echo", "input": USER})  # the thread's graph
    lines: asyncio.Queue[str] = asyncio.Queue()

    async def follow() -> None:
        async with http.stream("GET", f"/threads/{tid}/stream") as response:
            async for line in response.aiter_lines():
                lines.put_nowait(line)

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.5)  # the follower is in
    times = []
    for i in range(count):
        note = {"role": "user", "content": f"[task_id=t{i}][subagent=r] Completed. Result: {i}",
                "additional_kwargs": {"task_notification": {"task_id": f"t{i}", "subagent": "r",
                                                            "status": "success", "run_id": f"r{i}"}}}
        started = time.perf_counter()
        await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"messages": [note]}})
        while not (await lines.get()).startswith("event: "):
            pass  # the run's metadata: its first event
        times.append(time.perf_counter() - started)
        await _until_idle(http, tid)
        while not lines.empty():
            lines.get_nowait()
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    return times


async def _v2_first_events(http: httpx.AsyncClient, count: int) -> list[float]:
    """Each time from sending ``run.start`` until the thread's v2 event stream gets the run's first event."""
    tid = (await http.post("/threads", json={})).raise_for_status().json()["thread_id"]
    events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def follow() -> None:
        async with http.stream("POST", f"/threads/{tid}/stream/events", json={"channels": ["lifecycle"]}) as answer:
            async for line in answer.raise_for_status().aiter_lines():
                if line.startswith("data: "):
                    events.put_nowait(json.loads(line[6:]))

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0.5)  # the stream is open
    times = []
    for i in range(count):
        started = time.perf_counter()
        answer = await http.post(f"/threads/{tid}/commands", json={"id": i + 1, "method": "run.start", "params": {
            "assistant_id": "echo", "input": USER}})
        assert answer.raise_for_status().json()["type"] == "success", answer.text
        first = await events.get()
        times.append(time.perf_counter() - started)
        assert first["params"]["data"]["event"] == "running", first
        while (await events.get())["params"]["data"]["event"] != "completed":
            pass
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    return times


async def _until_idle(http: httpx.AsyncClient, thread_id: str) -> None:
    while (await http.get(f"/threads/{thread_id}")).json()["status"] != "idle":
        await asyncio.sleep(0.005)


def _pct(values: list[float], pct: int) -> float:
    return values[min(len(values) - 1, len(values) * pct // 100)]


@contextmanager
def backchannel_on_postgres(workdir: Path, postgres: str) -> Iterator[tuple[str, int]]:
    """``backchannel serve`` of the echo agent on a scratch schema of ``postgres``."""
    from backchannel.runtime.postgres import scratch_schema  # psycopg only when there is a Postgres

    with scratch_schema(postgres, "bench") as database, backchannel_server(workdir, database) as started:
        yield started


@contextmanager
def aegra_on_postgres(workdir: Path, postgres: str) -> Iterator[tuple[str, int]]:
    """Aegra serving the echo graph on a scratch database of ``postgres``'s cluster."""
    aegra_python()  # not installed: no database to make
    with scratch_database(postgres) as database, aegra_server(workdir, database) as started:
        yield started


def run(settings: Settings, postgres: str | None) -> dict[str, Any]:
    results: dict[str, Any] = {"load_average": os.getloadavg()[0]}
    servers: list[tuple[str, Any, bool]] = [("backchannel", backchannel_server, True),
                                            ("langgraph dev", langgraph_server, True)]
    if postgres:
        servers += [("backchannel, Postgres", lambda tmp: backchannel_on_postgres(tmp, postgres), False),
                    ("Aegra", lambda tmp: aegra_on_postgres(tmp, postgres), False)]
    else:
        results["backchannel, Postgres"] = results["Aegra"] = {"missing": "no Postgres (--postgres URL)"}
    for name, server, followers in servers:
        print(f"… {name}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
            try:
                with server(Path(tmp)) as (url, pid):
                    results[name] = asyncio.run(measure(url, pid, settings, followers=followers)).__dict__
            except ModuleNotFoundError as exc:
                results[name] = {"missing": str(exc)}
    results["load_average_after"] = os.getloadavg()[0]
    return results


ROWS = [("create + wait p50 (ms)", "latency_p50_ms", "≤ 5", False),
        ("create + wait p90 (ms)", "latency_p90_ms", "", False),
        ("runs/s, 32 clients", "runs_per_second", "≥ 1,000", True),
        ("  failed (timeouts, errors)", "failed_runs", "0", None),
        ("first event p50 (ms)", "first_event_p50_ms", "≤ 5", False),
        ("run to thread follower p50 (ms)", "follower_first_event_p50_ms", "≤ 2", False),
        ("v2 stream first event p50 (ms)", "v2_first_event_p50_ms", "≤ 1", False),
        ("peak RSS (MiB)", "peak_rss_mib", "≤ 80", False)]


def render(results: dict[str, Any], out: Any) -> None:
    ours = results["backchannel"]
    print(f"\nHTTP server, one-step runs, {CLIENTS} concurrent clients for throughput "
          f"(backchannel on SQLite, langgraph dev in memory); load average {results['load_average']:.1f} "
          f"-> {results['load_average_after']:.1f} on {os.cpu_count()} cores", file=out)
    _table(ours, results["langgraph dev"], "langgraph dev", ROWS, out)
    met = [ours["latency_p50_ms"] <= TARGETS["latency_p50_ms"],
           ours["runs_per_second"] >= TARGETS["runs_per_second"] and not ours["failed_runs"],
           ours["first_event_p50_ms"] <= TARGETS["first_event_p50_ms"],
           ours["peak_rss_mib"] <= TARGETS["peak_rss_mib"]]
    print(f"targets met: {sum(met)} of {len(met)}"
          f"{'' if shutil.which('wrk') else ' (throughput from a Python client: install wrk for the real figure)'}",
          file=out)


def render_postgres(results: dict[str, Any], out: Any) -> None:
    ours = results["backchannel, Postgres"]
    print("\nThe same on Postgres: backchannel on a scratch schema, Aegra on a scratch database of the same cluster",
          file=out)
    if "missing" in ours:
        print(f"not measured: {ours['missing']}", file=out)
        return
    rows = [(label, key, "", better) for label, key, _, better in ROWS if "follower" not in key and "v2" not in key]
    _table(ours, results["Aegra"], "Aegra", rows, out)  # the targets are SQLite's


def _table(ours: dict[str, Any], peer: dict[str, Any], peer_name: str, rows: list[tuple[str, str, str, bool | None]],
           out: Any) -> None:
    """Our column beside ``peer``'s, with the ratio (how many times better we are) and the target."""
    print(f"{'':<30}{'backchannel':>14}{peer_name:>16}{'ratio':>9}{'target':>12}", file=out)
    for label, key, target, higher_is_better in rows:
        mine = ours[key]
        theirs = peer.get(key)
        if theirs is None:
            ratio, shown = "", "not installed" if "missing" in peer else "-"
        else:
            ratio = "" if higher_is_better is None else f"{(mine / theirs if higher_is_better else theirs / mine):.1f}×"
            shown = f"{theirs:,.1f}"
        print(f"{label:<30}{mine:>14,.1f}{shown:>16}{ratio:>9}{target:>12}", file=out)
    if "missing" in peer:
        print(f"{peer_name}: {peer['missing']}", file=out)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "fewer samples (about a minute)", postgres=True).parse_args(argv)
    results = run(Settings.for_mode(args.quick), args.postgres)
    emit_report(results, [render, render_postgres], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
