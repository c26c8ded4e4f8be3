"""A run whose execution kills its process (a crashing native library, the OOM killer, ``os._exit``).

Issue 15.1, the runtime's part. Every start of the server picks the run up again
from its last checkpoint, and it kills the server again. Attempts are counted in
storage as the run is claimed, so after a bounded number of them the run ends
``error`` with a message saying why, and the server stays up; the other runs go on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "server"))
from server_helpers import ProcessServer, user  # noqa: E402

ATTEMPTS = 3  # the runtime's default bound


def _serve(db: str, log: Path) -> ProcessServer:
    return ProcessServer(["poison=poison_agents:poison", "steady=poison_agents:steady"], db,
                         env={"PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "server")])}, log=log)


def _dies(server: ProcessServer, within: float) -> bool:
    """Start the server; whether it dies within ``within`` seconds of starting."""
    try:
        server.start()
    except RuntimeError:  # it died as it started
        return True
    try:
        server.process.wait(within)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.mark.parametrize("how", ["kill", "exit"])
def test_a_run_that_kills_its_process_ends_in_error_after_bounded_attempts(tmp_path, how):
    db = f"sqlite:///{tmp_path}/state.db"
    log = tmp_path / "serve.log"
    first = _serve(db, log).start()
    with httpx.Client(base_url=first.url, timeout=30) as http:
        doomed = http.post("/threads", json={}).json()["thread_id"]
        steady = http.post("/threads", json={}).json()["thread_id"]
        run = http.post(f"/threads/{doomed}/runs", json={"assistant_id": "poison", "input": user(how)}).json()
        assert http.post(f"/threads/{steady}/runs/wait",
                         json={"assistant_id": "steady", "input": user("before")}).json()["messages"][-1]["content"] \
            == "steady answer"
    assert first.process.wait(30) != 0  # the first attempt took it down

    deaths = 1
    while True:
        server = _serve(db, log)
        if not _dies(server, within=3.0):
            break
        deaths += 1
        assert deaths <= ATTEMPTS + 2, f"the run killed the server {deaths} times:\n{log.read_text()[-3000:]}"
    try:
        assert deaths == ATTEMPTS
        with httpx.Client(base_url=server.url, timeout=30) as http:
            ended = http.get(f"/threads/{doomed}/runs/{run['run_id']}").json()
            assert ended["status"] == "error"
            thread = http.get(f"/threads/{doomed}").json()
            assert thread["status"] == "error"
            message = thread["error"]["message"]
            assert f"{ATTEMPTS} times" in message and "process" in message, message
            # the other runs go on, on the same server
            answer = http.post(f"/threads/{steady}/runs/wait", json={"assistant_id": "steady", "input": user("after")})
            assert answer.json()["messages"][-1]["content"] == "steady answer"
            runs = http.get(f"/threads/{steady}/runs").json()
            assert [r["status"] for r in runs] == ["success", "success"]
            time.sleep(0.5)
            assert server.process.poll() is None
    finally:
        server.stop()
