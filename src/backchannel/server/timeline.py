"""The timeline: ``GET /threads/{thread_id}/timeline`` (what the thread's runs did, as JSON) and the page that
draws it, ``/timeline?thread=<id>``.

The page is a waterfall of the thread's runs, model calls, tool calls and
subagents, with durations, tokens and errors; its background tasks on lanes
of their own, a dashed line from the tool call that started each, an arrow
from each task's run back to the notification its supervisor took in. Plain
HTML, CSS and script (``server/web/timeline.*``), reading only the API. The
page's own files need no API key; it asks for one when the API wants it.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backchannel.server._static import asset, static
from backchannel.server.routing import Endpoint, JSONResponse, Query, query_bool, runtime_of

__all__ = ["ENDPOINTS", "PAGE_PATHS", "page_routes"]

_FILES = {"/timeline": ("timeline.html", "text/html; charset=utf-8"),
          "/timeline/api.js": ("api.js", "text/javascript; charset=utf-8"),
          "/timeline/timeline.js": ("timeline.js", "text/javascript; charset=utf-8"),
          "/timeline/timeline.css": ("timeline.css", "text/css; charset=utf-8")}
PAGE_PATHS = frozenset(_FILES)


async def get_timeline(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).timeline(request.path_params["thread_id"],
                                                           spans=query_bool(request, "spans", True)))


ENDPOINTS = [
    Endpoint("GET", "/threads/{thread_id}/timeline", get_timeline,
             "What the thread's runs and its background tasks' runs did: their spans (runs, model calls, tool "
             "calls, subagents, notifications taken in) with times, statuses and errors, and their token usage",
             query={"spans": Query("boolean", "false: the runs and their usage only, without their spans")},
             responses={200: "The timeline", 404: "Thread not found"}),
]


def page_routes() -> list[Route]:
    """The page and its script and stylesheet."""
    return [Route(path, static(asset(name).encode(), media_type), methods=["GET"])
            for path, (name, media_type) in _FILES.items()]
