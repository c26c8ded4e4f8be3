"""The backend protocol: where a deep agent's files live, and what each file operation returns.

The names and result shapes are deepagents' (``LsResult``, ``ReadResult``,
``WriteResult``, ``EditResult``, ``GrepResult``, ``GlobResult``,
``ExecuteResponse``; ``FileData``, ``FileInfo``, ``GrepMatch``), so a backend
written against one reads naturally against the other. The methods are async:
a backend may reach a disk, a database or a remote sandbox.

A backend whose files depend on the run (the thread's state, a store
namespace per assistant) implements :meth:`BackendProtocol.bind`, which
returns the backend to use for one run; the others return themselves.
Backends that keep files in the thread's state don't write them: they return
``files_update``, the state update the file tools apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict, runtime_checkable

from backchannel.tools import ToolRuntime

__all__ = [
    "BackendProtocol",
    "DeleteResult",
    "EditResult",
    "ExecuteResponse",
    "FileData",
    "FileInfo",
    "FilesUpdate",
    "GlobResult",
    "GrepMatch",
    "GrepResult",
    "LsResult",
    "ReadResult",
    "SandboxBackendProtocol",
    "SupportsStore",
    "WriteResult",
    "supports_execution",
]


class FileData(TypedDict):
    """A file as the state and the store keep it."""

    content: str
    encoding: str  # "utf-8" for text, "base64" for binary
    created_at: NotRequired[str]
    modified_at: NotRequired[str]


class FileInfo(TypedDict):
    """One entry of a listing: only ``path`` is always there (directories end with ``/``)."""

    path: str
    is_dir: NotRequired[bool]
    size: NotRequired[int]
    modified_at: NotRequired[str]


class GrepMatch(TypedDict):
    """One matching line: its file, its 1-based line number and its text."""

    path: str
    line: int
    text: str


# A state update for the ``files`` key: per path, a FileData (write), None (delete) or an edit.
FilesUpdate = dict[str, Any]


@dataclass(slots=True)
class LsResult:
    error: str | None = None
    entries: list[FileInfo] | None = None


@dataclass(slots=True)
class ReadResult:
    """A window of a file: its lines ``start_line``..``end_line`` (1-based) of ``total_lines``."""

    error: str | None = None
    file_data: FileData | None = None
    total_lines: int | None = None
    start_line: int | None = None
    end_line: int | None = None
    next_offset: int | None = None  # the 0-based offset of the next unread line, None at the end


@dataclass(slots=True)
class WriteResult:
    error: str | None = None
    path: str | None = None
    files_update: FilesUpdate | None = None  # for backends that keep files in the state


@dataclass(slots=True)
class EditResult:
    error: str | None = None
    path: str | None = None
    occurrences: int | None = None
    files_update: FilesUpdate | None = None


@dataclass(slots=True)
class DeleteResult:
    error: str | None = None
    path: str | None = None
    files_update: FilesUpdate | None = None


@dataclass(slots=True)
class GrepResult:
    """Matches (complete, or cut at ``max_count`` when ``truncated``), or an error."""

    error: str | None = None
    matches: list[GrepMatch] | None = None
    truncated: bool = False


@dataclass(slots=True)
class GlobResult:
    error: str | None = None
    matches: list[FileInfo] | None = None
    truncated: bool = False


@dataclass(slots=True)
class ExecuteResponse:
    """A command's combined stdout and stderr, its exit code, and whether the output was cut."""

    output: str
    exit_code: int | None = None
    truncated: bool = False


@runtime_checkable
class BackendProtocol(Protocol):
    """Where files live. Paths are absolute (``/notes/todo.md``); errors come back in the results."""

    def bind(self, runtime: ToolRuntime) -> BackendProtocol:
        """The backend for one run (a backend that does not depend on the run returns itself)."""
        ...

    async def ls(self, path: str) -> LsResult:
        """The files and directories directly in ``path``."""
        ...

    async def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        """``limit`` lines of a file from line ``offset`` (0-based)."""
        ...

    async def write(self, file_path: str, content: str) -> WriteResult:
        """Create the file, or replace its content."""
        ...

    async def edit(self, file_path: str, old_string: str, new_string: str,
                   replace_all: bool = False) -> EditResult:
        """Replace ``old_string`` (which must be unique unless ``replace_all``) with ``new_string``."""
        ...

    async def delete(self, file_path: str) -> DeleteResult:
        """Delete a file, or a directory and everything in it."""
        ...

    async def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        """The files under ``path`` matching a glob pattern."""
        ...

    async def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                   max_count: int | None = None, regex: bool = False) -> GrepResult:
        """The lines containing ``pattern`` (literal text, or a regular expression with ``regex``)."""
        ...


@runtime_checkable
class SandboxBackendProtocol(BackendProtocol, Protocol):
    """A backend that can also run shell commands."""

    async def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        """Run ``command`` in the backend's root; ``timeout`` (seconds) overrides the default."""
        ...


def supports_execution(backend: BackendProtocol) -> bool:
    """Whether ``backend`` can run commands (offers the ``execute`` tool)."""
    probe = getattr(backend, "supports_execution", None)
    return bool(probe()) if callable(probe) else isinstance(backend, SandboxBackendProtocol)


class SupportsStore(Protocol):
    """The part of a runtime's store the store backend uses (``LocalRuntime.store``, ``RemoteRuntime.store``)."""

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any]) -> None: ...

    async def get_item(self, namespace: Sequence[str], /, key: str) -> dict[str, Any] | None: ...

    async def delete_item(self, namespace: Sequence[str], /, key: str) -> None: ...

    async def search_items(self, namespace_prefix: Sequence[str], /, *, limit: int = 10,
                           offset: int = 0) -> dict[str, Any]: ...
