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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Unpack
from urllib.parse import quote

from backchannel.errors import (
    AuthenticationError,
    BackchannelError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    RemoteError,
)
from backchannel.protocols import (
    Checkpoint,
    CronOptions,
    CronUpdate,
    Headers,
    Params,
    RunOptions,
    Runtime,
    StreamModes,
    StreamOptions,
    StreamPart,
    WaitOptions,
    timezone_name,
    unexpected_keywords,
)
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
        self.crons = RemoteCrons(self._http)

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

    async def timeline(self, thread_id: str, *, spans: bool = True) -> dict[str, Any]:
        """What the thread's runs and its background tasks' runs did (``GET /threads/{id}/timeline``)."""
        result: dict[str, Any] = await self._http.request("GET", f"/threads/{_q(thread_id)}/timeline",
                                                          params={"spans": spans})
        return result


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

    async def request(self, method: str, path: str, *, json: Any = None, params: Params = None,
                      headers: Headers = None, on_response: Callable[[Any], None] | None = None) -> Any:
        import httpx

        content = dumps(json).encode() if json is not None else None
        sent = {**(headers or {}), **({"content-type": "application/json"} if content is not None else {})}
        try:
            response = await self.client().request(method, path, content=content, params=_params(params),
                                                   headers=sent or None)
        except httpx.HTTPError as exc:
            raise RemoteError(f"{method} {self.url}{path} failed: {type(exc).__name__}: {exc}") from exc
        _raise_for_status(response, method, self.url + path)
        if on_response is not None:
            on_response(response)
        return response.json() if response.content.strip() else None

    async def stream(self, method: str, path: str, *, json: Any = None, params: Params = None,
                     headers: Headers = None,
                     on_response: Callable[[Any], None] | None = None) -> AsyncIterator[StreamPart]:
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
                if on_response is not None:
                    on_response(response)
                async for part in _read_events(response.aiter_lines()):
                    yield part
        except httpx.HTTPError as exc:
            raise RemoteError(f"{method} {self.url}{path} failed: {type(exc).__name__}: {exc}") from exc


