"""Runtime costs: backchannel's LocalRuntime against LangChain's agent on a LangGraph checkpointer.

What is measured (zero-latency scripted models, so only the harness and its storage are timed):

* throughput: runs per second of a one-step agent (the model answers at once, no tools) when
  ``THREADS`` runs on fresh threads are started together and awaited, in memory and on SQLite;
* step overhead with SQLite checkpointing: µs per step (one model call + its tool call) of an
  N = 50 step run on a fresh thread, every step checkpointed to a SQLite file;
* database size: bytes on disk after one 200-step run on a fresh SQLite file, once the WAL
  has been checkpointed into the database.

backchannel runs through ``LocalRuntime`` (``store="memory"`` or ``"sqlite:///file"``).
LangChain's ``create_agent`` runs with LangGraph's ``InMemorySaver`` or ``AsyncSqliteSaver``
(``langgraph-checkpoint-sqlite``) when importable, with the scripted chat model of
``step_overhead.py``. Usage::

    python bench/runtime.py [--quick] [--json]

``--json`` prints one JSON document on stdout (the tables go to stderr).
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import asdict, dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts, not a package)
from step_overhead import (  # noqa: E402
    LANGGRAPH_CONFIG,
    PROMPT,
    STEPS_PER_SAMPLE,
    Stats,
    _langchain_kit,
    _progress,
    versions,
)

THREADS = 1_000  # runs started at once in the throughput workload
WARMUP_RUNS = 20  # runs on the same store before a throughput sample is timed
STEP_N = 50
SIZE_N = 200
STORES = ("memory", "sqlite")
FRAMEWORKS = ("backchannel", "langchain")
DISTRIBUTIONS = ("backchannel", "langchain", "langchain-core", "langgraph", "langgraph-checkpoint",
                 "langgraph-checkpoint-sqlite", "aiosqlite")

TARGETS = {
    "step_speedup_at_50": 20.0,  # langchain µs/step ÷ backchannel µs/step, at least
    "db_size_fraction": 0.2,  # backchannel bytes ÷ langgraph bytes, at most
}


@dataclass
class Settings:
    """How hard to measure; ``--quick`` uses the small numbers."""

    throughput_repeats: int
    step_repeats: int

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        return cls(2, 3) if quick else cls(5, 9)


@dataclass
class Session:
    """An agent with ``tool_calls`` scripted tool calls, on an open store."""

    run: Callable[[str], Awaitable[list[Any]]]  # thread id -> the run's final messages
    run_many: Callable[[list[str]], Awaitable[list[list[Any]]]]  # all threads at once


# A store is "memory" or the path of a SQLite file; (store, tool_calls) -> an open session.
Opener = Callable[[str, int], AbstractAsyncContextManager[Session]]


# -- backchannel ----------------------------------------------------------------------------


@asynccontextmanager
async def backchannel_session(store: str, tool_calls: int) -> AsyncIterator[Session]:
    import backchannel as bc
    from backchannel.runtime import LocalRuntime

    @bc.tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    script: list[Any] = [{"tool_calls": [{"name": "echo", "args": {"x": i}}]} for i in range(tool_calls)]
    model = bc.ScriptedModel([*script, "done"], loop=True)
    agent = bc.create_agent(model, [echo], max_iterations=tool_calls + 1)
    url = "memory" if store == "memory" else f"sqlite:///{store}"
    async with LocalRuntime(url, agents={"agent": agent}) as rt:

        async def run(thread_id: str) -> list[Any]:
            return (await agent.ainvoke(PROMPT, thread_id=thread_id))["messages"]

        async def run_many(thread_ids: list[str]) -> list[list[Any]]:
            runs = await asyncio.gather(*(rt.runs.create(t, "agent", input=PROMPT, if_not_exists="create")
                                          for t in thread_ids))
            results = await asyncio.gather(*(rt.runs.join(r["thread_id"], r["run_id"]) for r in runs))
            return [r["messages"] for r in results]

        yield Session(run, run_many)


# -- LangChain create_agent + LangGraph checkpointer ----------------------------------------


@asynccontextmanager
async def langgraph_saver(store: str) -> AsyncIterator[Any]:
    if store == "memory":
        from langgraph.checkpoint.memory import InMemorySaver

        yield InMemorySaver()
    else:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(store) as saver:
            yield saver


@asynccontextmanager
async def langchain_session(store: str, tool_calls: int) -> AsyncIterator[Session]:
    from langchain.agents import create_agent

    model_class, echo = _langchain_kit()
    async with langgraph_saver(store) as saver:
        agent = create_agent(model_class(tool_calls=tool_calls), [echo], checkpointer=saver)

        def config(thread_id: str) -> Any:
            return {**LANGGRAPH_CONFIG, "configurable": {"thread_id": thread_id}}

        async def run(thread_id: str) -> list[Any]:
            return (await agent.ainvoke(PROMPT, config=config(thread_id)))["messages"]

        async def run_many(thread_ids: list[str]) -> list[list[Any]]:
            results = await asyncio.gather(*(agent.ainvoke(PROMPT, config=config(t)) for t in thread_ids))
            return [r["messages"] for r in results]

        yield Session(run, run_many)


def load_frameworks() -> dict[str, Opener | str]:
    """Each framework's session opener, or why it is unavailable ("not installed")."""
    found: dict[str, Opener | str] = {"backchannel": backchannel_session}
    try:
        import langchain.agents  # noqa: F401
        import langgraph.checkpoint.sqlite.aio  # noqa: F401
    except ImportError:
        found["langchain"] = "not installed"
    else:
        found["langchain"] = langchain_session
    return found


