"""Fixtures for the server tests: one real server (SQLite file) per module, and SDK clients for it."""

from __future__ import annotations

import pytest
from browser_helpers import start_chromium
from server_agents import AGENTS
from server_helpers import ThreadServer

from backchannel.runtime import LocalRuntime
from backchannel.server import create_app, served


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A live server for the test agents on a SQLite file; ``server.url``."""
    db = tmp_path_factory.mktemp("server") / "state.db"
    runtime = LocalRuntime(f"sqlite:///{db}", {name: served(agent) for name, agent in AGENTS.items()})
    with ThreadServer(create_app(runtime, heartbeat=0.2, grace=1.0)) as live:
        yield live


@pytest.fixture
async def client(server):
    """The official async client (``langgraph_sdk.get_client``) for the server."""
    from langgraph_sdk import get_client

    client = get_client(url=server.url, api_key=None)
    yield client
    await client.http.client.aclose()


@pytest.fixture
def sync_client(server):
    """The official sync client for the server."""
    from langgraph_sdk import get_sync_client

    client = get_sync_client(url=server.url, api_key=None)
    yield client
    client.http.client.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium driven by Selenium (skipped without Chromium, failed in CI), one per test module."""
    chrome = start_chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield chrome
    chrome.quit()
