"""The state backend: files in the thread's state, the ``files`` reducer, edits stored as what they changed."""

import os

import pytest
from subagent_helpers import call

from backchannel import ScriptedModel, ToolRuntime, create_agent
from backchannel.runtime import LocalRuntime
from backchannel.workspace import FilesystemMiddleware, StateBackend, merge_files
from backchannel.workspace.state import changed_files, files_written_since


def runtime_with(files):
    return ToolRuntime(None, None, "agent", "call_1", {"files": files})


def file(content, modified="2024-01-01T00:00:00+00:00"):
    return {"content": content, "encoding": "utf-8", "created_at": modified, "modified_at": modified}


def test_the_reducer_writes_deletes_and_applies_edits_without_changing_its_inputs():
    current = {"/a.txt": file("one two one"), "/b.txt": file("bee")}
    edit = {"at": [0, 8], "cut": 3, "put": "ONE", "modified_at": "2024-02-02T00:00:00+00:00"}
    merged = merge_files(current, {"/a.txt": edit, "/b.txt": None, "/c.txt": "plain text"})
    assert merged["/a.txt"]["content"] == "ONE two ONE"
    assert merged["/a.txt"]["created_at"] == "2024-01-01T00:00:00+00:00"
    assert merged["/a.txt"]["modified_at"] == "2024-02-02T00:00:00+00:00"
    assert "/b.txt" not in merged
    assert merged["/c.txt"] == {"content": "plain text", "encoding": "utf-8"}
    assert current["/a.txt"]["content"] == "one two one" and "/b.txt" in current  # inputs untouched


def test_two_updates_of_one_step_combine_and_then_apply_to_the_state():
    """Parallel tool calls: their updates are combined first (an edit stays an edit), then applied."""
    state = {"/a.txt": file("x = 1"), "/gone.txt": file("bye")}
    first = {"/b.txt": file("new")}
    second = {"/a.txt": {"at": [4], "cut": 1, "put": "2"}, "/gone.txt": None}
    step = merge_files.merge(first, second)
    assert step == {"/b.txt": first["/b.txt"], **second}
    state = merge_files(state, step)
    assert state["/a.txt"]["content"] == "x = 2" and state["/b.txt"]["content"] == "new"
    assert "/gone.txt" not in state
    assert merge_files.merge({"/c": file("abc")}, {"/c": {"at": [1], "cut": 1, "put": "B"}})["/c"]["content"] == "aBc"
    with pytest.raises(ValueError, match="two edits of /a.txt"):
        merge_files.merge({"/a.txt": {"at": [0], "cut": 1, "put": "y"}}, {"/a.txt": {"at": [0], "cut": 1, "put": "z"}})
    with pytest.raises(ValueError, match="no such file"):
        merge_files({}, {"/nowhere": {"at": [0], "cut": 1, "put": "z"}})


async def test_operations_return_deepagents_result_shapes_and_writes_as_state_updates():
    backend = StateBackend().bind(runtime_with({"/src/app.py": file("import os\nprint('hi')\n"),
                                                "/src/lib/util.py": file("def f():\n    return 'hi'\n"),
                                                "/README.md": file("# Readme\n")}))
    listing = await backend.ls("/src")
    assert [(e["path"], e["is_dir"]) for e in listing.entries] == [("/src/app.py", False), ("/src/lib/", True)]
    read = await backend.read("/src/app.py", 1, 5)
    assert (read.file_data["content"], read.start_line, read.end_line, read.total_lines, read.next_offset) == \
        ("print('hi')\n", 2, 2, 2, None)
    assert (await backend.read("/src/app.py", 0, 1)).next_offset == 1
    assert (await backend.read("/missing")).error == "File '/missing' not found"
    assert "exceeds file length" in (await backend.read("/src/app.py", 9)).error

    written = await backend.write("/new.txt", "text")
    assert written.path == "/new.txt" and written.files_update["/new.txt"]["content"] == "text"
    edited = await backend.edit("/src/lib/util.py", "'hi'", "'bye'")
    assert edited.occurrences == 1 and edited.files_update["/src/lib/util.py"]["at"] == [20]
    assert "appears 3 times" in (await backend.edit("/src/app.py", "i", "I")).error
    assert (await backend.edit("/src/app.py", "i", "I", replace_all=True)).occurrences == 3
    assert "String not found" in (await backend.edit("/src/app.py", "nothing", "x")).error
    deleted = await backend.delete("/src")
    assert deleted.files_update == {"/src/app.py": None, "/src/lib/util.py": None}

    globbed = await backend.glob("*.py")
    assert sorted(m["path"] for m in globbed.matches) == ["/src/app.py", "/src/lib/util.py"]
    assert [m["path"] for m in (await backend.glob("/*.md")).matches] == ["/README.md"]
    assert [m["path"] for m in (await backend.glob("lib/*.py", "/src")).matches] == ["/src/lib/util.py"]
    found = await backend.grep("'hi'")
    assert [(m["path"], m["line"]) for m in found.matches] == [("/src/app.py", 2), ("/src/lib/util.py", 2)]
    assert len((await backend.grep("hi", max_count=1)).matches) == 1
    assert (await backend.grep("hi", max_count=1)).truncated
    assert [m["line"] for m in (await backend.grep(r"^def \w+", regex=True)).matches] == [1]
    assert [m["path"] for m in (await backend.grep("hi", glob="app.py")).matches] == ["/src/app.py"]


def test_changed_files_and_files_written_since():
    before = {"/kept": file("k"), "/edited": file("e"), "/removed": file("r")}
    after = {"/kept": before["/kept"], "/edited": file("e2"), "/new": file("n")}
    assert changed_files(before, after) == {"/edited": after["/edited"], "/new": after["/new"], "/removed": None}
    theirs = {"/old": file("o", "2024-01-01"), "/fresh": file("f", "2024-03-01"), "/mine": file("m", "2024-03-01")}
    ours = {"/mine": file("newer", "2024-04-01")}
    assert files_written_since(theirs, ours, "2024-02-01") == {"/fresh": theirs["/fresh"]}


async def test_a_large_file_edited_many_times_grows_the_database_by_its_edits_not_its_copies(tmp_path):
    """Checkpoints store an edit as the text it changed: 20 edits of a 1 MiB file are not 20 MiB."""
    big = "".join(f"line {i:06d} {'x' * 50}\n" for i in range(18_000))  # ~1 MiB
    edits = [call("edit_file", {"file_path": "/big.txt", "old_string": f"line {i * 100:06d}",
                                "new_string": f"LINE {i * 100:06d}"}, f"e{i}") for i in range(20)]
    model = ScriptedModel([*({"tool_calls": [e]} for e in edits), "done"])
    agent = create_agent(model, middleware=[FilesystemMiddleware()])
    path = tmp_path / "state.db"
    async with LocalRuntime(f"sqlite:///{path}", agents={"agent": agent}) as rt:
        thread = await rt.threads.create()
        await rt.threads.update_state(thread["thread_id"], {"files": {"/big.txt": file(big)}})
        await rt.storage.close()
        await rt.storage.open()
        before = _size(path)
        state = await agent.ainvoke("edit", thread_id=thread["thread_id"])
        await rt.storage.close()
        await rt.storage.open()
        after = _size(path)
        content = (await rt.threads.get_state(thread["thread_id"]))["values"]["files"]["/big.txt"]["content"]
    assert [m.status for m in state["messages"] if m.type == "tool"] == ["success"] * 20
    assert content.count("LINE ") == 20 and len(content) == len(big)
    assert after - before < 200_000, f"the database grew by {after - before} bytes for 20 small edits"


def _size(path):
    return sum(os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p))
