"""Node and the npm packages of ``tests/js`` (the official LangGraph JavaScript SDK, React, esbuild) for the tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

JS = Path(__file__).parent.parent / "js"


def node_modules() -> Path:
    """``tests/js/node_modules``, installed from the lockfile (``npm ci``) if missing or older than it.

    Skips the test without Node and npm (fails it in CI, whose ``.ci/run`` installs them).
    """
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):
        problem = "Node and npm are not installed: apt-get install -y nodejs npm (.ci/run installs them)"
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI must test the JavaScript SDK, but {problem}")
        pytest.skip(problem)
    modules = JS / "node_modules"
    installed = modules / ".package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < (JS / "package-lock.json").stat().st_mtime:
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS, capture_output=True, text=True,
                              timeout=600)
        if done.returncode != 0:
            pytest.fail(f"npm ci in {JS} failed:\n{done.stdout}\n{done.stderr}")
    return modules


def run_node(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``node tests/js/<script> args...``, its output captured (with Node 20's WebSocket client, which the
    SDK's WebSocket transport needs, switched on)."""
    node_modules()
    return subprocess.run(["node", "--experimental-websocket", script, *args], cwd=JS, capture_output=True,
                          text=True, timeout=timeout)
