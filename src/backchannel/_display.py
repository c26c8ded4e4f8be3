"""Showing runs in a terminal: messages, tool calls, notifications and a live panel of the plan and background tasks.

Everything here reads what a runtime's surface returns (stream parts and
message dicts), so it shows a local run and a server's run the same way.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from backchannel.messages import text_of

__all__ = ["STREAM_MODES", "StreamView", "TaskBoard", "message_renderables", "print_once", "show_logs", "show_stream",
           "to_ansi"]

# What the chat asks a run's stream for (subgraphs on, so background subagents show as they work).
STREAM_MODES = ["messages-tuple", "updates", "async_tasks", "lifecycle"]

ACTIVE = frozenset({"pending", "running"})
_STYLE = {"pending": "yellow", "running": "cyan", "success": "green", "error": "red", "timeout": "red",
          "cancelled": "dim", "waiting": "magenta"}
_ICON = {"pending": "◌", "success": "✓", "error": "✗", "timeout": "✗", "cancelled": "–", "waiting": "?"}
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
_LIFECYCLE = {"started": "running", "completed": "success", "failed": "error", "interrupted": "waiting",
              "cancelled": "cancelled"}
_NOTE_VERB = {"success": "finished", "error": "failed", "timeout": "timed out", "waiting": "needs input"}


# -- messages -----------------------------------------------------------------------------------


def message_renderables(message: Mapping[str, Any], agent: str) -> list[RenderableType]:
    """How one message (a LangGraph message dict) is shown: replies, tool calls, notifications, failures."""
    kind = message.get("type")
    text = text_of(message.get("content") or "")
    extra = message.get("additional_kwargs") or {}
    if kind == "ai":
        shown: list[RenderableType] = [said(agent, text, "bold blue")] if text.strip() else []
        shown += [Text(f"  → {c['name']}({_brief(c.get('args') or {})})", style="dim")
                  for c in message.get("tool_calls") or ()]
        return shown
    if kind == "human" and "task_notification" in extra:
        note = extra["task_notification"]
        detail = text.split("] ", 2)[-1].removeprefix("Completed. ").removeprefix("Result: ")
        status = note.get("status", "success")
        head = Text(f"📬 {note.get('subagent', 'task')} {_NOTE_VERB.get(status, status)}:",
                    style=f"bold {_STYLE.get(status, '')}")
        return [_row(head, Text(_shorten(detail, 240)))]
    if kind == "human" and "summary" in extra:
        return [Text(f"  ⋯ {extra['summary'].get('summarized_messages', 'earlier')} earlier messages summarised",
                     style="dim italic")]
    if kind == "human":
        return [said("you", text, "bold")]
    if kind == "tool" and message.get("status") == "error":
        return [Text(f"  ✗ {message.get('name') or 'tool'}: {_shorten(text, 200)}", style="red")]
    return []


def print_once(console: Console, message: Mapping[str, Any], agent: str, shown: set[str]) -> None:
    """Print a message unless its id is in ``shown`` (then add it): the live view and the catch-up
    after background runs share one ``shown``, so neither prints what the other did."""
    message_id = message.get("id")
    if message_id is not None:
        if message_id in shown:
            return
        shown.add(message_id)
    for renderable in message_renderables(message, agent):
        console.print(renderable)


def said(who: str, text: str, style: str) -> RenderableType:
    """``who › text``, the text as Markdown."""
    from rich.markdown import Markdown  # here: with markdown-it and pygments, 30 ms of a server's start

    return _row(Text(f"{who} ›", style=style), Markdown(text))


def _row(head: RenderableType, body: RenderableType) -> RenderableType:
    """``head`` then ``body``, whose wrapped lines stay indented under its first."""
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(head, body)
    return grid


def _brief(args: Mapping[str, Any]) -> str:
    if "subagent_type" in args and "description" in args:
        return _shorten(f"{args['subagent_type']}: {args['description']}", 80)
    return _shorten(", ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}" for k, v in args.items()), 80)


def _shorten(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the task panel ----------------------------------------------------------------------------


@dataclass(slots=True)
class TaskRow:
    """One background task (or a subagent working inside the current reply), as the panel shows it."""

    key: str
    subagent: str
    description: str
    status: str
    task_id: str | None = None
    run_id: str | None = None
    started: float = 0.0
    ended: float | None = None

    def elapsed(self, now: float) -> str:
        seconds = int((self.ended or now) - self.started)
        return f"{seconds // 60}:{seconds % 60:02d}"


class TaskBoard:
    """The current thread's background tasks, with live status and elapsed time."""

    def __init__(self) -> None:
        self.rows: dict[str, TaskRow] = {}
        self.todos: list[Mapping[str, Any]] = []  # the agent's plan (write_todos), shown while unfinished
        self.drained = False  # every task has reported back, and the agent has heard it

    def clear(self) -> None:
        self.rows.clear()
        self.todos = []
        self.drained = False

    def on_task(self, task: Mapping[str, Any]) -> None:
        """A task as ``async_tasks`` stream parts and the thread's ``async_tasks`` state describe it
        (or the ``drained`` part: the last pending task has been heard)."""
        self.drained = task.get("event") == "drained"
        if self.drained:
            return
        key = task.get("tool_call_id") or task["task_id"]
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = TaskRow(key, task.get("subagent", "task"), task.get("description", ""),
                                           task.get("status", "pending"), started=_epoch(task.get("created_at")))
        row.task_id = task.get("task_id") or row.task_id
        row.description = task.get("description") or row.description
        self._set(row, task.get("status", row.status), task.get("run_id"), task.get("updated_at"))

    def on_lifecycle(self, data: Mapping[str, Any]) -> None:
        """A subagent's lifecycle part (its cause names the tool call that started it)."""
        cause = data.get("cause") or {}
        key = cause.get("tool_call_id")
        status = _LIFECYCLE.get(data.get("event", ""))
        if not key or status is None:
            return
        row = self.rows.get(key)
        if row is None:
            row = self.rows[key] = TaskRow(key, data.get("graph_name", "subagent"), "", status, started=time.time())
        self._set(row, status, None, None)

    def load(self, tasks: Mapping[str, Mapping[str, Any]]) -> None:
        """The tasks in a thread's state (after a restart, a resume, a background run): all reported when
        none is pending, as the agent's state has heard them."""
        for task in tasks.values():
            self.on_task(task)
        self.drained = bool(tasks) and not any(t.get("status") in ACTIVE for t in tasks.values())

    async def refresh(self, runtime: Any) -> None:
        """Ask the runtime how each unfinished task is doing."""
        from backchannel.async_tasks import task_status

        for row in list(self.rows.values()):
            if row.status in ACTIVE and row.task_id and row.run_id:
                status = await task_status(runtime, {"task_id": row.task_id, "run_id": row.run_id})
                self._set(row, status, None, None)

    def active(self) -> list[TaskRow]:
        return [r for r in self.rows.values() if r.status in ACTIVE]

    def find(self, prefix: str) -> list[TaskRow]:
        """The tasks whose id starts with ``prefix``."""
        return [r for r in self.rows.values() if r.task_id and r.task_id.startswith(prefix)]

    def panel(self, now: float | None = None, *, recent: float = 60.0) -> RenderableType | None:
        """Unfinished tasks and those that ended in the last ``recent`` seconds (``None``: nothing to show)."""
        now = time.time() if now is None else now
        rows = [r for r in self.rows.values() if r.ended is None or now - r.ended < recent]
        parts: list[RenderableType] = []
        if any(t.get("status") != "completed" for t in self.todos):
            parts += [Text(" plan", style="bold blue"), _plan(self.todos)]
        if rows:
            title = " background tasks" + (" · all reported" if self.drained and not self.active() else "")
            parts += [Text(title, style="bold blue"), self._table(rows, now, ids=False)]
        return Group(*parts) if parts else None

    def table(self, now: float | None = None) -> RenderableType:
        """Every task of the thread, with its id (what ``/tasks`` prints)."""
        return self._table(list(self.rows.values()), time.time() if now is None else now, ids=True)

    def _table(self, rows: Iterable[TaskRow], now: float, *, ids: bool) -> Table:
        table = Table(box=None, show_header=False, padding=(0, 1))
        for row in sorted(rows, key=lambda r: (r.status not in ACTIVE, r.started)):
            style = _STYLE.get(row.status, "")
            icon = _SPINNER[int(now * 10) % len(_SPINNER)] if row.status == "running" else _ICON.get(row.status, "•")
            cells = [Text(icon, style=style), Text(row.subagent, style="bold"), Text(row.status, style=style),
                     Text(row.elapsed(now), style="dim"), Text(_shorten(row.description, 60), style="dim")]
            if ids:
                cells.insert(1, Text((row.task_id or "(in reply)")[:8], style="dim"))
            table.add_row(*cells)
        return table

    def _set(self, row: TaskRow, status: str, run_id: str | None, updated_at: str | None) -> None:
        new_run = run_id is not None and run_id != row.run_id
        if run_id is not None:
            row.run_id = run_id
        if not new_run and row.status not in ACTIVE and status in ACTIVE:
            return  # an older report (e.g. the state's) must not undo a newer ending
        if status in ACTIVE:
            row.ended = None
        elif row.ended is None or status != row.status:
            row.ended = _epoch(updated_at) if updated_at else time.time()
        row.status = status


