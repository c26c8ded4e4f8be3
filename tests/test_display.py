"""The chat's live panel: the agent's plan (write_todos) above the background tasks, while it is unfinished."""

import io
from types import SimpleNamespace

from rich.console import Console

from backchannel._display import StreamView, TaskBoard, to_ansi

PLAN = [{"content": "find sources", "status": "completed"}, {"content": "write the summary", "status": "in_progress"},
        {"content": "check facts", "status": "pending"}]


def rendered(view):
    return to_ansi(view, 100)


def test_a_plan_from_a_runs_updates_shows_in_the_panel_until_it_is_done():
    board = TaskBoard()
    view = StreamView(Console(file=io.StringIO()), board, "agent", set())
    view.on_part(SimpleNamespace(event="updates", data={"tools": {"todos": PLAN, "messages": []}}))
    text = rendered(view)
    assert " plan" in text and "✓ find sources" in text and "▶ write the summary" in text and "○ check facts" in text
    view.on_part(SimpleNamespace(event="async_tasks", data={"task_id": "t1", "subagent": "researcher",
                                                           "description": "dig", "status": "running"}))
    text = rendered(view)
    assert text.index("plan") < text.index("background tasks")
    done = [{**t, "status": "completed"} for t in PLAN]
    view.on_part(SimpleNamespace(event="updates", data={"tools": {"todos": done, "messages": []}}))
    assert " plan" not in rendered(view) and "researcher" in rendered(view)
    board.clear()
    assert board.panel() is None
