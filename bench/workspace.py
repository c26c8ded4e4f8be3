"""The workspace: what the file tools cost per step, and what editing a large file costs in checkpoints.

* step overhead: µs per step (one model call + one tool call, N = 50 steps, zero-latency scripted
  models) of an agent whose tool is a trivial async ``echo``, against agents whose tool is
  ``read_file``, ``write_file`` or ``edit_file`` on the state backend (files in the run's state).
  Target: a file tool adds at most 20 µs per step over ``echo``. deepagents' ``create_deep_agent``
  (its own file tools on its ``StateBackend``) is measured the same way when installed;
* checkpoint growth: a 1 MiB file in the thread's state, then one run that edits it 100 times (each
  edit replaces a 512-byte block with another), on a SQLite file: how much the database grows
  (WAL folded in), against the bytes the edits changed (removed + inserted). backchannel on a
  ``LocalRuntime``, deepagents on LangGraph's ``AsyncSqliteSaver``. The conversation itself costs
  bytes too (each ``edit_file`` call carries its old and new text), so backchannel is also run with
  a stand-in ``edit_file`` that changes no file: the difference is what the files cost. Target: the
  files cost at most 2x the bytes changed.

Usage::

    .venv-peers/bin/python bench/workspace.py [--quick] [--json]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import arguments  # noqa: E402  (sibling scripts, not a package)
from _peers import reply_chat_model  # noqa: E402
from runtime import sqlite_footprint  # noqa: E402
from step_overhead import Framework, measure_steps  # noqa: E402

STEPS = 50
FILE_LINES = 16_384  # lines of 64 bytes: 1 MiB
EDITS = 100
BLOCK = 512  # bytes each edit replaces
PROMPT: Any = {"messages": [{"role": "user", "content": "go"}]}
TOOLS = ("echo", "read_file", "write_file", "edit_file")
TARGETS = {"file_tool_extra_us": 20.0, "growth_per_changed_byte": 2.0}


def big_file() -> str:
    return "".join(f"{i:08d} {'abcdefghijklmnopqrstuvwxyz' * 3}"[:63] + "\n" for i in range(FILE_LINES))


def edit_args(i: int) -> dict[str, Any]:
    """The i-th edit: lines 160*i .. 160*i+7 (8 lines, 512 bytes) replaced by 512 other bytes."""
    first = 160 * i
    old = "".join(f"{n:08d} {'abcdefghijklmnopqrstuvwxyz' * 3}"[:63] + "\n" for n in range(first, first + 8))
    new = "".join(f"{n:08d} {'ZYXWVUTSRQPONMLKJIHGFEDCBA' * 3}"[:63] + "\n" for n in range(first, first + 8))
    return {"file_path": "/big.txt", "old_string": old, "new_string": new}


def step_args(tool: str, i: int) -> dict[str, Any]:
    """The arguments of the i-th call of ``tool`` in the step benchmark (a 20-line file)."""
    if tool == "echo":
        return {"x": i}
    if tool == "read_file":
        return {"file_path": "/notes.md"}
    if tool == "write_file":
        return {"file_path": f"/out/{i % 5}.md", "content": f"draft {i}\n"}
    return {"file_path": "/notes.md", "old_string": f"line {i % 20:02d} " if i % 2 == 0 else f"LINE {i % 20:02d} ",
            "new_string": f"LINE {i % 20:02d} " if i % 2 == 0 else f"line {i % 20:02d} "}


NOTES = "".join(f"line {i:02d} of the notes\n" for i in range(20))


# -- backchannel ---------------------------------------------------------------------------------


def backchannel_step_runner(tool: str) -> Callable[[int], Callable[[], Awaitable[Any]]]:
    import backchannel as bc
    from backchannel.workspace import FilesystemMiddleware

    @bc.tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    # edit_file toggles a line's case, so each step edits the file as the previous one left it.
    calls = [{"tool_calls": [{"name": tool, "args": step_args(tool, i // 2 * 2 + (i % 2))}]} for i in range(STEPS)]
    model = bc.ScriptedModel([*calls, "done"], loop=True)
    if tool == "echo":
        agent = bc.create_agent(model, [echo], max_iterations=STEPS + 1)
    else:
        agent = bc.create_agent(model, middleware=[FilesystemMiddleware()], max_iterations=STEPS + 1)
    files = {"/notes.md": {"content": NOTES, "encoding": "utf-8"}}
    return lambda n: lambda: agent.ainvoke({**PROMPT, "files": files})  # (step_overhead's runner shape)


async def backchannel_growth(directory: str, *, files: bool = True) -> int:
    """Bytes the database grows by in the run of edits; with ``files=False`` the same conversation
    with a stand-in ``edit_file`` that changes nothing (what the messages alone cost)."""
    import backchannel as bc
    from backchannel.runtime import LocalRuntime
    from backchannel.workspace import FilesystemMiddleware

    @bc.tool(name="edit_file")
    async def stand_in(file_path: str, old_string: str, new_string: str) -> str:
        """Pretend to edit a file."""
        return f"Successfully replaced 1 instance(s) of the string in '{file_path}'"

    calls = [{"tool_calls": [{"name": "edit_file", "args": edit_args(i)}]} for i in range(EDITS)]
    model = bc.ScriptedModel(["ready", *calls, "done"])
    workspace = {"middleware": [FilesystemMiddleware()]} if files else {"tools": [stand_in]}
    agent = bc.create_agent(model, max_iterations=EDITS + 1, **workspace)
    path = os.path.join(directory, f"backchannel-{files}.db")
    async with LocalRuntime(f"sqlite:///{path}", agents={"agent": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        await agent.ainvoke({**PROMPT, "files": {"/big.txt": {"content": big_file(), "encoding": "utf-8"}}},
                            thread_id=thread)
    before = sqlite_footprint(path)
    async with LocalRuntime(f"sqlite:///{path}", agents={"agent": agent}) as rt:
        result = await agent.ainvoke(PROMPT, thread_id=thread)
        if files:
            _check_edits(result["messages"], result["files"]["/big.txt"]["content"])
    return sqlite_footprint(path) - before


# -- deepagents ---------------------------------------------------------------------------------------


def _scripted_langchain(calls: list[tuple[str, dict[str, Any]]], first: str | None = None) -> Any:
    """A LangChain chat model that makes ``calls`` one per reply (after ``first``, if any), then says done."""
    from langchain_core.messages import AIMessage

    def reply(messages: Sequence[Any]) -> Any:
        done = sum(1 for m in messages if m.type == "tool")
        if first is not None and sum(1 for m in messages if m.type == "human") == 1:
            return AIMessage(content=first)
        if done >= len(calls):
            return AIMessage(content="done")
        name, args = calls[done]
        return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call_{done}",
                                                  "type": "tool_call"}])

    return reply_chat_model(reply)


def deepagents_step_runner(tool: str) -> Callable[[int], Callable[[], Awaitable[Any]]]:
    from deepagents import create_deep_agent
    from langchain_core.tools import tool as lc_tool

    @lc_tool
    async def echo(x: int) -> int:
        """Return x unchanged."""
        return x

    calls = [(tool, step_args(tool, i)) for i in range(STEPS)]
    agent = create_deep_agent(model=_scripted_langchain(calls), tools=[echo] if tool == "echo" else [])
    files = {"/notes.md": {"content": NOTES, "encoding": "utf-8"}}
    config = {"recursion_limit": 10_000}
    return lambda n: lambda: agent.ainvoke({**PROMPT, "files": files}, config=config)


async def deepagents_growth(directory: str) -> int:
    from deepagents import create_deep_agent
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    path = os.path.join(directory, "deepagents.db")
    calls = [("edit_file", edit_args(i)) for i in range(EDITS)]
    config = {"recursion_limit": 10_000, "configurable": {"thread_id": "t"}}
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        agent = create_deep_agent(model=_scripted_langchain(calls, first="ready"), checkpointer=saver)
        await agent.ainvoke({**PROMPT, "files": {"/big.txt": {"content": big_file(), "encoding": "utf-8"}}},
                            config=config)
    before = sqlite_footprint(path)
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        agent = create_deep_agent(model=_scripted_langchain(calls, first="ready"), checkpointer=saver)
        result = await agent.ainvoke(PROMPT, config=config)
        _check_edits(result["messages"], result["files"]["/big.txt"]["content"])
    return sqlite_footprint(path) - before


# -- measuring ----------------------------------------------------------------------------------------


def _check_edits(messages: Sequence[Any], content: str) -> None:
    results = [m for m in messages if getattr(m, "type", None) == "tool"][-EDITS:]
    failed = [m.content for m in results if getattr(m, "status", "success") == "error"]
    inserted = sum(edit_args(i)["new_string"].count("ZYXWVU") for i in range(EDITS))
    if len(results) != EDITS or failed or content.count("ZYXWVU") != inserted:
        raise AssertionError(f"the edits did not all apply: {failed[:1]}")


def changed_bytes() -> int:
    return sum(len(a["old_string"]) + len(a["new_string"]) for a in map(edit_args, range(EDITS)))


def available() -> dict[str, bool]:
    try:
        import deepagents  # noqa: F401
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: F401
    except ImportError:
        return {"backchannel": True, "deepagents": False}
    return {"backchannel": True, "deepagents": True}


async def run_benchmarks(quick: bool) -> dict[str, Any]:
    found = available()
    repeats = 3 if quick else 9
    frameworks = {"backchannel": Framework("backchannel", {t: backchannel_step_runner(t) for t in TOOLS}, list)}
    if found["deepagents"]:
        frameworks["deepagents"] = Framework("deepagents", {t: deepagents_step_runner(t) for t in TOOLS}, list)
    steps: dict[str, dict[str, Any]] = {tool: {} for tool in TOOLS}
    for name, framework in frameworks.items():
        for tool in TOOLS:
            times = repeats if name == "backchannel" else max(2, repeats // 3)
            steps[tool][name] = asdict(await measure_steps(framework, tool, STEPS, times))
    growth: dict[str, int | str] = {}
    with tempfile.TemporaryDirectory() as directory:
        growth["backchannel"] = await backchannel_growth(directory)
        growth["backchannel_messages_only"] = await backchannel_growth(directory, files=False)
        growth["deepagents"] = await deepagents_growth(directory) if found["deepagents"] else "not installed"
    return {"steps": steps, "growth": growth, "changed_bytes": changed_bytes(), "file_bytes": len(big_file())}


def render(results: dict[str, Any], out: Any) -> list[dict[str, Any]]:
    steps = results["steps"]
    plain = steps["echo"]["backchannel"]["best"]
    print(f"\nµs per step (model call + tool call), N = {STEPS}, best (median); state backend", file=out)
    print(f"{'tool':<12}{'backchannel':>22}{'extra over echo':>18}{'deepagents':>22}", file=out)
    for tool, row in steps.items():
        ours = row["backchannel"]
        peer = row.get("deepagents")
        peer_text = f"{peer['best']:.0f} ({peer['median']:.0f})" if peer else "not installed"
        print(f"{tool:<12}{ours['best']:>14.1f} ({ours['median']:.1f}){ours['best'] - plain:>18.1f}{peer_text:>22}",
              file=out)
    growth, changed = results["growth"], results["changed_bytes"]
    files_only = growth["backchannel"] - growth["backchannel_messages_only"]
    print(f"\n{EDITS} edits of a {results['file_bytes'] / 2**20:.1f} MiB file in the thread's state, on SQLite: "
          f"{changed:,} bytes changed (removed + inserted)", file=out)
    rows = [("backchannel", growth["backchannel"]), ("deepagents", growth["deepagents"]),
            ("backchannel, the same messages without files", growth["backchannel_messages_only"]),
            ("backchannel, the files alone (the difference)", files_only)]
    for name, grown in rows:
        if isinstance(grown, int):
            print(f"  {name:<48}{grown:>13,} bytes = {grown / changed:7.2f}x the bytes changed", file=out)
        else:
            print(f"  {name:<48}{grown}", file=out)
    if isinstance(growth.get("deepagents"), int):
        print(f"  deepagents' database grew {growth['deepagents'] / growth['backchannel']:.0f}x as much", file=out)
    extra = max(steps[t]["backchannel"]["best"] - plain for t in TOOLS if t != "echo")
    checks = [{"target": "file_tool_extra_us", "value": extra, "limit": TARGETS["file_tool_extra_us"]},
              {"target": "growth_per_changed_byte", "value": files_only / changed,
               "limit": TARGETS["growth_per_changed_byte"]}]
    print("\ntargets", file=out)
    for check in checks:
        verdict = "met" if check["value"] <= check["limit"] else "MISSED"
        print(f"  {check['target']:<26}{check['value']:>8.2f} (at most {check['limit']})  {verdict}", file=out)
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    args = arguments(__doc__, "fewer repeats").parse_args(argv)
    results = asyncio.run(run_benchmarks(args.quick))
    checks = render(results, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps({**results, "targets": checks}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
