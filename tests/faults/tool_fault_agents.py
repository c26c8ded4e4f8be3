"""Agents whose tools misbehave, served by the ``backchannel serve`` processes of ``test_tool_faults.py``."""

from __future__ import annotations

import argparse
import asyncio

from backchannel import ScriptedModel, create_agent, tool


def _call(name: str, id: str) -> dict:
    return {"name": name, "args": {}, "id": id}


@tool
def convert() -> str:
    """Convert, the way a command-line parser does: a bad argument exits the program (SystemExit 2)."""
    parser = argparse.ArgumentParser(prog="convert")
    parser.add_argument("--count", type=int, required=True)
    return str(parser.parse_args(["--count", "many"]).count)


@tool
def interrupted() -> str:
    """A library that raises KeyboardInterrupt in a worker thread."""
    raise KeyboardInterrupt


@tool
async def exits() -> str:
    """An async tool that calls sys.exit()."""
    await asyncio.sleep(0)
    raise SystemExit("bye")


@tool
def fine() -> str:
    """A tool that works."""
    return "fine"


def _answer(request) -> str:
    results = [m for m in request.messages if m.type == "tool"]
    return "after: " + ", ".join(f"{m.name}={m.status}" for m in results)


def _reply(request):
    """Every run: all four calls in one reply, then the statuses it saw."""
    if request.messages[-1].type == "tool":
        return _answer(request)
    return {"tool_calls": [_call("convert", "c1"), _call("interrupted", "c2"), _call("exits", "c3"),
                           _call("fine", "c4")]}


faulty = create_agent(ScriptedModel([_reply], loop=True), [convert, interrupted, exits, fine], name="faulty")
