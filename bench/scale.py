"""Scaling out: one-step runs per second through the HTTP API with 1, 2 and 4 server processes on one Postgres.

Every configuration serves the same one-step agent (the model answers at once: only servers, runtimes
and storage are timed) with ``backchannel serve --database <url>`` processes on loopback ports, all on
one fresh Postgres schema; SQLite with one process is the baseline. The load is 64 concurrent clients in
all, split evenly over the processes (``wrk``, one per process, each looping ``POST /threads/{new id}/
runs/wait``; ``apt-get install wrk``). Printed: runs/s per configuration, the scaling factor from 1 to 2
and 1 to 4 processes, and Postgres with one process as a share of SQLite.

Targets: ≥ 1.6× from 1 to 2 processes; Postgres with one process ≥ 50 % of SQLite's throughput.
Postgres comes from ``--postgres URL`` or ``BACKCHANNEL_TEST_POSTGRES`` (``.ci/run`` shows how to start a
throwaway one). Usage::

    python bench/scale.py [--quick] [--json] [--postgres URL]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
from _cli import arguments, emit_report  # noqa: E402  (sibling scripts)
from server import USER, Load, backchannel_server, wrk_load  # noqa: E402

CLIENTS = 64
PROCESSES = (1, 2, 4)
TARGETS = {"scaling_1_to_2": 1.6, "postgres_share_of_sqlite": 0.5}


@contextmanager
def servers(workdir: Path, database: str, count: int):
    """``count`` server processes on ``database``; yields their URLs and pids."""
    with ExitStack() as stack:
        yield [stack.enter_context(backchannel_server(workdir, database, f"server-{i}.log")) for i in range(count)]


def throughput(urls: list[str], seconds: float) -> Load:
    """Answered runs per second and failures with ``CLIENTS`` clients split over ``urls``, after a warm-up on each."""
    for url in urls:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(20):
                http.post(f"/threads/{uuid.uuid4()}/runs/wait", json={
                    "assistant_id": "echo", "input": USER, "if_not_exists": "create"}).raise_for_status()
    wrk = shutil.which("wrk")
    if wrk is None:  # a Python client on the same two cores would measure itself, not the servers
        raise SystemExit("bench/scale.py needs wrk: apt-get install wrk")
    return wrk_load(wrk, urls, 1, CLIENTS // len(urls), seconds)


def run(postgres: str | None, seconds: float, repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {"sqlite": {}, "postgres": {}}
    if postgres:
        from backchannel.runtime.postgres import scratch_schema  # psycopg only when there is a Postgres
    configurations = [("sqlite", 1)] + ([("postgres", n) for n in PROCESSES] if postgres else [])
    for _ in range(repeats):  # interleaved, so a busy moment of the machine does not fall on one configuration
        for store, count in configurations:
            print(f"… {store}, {count} process{'es' if count > 1 else ''}", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp, ExitStack() as stack:
                database = (f"sqlite:///{tmp}/state.db" if store == "sqlite"
                            else stack.enter_context(scratch_schema(postgres, "bench")))
                with servers(Path(tmp), database, count) as started:
                    load = throughput([url for url, _ in started], seconds)
            best = results[store].setdefault(count, {"runs_per_second": 0.0, "failed": 0})
            best["runs_per_second"] = max(best["runs_per_second"], load.runs_per_second)
            best["failed"] += load.failed
    if not postgres:
        results["postgres"] = {"missing": "no Postgres: pass --postgres URL or set BACKCHANNEL_TEST_POSTGRES"}
    return results


def render(results: dict[str, Any], out: Any) -> None:
    sqlite, pg = results["sqlite"], results["postgres"]
    print(f"\nOne-step runs/s through the HTTP API, {CLIENTS} concurrent clients (wrk), best of the samples",
          file=out)
    print(f"{'':<28}{'runs/s':>10}{'vs 1 process':>14}{'failed':>9}", file=out)
    print(f"{'SQLite, 1 process':<28}{sqlite[1]['runs_per_second']:>10,.0f}{'':>14}{sqlite[1]['failed']:>9,}",
          file=out)
    if "missing" in pg:
        print(f"Postgres: not measured ({pg['missing']})", file=out)
        return
    rate = {n: pg[n]["runs_per_second"] for n in PROCESSES}
    for n in PROCESSES:
        label = f"Postgres, {n} process" + ("es" if n > 1 else "")
        print(f"{label:<28}{rate[n]:>10,.0f}{rate[n] / rate[1]:>13.2f}×{pg[n]['failed']:>9,}", file=out)
    scaling, share = rate[2] / rate[1], rate[1] / sqlite[1]["runs_per_second"]
    print(f"scaling 1 → 2 processes: {scaling:.2f}× (target ≥ {TARGETS['scaling_1_to_2']}×); 1 → 4: "
          f"{rate[4] / rate[1]:.2f}×", file=out)
    print(f"Postgres, 1 process, as a share of SQLite: {share:.0%} (target ≥ "
          f"{TARGETS['postgres_share_of_sqlite']:.0%})", file=out)
    failed = sum(each["failed"] for each in [sqlite[1], *(pg[n] for n in PROCESSES)])
    if failed:
        print(f"{failed:,} requests failed (timeouts, socket errors or non-2xx): the rates count only the others",
              file=out)


def main(argv: list[str] | None = None) -> int:
    args = arguments(__doc__, "shorter samples (about a minute)", postgres=True).parse_args(argv)
    results = run(args.postgres, 3.0 if args.quick else 8.0, 1 if args.quick else 3)
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