class RemoteAssistants:
    """The server's assistants."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def get(self, assistant_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}", headers=headers, params=params)

    async def create(self, graph_id: str | None, config: Mapping[str, Any] | None = None, *,
                     context: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
                     assistant_id: str | None = None, if_exists: str | None = None, name: str | None = None,
                     headers: Headers = None, description: str | None = None,
                     params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", "/assistants", json=_given(
            graph_id=graph_id, config=config, context=context, metadata=metadata, assistant_id=assistant_id,
            if_exists=if_exists, name=name, description=description), headers=headers, params=params)

    async def update(self, assistant_id: str, *, graph_id: str | None = None,
                     config: Mapping[str, Any] | None = None, context: Mapping[str, Any] | None = None,
                     metadata: Mapping[str, Any] | None = None, name: str | None = None, headers: Headers = None,
                     description: str | None = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("PATCH", f"/assistants/{_q(assistant_id)}", json=_given(
            graph_id=graph_id, config=config, context=context, metadata=metadata, name=name,
            description=description), headers=headers, params=params)

    async def delete(self, assistant_id: str, *, delete_threads: bool = False, headers: Headers = None,
                     params: Params = None) -> None:
        await self._http.request("DELETE", f"/assistants/{_q(assistant_id)}", headers=headers,
                                 params=_merged(params, delete_threads=delete_threads or None))

    async def search(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                     name: str | None = None, limit: int = 10, offset: int = 0, sort_by: str | None = None,
                     sort_order: str | None = None, select: Sequence[str] | None = None,
                     response_format: str = "array", headers: Headers = None, params: Params = None) -> Any:
        if response_format not in ("array", "object"):
            raise InvalidRequestError(f"response_format must be 'array' or 'object', not {response_format!r}")
        pages: list[str | None] = []
        found = await self._http.request("POST", "/assistants/search", json=_given(
            metadata=metadata, graph_id=graph_id, name=name, limit=limit, offset=offset, sort_by=sort_by,
            sort_order=sort_order, select=select), headers=headers, params=params,
            on_response=lambda response: pages.append(response.headers.get("X-Pagination-Next")))
        return {"assistants": found, "next": pages[0]} if response_format == "object" else found

    async def count(self, *, metadata: Mapping[str, Any] | None = None, graph_id: str | None = None,
                    name: str | None = None, headers: Headers = None, params: Params = None) -> int:
        return await self._http.request("POST", "/assistants/count", json=_given(
            metadata=metadata, graph_id=graph_id, name=name), headers=headers, params=params)

    async def get_versions(self, assistant_id: str, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                           offset: int = 0, *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("POST", f"/assistants/{_q(assistant_id)}/versions", json=_given(
            metadata=metadata, limit=limit, offset=offset), headers=headers, params=params)

    async def set_latest(self, assistant_id: str, version: int, *, headers: Headers = None,
                         params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", f"/assistants/{_q(assistant_id)}/latest", json={"version": version},
                                        headers=headers, params=params)

    async def get_graph(self, assistant_id: str, *, xray: int | bool = False, headers: Headers = None,
                        params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}/graph", headers=headers,
                                        params=_merged(params, xray=xray or None))

    async def get_schemas(self, assistant_id: str, *, headers: Headers = None,
                          params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/assistants/{_q(assistant_id)}/schemas", headers=headers,
                                        params=params)

    async def get_subgraphs(self, assistant_id: str, namespace: str | None = None, recurse: bool = False, *,
                            headers: Headers = None, params: Params = None) -> dict[str, Any]:
        path = f"/assistants/{_q(assistant_id)}/subgraphs" + (f"/{_q(namespace)}" if namespace is not None else "")
        return await self._http.request("GET", path, headers=headers, params=_merged(params, recurse=recurse))


class RemoteThreads:
    """The server's threads."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, *, metadata: Mapping[str, Any] | None = None, thread_id: str | None = None,
                     if_exists: str | None = None, supersteps: Sequence[Any] | None = None,
                     graph_id: str | None = None, ttl: int | Mapping[str, Any] | None = None,
                     headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", "/threads", json=_given(
            metadata=metadata, thread_id=thread_id, if_exists=if_exists, supersteps=supersteps, graph_id=graph_id,
            ttl=_ttl(ttl)), headers=headers, params=params)

    async def get(self, thread_id: str, *, include: Sequence[str] | None = None, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}", headers=headers,
                                        params=_merged(params, include=",".join(include) if include else None))

    async def update(self, thread_id: str, *, metadata: Mapping[str, Any], ttl: int | Mapping[str, Any] | None = None,
                     return_minimal: bool = False, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("PATCH", f"/threads/{_q(thread_id)}", json=_given(
            metadata=metadata, ttl=_ttl(ttl)), headers={**(headers or {}), **(
                {"Prefer": "return=minimal"} if return_minimal else {})}, params=params)

    async def delete(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> None:
        await self._http.request("DELETE", f"/threads/{_q(thread_id)}", headers=headers, params=params)

    async def prune(self, thread_ids: Sequence[str], *, strategy: str = "delete", headers: Headers = None,
                    params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", "/threads/prune", json={"thread_ids": list(thread_ids),
                                                                       "strategy": strategy},
                                        headers=headers, params=params)

    async def search(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                     ids: Sequence[str] | None = None, status: str | None = None, limit: int = 10, offset: int = 0,
                     sort_by: str | None = None, sort_order: str | None = None, select: Sequence[str] | None = None,
                     extract: Mapping[str, str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("POST", "/threads/search", json=_given(
            metadata=metadata, values=values, ids=ids, status=status, limit=limit, offset=offset, sort_by=sort_by,
            sort_order=sort_order, select=select, extract=extract), headers=headers, params=params)

    async def count(self, *, metadata: Mapping[str, Any] | None = None, values: Mapping[str, Any] | None = None,
                    status: str | None = None, headers: Headers = None, params: Params = None) -> int:
        return await self._http.request("POST", "/threads/count", json=_given(
            metadata=metadata, values=values, status=status), headers=headers, params=params)

    async def copy(self, thread_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/copy", headers=headers, params=params)

    async def get_state(self, thread_id: str, checkpoint: Checkpoint = None, checkpoint_id: str | None = None, *,
                        subgraphs: bool = False, select: Sequence[str] | None = None, headers: Headers = None,
                        params: Params = None) -> dict[str, Any]:
        query = _merged(params, subgraphs=subgraphs or None)
        if checkpoint:
            return await self._http.request("POST", f"/threads/{_q(thread_id)}/state/checkpoint", json=_given(
                checkpoint=checkpoint, subgraphs=subgraphs or None), headers=headers, params=params)
        if checkpoint_id:
            return await self._http.request("GET", f"/threads/{_q(thread_id)}/state/{_q(checkpoint_id)}",
                                            headers=headers, params=query)
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/state", headers=headers, params=query)

    async def update_state(self, thread_id: str, values: Mapping[str, Any] | Sequence[Any] | None, *,
                           as_node: str | None = None, checkpoint: Checkpoint = None,
                           checkpoint_id: str | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/state", json=_given(
            values=values, as_node=as_node, checkpoint=checkpoint, checkpoint_id=checkpoint_id), headers=headers,
            params=params)

    async def get_history(self, thread_id: str, *, limit: int = 10, before: str | Checkpoint = None,
                          metadata: Mapping[str, Any] | None = None, checkpoint: Checkpoint = None,
                          select: Sequence[str] | None = None, headers: Headers = None,
                          params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/history", json=_given(
            limit=limit, before=before, metadata=metadata, checkpoint=checkpoint, select=select), headers=headers,
            params=params)


class RemoteRuns:
    """The server's runs."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, thread_id: str | None, assistant_id: str, **options: Unpack[RunOptions]) -> dict[str, Any]:
        unexpected_keywords("create", options, RunOptions)
        headers, params, created = options.pop("headers", None), options.pop("params", None), _callback(options)
        run = await self._http.request("POST", _runs_path(thread_id), json=_run_body(assistant_id, options),
                                       headers=headers, params=params)
        created(run)
        return run

    async def get(self, thread_id: str, run_id: str, *, headers: Headers = None,
                  params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}", headers=headers,
                                        params=params)

    async def create_batch(self, payloads: Sequence[Mapping[str, Any]], *, headers: Headers = None,
                           params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("POST", "/runs/batch", json=[_given(**p) for p in payloads],
                                        headers=headers, params=params)

    async def cancel_many(self, *, thread_id: str | None = None, run_ids: Sequence[str] | None = None,
                          status: str | None = None, action: str = "interrupt", headers: Headers = None,
                          params: Params = None) -> None:
        await self._http.request("POST", "/runs/cancel", json=_given(thread_id=thread_id, run_ids=run_ids,
                                                                     status=status),
                                 headers=headers, params=_merged(params, action=action))

    async def list(self, thread_id: str, *, limit: int = 10, offset: int = 0, status: str | None = None,
                   select: Sequence[str] | None = None, headers: Headers = None,
                   params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs", headers=headers, params=_merged(
            params, limit=limit, offset=offset, status=status, select=",".join(select) if select else None))

    async def cancel(self, thread_id: str, run_id: str, *, wait: bool = False, action: str = "interrupt",
                     headers: Headers = None, params: Params = None) -> None:
        await self._http.request("POST", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/cancel", headers=headers,
                                 params=_merged(params, wait=1 if wait else 0, action=action))

    async def delete(self, thread_id: str, run_id: str, *, headers: Headers = None, params: Params = None) -> None:
        await self._http.request("DELETE", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}", headers=headers,
                                 params=params)

    async def join(self, thread_id: str, run_id: str, *, headers: Headers = None,
                   params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/join", headers=headers,
                                        params=params)

    async def wait(self, thread_id: str | None, assistant_id: str, **options: Unpack[WaitOptions]) -> Any:
        unexpected_keywords("wait", options, WaitOptions)
        raise_error = options.pop("raise_error", True)
        headers, params, created = options.pop("headers", None), options.pop("params", None), _callback(options)
        result = await self._http.request("POST", _runs_path(thread_id, "/wait"), json=_run_body(assistant_id, options),
                                          headers=headers, params=params, on_response=created)
        error = result.get("__error__") if isinstance(result, dict) else None
        if raise_error and isinstance(error, dict):
            raise BackchannelError(f"{error.get('error')}: {error.get('message')}")
        return result

    def stream(self, thread_id: str | None, assistant_id: str,
               **options: Unpack[StreamOptions]) -> AsyncIterator[StreamPart]:
        unexpected_keywords("stream", options, StreamOptions)
        headers, params, created = options.pop("headers", None), options.pop("params", None), _callback(options)
        return self._http.stream("POST", _runs_path(thread_id, "/stream"), json=_run_body(assistant_id, options),
                                 headers=headers, params=params, on_response=created)

    def join_stream(self, thread_id: str, run_id: str, *, cancel_on_disconnect: bool = False,
                    stream_mode: StreamModes | None = None, headers: Headers = None, params: Params = None,
                    last_event_id: str | None = None) -> AsyncIterator[StreamPart]:
        modes = [stream_mode] if isinstance(stream_mode, str) else stream_mode
        return self._http.stream(
            "GET", f"/threads/{_q(thread_id)}/runs/{_q(run_id)}/stream",
            params=_merged(params, stream_mode=dumps(list(modes)) if modes else None,
                           cancel_on_disconnect=cancel_on_disconnect or None),
            headers={**(headers or {}), **({"last-event-id": last_event_id} if last_event_id else {})})


class RemoteCrons:
    """The server's crons."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def create(self, assistant_id: str, *, schedule: str, on_run_completed: str | None = None,
                     **options: Unpack[CronOptions]) -> dict[str, Any]:
        unexpected_keywords("create", options, CronOptions)
        headers, params = options.pop("headers", None), options.pop("params", None)
        body = _cron_body(options, assistant_id=assistant_id, schedule=schedule, on_run_completed=on_run_completed)
        return await self._http.request("POST", "/runs/crons", json=body, headers=headers, params=params)

    async def create_for_thread(self, thread_id: str, assistant_id: str, *, schedule: str,
                                **options: Unpack[CronOptions]) -> dict[str, Any]:
        unexpected_keywords("create_for_thread", options, CronOptions)
        headers, params = options.pop("headers", None), options.pop("params", None)
        return await self._http.request("POST", f"/threads/{_q(thread_id)}/runs/crons", headers=headers,
                                        json=_cron_body(options, assistant_id=assistant_id, schedule=schedule),
                                        params=params)

    async def get(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("GET", f"/runs/crons/{_q(cron_id)}", headers=headers, params=params)

    async def update(self, cron_id: str, **changes: Unpack[CronUpdate]) -> dict[str, Any]:
        unexpected_keywords("update", changes, CronUpdate)
        headers, params = changes.pop("headers", None), changes.pop("params", None)
        body = _cron_body(changes)
        if "end_time" in changes and changes["end_time"] is None:
            body["end_time"] = None  # clears it
        return await self._http.request("PATCH", f"/runs/crons/{_q(cron_id)}", json=body, headers=headers,
                                        params=params)

    async def delete(self, cron_id: str, *, headers: Headers = None, params: Params = None) -> None:
        await self._http.request("DELETE", f"/runs/crons/{_q(cron_id)}", headers=headers, params=params)

    async def search(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                     enabled: bool | None = None, metadata: Mapping[str, Any] | None = None, limit: int = 10,
                     offset: int = 0, sort_by: str | None = None, sort_order: str | None = None,
                     select: Sequence[str] | None = None, headers: Headers = None,
                     params: Params = None) -> list[dict[str, Any]]:
        return await self._http.request("POST", "/runs/crons/search", headers=headers, params=params, json=_given(
            assistant_id=assistant_id, thread_id=thread_id, enabled=enabled, metadata=metadata, limit=limit,
            offset=offset, sort_by=sort_by, sort_order=sort_order, select=select))

    async def count(self, *, assistant_id: str | None = None, thread_id: str | None = None,
                    metadata: Mapping[str, Any] | None = None, headers: Headers = None,
                    params: Params = None) -> int:
        count: int = await self._http.request("POST", "/runs/crons/count", headers=headers, params=params,
                                              json=_given(assistant_id=assistant_id, thread_id=thread_id,
                                                          metadata=metadata))
        return count


class RemoteStore:
    """The server's key-value store."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    async def put_item(self, namespace: Sequence[str], /, key: str, value: Mapping[str, Any],
                       index: bool | Sequence[str] | None = None, ttl: int | None = None,
                       headers: Headers = None, params: Params = None) -> None:
        await self._http.request("PUT", "/store/items", json=_given(
            namespace=list(namespace), key=key, value=value, index=index, ttl=ttl), headers=headers, params=params)

    async def get_item(self, namespace: Sequence[str], /, key: str, *, refresh_ttl: bool | None = None,
                       headers: Headers = None, params: Params = None) -> dict[str, Any] | None:
        return await self._http.request("GET", "/store/items", headers=headers, params=_merged(
            params, namespace=".".join(namespace), key=key, refresh_ttl=refresh_ttl))

    async def delete_item(self, namespace: Sequence[str], /, key: str, headers: Headers = None,
                          params: Params = None) -> None:
        await self._http.request("DELETE", "/store/items", json={"namespace": list(namespace), "key": key},
                                 headers=headers, params=params)

    async def search_items(self, namespace_prefix: Sequence[str], /, filter: Mapping[str, Any] | None = None,
                           limit: int = 10, offset: int = 0, query: str | None = None,
                           refresh_ttl: bool | None = None, headers: Headers = None,
                           params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", "/store/items/search", json=_given(
            namespace_prefix=list(namespace_prefix), filter=filter, limit=limit, offset=offset, query=query,
            refresh_ttl=refresh_ttl), headers=headers, params=params)

    async def list_namespaces(self, prefix: Sequence[str] | None = None, suffix: Sequence[str] | None = None,
                              max_depth: int | None = None, limit: int = 100, offset: int = 0,
                              headers: Headers = None, params: Params = None) -> dict[str, Any]:
        return await self._http.request("POST", "/store/namespaces", json=_given(
            prefix=list(prefix) if prefix else None, suffix=list(suffix) if suffix else None, max_depth=max_depth,
            limit=limit, offset=offset), headers=headers, params=params)


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


def _merged(params: Params, **given: Any) -> dict[str, Any]:
    """Query parameters: the caller's ``params`` and the method's own (those not ``None``)."""
    return {**(params or {}), **_given(**given)}


def _ttl(ttl: float | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A TTL as the API takes it: minutes alone mean ``{"ttl": minutes, "strategy": "delete"}``."""
    return {"ttl": ttl, "strategy": "delete"} if isinstance(ttl, int | float) else ttl


def _callback(options: RunOptions) -> Callable[[Any], None]:
    """What calls ``on_run_created`` (taken out of ``options``) with the new run's ids: from the run itself, or
    from the ``Content-Location`` of a response that streams or waits for it."""
    callback = options.pop("on_run_created", None)

    def created(source: Any) -> None:
        if callback is None:
            return
        if isinstance(source, Mapping):
            ids = {"run_id": source.get("run_id"), "thread_id": source.get("thread_id")}
        else:  # /threads/{thread_id}/runs/{run_id} or /runs/{run_id}
            parts = source.headers.get("content-location", "").strip("/").split("/")
            ids = {"run_id": parts[-1] if len(parts) >= 2 and parts[-2] == "runs" else None,
                   "thread_id": parts[1] if len(parts) >= 4 and parts[0] == "threads" else None}
        if ids["run_id"]:
            callback(ids)

    return created


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not params:
        return None
    return {k: str(v).lower() if isinstance(v, bool) else v for k, v in params.items()}


def _runs_path(thread_id: str | None, suffix: str = "") -> str:
    return f"/threads/{_q(thread_id)}/runs{suffix}" if thread_id is not None else f"/runs{suffix}"


def _run_body(assistant_id: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A run's JSON body from ``runs.create`` keyword arguments (those the HTTP API has)."""
    body = {k: v for k, v in kwargs.items() if v is not None}
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


def _cron_body(options: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
    """A cron's JSON body: its fields and options (not ``None``), the end time and timezone as the API takes them."""
    body = _given(**fields, **options)
    if isinstance(body.get("end_time"), datetime):
        body["end_time"] = body["end_time"].isoformat()
    if "timezone" in body:
        body["timezone"] = timezone_name(body["timezone"])
    return body


if TYPE_CHECKING:
    def _is_a_runtime(rt: RemoteRuntime) -> Runtime:
        return rt  # mypy checks that RemoteRuntime has the whole Runtime surface
