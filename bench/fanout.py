"""Fan-out: a supervisor that starts K subagents at once, backchannel against Deep Agents.

What is measured (scripted models with simulated latency, so the critical path is known):

* background fan-out: a backchannel ``create_deep_agent`` supervisor with one background
  subagent, ``worker``, starts K tasks in one model reply (K ``start_async_task`` calls), then
  answers. Each worker makes 5 model calls of ``LATENCY`` (4 calls of a trivial async tool, then
  an answer). Wall time from the supervisor's run start until its model has seen all K
  completion notifications in its thread, K = 10, 100, 1000, in memory and (K = 1000) on
  SQLite, against the ideal (5 x ``LATENCY``) as a ratio; in both completion modes: ``notify``
  (the supervisor's run ends; completions wake its thread) and ``wait`` (its run stays open and
  takes completions in batches), with how many of its model calls it took to see them all, and
  (SQLite) the SQL statements per subagent, from its start to its notification taken in;
* memory per live subagent: with all K workers held mid-flight (each in its third tool call),
  bytes allocated since the fan-out began and still held (tracemalloc), and resident set growth
  (VmRSS), per subagent;
* synchronous fan-out: the supervisor calls ``task`` K times in one reply (K = 10, 100), same
  workers; backchannel's ``create_deep_agent`` against ``deepagents.create_deep_agent`` when
  importable, wall time of the whole run and the ratio.

The supervisor's model answers at once (no latency), so the ideal is the workers' 5 x 50 ms.
Usage::

    python bench/fanout.py [--quick] [--json] [--memory [--sqlite]]

``--json`` prints one JSON document on stdout (the tables go to stderr); ``--memory`` measures only the
memory per live subagent (a few seconds), with ``--sqlite`` on a SQLite file instead of in memory (the workers'
runs, threads and checkpoints are then rows on disk: tracemalloc sees only what the process holds of them).
"""

from __future__ import annotations

import asyncio
import gc
import os
import platform
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts, not a package)
from _peers import reply_chat_model  # noqa: E402
from step_overhead import LANGGRAPH_CONFIG, PROMPT, Stats, _langchain_kit, _progress, versions  # noqa: E402

KS = (10, 100, 1_000)
SQLITE_KS = (1_000,)
COMPLETIONS = ("notify", "wait")
SYNC_KS = (10, 100)
MEMORY_K = 1_000
WARMUP_K = 10  # a fan-out on the same runtime before each timed one
WORKER_TOOL_CALLS = 4  # then the answer: 5 model calls per worker
LATENCY = 0.05  # seconds per worker model call
IDEAL_S = (WORKER_TOOL_CALLS + 1) * LATENCY
MEMORY_SITES_SHOWN = 16  # files named in the breakdown of memory per live subagent
HOLD_AT = 2  # the memory run holds every worker in its tool call with x == HOLD_AT (the third)
TIMEOUT_S = 120.0

TARGETS = {  # wall time ÷ ideal, K = 1,000, at most
    "ratio_at_1000": 2.0,  # in memory, notify
    "wait_ratio_at_1000": 2.0,  # in memory, wait
    "sqlite_ratio_at_1000": 2.5,  # on SQLite, notify
    "sqlite_wait_ratio_at_1000": 3.0,  # on SQLite, wait
    "bytes_per_live_subagent": 8 * 1024,  # tracemalloc, at most (issue 22)
}


@dataclass
class Settings:
    """How hard to measure; ``--quick`` uses the small numbers."""

    repeats: int  # timed background fan-outs per K and store
    sync_repeats: int  # timed synchronous fan-outs per K and framework

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        return cls(2, 2) if quick else cls(5, 5)


# -- the script: what the supervisor and the workers reply (messages of either library) --------


def worker_reply(messages: Sequence[Any]) -> dict[str, Any] | str:
    """Call ``echo`` until it has ``WORKER_TOOL_CALLS`` results, then answer "done"."""
    results = sum(1 for m in messages if m.type == "tool")
    if results < WORKER_TOOL_CALLS:
        return {"tool_calls": [{"name": "echo", "args": {"x": results}}]}
    return "done"


