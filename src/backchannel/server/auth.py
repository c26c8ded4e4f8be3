"""API keys: with one configured, every request but ``/ok`` (and a demo page's files) must carry it in ``x-api-key``."""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from backchannel.server.routing import render_json

__all__ = ["APIKeyMiddleware"]

_OPEN_PATHS = frozenset({"/ok"})  # health checks need no key


class APIKeyMiddleware:
    """Refuses (401; a WebSocket: 403) requests without the right ``x-api-key``, compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str, open_paths: Iterable[str] = ()) -> None:
        self.app = app
        self._key = api_key.encode()
        self._open = _OPEN_PATHS | frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self._open or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # closing before accepting answers the handshake with 403
            await send({"type": "websocket.close", "code": 1008, "reason": "missing or invalid API key"})
            return
        body = render_json({"detail": "missing or invalid API key: send it in the x-api-key header"})
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b"x-api-key")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"x-api-key":
                return hmac.compare_digest(value, self._key)
        return False
