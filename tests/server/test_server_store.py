"""The store over HTTP with the official client."""

from __future__ import annotations

import httpx


async def test_put_get_search_list_and_delete(client):
    await client.store.put_item(["users", "ada"], "prefs", {"theme": "dark"})
    await client.store.put_item(["users", "ada"], "notes", {"text": "likes math"})
    await client.store.put_item(["users", "bob"], "prefs", {"theme": "light"})
    item = await client.store.get_item(["users", "ada"], "prefs")
    assert item["value"] == {"theme": "dark"} and item["namespace"] == ["users", "ada"]
    assert await client.store.get_item(["users", "ada"], "missing") is None
    ada = await client.store.search_items(["users", "ada"])
    assert sorted(i["key"] for i in ada["items"]) == ["notes", "prefs"]
    dark = await client.store.search_items(["users"], filter={"theme": "dark"})
    assert [(i["namespace"], i["key"]) for i in dark["items"]] == [(["users", "ada"], "prefs")]
    namespaces = (await client.store.list_namespaces(prefix=["users"]))["namespaces"]
    assert sorted(namespaces) == [["users", "ada"], ["users", "bob"]]
    await client.store.put_item(["users", "ada"], "prefs", {"theme": "solarized"})
    assert (await client.store.get_item(["users", "ada"], "prefs"))["value"] == {"theme": "solarized"}
    await client.store.delete_item(["users", "ada"], "prefs")
    assert await client.store.get_item(["users", "ada"], "prefs") is None


async def test_bad_namespaces_and_keys_are_422(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        dotted = await http.put("/store/items", json={"namespace": ["a.b"], "key": "k", "value": {}})
        no_key = await http.get("/store/items", params={"namespace": "a"})
        not_object = await http.put("/store/items", json={"namespace": ["a"], "key": "k", "value": [1]})
    assert dotted.status_code == 422 and "without periods" in dotted.json()["detail"]
    assert no_key.status_code == 422 and "key" in no_key.json()["detail"]
    assert not_object.status_code == 422 and "value" in not_object.json()["detail"]
