"""Suite-wide checks and fixtures."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

POSTGRES_ENV = "BACKCHANNEL_TEST_POSTGRES"
BACKENDS = ["memory", "sqlite", "postgres"]


def pytest_collection_finish(session: pytest.Session) -> None:
    # An empty run must fail loudly, never pass as "no tests ran".
    if not session.items:
        raise pytest.UsageError("no tests were collected: the suite lives in tests/ (see pyproject.toml)")


def postgres_server() -> str:
    """The test Postgres URL; skips the test when there is none (fails it in CI, which must have one)."""
    url = os.environ.get(POSTGRES_ENV)
    problem = None if url else f"no Postgres to test on: set {POSTGRES_ENV}=postgresql://... (.ci/run starts one)"
    if url:
        try:
            import psycopg  # noqa: F401
        except ImportError:
            problem = "psycopg is not installed: pip install -e '.[test]'"
    if problem:
        if os.environ.get("CI", "").lower() in ("true", "1"):
            pytest.fail(f"CI must test on Postgres, but {problem}")
        pytest.skip(problem)
    return url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose tables go to a fresh schema of the test Postgres, dropped after the test."""
    from backchannel.runtime.postgres import scratch_schema

    with scratch_schema(postgres_server(), "test") as url:
        yield url


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    """A fresh store of each backend in turn: memory, a SQLite file, a Postgres schema."""
    if request.param == "memory":
        return "memory"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/default.db"
    return request.getfixturevalue("postgres_url")
