"""The key-value store: items by namespace and key, search, namespaces."""

import asyncio

import pytest

from backchannel import InvalidRequestError, ScriptedModel, ToolRuntime, create_agent, tool

ITEM_KEYS = {"namespace", "key", "value", "created_at", "updated_at"}


async def test_put_get_and_overwrite(rt):
    assert await rt.store.put_item(["users", "u1"], "prefs", {"theme": "dark"}) is None
    item = await rt.store.get_item(["users", "u1"], "prefs")
    assert set(item) == ITEM_KEYS
    assert item["namespace"] == ["users", "u1"] and item["key"] == "prefs" and item["value"] == {"theme": "dark"}
    assert item["created_at"] == item["updated_at"]
    await asyncio.sleep(0.002)
    await rt.store.put_item(("users", "u1"), key="prefs", value={"theme": "light"})
    again = await rt.store.get_item(("users", "u1"), key="prefs")
    assert again["value"] == {"theme": "light"}
    assert again["created_at"] == item["created_at"] and again["updated_at"] > item["updated_at"]


async def test_missing_items_are_none(rt):
    assert await rt.store.get_item(["users", "u1"], "nothing") is None
    await rt.store.put_item(["users", "u1"], "k", {"a": 1})
    assert await rt.store.get_item(["users"], "k") is None  # namespaces are exact
    assert await rt.store.get_item(["users", "u2"], "k") is None


async def test_delete_is_idempotent(rt):
    await rt.store.put_item(["a"], "k", {"v": 1})
    await rt.store.delete_item(["a"], "k")
    assert await rt.store.get_item(["a"], "k") is None
    await rt.store.delete_item(["a"], "k")  # nothing there: still fine


async def test_search_by_prefix_filter_and_page(rt):
    await rt.store.put_item(["docs", "en"], "a", {"lang": "en", "n": 1})
    await rt.store.put_item(["docs", "en"], "b", {"lang": "en", "n": 2})
    await rt.store.put_item(["docs", "fr"], "c", {"lang": "fr", "n": 3})
    await rt.store.put_item(["docsx"], "d", {"lang": "en", "n": 4})
    await rt.store.put_item(["other"], "e", {"lang": "en", "n": 5})

    def keys(found):
        return sorted(i["key"] for i in found["items"])

    everything = await rt.store.search_items(["docs"])
    assert keys(everything) == ["a", "b", "c"]  # "docsx" is not under "docs"
    assert all(set(i) == ITEM_KEYS | {"score"} and i["score"] is None for i in everything["items"])
    assert keys(await rt.store.search_items(["docs", "en"])) == ["a", "b"]
    assert keys(await rt.store.search_items(["docs"], filter={"lang": "fr"})) == ["c"]
    assert keys(await rt.store.search_items(["docs"], filter={"lang": "en", "n": 2})) == ["b"]
    assert keys(await rt.store.search_items([], filter={"lang": "en"})) == ["a", "b", "d", "e"]
    assert keys(await rt.store.search_items(["nothing"])) == []
    page1 = await rt.store.search_items(["docs"], limit=2)
    page2 = await rt.store.search_items(["docs"], limit=2, offset=2)
    assert len(page1["items"]) == 2 and len(page2["items"]) == 1
    assert set(keys(page1)) | set(keys(page2)) == {"a", "b", "c"}
    # the default limit is 10
    for i in range(12):
        await rt.store.put_item(["many"], f"k{i}", {"i": i})
    assert len((await rt.store.search_items(["many"]))["items"]) == 10


async def test_list_namespaces(rt):
    for ns in (["a", "b", "c"], ["a", "b", "d"], ["a", "x"], ["z", "b"], ["z", "q", "d"]):
        await rt.store.put_item(ns, "k", {"v": 1})
    found = (await rt.store.list_namespaces())["namespaces"]
    assert sorted(found) == [["a", "b", "c"], ["a", "b", "d"], ["a", "x"], ["z", "b"], ["z", "q", "d"]]
    assert sorted((await rt.store.list_namespaces(prefix=["a"]))["namespaces"]) == [
        ["a", "b", "c"], ["a", "b", "d"], ["a", "x"]]
    assert sorted((await rt.store.list_namespaces(suffix=["d"]))["namespaces"]) == [["a", "b", "d"],
                                                                                   ["z", "q", "d"]]
    assert sorted((await rt.store.list_namespaces(prefix=["a"], max_depth=2))["namespaces"]) == [
        ["a", "b"], ["a", "x"]]
    assert sorted((await rt.store.list_namespaces(max_depth=1))["namespaces"]) == [["a"], ["z"]]
    assert len((await rt.store.list_namespaces(limit=2))["namespaces"]) == 2
    assert len((await rt.store.list_namespaces(limit=2, offset=4))["namespaces"]) == 1


async def test_bad_namespaces_are_invalid(rt):
    for bad in (["us.ers"], ["users", ""], []):
        with pytest.raises(InvalidRequestError):
            await rt.store.put_item(bad, "k", {"v": 1})
    with pytest.raises(InvalidRequestError, match="periods"):
        await rt.store.get_item(["a.b"], "k")
    with pytest.raises(InvalidRequestError):
        await rt.store.search_items(["a.b"])
    with pytest.raises(InvalidRequestError):
        await rt.store.delete_item(["a.b"], "k")
    assert (await rt.store.list_namespaces())["namespaces"] == []


async def test_tools_reach_the_store_through_their_runtime(make_runtime):
    @tool
    async def remember(fact: str, runtime: ToolRuntime) -> str:
        """Remember a fact."""
        await runtime.store.put_item(["facts", runtime.thread_id], "latest", {"fact": fact})
        return "remembered"

    def reply(request):
        if request.messages[-1].type == "human":
            return {"tool_calls": [{"name": "remember", "args": {"fact": "sky is blue"}, "id": "c1"}]}
        return "ok"

    rt = await make_runtime({"agent": create_agent(ScriptedModel([reply], loop=True), [remember])})
    thread = await rt.threads.create()
    await rt.runs.wait(thread["thread_id"], "agent", input={"messages": [{"role": "user", "content": "x"}]})
    item = await rt.store.get_item(["facts", thread["thread_id"]], "latest")
    assert item["value"] == {"fact": "sky is blue"}


async def test_items_persist_in_a_sqlite_file(make_runtime, tmp_path):
    url = f"sqlite:///{tmp_path}/store.db"
    first = await make_runtime({}, store=url)
    await first.store.put_item(["users", "u1"], "prefs", {"theme": "dark"})
    await first.close()
    second = await make_runtime({}, store=url)
    assert (await second.store.get_item(["users", "u1"], "prefs"))["value"] == {"theme": "dark"}
    assert (await second.store.list_namespaces())["namespaces"] == [["users", "u1"]]
