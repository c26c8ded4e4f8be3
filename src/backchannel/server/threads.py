"""``/threads/...``: conversations, their state and history."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from backchannel.server.routing import (
    Endpoint,
    JSONResponse,
    Query,
    dump,
    query_int,
    read_body,
    render_json,
    runtime_of,
)
from backchannel.server.schemas import (
    HistorySearch,
    StateCheckpoint,
    StateUpdate,
    ThreadCount,
    ThreadCreate,
    ThreadPatch,
    ThreadPrune,
    ThreadSearch,
)
from backchannel.server.sse import PushedChunks, StreamingBody, event_stream, push_parts

__all__ = ["ENDPOINTS"]


async def create_thread(request: Request) -> Response:
    body = await read_body(request, ThreadCreate)
    return JSONResponse(await runtime_of(request).threads.create(**dump(body)))


async def search_threads(request: Request) -> Response:
    body = await read_body(request, ThreadSearch)
    return JSONResponse(await runtime_of(request).threads.search(**dump(body)))


async def count_threads(request: Request) -> Response:
    body = await read_body(request, ThreadCount)
    return JSONResponse(await runtime_of(request).threads.count(**dump(body)))


async def get_thread(request: Request) -> Response:
    # The Python SDK joins the fields with commas; the JS SDK repeats the parameter.
    include = [f.strip() for value in request.query_params.getlist("include") for f in value.split(",") if f.strip()]
    return JSONResponse(await runtime_of(request).threads.get(request.path_params["thread_id"],
                                                              include=include or None))


async def patch_thread(request: Request) -> Response:
    body = await read_body(request, ThreadPatch)
    thread_id = request.path_params["thread_id"]
    thread = await runtime_of(request).threads.update(thread_id, metadata=body.metadata or {},
                                                      ttl=dump(body.ttl) if body.ttl else None)
    if request.headers.get("prefer") == "return=minimal":
        return Response(status_code=204)
    return JSONResponse(thread)


async def prune_threads(request: Request) -> Response:
    body = await read_body(request, ThreadPrune)
    return JSONResponse(await runtime_of(request).threads.prune(body.thread_ids, strategy=body.strategy))


async def delete_thread(request: Request) -> Response:
    await runtime_of(request).threads.delete(request.path_params["thread_id"])
    return Response(status_code=204)


async def copy_thread(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).threads.copy(request.path_params["thread_id"]))


async def get_state(request: Request) -> Response:
    thread_id = request.path_params["thread_id"]
    checkpoint_id = request.path_params.get("checkpoint_id")
    # The state is only encoded here: its stored JSON text is sent as it is, unparsed.
    return JSONResponse(await runtime_of(request).threads.get_state(
        thread_id, checkpoint_id=checkpoint_id, select=request.query_params.getlist("select") or None,
        stored_json=True))


async def get_state_at_checkpoint(request: Request) -> Response:
    body = await read_body(request, StateCheckpoint)
    return JSONResponse(await runtime_of(request).threads.get_state(
        request.path_params["thread_id"], checkpoint=body.checkpoint, select=body.select, stored_json=True))


async def update_state(request: Request) -> Response:
    body = await read_body(request, StateUpdate)
    return JSONResponse(await runtime_of(request).threads.update_state(
        request.path_params["thread_id"], body.values, **dump(body, exclude=("values",))))


async def get_history(request: Request) -> Response:
    return _json_list(await runtime_of(request).threads.get_history(
        request.path_params["thread_id"], limit=query_int(request, "limit", 10, minimum=1),
        before=request.query_params.get("before") or None, stored_json=True))


async def search_history(request: Request) -> Response:
    body = await read_body(request, HistorySearch)
    return _json_list(await runtime_of(request).threads.get_history(
        request.path_params["thread_id"], **dump(body, exclude=("checkpoint",)), stored_json=True))


def _json_list(items: list[Any]) -> Response:
    """A JSON list sent an item at a time: a long thread's history is tens of megabytes, and encoding it in
    one go would hold every other request back."""
    async def chunks() -> AsyncIterator[bytes]:
        for i, item in enumerate(items):
            yield (b"," if i else b"[") + render_json(item)
            await asyncio.sleep(0)
        yield b"]" if items else b"[]"

    return StreamingResponse(chunks(), media_type="application/json")


async def join_thread_stream(request: Request) -> StreamingBody:
    rt = runtime_of(request)
    thread_id = request.path_params["thread_id"]
    await rt.threads.get(thread_id)  # 404 for an unknown thread, before the response starts
    # The SDKs send stream_mode (repeated, or comma-separated); LangGraph's server reads stream_modes.
    raw = request.query_params.getlist("stream_mode") + request.query_params.getlist("stream_modes")
    modes = [m.strip() for value in raw for m in value.split(",") if m.strip()] or ["run_modes"]
    parts = rt.threads.join_stream(thread_id, stream_mode=modes,
                                   last_event_id=request.headers.get("last-event-id") or None)
    return event_stream(request, PushedChunks(lambda write: push_parts(parts, write, with_id=False)))


_THREAD = {200: "The thread", 404: "Thread not found"}
_STATE = {200: "The thread's state", 404: "Thread or checkpoint not found", 422: "Invalid request"}
_SELECT_STATE = {"select": Query(description="Fields to return (repeated): values, next, tasks, ..., or values.<key>")}

ENDPOINTS = [
    Endpoint("POST", "/threads", create_thread, "Create a thread", ThreadCreate,
             responses={200: "The new thread", 409: "A thread with this id exists", 422: "Invalid request"}),
    Endpoint("POST", "/threads/search", search_threads, "Search threads", ThreadSearch,
             responses={200: "Threads", 422: "Invalid request"}),
    Endpoint("POST", "/threads/count", count_threads, "Count threads", ThreadCount,
             responses={200: "The number of threads", 422: "Invalid request"}),
    Endpoint("POST", "/threads/prune", prune_threads, "Delete threads, or keep only their newest checkpoint "
             "(keep_latest); threads with a run pending or running are left alone", ThreadPrune,
             responses={200: "{pruned_count: N}", 422: "Invalid request"}),
    Endpoint("GET", "/threads/{thread_id}", get_thread, "Get a thread", query={
        "include": Query(description="Optional fields: ttl (its time to live, when it has one)")},
        responses={**_THREAD, 422: "Invalid include"}),
    Endpoint("PATCH", "/threads/{thread_id}", patch_thread, "Update a thread's metadata or time to live", ThreadPatch,
             responses={**_THREAD, 204: "Updated (Prefer: return=minimal)", 422: "Invalid request"}),
    Endpoint("DELETE", "/threads/{thread_id}", delete_thread, "Delete a thread with its runs and checkpoints",
             responses={204: "Deleted", 404: "Thread not found"}),
    Endpoint("POST", "/threads/{thread_id}/copy", copy_thread, "Copy a thread with its history",
             responses=_THREAD),
    Endpoint("GET", "/threads/{thread_id}/state", get_state, "Get a thread's latest state", query=_SELECT_STATE,
             responses=_STATE),
    Endpoint("POST", "/threads/{thread_id}/state", update_state, "Update a thread's state", StateUpdate,
             responses={200: "The new checkpoint", 404: "Thread not found", 409: "The thread has active runs",
                        422: "Invalid request"}),
    Endpoint("GET", "/threads/{thread_id}/state/{checkpoint_id}", get_state, "Get a thread's state at a checkpoint",
             query=_SELECT_STATE, responses=_STATE),
    Endpoint("POST", "/threads/{thread_id}/state/checkpoint", get_state_at_checkpoint,
             "Get a thread's state at a checkpoint", StateCheckpoint, responses={**_STATE, 422: "Invalid request"}),
    Endpoint("GET", "/threads/{thread_id}/history", get_history, "A thread's checkpoints, newest first",
             query={"limit": Query("integer"), "before": Query(description="A checkpoint id")},
             responses={200: "States", 404: "Thread or checkpoint not found", 422: "Invalid query"}),
    Endpoint("GET", "/threads/{thread_id}/stream", join_thread_stream,
             "Follow every run of the thread from now on, wake-up runs too (until the client leaves)", query={
                 "stream_mode": Query(description="run_modes (each run's parts, the default) or lifecycle (when "
                                                  "each run starts and ends); repeated or comma-separated")},
             responses={200: "Server-sent events: per run, metadata, its parts, metadata {status: run_done}",
                        404: "Thread not found", 422: "Invalid stream mode"}, media_type="text/event-stream"),
    Endpoint("POST", "/threads/{thread_id}/history", search_history, "A thread's checkpoints, newest first",
             HistorySearch, responses={200: "States", 404: "Thread or checkpoint not found",
                                       422: "Invalid request"}),
]
