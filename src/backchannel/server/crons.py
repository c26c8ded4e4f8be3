"""``/runs/crons/...`` and ``/threads/{thread_id}/runs/crons``: runs started on a schedule."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from backchannel.server.routing import Endpoint, JSONResponse, dump, read_body, runtime_of
from backchannel.server.schemas import CronCount, CronCreate, CronPatch, CronSearch, ThreadCronCreate

__all__ = ["ENDPOINTS"]


async def create_cron(request: Request) -> Response:
    body = await read_body(request, CronCreate)
    return JSONResponse(await runtime_of(request).crons.create(body.assistant_id,
                                                               **dump(body, exclude=("assistant_id",))))


async def create_thread_cron(request: Request) -> Response:
    body = await read_body(request, ThreadCronCreate)
    return JSONResponse(await runtime_of(request).crons.create_for_thread(
        request.path_params["thread_id"], body.assistant_id, **dump(body, exclude=("assistant_id",))))


async def get_cron(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).crons.get(request.path_params["cron_id"]))


async def patch_cron(request: Request) -> Response:
    body = await read_body(request, CronPatch)
    return JSONResponse(await runtime_of(request).crons.update(request.path_params["cron_id"], **dump(body)))


async def delete_cron(request: Request) -> Response:
    await runtime_of(request).crons.delete(request.path_params["cron_id"])
    return Response(status_code=204)


async def search_crons(request: Request) -> Response:
    body = await read_body(request, CronSearch)
    return JSONResponse(await runtime_of(request).crons.search(**dump(body)))


async def count_crons(request: Request) -> Response:
    body = await read_body(request, CronCount)
    return JSONResponse(await runtime_of(request).crons.count(**dump(body)))


_CRON = {200: "The cron", 404: "Assistant or thread not found", 422: "Invalid request (a bad schedule, timezone, ...)"}

ENDPOINTS = [
    Endpoint("POST", "/runs/crons", create_cron, "Create a cron whose runs each get a new thread", CronCreate,
             responses=_CRON),
    Endpoint("POST", "/runs/crons/search", search_crons, "Search crons", CronSearch,
             responses={200: "Crons", 422: "Invalid request"}),
    Endpoint("POST", "/runs/crons/count", count_crons, "Count crons", CronCount,
             responses={200: "How many", 422: "Invalid request"}),
    Endpoint("GET", "/runs/crons/{cron_id}", get_cron, "Get a cron", responses={200: "The cron", 404: "Not found"}),
    Endpoint("PATCH", "/runs/crons/{cron_id}", patch_cron, "Change a cron", CronPatch,
             responses={200: "The cron", 404: "Not found", 422: "Invalid request"}),
    Endpoint("DELETE", "/runs/crons/{cron_id}", delete_cron, "Delete a cron",
             responses={204: "Deleted", 404: "Not found"}),
    Endpoint("POST", "/threads/{thread_id}/runs/crons", create_thread_cron, "Create a cron that runs on a thread",
             ThreadCronCreate, responses=_CRON),
]
