"""The clock every layer stamps rows, events and summaries with: UTC, ISO 8601, as the LangGraph API writes it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

__all__ = ["now_iso"]

_second: tuple[int, str] = (0, "")  # the last whole second asked for, formatted


def now_iso() -> str:
    """The current UTC time as ISO 8601 with microseconds, the format the LangGraph API uses.

    Every row written gets one, so the date part is formatted once a second.
    """
    global _second
    now = time.time()
    second, text = _second
    if int(now) != second:
        second = int(now)
        text = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        _second = (second, text)
    return f"{text}.{int((now - second) * 1_000_000):06d}+00:00"
