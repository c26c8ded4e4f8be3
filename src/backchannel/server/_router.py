"""A Starlette router that tries, for an HTTP request, only the routes its path's shape allows.

Starlette's router matches a request against every route in turn (a run's stream
or wait is the 38th of 66): a regular expression and a dict per route, ~1 µs each.
A route whose parameters are plain segments (``{thread_id}``, ``{n:int}``...) can only
match a path with as many segments and the same literal segments, so the router
keeps, for each number of segments, first and last segment a route names, the
routes that could match such a path, in their order. Trying those in that order gives the
answer the full scan gives (the same full match, or the same first partial one: 405),
and a request none of them match goes through Starlette's own scan (404, the
trailing-slash redirect), as does anything that is not HTTP.
"""

from __future__ import annotations

from typing import Any

from starlette._utils import get_route_path
from starlette.convertors import FloatConvertor, IntegerConvertor, StringConvertor, UUIDConvertor
from starlette.routing import BaseRoute, Match, Route, Router
from starlette.types import Receive, Scope, Send

__all__ = ["ShapeRouter"]

# Convertors whose values never hold a "/" (PathConvertor's do; a registered one may).
_SEGMENT_CONVERTORS = (StringConvertor, IntegerConvertor, FloatConvertor, UUIDConvertor)
_ANY = None  # a segment a parameter fills (or, in a path, one no route names)
_Shape = tuple[int, str | None, str | None]  # segments, first and last literal segments


class ShapeRouter(Router):
    """Starlette's :class:`~starlette.routing.Router`, matching an HTTP request only against the routes
    its path's shape allows (in their order); the rest as Starlette does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._indexed: list[BaseRoute] = []
        self._shapes: list[_Shape | None] = []
        self._firsts: frozenset[str] = frozenset()
        self._lasts: frozenset[str] = frozenset()
        self._longest = 0
        self._candidates: dict[_Shape, list[int]] = {}

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await super().app(scope, receive, send)
            return
        if "router" not in scope:
            scope["router"] = self
        partial = partial_scope = None
        routes = self.routes
        for position in self._positions_for(get_route_path(scope)):
            route = routes[position]
            match, child_scope = route.matches(scope)
            if match is Match.FULL:
                scope["route"] = route
                scope.update(child_scope)
                await route.handle(scope, receive, send)
                return
            if match is Match.PARTIAL and partial is None:
                partial, partial_scope = route, child_scope
        if partial is not None and partial_scope is not None:  # another method on this path: 405
            scope["route"] = partial
            scope.update(partial_scope)
            await partial.handle(scope, receive, send)
            return
        await super().app(scope, receive, send)  # no route matches: Starlette's 404 or trailing-slash redirect

    def _positions_for(self, path: str) -> list[int]:
        """Where in ``routes`` the routes a path of this shape could match are (positions, not the routes:
        a route replaced by an equal one, which the check below cannot tell, is still the one tried)."""
        if self.routes != self._indexed:  # routes added, removed or replaced since (equality per route)
            self._index()
        segments = path.split("/")
        count = len(segments)
        if count > self._longest:
            count = 0  # longer than any plain route: only the others can match
        first = segments[1] if count > 1 and segments[1] in self._firsts else _ANY
        last = segments[-1] if count > 1 and segments[-1] in self._lasts else _ANY
        shape = (count, first, last)
        positions = self._candidates.get(shape)
        if positions is None:  # at most one list per shape the routes can tell apart
            positions = self._candidates[shape] = [i for i, own in enumerate(self._shapes) if _fits(own, shape)]
        return positions

    def _index(self) -> None:
        self._indexed = list(self.routes)
        self._shapes = [_shape(route) for route in self._indexed]
        shapes = [own for own in self._shapes if own is not None]
        self._firsts = frozenset(first for _, first, _ in shapes if first is not _ANY)
        self._lasts = frozenset(last for _, _, last in shapes if last is not _ANY)
        self._longest = max((count for count, _, _ in shapes), default=0)
        self._candidates = {}


def _fits(own: _Shape | None, shape: _Shape) -> bool:
    """Whether a route of shape ``own`` (None: unknown) could match a path of ``shape``."""
    if own is None:
        return True
    count, first, last = own
    return (count == shape[0] and (first is _ANY or first == shape[1])
            and (last is _ANY or last == shape[2]))


def _shape(route: BaseRoute) -> _Shape | None:
    """A plain route's number of segments and its first and last literal segments (None: a parameter)."""
    if type(route) is not Route or not all(isinstance(c, _SEGMENT_CONVERTORS) for c in route.param_convertors.values()):
        return None
    segments = route.path.split("/")
    first, last = segments[1], segments[-1]
    return len(segments), (_ANY if "{" in first else first), (_ANY if "{" in last else last)
