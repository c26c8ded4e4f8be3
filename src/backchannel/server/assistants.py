"""``/assistants/...``: each served graph's own assistant, and assistants made from a graph with a config and
a context of their own, with their versions."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from backchannel.server.routing import Endpoint, JSONResponse, Query, dump, query_bool, read_body, runtime_of
from backchannel.server.schemas import (
    AssistantCount,
    AssistantCreate,
    AssistantLatest,
    AssistantPatch,
    AssistantSearch,
    AssistantVersions,
)

__all__ = ["ENDPOINTS"]


async def create_assistant(request: Request) -> Response:
    body = await read_body(request, AssistantCreate)
    return JSONResponse(await runtime_of(request).assistants.create(**dump(body)))


async def get_assistant(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get(request.path_params["assistant_id"]))


async def patch_assistant(request: Request) -> Response:
    body = await read_body(request, AssistantPatch)
    return JSONResponse(await runtime_of(request).assistants.update(request.path_params["assistant_id"],
                                                                    **dump(body)))


async def delete_assistant(request: Request) -> Response:
    await runtime_of(request).assistants.delete(request.path_params["assistant_id"],
                                                delete_threads=query_bool(request, "delete_threads"))
    return Response(status_code=204)


async def search_assistants(request: Request) -> Response:
    body = await read_body(request, AssistantSearch)
    found, next_offset = await runtime_of(request).assistants.page(**dump(body))
    # LangGraph's pagination headers: the SDKs read the next page's offset from X-Pagination-Next.
    offset = body.offset
    headers = ({"X-Pagination-Total": str(offset + len(found))} if next_offset is None else
               {"X-Pagination-Total": str(next_offset + 1), "X-Pagination-Next": str(next_offset)})
    return JSONResponse(found, headers=headers)


async def count_assistants(request: Request) -> Response:
    body = await read_body(request, AssistantCount)
    return JSONResponse(await runtime_of(request).assistants.count(**dump(body)))


async def get_versions(request: Request) -> Response:
    body = await read_body(request, AssistantVersions)
    return JSONResponse(await runtime_of(request).assistants.get_versions(request.path_params["assistant_id"],
                                                                          **dump(body)))


async def set_latest(request: Request) -> Response:
    body = await read_body(request, AssistantLatest)
    return JSONResponse(await runtime_of(request).assistants.set_latest(request.path_params["assistant_id"],
                                                                        body.version))


async def get_graph(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get_graph(request.path_params["assistant_id"]))


async def get_schemas(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get_schemas(request.path_params["assistant_id"]))


async def get_subgraphs(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get_subgraphs(
        request.path_params["assistant_id"], request.path_params.get("namespace"),
        recurse=query_bool(request, "recurse")))


_ONE = {200: "Success", 404: "Assistant not found"}
_CHANGE = {200: "The assistant, at its new version", 404: "Assistant or graph not found", 422: "Invalid request"}
_RECURSE = {"recurse": Query("boolean", "Include the subgraphs' own subgraphs")}

ENDPOINTS = [
    Endpoint("POST", "/assistants", create_assistant, "Create an assistant: a served graph with a config and "
             "context of its own", AssistantCreate,
             responses={200: "The assistant (version 1)", 404: "Graph not found", 409: "Assistant exists already",
                        422: "Invalid request"}),
    Endpoint("POST", "/assistants/search", search_assistants, "Search assistants", AssistantSearch,
             responses={200: "Assistants (X-Pagination-Next: the next page's offset)", 422: "Invalid request"}),
    Endpoint("POST", "/assistants/count", count_assistants, "Count assistants", AssistantCount,
             responses={200: "The number of assistants", 422: "Invalid request"}),
    Endpoint("GET", "/assistants/{assistant_id}", get_assistant, "Get an assistant by id or graph id",
             responses=_ONE),
    Endpoint("PATCH", "/assistants/{assistant_id}", patch_assistant, "Update an assistant (a new version)",
             AssistantPatch, responses=_CHANGE),
    Endpoint("DELETE", "/assistants/{assistant_id}", delete_assistant, "Delete an assistant with its versions",
             query={"delete_threads": Query("boolean", "Delete its threads too")},
             responses={204: "Deleted", 404: "Assistant not found", 409: "A graph's own assistant"}),
    Endpoint("POST", "/assistants/{assistant_id}/versions", get_versions, "An assistant's versions, newest first",
             AssistantVersions, responses={200: "Versions", 404: "Assistant not found", 422: "Invalid request"}),
    Endpoint("POST", "/assistants/{assistant_id}/latest", set_latest, "Make one of an assistant's versions its "
             "current one", AssistantLatest,
             responses={200: "The assistant", 404: "Assistant or version not found", 422: "Invalid request"}),
    Endpoint("GET", "/assistants/{assistant_id}/graph", get_graph, "The agent's loop as nodes and edges",
             query={"xray": Query(description="true, false or a depth")}, responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/schemas", get_schemas, "JSON schemas of the agent's state",
             responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/subgraphs", get_subgraphs, "The agent's subgraphs (none)",
             query=_RECURSE, responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/subgraphs/{namespace}", get_subgraphs,
             "The agent's subgraphs under a namespace (none)", query=_RECURSE, responses=_ONE),
]
