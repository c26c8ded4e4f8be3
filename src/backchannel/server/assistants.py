"""``/assistants/...``: the agents this server runs, one assistant per graph."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from backchannel.server.routing import Endpoint, JSONResponse, dump, read_body, runtime_of
from backchannel.server.schemas import AssistantCount, AssistantSearch

__all__ = ["ENDPOINTS"]


async def get_assistant(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get(request.path_params["assistant_id"]))


async def search_assistants(request: Request) -> Response:
    body = await read_body(request, AssistantSearch)
    return JSONResponse(await runtime_of(request).assistants.search(**dump(body)))


async def count_assistants(request: Request) -> Response:
    body = await read_body(request, AssistantCount)
    return JSONResponse(await runtime_of(request).assistants.count(**dump(body)))


async def get_graph(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get_graph(request.path_params["assistant_id"]))


async def get_schemas(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).assistants.get_schemas(request.path_params["assistant_id"]))


async def get_subgraphs(request: Request) -> Response:
    await runtime_of(request).assistants.get(request.path_params["assistant_id"])  # 404 for an unknown one
    return JSONResponse({})  # subagents are agents of their own, not subgraphs


_ONE = {200: "Success", 404: "Assistant not found"}

ENDPOINTS = [
    Endpoint("POST", "/assistants/search", search_assistants, "Search assistants", AssistantSearch,
             responses={200: "Assistants", 422: "Invalid request"}),
    Endpoint("POST", "/assistants/count", count_assistants, "Count assistants", AssistantCount,
             responses={200: "The number of assistants", 422: "Invalid request"}),
    Endpoint("GET", "/assistants/{assistant_id}", get_assistant, "Get an assistant by id or graph id",
             responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/graph", get_graph, "The agent's loop as nodes and edges",
             responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/schemas", get_schemas, "JSON schemas of the agent's state",
             responses=_ONE),
    Endpoint("GET", "/assistants/{assistant_id}/subgraphs", get_subgraphs, "The agent's subgraphs (none)",
             responses=_ONE),
]
