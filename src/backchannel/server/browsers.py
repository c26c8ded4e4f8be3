"""Browsers: CORS for the web apps that call the server, and the checks that keep other pages out.

A browser lets any page send requests to any server; what stops a page from
driving a keyless server on this machine is the server itself. So, besides
answering CORS as LangGraph's server does (preflights, ``Access-Control-*``
headers, private-network access for loopback), :class:`BrowserGuard` refuses:

- a ``Host`` that is neither loopback, an IP address, nor a name it was told
  to serve (a DNS-rebinding page reaches ``127.0.0.1`` under its own name);
- a request whose ``Origin`` is neither the server's own nor an allowed one
  (a page may send a "simple" cross-site POST without asking first; a
  WebSocket is never subject to CORS at all);
- a request body that is not declared JSON (the kind a page can send without
  a preflight: ``text/plain``, forms).

:class:`BrowserPolicy` says what is allowed; :func:`default_policy` gives the
defaults (loopback web apps and LangGraph Studio without an API key; any
origin, as ``langgraph dev`` allows, with one, which a page cannot know).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from backchannel.server.routing import render_json

__all__ = ["LOOPBACK_ORIGINS", "STUDIO_ORIGIN", "BrowserGuard", "BrowserPolicy", "cors_middleware", "default_policy"]

# Pages served from this machine, on any port (a UI's dev server: localhost:3000, 127.0.0.1:5173, ...).
LOOPBACK_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
STUDIO_ORIGIN = "https://smith.langchain.com"  # LangGraph Studio, which calls local servers from the browser
# Headers browser apps read from responses (as LangGraph's server exposes them).
_EXPOSED = ("content-location", "location", "x-pagination-total", "x-pagination-next")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_WANTED = frozenset({b"host", b"origin", b"content-type", b"content-length", b"transfer-encoding"})
_REMEMBERED_HOSTS = 256  # Host values whose verdict the guard keeps


@dataclass(frozen=True, slots=True)
class BrowserPolicy:
    """Which pages may call the server, under which host names, with which bodies.

    ``cors_origins``: exact origins, ``"*"`` for any, or ``"loopback"`` for this
    machine's pages on any port. ``allowed_hosts``: names the server answers to
    besides loopback and IP addresses (``"*"``: any; ``None``: no check).
    ``json_only``: refuse request bodies not declared ``application/json``.
    """

    cors_origins: tuple[str, ...]
    allowed_hosts: tuple[str, ...] | None
    json_only: bool

    @property
    def any_origin(self) -> bool:
        return "*" in self.cors_origins

    def origin_regex(self) -> str | None:
        return LOOPBACK_ORIGINS if "loopback" in self.cors_origins else None

    def exact_origins(self) -> list[str]:
        return [o.rstrip("/") for o in self.cors_origins if o != "loopback"]


def default_policy(*, api_key: str | None, cors_origins: Sequence[str] | None = None,
                   allowed_hosts: Sequence[str] | None = None, served_names: Sequence[str] = ()) -> BrowserPolicy:
    """The policy for a server with or without ``api_key``, with what the operator chose instead.

    Without a key, only loopback pages and LangGraph Studio may call it, under loopback
    names, IP addresses or ``served_names`` (the names it listens on and is reached at),
    with JSON bodies. With a key (which a foreign page cannot know), any origin and
    host, as ``langgraph dev`` allows.
    """
    keyless = api_key is None
    origins = tuple(cors_origins) if cors_origins else (("loopback", STUDIO_ORIGIN) if keyless else ("*",))
    if allowed_hosts:
        hosts: tuple[str, ...] | None = None if "*" in allowed_hosts else (*allowed_hosts, *served_names)
    else:
        hosts = tuple(served_names) if keyless else None
    return BrowserPolicy(origins, hosts, keyless)


def cors_middleware(app: ASGIApp, policy: BrowserPolicy) -> CORSMiddleware:
    """Starlette's CORS middleware configured by ``policy`` (any method and header, as LangGraph allows)."""
    return CORSMiddleware(app, allow_origins=["*"] if policy.any_origin else policy.exact_origins(),
                          allow_origin_regex=policy.origin_regex(), allow_methods=["*"], allow_headers=["*"],
                          allow_credentials=not policy.any_origin, allow_private_network=True,
                          expose_headers=_EXPOSED)


class BrowserGuard:
    """Refuses requests a foreign page could make: a foreign Host, a foreign Origin, a body not declared JSON."""

    def __init__(self, app: ASGIApp, policy: BrowserPolicy) -> None:
        self.app = cors_middleware(app, policy)
        self.policy = policy
        self._hosts = frozenset(h.lower() for h in policy.allowed_hosts or ())
        self._origins = frozenset(policy.exact_origins())
        regex = policy.origin_regex()
        self._origin_regex = re.compile(regex) if regex else None
        self._host_verdicts: dict[str, bool] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            refusal = self._refusal(scope)
            if refusal is not None:
                await _refuse(scope, send, *refusal)
                return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        wanted = _wanted_headers(scope)
        host = wanted.get(b"host", "")
        if self.policy.allowed_hosts is not None and not self._host_allowed(host):
            return 403, (f"host {host!r} is not served here (a DNS-rebinding page?); serve it with "
                         "--allowed-hosts, or give the server an API key")
        origin = wanted.get(b"origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return 403, f"origin {origin!r} may not call this server; allow it with --cors-origins"
        content_type = wanted.get(b"content-type", "")
        if (self.policy.json_only and scope["type"] == "http" and scope["method"] in _BODY_METHODS
                and _has_body(wanted) and not _is_json(content_type)):
            return 415, (f"request bodies must be JSON (content-type: application/json), "
                         f"not {content_type or 'undeclared'}")
        return None

    def _host_allowed(self, host: str) -> bool:
        allowed = self._host_verdicts.get(host)
        if allowed is None:  # a client sends the same Host on every request: judge each value once
            if len(self._host_verdicts) >= _REMEMBERED_HOSTS:
                self._host_verdicts.clear()  # (a scanner's stream of made-up names must not grow it)
            name = _host_name(host)
            allowed = self._host_verdicts[host] = (name in self._hosts or name == "localhost"
                                                   or name.endswith(".localhost") or _is_ip(name))
        return allowed

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if self.policy.any_origin or origin.rstrip("/") in self._origins:
            return True
        if self._origin_regex is not None and self._origin_regex.fullmatch(origin):
            return True
        return origin.partition("://")[2] == host  # the server's own pages (the demo page)


def _host_name(host: str) -> str:
    """``host`` without its port: ``[::1]:8123`` → ``::1``, ``Example.org:80`` → ``example.org``."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _wanted_headers(scope: Scope) -> dict[bytes, str]:
    """The request headers the guard looks at, in one pass (the first of each, as ``Headers.get`` gives)."""
    wanted: dict[bytes, str] = {}
    for key, value in scope["headers"]:  # (names come lowercased, as ASGI says)
        if key in _WANTED and key not in wanted:
            wanted[key] = value.decode("latin-1")
    return wanted


def _has_body(headers: dict[bytes, str]) -> bool:
    length = headers.get(b"content-length")
    return b"transfer-encoding" in headers or (length is not None and length.strip() not in ("", "0"))


def _is_json(content_type: str) -> bool:
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    if scope["type"] == "websocket":  # closing before accepting answers the handshake with 403
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
        return
    body = render_json({"detail": detail})
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