# -- measurements -------------------------------------------------------------------------------


def _field(message: Any, name: str) -> Any:
    """A message attribute, whether the message is an object or (from ``runs.join``) a dict."""
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _check(messages: list[Any], n: int, name: str) -> None:
    """Make sure a run did what it should: n tool results, then the answer."""
    tool_results = sum(1 for m in messages if _field(m, "type") == "tool")
    answer = _field(messages[-1], "content")
    if tool_results != n or answer != "done":
        raise AssertionError(f"{name}: expected {n} tool results and 'done', "
                             f"got {tool_results} and {answer!r}")


def _thread_ids(count: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(count)]


def _store_in(directory: str, kind: str) -> str:
    return "memory" if kind == "memory" else os.path.join(directory, "state.db")


async def measure_throughput(name: str, opener: Opener, kind: str, repeats: int) -> Stats:
    """Seconds to finish ``THREADS`` one-step runs started together, each sample on a fresh store
    warmed up with ``WARMUP_RUNS`` runs.

    The runs share one scripted model; with no tool calls its script is the answer alone, so
    its cursor cannot hand one run another's reply.
    """
    samples = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as directory:
            async with opener(_store_in(directory, kind), 0) as session:
                for messages in await session.run_many(_thread_ids(WARMUP_RUNS)):
                    _check(messages, 0, name)
                threads = _thread_ids(THREADS)
                gc.collect()
                start = time.perf_counter_ns()
                results = await session.run_many(threads)
                samples.append((time.perf_counter_ns() - start) / 1e9)
            for messages in results:
                _check(messages, 0, name)
    return Stats.of(samples)


