"""Restart with a long queue: how soon `backchannel serve` starts the first of N queued runs, how fast they drain.

A runtime that runs nothing (``max_concurrency=0``) queues N one-step runs of the echo agent of
``bench/server.py``, each on a thread of its own, and closes: the database now holds N pending runs of
a process that is gone, as after a server was stopped with a full queue. Then ``backchannel serve`` starts
on that database, and this process watches the runs' rows (every 5 ms): the time from starting the server
process until the first run leaves ``pending``, and the rate at which all N end (runs/s from the first
start to the last end), with the server's CPU time for each (from ``/proc``: the figures that hold on a
loaded machine, where the wall-clock ones swing). The same with a short queue (the normal rate, and what
starting a server costs by itself: Python, imports, opening the database), on SQLite and, when there is one,
Postgres. The package's bytecode is compiled first, as ``pip install`` compiles it: a deployed server does
not compile its modules at every start (with ``PYTHONDONTWRITEBYTECODE`` set and an editable install, it would).

Targets: with 10,000 queued runs, the first starts ≤ 1 s after the server process starts, and the queue
drains at the short queue's rate (≥ 90 % of it). Usage::

    python bench/restart.py [--quick] [--json] [--postgres URL]
"""

from __future__ import annotations

import asyncio
import compileall
import os
import sqlite3
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts)
from pg_cpu import cpu_seconds  # noqa: E402
from server import BACKCHANNEL_AGENT, USER, _process, free_port  # noqa: E402

QUEUES = {"short": 1_000, "long": 10_000}
TARGETS = {"first_start_s": 1.0, "drain_share": 0.9}
POLL = 0.01  # seconds between looks for the first run started (ten times that for the end)
TIME_LIMIT = 600.0


async def queue_runs(database: str, count: int, agent: Any, input: Any) -> None:
    """Leave ``count`` pending runs of ``agent`` in ``database``, each on a thread of its own, queued by a runtime
    that starts none and then closes (as a server stopped with a full queue leaves them)."""
    from backchannel.runtime import LocalRuntime
    from backchannel.server.serving import served

    # As the server serves it (with its middleware), so the server takes these runs as its agent's.
    async with LocalRuntime(database, agents={"echo": served(agent)}, max_concurrency=0) as rt:
        for start in range(0, count, 500):  # in groups: the backends store a tick's writes at once
            await asyncio.gather(*(rt.runs.create(str(uuid.uuid4()), "echo", input=input, if_not_exists="create")
                                   for _ in range(start, min(count, start + 500))))


class Watcher:
    """Counts the runs that left ``pending`` and those that ended, by reading the database (SQLite's file or
    Postgres) from outside the server, as its own client."""

    # Cheap, so the watching does not slow the server down: whether one run has left the queue, and
    # (less often) how many have ended.
    BEGUN = "SELECT EXISTS (SELECT 1 FROM runs WHERE status IN ('running', 'success'))"
    ENDED = "SELECT count(*) FROM runs WHERE status = 'success'"

    def __init__(self, database: str) -> None:
        if database.startswith("sqlite:///"):
            self.conn: Any = sqlite3.connect(database.removeprefix("sqlite:///"), isolation_level=None)
        else:
            import psycopg

            self.conn = psycopg.connect(database, autocommit=True)

    def begun(self) -> bool:
        return bool(self._one(self.BEGUN))

    def ended(self) -> int:
        return self._one(self.ENDED)

    def _one(self, query: str) -> Any:
        try:
            return self.conn.execute(query).fetchall()[0][0]  # all read: SQLite's snapshot ends
        except sqlite3.OperationalError:  # the server is migrating: look again
            return 0

    def close(self) -> None:
        self.conn.close()


