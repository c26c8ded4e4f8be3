"""What this process's runtime has done since it opened, for the server's ``/metrics``.

Counters and a histogram in memory, one set per process as Prometheus scrapes
them: runs ended by status, how long each ran, task notifications delivered.
What holds for the whole database (runs by status, the queue) is counted from
storage when scraped.
"""

from __future__ import annotations

import bisect
from collections import Counter

from backchannel.runtime.rows import RunStatus

__all__ = ["LATENCY_BUCKETS", "RunMetrics"]

# Upper bounds (seconds) of the run latency histogram's buckets; the last, +Inf, is implied.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class RunMetrics:
    """Runs ended here by status, their latency histogram, notifications delivered here."""

    def __init__(self) -> None:
        self.ended: Counter[RunStatus] = Counter()
        self.latency_counts = [0] * (len(LATENCY_BUCKETS) + 1)  # per bucket (not cumulative); the last: +Inf
        self.latency_sum = 0.0
        self.notifications = 0

    def run_ended(self, status: RunStatus, seconds: float) -> None:
        """A run executed here ended with ``status`` after ``seconds``."""
        self.ended[status] += 1
        self.latency_counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.latency_sum += seconds

    def notification_delivered(self) -> None:
        """A task notification reached its thread here (each key once)."""
        self.notifications += 1