def supervisor_reply(messages: Sequence[Any], k: int, tool: str) -> dict[str, Any] | str:
    """First ``k`` calls of ``tool`` (``start_async_task`` or ``task``) in one reply, then
    "done"."""
    if any(m.type == "ai" for m in messages):
        return "done"
    args = [{"description": f"job {i}", "subagent_type": "worker"} for i in range(k)]
    return {"tool_calls": [{"name": tool, "args": a} for a in args]}


def new_notifications(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The task notifications that arrived since the supervisor's last reply."""
    found = []
    for message in reversed(messages):
        if message.type == "ai":
            break
        note = message.additional_kwargs.get("task_notification")
        if note is not None:
            found.append(note)
    return found


# -- backchannel: background fan-out through LocalRuntime ---------------------------------------


@dataclass
class Probe:
    """One fan-out as the scripted models see it (times from ``time.perf_counter``)."""

    k: int
    hold: asyncio.Event | None = None  # workers wait in their HOLD_AT tool call for all K
    on_hold: Callable[[], None] | None = None  # called once, when the K-th worker gets there
    worker_calls: int = 0
    live: int = 0
    peak_live: int = 0
    held: int = 0
    last_answer: float = 0.0
    started: float = 0.0  # the K start_async_task calls had returned (the supervisor's 2nd call)
    notified: set[str] = field(default_factory=set)
    batches: int = 0  # supervisor model calls that brought notifications
    done: asyncio.Future[float] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())

    def worker(self, request: Any) -> dict[str, Any] | str:
        self.worker_calls += 1
        reply = worker_reply(request.messages)
        if len(request.messages) == 1:  # its first call: the task description only
            self.live += 1
            self.peak_live = max(self.peak_live, self.live)
        if reply == "done":
            self.live -= 1
            self.last_answer = time.perf_counter()
        return reply

    def supervisor(self, request: Any) -> dict[str, Any] | str:
        if not self.started and any(m.type == "tool" for m in request.messages):
            self.started = time.perf_counter()
        news = new_notifications(request.messages)
        self.batches += bool(news)
        self.notified.update(note["task_id"] for note in news)
        if len(self.notified) >= self.k and not self.done.done():
            self.done.set_result(time.perf_counter())
        return supervisor_reply(request.messages, self.k, "start_async_task")

    async def echo(self, x: int) -> int:
        if self.hold is not None and x == HOLD_AT:
            self.held += 1
            if self.held == self.k:
                if self.on_hold is not None:
                    self.on_hold()
                self.hold.set()
            await self.hold.wait()
        return x


