"""The file tools, and large tool results moved into files.

:class:`FilesystemMiddleware` gives the agent deepagents' file tools, with
their names, argument names and result text: ``ls``, ``read_file``,
``write_file``, ``edit_file``, ``delete``, ``glob``, ``grep``, and
``execute`` when the backend can run commands. They work on any backend
(:mod:`backchannel.workspace.protocol`); on the state backend a write is a
state update, checkpointed with the step.

A tool result longer than ``tool_token_limit_before_evict`` tokens (about 4
characters each) is written to ``/large_tool_results/<tool call id>`` and the
model gets the path and a preview of its head and tail instead.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from backchannel.messages import AIMessage, ToolMessage
from backchannel.middleware import Middleware, ToolCallRequest
from backchannel.tools import Tool, ToolError, ToolResult, ToolRuntime
from backchannel.workspace._runs import hook_runtime
from backchannel.workspace._text import create_file_data, validate_path
from backchannel.workspace.protocol import BackendProtocol, GrepMatch, ReadResult, supports_execution
from backchannel.workspace.state import FILES_KEY, FilesState, StateBackend

__all__ = ["FILE_TOOLS", "FilesystemMiddleware", "format_with_line_numbers"]

FILE_TOOLS = ("ls", "read_file", "write_file", "edit_file", "delete", "glob", "grep", "execute")
_MUTATING = frozenset({"write_file", "edit_file", "delete"})
_NOT_EVICTED = frozenset({"ls", "glob", "grep", "read_file", "edit_file", "write_file", "delete"})
CHARS_PER_TOKEN = 4
MAX_LINE_LENGTH = 5000
DEFAULT_READ_LIMIT = 100
EMPTY_CONTENT_WARNING = "System reminder: File exists but has empty contents"
TRUNCATION_GUIDANCE = "... [results truncated, try being more specific with your parameters]"
LARGE_RESULTS_DIR = "/large_tool_results"

_TOO_LARGE = (
    "Tool result too large, the result of this tool call {tool_call_id} was saved in the filesystem "
    "at this path: {file_path}\n"
    "\n"
    "You can read the result from the filesystem by using the read_file tool, but make sure to only "
    "read part of the result at a time.\n"
    "\n"
    "You can do this by specifying an offset and limit in the read_file tool call. For example, to "
    "read the first 100 lines, you can use the read_file tool with offset=0 and limit=100.\n"
    "\n"
    "Here is a preview showing the head and tail of the result (lines of the form `... [N lines "
    "truncated] ...` indicate omitted lines in the middle of the content):\n"
    "\n"
    "{content_sample}\n"
)


class FilesystemMiddleware(Middleware):
    """File tools on ``backend`` (the thread's state by default), and large results moved to files.

    ``tools`` limits which file tools the model gets (all by default;
    ``execute`` only when the backend can run commands). ``grep_max_count``
    caps grep's matches unless the model asks for more.
    """

    state_schema = FilesState

    def __init__(self, *, backend: BackendProtocol | None = None, system_prompt: str | None = None,
                 tool_token_limit_before_evict: int | None = 20_000,
                 grep_max_count: int | None = 1000, max_execute_timeout: int = 3600,
                 tools: Sequence[str] | None = None,
                 custom_tool_descriptions: Mapping[str, str] | None = None) -> None:
        self.backend: BackendProtocol = backend if backend is not None else StateBackend()
        self.evict_above = (tool_token_limit_before_evict * CHARS_PER_TOKEN
                            if tool_token_limit_before_evict else None)
        self.grep_max_count = grep_max_count
        self.max_execute_timeout = max_execute_timeout
        can_execute = supports_execution(self.backend)
        wanted = set(FILE_TOOLS if tools is None else tools)
        unknown = wanted - set(FILE_TOOLS)
        if unknown:
            raise ValueError(f"unknown file tool(s) {sorted(unknown)}; choose from {list(FILE_TOOLS)}")
        if not can_execute:
            wanted.discard("execute")
        descriptions = dict(custom_tool_descriptions or {})
        self.tools = [Tool(getattr(self, name), name=name, description=descriptions.get(name))
                      for name in FILE_TOOLS if name in wanted]
        # As in deepagents 0.7, the tools' descriptions are the guidance: no prompt text unless given.
        self.system_prompt = system_prompt

    def __repr__(self) -> str:
        return f"FilesystemMiddleware(backend={self.backend!r})"

    # -- tools -----------------------------------------------------------------

    async def ls(self, path: str, runtime: ToolRuntime) -> str:
        """Lists all files in a directory.

        Useful to explore the workspace and find the file to read or edit; use it before read_file or edit_file.

        Args:
            path: Absolute path to the directory to list. Must be absolute, not relative.
        """
        result = await self.backend.bind(runtime).ls(_checked(path))
        if result.error:
            raise ToolError(_bare(result.error))
        return _path_list([e["path"] for e in result.entries or ()])

    async def read_file(self, file_path: str, runtime: ToolRuntime, offset: int = 0,
                        limit: int = DEFAULT_READ_LIMIT) -> str:
        """Reads a file from the filesystem, with line numbers.

        By default it reads up to 100 lines from the start; use offset and limit to page through a large file
        rather than reading it whole. A header `@@ lines A-B of N @@` says which lines came back; the numbers
        at the start of each line are not part of the file, so leave them out of edit_file's old_string.
        A large tool result moved to a file is read here too. Read a file before editing it.

        Args:
            file_path: Absolute path to the file to read. Must be absolute, not relative.
            offset: Line number to start reading from (0-indexed). Use for pagination of large files.
            limit: Maximum number of lines to read. Use for pagination of large files.
        """
        path = _checked(file_path)
        result = await self.backend.bind(runtime).read(path, offset, limit)
        if result.error:
            raise ToolError(_bare(result.error))
        return self._render_read(path, result, offset)

    async def write_file(self, file_path: str, content: str, runtime: ToolRuntime) -> ToolResult | str:
        """Writes content to a file: creates it, or replaces all of its content.

        Prefer edit_file to change part of an existing file.

        Args:
            file_path: Absolute path where the file should be written. Must be absolute, not relative.
            content: The text content to write to the file. This parameter is required.
        """
        path = self._mutable(file_path, runtime)
        result = await self.backend.bind(runtime).write(path, content)
        if result.error:
            raise ToolError(_bare(result.error))
        return _with_files(f"Updated file {result.path}", result.files_update)

    async def edit_file(self, file_path: str, old_string: str, new_string: str, runtime: ToolRuntime,
                        replace_all: bool = False) -> ToolResult | str:
        """Performs exact string replacements in files.

        You must read the file before editing. Keep the file's exact indentation, and never include the
        line numbers read_file shows. The edit fails if old_string is not in the file, or is in it more
        than once without replace_all.

        Args:
            file_path: Absolute path to the file to edit. Must be absolute, not relative.
            old_string: The exact text to find and replace. Must be unique in the file unless replace_all is True.
            new_string: The text to replace old_string with. Must be different from old_string.
            replace_all: If True, replace all occurrences of old_string. If False (default), old_string must be unique.
        """
        path = self._mutable(file_path, runtime)
        if old_string == new_string:
            raise ToolError("old_string and new_string are the same: nothing to change")
        result = await self.backend.bind(runtime).edit(path, old_string, new_string, replace_all)
        if result.error:
            raise ToolError(_bare(result.error))
        return _with_files(f"Successfully replaced {result.occurrences} instance(s) of the string in "
                           f"'{result.path}'", result.files_update)

    async def delete(self, file_path: str, runtime: ToolRuntime) -> ToolResult | str:
        """Deletes a file or directory from the filesystem (a directory with everything inside it).

        This cannot be undone: only delete what is no longer needed.

        Args:
            file_path: Absolute path to the file to delete. Must be absolute, not relative.
        """
        path = self._mutable(file_path, runtime)
        result = await self.backend.bind(runtime).delete(path)
        if result.error:
            raise ToolError(_bare(result.error))
        return _with_files(f"Deleted {result.path}", result.files_update)

    async def glob(self, pattern: str, runtime: ToolRuntime, path: str | None = None) -> str:
        """Find files matching a glob pattern, returning absolute paths.

        `*` matches within one path segment, `**` any directories, `?` one character, `[abc]` one of a set
        and `{a,b}` alternatives. A pattern without `/` matches the file name at any depth (`*.py`); one
        with `/` matches the path under the search root (`src/**/*.py`); a leading `/` anchors at the root.

        Args:
            pattern: Glob pattern to match files (e.g., '*.py', '**/*.py', '/subdir/**/*.md').
            path: Base directory to search from. Defaults to the backend's default root.
        """
        result = await self.backend.bind(runtime).glob(pattern, _checked(path) if path else None)
        if result.error:
            raise ToolError(_bare(result.error))
        return _path_list([m["path"] for m in result.matches or ()], empty="No files found")

    async def grep(self, pattern: str, runtime: ToolRuntime, path: str | None = None, glob: str | None = None,
                   output_mode: Literal["files_with_matches", "content", "count"] = "files_with_matches",
                   max_count: int | None = None, regex: bool = False) -> str:
        """Search for a text pattern across files.

        The pattern is literal text unless regex is true (then a Python regular expression). Returns the
        matching files, the matching lines, or match counts, as output_mode says.

        Args:
            pattern: Text pattern to search for (literal string, unless regex is true).
            path: Directory to search in. Defaults to the workspace root.
            glob: Glob pattern (not regex) limiting which files are searched (e.g. '*.py').
            output_mode: 'files_with_matches' (default): matching file paths, one per line. 'content':
                matching lines grouped by file under a '<path>:' header, each as '<line_number>: <line text>'.
                'count': one '<path>: <match_count>' line per file.
            max_count: Optional cap on the total number of matches returned across all files.
            regex: Treat the pattern as a regular expression instead of literal text.
        """
        if max_count is not None and max_count <= 0:
            raise ToolError(f"max_count must be positive, got {max_count}")
        cap = max_count if max_count is not None else self.grep_max_count
        result = await self.backend.bind(runtime).grep(pattern, _checked(path) if path else None, glob,
                                                       max_count=cap, regex=regex)
        if result.error and not result.matches:
            raise ToolError(_bare(result.error))
        text = _truncated(format_grep(result.matches or [], output_mode))
        if result.truncated:
            text += ("\n\nNote: the search stopped at the maximum match count. The matches above are valid but "
                     "incomplete. Narrow the search, or raise max_count, to see the rest.")
        return text

    async def execute(self, command: str, runtime: ToolRuntime, timeout: int | None = None) -> str:
        """Runs a shell command in the workspace's root and returns its combined output and exit code.

        Chain commands with `&&`; prefer the file tools to cat, grep or find.

        Args:
            command: Shell command to execute in the sandbox environment.
            timeout: Optional timeout in seconds for this command. Overrides the default timeout.
        """
        if timeout is not None and not 0 < timeout <= self.max_execute_timeout:
            raise ToolError(f"timeout must be between 1 and {self.max_execute_timeout} seconds, got {timeout}")
        backend: Any = self.backend.bind(runtime)
        response = await backend.execute(command, timeout=timeout)
        parts = [response.output]
        if response.exit_code is not None:
            status = "succeeded" if response.exit_code == 0 else "failed"
            parts.append(f"\n[Command {status} with exit code {response.exit_code}]")
        if response.truncated:
            parts.append("\n[Output was truncated due to size limits]")
        return "".join(parts)

    # -- hooks -------------------------------------------------------------------

    async def before_agent(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """Files given as bare text in the input become file data (content, encoding, timestamps)."""
        files = state.get(FILES_KEY)
        if not files:
            return None
        given = {path: create_file_data(value) for path, value in files.items() if isinstance(value, str)}
        return {FILES_KEY: given} if given else None

    # -- large results -------------------------------------------------------------

    async def after_tool_call(self, request: ToolCallRequest,
                              result: ToolMessage | ToolResult) -> ToolMessage | ToolResult:
        """A result too large for the context goes to a file; the model gets its path and a preview."""
        limit = self.evict_above
        if limit is None:
            return result
        content = result.content
        if not isinstance(content, str) or len(content) <= limit or request.call["name"] in _NOT_EVICTED:
            return result
        if isinstance(result, ToolMessage) and result.status == "error":
            return result
        call_id = request.call["id"]
        path = f"{LARGE_RESULTS_DIR}/{re.sub(r'[^A-Za-z0-9_-]', '_', call_id)[:128]}"
        written = await self.backend.bind(hook_runtime(request.state, request.ctx, call_id)).write(path, content)
        if written.error:
            return result  # the full result is better than none
        pointer = _TOO_LARGE.format(tool_call_id=call_id, file_path=written.path or path,
                                    content_sample=preview(content))
        update = dict(result.update or {}) if isinstance(result, ToolResult) else {}
        if written.files_update:
            update[FILES_KEY] = {**update.get(FILES_KEY, {}), **written.files_update}
        if isinstance(result, ToolResult):
            return ToolResult(pointer, update=update or None, return_direct=result.return_direct)
        return ToolResult(pointer, update=update or None, artifact=result.artifact)

    # -- helpers -------------------------------------------------------------------

    def _mutable(self, file_path: str, runtime: ToolRuntime) -> str:
        """The path to change, unless an earlier call of the same reply changes it, or a directory
        holding it or a file in it: they would run at the same time and race."""
        path = _checked(file_path)
        messages = runtime.state.get("messages") or ()
        reply = next((m for m in reversed(messages) if isinstance(m, AIMessage)), None)
        for call in reply.tool_calls if reply is not None else ():
            if call["id"] == runtime.tool_call_id:
                break
            other = call["args"].get("file_path") if isinstance(call.get("args"), dict) else None
            if call["name"] in _MUTATING and isinstance(other, str) and _overlapping(other, path):
                raise ToolError("parallel file mutations to the same path are not allowed.")
        return path

    def _render_read(self, path: str, result: ReadResult, offset: int) -> str:
        data = result.file_data or {"content": "", "encoding": "utf-8"}
        if data.get("encoding") == "base64":
            return (f"{path} is a binary file ({len(data['content']) * 3 // 4} bytes); it cannot be shown as "
                    "text.")
        content = data["content"]
        if result.start_line is None or result.end_line is None:
            return EMPTY_CONTENT_WARNING if not content.strip() else content
        rows = content.split("\n")
        if rows and rows[-1] == "":
            rows.pop()
        budget = self.evict_above
        numbered = format_with_line_numbers(rows, result.start_line)
        end, next_offset, notice = result.end_line, result.next_offset, ""
        fields = [f"lines {result.start_line}-{end}" + (f" of {result.total_lines}" if result.total_lines else "")]
        if budget is not None and len(numbered) > budget:
            # Cut at the last whole line that fits; say where the next read starts.
            cut = numbered[:budget]
            numbered = cut.rsplit("\n", 1)[0] if "\n" in cut else cut
            end = result.start_line + numbered.count("\n")
            next_offset = end if end < (result.total_lines or end) else None
            fields = [f"lines {result.start_line}-{end} of {result.total_lines}"]
            notice = ("[Output was truncated due to size limits. Read fewer lines at a time, with offset and "
                      "limit.]\n")
        if next_offset is not None:
            fields.append(f"next offset {next_offset}")
        if notice:
            fields.append("truncated due to size")
        return f"{notice}@@ {' | '.join(fields)} @@\n{numbered}"


def format_with_line_numbers(lines: Sequence[str], start_line: int = 1) -> str:
    """Lines numbered from ``start_line``: right-aligned numbers, two spaces, the line; a line
    longer than 5,000 characters continues on rows numbered ``N.1``, ``N.2``..."""
    if max(map(len, lines), default=0) <= MAX_LINE_LENGTH:
        width = len(str(start_line + len(lines) - 1))
        return "\n".join([str(number).rjust(width) + "  " + line for number, line in enumerate(lines, start_line)])
    rows: list[tuple[str, str]] = []
    for number, line in enumerate(lines, start_line):
        for part, start in enumerate(range(0, max(len(line), 1), MAX_LINE_LENGTH)):
            rows.append((str(number) if part == 0 else f"{number}.{part}", line[start:start + MAX_LINE_LENGTH]))
    width = max(len(marker) for marker, _ in rows)
    return "\n".join(f"{marker:>{width}}  {text}" for marker, text in rows)


def format_grep(matches: Sequence[GrepMatch], output_mode: str) -> str:
    """Matches as grep's ``output_mode`` shows them."""
    if not matches:
        return "No matches found"
    by_file: dict[str, list[GrepMatch]] = {}
    for m in matches:
        by_file.setdefault(m["path"], []).append(m)
    if output_mode == "files_with_matches":
        return "\n".join(sorted(by_file))
    if output_mode == "count":
        return "\n".join(f"{path}: {len(found)}" for path, found in sorted(by_file.items()))
    lines = []
    for path, found in sorted(by_file.items()):
        lines.append(f"{path}:")
        lines.extend(f"  {m['line']}: {m['text']}" for m in found)
    return "\n".join(lines)


def preview(content: str, head: int = 5, tail: int = 5) -> str:
    """The head and tail of ``content``, line-numbered, with the lines between left out."""
    lines = [line[:1000] for line in content.splitlines()]
    if len(lines) <= head + tail:
        return format_with_line_numbers(lines)
    top = format_with_line_numbers(lines[:head])
    bottom = format_with_line_numbers(lines[-tail:], len(lines) - tail + 1)
    return f"{top}\n... [{len(lines) - head - tail} lines truncated] ...\n{bottom}"


def _checked(path: str) -> str:
    try:
        return validate_path(path)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def _overlapping(a: str, b: str) -> bool:
    """Whether path ``a`` is ``b``, or one holds the other (a directory and a file in it)."""
    try:
        a = validate_path(a)
    except ValueError:
        return False
    return a == b or b.startswith(a.rstrip("/") + "/") or a.startswith(b.rstrip("/") + "/")


def _bare(error: str) -> str:
    """An error without its ``Error:`` prefix: the agent adds one to every error result."""
    return error.removeprefix("Error: ")


def _with_files(content: str, files_update: Mapping[str, Any] | None) -> ToolResult | str:
    return ToolResult(content, update={FILES_KEY: dict(files_update)}) if files_update else content


def _path_list(paths: list[str], *, empty: str | None = None) -> str:
    if not paths and empty is not None:
        return empty
    budget = 20_000 * CHARS_PER_TOKEN
    used = 0
    for kept, item in enumerate(paths):
        used += len(repr(item)) + 2
        if used > budget:
            return str([*paths[:kept], TRUNCATION_GUIDANCE])
    return str(paths)


def _truncated(text: str) -> str:
    limit = 20_000 * CHARS_PER_TOKEN
    return text if len(text) <= limit else text[:limit - len(TRUNCATION_GUIDANCE) - 1] + "\n" + TRUNCATION_GUIDANCE

