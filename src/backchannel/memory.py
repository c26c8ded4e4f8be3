"""Agent memory: a Markdown file the agent sees in its system prompt on every model call.

Each named agent has one (``~/.backchannel/agents/<name>/agent.md`` by
default). People edit it by hand; a handoff (:mod:`backchannel.handoff`)
writes a summary of the previous thread into its managed block::

    ## Recent Thread Snapshot
    <current_thread_summary>
    None recorded yet.
    </current_thread_summary>

Writes are atomic (a temporary file, then ``os.replace``), so a crash mid-write
leaves the previous file whole. They keep what the person chose: the file's
line endings (CRLF stays CRLF), its mode, and a symlink (the link's target is
written, so a file kept in a dotfiles repository gets every change).
"""

from __future__ import annotations

import os
import stat
import uuid
from pathlib import Path

from backchannel.messages import AIMessage
from backchannel.middleware import Middleware, ModelHandler
from backchannel.models.base import ModelRequest

__all__ = [
    "BLOCK_END",
    "BLOCK_PLACEHOLDER",
    "BLOCK_START",
    "AgentMemoryMiddleware",
    "MemoryFile",
    "agent_memory_path",
    "write_atomic",
]

BLOCK_START = "<current_thread_summary>"
BLOCK_END = "</current_thread_summary>"
BLOCK_PLACEHOLDER = "None recorded yet."
_SCAFFOLD = f"## Recent Thread Snapshot\n{BLOCK_START}\n{BLOCK_PLACEHOLDER}\n{BLOCK_END}\n"
_HANDOFF_MARK = "<!-- handoff_id: "


def agent_memory_path(agent: str, home: str | os.PathLike[str] | None = None) -> Path:
    """Where the memory file of ``agent`` lives: ``<home>/agents/<agent>/agent.md`` (home: ``~/.backchannel``)."""
    if not agent or "/" in agent or agent in (".", ".."):
        raise ValueError(f"an agent name must be a plain name (no '/'), got {agent!r}")
    base = Path(home) if home is not None else Path.home() / ".backchannel"
    return base / "agents" / agent / "agent.md"


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content with ``text`` all at once: readers see the old file or the new, never half.

    ``text`` is written as it is (no newline translation). A symlink's target is
    replaced, not the link; an existing file keeps its mode, a new one gets the
    umask's, as any editor would leave it.
    """
    target = Path(os.path.realpath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode: int | None = stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        mode = None
    temp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 minus the umask, like open()
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise


class MemoryFile:
    """An agent's memory file and its ``<current_thread_summary>`` block."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path).expanduser()
        self._cache: tuple[int, int, str] | None = None  # (mtime_ns, size, text)

    def __repr__(self) -> str:
        return f"MemoryFile({str(self.path)!r})"

    def read(self) -> str:
        """The file's text ("" when there is no file yet); re-read only when the file changed."""
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._cache = None
            return ""
        cached = self._cache
        if cached is not None and cached[0] == stat.st_mtime_ns and cached[1] == stat.st_size:
            return cached[2]
        text = self.path.read_text(encoding="utf-8")
        self._cache = (stat.st_mtime_ns, stat.st_size, text)
        return text

    def block(self) -> str | None:
        """What the summary block holds now (``None`` when the file has no block)."""
        parts = _split(self.read())
        return parts[1].strip("\n") if parts else None

    def block_handoff_id(self) -> str | None:
        """The id of the handoff whose summary is in the block, if one is."""
        block = self.block() or ""
        if not block.startswith(_HANDOFF_MARK):
            return None
        return block[len(_HANDOFF_MARK):].split(" -->", 1)[0].strip() or None

    def write_block(self, summary_md: str, *, handoff_id: str | None = None) -> None:
        """Put ``summary_md`` in the block, adding the block (once) if the file has none."""
        mark = f"{_HANDOFF_MARK}{handoff_id} -->\n" if handoff_id else ""
        self._replace_block(mark + summary_md.strip("\n"))

    def reset_block(self, *, handoff_id: str | None = None) -> bool:
        """Put the placeholder back; with ``handoff_id``, only if the block still holds that handoff's summary.

        Returns whether the file changed (``False`` when there was nothing to
        reset), so calling it again is harmless.
        """
        if handoff_id is not None and self.block_handoff_id() != handoff_id:
            return False
        if self.block() in (None, BLOCK_PLACEHOLDER):
            return False
        self._replace_block(BLOCK_PLACEHOLDER)
        return True

    def _replace_block(self, content: str) -> None:
        text = self._read_raw()
        newline = "\r\n" if "\r\n" in text else "\n"  # new lines follow the file's own line endings
        parts = _split(text)
        if parts is None:  # no block yet: add the scaffold once, at the end
            scaffold = _SCAFFOLD.replace("\n", newline)
            text = f"{text.rstrip()}{newline * 2}{scaffold}" if text.strip() else scaffold
            parts = _split(text)
            assert parts is not None
        before, _, after = parts
        content = content.replace("\r\n", "\n").replace("\n", newline)
        write_atomic(self.path, f"{before}{BLOCK_START}{newline}{content}{newline}{BLOCK_END}{after}")
        self._cache = None

    def _read_raw(self) -> str:
        """The file's text with its line endings as they are ("" when there is no file yet)."""
        try:
            with open(self.path, encoding="utf-8", newline="") as f:
                return f.read()
        except FileNotFoundError:
            return ""


def _split(text: str) -> tuple[str, str, str] | None:
    """``(before, block content, after)`` around the block's markers, or ``None`` without a whole block."""
    start = text.find(BLOCK_START)
    if start < 0:
        return None
    end = text.find(BLOCK_END, start + len(BLOCK_START))
    if end < 0:
        return None
    return text[:start], text[start + len(BLOCK_START):end], text[end + len(BLOCK_END):]


class AgentMemoryMiddleware(Middleware):
    """Put the agent's memory file at the top of its system prompt, on every model call.

    ``memory`` is a :class:`MemoryFile` or a path. The file is read again only
    when it changes, so edits show up at the next model call.
    """

    def __init__(self, memory: MemoryFile | str | os.PathLike[str]) -> None:
        self.memory = memory if isinstance(memory, MemoryFile) else MemoryFile(memory)

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """Every model call: the memory file's text goes first in the system prompt."""
        text = self.memory.read().strip()
        if not text:
            return await handler(request)
        section = f"<agent_memory>\n{text}\n</agent_memory>"
        prompt = f"{section}\n\n{request.system_prompt}" if request.system_prompt else section
        return await handler(request.override(system_prompt=prompt))
