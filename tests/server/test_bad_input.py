"""Bad input gets a typed 4xx naming what is wrong: never a 500, never a run that fails later, never an alias."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import user

DEEP = 1000


def nested(depth: int) -> str:
    """JSON text of objects nested ``depth`` levels deep (too deep for Python's json module to write)."""
    return '{"a": ' * depth + "{}" + "}" * depth


async def post(http, method: str, path: str, body: str) -> httpx.Response:
    return await http.request(method, path, content=body, headers={"content-type": "application/json"})


@pytest.fixture
async def http(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        yield client


@pytest.fixture
async def thread_id(http):
    return (await http.post("/threads", json={})).json()["thread_id"]


def refused(response: httpx.Response, *words: str) -> str:
    assert 400 <= response.status_code < 500, (response.status_code, response.text)
    detail = response.json()["detail"]
    for word in words:
        assert word in detail, (word, detail)
    return detail


async def runs_of(http, thread_id: str) -> list:
    return (await http.get(f"/threads/{thread_id}/runs")).json()


async def test_deeply_nested_json_is_refused_not_a_500(http, thread_id):
    # orjson refuses to parse past its depth limit; what it parses must also encode again.
    for depth in (DEEP, 250, 60):
        created = await post(http, "POST", "/threads", f'{{"metadata": {nested(depth)}}}')
        assert created.status_code in (200, 422), created.text
        if created.status_code == 200:  # stored: it must read back, and list, as it went in
            got = await http.get(f"/threads/{created.json()['thread_id']}")
            assert got.status_code == 200 and got.text.count('{"a":') == depth
            assert (await http.post("/threads/search", json={})).status_code == 200
        else:
            refused(created, "deep")
    assert created.status_code == 200  # 60 levels are fine
    run = await post(http, "POST", f"/threads/{thread_id}/runs/wait",
                     f'{{"assistant_id": "echo", "input": {{"messages": [], "extra": {nested(DEEP)}}}}}')
    refused(run, "deep")
    store = await post(http, "PUT", "/store/items", f'{{"namespace": ["n"], "key": "k", "value": {nested(DEEP)}}}')
    refused(store, "deep")
    assert await runs_of(http, thread_id) == []
    assert (await http.get("/ok")).status_code == 200


async def test_long_integers_in_a_body_are_kept_or_refused_not_a_500(http):
    # Integers past 64 bits are read by Python's json module (orjson takes them for floats), which refuses more
    # digits than Python converts, and recurses: neither may be a 500.
    kept = await post(http, "POST", "/threads", f'{{"metadata": {{"n": {2**70}}}}}')
    assert kept.status_code == 200 and f'"n":{2**70}'.encode() in kept.content
    refused(await post(http, "POST", "/threads", f'{{"metadata": {{"n": {"9" * 5000}}}}}'), "Invalid JSON")
    deep = f'{{"metadata": {{"n": {2**70}, "m": {nested(100_000)}}}}}'
    refused(await post(http, "POST", "/threads", deep), "deep")
    assert (await http.get("/ok")).status_code == 200


@pytest.mark.parametrize("path, params", [
    ("/threads/{tid}/runs", {"limit": 2**63}),
    ("/threads/{tid}/runs", {"offset": 2**63}),
    ("/threads/{tid}/history", {"limit": 2**63}),
])
async def test_huge_query_numbers_are_422(http, thread_id, path, params):
    answer = await http.get(path.format(tid=thread_id), params=params)
    refused(answer, next(iter(params)))


@pytest.mark.parametrize("path, body", [
    ("/threads/search", {"limit": 2**63}),
    ("/threads/search", {"offset": 2**63}),
    ("/assistants/search", {"offset": 2**63}),
    ("/store/items/search", {"offset": 2**63}),
    ("/store/namespaces", {"offset": 2**63}),
    ("/threads/search", {"offset": 2**64 + 1}),
])
async def test_huge_body_numbers_are_422(http, path, body):
    refused(await http.post(path, json=body), next(iter(body)))


async def test_after_seconds_far_in_the_future_is_422(http, thread_id):
    for value in (1e300, float(10**12)):
        answer = await http.post(f"/threads/{thread_id}/runs", json={
            "assistant_id": "echo", "input": user("later"), "after_seconds": value})
        refused(answer, "after_seconds")
    assert await runs_of(http, thread_id) == []
    ok = await http.post(f"/threads/{thread_id}/runs", json={"assistant_id": "echo", "input": user("soon"),
                                                             "after_seconds": 0.01})
    assert ok.status_code == 200


@pytest.mark.parametrize("values, words", [
    ({"messages": [{"role": "wizard", "content": "x"}]}, ["messages"]),
    ({"messages": [{"content": 5}]}, ["messages"]),
    ({"messages": 5}, ["messages"]),
    ({"messages": [[1, 2, 3]]}, ["messages"]),
    (5, ["values"]),
])
async def test_a_malformed_state_update_is_422(http, thread_id, values, words):
    refused(await http.post(f"/threads/{thread_id}/state", json={"values": values}), *words)
    assert (await http.get(f"/threads/{thread_id}/state")).json()["values"] == {}


@pytest.mark.parametrize("body, words", [
    ({"input": 5}, ["input"]),
    ({"input": True}, ["input"]),
    ({"input": {"messages": [{"role": "wizard", "content": "x"}]}}, ["messages"]),
    ({"command": {"update": [1, 2, 3]}}, ["command.update"]),
    ({"command": {"update": {"messages": 7}}}, ["command.update"]),
    ({"command": {"goto": "nowhere"}}, ["nowhere"]),
    ({"command": {"goto": ["model", "tools"]}}, ["goto"]),
    ({"command": {"goto": 5}}, ["goto"]),
    ({"command": {}}, ["command"]),
    ({"config": {"recursion_limit": 0}}, ["recursion_limit"]),
    ({"config": {"recursion_limit": "many"}}, ["recursion_limit"]),
    ({"input": user("x"), "command": {"resume": "yes"}}, ["input", "command"]),
])
async def test_a_run_that_would_fail_is_422_and_not_created(http, thread_id, body, words):
    for route in ("runs", "runs/wait", "runs/stream"):
        answer = await http.post(f"/threads/{thread_id}/{route}", json={"assistant_id": "echo", **body})
        refused(answer, *words)
    assert await runs_of(http, thread_id) == []


async def test_a_huge_last_event_id_is_refused_or_ignored_not_a_500(http, thread_id):
    run = (await http.post(f"/threads/{thread_id}/runs", json={"assistant_id": "echo", "input": user("hi"),
                                                               "stream_resumable": True})).json()
    await http.get(f"/threads/{thread_id}/runs/{run['run_id']}/join")
    for last in ("9" * 5000, "-2", "abc", "1e5"):
        answer = await http.get(f"/threads/{thread_id}/runs/{run['run_id']}/stream",
                                headers={"last-event-id": last})
        refused(answer, "Last-Event-ID")


async def test_a_bad_stream_mode_on_join_stream_is_422(http, thread_id):
    run = (await http.post(f"/threads/{thread_id}/runs", json={"assistant_id": "echo", "input": user("hi")})).json()
    for mode in ("valuez", '["values", "bogus"]', "[1]", '["values"'):
        answer = await http.get(f"/threads/{thread_id}/runs/{run['run_id']}/stream", params={"stream_mode": mode})
        refused(answer, "stream_mode")


async def test_a_namespace_label_cannot_alias_another_namespace(http):
    for label in ("a\x1fb", "a.b", "", "a\x00b"):
        answer = await http.put("/store/items", json={"namespace": ["ns", label], "key": "k", "value": {"v": 1}})
        refused(answer, "amespace")
    await http.put("/store/items", json={"namespace": ["a", "b"], "key": "k", "value": {"v": 1}})
    found = await http.post("/store/items/search", json={"namespace_prefix": ["a\x1fb"]})
    refused(found, "amespace")
    listed = await http.post("/store/namespaces", json={"prefix": ["a\x1fb"]})
    refused(listed, "amespace")
