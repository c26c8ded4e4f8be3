"""The composite backend: path prefixes routed to other backends.

``CompositeBackend(default=StateBackend(), routes={"/memories/": StoreBackend()})``
keeps ``/memories/...`` in the store (shared across threads) and everything
else in the thread's state. A routed backend sees paths without the prefix
(``/memories/notes.md`` is ``/notes.md`` in the store); results show them
with it. The state backend is the exception: it keeps the full path, as all
its files share the thread's one ``files`` key. ``execute`` goes to the
default backend, when it can run commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from backchannel.tools import ToolRuntime
from backchannel.workspace._text import under
from backchannel.workspace.protocol import (
    BackendProtocol,
    DeleteResult,
    EditResult,
    ExecuteResponse,
    FileInfo,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
    supports_execution,
)
from backchannel.workspace.state import StateBackend

__all__ = ["CompositeBackend"]


class CompositeBackend:
    """Routes each path to the backend of its longest matching prefix, or to ``default``."""

    def __init__(self, default: BackendProtocol, routes: Mapping[str, BackendProtocol]) -> None:
        for prefix in routes:
            if not prefix.startswith("/"):
                raise ValueError(f"a route prefix must start with '/', got {prefix!r}")
        self.default = default
        self.routes = {p if p.endswith("/") else p + "/": b for p, b in routes.items()}
        self._ordered = sorted(self.routes.items(), key=lambda item: len(item[0]), reverse=True)

    def __repr__(self) -> str:
        return f"CompositeBackend(default={self.default!r}, routes={self.routes!r})"

    def bind(self, runtime: ToolRuntime) -> CompositeBackend:
        return CompositeBackend(self.default.bind(runtime), {p: b.bind(runtime) for p, b in self.routes.items()})

    def supports_execution(self) -> bool:
        return supports_execution(self.default)

    def _route(self, path: str) -> tuple[BackendProtocol, str, str]:
        """The backend for ``path``, the path it knows the file by, and the prefix to show it with."""
        for prefix, backend in self._ordered:
            if path.startswith(prefix) or path + "/" == prefix:
                if isinstance(backend, StateBackend):
                    return backend, path, ""
                return backend, "/" + path[len(prefix):], prefix[:-1]
        return self.default, path, ""

    def _searched(self, path: str | None) -> list[tuple[BackendProtocol, str | None, str]]:
        """The backends a search under ``path`` covers, each with the path to search and the prefix."""
        root = (path or "/").rstrip("/") or "/"
        routed = self._route(root)
        if routed[0] is not self.default:
            return [routed]
        found: list[tuple[BackendProtocol, str | None, str]] = [(self.default, path, "")]
        for prefix, backend in self.routes.items():
            if under(prefix[:-1], root):
                found.append((backend, prefix[:-1] if isinstance(backend, StateBackend) else "/",
                              "" if isinstance(backend, StateBackend) else prefix[:-1]))
        return found

    async def ls(self, path: str) -> LsResult:
        backend, inner, prefix = self._route(path)
        result = await backend.ls(inner)
        if result.entries is None:
            return result
        entries = [_prefixed(e, prefix) for e in result.entries]
        if backend is self.default:
            directory = path if path.endswith("/") else path + "/"
            shown = {e["path"] for e in entries}
            for route in self.routes:
                if route.startswith(directory) and route != directory:
                    child = directory + route[len(directory):].split("/", 1)[0] + "/"
                    if child not in shown:
                        shown.add(child)
                        entries.append({"path": child, "is_dir": True, "size": 0, "modified_at": ""})
            entries.sort(key=lambda e: e["path"])
        return LsResult(entries=entries)

    async def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        backend, inner, _ = self._route(file_path)
        return await backend.read(inner, offset, limit)

    async def write(self, file_path: str, content: str) -> WriteResult:
        backend, inner, prefix = self._route(file_path)
        result = await backend.write(inner, content)
        return replace(result, path=prefix + result.path) if result.path else result

    async def edit(self, file_path: str, old_string: str, new_string: str,
                   replace_all: bool = False) -> EditResult:
        backend, inner, prefix = self._route(file_path)
        result = await backend.edit(inner, old_string, new_string, replace_all)
        return replace(result, path=prefix + result.path) if result.path else result

    async def delete(self, file_path: str) -> DeleteResult:
        backend, inner, prefix = self._route(file_path)
        result = await backend.delete(inner)
        return replace(result, path=prefix + result.path) if result.path else result

    async def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        matches: list[FileInfo] = []
        for backend, inner, prefix in self._searched(path):
            result = await backend.glob(pattern, inner)
            if result.error:
                return result
            matches.extend(_prefixed(m, prefix) for m in result.matches or ())
        return GlobResult(matches=matches)

    async def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                   max_count: int | None = None, regex: bool = False) -> GrepResult:
        matches: list[Any] = []
        for backend, inner, prefix in self._searched(path):
            left = None if max_count is None else max_count - len(matches)
            result = await backend.grep(pattern, inner, glob, max_count=left, regex=regex)
            if result.error:
                return result
            matches.extend({**m, "path": prefix + m["path"]} for m in result.matches or ())
            if result.truncated:
                return GrepResult(matches=matches, truncated=True)
        return GrepResult(matches=matches)

    async def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        execute = getattr(self.default, "execute", None)
        if execute is None or not supports_execution(self.default):
            return ExecuteResponse("Error: Execution not available: the default backend cannot run commands.")
        return await execute(command, timeout=timeout)


def _prefixed(info: FileInfo, prefix: str) -> FileInfo:
    return {**info, "path": prefix + info["path"]} if prefix else info
