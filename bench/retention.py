"""What retention costs: a sweep over many threads when none has expired (what every sweep interval pays
with a default TTL set), the sweep that prunes them, and keep_latest on one long thread.

    .venv/bin/python bench/retention.py [--threads 10000] [--postgres URL]

No peer is measured beside it: LangGraph's in-memory server does not sweep TTLs (its sweep_ttl is a
no-op) and its Postgres runtime is not open source.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from datetime import UTC, datetime, timedelta

from backchannel._clock import now_iso
from backchannel.runtime import LocalRuntime, ThreadTTLConfig
from backchannel.runtime.postgres import scratch_schema
from backchannel.runtime.rows import CheckpointRow, ThreadRow


class Clock:
    def __init__(self) -> None:
        self.ahead = timedelta()

    def __call__(self) -> str:
        return (datetime.now(UTC) + self.ahead).isoformat()


async def measure(store: str, threads: int, label: str) -> None:
    clock = Clock()
    # Sweeps only when called here: the scheduler's interval is a day.
    config = ThreadTTLConfig(strategy="keep_latest", default_ttl=60, sweep_interval_minutes=24 * 60)
    async with LocalRuntime(store, clock=clock, thread_ttl=config) as rt:
        now = now_iso()
        for i in range(threads):
            await rt.storage.create_thread(ThreadRow(f"t{i}", now, now))
            for seq in (1, 2):
                await rt.storage.put_checkpoint(CheckpointRow(f"t{i}", f"c{seq}", "c1" if seq == 2 else None, seq,
                                                              None, {"messages": []}, "", {}, now))
        start = time.perf_counter()
        assert await rt.retention.sweep() == (0, 0)
        idle = time.perf_counter() - start
        clock.ahead = timedelta(minutes=61)
        config_limit = rt.retention.threads.sweep_limit
        start = time.perf_counter()
        pruned, _ = await rt.retention.sweep()
        pruning = time.perf_counter() - start
        assert pruned == min(threads, config_limit)
        long = "long"
        await rt.storage.create_thread(ThreadRow(long, now, now))
        for seq in range(1, 2001):
            await rt.storage.put_checkpoint(CheckpointRow(long, f"c{seq}", f"c{seq - 1}" if seq > 1 else None, seq,
                                                          None, {"messages": [{"type": "human", "content": "x" * 200,
                                                                               "id": f"m{seq}"}]}, "", {}, now))
        start = time.perf_counter()
        assert await rt.threads.prune([long], strategy="keep_latest") == {"pruned_count": 1}
        keep = time.perf_counter() - start
    print(f"{label:>9}: sweep of {threads:,} threads, none expired {idle * 1000:8.1f} ms "
          f"({idle / threads * 1e6:.2f} µs/thread); pruning all (keep_latest) {pruning * 1000:8.1f} ms "
          f"({pruning / threads * 1e6:.0f} µs/thread); keep_latest of a 2,000-checkpoint thread {keep * 1000:.1f} ms")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--postgres", default=os.environ.get("BACKCHANNEL_TEST_POSTGRES"))
    args = parser.parse_args()
    await measure("memory", args.threads, "memory")
    with tempfile.TemporaryDirectory() as tmp:
        await measure(f"sqlite:///{tmp}/bench.db", args.threads, "SQLite")
    if args.postgres:
        with scratch_schema(args.postgres, "bench") as url:
            await measure(url, args.threads, "Postgres")


if __name__ == "__main__":
    asyncio.run(main())