async def measure_sqlite_steps(name: str, opener: Opener, n: int, repeats: int) -> Stats:
    """µs per step of n-step runs, each on a fresh thread of one SQLite file, after a warm-up run.

    A sample times back-to-back runs covering about ``STEPS_PER_SAMPLE`` steps, as in
    ``step_overhead.py``.
    """
    runs = max(1, STEPS_PER_SAMPLE // n)
    samples = []
    with tempfile.TemporaryDirectory() as directory:
        async with opener(_store_in(directory, "sqlite"), n) as session:
            _check(await session.run(str(uuid.uuid4())), n, name)
            gc.collect()
            for _ in range(repeats):
                threads = _thread_ids(runs)
                start = time.perf_counter_ns()
                for thread_id in threads:
                    await session.run(thread_id)
                samples.append((time.perf_counter_ns() - start) / 1_000 / (runs * n))
    return Stats.of(samples)


def sqlite_footprint(path: str) -> int:
    """Bytes of a SQLite database on disk once its WAL is folded in (db + any -wal/-shm left)."""
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        db.close()
    return sum(os.path.getsize(path + suffix) for suffix in ("", "-wal", "-shm")
               if os.path.exists(path + suffix))


async def measure_db_size(name: str, opener: Opener, n: int) -> int:
    """Bytes of a fresh SQLite file after one n-step run, the store closed and its WAL checkpointed."""
    with tempfile.TemporaryDirectory() as directory:
        path = _store_in(directory, "sqlite")
        async with opener(path, n) as session:
            _check(await session.run(str(uuid.uuid4())), n, name)
        return sqlite_footprint(path)


# -- the whole run ----------------------------------------------------------------------------------


async def run_benchmarks(settings: Settings) -> dict[str, Any]:
    frameworks = load_frameworks()
    throughput: dict[str, dict[str, Stats | str]] = {name: {} for name in frameworks}
    steps: dict[str, Stats | str] = {}
    size: dict[str, int | str] = {}
    for name, opener in frameworks.items():
        for kind in STORES:
            if isinstance(opener, str):
                throughput[name][kind] = opener
            else:
                _progress(f"throughput: {name} {kind}")
                throughput[name][kind] = await measure_throughput(name, opener, kind,
                                                                  settings.throughput_repeats)
        if isinstance(opener, str):
            steps[name] = size[name] = opener
            continue
        _progress(f"steps on SQLite: {name} N={STEP_N}")
        steps[name] = await measure_sqlite_steps(name, opener, STEP_N, settings.step_repeats)
        _progress(f"database size: {name} N={SIZE_N}")
        size[name] = await measure_db_size(name, opener, SIZE_N)
    return {"throughput_seconds": throughput, "sqlite_step_us": steps, "db_bytes": size}


# -- reporting ----------------------------------------------------------------------------------------


def runs_per_second(seconds: Stats | str) -> Stats | str:
    """Seconds per ``THREADS`` runs as runs/s (the best sample is the fastest)."""
    if isinstance(seconds, str):
        return seconds
    return Stats(THREADS / seconds.best, THREADS / seconds.median)


def _fmt(value: Stats | int | str, digits: int = 1) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Stats):
        return f"{value.best:,.{digits}f} / {value.median:,.{digits}f}"
    return f"{value:,}"


def _ratio(numerator: Stats | int | str, denominator: Stats | int | str) -> float | None:
    def best(value: Stats | int | str) -> float | None:
        return None if isinstance(value, str) else value.best if isinstance(value, Stats) else float(value)

    top, bottom = best(numerator), best(denominator)
    return None if top is None or not bottom else top / bottom


def _fmt_ratio(ratio: float | None, digits: int = 1) -> str:
    return "-" if ratio is None else f"{ratio:,.{digits}f}x"


def target_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """backchannel's figures against the targets of the issue (n/a when the peer is not installed)."""
    steps, size = results["sqlite_step_us"], results["db_bytes"]
    figures = {"step_speedup_at_50": (_ratio(steps["langchain"], steps["backchannel"]), "min"),
               "db_size_fraction": (_ratio(size["backchannel"], size["langchain"]), "max")}
    return [{"name": name, "value": value, "target": TARGETS[name], "kind": kind,
             "met": _meets(value, TARGETS[name], kind)} for name, (value, kind) in figures.items()]


def _meets(value: float | None, target: float, kind: str) -> bool | None:
    if value is None:
        return None
    return value >= target if kind == "min" else value <= target


