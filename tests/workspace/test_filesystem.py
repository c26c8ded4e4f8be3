"""The file tools' arguments and results (deepagents'), parallel writes, and large results moved to files."""

from subagent_helpers import call, stack_looker

from backchannel import ScriptedModel, create_agent, tool
from backchannel.workspace import FILE_TOOLS, FilesystemMiddleware, LocalShellBackend, StateBackend

LINES = "".join(f"row {i}\n" for i in range(1, 251))


async def run(*replies, middleware=None, tools=(), files=None):
    model = ScriptedModel([*replies, "done"])
    model.record = True
    agent = create_agent(model, tools, middleware=[middleware or FilesystemMiddleware()])
    state = await agent.ainvoke({"messages": [{"role": "user", "content": "go"}], "files": files or {}})
    return state, {m.tool_call_id: m for m in state["messages"] if m.type == "tool"}, model


def test_the_tools_have_deepagents_names_and_argument_names():
    schemas = {t.name: t.parameters for t in FilesystemMiddleware(backend=LocalShellBackend(".")).tools}
    assert list(schemas) == list(FILE_TOOLS)
    expected = {"ls": ["path"], "read_file": ["file_path", "offset", "limit"],
                "write_file": ["file_path", "content"], "edit_file": ["file_path", "old_string", "new_string",
                                                                      "replace_all"],
                "delete": ["file_path"], "glob": ["pattern", "path"],
                "grep": ["pattern", "path", "glob", "output_mode", "max_count", "regex"],
                "execute": ["command", "timeout"]}
    for name, args in expected.items():
        assert list(schemas[name]["properties"]) == args, name
    assert schemas["grep"]["properties"]["output_mode"]["enum"] == ["files_with_matches", "content", "count"]
    assert schemas["read_file"]["properties"]["limit"]["default"] == 100
    assert "execute" not in [t.name for t in FilesystemMiddleware(backend=StateBackend()).tools]
    assert [t.name for t in FilesystemMiddleware(tools=["ls", "read_file"]).tools] == ["ls", "read_file"]


async def test_read_file_pages_with_offset_and_limit_and_numbers_the_lines():
    _, results, _ = await run({"tool_calls": [
        call("read_file", {"file_path": "/rows.txt"}, "first"),
        call("read_file", {"file_path": "/rows.txt", "offset": 248, "limit": 10}, "last"),
        call("read_file", {"file_path": "/rows.txt", "offset": 500}, "past"),
        call("read_file", {"file_path": "/empty.txt"}, "empty"),
        call("read_file", {"file_path": "relative/../../x"}, "bad")]},
        files={"/rows.txt": LINES, "/empty.txt": ""})
    first = results["first"].text.split("\n")
    assert first[0] == "@@ lines 1-100 of 250 | next offset 100 @@"
    assert first[1] == "  1  row 1" and first[100] == "100  row 100" and len(first) == 101
    assert results["last"].text == "@@ lines 249-250 of 250 @@\n249  row 249\n250  row 250"
    assert results["past"].status == "error" and "Line offset 500 exceeds file length (250 lines)" in \
        results["past"].text
    assert results["empty"].text == "System reminder: File exists but has empty contents"
    assert results["bad"].status == "error" and "traversal" in results["bad"].text


async def test_a_read_larger_than_the_budget_stops_at_a_whole_line_and_says_where_to_go_on():
    wide = "".join(f"{i:04d} {'w' * 300}\n" for i in range(100))
    _, results, _ = await run({"tool_calls": [call("read_file", {"file_path": "/wide.txt"}, "r")]},
                              files={"/wide.txt": wide},
                              middleware=FilesystemMiddleware(tool_token_limit_before_evict=2000))
    text = results["r"].text
    assert text.startswith("[Output was truncated due to size limits.")
    header = text.split("\n")[1]
    assert header.startswith("@@ lines 1-") and "of 100 | next offset" in header and "truncated due to size" in header
    shown = int(header.split("-")[1].split(" ")[0])
    assert text.endswith(f"{shown}  {shown - 1:04d} {'w' * 300}") and len(text) < 8_300  # whole lines only


async def test_edit_file_errors_tell_the_model_what_to_fix():
    state, results, _ = await run({"tool_calls": [
        call("edit_file", {"file_path": "/a.py", "old_string": "x", "new_string": "y"}, "twice"),
        call("edit_file", {"file_path": "/b.py", "old_string": "zzz", "new_string": "y"}, "absent"),
        call("edit_file", {"file_path": "/nope.py", "old_string": "x", "new_string": "y"}, "missing"),
        call("edit_file", {"file_path": "/c.py", "old_string": "x", "new_string": "x"}, "same"),
        call("edit_file", {"file_path": "/d.py", "old_string": "x", "new_string": "y", "replace_all": True}, "all")]},
        files={"/a.py": "x = x", "/b.py": "b", "/c.py": "x", "/d.py": "x, x, x"})
    assert results["twice"].text.startswith("Error: String 'x' appears 2 times in file. Use replace_all=True")
    assert results["absent"].text == "Error: String not found in file: 'zzz'"
    assert results["missing"].text == "Error: File '/nope.py' not found"
    assert "the same" in results["same"].text
    assert results["all"].text == "Successfully replaced 3 instance(s) of the string in '/d.py'"
    assert state["files"]["/d.py"]["content"] == "y, y, y" and state["files"]["/a.py"]["content"] == "x = x"


