"""Harness overhead: backchannel against LangChain's and Deep Agents' agents, in one run.

What is measured (zero-latency scripted models, so only the harness is timed):

* step overhead: one agent whose model calls a trivial tool ``echo(x: int) -> int`` N times and
  then answers; µs per step (one model call + its tool call), N = 10, 50, 200; with an async
  ``echo`` and with a sync one (which every framework runs in a worker thread; backchannel's
  ``@tool(inline=True)`` runs it on the event loop, measured too);
* tracing: µs per step (async tool, N = 50) with nothing recorded (``agent.ainvoke``), with the run's
  spans recorded (as in a runtime, which keeps them for the run's usage and timeline), and with
  OpenTelemetry on (its SDK with a batch span processor whose exporter encodes each batch to OTLP
  protobuf and drops it), measured in turns in one process by wall clock, process CPU and the event
  loop thread's CPU; the same with and without OpenTelemetry when model calls take 1 ms; the OTLP
  encoding's CPU per span; and what one bare SDK span costs here;
* construction: µs per ``create_agent(...)`` call, model and tools pre-built;
* retained memory: bytes per agent (tracemalloc) with many agents kept alive;
* import time: ``python -X importtime``, a fresh process each time.

LangChain (``langchain.agents.create_agent``) and Deep Agents (``deepagents.create_deep_agent``)
are measured when importable, each with a scripted LangChain chat model equivalent to
backchannel's ``ScriptedModel``. Usage::

    python bench/step_overhead.py [--quick] [--json]

``--json`` prints one JSON document on stdout (the tables go to stderr).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib.metadata
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from _cli import arguments, emit_report  # a sibling module, on the path beside this script

SIZES = (10, 50, 200)
STEPS_PER_SAMPLE = 200  # runs per timed sample: max(1, STEPS_PER_SAMPLE // N)
PROMPT: Any = {"messages": [{"role": "user", "content": "go"}]}
LANGGRAPH_CONFIG: Any = {"recursion_limit": 10_000}
FRAMEWORKS = ("backchannel", "langchain", "deepagents")
IMPORT_TARGETS = {"backchannel": "backchannel", "langchain": "langchain.agents", "deepagents": "deepagents"}
DISTRIBUTIONS = ("backchannel", "langchain", "langchain-core", "langgraph", "deepagents", "pydantic")

TOOL_KINDS = ("async", "sync", "inline")  # inline: backchannel's @tool(inline=True) sync tool

TARGETS = {
    "step_us_at_50": 50.0,
    "sync_step_us_at_50": 60.0,  # a trivial sync tool, run as documented for one: @tool(inline=True)
    "growth_10_to_200_pct": 20.0,
    "construct_us": 20.0,
    "bytes_per_agent": 8 * 1024,
    "import_ms": 100.0,
    "otel_added_us_at_50": 15.0,  # OpenTelemetry on (batch exporter) over nothing recorded, per step
}

Runner = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Settings:
    """How hard to measure; ``--quick`` uses the small numbers."""

    step_repeats: int
    build_iterations: int
    peer_build_iterations: int
    build_repeats: int
    memory_agents: int
    peer_memory_agents: int
    import_repeats: int

    @classmethod
    def for_mode(cls, quick: bool) -> Settings:
        if quick:
            return cls(3, 2_000, 10, 2, 2_000, 10, 3)
        return cls(9, 10_000, 50, 5, 10_000, 50, 7)


@dataclass
class Stats:
    """Best (min) and median of repeated measurements."""

    best: float
    median: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        return cls(min(samples), statistics.median(samples))


@dataclass
class ImportTime:
    """µs to import a module in a fresh process, and the part spent in its package's own modules."""

    total_us: int
    own_us: int


@dataclass
class Framework:
    """What the benchmark needs of one harness: runners for N tool steps, and a constructor."""

    name: str
    runners: dict[str, Callable[[int], Runner]]  # tool kind -> (N -> a coroutine function running
    # the N-step script once)
    build: Callable[[], Any]  # one agent, model and tools pre-built


# -- backchannel ----------------------------------------------------------------


