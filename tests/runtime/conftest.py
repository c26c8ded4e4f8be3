"""Fixtures for the runtime tests (helpers live in ``runtime_helpers``)."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_helpers import echo_agent

from backchannel.runtime import LocalRuntime


@pytest.fixture
async def make_runtime(store_url):
    """``await make_runtime(agents, store=..., **kw)``: an open LocalRuntime, closed after the test.

    Without ``store``, each test runs on every backend: memory, a SQLite file and Postgres.
    """
    opened: list[LocalRuntime] = []
    default = store_url

    async def make(agents: dict[str, Any], store: Any = None, **kwargs: Any) -> LocalRuntime:
        rt = LocalRuntime(store=store or default, agents=agents, **kwargs)
        await rt.open()
        opened.append(rt)
        return rt

    yield make
    for rt in reversed(opened):
        await rt.close()


@pytest.fixture
async def rt(make_runtime):
    """A memory runtime with an echo agent registered as ``agent``."""
    return await make_runtime({"agent": echo_agent()})