_TODO_MARK = {"completed": ("✓", "dim"), "in_progress": ("▶", "bold yellow"), "pending": ("○", "")}


def _plan(todos: Iterable[Mapping[str, Any]]) -> Text:
    lines = Text()
    for i, todo in enumerate(todos):
        mark, style = _TODO_MARK.get(todo.get("status", ""), ("•", ""))
        lines.append(("\n" if i else "") + f" {mark} {_shorten(str(todo.get('content', '')), 70)}", style=style)
    return lines


def _epoch(iso: str | None) -> float:
    if not iso:
        return time.time()
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return time.time()


# -- one run's stream -------------------------------------------------------------------------


class StreamView:
    """Follows one run's stream parts: prints what completes, keeps what is in progress for a live display."""

    def __init__(self, console: Console, board: TaskBoard, agent: str, shown: set[str]) -> None:
        self.console = console
        self.board = board
        self.agent = agent
        self.shown = shown
        self.typing = ""
        self.run_id: str | None = None
        self.interrupts: list[dict[str, Any]] = []
        self.error: dict[str, Any] | None = None
        self.started = time.time()

    def on_part(self, part: Any) -> None:
        mode, _, namespace = part.event.partition("|")
        data = part.data
        if mode == "metadata":
            self.run_id = data.get("run_id")
        elif mode == "messages" and not namespace:
            chunk = data[0]
            if chunk.get("type") == "AIMessageChunk" and isinstance(chunk.get("content"), str):
                self.typing += chunk["content"]
        elif mode == "updates" and not namespace:
            self._on_updates(data)
        elif mode == "async_tasks":
            self.board.on_task(data)
        elif mode == "lifecycle" and namespace and "|" not in namespace:
            self.board.on_lifecycle(data)
        elif mode == "error":
            self.error = data

    def _on_updates(self, data: Mapping[str, Any]) -> None:
        for node, update in data.items():
            if node == "__interrupt__":
                self.interrupts.extend(update)
                continue
            if node == "model":
                self.typing = ""
            if isinstance(update, Mapping) and isinstance(update.get("todos"), list):
                self.board.todos = update["todos"]
            for message in (update or {}).get("messages") or () if isinstance(update, Mapping) else ():
                print_once(self.console, message, self.agent, self.shown)

    def __rich__(self) -> RenderableType:
        parts: list[RenderableType] = []
        panel = self.board.panel()
        if panel is not None:
            parts.append(panel)
        if self.typing.strip():
            tail = self.typing.strip().splitlines()[-6:]
            parts.append(Text.assemble((f"{self.agent} › ", "bold blue"), "\n".join(tail)))
        else:
            frame = _SPINNER[int(time.time() * 10) % len(_SPINNER)]
            parts.append(Text(f"{frame} working… {int(time.time() - self.started)}s  (Ctrl-C cancels)",
                              style="dim"))
        return Group(*parts)


