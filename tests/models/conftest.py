"""Fixtures for the model adapter tests: a fake provider server on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from provider_fakes import FakeServer


@pytest.fixture
def server() -> Iterator[FakeServer]:
    fake = FakeServer().start()
    yield fake
    fake.stop()
