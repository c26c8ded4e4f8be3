"""The disk backend: a directory as the workspace, which no path, absolute path or symlink can leave."""

import os

import pytest
from subagent_helpers import call

from backchannel import ScriptedModel, create_agent
from backchannel.workspace import FilesystemBackend, FilesystemMiddleware


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("import os\nprint('hi')\n")
    (tmp_path / "secret.txt").write_text("the secret outside the root\n")
    return root


async def run_calls(backend, *calls):
    """Run one scripted reply's tool calls through the file tools; their tool messages, in order."""
    model = ScriptedModel([{"tool_calls": list(calls)}, "done"])
    agent = create_agent(model, middleware=[FilesystemMiddleware(backend=backend)])
    state = await agent.ainvoke("go")
    return [m for m in state["messages"] if m.type == "tool"]


async def test_files_are_read_written_edited_listed_and_searched_inside_the_root(root):
    backend = FilesystemBackend(root_dir=root)
    written, edited = await run_calls(
        backend,
        call("write_file", {"file_path": "/notes/plan.md", "content": "step one\nstep two\n"}, "w"),
        call("edit_file", {"file_path": "/src/app.py", "old_string": "'hi'", "new_string": "'hello'"}, "e"))
    listed, read, found, globbed = await run_calls(  # calls of one reply run at once: reads after writes
        backend,
        call("ls", {"path": "/"}, "l"),
        call("read_file", {"file_path": "/src/app.py", "offset": 1, "limit": 1}, "r"),
        call("grep", {"pattern": "step", "output_mode": "count"}, "g"),
        call("glob", {"pattern": "**/*.py"}, "gl"))
    assert written.text == "Updated file /notes/plan.md"
    assert edited.text == "Successfully replaced 1 instance(s) of the string in '/src/app.py'"
    assert (root / "src" / "app.py").read_text() == "import os\nprint('hello')\n"
    assert listed.text == "['/notes/', '/src/']"
    assert read.text == "@@ lines 2-2 of 2 @@\n2  print('hello')"
    assert found.text == "/notes/plan.md: 2"
    assert globbed.text == "['/src/app.py']"
    [deleted] = await run_calls(backend, call("delete", {"file_path": "/notes"}, "d"))
    assert deleted.text == "Deleted /notes" and not (root / "notes").exists()


@pytest.mark.parametrize("path", ["/../secret.txt", "../secret.txt", "/src/../../secret.txt", "~/secret.txt"])
async def test_a_path_with_dotdot_is_refused_with_a_clear_error(root, path):
    [read] = await run_calls(FilesystemBackend(root_dir=root), call("read_file", {"file_path": path}, "r"))
    assert read.status == "error" and "Path traversal not allowed" in read.text
    [write] = await run_calls(FilesystemBackend(root_dir=root),
                              call("write_file", {"file_path": path, "content": "x"}, "w"))
    assert write.status == "error" and "traversal" in write.text
    assert (root.parent / "secret.txt").read_text() == "the secret outside the root\n"


async def test_an_absolute_path_outside_the_root_is_refused(root):
    outside = str(root.parent / "secret.txt")
    # Without virtual_mode, paths are the machine's own, and must lie inside the root.
    real = FilesystemBackend(root_dir=root, virtual_mode=False)
    read, write, inside = await run_calls(
        real, call("read_file", {"file_path": outside}, "r"),
        call("write_file", {"file_path": "/etc/backchannel-test.txt", "content": "x"}, "w"),
        call("read_file", {"file_path": str(root / "src" / "app.py")}, "ok"))
    assert read.status == "error" and "is outside the workspace root" in read.text
    assert write.status == "error" and "is outside the workspace root" in write.text
    assert not os.path.exists("/etc/backchannel-test.txt")
    assert inside.status == "success" and "import os" in inside.text
    # In virtual mode (the default) an absolute path is a path in the root: the secret is not there.
    [virtual] = await run_calls(FilesystemBackend(root_dir=root), call("read_file", {"file_path": outside}, "v"))
    assert virtual.status == "error" and "not found" in virtual.text


async def test_symlinks_that_lead_out_of_the_root_are_refused(root):
    (root / "link.txt").symlink_to(root.parent / "secret.txt")
    (root / "linked_dir").symlink_to(root.parent, target_is_directory=True)
    (root / "inner.txt").symlink_to(root / "src" / "app.py")
    backend = FilesystemBackend(root_dir=root)
    read, through_dir, write, edit, inner = await run_calls(
        backend,
        call("read_file", {"file_path": "/link.txt"}, "r"),
        call("read_file", {"file_path": "/linked_dir/secret.txt"}, "d"),
        call("write_file", {"file_path": "/linked_dir/planted.txt", "content": "x"}, "w"),
        call("edit_file", {"file_path": "/link.txt", "old_string": "secret", "new_string": "public"}, "e"),
        call("read_file", {"file_path": "/inner.txt"}, "i"))
    for refused in (read, through_dir, write, edit):
        assert refused.status == "error" and "leads outside the workspace root" in refused.text
    assert inner.status == "success"  # a symlink within the root is fine
    assert not (root.parent / "planted.txt").exists()
    assert (root.parent / "secret.txt").read_text() == "the secret outside the root\n"
    # Searches don't follow them out either.
    grep, glob, listing = await run_calls(backend, call("grep", {"pattern": "secret"}, "g"),
                                          call("glob", {"pattern": "**/*.txt"}, "gl"), call("ls", {"path": "/"}, "l"))
    assert grep.text == "No matches found"
    assert "secret" not in glob.text and "link" not in listing.text


async def test_binary_and_missing_files(root):
    (root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff")
    binary, missing, edit = await run_calls(
        FilesystemBackend(root_dir=root), call("read_file", {"file_path": "/image.png"}, "b"),
        call("read_file", {"file_path": "/nope.txt"}, "m"),
        call("edit_file", {"file_path": "/image.png", "old_string": "PNG", "new_string": "GIF"}, "e"))
    assert binary.status == "success" and "binary file" in binary.text
    assert missing.status == "error" and missing.text == "Error: File '/nope.txt' not found"
    assert edit.status == "error" and "Cannot edit binary files" in edit.text
