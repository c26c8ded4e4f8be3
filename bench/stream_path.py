"""A streamed token's path in process: Python calls per token (deterministic) and CPU per token.

The runtime, the agent and the server's response as ``backchannel serve`` runs them for
``POST /threads/{id}/runs/stream`` with ``stream_mode=["messages-tuple"]`` (``RunsClient.stream`` pushed through
``sse.push_parts`` and ``PushedChunks`` into a ``StreamingBody``), on a SQLite file, with ``streams.py``'s scripted
model; the body's chunks go to a connection that takes every write and keeps only its length (no HTTP, no socket),
on uvloop when installed, as the server. Two measures:

* **calls per token**: cProfile over ``RUNS`` runs of ``TOKENS`` tokens and over as many runs of twice as many,
  the model yielding at once (``asyncio.sleep(0)``); the difference over the extra tokens is what one token
  costs, by function: a count, not a time, the same from one run to the next;
* **CPU per token**: ``--clients`` streams at once (1,000 by default), each streaming runs of 200 tokens at 20 ms
  a token one after another, as ``streams.py``'s clients do; the process's CPU time over a window
  (``time.process_time()``) divided by the tokens written in it.

And for callgrind, ``--workload T``: only ``RUNS`` runs of ``T`` tokens (the model yielding at once). Instructions per
token: (Ir at 1,000 tokens - Ir at 200) / (20 runs x 800 tokens); two runs of the same code agree within ~250.

Usage::

    python bench/stream_path.py [--quick] [--json] [--clients 1000] [--calls-only]
    PYTHONHASHSEED=0 valgrind --tool=callgrind python bench/stream_path.py --workload 200   # and --workload 1000
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts)

TOKENS = 200
INTERVAL = 0.02
RUNS = 20  # runs counted at once for the calls per token
SHOWN = 40  # functions listed, the most called per token first


def token_agent(tokens: int, interval: float) -> Any:
    """``streams.py``'s agent: a model streaming ``tokens`` tokens, one every ``interval`` s (0: at once)."""
    from backchannel import create_agent
    from backchannel.models.base import ChatModel, FinishDelta, TextDelta

    class TokenModel(ChatModel):
        async def stream(self, request: Any) -> Any:
            loop = asyncio.get_running_loop()
            due = loop.time()
            for _ in range(tokens):
                due += interval
                await asyncio.sleep(due - loop.time() if interval else 0)
                yield TextDelta(f"@{time.monotonic_ns()} ")
            yield FinishDelta(None, "stop", {}, None)

    return create_agent(TokenModel(), name="tokens")


class Counter:
    """A connection that takes every write and keeps only its length (as a socket that always takes them), standing
    for uvicorn's: a ``BodyWriter`` in the request's scope, which ``StreamingBody`` writes pushed chunks to."""

    def __init__(self) -> None:
        self.chunks = 0
        self.bytes = 0

    def write(self, chunk: bytes) -> bool:
        self.chunks += 1
        self.bytes += len(chunk)
        return True

    async def send(self, message: dict[str, Any]) -> None:  # the response's start and end
        self.bytes += len(message.get("body", b""))


