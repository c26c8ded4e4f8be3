"""The server's router answers every request as Starlette's own router does, trying fewer routes."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable

import httpx
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route, WebSocketRoute

from backchannel.runtime import LocalRuntime
from backchannel.server import create_app
from backchannel.server._router import ShapeRouter

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def _served_routes() -> list[BaseRoute]:
    """Routes of the server's paths and methods (and odd ones besides), each answering with its own number."""
    app = create_app(LocalRuntime("memory", {}))
    shapes: list[tuple[str, list[str] | None, str]] = [
        (route.path, sorted(getattr(route, "methods", None) or ()), type(route).__name__)  # type: ignore[attr-defined]
        for route in app.routes]
    shapes += [("/{first}/runs/wait", ["PUT"], "Route"), ("/files/{rest:path}", ["GET"], "Route"),
               ("/threads/{n:int}/runs/{run_id}/stream", ["POST"], "Route"), ("/mounted", None, "Mount"),
               ("/{name}.json", ["GET"], "Route")]
    routes: list[BaseRoute] = []
    for number, (path, methods, kind) in enumerate(shapes):
        async def answer(request: Request, number: int = number) -> Response:
            return PlainTextResponse(f"{number} {sorted(request.path_params.items())}")
        if kind == "WebSocketRoute":
            routes.append(WebSocketRoute(path, answer))
        elif kind == "Mount":
            routes.append(Mount(path, routes=[Route("/{rest:path}", answer)]))
        else:
            routes.append(Route(path, answer, methods=methods))
    return routes


def _paths(routes: list[BaseRoute]) -> list[str]:
    """Each route's path with its parameters filled in, and near misses: another or a route's own literal
    in a parameter's place, a segment more or less, a trailing slash, paths no route has."""
    paths = {"/", "", "/nowhere", "/threads/", "/a/b/c/d/e/f/g/h/i", "/mounted/x/y", "/files/a/b", "/7.json",
             "/threads/7/runs/8/stream", "/threads/x/state/checkpoint", "/runs/crons/search/"}
    for route in routes:
        template = getattr(route, "path", "")
        for value in ("abc", "search", "runs", "42"):
            path = template
            for name in getattr(route, "param_convertors", {}):
                path = path.replace("{" + name + "}", value).replace("{" + name + ":int}", "42")
                path = path.replace("{" + name + ":path}", value + "/z")
            paths |= {path, path + "/", path + "/more", path.rpartition("/")[0]}
    return sorted(paths)


async def test_every_method_and_path_gets_starlettes_answer():
    routes = _served_routes()
    plain, shaped = Starlette(routes=routes), Starlette(routes=routes)
    shaped.router = ShapeRouter(routes)
    answers: dict[str, list[tuple[str, str, int, str, str | None, str | None]]] = {"plain": [], "shaped": []}
    for name, app in (("plain", plain), ("shaped", shaped)):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            for method, path in itertools.product(METHODS, _paths(routes)):
                response = await http.request(method, "http://test" + path)
                answers[name].append((method, path, response.status_code, response.text,
                                      response.headers.get("allow"), response.headers.get("location")))
    assert answers["shaped"] == answers["plain"]
    assert len({text for _, _, status, text, _, _ in answers["shaped"] if status == 200}) > 50  # most routes were hit


async def test_routes_added_after_the_first_request_are_served():
    app = create_app(LocalRuntime("memory", {}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        assert (await http.get("/threads/x/extra")).status_code == 404
        app.add_route("/threads/{thread_id}/extra", lambda request: PlainTextResponse("extra"))
        assert (await http.get("/threads/x/extra")).text == "extra"
        app.router.routes.insert(0, Route("/ok", lambda request: PlainTextResponse("mine")))
        assert (await http.get("/ok")).text == "mine"


async def test_a_route_replaced_by_an_equal_one_is_the_one_served():
    async def first(request: Request) -> Response:
        return PlainTextResponse("first")
    app = Starlette(routes=[Route("/threads/{thread_id}", first)])
    app.router = ShapeRouter(app.routes)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        assert (await http.get("/threads/x")).text == "first"
        app.router.routes[0] = Route("/threads/{thread_id}", first, middleware=[Middleware(_Replaced)])
        assert (await http.get("/threads/x")).text == "replaced"


class _Replaced:
    def __init__(self, app: object) -> None:
        pass

    async def __call__(self, scope: dict, receive: object, send: Callable[[dict], Awaitable[None]]) -> None:
        await PlainTextResponse("replaced")(scope, receive, send)  # type: ignore[arg-type]
