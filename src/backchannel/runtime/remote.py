"""``RemoteRuntime``: a runtime on another server, with the same surface as :class:`LocalRuntime`.

It speaks the LangGraph HTTP API (what ``backchannel serve`` and LangGraph
servers serve) with ``httpx``, so code written for one runtime runs on the
other: ``rt.threads.create(...)``, ``rt.runs.stream(...)``,
``rt.store.put_item(...)``. Server errors come back as backchannel's own
exceptions: :class:`NotFoundError` (404), :class:`ConflictError` (409),
:class:`InvalidRequestError` (400, 413, 422), :class:`AuthenticationError`
(401, 403) and :class:`RemoteError` (unreachable, 5xx: worth retrying).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote

from backchannel.errors import (
    AuthenticationError,
    BackchannelError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RemoteError,
)
from backchannel.runtime.modes import StreamPart
from backchannel.serde import dumps
from backchannel.tracing import with_trace_context

__all__ = ["DEFAULT_URL", "RemoteRuntime"]

DEFAULT_URL = "http://127.0.0.1:8123"
_FROM_ENV: Any = object()


class RemoteRuntime:
    """A runtime served over HTTP: ``RemoteRuntime("http://host:8123", api_key=None, headers=None)``.

    ``api_key`` (sent as ``x-api-key``) defaults to ``BACKCHANNEL_API_KEY``
    from the environment; pass ``None`` to send none. Use it as ``async with
    RemoteRuntime(...) as rt:`` or call ``await rt.close()``.
    """

    def __init__(self, url: str = DEFAULT_URL, *, api_key: str | None = _FROM_ENV,
                 headers: Mapping[str, str] | None = None, timeout: float = 30.0, transport: Any = None) -> None:
        if api_key is _FROM_ENV:
            api_key = os.environ.get("BACKCHANNEL_API_KEY") or None
        self.url = url.rstrip("/")
        sent = dict(headers or {})
        if api_key:
            sent["x-api-key"] = api_key
        self._http = _Http(self.url, sent, timeout, transport)
        self.assistants = RemoteAssistants(self._http)
        self.threads = RemoteThreads(self._http)
        self.runs = RemoteRuns(self._http)
        self.store = RemoteStore(self._http)

    def __repr__(self) -> str:
        return f"RemoteRuntime({self.url!r})"

    async def __aenter__(self) -> RemoteRuntime:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Nothing to open: connections are made on first use (here for symmetry with LocalRuntime)."""

    async def close(self) -> None:
        """Close the connections to the server."""
        await self._http.close()


class _Http:
    """Requests to one server, with its errors turned into backchannel's."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float, transport: Any) -> None:
        self.url = url
        self.headers = headers
        self.timeout = timeout
        self.transport = transport
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(base_url=self.url, headers=self.headers, transport=self.transport,
                                             timeout=httpx.Timeout(self.timeout))
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, Any] | None = None) -> Any:
        import httpx

        content = dumps(json).encode() if json is not None else None
        headers = {"content-type": "application/json"} if content is not None else None
        try:
            response = await self.client().request(method, path, content=content, params=_params(params),
                                                   headers=headers)
        except httpx.HTTPError as exc:
            raise RemoteError(f"{method} {self.url}{path} failed: {type(exc).__name__}: {exc}") from exc
        _raise_for_status(response, method, self.url + path)
        return response.json() if response.content.strip() else None

    async def stream(self, method: str, path: str, *, json: Any = None, params: Mapping[str, Any] | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[StreamPart]:
        """The server-sent events of a streaming endpoint, as stream parts."""
        import httpx

        sent = {"accept": "text/event-stream", **(headers or {})}
        if json is not None:
            sent["content-type"] = "application/json"
        content = dumps(json).encode() if json is not None else None
        try:
            async with self.client().stream(method, path, content=content, params=_params(params),
                                            headers=sent) as response:
                if response.is_error:
                    await response.aread()
                    _raise_for_status(response, method, self.url + path)
                async for part in _read_events(response.aiter_lines()):
                    yield part
        except httpx.HTTPError as exc:
            raise RemoteError(f"{method} {self.url}{path} failed: {type(exc).__name__}: {exc}") from exc


class RemoteAssistants:
    """The server's assistants."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def get(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}")

    async def search(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                     name: str | None = None, limit: int = 10, offset: int = 0, **_: Any) -> list[dict[str, Any]]:
        return await self._http.request("POST", "/assistants/search", json=_given(
            metadata=metadata, graph_id=graph_id, name=name, limit=limit, offset=offset))

    async def count(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                    **_: Any) -> int:
        return await self._http.request("POST", "/assistants/count", json=_given(metadata=metadata, graph_id=graph_id))

    async def get_graph(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}/graph")

    async def get_schemas(self, assistant_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}/schemas")


