"""The workspace over the server: a deep agent's files and plan in the thread's state, through langgraph_sdk."""

import pytest
from server_helpers import ThreadServer, user
from subagent_helpers import call

from backchannel import ScriptedModel
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.server import create_app
from backchannel.workspace import CompositeBackend, StateBackend, StoreBackend

PLAN = [{"content": "draft", "status": "in_progress"}]


def writer():
    return create_deep_agent(ScriptedModel([
        {"tool_calls": [call("write_todos", {"todos": PLAN}, "plan")]},
        {"tool_calls": [call("write_file", {"file_path": "/draft.md", "content": "Tea is a drink.\n"}, "w"),
                        call("write_file", {"file_path": "/memories/facts.md", "content": "tea\n"}, "m")]},
        {"tool_calls": [call("edit_file", {"file_path": "/draft.md", "old_string": "a drink",
                                           "new_string": "an old drink"}, "e")]},
        {"tool_calls": [call("grep", {"pattern": "tea", "output_mode": "count"}, "g")]},
        "The draft is in /draft.md."], loop=True),
        backend=CompositeBackend(StateBackend(), {"/memories/": StoreBackend()}), todos=True,
        general_purpose=False)


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    db = tmp_path_factory.mktemp("workspace") / "state.db"
    with ThreadServer(create_app(LocalRuntime(f"sqlite:///{db}", {"writer": writer()}))) as server:
        yield server


async def test_files_and_todos_are_in_the_threads_state_and_stream_as_updates(live):
    from langgraph_sdk import get_client

    client = get_client(url=live.url, api_key=None)
    try:
        thread = await client.threads.create()
        updates = [part.data async for part in client.runs.stream(thread["thread_id"], "writer",
                                                                 input=user("write a draft"),
                                                                 stream_mode="updates")]
        state = await client.threads.get_state(thread["thread_id"])
        history = await client.threads.get_history(thread["thread_id"], limit=50)
        stored = await client.store.get_item(["writer", "filesystem"], "/facts.md")
    finally:
        await client.http.client.aclose()
    values = state["values"]
    assert values["files"]["/draft.md"]["content"] == "Tea is an old drink.\n"
    assert values["files"]["/draft.md"]["encoding"] == "utf-8"
    assert "/memories/facts.md" not in values["files"]  # that one is in the store, shared by the threads
    assert stored["value"]["content"] == "tea\n"
    assert values["todos"] == PLAN
    assert values["messages"][-1]["content"] == "The draft is in /draft.md."
    tool_updates = [u["tools"] for u in updates if "tools" in u]
    assert tool_updates[0]["todos"] == PLAN
    written = next(u["files"] for u in tool_updates if "files" in u)
    assert written["/draft.md"]["content"] == "Tea is a drink.\n"
    edit = next(u["files"]["/draft.md"] for u in tool_updates if "files" in u and "at" in u["files"]["/draft.md"])
    assert edit["put"] == "an old drink"  # the edit travels (and is stored) as what it changed
    counted = [m for u in tool_updates for m in u["messages"] if m["tool_call_id"] == "g"]
    assert counted[0]["content"] == "/memories/facts.md: 1"  # grep covers the store route too
    # Each checkpoint of the history holds the files as they were then.
    drafts = [h["values"].get("files", {}).get("/draft.md", {}).get("content") for h in history]
    assert "Tea is a drink.\n" in drafts and "Tea is an old drink.\n" in drafts