class BackgroundFanOut:
    """A supervisor with the background subagent ``worker`` on a LocalRuntime.

    The scripted models and the tool answer through ``self.probe``, the current fan-out's.
    """

    def __init__(self, store: str, capacity: int, completion: str = "notify") -> None:
        import backchannel as bc
        from backchannel.runtime import LocalRuntime

        self.probe = Probe(0)

        @bc.tool
        async def echo(x: int) -> int:
            """Return x unchanged."""
            return await self.probe.echo(x)

        worker_model = bc.ScriptedModel([lambda request: self.probe.worker(request)], loop=True,
                                        latency=LATENCY)
        supervisor_model = bc.ScriptedModel([lambda request: self.probe.supervisor(request)],
                                            loop=True)
        worker = bc.SubAgent("worker", "Does one job.", system_prompt="Do the job.",
                             model=worker_model, tools=[echo], background=True)
        self.agent = bc.create_deep_agent(supervisor_model, subagents=[worker], general_purpose=False,
                                          max_concurrent_tasks=capacity, completion=completion)
        self.runtime = LocalRuntime(store, agents={"supervisor": self.agent},
                                    max_concurrency=capacity + 1)

    async def run(self, probe: Probe) -> float:
        """Seconds until the supervisor's model had seen all K notifications."""
        self.probe = probe
        thread_id = str(uuid.uuid4())
        start = time.perf_counter()
        await self.runtime.runs.create(thread_id, "supervisor", input=PROMPT, if_not_exists="create")
        notified = await asyncio.wait_for(probe.done, TIMEOUT_S)
        await self._settle(thread_id, probe)
        return notified - start

    async def _settle(self, thread_id: str, probe: Probe) -> None:
        """Wait for the supervisor's wake-up runs, then check that every task reported success."""
        rt = self.runtime
        for run in await rt.runs.list(thread_id, limit=1_000):
            await rt.runs.join(thread_id, run["run_id"])
        messages = (await rt.threads.get_state(thread_id))["values"]["messages"]
        notes = [m["additional_kwargs"]["task_notification"] for m in messages
                 if m.get("additional_kwargs", {}).get("task_notification")]
        ok = sum(1 for n in notes if n["status"] == "success")
        calls = probe.k * (WORKER_TOOL_CALLS + 1)
        if ok != probe.k or probe.worker_calls != calls:
            raise AssertionError(f"expected {probe.k} successful tasks and {calls} worker calls, "
                                 f"got {ok} and {probe.worker_calls}")


@dataclass
class FanOutSample:
    """One timed background fan-out, in seconds from the supervisor's run start."""

    started: float  # the supervisor's K start_async_task calls had returned
    last_answer: float  # the last worker answered
    notified: float  # the supervisor's model has seen all K notifications
    peak_live: int  # most workers alive at once
    batches: int  # supervisor model calls that brought notifications


async def fan_out_once(store: str, k: int, completion: str,
                       on_open: Callable[[Any], Any] = lambda storage: None) -> FanOutSample:
    """A fresh runtime, a warm-up fan-out, then one timed fan-out of k workers (``on_open(storage)``
    just before it)."""
    fan = BackgroundFanOut(store, max(k, WARMUP_K), completion)
    async with fan.runtime:
        await fan.run(Probe(WARMUP_K))
        gc.collect()
        probe = Probe(k)
        on_open(fan.runtime.storage)
        start = time.perf_counter()
        notified = await fan.run(probe)
        return FanOutSample(probe.started - start, probe.last_answer - start, notified, probe.peak_live,
                            probe.batches)


@dataclass
class FanOutStats:
    """Repeated background fan-outs: wall time to all notifications, and where it went."""

    notified: Stats
    started: Stats
    last_answer: Stats
    peak_live: int
    batches: int  # the most supervisor model calls any sample took to see all notifications

    @classmethod
    def of(cls, samples: Sequence[FanOutSample]) -> FanOutStats:
        return cls(Stats.of([s.notified for s in samples]), Stats.of([s.started for s in samples]),
                   Stats.of([s.last_answer for s in samples]), min(s.peak_live for s in samples),
                   max(s.batches for s in samples))


def _store(kind: str, directory: str) -> str:
    return "memory" if kind == "memory" else f"sqlite:///{os.path.join(directory, 'state.db')}"


async def measure_fan_out(kind: str, completion: str, k: int, repeats: int) -> FanOutStats:
    """``repeats`` fan-outs, each on a fresh store: ``"memory"``, or a SQLite file in a temp dir."""
    samples = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as directory:
            samples.append(await fan_out_once(_store(kind, directory), k, completion))
    return FanOutStats.of(samples)


async def count_statements(completion: str, k: int) -> float:
    """SQL statements per subagent in one SQLite fan-out of k (a run of its own: counting costs time)."""
    count = [0]

    def trace(storage: Any) -> None:
        storage.db.set_trace_callback(lambda statement: count.__setitem__(0, count[0] + 1))

    with tempfile.TemporaryDirectory() as directory:
        await fan_out_once(_store("sqlite", directory), k, completion, on_open=trace)
    return count[0] / k


# -- memory per live subagent -------------------------------------------------------------------