class RemoteThreads:
    """The server's threads."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, *, metadata: Mapping[str, Any] | None = None, thread_id: str | None = None,
                     if_exists: str | None = None, graph_id: str | None = None, **_: Any) -> dict[str, Any]:
        return await self._http.request("POST", "/threads", json=_given(
            metadata=metadata, thread_id=thread_id, if_exists=if_exists, graph_id=graph_id))

    async def get(self, thread_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}")

    async def update(self, thread_id: str, *, metadata: Mapping[str, Any], **_: Any) -> dict[str, Any]:
        return await self._http.request("PATCH", f"/threads/{_q(thread_id)}", json={"metadata": metadata})

    async def delete(self, thread_id: str, **_: Any) -> None:
        await self._http.request("DELETE", f"/threads/{_q(thread_id)}")

    async def search(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                     ids: Sequence[str] | None = None, status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_by: str | None = None, sort_order: str | None = None, **_: Any) -> list[dict[str, Any]]:
        return await self._http.request("POST", "/threads/search", json=_given(
            metadata=metadata, values=values, ids=ids, status=status, limit=limit, offset=offset, sort_by=sort_by,
            sort_order=sort_order))

    async def count(self, *, metadata: Mapping[str, Any] | None = None, status: str | None = None,
                    **_: Any) -> int:
        return await self._http.request("POST", "/threads/count", json=_given(metadata=metadata, status=status))

    async def copy(self, thread_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/copy")

    async def get_state(self, thread_id: str, checkpoint: Mapping[str, Any] | None = None,
                        checkpoint_id: str | None = None, **_: Any) -> dict[str, Any]:
        if checkpoint:
            return await self._http.request("POST", f"/threads/{_q(thread_id)}/state/checkpoint",
                                            json={"checkpoint": checkpoint})
        if checkpoint_id:
            return await self._http.request("GET", f"/threads/{_q(thread_id)}/state/{_q(checkpoint_id)}")
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/state")

    async def update_state(self, thread_id: str, values: Any, *, as_node: str | None = None,
                           checkpoint: Mapping[str, Any] | None = None, checkpoint_id: str | None = None,
                           **_: Any) -> dict[str, Any]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/state", json=_given(
            values=values, as_node=as_node, checkpoint=checkpoint, checkpoint_id=checkpoint_id))

    async def get_history(self, thread_id: str, *, limit: int = 10, before: str | Mapping[str, Any] | None = None,
                          metadata: Mapping[str, Any] | None = None, **_: Any) -> list[dict[str, Any]]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/history", json=_given(
            limit=limit, before=before, metadata=metadata))


class RemoteRuns:
    """The server's runs."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, thread_id: str | None, assistant_id: str, **kwargs: Any) -> dict[str, Any]:
        return await self._http.request("POST", _runs_path(thread_id), json=_run_body(assistant_id, kwargs))

    async def get(self, thread_id: str, run_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}")

    async def list(self, thread_id: str, *, limit: int = 10, offset: int = 0, status: str | None = None,
                   **_: Any) -> list[dict[str, Any]]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs",
                                        params=_given(limit=limit, offset=offset, status=status))

    async def cancel(self, thread_id: str, run_id: str, *, wait: bool = False, action: str = "interrupt",
                     **_: Any) -> None:
        await self._http.request("POST", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/cancel",
                                 params={"wait": 1 if wait else 0, "action": action})

    async def delete(self, thread_id: str, run_id: str, **_: Any) -> None:
        await self._http.request("DELETE", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}")

    async def join(self, thread_id: str, run_id: str, **_: Any) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/join")

    async def wait(self, thread_id: str | None, assistant_id: str, *, raise_error: bool = True,
                   **kwargs: Any) -> dict[str, Any]:
        result = await self._http.request("POST", _runs_path(thread_id, "/wait"), json=_run_body(assistant_id, kwargs))
        error = result.get("__error__") if isinstance(result, dict) else None
        if raise_error and isinstance(error, dict):
            raise BackchannelError(f"{error.get('error')}: {error.get('message')}")
        return result

    def stream(self, thread_id: str | None, assistant_id: str, **kwargs: Any) -> AsyncIterator[StreamPart]:
        return self._http.stream("POST", _runs_path(thread_id, "/stream"), json=_run_body(assistant_id, kwargs))

    def join_stream(self, thread_id: str, run_id: str, *, stream_mode: str | Sequence[str] | None = None,
                    last_event_id: str | None = None, cancel_on_disconnect: bool = False,
                    **_: Any) -> AsyncIterator[StreamPart]:
        modes = [stream_mode] if isinstance(stream_mode, str) else stream_mode
        return self._http.stream(
            "GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/stream",
            params=_given(stream_mode=dumps(list(modes)) if modes else None,
                          cancel_on_disconnect=cancel_on_disconnect or None),
            headers={"last-event-id": last_event_id} if last_event_id else None)


