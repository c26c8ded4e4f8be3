"""Long threads: what reading and continuing a long conversation costs, beside LangGraph's checkpointer.

Zero-latency scripted models and an inline tool, so only the harness and its SQLite storage are timed:

* **history of a 5,000-message thread** (one run of 2,500 tool steps): ``threads.get_history(limit=50)``,
  its time, the longest the event loop was held meanwhile (what every other request waits), and the time
  orjson takes to encode what it returns; LangGraph: ``aget_state_history(limit=50)`` of LangChain's
  ``create_agent`` on ``AsyncSqliteSaver`` after the same run;
* **a 10,000-message thread** (10 runs of 500 tool steps): ``get_state`` and ``get_history(limit=10)``, its
  state cached (as after a run) and read back from the file (best, and mean: what the cycle collector adds), each
  against the time to JSON-encode what it returns;
  read back from the file as the server does (its stored JSON text spliced unparsed, then the response encoded);
  a 4-step run on it against the same run on a 10-message thread (``agent.ainvoke``: the harness;
  ``runs.wait``: with the whole state as its output); and the file's size.

Times are CPU seconds of this process (the machine may be shared), best of the repeats. Usage::

    python bench/long_threads.py [--quick] [--json]
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import arguments, emit_report  # noqa: E402
from runtime import sqlite_footprint  # noqa: E402  (a sibling script, not a package)
from step_overhead import _progress  # noqa: E402

HISTORY_STEPS = 2_500  # tool steps of the one run of the 5,000-message thread
LONG_RUNS, LONG_STEPS = 10, 500  # the 10,000-message thread
SHORT_STEPS = 4  # the run timed on the long and the short thread


def _prompt(steps: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"steps {steps}"}]}


def _steps_wanted(text: str) -> int:
    return int(text.split()[1])


async def cpu_times(call: Callable[[], Awaitable[Any]], repeats: int) -> tuple[float, float, Any]:
    """Best and mean CPU seconds of ``repeats`` calls (the mean shows the cycle collector's passes, which the best
    of a few calls may miss), and the last result."""
    best, total, result = float("inf"), 0.0, None
    for _ in range(repeats):
        started = time.process_time()
        result = await call()
        took = time.process_time() - started
        best, total = min(best, took), total + took
    return best, total / repeats, result


async def cpu_time(call: Callable[[], Awaitable[Any]], repeats: int) -> tuple[float, Any]:
    """Best CPU seconds of ``repeats`` calls, and the last result."""
    best, _, result = await cpu_times(call, repeats)
    return best, result


def encode_time(value: Any, repeats: int) -> tuple[float, int]:
    """Best CPU seconds orjson takes to encode ``value``, and its size in bytes."""
    best, size = float("inf"), 0
    for _ in range(repeats):
        started = time.process_time()
        size = len(orjson.dumps(value))
        best = min(best, time.process_time() - started)
    return best, size


async def longest_hold(call: Callable[[], Awaitable[Any]]) -> tuple[float, float]:
    """Wall seconds of one call, and the longest the event loop went without serving another task meanwhile."""
    longest, running = 0.0, True

    async def other_requests() -> None:
        nonlocal longest
        while running:
            started = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - started)

    other = asyncio.create_task(other_requests())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await call()
    took = time.perf_counter() - started
    running = False
    await other
    return took, longest


# -- backchannel --------------------------------------------------------------------------------------


def backchannel_agent() -> Any:
    import backchannel as bc

    @bc.tool(inline=True)
    def step(i: int) -> str:
        """One step of work."""
        return f"step {i} done"

    def reply(request: Any) -> Any:
        # Only the messages since the last prompt are looked at: the model's own cost stays flat.
        done = 0
        for message in reversed(request.messages):
            if isinstance(message, bc.HumanMessage):
                break
            done += message.type == "tool"
        if done < _steps_wanted(message.text):
            return {"tool_calls": [{"name": "step", "args": {"i": done}}]}
        return f"{done} steps"

    return bc.create_agent(bc.ScriptedModel([reply], loop=True), [step], max_iterations=1_000_000)


async def backchannel_history(directory: str, repeats: int) -> dict[str, float]:
    from backchannel.runtime import LocalRuntime

    agent = backchannel_agent()
    async with LocalRuntime(f"sqlite:///{directory}/history.db", agents={"agent": agent}) as rt:
        thread = str(uuid.uuid4())
        await rt.runs.wait(thread, "agent", input=_prompt(HISTORY_STEPS), if_not_exists="create")
        rt.checkpoints.forget(thread)  # read from the file, as after a restart
        took, held = await longest_hold(lambda: rt.threads.get_history(thread, limit=50))
        cpu, history = await cpu_time(lambda: rt.threads.get_history(thread, limit=50), repeats)
        encode, size = encode_time(history, repeats)
        assert len(history) == 50 and len(history[0]["values"]["messages"]) == 2 * HISTORY_STEPS + 2
    return {"wall_s": took, "cpu_s": cpu, "loop_held_s": held, "encode_s": encode, "bytes": size}


async def backchannel_long_thread(directory: str, repeats: int) -> dict[str, float]:
    from backchannel.runtime import LocalRuntime

    agent = backchannel_agent()
    path = f"{directory}/long.db"
    async with LocalRuntime(f"sqlite:///{path}", agents={"agent": agent}) as rt:
        long, short = str(uuid.uuid4()), str(uuid.uuid4())
        for _ in range(LONG_RUNS):
            await agent.ainvoke(_prompt(LONG_STEPS), thread_id=long)
        await agent.ainvoke(_prompt(SHORT_STEPS), thread_id=short)
        figures: dict[str, float] = {}
        figures["get_state_s"], state = await cpu_time(lambda: rt.threads.get_state(long), repeats)
        figures["get_state_encode_s"], figures["state_bytes"] = encode_time(state, repeats)
        figures["history10_s"], history = await cpu_time(lambda: rt.threads.get_history(long, limit=10), repeats)
        figures["history10_encode_s"], figures["history10_bytes"] = encode_time(history, repeats)

        async def cold(read: Callable[[], Awaitable[Any]]) -> Any:
            rt.checkpoints.forget(long)  # as after a restart, or once the thread's state left the cache
            return await read()

        figures["cold_get_state_s"], figures["cold_get_state_mean_s"], _ = await cpu_times(
            lambda: cold(lambda: rt.threads.get_state(long)), repeats)
        figures["cold_history10_s"], figures["cold_history10_mean_s"], cold_history = await cpu_times(
            lambda: cold(lambda: rt.threads.get_history(long, limit=10)), repeats)
        assert cold_history == history

        async def body(read: Callable[..., Awaitable[Any]], **kwargs: Any) -> bytes:
            # What the server does for the request: the read (stored JSON text unparsed) and the response's encoding.
            return orjson.dumps(await cold(lambda: read(long, stored_json=True, **kwargs)))

        figures["served_get_state_s"], served = await cpu_time(lambda: body(rt.threads.get_state), repeats)
        assert orjson.loads(served) == state
        figures["served_history10_s"], served = await cpu_time(lambda: body(rt.threads.get_history, limit=10),
                                                               repeats)
        assert orjson.loads(served) == history
        for name, thread in (("long", long), ("short", short)):
            await agent.ainvoke(_prompt(SHORT_STEPS), thread_id=thread)  # its state cached, as in a chat
            figures[f"run_{name}_s"], _ = await cpu_time(
                lambda thread=thread: agent.ainvoke(_prompt(SHORT_STEPS), thread_id=thread), repeats * 3)
            figures[f"wait_{name}_s"], _ = await cpu_time(
                lambda thread=thread: rt.runs.wait(thread, "agent", input=_prompt(SHORT_STEPS)), repeats * 3)
        figures["messages"] = len(state["values"]["messages"])
    figures["db_bytes"] = sqlite_footprint(path)
    return figures


# -- LangGraph ----------------------------------------------------------------------------------------


def langgraph_agent(saver: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def step(i: int) -> str:
        """One step of work."""
        return f"step {i} done"

    class Model(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            from langchain_core.outputs import ChatGeneration, ChatResult

            last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
            done = sum(isinstance(m, ToolMessage) for m in messages[last:])
            wanted = _steps_wanted(str(messages[last].content))
            reply = (AIMessage("", tool_calls=[{"name": "step", "args": {"i": done}, "id": f"c{uuid.uuid4().hex}"}])
                     if done < wanted else AIMessage(f"{done} steps"))
            return ChatResult(generations=[ChatGeneration(message=reply)])

    return create_agent(Model(messages=iter(())), [step], checkpointer=saver)


async def langgraph_history(directory: str, repeats: int) -> dict[str, float] | str:
    try:
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    except ImportError:
        return "not installed"
    async with AsyncSqliteSaver.from_conn_string(f"{directory}/langgraph.db") as saver:
        agent = langgraph_agent(saver)
        config = {"configurable": {"thread_id": "t"}, "recursion_limit": 10 * HISTORY_STEPS}
        await agent.ainvoke(_prompt(HISTORY_STEPS), config=config)

        async def history() -> list[Any]:
            return [s async for s in agent.aget_state_history(config, limit=50)]

        took, held = await longest_hold(history)
        cpu, states = await cpu_time(history, repeats)
        assert len(states) == 50
    return {"wall_s": took, "cpu_s": cpu, "loop_held_s": held}


# -- the whole run ------------------------------------------------------------------------------------


async def run_benchmarks(repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        _progress("history of a 5,000-message thread: backchannel")
        history = {"backchannel": await backchannel_history(directory, repeats)}
        _progress("history of a 5,000-message thread: LangGraph")
        history["langgraph"] = await langgraph_history(directory, repeats)
        _progress("a 10,000-message thread: backchannel")
        long = await backchannel_long_thread(directory, repeats)
    return {"history_5000": history, "thread_10000": long}


def render(results: dict[str, Any], out: Any) -> None:
    bc, lg = results["history_5000"]["backchannel"], results["history_5000"]["langgraph"]
    print(f"\nhistory(limit=50) of a 5,000-message SQLite thread ({bc['bytes'] / 1e6:.0f} MB of JSON), "
          "CPU ms (best); wall ms and the longest the event loop was held, first call", file=out)
    print(f"{'':<12} | {'cpu':>8} | {'wall':>8} | {'loop held':>9} | {'encode':>8}", file=out)
    for name, row in (("backchannel", bc), ("langgraph", lg)):
        if isinstance(row, str):
            print(f"{name:<12} | {row}", file=out)
            continue
        encode = f"{row['encode_s'] * 1000:8.1f}" if "encode_s" in row else f"{'-':>8}"
        print(f"{name:<12} | {row['cpu_s'] * 1000:8.1f} | {row['wall_s'] * 1000:8.1f} | "
              f"{row['loop_held_s'] * 1000:9.1f} | {encode}", file=out)
    if not isinstance(lg, str):
        print(f"langgraph / backchannel (cpu): {lg['cpu_s'] / bc['cpu_s']:,.1f}x", file=out)
    long = results["thread_10000"]
    print(f"\na {long['messages']:,}-message SQLite thread ({long['db_bytes'] / 1e6:.1f} MB file), CPU ms (best)",
          file=out)
    for label, key, encode in (("get_state (state cached)", "get_state_s", "get_state_encode_s"),
                               ("get_state (read from the file)", "cold_get_state_s", "get_state_encode_s"),
                               ("get_history(limit=10) (state cached)", "history10_s", "history10_encode_s"),
                               ("get_history(limit=10) (from the file)", "cold_history10_s", "history10_encode_s"),
                               ("server: get_state from the file, encoded", "served_get_state_s", "get_state_encode_s"),
                               ("server: history(limit=10) from the file, encoded", "served_history10_s",
                                "history10_encode_s")):
        mean = long.get(key.removesuffix("_s") + "_mean_s")
        print(f"  {label:<50} {long[key] * 1000:8.1f}   orjson encode of the result {long[encode] * 1000:7.1f}"
              f"   ratio {long[key] / long[encode]:5.2f}" + (f"   (mean {mean * 1000:.1f})" if mean else ""), file=out)
    for label, key in (("4-step run, agent.ainvoke", "run"), ("4-step run, runs.wait (whole state out)", "wait")):
        longer, shorter = long[f"{key}_long_s"] * 1000, long[f"{key}_short_s"] * 1000
        print(f"  {label:<40} 10,000 messages {longer:6.2f} · 10 messages {shorter:6.2f} · "
              f"+{longer - shorter:.2f} ms", file=out)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "fewer repeats").parse_args(argv)
    results = asyncio.run(run_benchmarks(2 if args.quick else 5))
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
