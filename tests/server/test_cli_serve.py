"""The command line against a server: ``backchannel serve``, ``run --url``, ``threads --url``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import httpx
from server_helpers import ProcessServer, free_port


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "backchannel.cli", *args], capture_output=True, text=True,
                          timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_run_and_threads_against_a_served_agent(tmp_path):
    with ProcessServer(["server_agents:AGENTS"], f"sqlite:///{tmp_path}/state.db") as server:
        asked = cli("run", "2 + 3?", "--url", server.url, "--assistant", "calc")
        assert asked.returncode == 0, asked.stderr
        assert "→ add(a=2, b=3)" in asked.stdout and "calc › the answer is 5" in asked.stdout
        thread_id = asked.stdout.split("thread ")[-1].split()[0]
        shown = cli("threads", "show", thread_id, "--url", server.url)
        assert "the answer is 5" in shown.stdout
        unknown = cli("run", "hi", "--url", server.url, "--assistant", "nobody")
        assert unknown.returncode == 1 and "assistant 'nobody' not found" in unknown.stderr  # errors go to stderr


def test_serve_refuses_an_open_host_without_a_key(tmp_path):
    refused = cli("serve", "--host", "0.0.0.0", "--demo", "--database", f"sqlite:///{tmp_path}/x.db")
    assert refused.returncode == 2 and "without an API key" in refused.stdout
    nothing = cli("serve", "--database", f"sqlite:///{tmp_path}/x.db")
    assert nothing.returncode == 2 and "nothing to serve" in nothing.stdout
    bad = cli("serve", "--agents", "no_such_module:agent", "--database", f"sqlite:///{tmp_path}/x.db")
    assert bad.returncode == 1 and "cannot load no_such_module:agent" in bad.stderr


def test_serve_runs_at_most_max_concurrency_runs_at_once(tmp_path):
    with ProcessServer(["server_agents:AGENTS"], f"sqlite:///{tmp_path}/state.db",
                       extra=["--max-concurrency", "2"]) as server, httpx.Client(base_url=server.url) as http:
        for _ in range(4):  # the glacial agent takes 5 s a run
            http.post(f"/threads/{uuid.uuid4()}/runs", json={
                "assistant_id": "glacial", "input": {"messages": [{"role": "user", "content": "hi"}]},
                "if_not_exists": "create"}).raise_for_status()
        deadline = time.monotonic() + 4
        while (statuses := _run_statuses(http)).count("running") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(statuses) == ["pending", "pending", "running", "running"]


def _run_statuses(http: httpx.Client) -> list[str]:
    threads = http.post("/threads/search", json={"limit": 10}).raise_for_status().json()
    return [run["status"] for t in threads
            for run in http.get(f"/threads/{t['thread_id']}/runs").raise_for_status().json()]


# Modules `backchannel serve` has no use for when serving an agent: the chat's Markdown and live display, cron
# expressions (until a cron exists), the deep agent and its workspace (the demo page's), exporters' entry points
# and the optional integrations. Each costs the server's start 5-30 ms of CPU (`python -X importtime`).
NOT_FOR_SERVING = ("rich.markdown", "rich.live", "markdown_it", "pygments", "croniter", "dateutil",
                   "backchannel.deep_agent", "backchannel.subagents", "backchannel.async_tasks",
                   "backchannel.workspace", "backchannel.mcp", "opentelemetry", "langchain_core", "prompt_toolkit")


def test_serve_imports_only_what_serving_an_agent_needs(tmp_path):
    (tmp_path / "plain_agent.py").write_text(
        "from backchannel import ScriptedModel, create_agent\n\n"
        "agent = create_agent(ScriptedModel(['hello'], loop=True), name='plain')\n")
    log = tmp_path / "serve.log"
    with ProcessServer(["plain=plain_agent:agent"], f"sqlite:///{tmp_path}/state.db", log=log,
                       env={"PYTHONPATH": str(tmp_path), "PYTHONPROFILEIMPORTTIME": "1"}) as server:
        httpx.post(f"{server.url}/runs/wait", json={"assistant_id": "plain", "input": {}}).raise_for_status()
    imported = {line.rsplit("|", 1)[-1].strip() for line in log.read_text().splitlines()
                if line.startswith("import time:")}
    assert "backchannel.server.app" in imported and "uvicorn" in imported  # the log is read right
    assert sorted(name for name in imported
                  if any(name == unneeded or name.startswith(f"{unneeded}.") for unneeded in NOT_FOR_SERVING)) == []


def test_a_server_builds_request_schemas_when_requests_need_them_not_as_it_starts(tmp_path):
    # In a process of its own: this one's other tests have built them already.
    script = ("import json, sys\n"
              "from backchannel.runtime import LocalRuntime\n"
              "from backchannel.server import create_app, schemas\n"
              f"create_app(LocalRuntime('sqlite:///{tmp_path}/state.db', agents={{}}))\n"
              "print(json.dumps([n for n in schemas.__all__ if getattr(schemas, n).__pydantic_complete__]))\n")
    started = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == "[]"  # none built: /openapi.json and each body's first request build them


def test_a_server_collects_garbage_as_one_holding_many_requests_should(tmp_path):
    # Python's default (the youngest objects collected every 700 made) had 1,000 live streams spend ~15 % of the
    # server's CPU walking their tasks and futures; and what was loaded before serving is never garbage.
    script = ("import gc, os, signal\n"
              "from backchannel import ScriptedModel, create_agent\n"
              "from backchannel.server.serving import serve\n"
              "def ready():\n"
              "    print(gc.get_threshold()[0], gc.get_freeze_count(), flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              f"serve({{'a': create_agent(ScriptedModel(['hi']))}}, port={free_port()}, "
              f"database='sqlite:///{tmp_path}/state.db', on_ready=ready, log_level='warning')\n")
    served = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert served.stdout, served.stderr  # (it ends as a server sent SIGINT does)
    young, frozen = map(int, served.stdout.split())
    assert young >= 50_000 and frozen > 10_000
