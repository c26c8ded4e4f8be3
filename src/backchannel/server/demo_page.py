"""The seed 001 demo as a web page: a chat with the supervisor beside live cards of its background subagents.

``backchannel serve --demo`` and ``backchannel demo --web`` mount it at ``/``.
The page is plain HTML, CSS and a small script shipped in this package
(``server/web/``), with no build step. It talks to the server only through
the LangGraph API: it creates a thread, streams each run with
``POST /threads/{id}/runs/stream`` (read with ``fetch``), follows the runs
that notifications start with ``GET /threads/{id}/runs/{run_id}/stream``, and
reads a task's result from its thread's state.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from starlette.routing import Route

from backchannel.demo import DEFAULT_PROMPT
from backchannel.server._static import asset, static

__all__ = ["DemoPage"]

_ASSETS = {"/demo/demo.css": ("demo.css", "text/css; charset=utf-8"),
           "/demo/api.js": ("api.js", "text/javascript; charset=utf-8"),
           "/demo/demo.js": ("demo.js", "text/javascript; charset=utf-8")}


@dataclass(frozen=True, slots=True)
class DemoPage:
    """The page for the assistant ``assistant_id``; ``model`` is the configured model, ``None`` when offline.

    ``prompt`` is the question the page suggests (``""`` for none).
    """

    assistant_id: str = "supervisor"
    model: str | None = None
    prompt: str = DEFAULT_PROMPT

    @property
    def model_label(self) -> str:
        """What the page says about the model: the demo on its scripted model is labelled as such."""
        return f"model: {self.model}" if self.model else "offline scripted model"

    @property
    def paths(self) -> frozenset[str]:
        """The page's own paths: served without an API key (the page asks for one when the API wants it)."""
        return frozenset({"/", *_ASSETS})

    def routes(self) -> list[Route]:
        """The page at ``/`` and its stylesheet and script under ``/demo/``."""
        index = self._render_index().encode()
        routes = [Route("/", static(index, "text/html; charset=utf-8"), methods=["GET"])]
        for path, (name, media_type) in _ASSETS.items():
            routes.append(Route(path, static(asset(name).encode(), media_type), methods=["GET"]))
        return routes

    def _render_index(self) -> str:
        fields = {"assistant": self.assistant_id, "model_label": self.model_label,
                  "offline": "true" if self.model is None else "false", "prompt": self.prompt}
        page = asset("index.html")
        for key, value in fields.items():
            page = page.replace(f"{{{{{key}}}}}", html.escape(value, quote=True))
        return page