def backchannel_framework() -> Framework:
    import backchannel as bc

    @bc.tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    def sync_echo(x: int) -> int:
        """Return x unchanged."""
        return x

    tools = {"async": echo, "sync": bc.tool(sync_echo, name="echo"),
             "inline": bc.tool(sync_echo, name="echo", inline=True)}

    def runner(kind: str) -> Callable[[int], Runner]:
        def run_n(n: int) -> Runner:
            script: list[Any] = [{"tool_calls": [{"name": "echo", "args": {"x": i}}]} for i in range(n)]
            model = bc.ScriptedModel([*script, "done"], loop=True)
            agent = bc.create_agent(model, [tools[kind]], max_iterations=n + 1)
            return lambda: agent.ainvoke(PROMPT)

        return run_n

    answer = bc.ScriptedModel(["done"], loop=True)
    return Framework("backchannel", {kind: runner(kind) for kind in TOOL_KINDS},
                     lambda: bc.create_agent(answer, [echo]))


# -- LangChain peers ---------------------------------------------------------------


@functools.cache
def _langchain_kit() -> tuple[type, Any]:
    """A scripted LangChain chat model class and the async ``echo`` tool (imported only when
    needed)."""
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from pydantic import Field

    class ScriptedChatModel(BaseChatModel):
        """Calls ``echo`` ``tool_calls`` times, then answers "done"; starts over after that."""

        tool_calls: int = 0
        cursor: list[int] = Field(default_factory=lambda: [0])

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def _reply(self) -> ChatResult:
            i = self.cursor[0]
            self.cursor[0] = (i + 1) % (self.tool_calls + 1)
            if i < self.tool_calls:
                call = {"name": "echo", "args": {"x": i}, "id": f"call_{i}", "type": "tool_call"}
                message = AIMessage(content="", tool_calls=[call])
            else:
                message = AIMessage(content="done")
            return ChatResult(generations=[ChatGeneration(message=message)])

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                      **kwargs: Any) -> ChatResult:
            return self._reply()

        async def _agenerate(self, messages: Any, stop: Any = None, run_manager: Any = None,
                             **kwargs: Any) -> ChatResult:
            return self._reply()

        def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
            return self

    @tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    return ScriptedChatModel, echo


@functools.cache
def _langchain_sync_echo() -> Any:
    """The ``echo`` tool on a sync function (LangChain runs it in a worker thread)."""
    from langchain_core.tools import tool

    @tool
    def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    return echo


def langchain_framework() -> Framework:
    from langchain.agents import create_agent

    return _langgraph_framework("langchain", create_agent)


def deepagents_framework() -> Framework:
    from deepagents import create_deep_agent

    return _langgraph_framework("deepagents", create_deep_agent)


def _langgraph_framework(name: str, create: Callable[..., Any]) -> Framework:
    """A LangGraph-based peer built by ``create(model, tools)`` with the scripted LangChain model."""
    model_class, echo = _langchain_kit()
    tools = {"async": echo, "sync": _langchain_sync_echo()}

    def runner(kind: str) -> Callable[[int], Runner]:
        def run_n(n: int) -> Runner:
            agent = create(model_class(tool_calls=n), [tools[kind]])
            return lambda: agent.ainvoke(PROMPT, config=LANGGRAPH_CONFIG)

        return run_n

    answer = model_class(tool_calls=0)
    return Framework(name, {kind: runner(kind) for kind in tools}, lambda: create(answer, [echo]))


def load_frameworks() -> dict[str, Framework | str]:
    """Each framework, or why it is unavailable ("not installed")."""
    loaders = {"backchannel": backchannel_framework, "langchain": langchain_framework,
               "deepagents": deepagents_framework}
    found: dict[str, Framework | str] = {}
    for name, load in loaders.items():
        try:
            found[name] = load()
        except ImportError:
            found[name] = "not installed"
    return found


# -- measurements -------------------------------------------------------------------


def _check(result: dict[str, Any], n: int, name: str) -> None:
    """Make sure a run did what it should: n tool results, then the answer."""
    messages = result["messages"]
    tool_results = sum(1 for m in messages if getattr(m, "type", None) == "tool")
    last = messages[-1]
    if tool_results != n or getattr(last, "content", None) != "done":
        raise AssertionError(f"{name}: expected {n} tool results and 'done', got {tool_results} "
                             f"and {getattr(last, 'content', None)!r}")