class RemoteStore:
    """The server's key-value store."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any],
                       index: Any = None, ttl: Any = None, **_: Any) -> None:
        await self._http.request("PUT", "/store/items", json=_given(
            namespace=list(namespace), key=key, value=value, index=index, ttl=ttl))

    async def get_item(self, namespace: Sequence[str], /, key: str, **_: Any) -> dict[str, Any] | None:
        return await self._http.request("GET", "/store/items", params={"namespace": ".".join(namespace), "key": key})

    async def delete_item(self, namespace: Sequence[str], /, key: str, **_: Any) -> None:
        await self._http.request("DELETE", "/store/items", json={"namespace": list(namespace), "key": key})

    async def search_items(self, namespace_prefix: Sequence[str], /, filter: Mapping[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, query: str | None = None,
                           **_: Any) -> dict[str, Any]:
        return await self._http.request("POST", "/store/items/search", json=_given(
            namespace_prefix=list(namespace_prefix), filter=filter, limit=limit, offset=offset, query=query))

    async def list_namespaces(self, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100, offset: int = 0,
                              **_: Any) -> dict[str, Any]:
        return await self._http.request("POST", "/store/namespaces", json=_given(
            prefix=list(prefix) if prefix else None, suffix=list(suffix) if suffix else None, max_depth=max_depth,
            limit=limit, offset=offset))


# -- helpers -------------------------------------------------------------------

_ERRORS: dict[int, type[BackchannelError]] = {400: InvalidRequestError, 401: AuthenticationError,
                                              403: AuthenticationError, 404: NotFoundError, 409: ConflictError,
                                              413: InvalidRequestError, 422: InvalidRequestError}


def _raise_for_status(response: Any, method: str, url: str) -> None:
    status = response.status_code
    if status < 400:
        return
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    message = f"{method} {url}: HTTP {status}: {detail or response.text[:500] or response.reason_phrase}"
    error = _ERRORS.get(status)
    if error is not None:
        raise error(message)
    raise RemoteError(message, status_code=status)


def _q(value: str) -> str:
    return quote(str(value), safe="")


def _given(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    return {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}


def _runs_path(thread_id: str | None, suffix: str = "") -> str:
    return f"/threads/{_q(thread_id)}/runs{suffix}" if thread_id is not None else f"/runs{suffix}"


def _run_body(assistant_id: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A run's JSON body from ``runs.create`` keyword arguments (those the HTTP API has)."""
    body = {k: v for k, v in kwargs.items() if v is not None and k not in ("headers", "params", "raise_error")}
    config = with_trace_context(body.get("config"))  # the run continues this trace on the server
    if config is not None:
        body["config"] = config
    return {"assistant_id": assistant_id, **body}


async def _read_events(lines: AsyncIterator[str]) -> AsyncIterator[StreamPart]:
    """Server-sent events as stream parts: ``event``, ``data`` (JSON) and ``id`` fields; comments skipped."""
    event, data, event_id = "", [], None
    async for line in lines:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value
            continue
        if event or data:
            yield _part(event, data, event_id)
        event, data = "", []
    if event or data:
        yield _part(event, data, event_id)


def _part(event: str, data: list[str], event_id: str | None) -> StreamPart:
    import json

    text = "\n".join(data)
    return StreamPart(event, json.loads(text) if text.strip() else None, event_id)
