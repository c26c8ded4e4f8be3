"""A deep agent's workspace: files on a backend, a plan, memory files and skills.

The backends keep files in the thread's state (:class:`StateBackend`, the
default), a directory (:class:`FilesystemBackend`, and
:class:`LocalShellBackend` which can also run commands), the runtime's store
(:class:`StoreBackend`), or several of these by path prefix
(:class:`CompositeBackend`). The middleware give the agent deepagents' tools
on top of them: :class:`FilesystemMiddleware` (``ls``, ``read_file``,
``write_file``, ``edit_file``, ``delete``, ``glob``, ``grep``, ``execute``),
:class:`TodoListMiddleware` (``write_todos``), :class:`MemoryMiddleware` and
:class:`SkillsMiddleware`.
"""

from backchannel.workspace.composite import CompositeBackend
from backchannel.workspace.disk import FilesystemBackend
from backchannel.workspace.filesystem import FILE_TOOLS, FilesystemMiddleware
from backchannel.workspace.memory import MemoryMiddleware
from backchannel.workspace.protocol import (
    BackendProtocol,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileData,
    FileInfo,
    GlobResult,
    GrepMatch,
    GrepResult,
    LsResult,
    ReadResult,
    SandboxBackendProtocol,
    SupportsStore,
    WriteResult,
    supports_execution,
)
from backchannel.workspace.shell import LocalShellBackend
from backchannel.workspace.skills import SkillMetadata, SkillsMiddleware
from backchannel.workspace.state import FILES_KEY, StateBackend, merge_files
from backchannel.workspace.store import StoreBackend
from backchannel.workspace.todos import Todo, TodoListMiddleware

__all__ = [
    "FILES_KEY",
    "FILE_TOOLS",
    "BackendProtocol",
    "CompositeBackend",
    "DeleteResult",
    "EditResult",
    "ExecuteResponse",
    "FileData",
    "FileInfo",
    "FilesystemBackend",
    "FilesystemMiddleware",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "LocalShellBackend",
    "LsResult",
    "MemoryMiddleware",
    "ReadResult",
    "SandboxBackendProtocol",
    "SkillMetadata",
    "SkillsMiddleware",
    "StateBackend",
    "StoreBackend",
    "SupportsStore",
    "Todo",
    "TodoListMiddleware",
    "WriteResult",
    "merge_files",
    "supports_execution",
]
