"""Browsers: CORS for web apps on other origins, and no way in for a foreign page (Host, Origin, content type)."""

from __future__ import annotations

import httpx
import pytest
from server_agents import AGENTS
from server_helpers import ProcessServer, ThreadServer

from backchannel.runtime import LocalRuntime
from backchannel.server import create_app
from backchannel.server.browsers import default_policy

UI = "http://localhost:5173"  # a web app's dev server on this machine
EVIL = "https://evil.example"


def preflight(origin: str, method: str = "POST") -> dict[str, str]:
    return {"origin": origin, "access-control-request-method": method,
            "access-control-request-headers": "content-type,x-api-key"}


async def test_a_web_app_on_another_local_origin_may_call_a_keyless_server(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        answer = await http.options("/threads", headers={**preflight(UI), "access-control-request-private-network":
                                                         "true"})
        assert answer.status_code == 200
        assert answer.headers["access-control-allow-origin"] == UI
        assert "POST" in answer.headers["access-control-allow-methods"]
        assert "x-api-key" in answer.headers["access-control-allow-headers"].lower()
        assert answer.headers["access-control-allow-private-network"] == "true"
        created = await http.post("/threads", json={}, headers={"origin": UI})
        assert created.status_code == 200 and created.headers["access-control-allow-origin"] == UI
        assert "content-location" in created.headers["access-control-expose-headers"]  # the SDK reads it
        studio = await http.options("/threads", headers=preflight("https://smith.langchain.com"))
        assert studio.headers["access-control-allow-origin"] == "https://smith.langchain.com"


async def test_a_foreign_page_cannot_drive_a_keyless_server(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        before = (await http.post("/threads/count", json={})).json()
        refused = await http.options("/threads", headers=preflight(EVIL))
        assert refused.status_code == 403 and "access-control-allow-origin" not in refused.headers
        # A "simple" request needs no preflight: the page sends it and cannot read the answer, so it must be refused.
        simple = await http.post("/threads", content=b'{"metadata": {"x": 1}}',
                                 headers={"origin": EVIL, "content-type": "text/plain"})
        assert simple.status_code == 403 and "evil.example" in simple.json()["detail"]
        assert "--cors-origins" in simple.json()["detail"]
        # Without an Origin (an old browser, a plugin), a body that is not JSON is refused all the same.
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            plain = await http.post("/threads", content=b'{"metadata": {}}', headers={"content-type": content_type})
            assert plain.status_code == 415, content_type
            assert "application/json" in plain.json()["detail"]
        # DNS rebinding: the page's own name resolves to 127.0.0.1, so the browser sends it as the Host.
        rebound = await http.post("/threads", json={}, headers={"host": "evil.example:2024"})
        assert rebound.status_code == 403 and "--allowed-hosts" in rebound.json()["detail"]
        assert (await http.get("/threads/x", headers={"host": "evil.example"})).status_code == 403
        assert (await http.post("/threads/count", json={})).json() == before  # nothing was created
        # What clients send is served: JSON (with a charset), loopback names and IP addresses as the Host.
        for host in ("localhost", "localhost:8123", "127.0.0.1:9", "[::1]:8123", "app.localhost"):
            assert (await http.get("/ok", headers={"host": host})).status_code == 200, host
        assert (await http.post("/threads", content=b"{}", headers={
            "content-type": "application/json; charset=utf-8"})).status_code == 200
        # The server's own pages (the demo page) are same-origin: their Origin is the Host.
        own = await http.post("/threads", json={}, headers={"origin": server.url})
        assert own.status_code == 200


async def test_with_an_api_key_any_origin_and_host_may_call_with_the_key():
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, api_key="k")) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            answer = await http.options("/threads", headers=preflight(EVIL))
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
            unauthorized = await http.post("/threads", json={}, headers={"origin": EVIL})
            # the browser app can read why it was refused
            assert unauthorized.status_code == 401 and unauthorized.headers["access-control-allow-origin"] == "*"
            ok = await http.post("/threads", json={}, headers={"origin": EVIL, "x-api-key": "k",
                                                               "host": "agents.example.com"})
            assert ok.status_code == 200


async def test_configured_origins_and_hosts_replace_the_defaults():
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    policy = default_policy(api_key=None, cors_origins=["https://ui.example.com"], allowed_hosts=["agents.lan"])
    with ThreadServer(create_app(runtime, browsers=policy)) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            answer = await http.options("/threads", headers=preflight("https://ui.example.com"))
            assert answer.headers["access-control-allow-origin"] == "https://ui.example.com"
            assert (await http.options("/threads", headers=preflight(UI))).status_code == 403  # no longer allowed
            assert (await http.get("/ok", headers={"host": "agents.lan:8123"})).status_code == 200
            assert (await http.get("/ok", headers={"host": "other.lan"})).status_code == 403


async def test_hosts_are_judged_alike_however_many_names_came_before(server):
    # The guard remembers a verdict per Host value, a bounded number of them: a stream of made-up names
    # (more than it keeps) is refused one by one, and the names it served before are still served.
    async with httpx.AsyncClient(base_url=server.url) as http:
        for round_ in range(2):
            for n in range(300):
                answer = await http.get("/ok", headers={"host": f"rebind-{n}.example:8123"})
                assert answer.status_code == 403, (round_, n)
            for host in ("localhost:8123", "127.0.0.1:9", "[::1]:8123"):
                assert (await http.get("/ok", headers={"host": host})).status_code == 200, host


@pytest.mark.parametrize("extra, host, origin, status", [
    ([], "evil.example", None, 403),
    (["--allowed-hosts", "agents.lan"], "agents.lan", None, 200),
    (["--cors-origins", "https://ui.example.com"], None, "https://ui.example.com", 200),
    (["--cors-origins", "*"], None, EVIL, 200),
])
def test_serve_takes_cors_origins_and_allowed_hosts(tmp_path, extra, host, origin, status):
    with ProcessServer(["echo=server_agents:echo"], f"sqlite:///{tmp_path / 'db'}", extra=extra) as live:
        headers = {k: v for k, v in (("host", host), ("origin", origin)) if v}
        assert httpx.post(f"{live.url}/threads", json={}, headers=headers).status_code == status