async def test_two_writes_to_one_file_in_one_reply_are_refused_the_second_time():
    state, results, _ = await run({"tool_calls": [
        call("edit_file", {"file_path": "/a.txt", "old_string": "one", "new_string": "1"}, "first"),
        call("edit_file", {"file_path": "/a.txt", "old_string": "two", "new_string": "2"}, "second"),
        call("write_file", {"file_path": "/b.txt", "content": "bee"}, "other"),
        call("write_file", {"file_path": "/dir/c.txt", "content": "sea"}, "in_dir"),
        call("delete", {"file_path": "/dir"}, "dir")]},
        files={"/a.txt": "one two", "/dir/old.txt": "old"})
    assert results["first"].status == "success" and results["other"].status == "success"
    assert results["second"].status == "error" and "parallel file mutations to the same path" in \
        results["second"].text
    assert results["dir"].status == "error"  # a directory holding a file written in the same reply
    assert state["files"]["/a.txt"]["content"] == "1 two" and state["files"]["/b.txt"]["content"] == "bee"
    assert state["files"]["/dir/c.txt"]["content"] == "sea" and "/dir/old.txt" in state["files"]


async def test_grep_modes_literal_and_regex():
    files = {"/src/a.py": "def alpha():\n    return 'a|b'\n", "/src/b.py": "def beta():\n    pass\n",
             "/docs/x.md": "def in docs\n"}
    _, results, _ = await run({"tool_calls": [
        call("grep", {"pattern": "def"}, "files"),
        call("grep", {"pattern": "def", "path": "/src", "output_mode": "content"}, "content"),
        call("grep", {"pattern": "def", "glob": "*.py", "output_mode": "count"}, "count"),
        call("grep", {"pattern": "a|b"}, "literal"),
        call("grep", {"pattern": r"def \w+\(\)", "regex": True, "output_mode": "content"}, "regex"),
        call("grep", {"pattern": "(", "regex": True}, "bad_regex"),
        call("grep", {"pattern": "def", "max_count": 1}, "capped"),
        call("grep", {"pattern": "nothing"}, "none")]}, files=files)
    assert results["files"].text == "/docs/x.md\n/src/a.py\n/src/b.py"
    assert results["content"].text == "/src/a.py:\n  1: def alpha():\n/src/b.py:\n  1: def beta():"
    assert results["count"].text == "/src/a.py: 1\n/src/b.py: 1"
    assert results["literal"].text == "/src/a.py"
    assert results["regex"].text == "/src/a.py:\n  1: def alpha():\n/src/b.py:\n  1: def beta():"
    assert results["bad_regex"].status == "error" and "Invalid regex" in results["bad_regex"].text
    assert results["capped"].text.startswith("/docs/x.md\n\nNote: the search stopped at the maximum match count")
    assert results["none"].text == "No matches found"


async def test_a_large_tool_result_goes_to_a_file_and_the_model_gets_its_path_and_a_preview():
    @tool
    def dump() -> str:
        """A very long report."""
        return "".join(f"report line {i}\n" for i in range(1, 5001))

    state, results, model = await run(
        {"tool_calls": [call("dump", {}, "call_big")]},
        {"tool_calls": [call("read_file", {"file_path": "/large_tool_results/call_big", "offset": 2500,
                                           "limit": 2}, "page")]},
        tools=[dump], middleware=FilesystemMiddleware(tool_token_limit_before_evict=1000))
    pointer = results["call_big"].text
    assert pointer.startswith("Tool result too large, the result of this tool call call_big was saved in the "
                              "filesystem at this path: /large_tool_results/call_big")
    assert "1  report line 1" in pointer and "... [4990 lines truncated] ..." in pointer
    assert "5000  report line 5000" in pointer and len(pointer) < 2000
    assert state["files"]["/large_tool_results/call_big"]["content"].count("\n") == 5000
    assert results["page"].text == "@@ lines 2501-2502 of 5000 | next offset 2502 @@\n" \
                                   "2501  report line 2501\n2502  report line 2502"
    # What the model saw in its next call was the pointer, not the report.
    assert model.requests[1].messages[-1].text == pointer


async def test_a_tool_runs_with_no_frame_of_the_filesystem_middleware_waiting_on_it():
    """The eviction looks at the result only (``after_tool_call``): a thousand live subagents each waiting on a
    tool would otherwise hold a thousand suspended frames of it."""
    look, waiting = stack_looker("x" * 5000)
    _, results, _ = await run({"tool_calls": [call("look", {}, "big")]}, tools=[look],
                              middleware=FilesystemMiddleware(tool_token_limit_before_evict=1000))
    assert results["big"].text.startswith("Tool result too large")  # still evicted
    assert any(name.endswith("_tool_call") for name in waiting)
    assert not [name for name in waiting if name.startswith("FilesystemMiddleware.")]