def rss_bytes() -> int | None:
    """This process's resident set size (VmRSS), or None where /proc is not there."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


@dataclass
class MemorySample:
    """Growth per live subagent with all K held mid-flight, over the warmed-up runtime before."""

    traced_bytes: float  # tracemalloc: allocated since the fan-out began and still held
    traced_peak_bytes: float  # tracemalloc: the peak from the fan-out's start until then
    collected_bytes: float  # tracemalloc, held after a full collection (see traced_memory)
    rss_bytes: float | None  # VmRSS growth without tracemalloc (rough: freed pages stay mapped)
    live: int
    by_file: dict[str, float] = field(default_factory=dict)  # tracemalloc's held bytes by where allocated
    store: str = "memory"  # where the runs were stored: "memory" or "sqlite"


async def held_fan_out(k: int, begin: Callable[[], Any], read: Callable[[], Any],
                       store: str = "memory") -> tuple[Any, int]:
    """A k-worker fan-out (after a warm-up) holding every worker mid-flight on ``store``: ``begin()`` as it
    starts, ``read()`` once all k are held; returns what ``read()`` gave and the live workers."""
    fan = BackgroundFanOut(store, max(k, WARMUP_K))
    taken: list[tuple[Any, int]] = []
    async with fan.runtime:
        await fan.run(Probe(WARMUP_K))
        gc.collect()
        probe = Probe(k, hold=asyncio.Event())
        probe.on_hold = lambda: taken.append((read(), probe.live))
        begin()
        await fan.run(probe)
    return taken[0]


async def measure_memory(k: int, kind: str = "memory") -> MemorySample:
    """Memory per live subagent with k held, in memory or (``kind="sqlite"``) on a fresh SQLite file."""
    base = [0]

    def rss_begin() -> None:
        base[0] = rss_bytes() or 0

    with tempfile.TemporaryDirectory() as directory:
        rss, live = await held_fan_out(k, rss_begin, lambda: (rss_bytes() or 0) - base[0], _store(kind, directory))
    try:  # tracing starts with the fan-out: it reports what was allocated since and is still held
        with tempfile.TemporaryDirectory() as directory:
            (traced, peak, collected, sites), live = await held_fan_out(k, tracemalloc.start, traced_memory,
                                                                        _store(kind, directory))
    finally:
        tracemalloc.stop()
    by_file = {name: size / live for name, size in sites.items()}
    return MemorySample(traced / live, peak / live, collected / live,
                        rss / live if rss_bytes() is not None else None, live, by_file, kind)


def traced_memory() -> tuple[int, int, int, dict[str, int]]:
    """tracemalloc's held and peak bytes, the held bytes after a full collection, and the held bytes by the file
    that allocated them (a module of backchannel by its name, the rest by file name), largest first.

    The held bytes count objects freed into CPython's free lists (tuples, up to 2,000 of each length, floats, lists,
    dicts) and cycles not yet collected, so a change that frees objects earlier can move them by a few hundred bytes
    a subagent either way; a full collection empties both, which leaves what the live workers really hold.
    """
    traced, peak = tracemalloc.get_traced_memory()
    sites: dict[str, int] = {}
    for stat in tracemalloc.take_snapshot().statistics("filename"):
        path = stat.traceback[0].filename
        name = path.split("backchannel/", 1)[1] if "backchannel/" in path else os.path.basename(path)
        sites[name] = sites.get(name, 0) + stat.size
    gc.collect()
    collected = tracemalloc.get_traced_memory()[0]
    return traced, peak, collected, dict(sorted(sites.items(), key=lambda item: -item[1]))


# -- synchronous fan-out: the `task` tool -------------------------------------------------------


def backchannel_sync(k: int) -> Callable[[], Any]:
    """A coroutine function running backchannel's supervisor through one k-way ``task`` fan-out."""
    import backchannel as bc

    @bc.tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    worker_model = bc.ScriptedModel([lambda request: worker_reply(request.messages)], loop=True,
                                    latency=LATENCY)
    supervisor_model = bc.ScriptedModel(
        [lambda request: supervisor_reply(request.messages, k, "task")], loop=True)
    worker = bc.SubAgent("worker", "Does one job.", system_prompt="Do the job.", model=worker_model,
                         tools=[echo])
    agent = bc.create_deep_agent(supervisor_model, subagents=[worker], general_purpose=False)
    return lambda: agent.ainvoke(PROMPT)


