"""What every backend does the same way: path checks, file data, line windows, edits, grep and glob."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from posixpath import normpath
from typing import Any

from backchannel._clock import now_iso as now
from backchannel.workspace.protocol import FileData, GrepMatch, GrepResult, ReadResult

__all__ = [
    "apply_edit",
    "as_file_data",
    "compile_glob",
    "create_file_data",
    "grep_lines",
    "is_edit",
    "edit_positions",
    "plan_edit",
    "read_window",
    "relative_to",
    "slice_lines",
    "validate_path",
]

EMPTY_OLD_STRING = "Error: old_string cannot be empty. Provide the exact text to replace."


def validate_path(path: str) -> str:
    """``path`` as a clean absolute path (``/a/b``); ``ValueError`` for ``..``, ``~`` or a drive letter."""
    if path[:1] == "/" and path[-1:] != "/" and "/." not in path and "//" not in path and "\\" not in path:
        return path  # already clean: no "." or ".." part, no empty part (the common case, kept cheap)
    if not isinstance(path, str) or not path.strip():
        raise ValueError("Path cannot be empty")
    posix = path.replace("\\", "/")
    if ".." in posix.split("/") or posix.startswith("~"):
        raise ValueError(f"Path traversal not allowed: {path}")
    if re.match(r"^[a-zA-Z]:", posix):
        raise ValueError(f"Windows absolute paths are not supported: {path}. Use paths like /workspace/file.txt")
    clean = normpath("/" + posix.lstrip("/"))
    return "/" if clean in ("/", "//") else clean


def create_file_data(content: str, created_at: str | None = None, encoding: str = "utf-8") -> FileData:
    """A new file's data, stamped now."""
    stamp = now()
    return {"content": content, "encoding": encoding, "created_at": created_at or stamp, "modified_at": stamp}


def as_file_data(value: Any) -> FileData:
    """A file as given in a state (``FileData``, or just its text)."""
    if isinstance(value, str):
        return {"content": value, "encoding": "utf-8"}
    content = value["content"]
    if isinstance(content, list):  # deepagents' older form: a list of lines
        return {"encoding": "utf-8", **value, "content": "\n".join(content)}
    return value


def is_edit(value: Any) -> bool:
    """Whether a ``files`` update value is an edit (positions to replace) rather than a whole file."""
    return isinstance(value, dict) and "at" in value and "content" not in value


def slice_lines(content: str, offset: int, limit: int) -> ReadResult:
    """The window of ``limit`` lines from line ``offset`` (0-based), with its place in the file.

    Lines end at ``\\n`` (as grep counts them); only the lines up to the window are split off,
    so reading the start of a large file costs the window, not the file.
    """
    offset, limit = max(int(offset), 0), max(int(limit), 0)
    if limit == 0 or not content or content.isspace():
        return ReadResult(file_data={"content": content if limit else "", "encoding": "utf-8"})
    ends_with_newline = content.endswith("\n")
    total = content.count("\n") + (0 if ends_with_newline else 1)
    if offset >= total:
        return ReadResult(error=f"Line offset {offset} exceeds file length ({total} lines)")
    end = min(offset + limit, total)
    lines = content.split("\n", end)[offset:end]
    window = "\n".join(lines) + ("\n" if end < total or ends_with_newline else "")
    if "\r" in window:
        window = window.replace("\r\n", "\n")
    return ReadResult(file_data={"content": window, "encoding": "utf-8"}, total_lines=total,
                      start_line=offset + 1, end_line=end, next_offset=end if end < total else None)


def read_window(data: FileData | None, file_path: str, offset: int, limit: int) -> ReadResult:
    """A read of ``data`` (``None``: no such file): a text file's window, a binary file whole."""
    if data is None:
        return ReadResult(error=f"File '{file_path}' not found")
    if data.get("encoding") == "base64":
        return ReadResult(file_data=data)
    return slice_lines(data["content"], offset, limit)


def edit_positions(data: FileData | None, file_path: str, old_string: str, new_string: str,
                   replace_all: bool) -> list[int] | str:
    """Where an edit of ``data`` (``None``: no such file) replaces text, or why it cannot."""
    if data is None:
        return f"Error: File '{file_path}' not found"
    if data.get("encoding") == "base64":
        return "Error: Cannot edit binary files with text replacements."
    return plan_edit(data["content"], old_string, new_string, replace_all)


def plan_edit(content: str, old_string: str, new_string: str, replace_all: bool) -> list[int] | str:
    """Where ``old_string`` starts in ``content`` (each occurrence, left to right), or what is wrong."""
    if not old_string:
        return EMPTY_OLD_STRING
    first = content.find(old_string)
    if first < 0:
        stripped = old_string.removesuffix("\n")
        if stripped != old_string and stripped and content.endswith(stripped) and content.count(stripped) == 1:
            return ("Error: old_string ends with a newline, but the file does not end with a newline. Retry with "
                    "the trailing newline removed from old_string (and from new_string if it also ends with one).")
        return f"Error: String not found in file: '{old_string}'"
    positions = [first]
    at = content.find(old_string, first + len(old_string))
    while at >= 0:
        positions.append(at)
        at = content.find(old_string, at + len(old_string))
    if len(positions) > 1 and not replace_all:
        return (f"Error: String '{old_string}' appears {len(positions)} times in file. Use replace_all=True to "
                "replace all instances, or provide a more specific string with surrounding context.")
    return positions


