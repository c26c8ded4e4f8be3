"""The web pages' own files (``server/web/``), served as they ship in the package."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

__all__ = ["asset", "static"]


def asset(name: str) -> str:
    """The text of ``server/web/<name>``."""
    return (resources.files("backchannel.server") / "web" / name).read_text(encoding="utf-8")


def static(body: bytes, media_type: str) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint answering every GET with ``body``."""
    async def endpoint(request: Request) -> Response:
        return Response(body, media_type=media_type, headers={"cache-control": "no-cache"})

    return endpoint
