"""How errors become HTTP responses: ``{"detail": "what is wrong"}`` with the status that says why.

The runtime's own errors map to their status (404, 409, 422, ...); anything
unexpected is a 500 whose body says only that, the traceback going to the
server's log, never to the client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from backchannel.errors import (
    AuthenticationError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RemoteError,
    StorageUnavailableError,
)
from backchannel.server.routing import JSONResponse

__all__ = ["EXCEPTION_HANDLERS"]

logger = logging.getLogger("backchannel.server")

_STATUS: dict[type[Exception], int] = {NotFoundError: 404, ConflictError: 409, InvalidRequestError: 422,
                                       AuthenticationError: 401, RemoteError: 502, StorageUnavailableError: 503}


def detail(status: int, message: str) -> Response:
    """An error response."""
    return JSONResponse({"detail": message}, status_code=status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return detail(exc.status_code, str(exc.detail))


def _known_error(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The handler of one kind of runtime error (Starlette picks it by the exception's class)."""
    async def handler(request: Request, exc: Exception) -> Response:
        return detail(status, str(exc))

    return handler


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("%s %s failed", request.method, request.url.path, exc_info=exc)
    return detail(500, f"internal server error ({type(exc).__name__}); see the server log")


Handler = Callable[[Request, Exception], Awaitable[Response]]
EXCEPTION_HANDLERS: dict[type[Exception], Handler] = {
    HTTPException: _http_error, **{kind: _known_error(code) for kind, code in _STATUS.items()}, Exception: _unexpected}