def _langchain_message(reply: dict[str, Any] | str, messages: Sequence[Any]) -> Any:
    """A script reply as a LangChain ``AIMessage`` (call ids unique within the conversation)."""
    from langchain_core.messages import AIMessage

    if isinstance(reply, str):
        return AIMessage(content=reply)
    calls = [{**call, "id": f"call_{len(messages)}_{i}", "type": "tool_call"}
             for i, call in enumerate(reply["tool_calls"])]
    return AIMessage(content="", tool_calls=calls)


def deepagents_sync(k: int) -> Callable[[], Any]:
    """The same fan-out with ``deepagents.create_deep_agent`` and its ``task`` tool."""
    from deepagents import create_deep_agent

    _, echo = _langchain_kit()
    worker_model = reply_chat_model(lambda ms: _langchain_message(worker_reply(ms), ms),
                                    latency=LATENCY)
    supervisor_model = reply_chat_model(
        lambda ms: _langchain_message(supervisor_reply(ms, k, "task"), ms))
    worker = {"name": "worker", "description": "Does one job.", "system_prompt": "Do the job.",
              "model": worker_model, "tools": [echo]}
    agent = create_deep_agent(supervisor_model, subagents=[worker])
    return lambda: agent.ainvoke(PROMPT, config=LANGGRAPH_CONFIG)


def _check_sync(result: dict[str, Any], k: int, name: str) -> None:
    """The supervisor got k task results, each the worker's "done", and answered."""
    results = [m for m in result["messages"] if m.type == "tool"]
    answers = sum(1 for m in results if "done" in str(m.content))
    if len(results) != k or answers != k or result["messages"][-1].content != "done":
        raise AssertionError(f"{name}: expected {k} task results 'done' and the answer, got "
                             f"{len(results)} results ({answers} 'done')")


async def measure_sync(name: str, build: Callable[[int], Callable[[], Any]], k: int,
                       repeats: int) -> Stats:
    """Seconds per k-way ``task`` fan-out, after one warm-up run."""
    run = build(k)
    _check_sync(await run(), k, name)
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter()
        await run()
        samples.append(time.perf_counter() - start)
    return Stats.of(samples)


def load_sync_frameworks() -> dict[str, Callable[[int], Callable[[], Any]] | str]:
    """Each framework's fan-out builder, or why it is unavailable ("not installed")."""
    found: dict[str, Callable[[int], Callable[[], Any]] | str] = {"backchannel": backchannel_sync}
    try:
        import deepagents  # noqa: F401
    except ImportError:
        found["deepagents"] = "not installed"
    else:
        found["deepagents"] = deepagents_sync
    return found


# -- the whole run ------------------------------------------------------------------------------


async def run_benchmarks(settings: Settings) -> dict[str, Any]:
    _progress(f"memory: K={MEMORY_K} held mid-flight")
    memory = await measure_memory(MEMORY_K)
    background: dict[str, dict[str, dict[int, FanOutStats]]] = {
        kind: {completion: {} for completion in COMPLETIONS} for kind in ("memory", "sqlite")}
    for kind, ks in (("memory", KS), ("sqlite", SQLITE_KS)):
        for k in ks:
            for completion in COMPLETIONS:
                _progress(f"background fan-out: {kind} K={k} {completion}")
                background[kind][completion][k] = await measure_fan_out(kind, completion, k, settings.repeats)
    statements = {}
    for completion in COMPLETIONS:
        _progress(f"SQL statements per subagent: K={SQLITE_KS[-1]} {completion}")
        statements[completion] = await count_statements(completion, SQLITE_KS[-1])
    sync: dict[str, dict[int, Stats | str]] = {}
    for name, build in load_sync_frameworks().items():
        sync[name] = {}
        for k in SYNC_KS:
            if isinstance(build, str):
                sync[name][k] = build
            else:
                _progress(f"task fan-out: {name} K={k}")
                sync[name][k] = await measure_sync(name, build, k, settings.sync_repeats)
    return {"background": background, "sql_statements_per_subagent": statements, "memory": memory, "sync": sync}


