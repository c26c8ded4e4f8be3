"""The agent memory file: its summary block, atomic writes, and its place in the system prompt."""

from __future__ import annotations

import os

import pytest

from backchannel import ScriptedModel, create_agent
from backchannel.memory import (
    BLOCK_END,
    BLOCK_PLACEHOLDER,
    BLOCK_START,
    AgentMemoryMiddleware,
    MemoryFile,
    agent_memory_path,
)


def test_each_agent_has_its_memory_file_under_the_home_directory(tmp_path):
    assert agent_memory_path("agent", tmp_path) == tmp_path / "agents" / "agent" / "agent.md"
    for bad in ("", "a/b", ".."):
        with pytest.raises(ValueError, match="plain name"):
            agent_memory_path(bad, tmp_path)


def test_the_block_is_added_once_below_what_the_person_wrote(tmp_path):
    memory = MemoryFile(tmp_path / "agent.md")
    memory.path.write_text("# Preferences\nAnswer briefly.\n")
    memory.write_block("### First\n\n- one", handoff_id="h1")
    memory.write_block("### Second\n\n- two", handoff_id="h2")
    text = memory.path.read_text()
    assert text.startswith("# Preferences\nAnswer briefly.\n")
    assert text.count(BLOCK_START) == 1 and text.count(BLOCK_END) == 1
    assert "## Recent Thread Snapshot" in text
    assert "Second" in memory.block() and "First" not in text
    assert memory.block_handoff_id() == "h2"


def test_a_file_without_markers_is_migrated_and_one_with_them_is_left_in_place(tmp_path):
    memory = MemoryFile(tmp_path / "new" / "agent.md")  # no file, no directory yet
    assert memory.read() == "" and memory.block() is None
    memory.write_block("summary")
    assert memory.path.read_text().startswith("## Recent Thread Snapshot\n")
    custom = MemoryFile(tmp_path / "custom.md")
    custom.path.write_text(f"intro\n{BLOCK_START}\nold\n{BLOCK_END}\noutro\n")
    custom.write_block("new")
    assert custom.path.read_text() == f"intro\n{BLOCK_START}\nnew\n{BLOCK_END}\noutro\n"


def test_reset_is_idempotent_and_spares_a_newer_handoffs_summary(tmp_path):
    memory = MemoryFile(tmp_path / "agent.md")
    memory.write_block("summary of h1", handoff_id="h1")
    assert memory.reset_block(handoff_id="other") is False
    assert "summary of h1" in memory.block()
    assert memory.reset_block(handoff_id="h1") is True
    assert memory.block() == BLOCK_PLACEHOLDER
    before = memory.path.stat().st_mtime_ns
    assert memory.reset_block(handoff_id="h1") is False
    assert memory.reset_block() is False
    assert memory.path.stat().st_mtime_ns == before


def test_a_crash_between_the_temporary_write_and_the_replace_leaves_the_old_file(tmp_path, monkeypatch):
    memory = MemoryFile(tmp_path / "agent.md")
    memory.write_block("the old summary", handoff_id="old")
    old = memory.path.read_text()

    def crash(src, dst):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        memory.write_block("the new summary", handoff_id="new")
    assert memory.path.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.md"]  # no temporary file left behind


async def test_the_memory_is_in_the_system_prompt_of_every_model_call_and_edits_show_at_once(tmp_path):
    path = tmp_path / "agent.md"
    model = ScriptedModel(["one", "two", "three"])
    model.record = True
    agent = create_agent(model, system_prompt="You are helpful.", middleware=[AgentMemoryMiddleware(path)])
    await agent.ainvoke("hi")  # no file yet: the prompt is the agent's own
    path.write_text("The user's name is Ada.")
    await agent.ainvoke("hi")
    path.write_text("The user's name is Grace.")
    await agent.ainvoke("hi")
    prompts = [r.system_prompt for r in model.requests]
    assert prompts[0] == "You are helpful."
    assert prompts[1] == "<agent_memory>\nThe user's name is Ada.\n</agent_memory>\n\nYou are helpful."
    assert "Grace" in prompts[2] and "Ada" not in prompts[2]


def test_a_crlf_file_keeps_its_line_endings_and_the_block_uses_them_too(tmp_path):
    memory = MemoryFile(tmp_path / "agent.md")
    memory.path.write_bytes(b"# Notes\r\nAnswer briefly.\r\n")
    memory.write_block("### Tea\n\n- one\n- two", handoff_id="h1")
    raw = memory.path.read_bytes()
    assert raw.startswith(b"# Notes\r\nAnswer briefly.\r\n")
    assert b"\n" not in raw.replace(b"\r\n", b"")  # every line ends in CRLF, the new ones too
    assert "- two" in memory.block()
    assert memory.reset_block(handoff_id="h1")
    assert memory.block() == BLOCK_PLACEHOLDER
    assert memory.path.read_bytes().startswith(b"# Notes\r\nAnswer briefly.\r\n")
    assert b"\n" not in memory.path.read_bytes().replace(b"\r\n", b"")


def test_a_symlinked_memory_file_is_written_through_to_its_target(tmp_path):
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    target = dotfiles / "agent.md"
    target.write_text("# Mine\n")
    link = tmp_path / "agents" / "agent" / "agent.md"
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    memory = MemoryFile(link)
    memory.write_block("### Tea", handoff_id="h1")
    assert link.is_symlink() and link.resolve() == target  # the link is still a link
    assert "### Tea" in target.read_text() and target.read_text().startswith("# Mine\n")
    target.write_text(target.read_text() + "An edit in the dotfiles.\n")
    memory.reset_block(handoff_id="h1")
    assert "An edit in the dotfiles." in link.read_text()
    assert not [p for p in link.parent.iterdir() if p.name != "agent.md"]  # no temporary files left behind


def test_the_file_keeps_its_mode_and_a_new_one_follows_the_umask(tmp_path):
    memory = MemoryFile(tmp_path / "agent.md")
    memory.path.write_text("# Notes\n")
    memory.path.chmod(0o644)
    memory.write_block("### Tea")
    assert oct(memory.path.stat().st_mode & 0o777) == oct(0o644)
    memory.path.chmod(0o640)
    memory.reset_block()
    assert oct(memory.path.stat().st_mode & 0o777) == oct(0o640)
    old = os.umask(0o022)
    try:
        fresh = MemoryFile(tmp_path / "new" / "agent.md")
        fresh.write_block("### New")
    finally:
        os.umask(old)
    assert oct(fresh.path.stat().st_mode & 0o777) == oct(0o644)
