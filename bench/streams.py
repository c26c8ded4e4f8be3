"""Live streams: N clients at once, each streaming a run whose model streams 200 tokens at 20 ms a token.

Each server runs in its own process on loopback, with an agent whose scripted model streams 200 tokens,
one every 20 ms (4 s a run, like a real model), each token the moment the model yielded it
(``@<time.monotonic_ns()>``). The load generator (``_stream_client.py``) is a process of its own: N
connections, each ``POST /threads/{new id}/runs/stream`` (``stream_mode="messages-tuple"``,
``if_not_exists="create"``), then the next run on the same connection when one ends; the first runs' starts
spread evenly over one run's length. Once every client has a run going (one run's length plus 1 s), a
measurement window opens until the clients stop starting runs. Reported per N = 100, 1,000, 2,000, each on
a fresh server:

* **token latency**, model yields → the client reads its bytes, p50 / p99 / max, of the tokens yielded in
  the window;
* **server CPU per token**: the server's CPU time in the window (``/proc/<pid>/stat``, its children
  included) over the tokens the model yielded in it; everything the server does counts (creating runs and
  threads, checkpoints, the model itself), and as a share of one core;
* **memory per live stream**: the server's peak resident memory (``VmHWM``) over its resident memory
  after a warm-up, divided by N;
* **failures**: connections refused or cut, non-200 responses, ``error`` events, runs with fewer tokens;
* **the load generator's CPU** in the window, as a share of one core (it must not be the bottleneck).

Targets for backchannel at N = 1,000: p99 ≤ 25 ms, ≤ 5 µs server CPU per token, ≤ 100 KiB per live stream,
no failure; and the 50,000 tokens/s due delivered (95 % of them at least): latency is timed from the model's
yield, so a server too busy to run its models on time delays them without showing it there.
backchannel runs on a SQLite file (its default) with ``--max-concurrency`` N;
``langgraph dev`` in memory with ``--n-jobs-per-worker`` N (it needs ``langgraph-cli[inmem]`` and
``langchain`` in ``.venv-peers``). ``floor`` (``_stream_floor.py``) is no server but the least one in Python can
spend: the same bytes on the wire from a bare event loop, a timer and a write per token. Usage::

    python bench/streams.py [--quick] [--json] [--clients 100,1000] [--servers backchannel,langgraph dev,floor]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts)
from server import (  # noqa: E402
    _process,
    backchannel_server,
    children,
    free_port,
    langgraph_server,
    memory_mib,
    peak_rss_mib,
    wait_until_up,
)

TOKENS = 200
INTERVAL = 0.02
RUN_SECONDS = TOKENS * INTERVAL
LEVELS = (100, 1000, 2000)
SERVERS = ("backchannel", "langgraph dev", "floor")
TARGETS = {"p99_ms": 25.0, "cpu_us_per_token": 5.0, "kib_per_stream": 100.0, "delivered": 0.95}

BACKCHANNEL_AGENT = f'''
import asyncio
import time

from backchannel import create_agent
from backchannel.models.base import ChatModel, FinishDelta, TextDelta


class TokenModel(ChatModel):
    """Streams {TOKENS} tokens, one each {INTERVAL} s, each the moment it was yielded."""

    async def stream(self, request):
        loop = asyncio.get_running_loop()
        due = loop.time()
        for _ in range({TOKENS}):
            due += {INTERVAL}
            await asyncio.sleep(due - loop.time())
            yield TextDelta(f"@{{time.monotonic_ns()}} ")
        yield FinishDelta(None, "stop", {{}}, None)


agent = create_agent(TokenModel(), name="tokens")
'''

LANGGRAPH_AGENT = f'''
import sys
sys.path.insert(0, {str(BENCH)!r})
from _peers import token_chat_model
from langchain.agents import create_agent

graph = create_agent(token_chat_model({TOKENS}, {INTERVAL}), tools=[])
'''

BODY = json.dumps({"assistant_id": "tokens", "input": {"messages": [{"role": "user", "content": "go"}]},
                   "stream_mode": ["messages-tuple"], "if_not_exists": "create"})


@dataclass
class Settings:
    window: float  # seconds measured, once every client has a run going

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        return cls(4.0 if quick else 10.0)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of ``pid`` and its children, from ``/proc``."""
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for each in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rpartition(")")[2].split()
        except FileNotFoundError:
            continue
        user += int(fields[11])  # utime, stime: fields 14 and 15 of stat
        system += int(fields[12])
    return user / ticks, system / ticks


