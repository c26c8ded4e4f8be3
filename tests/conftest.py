"""Suite-wide checks."""

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    # An empty run must fail loudly, never pass as "no tests ran".
    if not session.items:
        raise pytest.UsageError("no tests were collected: the suite lives in tests/ (see pyproject.toml)")
