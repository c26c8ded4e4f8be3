"""What a one-step run costs on the Postgres side, counted rather than timed: statements, commits, WAL, HOT updates.

``pg_cpu.py``'s CPU samples move by ±10-20 % on a shared two-core machine, more than most single cuts; this
counts what a cut changes deterministically. The same load as ``pg_cpu.py`` (``wrk``, 32 connections split
over 1 and 4 ``backchannel serve`` processes, ``POST /threads/{new id}/runs/wait`` of the one-step echo agent)
for a few seconds, and per run ended: the statements executed and their execution time (``pg_stat_statements``),
the database's commits, read-only ones too (``pg_stat_database``), WAL records, bytes, full-page images and
syncs (``pg_stat_wal``: a commit that wrote waits for one, or finds it made by another's), the
share of updates of ``threads`` and ``runs`` that were HOT (no new index entries), the context switches of the
servers and of their backends (waits: each a wake-up; preempted: the cores were busy), and the statements that
cost most. The counters are the cluster's: use a cluster of your own, with ``pg_stat_statements`` in
``shared_preload_libraries`` (``.ci/run`` starts a throwaway cluster; add the setting to its configuration).
With ``--past``, each connection continues a thread of its own (made by a second of load before the counted one)
instead of making a new thread per run: runs on threads with a past, a chat's second and later turns. Usage::

    python bench/pg_per_run.py [--quick] [--past] [--json] [--postgres URL]
"""

from __future__ import annotations

import shutil
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
from pg_cpu import CONNECTIONS, Database, warm_up  # noqa: E402
from scale import servers  # noqa: E402
from server import children, wrk_load  # noqa: E402

COUNTS = (1, 4)  # server processes
TOP = 5  # statements shown, by execution time
STATS_FLUSHED = 2.5  # seconds: a backend reports its table counters once idle, at most once a second


def switches(pids: list[int]) -> dict[int, tuple[int, int]]:
    """Each process's voluntary (waits: a socket read, a lock) and involuntary (preempted) context switches, all its
    threads; a process gone is left out."""
    found = {}
    for pid in pids:
        try:
            fields = [dict(line.split(":\t") for line in (task / "status").read_text().splitlines() if ":\t" in line)
                      for task in Path(f"/proc/{pid}/task").iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            continue
        found[pid] = (sum(int(f["voluntary_ctxt_switches"]) for f in fields),
                      sum(int(f["nonvoluntary_ctxt_switches"]) for f in fields))
    return found


def switched(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]], runs: int) -> list[float]:
    """Waits and preemptions per run; a process started meanwhile counts from zero (as ``pg_cpu.py``'s CPU)."""
    return [sum(now[i] - before.get(pid, (0, 0))[i] for pid, now in after.items()) / runs for i in (0, 1)]