def load(url: str, clients: int, seconds: float, window: tuple[float, float],
         on_window: Any = None) -> dict[str, Any]:
    """Run the load generator; ``on_window(name)`` is called as the window opens ("start") and closes ("end")."""
    parts = urlsplit(url)
    spec = {"address": parts.hostname, "port": parts.port, "host": parts.netloc, "clients": clients,
            "path": "/threads/{thread_id}/runs/stream", "body": BODY, "tokens": TOKENS, "seconds": seconds,
            "run_seconds": RUN_SECONDS, "window": list(window)}
    process = subprocess.Popen([sys.executable, str(BENCH / "_stream_client.py"), json.dumps(spec)],
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    started = json.loads(process.stdout.readline())["started_ns"] / 1e9
    if on_window is not None:
        for name, at in (("start", window[0]), ("end", window[1])):
            time.sleep(max(0.0, started + at - time.monotonic()))
            on_window(name)
    out = process.stdout.read()
    if process.wait() != 0:
        raise RuntimeError(f"the load generator failed (exit {process.returncode})")
    return json.loads(out)


def measure(url: str, pid: int, clients: int, settings: Settings) -> dict[str, Any]:
    load(url, 5, 0.0, (0.0, 0.0))  # warm up: five runs
    baseline = memory_mib(pid, "VmRSS")
    cpu: dict[str, tuple[float, float]] = {}
    ramp = RUN_SECONDS + 1.0
    window = (ramp, ramp + settings.window)
    result = load(url, clients, window[1], window, lambda name: cpu.__setitem__(name, cpu_seconds(pid)))
    server_user = cpu["end"][0] - cpu["start"][0]
    server_cpu = server_user + cpu["end"][1] - cpu["start"][1]
    tokens = result["window_tokens"]
    return {
        "clients": clients, "p50_ms": result["p50_ms"], "p99_ms": result["p99_ms"], "max_ms": result["max_ms"],
        "tokens": tokens, "tokens_per_second": tokens / settings.window, "runs": result["runs"],
        "failures": result["failures"], "failed": sum(result["failures"].values()),
        "cpu_us_per_token": server_cpu / tokens * 1e6 if tokens else None,
        "user_cpu_us_per_token": server_user / tokens * 1e6 if tokens else None,
        "server_core_share": server_cpu / settings.window,
        "client_core_share": result["cpu_seconds"] / settings.window,
        "client_cpu_us_per_token": result["cpu_seconds"] / tokens * 1e6 if tokens else None,
        "kib_per_stream": (peak_rss_mib(pid) - baseline) * 1024 / clients,
        "baseline_rss_mib": baseline}


def run(settings: Settings, levels: list[int], servers: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {name: {} for name in servers}
    for name in servers:
        for clients in levels:
            print(f"… {name}, {clients:,} streams", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="bench-streams-") as tmp:
                try:
                    with _server(name, Path(tmp), clients) as (url, pid):
                        results[name][clients] = measure(url, pid, clients, settings)
                except ModuleNotFoundError as exc:
                    results[name] = {"missing": str(exc)}
                    break
    return results


def _server(name: str, workdir: Path, clients: int) -> Any:
    if name == "backchannel":
        return backchannel_server(workdir, agents=BACKCHANNEL_AGENT, assistant="tokens",
                                  options=("--max-concurrency", str(clients)))
    if name == "floor":
        return floor_server(workdir)
    return langgraph_server(workdir, graph=LANGGRAPH_AGENT, assistant="tokens", jobs=clients)


@contextmanager
def floor_server(workdir: Path) -> Iterator[tuple[str, int]]:
    """``_stream_floor.py``: the same bytes on the wire from a bare event loop (a timer and a write a token)."""
    port = free_port()
    log = workdir / "floor.log"
    command = [sys.executable, str(BENCH / "_stream_floor.py"), str(port), str(TOKENS), str(INTERVAL)]
    with _process(command, workdir, log) as process:
        url = f"http://127.0.0.1:{port}"
        wait_until_up(url, process, log)
        yield url, process.pid


ROWS = [("token latency p50 (ms)", "p50_ms", "{:,.1f}"), ("token latency p99 (ms)", "p99_ms", "{:,.1f}"),
        ("token latency max (ms)", "max_ms", "{:,.1f}"), ("tokens/s delivered", "tokens_per_second", "{:,.0f}"),
        ("server CPU per token (µs)", "cpu_us_per_token", "{:,.2f}"),
        ("  of which user space (µs)", "user_cpu_us_per_token", "{:,.2f}"),
        ("server CPU (cores)", "server_core_share", "{:.2f}"), ("KiB per live stream", "kib_per_stream", "{:,.1f}"),
        ("failed", "failed", "{:,}"), ("load generator CPU (cores)", "client_core_share", "{:.2f}"),
        ("load generator µs per token", "client_cpu_us_per_token", "{:,.2f}")]


def render(results: dict[str, Any], out: Any) -> None:
    names = list(results)
    print(f"\nLive streams: each run streams {TOKENS} tokens at {INTERVAL * 1000:.0f} ms a token (messages-tuple)",
          file=out)
    levels = sorted({n for name in names for n in results[name] if isinstance(n, int)})
    for clients in levels:
        print(f"\nN = {clients:,}{'':<22}" + "".join(f"{name:>16}" for name in names), file=out)
        for label, key, fmt in ROWS:
            cells = []
            for name in names:
                row = results[name].get(clients) if "missing" not in results[name] else None
                value = None if row is None else row.get(key)
                cells.append("not installed" if "missing" in results[name] else "" if value is None
                             else fmt.format(value))
            print(f"{label:<32}" + "".join(f"{cell:>16}" for cell in cells), file=out)
        for name in names:
            failures = (results[name].get(clients) or {}).get("failures") if "missing" not in results[name] else None
            if failures:
                print(f"  {name} failures: {failures}", file=out)
    ours = results.get("backchannel", {}).get(1000)
    if ours:
        met = [ours["p99_ms"] is not None and ours["p99_ms"] <= TARGETS["p99_ms"],
               ours["cpu_us_per_token"] is not None and ours["cpu_us_per_token"] <= TARGETS["cpu_us_per_token"],
               ours["kib_per_stream"] <= TARGETS["kib_per_stream"], not ours["failed"],
               ours["tokens_per_second"] >= TARGETS["delivered"] * 1000 / INTERVAL]
        print(f"\nbackchannel at N = 1,000: targets met {sum(met)} of {len(met)} (p99 ≤ 25 ms, ≤ 5 µs CPU per token, "
              "≤ 100 KiB per stream, no failure, the tokens due delivered)", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, "a shorter window")
    parser.add_argument("--clients", default=",".join(map(str, LEVELS)), help="the Ns, comma-separated")
    parser.add_argument("--servers", default=",".join(SERVERS), help="which servers, comma-separated")
    args = parser.parse_args(argv)
    results = run(Settings.for_mode(args.quick), [int(n) for n in args.clients.split(",")],
                  [s.strip() for s in args.servers.split(",")])
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
