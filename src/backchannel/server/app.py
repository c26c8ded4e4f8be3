"""The ASGI app: the LangGraph API over a :class:`~backchannel.runtime.LocalRuntime`.

``create_app(runtime)`` serves the runtime's ``assistants``, ``threads``,
``runs``, ``crons`` and ``store`` at the paths ``langgraph_sdk`` calls, plus ``/ok``,
``/info``, ``/openapi.json``, ``/docs`` (the same document as a page) and
``/metrics`` (Prometheus). The app opens the runtime when it starts
and, when it stops, gives running runs ``grace`` seconds to finish; the rest
resume when a runtime next opens the same database. It serves a thread's
timeline page at ``/timeline`` (:mod:`backchannel.server.timeline`), and with a
``demo_page`` the seed 001 demo page at ``/`` (:mod:`backchannel.server.demo_page`).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from backchannel.server import assistants, crons, runs, store, thread_events, threads, timeline
from backchannel.server._router import ShapeRouter
from backchannel.server.auth import APIKeyMiddleware
from backchannel.server.browsers import BrowserGuard, BrowserPolicy, default_policy
from backchannel.server.connections import DEFAULT_CLIENT_TIMEOUT
from backchannel.server.docs import docs
from backchannel.server.errors import EXCEPTION_HANDLERS
from backchannel.server.metrics import CONTENT_TYPE, metrics
from backchannel.server.openapi import openapi_document
from backchannel.server.routing import Endpoint, JSONResponse, routes
from backchannel.server.sse import BODY_SEND, OpenStreams

if TYPE_CHECKING:
    from backchannel.server.demo_page import DemoPage

__all__ = ["DEFAULT_MAX_BODY_BYTES", "create_app"]

DEFAULT_MAX_BODY_BYTES = 10 * 1024 * 1024


async def ok(request: Request) -> Response:
    return JSONResponse({"ok": True})


async def info(request: Request) -> Response:
    from backchannel import __version__

    return JSONResponse({"version": __version__, "host": {"kind": "backchannel"},
                         "flags": {"assistants": True, "crons": True, "langsmith": False}})


async def openapi(request: Request) -> Response:
    return JSONResponse(request.app.state.openapi())


META = [
    Endpoint("GET", "/ok", ok, "Health check (needs no API key)"),
    Endpoint("GET", "/info", info, "Server version and features"),
    Endpoint("GET", "/openapi.json", openapi, "This document"),
    Endpoint("GET", "/docs", docs, "This document as a web page", media_type="text/html"),
    Endpoint("GET", "/metrics", metrics, "Runs, the queue, run latency, open streams and notifications, for Prometheus",
             media_type=CONTENT_TYPE),
]
ENDPOINTS: Sequence[Endpoint] = [*META, *assistants.ENDPOINTS, *threads.ENDPOINTS, *thread_events.ENDPOINTS,
                                 *runs.ENDPOINTS, *crons.ENDPOINTS, *store.ENDPOINTS, *timeline.ENDPOINTS]


class _App(Starlette):
    """Starlette, leaving the send it is called with in the scope for long responses' bodies
    (:data:`~backchannel.server.sse.BODY_SEND`) while its middleware is what :func:`create_app` put in:
    each of those acts on a response's start (CORS headers, errors before it) and would only pass the
    body's messages on (~1 µs a streamed token). Once more middleware is added (gzip, a body logger...),
    every body goes through all of it, as in any Starlette app."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.router = ShapeRouter(self.router.routes, lifespan=self.router.lifespan_context)
        self._own_middleware = list(self.user_middleware)
        self._bodies_past_middleware = True

    def build_middleware_stack(self) -> ASGIApp:
        self._bodies_past_middleware = self.user_middleware == self._own_middleware
        return super().build_middleware_stack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        if self._bodies_past_middleware:
            scope[BODY_SEND] = send
        await super().__call__(scope, receive, send)


def create_app(runtime: Any, *, api_key: str | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               heartbeat: float = 5.0, grace: float = 10.0, demo_page: DemoPage | None = None,
               browsers: BrowserPolicy | None = None, client_timeout: float = DEFAULT_CLIENT_TIMEOUT) -> Starlette:
    """The server app for ``runtime``; with ``api_key``, requests need it in the ``x-api-key`` header.

    A request body must arrive within ``client_timeout`` seconds; a stream whose reader leaves the
    server's writes unread for half that ends with an ``error`` event saying so, and is disconnected
    if it still reads nothing (:mod:`backchannel.server.connections`).

    ``browsers`` says which web pages may call it (CORS) and under which host names
    (default: :func:`~backchannel.server.browsers.default_policy`). ``demo_page`` adds the
    demo's web page at ``/`` (its own files need no key).
    """
    from backchannel import __version__

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runtime.open()
        try:
            yield
        finally:
            await runtime.close(grace=grace)

    page_routes = [*timeline.page_routes(), *(demo_page.routes() if demo_page is not None else [])]
    open_paths = timeline.PAGE_PATHS | (demo_page.paths if demo_page is not None else frozenset())
    middleware = [Middleware(BrowserGuard, policy=browsers or default_policy(api_key=api_key))]
    if api_key:
        middleware.append(Middleware(APIKeyMiddleware, api_key=api_key, open_paths=open_paths))
    app = _App(routes=[*routes(ENDPOINTS), *thread_events.websocket_routes(), *page_routes],
                    middleware=middleware,
                    exception_handlers=EXCEPTION_HANDLERS, lifespan=lifespan)
    app.state.runtime = runtime
    app.state.max_body_bytes = max_body_bytes
    app.state.heartbeat = heartbeat
    app.state.client_timeout = client_timeout
    app.state.open_streams = OpenStreams()
    # Built at its first request, as FastAPI does: every body's JSON schema costs the server's start more
    # than the rest of its set-up.
    app.state.openapi = functools.cache(functools.partial(openapi_document, ENDPOINTS, version=__version__))
    return app