def apply_edit(content: str, positions: list[int], cut: int, put: str) -> str:
    """``content`` with the ``cut`` characters at each position replaced by ``put``."""
    pieces: list[str] = []
    previous = 0
    for at in positions:
        pieces.append(content[previous:at])
        pieces.append(put)
        previous = at + cut
    pieces.append(content[previous:])
    return "".join(pieces)


def relative_to(file_path: str, root: str) -> str:
    """``file_path`` relative to the search root ``root`` (its name when it is the root itself)."""
    if root == "/":
        return file_path[1:]
    if file_path == root:
        return file_path.rsplit("/", 1)[-1]
    return file_path[len(root) + 1:]


def under(file_path: str, root: str) -> bool:
    """Whether ``file_path`` is ``root`` or inside it."""
    return root == "/" or file_path == root or file_path.startswith(root + "/")


def grep_lines(files: Iterable[tuple[str, str]], pattern: str, *, regex: bool = False,
               max_count: int | None = None) -> GrepResult:
    """The lines of ``files`` (path, text) that contain ``pattern``, at most ``max_count`` of them."""
    if regex:
        try:
            search: Callable[[str], Any] = re.compile(pattern).search
        except re.error as exc:
            return GrepResult(error=f"Invalid regex pattern {pattern!r}: {exc}")
    else:
        def search(line: str) -> bool:
            return pattern in line
    matches: list[GrepMatch] = []
    for path, text in files:
        if not regex and pattern not in text:
            continue  # most files don't match: one scan of the whole text instead of one per line
        for number, line in enumerate(text.split("\n"), 1):
            if search(line):
                if max_count is not None and len(matches) >= max_count:
                    return GrepResult(matches=matches, truncated=True)
                matches.append({"path": path, "line": number, "text": line})
    return GrepResult(matches=matches)


@functools.lru_cache(maxsize=256)
def compile_glob(pattern: str) -> Callable[[str], bool]:
    """A matcher of root-relative paths, by deepagents' rules.

    A pattern without ``/`` matches the file name at any depth; with ``/`` the
    relative path; a leading ``/`` anchors it at the search root. ``*``, ``?``,
    ``[abc]``, ``{a,b}`` and ``**`` (any directories) work as in a shell, and
    names starting with ``.`` match only a pattern segment that starts with ``.``.
    """
    if pattern.startswith("/"):
        compiled = re.compile(_translate(pattern.lstrip("/")))
        return lambda path: compiled.fullmatch(path) is not None
    compiled = re.compile(_translate(pattern))
    if "/" in pattern:
        return lambda path: compiled.fullmatch(path) is not None
    return lambda path: compiled.fullmatch(path.rsplit("/", 1)[-1]) is not None


def _translate(pattern: str) -> str:
    """A glob pattern as a regular expression."""
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        segment_start = i == 0 or pattern[i - 1] == "/"
        c = pattern[i]
        if pattern.startswith("**", i) and segment_start and (i + 2 == n or pattern[i + 2] == "/"):
            out.append("(?:[^/.][^/]*/)*" if i + 2 < n else "(?:[^/.][^/]*(?:/[^/.][^/]*)*)?")
            i += 3
            continue
        if c == "*":
            out.append("(?![.])[^/]*" if segment_start else "[^/]*")
        elif c == "?":
            out.append("(?![.])[^/]" if segment_start else "[^/]")
        elif c == "[":
            end = pattern.find("]", i + 2)
            if end < 0:
                out.append(re.escape(c))
            else:
                body = pattern[i + 1:end]
                body = "^" + body[1:] if body.startswith("!") else body
                out.append(f"[{body.replace(chr(92), chr(92) * 2)}]")
                i = end
        elif c == "{":
            end = _closing_brace(pattern, i)
            if end < 0:
                out.append(re.escape(c))
            else:
                options = _split_options(pattern[i + 1:end])
                out.append("(?:" + "|".join(_translate(o) for o in options) + ")")
                i = end
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


def _closing_brace(pattern: str, start: int) -> int:
    depth = 0
    for i in range(start, len(pattern)):
        if pattern[i] == "{":
            depth += 1
        elif pattern[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _split_options(body: str) -> list[str]:
    options: list[str] = []
    current: list[str] = []
    depth = 0
    for c in body:
        if c == "," and depth == 0:
            options.append("".join(current))
            current = []
            continue
        depth += (c == "{") - (c == "}")
        current.append(c)
    options.append("".join(current))
    return options
