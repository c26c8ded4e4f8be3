"""Property-based: requests generated from ``/openapi.json`` never get a 5xx, and every 4xx says what is wrong."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from server_agents import AGENTS  # noqa: E402
from server_helpers import ThreadServer  # noqa: E402

from backchannel.runtime import LocalRuntime  # noqa: E402
from backchannel.server import create_app  # noqa: E402
from backchannel.server.app import ENDPOINTS  # noqa: E402
from backchannel.server.openapi import openapi_document  # noqa: E402

# The same document the server serves at /openapi.json (checked below), known before the server starts.
SCHEMA = schemathesis.openapi.from_dict(openapi_document(ENDPOINTS, version="test"))
OPERATIONS = {op.label: op for op in (result.ok() for result in SCHEMA.get_all_operations())}


@pytest.fixture(scope="module")
def live():
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"], "calc": AGENTS["calc"]})
    with ThreadServer(create_app(runtime, heartbeat=0.5)) as server:
        yield server


def says_what_is_wrong(ctx, response, case) -> None:
    """A 4xx body is ``{"detail": "<a sentence>"}``, never empty and never a traceback."""
    if 400 <= response.status_code < 500:
        body = response.json()
        assert isinstance(body, dict) and isinstance(body.get("detail"), str) and body["detail"].strip(), body
        assert "Traceback" not in response.text


def test_the_document_is_the_served_one(live):
    import httpx

    served = httpx.get(f"{live.url}/openapi.json").json()
    assert served["paths"] == SCHEMA.raw_schema["paths"]


@pytest.mark.parametrize("label", sorted(OPERATIONS))
def test_no_request_breaks_the_server(live, label):
    @given(case=OPERATIONS[label].as_strategy())
    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def check(case):
        case.call_and_validate(base_url=live.url, checks=[not_a_server_error, says_what_is_wrong])

    check()
