"""Endpoints: a route with what ``/openapi.json`` says about it, and the request helpers handlers share.

Each module of the server declares its endpoints as :class:`Endpoint`
values; :func:`routes` turns them into Starlette routes, and
:mod:`backchannel.server.openapi` documents them from the same values, so
the document cannot drift from what is served.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from backchannel.serde import json_bytes, loads_exact

__all__ = ["MAX_INT", "MAX_JSON_DEPTH", "Endpoint", "JSONResponse", "Query", "dump", "query_bool", "query_int",
           "read_body", "render_json", "routes", "runtime_of"]

Handler = Callable[[Request], Awaitable[ASGIApp]]  # a Response, or an ASGI app that streams
MAX_JSON_DEPTH = 100  # deeper bodies are refused: state this deep could not be stored and read back
MAX_INT = 2**31 - 1  # the largest limit or offset a request may give (storage keeps them in 32 bits)
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Query:
    """A query parameter, as the OpenAPI document describes it."""

    type: str = "string"  # "string", "integer" or "boolean"
    description: str = ""
    required: bool = False


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One method on one path: its handler, its request body and query parameters, what it returns."""

    method: str
    path: str
    handler: Handler
    summary: str
    body: type[BaseModel] | None = None
    query: Mapping[str, Query] = field(default_factory=dict)
    responses: Mapping[int, str] = field(default_factory=lambda: {200: "Success"})
    media_type: str = "application/json"  # of the success response; "text/event-stream" for streams


def routes(endpoints: Sequence[Endpoint]) -> list[Route]:
    """Starlette routes for ``endpoints``, one per method and path."""
    return [Route(e.path, e.handler, methods=[e.method]) for e in endpoints]


def render_json(content: Any) -> bytes:
    """JSON bytes (state values are plain JSON by the time they get here), integers past 64 bits exact."""
    return json_bytes(content)


class JSONResponse(Response):
    """A JSON response rendered with :func:`render_json`."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return render_json(content)


def runtime_of(request: Request) -> Any:
    """The :class:`~backchannel.runtime.LocalRuntime` this server serves."""
    return request.app.state.runtime


async def read_body(request: Request, model: type[M]) -> M:
    """The request's JSON body validated as ``model``: 413 when too large, 422 naming what is wrong."""
    limit: int = request.app.state.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HTTPException(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks, size = [], 0
    try:
        async with asyncio.timeout(request.app.state.client_timeout):  # a body trickled in holds the request
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HTTPException(413, f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        late = f"the request body took more than {request.app.state.client_timeout} s to come"
        raise HTTPException(408, late) from None
    raw = b"".join(chunks)
    try:
        data = loads_exact(raw) if raw.strip() else {}
    except ValueError as exc:  # json.JSONDecodeError, or an integer of more digits than Python converts
        raise HTTPException(422, f"Invalid JSON in request body: {exc}") from None
    except RecursionError:
        raise HTTPException(422, "request body is nested too deep") from None
    if _too_deep(data, MAX_JSON_DEPTH):
        raise HTTPException(422, f"request body is nested more than {MAX_JSON_DEPTH} levels deep")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise HTTPException(422, describe_validation_error(exc)) from None


def _too_deep(data: Any, limit: int) -> bool:
    """Whether ``data`` nests objects and lists more than ``limit`` levels deep (without recursing)."""
    level: list[Any] = [data]
    for _ in range(limit + 1):
        level = [child for value in level for child in _children(value)]
        if not level:
            return False
    return True


def _children(value: Any) -> Any:
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, dict | list)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, dict | list)]
    return ()


def describe_validation_error(exc: ValidationError) -> str:
    """Each problem of a body on one line: ``field.path: what is wrong``."""
    lines = []
    for error in exc.errors(include_url=False):
        if not error["loc"]:
            lines.append("the request body must be a JSON object")
            continue
        lines.append(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}")
    return "; ".join(lines)


def query_int(request: Request, name: str, default: int, *, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An integer query parameter (422 when it is not one, or outside ``minimum``..``maximum``)."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > 20 or not raw.lstrip("-").isdigit():
        raise HTTPException(422, f"query parameter {name!r} must be an integer, got {raw[:40]!r}")
    value = int(raw)
    if not minimum <= value <= maximum:
        raise HTTPException(422, f"query parameter {name!r} must be from {minimum} to {maximum}, got {value}")
    return value


def query_bool(request: Request, name: str, default: bool = False) -> bool:
    """A boolean query parameter: true/1/yes or false/0/no."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise HTTPException(422, f"query parameter {name!r} must be true or false, got {raw!r}")


def dump(model: BaseModel, *, exclude: Sequence[str] = ()) -> dict[str, Any]:
    """The fields a client actually sent (so the runtime's own defaults apply to the rest)."""
    return model.model_dump(exclude_unset=True, exclude=set(exclude))