async def show_stream(console: Console, parts: AsyncIterator[Any], view: StreamView) -> StreamView:
    """Feed ``parts`` to ``view`` under a live display of what is in progress."""
    from rich.live import Live

    with Live(view, console=console, refresh_per_second=10, transient=True):
        async for part in parts:
            view.on_part(part)
    return view


def to_ansi(renderable: RenderableType, width: int) -> str:
    """A renderable as text with ANSI colours (for prompt_toolkit's toolbar)."""
    console = Console(file=io.StringIO(), force_terminal=True, color_system="standard", width=width)
    console.print(renderable, end="")
    return console.file.getvalue()  # type: ignore[attr-defined]


# -- log lines ------------------------------------------------------------------------------------


class _ConsoleHandler(logging.Handler):
    """Log records printed through a rich console: above its live display, or above the chat's prompt (whose
    stdout prompt_toolkit patches), never into the middle of either as a write to stderr would."""

    _STYLES = {"DEBUG": "dim", "INFO": "dim", "WARNING": "yellow", "ERROR": "red", "CRITICAL": "bold red"}

    def __init__(self, console: Console) -> None:
        super().__init__()
        self.console = console
        self.setFormatter(logging.Formatter("%(levelname)-7s %(name)s  %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.print(Text(self.format(record), style=self._STYLES.get(record.levelname, "")),
                               soft_wrap=True)
        except Exception:
            self.handleError(record)


def show_logs(console: Console, *, verbose: bool = False) -> None:
    """Print backchannel's log lines and Python warnings through ``console``.

    Warnings always show; ``verbose`` adds the INFO lines (handoff ids, tokens
    used, retries), and ``BACKCHANNEL_LOG`` sets the level (``debug``, ``info``, ``warning``, ``error``).
    """
    named = os.environ.get("BACKCHANNEL_LOG", "").strip().upper()
    level = named if named in logging.getLevelNamesMapping() else "INFO" if verbose else "WARNING"
    handler = _ConsoleHandler(console)
    logging.captureWarnings(True)
    for name, at in (("backchannel", level), ("py.warnings", "WARNING")):
        logger = logging.getLogger(name)
        logger.handlers = [h for h in logger.handlers if not isinstance(h, _ConsoleHandler)]
        logger.addHandler(handler)
        logger.setLevel(at)
        logger.propagate = False  # not also to the root logger's stderr