# -- reporting ----------------------------------------------------------------------------------


def _ms(value: Stats) -> str:
    return f"{value.best * 1000:,.0f} / {value.median * 1000:,.0f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}x"


def _kib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 1024:,.1f}"


def render_background(results: dict[str, Any], out: Any) -> None:
    print(f"\nbackground fan-out: ms from the supervisor's run start until its model has seen all "
          f"K notifications, best / median of {results['settings']['repeats']} samples "
          f"(python {results['python']}, {results['cpus']} cpus, {results['mode']} mode)", file=out)
    print(f"each worker: {WORKER_TOOL_CALLS + 1} model calls of {LATENCY * 1000:.0f} ms; ideal "
          f"{IDEAL_S * 1000:.0f} ms. notify: the supervisor's run ends and completions wake it; wait: "
          "its run stays open. started = its K start_async_task calls returned; last answer = the last "
          "worker's final model call; calls = the supervisor's model calls that brought notifications "
          "(most of any sample)\n", file=out)
    header = (f"{'store':<7} | {'mode':<6} | {'K':>5} | {'all notified ms':>17} | {'x ideal':>7} | "
              f"{'started ms':>13} | {'last answer ms':>15} | {'peak live':>9} | {'calls':>5}")
    print(header, "-" * len(header), sep="\n", file=out)
    for kind, by_mode in results["background"].items():
        ks = sorted({k for by_k in by_mode.values() for k in by_k})
        for k in ks:
            for mode, by_k in by_mode.items():
                st = by_k[k]
                print(f"{kind:<7} | {mode:<6} | {k:>5,} | {_ms(st.notified):>17} | "
                      f"{_x(st.notified.best / IDEAL_S):>7} | {_ms(st.started):>13} | "
                      f"{_ms(st.last_answer):>15} | {st.peak_live:>9,} | {st.batches:>5,}", file=out)
    statements = results["sql_statements_per_subagent"]
    print(f"\nSQL statements per subagent on SQLite (K={SQLITE_KS[-1]:,}, from its start to its "
          "notification taken in): " + ", ".join(f"{mode} {n:.1f}" for mode, n in statements.items()),
          file=out)


def render_memory(results: dict[str, Any], out: Any) -> None:
    mem: MemorySample = results["memory"]
    where = "in memory" if mem.store == "memory" else "on SQLite"
    print(f"\nmemory per live subagent: {mem.live:,} workers held mid-flight {where} (each in its tool "
          f"call x={HOLD_AT}, after {HOLD_AT + 1} model calls); growth over the warmed-up "
          "runtime\n", file=out)
    rows = (("tracemalloc, held at that moment", mem.traced_bytes),
            ("tracemalloc, peak until then", mem.traced_peak_bytes),
            ("tracemalloc, after gc.collect()", mem.collected_bytes),
            ("VmRSS growth (no tracemalloc)", mem.rss_bytes))
    for label, value in rows:
        print(f"  {label:<34} {_kib(value):>8} KiB per subagent", file=out)
    largest = list(mem.by_file.items())[:MEMORY_SITES_SHOWN]
    print("  held, by the file that allocated it (bytes per subagent): "
          + ", ".join(f"{name} {size:,.0f}" for name, size in largest), file=out)


