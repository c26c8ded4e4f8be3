"""The disk backend: files in a directory, confined to it.

``FilesystemBackend(root_dir)`` serves the directory as ``/`` (``virtual_mode``,
the default): ``/notes.md`` is ``<root_dir>/notes.md``. With
``virtual_mode=False`` paths are the machine's own, and must lie inside
``root_dir``. Either way a path with ``..``, a path outside the root, or a
symlink that leads out of it is refused with an error result. File work runs
in worker threads, so a slow disk never stalls the event loop.
"""

from __future__ import annotations

import base64
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backchannel._threads import run_in_thread
from backchannel.memory import write_atomic
from backchannel.tools import ToolRuntime
from backchannel.workspace._text import (
    apply_edit,
    compile_glob,
    edit_positions,
    grep_lines,
    read_window,
    relative_to,
    validate_path,
)
from backchannel.workspace.protocol import (
    DeleteResult,
    EditResult,
    FileInfo,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)

__all__ = ["FilesystemBackend"]


class FilesystemBackend:
    """Files in ``root_dir`` (default: the current directory), which the agent cannot leave."""

    def __init__(self, root_dir: str | os.PathLike[str] | None = None, virtual_mode: bool = True,
                 max_file_size_mb: int = 10) -> None:
        self.cwd = Path(root_dir or os.getcwd()).expanduser().resolve()
        self.virtual_mode = virtual_mode
        self.max_file_bytes = max_file_size_mb * 1024 * 1024

    def __repr__(self) -> str:
        return f"{type(self).__name__}(root_dir={str(self.cwd)!r})"

    def bind(self, runtime: ToolRuntime) -> FilesystemBackend:
        return self

    # -- paths -----------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The file ``path`` names, inside the root; ``ValueError`` saying why it is refused."""
        if self.virtual_mode:
            full = self.cwd / validate_path(path).lstrip("/")
        else:
            given = Path(path)
            if ".." in given.parts or path.startswith("~"):
                raise ValueError(f"Path traversal not allowed: {path}")
            full = given if given.is_absolute() else self.cwd / given
            if not _inside(Path(os.path.normpath(full)), self.cwd):
                raise ValueError(f"Path {path} is outside the workspace root {self.cwd}")
        if not _inside(full.resolve(), self.cwd):
            raise ValueError(f"Path {path} leads outside the workspace root (through a symlink)")
        return full

    def shown(self, full: Path) -> str:
        """How results name a file: its virtual path, or its real one without ``virtual_mode``."""
        if not self.virtual_mode:
            return str(full)
        relative = full.relative_to(self.cwd).as_posix()
        return "/" if relative == "." else "/" + relative

    # -- operations ------------------------------------------------------------

    async def ls(self, path: str) -> LsResult:
        return await run_in_thread(self._ls, {"path": path})

    async def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return await run_in_thread(self._read, {"file_path": file_path, "offset": offset, "limit": limit})

    async def write(self, file_path: str, content: str) -> WriteResult:
        return await run_in_thread(self._write, {"file_path": file_path, "content": content})

    async def edit(self, file_path: str, old_string: str, new_string: str,
                   replace_all: bool = False) -> EditResult:
        return await run_in_thread(self._edit, {"file_path": file_path, "old_string": old_string,
                                                "new_string": new_string, "replace_all": replace_all})

    async def delete(self, file_path: str) -> DeleteResult:
        return await run_in_thread(self._delete, {"file_path": file_path})

    async def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        return await run_in_thread(self._glob, {"pattern": pattern, "path": path})

    async def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                   max_count: int | None = None, regex: bool = False) -> GrepResult:
        return await run_in_thread(self._grep, {"pattern": pattern, "path": path, "glob": glob,
                                                "max_count": max_count, "regex": regex})

    # -- the same, in a worker thread ----------------------------------------------

    def _ls(self, path: str) -> LsResult:
        try:
            directory = self.resolve(path)
            if not directory.is_dir():
                return LsResult(error=f"Directory '{path}' not found")
            entries = [self._info(child) for child in sorted(directory.iterdir()) if _inside(child.resolve(), self.cwd)]
        except (ValueError, OSError) as exc:
            return LsResult(error=str(exc))
        return LsResult(entries=entries)

    def _info(self, full: Path) -> FileInfo:
        stat = full.stat()
        is_dir = full.is_dir()
        return {"path": self.shown(full) + ("/" if is_dir else ""), "is_dir": is_dir,
                "size": 0 if is_dir else stat.st_size, "modified_at": _stamp(stat.st_mtime)}

    def _load(self, file_path: str) -> tuple[Path, str, str] | str:
        """The file, its content and encoding; or an error message."""
        try:
            full = self.resolve(file_path)
            if not full.is_file():
                return f"File '{file_path}' not found"
            if full.stat().st_size > self.max_file_bytes:
                return f"File '{file_path}' is larger than {self.max_file_bytes // (1024 * 1024)} MB"
            raw = full.read_bytes()
        except (ValueError, OSError) as exc:
            return str(exc)
        try:
            return full, raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            return full, base64.b64encode(raw).decode("ascii"), "base64"

    def _read(self, file_path: str, offset: int, limit: int) -> ReadResult:
        loaded = self._load(file_path)
        if isinstance(loaded, str):
            return ReadResult(error=loaded)
        _, content, encoding = loaded
        return read_window({"content": content, "encoding": encoding}, file_path, offset, limit)

    def _write(self, file_path: str, content: str) -> WriteResult:
        try:
            full = self.resolve(file_path)
            if full.is_dir():
                return WriteResult(error=f"Error: '{file_path}' is a directory")
            write_atomic(full, content)
        except (ValueError, OSError) as exc:
            return WriteResult(error=f"Error: {exc}")
        return WriteResult(path=self.shown(full))

    def _edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool) -> EditResult:
        loaded = self._load(file_path)
        if isinstance(loaded, str):
            return EditResult(error=f"Error: {loaded}")
        full, content, encoding = loaded
        positions = edit_positions({"content": content, "encoding": encoding}, file_path, old_string, new_string,
                                   replace_all)
        if isinstance(positions, str):
            return EditResult(error=positions)
        try:
            write_atomic(full, apply_edit(content, positions, len(old_string), new_string))
        except OSError as exc:
            return EditResult(error=f"Error: {exc}")
        return EditResult(path=self.shown(full), occurrences=len(positions))

    def _delete(self, file_path: str) -> DeleteResult:
        try:
            full = self.resolve(file_path)
            if full == self.cwd:
                return DeleteResult(error="Error: cannot delete the workspace root")
            if full.is_symlink() or full.is_file():
                full.unlink()
            elif full.is_dir():
                shutil.rmtree(full)
            else:
                return DeleteResult(error=f"Error: File '{file_path}' not found")
        except (ValueError, OSError) as exc:
            return DeleteResult(error=f"Error: {exc}")
        return DeleteResult(path=self.shown(full))

    def _walk(self, path: str | None) -> tuple[Path, list[Path]]:
        """The search root and the files under it (not following symlinks out of the root)."""
        root = self.resolve(path or "/")
        if root.is_file():
            return root, [root]
        files = []
        for directory, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                full = Path(directory, name)
                if _inside(full.resolve(), self.cwd):
                    files.append(full)
        return root, files

    def _glob(self, pattern: str, path: str | None) -> GlobResult:
        try:
            root, files = self._walk(path)
        except (ValueError, OSError) as exc:
            return GlobResult(error=str(exc))
        matches = compile_glob(pattern)
        shown_root = self.shown(root)
        found = []
        for full in files:
            if matches(relative_to(self.shown(full), shown_root)):
                found.append(self._info(full))
        return GlobResult(matches=found)

    def _grep(self, pattern: str, path: str | None, glob: str | None, max_count: int | None,
              regex: bool) -> GrepResult:
        try:
            root, files = self._walk(path)
        except (ValueError, OSError) as exc:
            return GrepResult(error=str(exc))
        shown_root = self.shown(root)
        if glob:
            matches = compile_glob(glob)
            files = [f for f in files if matches(relative_to(self.shown(f), shown_root))]
        return grep_lines(_texts(self, files), pattern, regex=regex, max_count=max_count)


def _texts(backend: FilesystemBackend, files: list[Path]) -> Any:
    """(shown path, text) of each readable text file, read as the search reaches it."""
    for full in files:
        try:
            if full.stat().st_size > backend.max_file_bytes:
                continue
            text = full.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        yield backend.shown(full), text


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _stamp(mtime: float) -> str:
    return datetime.fromtimestamp(mtime, UTC).isoformat()