def render_throughput(results: dict[str, Any], out: Any) -> None:
    rates = results["throughput_runs_per_s"]
    print(f"\nthroughput: runs/s, {THREADS:,} one-step runs on fresh threads started at once, "
          f"best / median of {results['settings']['throughput_repeats']} samples "
          f"(python {results['python']}, {results['mode']} mode)", file=out)
    print("backchannel: runs.create on every thread, then runs.join on every run; "
          "langchain: asyncio.gather of ainvoke\n", file=out)
    header = f"{'store':<8} | {'backchannel':>19} | {'langchain':>19} | {'bc/lc':>7}"
    print(header, "-" * len(header), sep="\n", file=out)
    for kind in STORES:
        bc, lc = rates["backchannel"][kind], rates["langchain"][kind]
        print(f"{kind:<8} | {_fmt(bc, 0):>19} | {_fmt(lc, 0):>19} | {_fmt_ratio(_ratio(bc, lc)):>7}", file=out)
    print("(memory: backchannel store='memory', langgraph InMemorySaver; sqlite: a file in a temp dir, "
          "langgraph AsyncSqliteSaver)", file=out)


def render_steps(results: dict[str, Any], out: Any) -> None:
    steps = results["sqlite_step_us"]
    bc, lc = steps["backchannel"], steps["langchain"]
    print(f"\nstep overhead with SQLite checkpointing: µs per step at N={STEP_N}, best / median of "
          f"{results['settings']['step_repeats']} samples", file=out)
    print("a step = one model call + its tool call; each run's final answer call is included\n", file=out)
    header = f"{'backchannel':>17} | {'langchain':>19} | {'lc/bc':>7}"
    print(header, "-" * len(header), sep="\n", file=out)
    print(f"{_fmt(bc):>17} | {_fmt(lc):>19} | {_fmt_ratio(_ratio(lc, bc)):>7}", file=out)


def render_size(results: dict[str, Any], out: Any) -> None:
    size = results["db_bytes"]
    bc, lc = size["backchannel"], size["langchain"]
    print(f"\ndatabase size after one {SIZE_N}-step run on a fresh SQLite file (WAL checkpointed)\n", file=out)
    header = f"{'':<12} | {'bytes':>13} | {'bytes/step':>11}"
    print(header, "-" * len(header), sep="\n", file=out)
    for name, value in (("backchannel", bc), ("langchain", lc)):
        per_step = "-" if isinstance(value, str) else f"{value / SIZE_N:,.0f}"
        print(f"{name:<12} | {_fmt(value):>13} | {per_step:>11}", file=out)
    print(f"backchannel / langgraph: {_fmt_ratio(_ratio(bc, lc), 3)}", file=out)


def render_targets(checks: list[dict[str, Any]], out: Any) -> None:
    labels = {"step_speedup_at_50": f"SQLite step speed-up, N={STEP_N}",
              "db_size_fraction": f"db size vs langgraph, N={SIZE_N}"}
    print("\nbackchannel against its targets", file=out)
    for check in checks:
        status = "n/a " if check["met"] is None else "OK  " if check["met"] else "MISS"
        value = "n/a" if check["value"] is None else f"{check['value']:,.3f}x"
        bound = ">=" if check["kind"] == "min" else "<="
        print(f"  {status} {labels[check['name']]:<32} {value:>10} "
              f"(target {bound} {check['target']:g}x)", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(__doc__, "fewer repeats").parse_args(argv)
    settings = Settings.for_mode(args.quick)
    results = asyncio.run(run_benchmarks(settings))
    results.update(mode="quick" if args.quick else "full", settings=asdict(settings), threads=THREADS,
                   python=platform.python_version(), versions=versions(DISTRIBUTIONS), targets=TARGETS)
    results["throughput_runs_per_s"] = {
        name: {kind: runs_per_second(results["throughput_seconds"][name][kind]) for kind in STORES}
        for name in FRAMEWORKS}
    checks = target_checks(results)
    results["target_checks"] = checks
    emit_report(results, [render_throughput, render_steps, render_size,
                          lambda r, out: render_targets(checks, out)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