def measure(workdir: Path, database: str, count: int) -> dict[str, float]:
    (workdir / "bench_agents.py").write_text(BACKCHANNEL_AGENT)
    sys.path.insert(0, str(workdir))
    try:
        from bench_agents import agent  # written into the work directory, as the server imports it

        asyncio.run(queue_runs(database, count, agent, USER))
    finally:
        sys.path.remove(str(workdir))
        sys.modules.pop("bench_agents", None)
    watcher = Watcher(database)
    port = free_port()
    command = [sys.executable, "-m", "backchannel.cli", "serve", "--port", str(port), "--agents",
               "echo=bench_agents:agent", "--database", database]
    try:
        started = time.perf_counter()
        with _process(command, workdir, workdir / "serve.log") as process:
            first, first_cpu = None, 0.0
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the server exited:\n{(workdir / 'serve.log').read_text()[-3000:]}")
                if first is None:
                    if watcher.begun():
                        first, first_cpu = time.perf_counter(), cpu_seconds(process.pid)
                elif watcher.ended() == count:
                    now, end_cpu = time.perf_counter(), cpu_seconds(process.pid)
                    break
                if time.perf_counter() - started > TIME_LIMIT:
                    raise RuntimeError(f"{watcher.ended()} of {count} queued runs ended in {TIME_LIMIT:.0f} s")
                time.sleep(POLL if first is None else 10 * POLL)
    finally:
        watcher.close()
    assert first is not None
    return {"first_start_s": first - started, "runs_per_second": count / max(now - first, 1e-9),
            "first_start_cpu_s": first_cpu, "cpu_per_run_us": (end_cpu - first_cpu) / count * 1e6}


def compile_backchannel() -> None:
    """Compile the package's modules to bytecode, as installing it does."""
    import backchannel

    compileall.compile_dir(str(Path(backchannel.__file__).parent), quiet=1)


def run(postgres: str | None, quick: bool) -> dict[str, Any]:
    compile_backchannel()
    stores = ["sqlite"] + (["postgres"] if postgres else [])
    queues = {"short": 200, "long": 2_000} if quick else QUEUES
    results: dict[str, Any] = {"queues": queues, "load_average": os.getloadavg()[0]}
    for store in stores:
        for name, count in queues.items():
            print(f"… {store}, {count:,} queued runs", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp, ExitStack() as stack:
                if store == "sqlite":
                    database = f"sqlite:///{tmp}/state.db"
                else:
                    from backchannel.runtime.postgres import scratch_schema  # psycopg only with a Postgres

                    database = stack.enter_context(scratch_schema(postgres or "", "bench"))
                results.setdefault(store, {})[name] = measure(Path(tmp), database, count)
    if not postgres:
        results["postgres"] = {"missing": "no Postgres: pass --postgres URL or set BACKCHANNEL_TEST_POSTGRES"}
    return results


def render(results: dict[str, Any], out: Any) -> None:
    queues = results["queues"]
    print(f"\nRestart with queued one-step runs: `backchannel serve` started on a database holding them "
          f"(load average {results['load_average']:.1f})", file=out)
    print(f"{'':<12}{'queued':>9}{'first start (s)':>17}{'drain (runs/s)':>16}{'vs short':>10}"
          f"{'CPU to first (s)':>18}{'CPU/run (µs)':>14}{'vs short':>10}", file=out)
    for store in ("sqlite", "postgres"):
        each = results[store]
        if "missing" in each:
            print(f"{'Postgres':<12} not measured ({each['missing']})", file=out)
            continue
        for name in ("short", "long"):
            figures, short = each[name], each["short"]
            share = figures["runs_per_second"] / short["runs_per_second"]
            cpu_share = short["cpu_per_run_us"] / figures["cpu_per_run_us"]  # as a rate: more CPU a run, lower
            print(f"{'SQLite' if store == 'sqlite' else 'Postgres':<12}{queues[name]:>9,}"
                  f"{figures['first_start_s']:>17.2f}{figures['runs_per_second']:>16,.0f}{share:>9.0%}"
                  f"{figures['first_start_cpu_s']:>18.2f}{figures['cpu_per_run_us']:>14,.0f}{cpu_share:>9.0%}",
                  file=out)
    print(f"targets with the long queue: first start ≤ {TARGETS['first_start_s']:.0f} s after the server process "
          f"starts; drain ≥ {TARGETS['drain_share']:.0%} of the short queue's rate (CPU/run: the server's CPU per "
          "run as it drains, Postgres's own not counted)", file=out)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "queues of 200 and 2,000 runs", postgres=True).parse_args(argv)
    results = run(args.postgres, args.quick)
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
