"""Token usage summed over model calls: per run, per thread, with subagents shown separately.

A total is a dict::

    {"input_tokens": 1200, "output_tokens": 300, "total_tokens": 1500, "model_calls": 4,
     "subagents": {"researcher": {"input_tokens": 700, "output_tokens": 100, "total_tokens": 800,
                                  "model_calls": 2}}}

The top-level counts include the subagents' calls; ``subagents`` breaks those
down by subagent name (absent when no subagent called a model). A run's total
covers its own model calls and those of the subagents it ran to completion
(``task``); a thread's covers its runs and its background tasks' threads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["COUNTS", "add_call", "add_total", "describe_usage", "empty_usage", "sum_usage"]

COUNTS = ("input_tokens", "output_tokens", "total_tokens", "model_calls")


def empty_usage() -> dict[str, Any]:
    """A total with nothing counted yet."""
    return {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "model_calls": 0}


def add_call(total: dict[str, Any], usage: Mapping[str, Any] | None, subagent: str | None = None) -> None:
    """Count one model call (its ``usage_metadata``, ``None`` when the provider reported none) into ``total``;
    a subagent's call is also counted under its name."""
    _add_call(total, usage)
    if subagent is not None:
        _add_call(total.setdefault("subagents", {}).setdefault(subagent, empty_usage()), usage)


def _add_call(total: dict[str, Any], usage: Mapping[str, Any] | None) -> None:
    total["model_calls"] += 1
    if usage:
        inputs, outputs = usage.get("input_tokens") or 0, usage.get("output_tokens") or 0
        total["input_tokens"] += inputs
        total["output_tokens"] += outputs
        total["total_tokens"] += usage.get("total_tokens") or inputs + outputs


def add_total(total: dict[str, Any], other: Mapping[str, Any] | None, subagent: str | None = None) -> None:
    """Add another total (a run's, a task thread's) into ``total``; with ``subagent``, all of it counts as that
    subagent's, else its own subagent breakdown carries over."""
    if not other:
        return
    for key in COUNTS:
        total[key] += other.get(key) or 0
    if subagent is not None:
        add_total(total.setdefault("subagents", {}).setdefault(subagent, empty_usage()),
                  {key: other.get(key) for key in COUNTS})
        return
    for name, counts in (other.get("subagents") or {}).items():
        add_total(total.setdefault("subagents", {}).setdefault(name, empty_usage()), counts)


def sum_usage(totals: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The sum of several totals (``None`` counts as nothing)."""
    total = empty_usage()
    for other in totals:
        add_total(total, other)
    return total


def describe_usage(total: Mapping[str, Any] | None) -> str:
    """One line for people: ``1,500 tokens (1,200 in, 300 out) in 4 model calls; researcher 800``."""
    if not total or not total.get("model_calls"):
        return "no model calls"
    calls = total["model_calls"]
    line = (f"{total['total_tokens']:,} tokens ({total['input_tokens']:,} in, {total['output_tokens']:,} out) "
            f"in {calls} model call{'s' if calls != 1 else ''}")
    subagents = total.get("subagents") or {}
    if subagents:
        line += "; " + ", ".join(f"{name} {counts['total_tokens']:,}" for name, counts in subagents.items())
    return line
