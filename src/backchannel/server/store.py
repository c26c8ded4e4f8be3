"""``/store/...``: the key-value store shared by all threads, addressed by namespace."""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from backchannel.server.routing import Endpoint, JSONResponse, Query, dump, query_bool, read_body, runtime_of
from backchannel.server.schemas import StoreDelete, StoreNamespaces, StorePut, StoreSearch

__all__ = ["ENDPOINTS"]


async def put_item(request: Request) -> Response:
    body = await read_body(request, StorePut)
    await runtime_of(request).store.put_item(body.namespace, key=body.key, value=body.value, ttl=body.ttl)
    return Response(status_code=204)


async def get_item(request: Request) -> Response:
    namespace, key = request.query_params.get("namespace", ""), request.query_params.get("key")
    if not key:
        raise HTTPException(422, "query parameter 'key' is required")
    item = await runtime_of(request).store.get_item(namespace.split(".") if namespace else [], key=key,
                                                    refresh_ttl=query_bool(request, "refresh_ttl")
                                                    if request.query_params.get("refresh_ttl") else None)
    return JSONResponse(item)


async def delete_item(request: Request) -> Response:
    body = await read_body(request, StoreDelete)
    await runtime_of(request).store.delete_item(body.namespace, key=body.key)
    return Response(status_code=204)


async def search_items(request: Request) -> Response:
    body = await read_body(request, StoreSearch)
    options = dump(body, exclude=("namespace_prefix",))
    return JSONResponse(await runtime_of(request).store.search_items(body.namespace_prefix or [], **options))


async def list_namespaces(request: Request) -> Response:
    body = await read_body(request, StoreNamespaces)
    return JSONResponse(await runtime_of(request).store.list_namespaces(**dump(body)))


ENDPOINTS = [
    Endpoint("PUT", "/store/items", put_item, "Store or replace an item", StorePut,
             responses={204: "Stored", 422: "Invalid request"}),
    Endpoint("GET", "/store/items", get_item, "Get an item (null when there is none)", query={
        "namespace": Query(description="The namespace's labels joined with '.'"),
        "key": Query(required=True),
        "refresh_ttl": Query("boolean", description="Start the item's time to live again (default: the store's "
                                                    "refresh_on_read)")},
        responses={200: "The item, or null", 422: "Invalid request"}),
    Endpoint("DELETE", "/store/items", delete_item, "Delete an item", StoreDelete,
             responses={204: "Deleted", 422: "Invalid request"}),
    Endpoint("POST", "/store/items/search", search_items, "Items under a namespace prefix", StoreSearch,
             responses={200: "{items: [...]}", 422: "Invalid request"}),
    Endpoint("POST", "/store/namespaces", list_namespaces, "List namespaces", StoreNamespaces,
             responses={200: "{namespaces: [...]}", 422: "Invalid request"}),
]
