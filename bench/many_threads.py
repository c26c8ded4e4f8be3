"""Many threads: thread search and count through the server, and its memory, as the number of threads grows.

For each store (a SQLite file; Postgres with ``--postgres URL`` or ``BACKCHANNEL_TEST_POSTGRES``, in a fresh
schema), threads are created through a ``LocalRuntime`` (each with metadata ``{"user": "u<i % 100>"}``) up to
1,000, then up to 100,000. At each size a fresh ``backchannel serve`` on that database answers, one request
at a time over loopback HTTP:

* ``POST /threads/search`` ``{"limit": 10}`` (newest first), with ``"status": "idle"``, and with
  ``"metadata": {"user": "u7"}`` (1 thread in 100);
* ``POST /threads/count`` ``{}``, with ``"status": "idle"``, and with that metadata;

each query's p50 wall time and the server's CPU time per request (read from ``/proc``: on a loaded machine
the wall time is mostly waiting for a core), and the server's peak resident memory (``VmHWM``) once it has
answered them all. Targets (issue 22.3): at 100,000 threads, p50 ≤ 5 ms for each, and the server's memory
the same as at 1,000 threads. Usage::

    python bench/many_threads.py [--quick] [--json] [--postgres URL]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import arguments, emit_report  # noqa: E402
from server import backchannel_server, peak_rss_mib  # noqa: E402  (a sibling script, not a package)
from step_overhead import _progress  # noqa: E402

SIZES = (1_000, 100_000)
USERS = 100  # distinct metadata values: a metadata search matches 1 thread in USERS
TARGET_MS = 5.0
QUERIES: dict[str, tuple[str, dict[str, Any]]] = {
    "search": ("/threads/search", {"limit": 10}),
    "search idle": ("/threads/search", {"limit": 10, "status": "idle"}),
    "search metadata": ("/threads/search", {"limit": 10, "metadata": {"user": "u7"}}),
    "count": ("/threads/count", {}),
    "count idle": ("/threads/count", {"status": "idle"}),
    "count metadata": ("/threads/count", {"metadata": {"user": "u7"}}),
}


async def fill(database: str, start: int, stop: int) -> None:
    """Create threads ``start`` to ``stop`` (a batch at a time, as many clients would)."""
    from backchannel.runtime import LocalRuntime

    async with LocalRuntime(database, agents={}) as rt:
        for first in range(start, stop, 1_000):
            await asyncio.gather(*(rt.threads.create(metadata={"user": f"u{i % USERS}"})
                                   for i in range(first, min(first + 1_000, stop))))


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) the process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def latencies(url: str, pid: int, requests: int) -> dict[str, dict[str, float]]:
    """Each query's p50 ms and the server's CPU ms per request, over ``requests`` sequential requests (after
    a warm-up of each)."""
    figures = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        for name, (path, body) in QUERIES.items():
            http.post(path, json=body).raise_for_status()
            times = []
            cpu = cpu_seconds(pid)
            for _ in range(requests):
                started = time.perf_counter()
                http.post(path, json=body).raise_for_status()
                times.append(time.perf_counter() - started)
            figures[name] = {"p50_ms": statistics.median(times) * 1000,
                             "cpu_ms": (cpu_seconds(pid) - cpu) / requests * 1000}
    return figures


def run(postgres: str | None, requests: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    stores = ["sqlite"] + (["postgres"] if postgres else [])
    for store in stores:
        with tempfile.TemporaryDirectory(prefix="bench-threads-") as tmp, ExitStack() as stack:
            if store == "sqlite":
                database = f"sqlite:///{tmp}/state.db"
            else:
                from backchannel.runtime.postgres import scratch_schema  # psycopg only when there is a Postgres

                database = stack.enter_context(scratch_schema(postgres or "", "bench"))
            made = 0
            for size in SIZES:
                _progress(f"{store}: {size:,} threads")
                asyncio.run(fill(database, made, size))
                made = size
                with backchannel_server(Path(tmp), database, f"server-{size}.log") as (url, pid):
                    figures: dict[str, Any] = latencies(url, pid, requests)
                    figures["peak_rss_mib"] = peak_rss_mib(pid)
                results.setdefault(store, {})[size] = figures
    if not postgres:
        results["postgres"] = "no Postgres: pass --postgres URL or set BACKCHANNEL_TEST_POSTGRES"
    return results


def render(results: dict[str, Any], out: Any) -> None:
    print(f"\nThread search and count through `backchannel serve`: p50 ms of sequential requests · server CPU "
          f"ms per request; target at {SIZES[-1]:,} threads: ≤ {TARGET_MS:g} ms, memory as at {SIZES[0]:,}", file=out)
    header = "".join(f"{name:>17}" for name in QUERIES)
    print(f"{'':<24}{header}{'peak RSS':>11}", file=out)
    for store in ("sqlite", "postgres"):
        figures = results.get(store)
        if isinstance(figures, str):
            print(f"{store}: not measured ({figures})", file=out)
            continue
        for size, row in figures.items():
            cells = "".join(f"{_cell(row[name]):>17}" for name in QUERIES)
            print(f"{f'{store}, {int(size):,} threads':<24}{cells}{row['peak_rss_mib']:>7.1f} MiB", file=out)


def _cell(figures: dict[str, float]) -> str:
    return f"{figures['p50_ms']:.2f} · {figures['cpu_ms']:.2f}"


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "fewer requests", postgres=True).parse_args(argv)
    results = run(args.postgres, 20 if args.quick else 100)
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
