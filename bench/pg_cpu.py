"""CPU per one-step run, from ``/proc``: SQLite, and 1, 2 and 4 server processes on one Postgres.

Wall-clock scaling cannot be shown on two cores (the servers, Postgres and the load generator share
them), so this counts the CPU time each run costs: the server processes' (``utime + stime`` of each
``backchannel serve``) and, apart, that of the Postgres backends serving them (found by the
``application_name`` their connection URL sets, in ``pg_stat_activity``), over a few seconds of load
(``wrk``, 32 connections in all, split over the processes, each looping ``POST /threads/{new id}/runs/wait``
of the one-step echo agent of ``bench/server.py``), divided by the runs that ended meanwhile (counted in
the database). Postgres's own background processes (WAL writer, checkpointer) are shared with whatever
else uses the cluster and are not counted. Where Aegra is installed (``.venv-aegra``, see ``bench/server.py``),
it is measured beside them the same way, serving the same graph as ``langgraph dev`` on a scratch database
of the same cluster (its backends: every connection to that database).

Targets: Postgres with one process ≤ 1.3× SQLite's CPU per run (servers and backends together), and with
2 and 4 processes ≤ 1.1× the single-process figure. CPU time is less sensitive to a busy machine than
wall time, but not immune (caches, migrations between cores): configurations are sampled in turns and
the median is shown. Usage::

    python bench/pg_cpu.py [--quick] [--json] [--postgres URL] [--connections N]
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts)
from scale import PROCESSES, servers  # noqa: E402
from server import USER, aegra_python, aegra_server, children, scratch_database, wrk_load  # noqa: E402

CONNECTIONS = 32
TARGETS = {"postgres_vs_sqlite": 1.3, "processes_vs_one": 1.1}
TICK = os.sysconf("SC_CLK_TCK")
IDLE_SECONDS = 3.0  # with no load, before it: what the servers (heartbeats, schedulers' ticks) cost by the second


@dataclass
class Sample:
    runs: int
    seconds: float
    server_cpu: float  # seconds of CPU, all server processes
    backend_cpu: float  # seconds of CPU, the Postgres backends of those servers
    idle_cpu: float  # seconds of CPU per second, servers and backends together, with no request coming

    def per_run_us(self, cpu: float) -> float:
        return cpu / self.runs * 1e6 if self.runs else float("nan")


def cpu_seconds(pid: int) -> float:
    """``utime + stime`` of a process (all its threads) and its children, in seconds; 0 if it is gone."""
    total = 0
    for each in [pid, *children(pid)]:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / TICK


class Database:
    """What the bench reads from the servers' database: runs ended, and (Postgres) the backends' pids: those
    of ``app`` (an ``application_name``), or with ``own_database`` every other connection to the database."""

    def __init__(self, url: str, app: str | None, *, own_database: bool = False) -> None:
        self.url, self.app, self.own_database = url, app, own_database

    def ended_runs(self) -> int:
        if self.url.startswith("sqlite:///"):
            with sqlite3.connect(self.url.removeprefix("sqlite:///")) as conn:
                return conn.execute("SELECT count(*) FROM runs WHERE status = 'success'").fetchone()[0]
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            found = conn.execute("SELECT count(*) FROM runs WHERE status = 'success'").fetchone()
            assert found is not None
            return found[0]

    def backends(self) -> list[int]:
        if self.own_database:
            url, where, params = self.url, "datname = current_database() AND pid <> pg_backend_pid()", ()
        elif self.app is not None:
            url, where, params = self.url.replace(self.app, "bench_probe"), "application_name = %s", (self.app,)
        else:
            return []
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            return [r[0] for r in conn.execute(f"SELECT pid FROM pg_stat_activity WHERE {where}", params).fetchall()]


def warm_up(urls: list[str]) -> None:
    for url in urls:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(50):
                http.post(f"/threads/{uuid.uuid4()}/runs/wait", json={
                    "assistant_id": "echo", "input": USER, "if_not_exists": "create"}).raise_for_status()


def measure(urls: list[str], pids: list[int], db: Database, seconds: float, connections: int = CONNECTIONS) -> Sample:
    wrk = shutil.which("wrk")
    if wrk is None:  # a Python client on the same two cores would measure itself, not the servers
        raise SystemExit("bench/pg_cpu.py needs wrk: apt-get install wrk")
    warm_up(urls)
    backends = db.backends()  # the pools have opened their connections during the warm-up
    idle = _cpu_of(pids, backends)
    time.sleep(IDLE_SECONDS)
    idle = (_cpu_of(pids, backends) - idle) / IDLE_SECONDS
    runs = db.ended_runs()
    servers0 = sum(cpu_seconds(p) for p in pids)
    backends0 = {p: cpu_seconds(p) for p in backends}
    started = time.perf_counter()
    load = wrk_load(wrk, urls, 1, connections // len(urls), seconds)
    elapsed = time.perf_counter() - started
    server_cpu = sum(cpu_seconds(p) for p in pids) - servers0
    backends_now = db.backends()
    # A backend that opened during the load counts from zero (its start is part of the cost).
    backend_cpu = sum(cpu_seconds(p) - backends0.get(p, 0.0) for p in backends_now)
    if load.failed:
        print(f"  {load.failed} requests failed: {load.failures}", file=sys.stderr)
    return Sample(db.ended_runs() - runs, elapsed, server_cpu, backend_cpu, idle)


def _cpu_of(pids: list[int], backends: list[int]) -> float:
    return sum(cpu_seconds(p) for p in [*pids, *backends])


def sample(store: str, count: int, postgres: str | None, seconds: float, connections: int = CONNECTIONS) -> Sample:
    with tempfile.TemporaryDirectory(prefix="bench-pg-cpu-") as tmp, ExitStack() as stack:
        if store == "aegra":
            database = stack.enter_context(scratch_database(postgres or ""))
            url, pid = stack.enter_context(aegra_server(Path(tmp), database))
            return measure([url], [pid], Database(database, None, own_database=True), seconds, connections)
        if store == "sqlite":
            database, app = f"sqlite:///{tmp}/state.db", None
        else:
            from backchannel.runtime.postgres import scratch_schema  # psycopg only when there is a Postgres

            app = f"bench_{uuid.uuid4().hex[:12]}"
            database = f"{stack.enter_context(scratch_schema(postgres or '', 'bench'))}&application_name={app}"
        with servers(Path(tmp), database, count) as started:
            return measure([url for url, _ in started], [pid for _, pid in started], Database(database, app), seconds,
                           connections)


def run(postgres: str | None, seconds: float, repeats: int, connections: int = CONNECTIONS) -> dict[str, Any]:
    configurations = [("sqlite", 1)] + ([("postgres", n) for n in PROCESSES] if postgres else [])
    aegra = _aegra_missing() if postgres else "no Postgres"
    configurations += [] if aegra else [("aegra", 1)]
    samples: dict[tuple[str, int], list[Sample]] = {c: [] for c in configurations}
    for _ in range(repeats):  # in turns, so a busy moment of the machine does not fall on one configuration
        for store, count in configurations:
            print(f"… {store}, {count} process{'es' if count > 1 else ''}", file=sys.stderr, flush=True)
            samples[(store, count)].append(sample(store, count, postgres, seconds, connections))
    results: dict[str, Any] = {"load_average": os.getloadavg()[0], "connections": connections, "configurations": {}}
    for (store, count), each in samples.items():
        results["configurations"][f"{store}:{count}"] = {
            "server_us_per_run": statistics.median(s.per_run_us(s.server_cpu) for s in each),
            "postgres_us_per_run": statistics.median(s.per_run_us(s.backend_cpu) for s in each),
            "total_us_per_run": statistics.median(s.per_run_us(s.server_cpu + s.backend_cpu) for s in each),
            "runs_per_second": statistics.median(s.runs / s.seconds for s in each),
            "idle_ms_per_second": statistics.median(s.idle_cpu * 1e3 for s in each),
            "samples": len(each),
        }
    if not postgres:
        results["missing"] = "no Postgres: pass --postgres URL or set BACKCHANNEL_TEST_POSTGRES"
    if aegra:
        results["aegra_missing"] = aegra
    return results


def _aegra_missing() -> str | None:
    """Why Aegra cannot be measured here, or None."""
    try:
        aegra_python()
    except ModuleNotFoundError as exc:
        return str(exc)
    return None


_STORES = {"sqlite": "SQLite", "postgres": "Postgres", "aegra": "Aegra on Postgres"}


def render(results: dict[str, Any], out: Any) -> None:
    rows = results["configurations"]
    print(f"\nCPU per one-step run through the HTTP API, {results['connections']} connections (wrk), median of the "
          f"samples; load average {results['load_average']:.1f} on {os.cpu_count()} cores", file=out)
    print(f"{'':<30}{'server µs':>11}{'Postgres µs':>13}{'total µs':>10}{'vs SQLite':>11}{'vs 1 proc':>11}"
          f"{'runs/s':>9}{'idle ms/s':>11}", file=out)
    sqlite = rows["sqlite:1"]["total_us_per_run"]
    one = rows.get("postgres:1", {}).get("total_us_per_run")
    for key, row in rows.items():
        store, count = key.split(":")
        label = f"{_STORES[store]}, {count} process{'es' if count != '1' else ''}"
        total = row["total_us_per_run"]
        vs_one = f"{total / one:.2f}×" if store == "postgres" and one else ""
        print(f"{label:<30}{row['server_us_per_run']:>11,.0f}{row['postgres_us_per_run']:>13,.0f}{total:>10,.0f}"
              f"{total / sqlite:>10.2f}×{vs_one:>11}{row['runs_per_second']:>9,.0f}{row['idle_ms_per_second']:>11.1f}",
              file=out)
    if "missing" in results:
        print(f"Postgres: not measured ({results['missing']})", file=out)
        return
    worst = max(rows[f"postgres:{n}"]["total_us_per_run"] for n in PROCESSES if n > 1) / one
    print(f"targets: Postgres ≤ {TARGETS['postgres_vs_sqlite']}× SQLite (now {one / sqlite:.2f}×); 2 and 4 processes "
          f"≤ {TARGETS['processes_vs_one']}× one (now at most {worst:.2f}×)", file=out)
    if "aegra:1" in rows:
        print(f"Aegra, 1 process: {rows['aegra:1']['total_us_per_run'] / one:.1f}× backchannel's CPU per run on "
              "Postgres, 1 process", file=out)
    else:
        print(f"Aegra: not measured ({results['aegra_missing']})", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, "one sample of each configuration", postgres=True)
    parser.add_argument("--connections", type=int, default=CONNECTIONS,
                        help="wrk's connections in all, split over the processes (runs in flight)")
    args = parser.parse_args(argv)
    results = run(args.postgres, 4.0 if args.quick else 6.0, 1 if args.quick else 3, args.connections)
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