def counters(conn: Any, schema: str) -> dict[str, Any]:
    """The cluster's cumulative counters this bench reads."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    wal = conn.execute("SELECT wal_records, wal_bytes, wal_fpi, wal_sync FROM pg_stat_wal").fetchone()
    commits = conn.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()").fetchone()
    tables = {r[0]: (r[1], r[2]) for r in conn.execute(
        "SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = %s "
        "AND relname IN ('threads', 'runs')", (schema,))}
    return {"wal": wal, "commits": commits[0], "tables": tables}


def measure(postgres: str, count: int, seconds: float, *, past: bool = False) -> dict[str, Any]:
    import psycopg

    from backchannel.runtime.postgres import scratch_schema

    wrk = shutil.which("wrk")
    if wrk is None:
        raise SystemExit("bench/pg_per_run.py needs wrk: apt-get install wrk")
    with tempfile.TemporaryDirectory(prefix="bench-pg-per-run-") as tmp, ExitStack() as stack:
        url = stack.enter_context(scratch_schema(postgres, "bench"))
        schema = url.rsplit("search_path%3D", 1)[1]
        app = f"bench_{uuid.uuid4().hex[:12]}"
        database = Database(f"{url}&application_name={app}", app)
        started = stack.enter_context(servers(Path(tmp), database.url, count))
        urls, pids = [u for u, _ in started], [p for _, pid in started for p in (pid, *children(pid))]
        warm_up(urls)
        connections = CONNECTIONS // count
        key = uuid.uuid4().hex[:6] if past else None  # the same threads in both loads: made by the first
        if key is not None:
            wrk_load(wrk, urls, connections, connections, 1.0, past=key)
        with psycopg.connect(postgres, autocommit=True) as conn:
            try:
                conn.execute("SELECT pg_stat_statements_reset()")
            except psycopg.errors.UndefinedFunction:
                raise SystemExit("bench/pg_per_run.py needs pg_stat_statements: in shared_preload_libraries, and "
                                 "CREATE EXTENSION pg_stat_statements in the database") from None
            runs, before = database.ended_runs(), counters(conn, schema)
            servers_before, backends_before = switches(pids), switches(database.backends())
            wrk_load(wrk, urls, connections if past else 1, connections, seconds, past=key)
            servers_after, backends_after = switches(pids), switches(database.backends())
            time.sleep(STATS_FLUSHED)
            runs, after = database.ended_runs() - runs, counters(conn, schema)
            statements = conn.execute(
                "SELECT calls, total_exec_time, wal_records, regexp_replace(query, '\\s+', ' ', 'g') "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "AND query NOT LIKE '%%pg_stat%%' ORDER BY total_exec_time DESC").fetchall()
    wal = [(b - a) / runs for a, b in zip(before["wal"], after["wal"], strict=True)]
    hot = {}
    for table in ("threads", "runs"):
        (upd0, hot0), (upd1, hot1) = before["tables"].get(table, (0, 0)), after["tables"][table]
        hot[table] = (hot1 - hot0) / (upd1 - upd0) if upd1 > upd0 else float("nan")
    return {
        "runs": runs,
        "statements_per_run": sum(s[0] for s in statements) / runs,
        "execution_us_per_run": sum(s[1] for s in statements) * 1e3 / runs,
        "commits_per_run": (after["commits"] - before["commits"]) / runs,
        "wal_records_per_run": wal[0], "wal_bytes_per_run": float(wal[1]), "wal_fpi_per_run": wal[2],
        "wal_syncs_per_run": wal[3],
        "server_switches_per_run": switched(servers_before, servers_after, runs),
        "backend_switches_per_run": switched(backends_before, backends_after, runs),
        "hot_share_of_updates": hot,
        "top": [{"calls_per_run": c / runs, "us_per_call": t * 1e3 / c, "wal_records_per_call": w / c,
                 "statement": q[:100]} for c, t, w, q in statements[:TOP]],
    }


def render(results: dict[str, Any], out: Any) -> None:
    print(f"\nPostgres per one-step run, {CONNECTIONS} connections (wrk); counters of the whole cluster", file=out)
    print(f"{'processes':<11}{'runs':>7}{'statements':>12}{'exec µs':>9}{'commits':>9}{'WAL syncs':>11}"
          f"{'WAL records':>13}{'WAL bytes':>11}{'FPI':>6}{'HOT threads':>13}{'HOT runs':>10}"
          f"{'server waits · preempted':>26}{'backend waits · preempted':>27}", file=out)
    for count, row in results.items():
        hot = row["hot_share_of_updates"]
        print(f"{count:<11}{row['runs']:>7,}{row['statements_per_run']:>12.2f}{row['execution_us_per_run']:>9.0f}"
              f"{row['commits_per_run']:>9.2f}{row['wal_syncs_per_run']:>11.2f}{row['wal_records_per_run']:>13.1f}{row['wal_bytes_per_run']:>11,.0f}"
              f"{row['wal_fpi_per_run']:>6.2f}{hot['threads']:>13.0%}{hot['runs']:>10.0%}"
              f"{'{:.1f} · {:.1f}'.format(*row['server_switches_per_run']):>26}"
              f"{'{:.1f} · {:.1f}'.format(*row['backend_switches_per_run']):>27}", file=out)
    for count, row in results.items():
        print(f"\n{count} process(es), the statements that cost most: calls per run · µs a call · WAL records a call",
              file=out)
        for s in row["top"]:
            print(f"  {s['calls_per_run']:5.2f} · {s['us_per_call']:6.1f} · {s['wal_records_per_call']:5.1f}  "
                  f"{s['statement']}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, "3 seconds of load a configuration, not 6", postgres=True)
    parser.add_argument("--past", action="store_true", help="runs on threads with a past (see above)")
    args = parser.parse_args(argv)
    if not args.postgres:
        raise SystemExit("bench/pg_per_run.py needs --postgres URL or BACKCHANNEL_TEST_POSTGRES")
    results = {count: measure(args.postgres, count, 3.0 if args.quick else 6.0, past=args.past) for count in COUNTS}
    emit_report(results, [render], args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
