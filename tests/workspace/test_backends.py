"""A scripted deep agent plans, writes, edits, greps and reads files on each backend, over LocalRuntime."""

import pytest
from subagent_helpers import call

from backchannel import ScriptedModel, create_agent
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.workspace import (
    CompositeBackend,
    FilesystemBackend,
    FilesystemMiddleware,
    StateBackend,
    StoreBackend,
)

PLAN = [{"content": "write the notes", "status": "in_progress"}, {"content": "check them", "status": "pending"}]
DONE = [{"content": "write the notes", "status": "completed"}, {"content": "check them", "status": "completed"}]


def workflow(folder):
    """The supervisor's replies: plan, write, edit, grep, read, update the plan, answer."""
    path = f"{folder}/notes.md"
    return ScriptedModel([
        {"tool_calls": [call("write_todos", {"todos": PLAN}, "plan")]},
        {"tool_calls": [call("write_file", {"file_path": path, "content": "# Notes\ntea: green\ncoffee: black\n"},
                             "write")]},
        {"tool_calls": [call("edit_file", {"file_path": path, "old_string": "green", "new_string": "oolong"},
                             "edit")]},
        {"tool_calls": [call("grep", {"pattern": "oolong", "output_mode": "content"}, "grep")]},
        {"tool_calls": [call("read_file", {"file_path": path}, "read"), call("write_todos", {"todos": DONE}, "done")]},
        "The notes say tea: oolong.",
    ])


def backends(kind, tmp_path):
    return {
        "state": lambda: StateBackend(),
        "disk": lambda: FilesystemBackend(root_dir=tmp_path / "disk"),
        "store": lambda: StoreBackend(),
        "composite": lambda: CompositeBackend(StateBackend(), {"/memories/": StoreBackend()}),
    }[kind]()


@pytest.mark.parametrize("kind,folder", [("state", "/work"), ("disk", "/work"), ("store", "/work"),
                                         ("composite", "/work"), ("composite", "/memories")])
async def test_a_deep_agent_plans_writes_edits_greps_and_reads_files(kind, folder, tmp_path):
    (tmp_path / "disk").mkdir()
    backend = backends(kind, tmp_path)
    agent = create_deep_agent(workflow(folder), backend=backend, todos=True, general_purpose=False)
    async with LocalRuntime(f"sqlite:///{tmp_path}/state.db", agents={"writer": agent}) as rt:
        thread = await rt.threads.create()
        state = await agent.ainvoke("take notes", thread_id=thread["thread_id"])
        saved = (await rt.threads.get_state(thread["thread_id"]))["values"]
        stored = await rt.store.search_items(("writer", "filesystem"))
    results = {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}
    path = f"{folder}/notes.md"
    assert all(m.status == "success" for m in results.values()), [m.text for m in results.values()]
    assert results["write"].text == f"Updated file {path}"
    assert results["grep"].text == f"{path}:\n  2: tea: oolong"
    assert results["read"].text == "@@ lines 1-3 of 3 @@\n1  # Notes\n2  tea: oolong\n3  coffee: black"
    assert state["messages"][-1].text == "The notes say tea: oolong."
    assert saved["todos"] == DONE
    in_state = kind == "state" or (kind == "composite" and folder == "/work")
    in_store = kind == "store" or (kind == "composite" and folder == "/memories")
    assert (path in saved.get("files", {})) is in_state
    if in_state:
        assert saved["files"][path]["content"] == "# Notes\ntea: oolong\ncoffee: black\n"
    keys = {item["key"]: item["value"]["content"] for item in stored["items"]}
    expected_key = "/notes.md" if kind == "composite" else path  # a route sees paths without its prefix
    assert (keys.get(expected_key) == "# Notes\ntea: oolong\ncoffee: black\n") is in_store
    if kind == "disk":
        assert (tmp_path / "disk" / "work" / "notes.md").read_text() == "# Notes\ntea: oolong\ncoffee: black\n"


async def test_store_files_are_shared_by_the_threads_of_an_assistant_not_by_other_assistants(tmp_path):
    def agent(script):
        return create_agent(ScriptedModel(script), middleware=[FilesystemMiddleware(backend=StoreBackend())])

    writer = agent([{"tool_calls": [call("write_file", {"file_path": "/shared.md", "content": "kept"}, "w")]}, "ok"])
    readers = [agent([{"tool_calls": [call("read_file", {"file_path": "/shared.md"}, "r")]}, "ok"]) for _ in "ab"]
    async with LocalRuntime(f"sqlite:///{tmp_path}/s.db", agents={"a": writer, "other": readers[1]}) as rt:
        await writer.ainvoke("write", thread_id=(await rt.threads.create())["thread_id"])
        rt.graphs["a"] = readers[0]  # the same assistant, another thread, another agent object
        readers[0].runtime = rt
        same = await readers[0].ainvoke("read", thread_id=(await rt.threads.create())["thread_id"])
        other = await readers[1].ainvoke("read", thread_id=(await rt.threads.create())["thread_id"])
        item = await rt.store.get_item(("a", "filesystem"), key="/shared.md")
    assert same["messages"][2].text == "@@ lines 1-1 of 1 @@\n1  kept"
    assert other["messages"][2].status == "error" and "not found" in other["messages"][2].text
    assert item["value"]["content"] == "kept"


async def test_the_store_backend_without_a_runtime_says_what_it_needs():
    model = ScriptedModel([{"tool_calls": [call("ls", {"path": "/"}, "l")]}, "ok"])
    agent = create_agent(model, middleware=[FilesystemMiddleware(backend=StoreBackend())])
    state = await agent.ainvoke("list")
    assert state["messages"][2].status == "error" and "the store backend has no store" in state["messages"][2].text


async def test_the_composite_lists_routes_as_directories_and_searches_every_backend(tmp_path):
    backend = CompositeBackend(StateBackend(), {"/memories/": StoreBackend(), "/disk/": FilesystemBackend(tmp_path)})
    (tmp_path / "d.txt").write_text("needle on disk\n")
    model = ScriptedModel([
        {"tool_calls": [call("write_file", {"file_path": "/s.txt", "content": "needle in state"}, "1"),
                        call("write_file", {"file_path": "/memories/m.txt", "content": "needle in store"}, "2")]},
        {"tool_calls": [call("ls", {"path": "/"}, "ls"), call("grep", {"pattern": "needle"}, "grep"),
                        call("glob", {"pattern": "*.txt"}, "glob"), call("ls", {"path": "/memories"}, "mem")]},
        "ok"])
    agent = create_agent(model, middleware=[FilesystemMiddleware(backend=backend)])
    async with LocalRuntime("memory", agents={"c": agent}) as rt:
        state = await agent.ainvoke("go", thread_id=(await rt.threads.create())["thread_id"])
    results = {m.tool_call_id: m.text for m in state["messages"] if m.type == "tool"}
    assert results["ls"] == "['/disk/', '/memories/', '/s.txt']"
    assert results["grep"] == "/disk/d.txt\n/memories/m.txt\n/s.txt"
    assert sorted(eval(results["glob"])) == ["/disk/d.txt", "/memories/m.txt", "/s.txt"]
    assert results["mem"] == "['/memories/m.txt']"
