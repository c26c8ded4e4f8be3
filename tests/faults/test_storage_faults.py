"""The database under a served runtime fails: nothing acknowledged is lost, and the failure is an answer.

Issue 15, items 3 and 4, on real ``backchannel serve`` processes and real SQLite files: a 2xx is
sent only once its write is committed (a kill -9 right after the response loses nothing); a full
disk is a 503 naming the cause, logged once, and the server works again as soon as space is
freed; a database file deleted or replaced under the server refuses further writes. Run alone with
``pytest tests/faults``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))
from server_helpers import ProcessServer, user  # noqa: E402

AGENTS = ["echo=storage_fault_agents:echo", "busy=storage_fault_agents:busy"]
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "server")])}


def _server(tmp_path: Path, database: Path | str) -> ProcessServer:
    url = database if isinstance(database, str) else f"sqlite:///{database}"
    return ProcessServer(AGENTS, url, env=ENV, log=tmp_path / "serve.log")


def _committed(database: Path | str, table: str, key: str, value: str) -> bool:
    """Whether a row is committed in the database, as another process (or the server after a crash) reads it."""
    query = f"SELECT 1 FROM {table} WHERE {key} = %s"
    if isinstance(database, str):
        import psycopg

        with psycopg.connect(database) as db:
            return db.execute(query, (value,)).fetchone() is not None
    with contextlib.closing(sqlite3.connect(database, timeout=10)) as db:
        return db.execute(query.replace("%s", "?"), (value,)).fetchone() is not None


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_write_acknowledged_is_committed_before_the_response_so_kill_9_loses_nothing(tmp_path, backend, request):
    """A run keeps the event loop busy (50 ms steps), so the end of a tick comes late; each response
    stops the server at once (SIGSTOP) and the database is read from outside: what a kill -9 would keep."""
    database = tmp_path / "state.db" if backend == "sqlite" else request.getfixturevalue("postgres_url")
    server = _server(tmp_path, database).start()
    acknowledged: list[tuple[str, str, str]] = []
    lost = None
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            busy = http.post("/threads", json={}).json()["thread_id"]
            assert http.post(f"/threads/{busy}/runs", json={"assistant_id": "busy", "input": user("go")}).is_success
            for i in range(30):
                if i % 2:
                    response = http.post("/threads", json={"metadata": {"i": i}})
                    row = ("threads", "thread_id", response.json()["thread_id"])
                else:
                    response = http.post(f"/threads/t-{i}/runs", json={
                        "assistant_id": "echo", "input": user("hi"), "if_not_exists": "create"})
                    row = ("runs", "run_id", response.json()["run_id"])
                server.process.send_signal(signal.SIGSTOP)  # right after the response: nothing more happens
                assert response.status_code == 200, response.text
                acknowledged.append(row)
                if not _committed(database, *row):
                    lost = row
                    break
                server.process.send_signal(signal.SIGCONT)
    finally:
        server.process.kill()  # SIGKILL, stopped or not
        server.process.wait(10)
    with _server(tmp_path, database):
        missing = [row for row in acknowledged if not _committed(database, *row)]
    assert lost is None and not missing, f"acknowledged, then lost to kill -9: {missing}"


# -- a full disk ----------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (as root, which CI runs as); skipped otherwise, never in CI."""
    mount = tmp_path / "disk"
    mount.mkdir()
    problem = None
    if os.geteuid() != 0:
        problem = "mounting a small tmpfs to fill needs root"
    else:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True)
        if done.returncode:
            problem = f"could not mount a tmpfs: {done.stderr.decode().strip()}"
    if problem:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI must test a full disk, but {problem}")
        pytest.skip(problem)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Take every free byte of the disk with one file; returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)
    return filler


