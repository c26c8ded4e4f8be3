"""Fixtures for the runtime tests (helpers live in ``runtime_helpers``)."""

from __future__ import annotations

from typing import Any

import pytest
from runtime_helpers import echo_agent

from backchannel.runtime import LocalRuntime


@pytest.fixture(params=["memory", "sqlite"])
async def make_runtime(request, tmp_path):
    """``await make_runtime(agents, store=..., **kw)``: an open LocalRuntime, closed after the test.

    Without ``store``, each test runs on both backends: memory and a SQLite file.
    """
    opened: list[LocalRuntime] = []
    default = "memory" if request.param == "memory" else f"sqlite:///{tmp_path}/default.db"

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

