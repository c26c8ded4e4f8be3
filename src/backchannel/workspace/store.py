"""The store backend: files in the runtime's key-value store, shared by every thread.

Each file is one item (key: its path, value: its ``FileData``) in a namespace
that is, by default, ``(<assistant>, "filesystem")``: the files of one
assistant, seen by all its threads and its subagents. Give ``namespace`` (a
tuple, or a function of the run) to share more widely or less. It goes
through the runtime's public store API (``put_item``, ``get_item``,
``search_items``, ``delete_item``), so it works the same on a
``LocalRuntime`` (memory, SQLite, Postgres) and a ``RemoteRuntime``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from backchannel.tools import ToolRuntime
from backchannel.workspace._text import (
    apply_edit,
    as_file_data,
    create_file_data,
    edit_positions,
    read_window,
    under,
)
from backchannel.workspace.protocol import (
    DeleteResult,
    EditResult,
    FileData,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    SupportsStore,
    WriteResult,
)
from backchannel.workspace.state import StateBackend

__all__ = ["StoreBackend"]

Namespace = Sequence[str] | Callable[[ToolRuntime], Sequence[str]]
_PAGE = 500


class StoreBackend:
    """Files in a store namespace: ``StoreBackend()`` uses the run's runtime store, per assistant."""

    def __init__(self, *, store: SupportsStore | None = None, namespace: Namespace | None = None) -> None:
        self.store = store
        self.namespace = namespace
        self._bound: tuple[str, ...] | None = tuple(namespace) if isinstance(namespace, (tuple, list)) else None

    def __repr__(self) -> str:
        return f"StoreBackend(namespace={self._bound or self.namespace!r})"

    def bind(self, runtime: ToolRuntime) -> StoreBackend:
        store = self.store or runtime.store
        if callable(self.namespace):
            namespace = tuple(self.namespace(runtime))
        else:
            namespace = self._bound or (assistant_of(runtime), "filesystem")
        bound = StoreBackend(store=store, namespace=namespace)
        return bound

    def _target(self) -> tuple[SupportsStore, tuple[str, ...]]:
        if self.store is None or self._bound is None:
            raise ValueError("the store backend has no store: run the agent on a runtime's thread "
                             "(LocalRuntime or RemoteRuntime), or give StoreBackend(store=..., namespace=(...))")
        return self.store, self._bound

    async def _get(self, path: str) -> FileData | None:
        store, namespace = self._target()
        item = await store.get_item(namespace, key=path)
        return as_file_data(item["value"]) if item else None

    async def _all(self) -> dict[str, FileData]:
        """Every file in the namespace (items of deeper namespaces are not files here)."""
        store, namespace = self._target()
        files: dict[str, FileData] = {}
        offset = 0
        while True:
            page = (await store.search_items(namespace, limit=_PAGE, offset=offset))["items"]
            for item in page:
                if tuple(item["namespace"]) == namespace:
                    files[item["key"]] = as_file_data(item["value"])
            if len(page) < _PAGE:
                return files
            offset += _PAGE

    async def ls(self, path: str) -> LsResult:
        try:
            files = await self._all()
        except ValueError as exc:
            return LsResult(error=str(exc))
        return await StateBackend(files).ls(path)  # the same listing as files in a state

    async def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        try:
            data = await self._get(file_path)
        except ValueError as exc:
            return ReadResult(error=str(exc))
        return read_window(data, file_path, offset, limit)

    async def write(self, file_path: str, content: str) -> WriteResult:
        try:
            store, namespace = self._target()
            existing = await self._get(file_path)
        except ValueError as exc:
            return WriteResult(error=f"Error: {exc}")
        data = create_file_data(content, created_at=existing.get("created_at") if existing else None)
        await store.put_item(namespace, key=file_path, value=data)
        return WriteResult(path=file_path)

    async def edit(self, file_path: str, old_string: str, new_string: str,
                   replace_all: bool = False) -> EditResult:
        try:
            store, namespace = self._target()
            data = await self._get(file_path)
        except ValueError as exc:
            return EditResult(error=f"Error: {exc}")
        positions = edit_positions(data, file_path, old_string, new_string, replace_all)
        if isinstance(positions, str):
            return EditResult(error=positions)
        assert data is not None
        content = apply_edit(data["content"], positions, len(old_string), new_string)
        await store.put_item(namespace, key=file_path,
                             value=create_file_data(content, created_at=data.get("created_at")))
        return EditResult(path=file_path, occurrences=len(positions))

    async def delete(self, file_path: str) -> DeleteResult:
        try:
            store, namespace = self._target()
            files = await self._all()
        except ValueError as exc:
            return DeleteResult(error=f"Error: {exc}")
        base = file_path.rstrip("/") or "/"
        doomed = [k for k in files if under(k, base)]
        if not doomed:
            return DeleteResult(error=f"Error: File '{file_path}' not found")
        for key in doomed:
            await store.delete_item(namespace, key=key)
        return DeleteResult(path=file_path)

    async def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        try:
            files = await self._all()
        except ValueError as exc:
            return GlobResult(error=str(exc))
        return await StateBackend(files).glob(pattern, path)

    async def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                   max_count: int | None = None, regex: bool = False) -> GrepResult:
        try:
            files = await self._all()
        except ValueError as exc:
            return GrepResult(error=str(exc))
        return await StateBackend(files).grep(pattern, path, glob, max_count=max_count, regex=regex)


def assistant_of(runtime: ToolRuntime) -> str:
    """The assistant whose files a run works on: a task's supervisor's, else its root agent's graph."""
    parent = runtime.state.get("parent_assistant_id")
    if parent:
        return str(parent)
    ctx: Any = runtime.ctx
    if ctx is None:
        return runtime.agent_name
    while ctx.parent is not None:
        ctx = ctx.parent
    return str(ctx.metadata.get("graph_id") or ctx.agent)
