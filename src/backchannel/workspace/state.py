"""The state backend: files kept in the thread's state, under ``files``, checkpointed with the thread.

The default backend. Files are visible wherever the thread's state is
(``get_state``, the ``values`` stream, ``langgraph_sdk`` clients of the
server) and shared with the subagents that share the workspace. An edit is
recorded as what it changed, not as the whole new file: the ``files`` update
of ``edit_file`` holds the positions replaced and the new text, and the
``files`` reducer applies it. A checkpoint stores that update, so a large
file edited many times costs the bytes of the edits, not a copy per edit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from backchannel.tools import ToolRuntime
from backchannel.workspace._text import (
    apply_edit,
    as_file_data,
    compile_glob,
    create_file_data,
    edit_positions,
    grep_lines,
    is_edit,
    now,
    read_window,
    relative_to,
    under,
)
from backchannel.workspace.protocol import (
    DeleteResult,
    EditResult,
    FileData,
    FileInfo,
    GlobResult,
    GrepResult,
    LsResult,
    ReadResult,
    WriteResult,
)

__all__ = ["FILES_KEY", "FilesState", "StateBackend", "changed_files", "combine_file_updates", "files_written_since",
           "merge_files"]

FILES_KEY = "files"


def merge_files(current: Mapping[str, Any] | None, update: Mapping[str, Any]) -> dict[str, Any]:
    """The ``files`` reducer: per path, a file (or its text) replaces, ``None`` deletes, an edit applies."""
    files = dict(current or {})
    for path, value in update.items():
        if value is None:
            files.pop(path, None)
        elif is_edit(value):
            base = files.get(path)
            if base is None:
                raise ValueError(f"cannot edit {path}: there is no such file")
            data = as_file_data(base)
            content = apply_edit(data["content"], value["at"], value["cut"], value["put"])
            files[path] = {**data, "content": content, "modified_at": value.get("modified_at", now())}
        else:
            files[path] = as_file_data(value)
    return files


def combine_file_updates(first: Mapping[str, Any], then: Mapping[str, Any]) -> dict[str, Any]:
    """Two ``files`` updates of one step (parallel tool calls) as one: the later wins per path; an
    edit after a write applies to it. Two edits of one path cannot be combined (their positions
    are both in the file before the step): the file tools refuse that."""
    combined = dict(first)
    for path, value in then.items():
        base = combined.get(path)
        if is_edit(value) and base is not None:
            if is_edit(base):
                raise ValueError(f"two edits of {path} in one step cannot be merged; edit a file once per step")
            value = merge_files({path: base}, {path: value})[path]
        combined[path] = value
    return combined


merge_files.merge = combine_file_updates  # type: ignore[attr-defined]


class FilesState(TypedDict, total=False):
    files: Annotated[dict[str, FileData], merge_files]


class StateBackend:
    """Files in the thread's state: ``create_deep_agent``'s default backend.

    Bound to a run, it reads the run's ``files``; its writes come back as
    ``files_update`` for the file tools to apply, so they are checkpointed with
    the step that made them.
    """

    __slots__ = ("files",)

    def __init__(self, files: Mapping[str, Any] | None = None) -> None:
        self.files: Mapping[str, Any] = files if files is not None else {}

    def __repr__(self) -> str:
        return "StateBackend()"

    def bind(self, runtime: ToolRuntime) -> StateBackend:
        return StateBackend(runtime.state.get(FILES_KEY) or {})

    def _get(self, path: str) -> FileData | None:
        value = self.files.get(path)
        return None if value is None or is_edit(value) else as_file_data(value)

    async def ls(self, path: str) -> LsResult:
        prefix = path if path.endswith("/") else path + "/"
        entries: list[FileInfo] = []
        directories: set[str] = set()
        for key in self.files:
            data = self._get(key)
            if data is None or not key.startswith(prefix):
                continue
            rest = key[len(prefix):]
            if "/" in rest:
                directories.add(prefix + rest.split("/", 1)[0] + "/")
            else:
                entries.append({"path": key, "is_dir": False, "size": len(data["content"].encode()),
                                "modified_at": data.get("modified_at", "")})
        entries.extend({"path": d, "is_dir": True, "size": 0, "modified_at": ""} for d in directories)
        entries.sort(key=lambda e: e["path"])
        return LsResult(entries=entries)

    async def read(self, file_path: str, offset: int = 0, limit: int = 2000) -> ReadResult:
        return read_window(self._get(file_path), file_path, offset, limit)

    async def write(self, file_path: str, content: str) -> WriteResult:
        existing = self._get(file_path)
        data = create_file_data(content, created_at=existing.get("created_at") if existing else None)
        return WriteResult(path=file_path, files_update={file_path: data})

    async def edit(self, file_path: str, old_string: str, new_string: str,
                   replace_all: bool = False) -> EditResult:
        positions = edit_positions(self._get(file_path), file_path, old_string, new_string, replace_all)
        if isinstance(positions, str):
            return EditResult(error=positions)
        change = {"at": positions, "cut": len(old_string), "put": new_string, "modified_at": now()}
        return EditResult(path=file_path, occurrences=len(positions), files_update={file_path: change})

    async def delete(self, file_path: str) -> DeleteResult:
        base = file_path.rstrip("/") or "/"
        doomed = [k for k in self.files if self._get(k) is not None and under(k, base)]
        if not doomed:
            return DeleteResult(error=f"Error: File '{file_path}' not found")
        return DeleteResult(path=file_path, files_update=dict.fromkeys(doomed))

    def _texts(self, root: str) -> list[tuple[str, FileData]]:
        return [(k, data) for k in self.files if under(k, root) and (data := self._get(k)) is not None]

    async def glob(self, pattern: str, path: str | None = None) -> GlobResult:
        root = (path or "/").rstrip("/") or "/"
        matches = compile_glob(pattern)
        found: list[FileInfo] = [
            {"path": k, "is_dir": False, "size": len(data["content"].encode()),
             "modified_at": data.get("modified_at", "")}
            for k, data in self._texts(root) if matches(relative_to(k, root))]
        found.sort(key=lambda info: info.get("modified_at", ""), reverse=True)
        return GlobResult(matches=found)

    async def grep(self, pattern: str, path: str | None = None, glob: str | None = None, *,
                   max_count: int | None = None, regex: bool = False) -> GrepResult:
        root = (path or "/").rstrip("/") or "/"
        files = self._texts(root)
        if glob:
            matches = compile_glob(glob)
            files = [(k, d) for k, d in files if matches(relative_to(k, root))]
        texts = [(k, d["content"]) for k, d in sorted(files) if d.get("encoding") != "base64"]
        return grep_lines(texts, pattern, regex=regex, max_count=max_count)


def changed_files(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``files`` update that turns ``before`` into ``after``: what a subagent that started with
    ``before`` wrote (new file objects) and deleted. Unchanged files are the same objects in both."""
    before, after = before or {}, after or {}
    update: dict[str, Any] = {path: data for path, data in after.items() if before.get(path) is not data}
    update.update({path: None for path in before if path not in after})
    return update


def files_written_since(files: Mapping[str, Any] | None, ours: Mapping[str, Any] | None,
                        since: str) -> dict[str, Any]:
    """The files of another thread (a background task's) written at or after ``since`` and newer
    than our copy: what to take back from it without undoing our own later writes."""
    update: dict[str, Any] = {}
    ours = ours or {}
    for path, value in (files or {}).items():
        if value is None or is_edit(value):
            continue
        data = as_file_data(value)
        stamp = data.get("modified_at", "")
        mine = ours.get(path)
        if stamp >= since and (mine is None or stamp > as_file_data(mine).get("modified_at", "")):
            update[path] = data
    return update