def test_a_full_disk_is_a_503_naming_it_loses_nothing_acknowledged_and_passes_when_space_is_freed(tmp_path,
                                                                                                 small_disk):
    database = small_disk / "state.db"
    acknowledged: list[str] = []
    with _server(tmp_path, database) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        waiting = http.post("/threads", json={}).json()["thread_id"]
        acknowledged.append(waiting)
        filler = _fill(small_disk)
        refused = []
        for i in range(300):
            response = http.post("/threads", json={"metadata": {"i": i, "pad": "x" * 8000}})
            if response.status_code == 200:
                acknowledged.append(response.json()["thread_id"])
                continue
            assert response.status_code == 503, response.text
            refused.append(response.json()["detail"])
            if len(refused) == 20:
                break
        assert refused, "300 writes of 8 kB fitted on a full 4 MiB disk"
        assert all("full" in detail for detail in refused), refused
        # a run on the full disk is refused, never left hanging
        started = time.monotonic()
        response = http.post(f"/threads/{waiting}/runs/wait", json={"assistant_id": "echo", "input": user("hi")},
                             timeout=20)
        assert response.status_code == 503 and "full" in response.json()["detail"], response.text
        assert time.monotonic() - started < 10
        # space freed: the same server works again, and kept everything it acknowledged
        filler.unlink()
        response = http.post(f"/threads/{waiting}/runs/wait", json={"assistant_id": "echo", "input": user("again")})
        assert response.status_code == 200 and response.json()["messages"][-1]["content"] == "echo: again"
        assert http.post("/threads", json={}).status_code == 200
        assert [t for t in acknowledged if http.get(f"/threads/{t}").status_code != 200] == []
    log = (tmp_path / "serve.log").read_text()
    assert log.count("database or disk is full") == 1, log[-3000:]  # logged once, not once per write
    with _server(tmp_path, database) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert [t for t in acknowledged if http.get(f"/threads/{t}").status_code != 200] == []


# -- the file deleted or replaced -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_database_file_deleted_or_replaced_under_the_server_refuses_writes(tmp_path, how):
    database = tmp_path / "state.db"
    with _server(tmp_path, database) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        kept = http.post("/threads", json={}).json()["thread_id"]
        if how == "deleted":
            database.unlink()
        else:
            other = tmp_path / "other.db"
            sqlite3.connect(other).close()
            os.replace(other, database)
        for _ in range(3):
            response = http.post("/threads", json={})
            assert response.status_code == 503, response.text
            assert str(database) in response.json()["detail"] and how in response.json()["detail"]
        response = http.post(f"/threads/{kept}/runs/wait", json={"assistant_id": "echo", "input": user("hi")},
                             timeout=20)
        assert response.status_code == 503, response.text
        assert http.get(f"/threads/{kept}").status_code == 200  # what it has is still readable
    log = (tmp_path / "serve.log").read_text()
    assert log.count(f"was {how}") == 1, log[-3000:]


# -- two servers on one SQLite file -------------------------------------------------------------------


async def test_a_second_server_on_one_sqlite_file_is_refused_naming_the_first(tmp_path):
    """Issue 15.10: SQLite has no way for two servers to cancel, follow or take over each other's runs, so the
    second is refused with a message naming the first; runtimes embedded in other processes still share it."""
    from storage_fault_agents import echo

    from backchannel.runtime import LocalRuntime

    database = tmp_path / "state.db"
    first = _server(tmp_path, database).start()
    try:
        second = ProcessServer(AGENTS, f"sqlite:///{database}", env=ENV, log=tmp_path / "second.log")
        with pytest.raises(RuntimeError, match="did not start"):
            second.start()
        assert second.process.wait(30) != 0
        refusal = (tmp_path / "second.log").read_text()
        assert f"pid {first.process.pid}" in refusal and first.url in refusal and "Postgres" in refusal, refusal
        with httpx.Client(base_url=first.url, timeout=30) as http:  # the first serves on
            thread = http.post("/threads", json={}).json()["thread_id"]
            response = http.post(f"/threads/{thread}/runs/wait", json={"assistant_id": "echo", "input": user("hi")})
            assert response.json()["messages"][-1]["content"] == "echo: hi"
        async with LocalRuntime(f"sqlite:///{database}", agents={"echo": echo}) as rt:  # an embedded runtime too
            values = await rt.runs.wait(None, "echo", input=user("embedded"))
            assert values["messages"][-1]["content"] == "echo: embedded"
    finally:
        first.process.kill()  # kill -9: the file is free for the next server at once
        first.process.wait(10)
    with _server(tmp_path, database) as third, httpx.Client(base_url=third.url, timeout=30) as http:
        assert http.get(f"/threads/{thread}").status_code == 200