async def measure_steps(framework: Framework, kind: str, n: int, repeats: int) -> Stats:
    """µs per step with a ``kind`` tool over ``repeats`` samples, after one warm-up run.

    A sample times back-to-back runs covering about ``STEPS_PER_SAMPLE`` steps, so short
    scripts are not dominated by timer and cache noise. The collector stays on, as in real use.
    """
    run = framework.runners[kind](n)
    _check(await run(), n, framework.name)
    runs = max(1, STEPS_PER_SAMPLE // n)
    gc.collect()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        for _ in range(runs):
            await run()
        samples.append((time.perf_counter_ns() - start) / 1_000 / (runs * n))
    return Stats.of(samples)


TRACING_MODES = ("off", "recorded", "opentelemetry")
SLOW_MODEL_LATENCY = 0.001  # seconds a model call takes in the "slow model" comparison


@dataclass
class StepCost:
    """µs per step by clock: wall, the process's CPU (all its threads), the event loop's thread's CPU."""

    wall: Stats
    cpu: Stats
    loop_cpu: Stats


async def measure_tracing(repeats: int, n: int = 50) -> dict[str, Any]:
    """backchannel's µs per step (async tool) by tracing mode, sampled in turns in one process, by wall clock,
    process CPU and event-loop-thread CPU; the same with and without OpenTelemetry when each model call takes
    ``SLOW_MODEL_LATENCY`` (the loop waits, as on a real model); the µs the OTLP exporter's encoding takes per
    span in its thread; and what one bare OpenTelemetry SDK span (start + end) costs here, for scale. ``None``
    without the SDK."""
    try:
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    except ImportError:
        return {"modes": "opentelemetry-sdk not installed (pip install 'backchannel[otel]')"}
    import backchannel as bc
    from backchannel.agent import initial_state
    from backchannel.tracing import configure_tracing

    class EncodingExporter(SpanExporter):
        encoded = 0
        encode_ns = 0

        def export(self, spans: Any) -> SpanExportResult:
            start = time.thread_time_ns()
            encode_spans(spans).SerializeToString()  # what an OTLP exporter does before sending
            self.encode_ns += time.thread_time_ns() - start
            self.encoded += len(spans)
            return SpanExportResult.SUCCESS

    exporter = EncodingExporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))

    @bc.tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    def agent(latency: float = 0.0) -> Any:
        script: list[Any] = [{"tool_calls": [{"name": "echo", "args": {"x": i}}]} for i in range(n)]
        model = bc.ScriptedModel([*script, "done"], loop=True, latency=latency)
        return bc.create_agent(model, [echo], max_iterations=n + 1)

    fast, slow = agent(), agent(SLOW_MODEL_LATENCY)
    runners = {"off": lambda: fast.ainvoke(PROMPT),  # nothing reads the spans: none recorded
               "recorded": lambda: fast.run(initial_state(PROMPT), bc.RunContext("agent", "bench")),
               "opentelemetry": lambda: fast.ainvoke(PROMPT),
               "slow model": lambda: slow.ainvoke(PROMPT),
               "slow model, opentelemetry": lambda: slow.ainvoke(PROMPT)}
    samples: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in runners}
    try:
        for repeat in range(repeats):
            for mode, run in runners.items():
                if mode.startswith("slow") and repeat >= max(3, repeats // 3):
                    continue  # ~100 ms a sample: fewer
                configure_tracing(provider, enabled=mode.endswith("opentelemetry"))
                samples[mode].append(await _step_cost(run, max(1, STEPS_PER_SAMPLE // n), n + 1))
    finally:
        configure_tracing()
    provider.shutdown()
    tracer, spans, bare = TracerProvider().get_tracer("bench"), 500, []  # no processor: the SDK's span alone
    for _ in range(repeats * 3):
        start = time.perf_counter_ns()
        for _ in range(spans):
            tracer.start_span("span").end()
        bare.append((time.perf_counter_ns() - start) / 1_000 / spans)
    return {"modes": {mode: StepCost(*(Stats.of([s[i] for s in found]) for i in range(3)))
                      for mode, found in samples.items()},
            "bare_span_us": min(bare), "encode_us_per_span": exporter.encode_ns / 1_000 / max(1, exporter.encoded)}


async def _step_cost(run: Runner, runs: int, steps: int) -> tuple[float, float, float]:
    """µs per step of ``runs`` runs of ``steps`` steps (after one warm-up run): wall, process CPU, this thread's
    CPU."""
    await run()
    gc.collect()
    wall, cpu, loop_cpu = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
    for _ in range(runs):
        await run()
    per_step = 1_000 * runs * steps
    return ((time.perf_counter_ns() - wall) / per_step, (time.process_time_ns() - cpu) / per_step,
            (time.thread_time_ns() - loop_cpu) / per_step)


def measure_construction(framework: Framework, iterations: int, repeats: int) -> Stats:
    """µs per constructed agent, over ``repeats`` loops of ``iterations`` constructions."""
    build = framework.build
    build()  # warm-up: imports, caches, schemas
    samples = []
    for _ in range(repeats):
        gc.collect()
        start = time.perf_counter_ns()
        for _ in range(iterations):
            build()
        samples.append((time.perf_counter_ns() - start) / 1_000 / iterations)
    return Stats.of(samples)


@contextmanager
def retained_bytes(per: int) -> Iterator[list[float]]:
    """Yields a list that gets the bytes allocated in the block and still held at its end, divided by ``per``."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        per_one: list[float] = []
        yield per_one
        gc.collect()
        per_one.append((tracemalloc.get_traced_memory()[0] - before) / per)
    finally:
        tracemalloc.stop()


def measure_memory(framework: Framework, count: int) -> float:
    """Bytes retained per agent while ``count`` agents are kept in a list."""
    build = framework.build
    build()
    with retained_bytes(count) as per_agent:
        agents = [build() for _ in range(count)]
    del agents
    return per_agent[0]


async def measure_compiled_memory(framework: Framework, count: int) -> float:
    """backchannel compiles on the first run: bytes per agent once each has run (one answer)."""
    build = framework.build
    await build().ainvoke(PROMPT)
    with retained_bytes(count) as per_agent:
        agents = [build() for _ in range(count)]
        for agent in agents:
            await agent.ainvoke(PROMPT)
    del agents
    return per_agent[0]


async def measure_first_run_extra(framework: Framework, count: int) -> float:
    """backchannel compiles lazily: extra µs of a fresh agent's first run over a warm agent's run."""
    warm = framework.build()
    await warm.ainvoke(PROMPT)
    first, again = [], []
    for _ in range(count):
        agent = framework.build()
        start = time.perf_counter_ns()
        await agent.ainvoke(PROMPT)
        first.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        await warm.ainvoke(PROMPT)
        again.append(time.perf_counter_ns() - start)
    return (statistics.median(first) - statistics.median(again)) / 1_000


def measure_import(module: str, repeats: int) -> ImportTime | None:
    """Min over fresh processes of the µs ``import module`` takes (``-X importtime``)."""
    code = f"import sys; sys.stderr.write('@@start\\n'); sys.stderr.flush(); import {module}"
    package = module.partition(".")[0]
    samples = []
    for _ in range(repeats):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return None
        samples.append(_parse_importtime(proc.stderr, package))
    return ImportTime(min(s.total_us for s in samples), min(s.own_us for s in samples))


def _parse_importtime(stderr: str, package: str) -> ImportTime:
    """Cumulative µs of the top-level imports after the start marker (interpreter startup
    excluded), and the self µs of the package's own modules."""
    total = own = 0
    started = False
    for line in stderr.splitlines():
        if line == "@@start":
            started = True
        elif started and line.startswith("import time:") and "cumulative" not in line:
            self_us, cumulative, name = line[len("import time:"):].split("|")
            if not name.startswith("  "):  # importtime indents nested imports by two spaces
                total += int(cumulative)
            if name.strip().partition(".")[0] == package:
                own += int(self_us)
    return ImportTime(total, own)


# -- the whole run ------------------------------------------------------------------------


async def measure_all_steps(frameworks: dict[str, Framework | str],
                            settings: Settings) -> dict[str, dict[str, dict[int, Stats | str]]]:
    """µs per step by tool kind, framework and N ("not installed", or "-" for a kind a framework
    does not have)."""
    steps: dict[str, dict[str, dict[int, Stats | str]]] = {kind: {} for kind in TOOL_KINDS}
    for kind in TOOL_KINDS:
        for name, fw in frameworks.items():
            steps[kind][name] = {}
            for n in SIZES:
                if isinstance(fw, str) or kind not in fw.runners:
                    steps[kind][name][n] = fw if isinstance(fw, str) else "-"
                else:
                    _progress(f"steps, {kind} tool: {name} N={n}")
                    steps[kind][name][n] = await measure_steps(fw, kind, n, settings.step_repeats)
    return steps


def run_benchmarks(settings: Settings) -> dict[str, Any]:
    frameworks = load_frameworks()
    steps = asyncio.run(measure_all_steps(frameworks, settings))
    construction: dict[str, Stats | str] = {}
    memory: dict[str, float | str] = {}
    for name, fw in frameworks.items():
        if isinstance(fw, str):
            construction[name] = memory[name] = fw
            continue
        ours = name == "backchannel"
        _progress(f"construction and memory: {name}")
        iterations = settings.build_iterations if ours else settings.peer_build_iterations
        construction[name] = measure_construction(fw, iterations, settings.build_repeats)
        memory[name] = measure_memory(fw, settings.memory_agents if ours else settings.peer_memory_agents)
    extras: dict[str, float] = {}
    bc = frameworks["backchannel"]
    if isinstance(bc, Framework):
        count = settings.memory_agents // 10
        extras["compiled_bytes_per_agent"] = asyncio.run(measure_compiled_memory(bc, count))
        extras["first_run_extra_us"] = asyncio.run(measure_first_run_extra(bc, count))
    _progress("tracing: backchannel N=50")
    tracing = asyncio.run(measure_tracing(settings.step_repeats))
    imports: dict[str, ImportTime | str] = {}
    for name, module in IMPORT_TARGETS.items():
        _progress(f"import time: {module}")
        measured = measure_import(module, settings.import_repeats)
        imports[name] = "not installed" if measured is None else measured
    return {"steps": steps["async"], "sync_steps": steps["sync"], "inline_steps": steps["inline"],
            "construction": construction, "memory": memory, "backchannel_extras": extras,
            "imports": imports, "tracing": tracing}


# -- reporting --------------------------------------------------------------------------


def _progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def _best(value: Stats | float | str) -> float | None:
    if isinstance(value, str):
        return None
    return value.best if isinstance(value, Stats) else value


def _fmt(value: Stats | float | str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, Stats):
        return f"{value.best:,.1f} / {value.median:,.1f}"
    return f"{value:,.1f}"


def _ratio(peer: Stats | float | str, ours: Stats | float | str) -> str:
    p, o = _best(peer), _best(ours)
    return "-" if p is None or not o else f"{p / o:,.1f}x"


def growth_pct(steps: dict[int, Stats | str]) -> float | None:
    """Change of the best µs/step from the smallest N to the largest."""
    low, high = _best(steps[SIZES[0]]), _best(steps[SIZES[-1]])
    return None if low is None or high is None else (high / low - 1) * 100


def marginal_us(steps: dict[int, Stats | str]) -> float | None:
    """µs one more step costs: the slope of best run time between the smallest and largest N."""
    low, high = _best(steps[SIZES[0]]), _best(steps[SIZES[-1]])
    if low is None or high is None:
        return None
    return (high * SIZES[-1] - low * SIZES[0]) / (SIZES[-1] - SIZES[0])


def target_checks(results: dict[str, Any]) -> list[dict[str, Any]]:
    """backchannel's figures against the targets of the issue."""
    steps = results["steps"]["backchannel"]
    imports = results["imports"]["backchannel"]
    figures = {
        "step_us_at_50": _best(steps[50]),
        "sync_step_us_at_50": _best(results["inline_steps"]["backchannel"][50]),
        "growth_10_to_200_pct": growth_pct(steps),
        "construct_us": _best(results["construction"]["backchannel"]),
        "bytes_per_agent": _best(results["memory"]["backchannel"]),
        "import_ms": imports.total_us / 1000 if isinstance(imports, ImportTime) else None,
        "otel_added_us_at_50": otel_added_us(results["tracing"]),
    }
    return [{"name": name, "value": value, "target": TARGETS[name],
             "met": value is not None and value <= TARGETS[name]} for name, value in figures.items()]


def otel_added_us(tracing: dict[str, Any]) -> float | None:
    """µs per step (wall) OpenTelemetry adds over a run that records nothing (best against best)."""
    modes = tracing["modes"]
    return None if isinstance(modes, str) else modes["opentelemetry"].wall.best - modes["off"].wall.best


def render_tracing(results: dict[str, Any], out: Any) -> None:
    tracing = results["tracing"]
    modes = tracing["modes"]
    print("\ntracing: backchannel µs per step (async tool, N=50), best / median, the modes sampled in turns: by\n"
          "wall clock, the process's CPU (all its threads) and the event loop thread's CPU; +: added over nothing\n"
          "recorded (over the same model without OpenTelemetry, for the 1 ms model)\n", file=out)
    if isinstance(modes, str):
        print(f"  {modes}", file=out)
        return
    labels = {"off": "nothing recorded (agent.ainvoke)", "recorded": "spans recorded (as in a runtime)",
              "opentelemetry": "OpenTelemetry on, batch exporter",
              "slow model": f"model calls of {SLOW_MODEL_LATENCY * 1000:g} ms",
              "slow model, opentelemetry": "... OpenTelemetry on"}
    header = f"  {'':<34} | {'wall':>24} | {'process CPU':>24} | {'loop thread CPU':>24}"
    print(header, "  " + "-" * (len(header) - 2), sep="\n", file=out)
    bases = {"recorded": "off", "opentelemetry": "off", "slow model, opentelemetry": "slow model"}
    for mode, label in labels.items():
        cost, base = modes[mode], modes.get(bases.get(mode, ""))
        cells = []
        for clock in ("wall", "cpu", "loop_cpu"):
            stats = getattr(cost, clock)
            added = f" {stats.best - getattr(base, clock).best:+6.0f}" if base is not None else ""
            cells.append(f"{stats.best:,.1f} / {stats.median:,.1f}{added}".rjust(24))
        print(f"  {label:<34} | " + " | ".join(cells), file=out)
    print(f"\n  the OTLP encoding of a span (in the batch processor's thread): {tracing['encode_us_per_span']:,.1f} "
          f"µs CPU; one bare OpenTelemetry SDK span (start + end, no attributes, no processor): "
          f"{tracing['bare_span_us']:,.1f} µs; a step has two spans (its model call and its tool call)", file=out)


def render_steps(results: dict[str, Any], out: Any) -> None:
    steps = results["steps"]
    print(f"\nstep overhead: µs per step, best / median of {results['settings']['step_repeats']} samples "
          f"(python {results['python']}, {results['mode']} mode)", file=out)
    print("a step = one model call + its tool call; each run's final answer call is included\n", file=out)
    _print_step_table({name: steps[name] for name in FRAMEWORKS}, out)
    print(file=out)
    for name in FRAMEWORKS:
        g, m = growth_pct(steps[name]), marginal_us(steps[name])
        if g is None or m is None:
            print(f"{name:<12} not installed", file=out)
        else:
            print(f"{name:<12} growth N={SIZES[0]}->{SIZES[-1]}: {g:+6.1f} %   "
                  f"marginal cost of a step: {m:,.1f} µs", file=out)


def render_sync_steps(results: dict[str, Any], out: Any) -> None:
    sync, inline = results["sync_steps"], results["inline_steps"]["backchannel"]
    print(f"\nstep overhead with a sync tool: µs per step, best / median of "
          f"{results['settings']['step_repeats']} samples", file=out)
    print("sync tools run in a worker thread in every framework; backchannel's @tool(inline=True) runs "
          "one on the event loop\n", file=out)
    _print_step_table({"backchannel": sync["backchannel"], "bc inline=True": inline,
                       "langchain": sync["langchain"], "deepagents": sync["deepagents"]}, out)


def _print_step_table(columns: dict[str, dict[int, Stats | str]], out: Any) -> None:
    """One row per N: each column's best / median µs, then the peers' ratios to backchannel."""
    header = (f"{'N':>5} | " + " | ".join(f"{name:>19}" for name in columns) +
              f" | {'lc/bc':>7} | {'da/bc':>7}")
    print(header, "-" * len(header), sep="\n", file=out)
    for n in SIZES:
        cells = " | ".join(f"{_fmt(column[n]):>19}" for column in columns.values())
        bc = columns["backchannel"][n]
        print(f"{n:>5} | {cells} | {_ratio(columns['langchain'][n], bc):>7} | "
              f"{_ratio(columns['deepagents'][n], bc):>7}", file=out)


def render_costs(results: dict[str, Any], out: Any) -> None:
    print("\nper agent: construction µs (best / median), retained bytes; import ms (min, fresh process)\n",
          file=out)
    header = f"{'':<12} | {'construct µs':>22} | {'bytes/agent':>13} | {'import ms':>13}"
    print(header, "-" * len(header), sep="\n", file=out)
    for name in FRAMEWORKS:
        imp = results["imports"][name]
        total = f"{imp.total_us / 1000:,.1f}" if isinstance(imp, ImportTime) else imp
        print(f"{name:<12} | {_fmt(results['construction'][name]):>22} | {_fmt(results['memory'][name]):>13} | "
              f"{total:>13}", file=out)
    imp = results["imports"]["backchannel"]
    if isinstance(imp, ImportTime):
        print(f"\nimport backchannel: {imp.own_us / 1000:,.1f} ms in its own modules, the rest in the "
              "standard library (asyncio, ...)", file=out)
    extras = results["backchannel_extras"]
    if extras:
        print(f"backchannel compiles an agent on its first run: that run takes "
              f"+{extras['first_run_extra_us']:,.1f} µs, and a compiled agent retains "
              f"{extras['compiled_bytes_per_agent']:,.0f} bytes", file=out)


def render_targets(checks: list[dict[str, Any]], out: Any) -> None:
    labels = {"step_us_at_50": ("µs per step at N=50 (best)", "µs"),
              "sync_step_us_at_50": ("... trivial sync tool, inline=True", "µs"),
              "growth_10_to_200_pct": (f"growth N={SIZES[0]}->{SIZES[-1]}", "%"),
              "construct_us": ("construction (best)", "µs"),
              "bytes_per_agent": ("retained memory per agent", "B"),
              "import_ms": ("import backchannel (min)", "ms"),
              "otel_added_us_at_50": ("OpenTelemetry on, added per step", "µs")}
    print("\nbackchannel against its targets", file=out)
    for check in checks:
        label, unit = labels[check["name"]]
        value = "n/a" if check["value"] is None else f"{check['value']:,.1f}"
        print(f"  {'OK  ' if check['met'] else 'MISS'} {label:<28} {value:>10} {unit:<3} "
              f"(target <= {check['target']:,.0f} {unit})", file=out)


def versions(distributions: tuple[str, ...] = DISTRIBUTIONS) -> dict[str, str]:
    """The installed version of each distribution (or "not installed")."""
    found = {}
    for dist in distributions:
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            found[dist] = "not installed"
    return found


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(__doc__, "fewer repeats and iterations").parse_args(argv)
    settings = Settings.for_mode(args.quick)
    results = run_benchmarks(settings)
    results.update(mode="quick" if args.quick else "full", settings=asdict(settings),
                   python=platform.python_version(), versions=versions(), targets=TARGETS)
    results["growth_pct"] = {name: growth_pct(results["steps"][name]) for name in FRAMEWORKS}
    results["marginal_us_per_step"] = {name: marginal_us(results["steps"][name]) for name in FRAMEWORKS}
    checks = target_checks(results)
    results["target_checks"] = checks
    emit_report(results, [render_steps, render_sync_steps, render_tracing, render_costs,
                          lambda r, out: render_targets(checks, out)], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