def render_sync(results: dict[str, Any], out: Any) -> None:
    sync = results["sync"]
    print(f"\ntask fan-out: ms per run, the supervisor calls `task` K times in one reply, best / "
          f"median of {results['settings']['sync_repeats']} samples; "
          f"ideal {IDEAL_S * 1000:.0f} ms\n", file=out)
    header = (f"{'K':>5} | {'backchannel':>13} | {'x ideal':>7} | {'deepagents':>13} | "
              f"{'x ideal':>7} | {'da/bc':>7} | {'da/bc beyond ideal':>18}")
    print(header, "-" * len(header), sep="\n", file=out)
    for k in SYNC_KS:
        bc, da = sync["backchannel"][k], sync["deepagents"][k]
        if isinstance(da, str):
            da_text, da_x, ratio, beyond = da, "-", "-", "-"
        else:
            da_text, da_x, ratio = _ms(da), _x(da.best / IDEAL_S), _x(da.best / bc.best)
            ours = bc.best - IDEAL_S
            beyond = _x((da.best - IDEAL_S) / ours) if ours > 0 else "-"
        print(f"{k:>5,} | {_ms(bc):>13} | {_x(bc.best / IDEAL_S):>7} | {da_text:>13} | {da_x:>7} | "
              f"{ratio:>7} | {beyond:>18}", file=out)
    print("(beyond ideal: wall time minus the ideal, the harness's own cost; ratios of best times)",
          file=out)


def target_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """backchannel's figures against the targets of the issue."""
    background = results["background"]
    figures = {"ratio_at_1000": background["memory"]["notify"][1_000].notified.best / IDEAL_S,
               "wait_ratio_at_1000": background["memory"]["wait"][1_000].notified.best / IDEAL_S,
               "sqlite_ratio_at_1000": background["sqlite"]["notify"][1_000].notified.best / IDEAL_S,
               "sqlite_wait_ratio_at_1000": background["sqlite"]["wait"][1_000].notified.best / IDEAL_S,
               "bytes_per_live_subagent": results["memory"].traced_bytes}
    return [{"name": name, "value": value, "target": TARGETS[name], "met": value <= TARGETS[name]}
            for name, value in figures.items()]


def render_targets(checks: list[dict[str, Any]], out: Any) -> None:
    labels = {"ratio_at_1000": ("background K=1,000 vs ideal (best)", "x", 1),
              "wait_ratio_at_1000": ("... completion='wait'", "x", 1),
              "sqlite_ratio_at_1000": ("... on SQLite", "x", 1),
              "sqlite_wait_ratio_at_1000": ("... on SQLite, completion='wait'", "x", 1),
              "bytes_per_live_subagent": ("memory per live subagent", "KiB", 1024)}
    print("\nbackchannel against its targets", file=out)
    for check in checks:
        label, unit, scale = labels[check["name"]]
        print(f"  {'OK  ' if check['met'] else 'MISS'} {label:<36} {check['value'] / scale:>8,.2f} "
              f"{unit:<3} (target <= {check['target'] / scale:g} {unit})", file=out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments(__doc__, "fewer repeats")
    parser.add_argument("--memory", action="store_true", help="measure only the memory per live subagent")
    parser.add_argument("--sqlite", action="store_true", help="with --memory: the runs on a SQLite file")
    args = parser.parse_args(argv)
    if args.memory:
        memory = asyncio.run(measure_memory(MEMORY_K, "sqlite" if args.sqlite else "memory"))
        emit_report({"memory": memory}, [render_memory], args.json)
        return 0
    settings = Settings.for_mode(args.quick)
    results = asyncio.run(run_benchmarks(settings))
    results.update(mode="quick" if args.quick else "full", settings=asdict(settings),
                   python=platform.python_version(), cpus=os.cpu_count(), ideal_s=IDEAL_S,
                   latency_s=LATENCY, versions=versions(), targets=TARGETS)
    checks = target_checks(results)
    results["target_checks"] = checks
    emit_report(results, [render_background, render_memory, render_sync,
                          lambda r, out: render_targets(checks, out)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