async def _never(loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    await loop.create_future()  # the client never leaves
    raise AssertionError


async def stream_one(rt: Any, counter: Counter) -> None:
    """One client's run, as the server streams it (``server/runs.py``'s ``stream_run``, then its response)."""
    from backchannel.server.connections import BODY_WRITER
    from backchannel.server.sse import PushedChunks, StreamingBody, push_parts

    parts = rt.runs.stream(None, "tokens", input={"messages": [{"role": "user", "content": "go"}]},
                           stream_mode=["messages-tuple"], if_not_exists="create")
    created: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    chunks = PushedChunks(lambda write: push_parts(parts, write, with_id=False, created=created))
    await chunks.until(created)
    response = StreamingBody(chunks, media_type="text/event-stream", heartbeat=15.0, patience=30.0)
    loop = asyncio.get_running_loop()
    await response({BODY_WRITER: counter}, lambda: _never(loop), counter.send)


async def profile_runs(directory: str, tokens: int, *, profiled: bool = True) -> dict[str, int]:
    """Calls by function over ``RUNS`` runs of ``tokens`` tokens streamed at once (without ``profiled``, only the
    runs: nothing counted)."""
    from backchannel.runtime import LocalRuntime

    async with LocalRuntime(f"sqlite:///{directory}/calls-{tokens}.db",
                            agents={"tokens": token_agent(tokens, 0)}) as rt:
        counter = Counter()
        await asyncio.gather(*(stream_one(rt, counter) for _ in range(2)))  # warm: imports, caches
        profile = cProfile.Profile()
        if profiled:
            profile.enable()
        await asyncio.gather(*(stream_one(rt, counter) for _ in range(RUNS)))
        profile.disable()
    counts: dict[str, int] = {}
    for entry in profile.getstats():  # not pstats: it keeps one of the functions of the same file, line and name
        name = _name(entry.code)  # (a dataclass's __init__, a named tuple's __new__: all "<string>")
        counts[name] = counts.get(name, 0) + entry.callcount
    return counts


def calls_per_token(directory: str) -> dict[str, Any]:
    """Calls one token costs, by function: the counts of runs of 2T tokens less those of runs of T."""
    before = asyncio.run(profile_runs(directory, TOKENS))
    after = asyncio.run(profile_runs(directory, 2 * TOKENS))
    extra = RUNS * TOKENS
    per_token = {name: (after.get(name, 0) - before.get(name, 0)) / extra for name in set(before) | set(after)}
    per_token = {name: n for name, n in per_token.items() if n >= 0.05}
    python = {name: n for name, n in per_token.items() if not name.startswith("~")}
    return {"calls": round(sum(per_token.values()), 2), "python_calls": round(sum(python.values()), 2),
            "by_function": dict(sorted(per_token.items(), key=lambda item: -item[1]))}


def _name(code: Any) -> str:
    if isinstance(code, str):
        return f"~{code}"  # a builtin: "~<method 'append' of 'list' objects>"
    filename, marker = code.co_filename, "/backchannel/"
    path = filename[filename.rindex(marker) + 1:] if marker in filename else Path(filename).name
    return f"{path}:{code.co_firstlineno}({code.co_name})"


async def cpu_per_token(directory: str, clients: int, window: float) -> dict[str, Any]:
    """``clients`` streams of runs one after another, tokens every 20 ms: the CPU per token over ``window`` s."""
    from backchannel.runtime import LocalRuntime

    gc.collect()
    gc.freeze()  # as `backchannel serve` does
    gc.set_threshold(50_000)
    counter = Counter()
    stop = False

    async def client(delay: float) -> None:
        await asyncio.sleep(delay)
        while not stop:
            await stream_one(rt, counter)

    async with LocalRuntime(f"sqlite:///{directory}/cpu.db", agents={"tokens": token_agent(TOKENS, INTERVAL)},
                            max_concurrency=clients) as rt:
        await stream_one(rt, counter)
        tasks = [asyncio.ensure_future(client(i * TOKENS * INTERVAL / clients)) for i in range(clients)]
        await asyncio.sleep(TOKENS * INTERVAL + 1.0)  # every client has a run going
        chunks, cpu, wall = counter.chunks, time.process_time(), time.monotonic()
        await asyncio.sleep(window)
        chunks, cpu, wall = counter.chunks - chunks, time.process_time() - cpu, time.monotonic() - wall
        stop = True
        await asyncio.gather(*tasks)
    return {"clients": clients, "tokens": chunks, "cpu_us_per_token": cpu / chunks * 1e6,
            "core_share": cpu / wall, "tokens_per_second": chunks / wall}


def render(results: dict[str, Any], out: Any) -> None:
    calls = results["calls"]
    print(f"\nA streamed token's path in process (messages-tuple, {RUNS} runs of {TOKENS} and {2 * TOKENS} tokens):",
          file=out)
    print(f"calls per token: {calls['calls']} ({calls['python_calls']} of Python functions)", file=out)
    for name, n in list(calls["by_function"].items())[:SHOWN]:
        print(f"  {n:6.2f}  {name}", file=out)
    cpu = results.get("cpu")
    if cpu:
        print(f"\nCPU per token, {cpu['clients']:,} streams of a token every {INTERVAL * 1000:.0f} ms: "
              f"{cpu['cpu_us_per_token']:.2f} µs ({cpu['tokens_per_second']:,.0f} tokens/s, "
              f"{cpu['core_share']:.2f} of a core)", file=out)


def use_uvloop() -> None:
    """The event loop ``backchannel serve`` runs on (uvicorn's choice): uvloop when installed."""
    try:
        import uvloop
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, "a 4 s window instead of 10 s")
    parser.add_argument("--clients", type=int, default=1000, help="streams at once for the CPU per token")
    parser.add_argument("--calls-only", action="store_true", help="only the calls per token")
    parser.add_argument("--workload", type=int, metavar="TOKENS",
                        help=f"only run {RUNS} runs of TOKENS tokens, unprofiled (for callgrind: run it with T and 2T)")
    args = parser.parse_args(argv)
    use_uvloop()
    if args.workload:
        with tempfile.TemporaryDirectory(prefix="bench-stream-path-") as directory:
            asyncio.run(profile_runs(directory, args.workload, profiled=False))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-stream-path-") as directory:
        results: dict[str, Any] = {"calls": calls_per_token(directory)}
        if not args.calls_only:
            results["cpu"] = asyncio.run(cpu_per_token(directory, args.clients, 4.0 if args.quick else 10.0))
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
