"""``/threads/{thread_id}/runs/...`` and ``/runs/...``: create, stream, wait for, join and cancel runs."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from backchannel.errors import BackchannelError, NotFoundError
from backchannel.runtime.run_options import check_stream_modes, event_position
from backchannel.server.routing import (
    Endpoint,
    JSONResponse,
    Query,
    dump,
    query_bool,
    query_int,
    read_body,
    render_json,
    runtime_of,
)
from backchannel.server.schemas import RunBatch, RunCreate, RunsCancel
from backchannel.server.sse import PushedChunks, StreamingBody, event_stream, json_body, push_parts
from backchannel.tracing import with_trace_context

__all__ = ["ENDPOINTS"]


_NOT_RUN_OPTIONS = ("assistant_id", "on_disconnect")


def _run_options(body: RunCreate, request: Request) -> dict[str, Any]:
    options = dump(body, exclude=_NOT_RUN_OPTIONS)
    # A caller tracing with OpenTelemetry sends its trace context as headers: the run continues that trace.
    config = with_trace_context(options.get("config"), request.headers)
    if config is not None:
        options["config"] = config
    return options


async def create_run(request: Request) -> Response:
    body = await read_body(request, RunCreate)
    thread_id = request.path_params.get("thread_id")
    run = await runtime_of(request).runs.create(thread_id, body.assistant_id, **_run_options(body, request))
    return JSONResponse(run, headers=_run_headers(thread_id, run["run_id"]))


async def create_batch(request: Request) -> Response:
    body = await read_body(request, RunBatch)
    payloads = [{"assistant_id": run.assistant_id, **_run_options(run, request)} for run in body.root]
    return JSONResponse(await runtime_of(request).runs.create_batch(payloads))


async def cancel_runs(request: Request) -> Response:
    body = await read_body(request, RunsCancel)
    await runtime_of(request).runs.cancel_many(**dump(body), action=request.query_params.get("action") or "interrupt")
    return Response(status_code=204)


async def stream_run(request: Request) -> Response | StreamingBody:
    body = await read_body(request, RunCreate)
    rt = runtime_of(request)
    thread_id = request.path_params.get("thread_id")
    parts = rt.runs.stream(thread_id, body.assistant_id, **_run_options(body, request))
    created: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    chunks = PushedChunks(lambda write: push_parts(parts, write, with_id=body.stream_resumable, created=created))
    run_id = await chunks.until(created)  # the run is made first, so a bad request fails here, before the response
    return event_stream(
        request, chunks, headers=_run_headers(thread_id, run_id, "stream"),
        on_disconnect=_canceller(rt, thread_id, run_id) if body.on_disconnect == "cancel" else None)


async def wait_run(request: Request) -> Response | StreamingBody:
    body = await read_body(request, RunCreate)
    rt = runtime_of(request)
    thread_id = request.path_params.get("thread_id")
    run = await rt.runs.create(thread_id, body.assistant_id, **_run_options(body, request))
    return json_body(
        request, _output(rt, run["run_id"]), headers=_run_headers(run["thread_id"], run["run_id"], "join"),
        on_disconnect=_canceller(rt, run["thread_id"], run["run_id"]) if body.on_disconnect == "cancel" else None)


async def list_runs(request: Request) -> Response:
    runs = await runtime_of(request).runs.list(
        request.path_params["thread_id"], limit=query_int(request, "limit", 10, minimum=1),
        offset=query_int(request, "offset", 0), status=request.query_params.get("status") or None,
        select=request.query_params.getlist("select") or None)
    return JSONResponse(runs)


async def get_run(request: Request) -> Response:
    return JSONResponse(await runtime_of(request).runs.get(request.path_params["thread_id"],
                                                           request.path_params["run_id"]))


async def delete_run(request: Request) -> Response:
    await runtime_of(request).runs.delete(request.path_params["thread_id"], request.path_params["run_id"])
    return Response(status_code=204)


async def join_run(request: Request) -> Response | StreamingBody:
    rt = runtime_of(request)
    thread_id, run_id = request.path_params["thread_id"], request.path_params["run_id"]
    await rt.runs.get(thread_id, run_id)  # 404 for an unknown run, before the response starts
    return json_body(
        request, _output(rt, run_id), headers=_run_headers(thread_id, run_id, "join"),
        on_disconnect=_canceller(rt, thread_id, run_id) if query_bool(request, "cancel_on_disconnect") else None)


async def join_run_stream(request: Request) -> Response | StreamingBody:
    rt = runtime_of(request)
    thread_id, run_id = request.path_params["thread_id"], request.path_params["run_id"]
    run = await rt.runs.get(thread_id, run_id)
    modes = _stream_modes([m for m in request.query_params.getlist("stream_mode") if m])  # "": the run's own
    last_event_id = request.headers.get("last-event-id") or None
    event_position(last_event_id)  # a bad one is a 422 before the response starts
    parts = rt.runs.join_stream(thread_id, run_id, stream_mode=modes, last_event_id=last_event_id)
    with_id = bool(run["kwargs"].get("stream_resumable"))
    return event_stream(
        request, PushedChunks(lambda write: push_parts(parts, write, with_id=with_id)),
        headers=_run_headers(thread_id, run_id, "stream"),
        on_disconnect=_canceller(rt, thread_id, run_id) if query_bool(request, "cancel_on_disconnect") else None)


async def cancel_run(request: Request) -> Response | StreamingBody:
    rt = runtime_of(request)
    thread_id, run_id = request.path_params["thread_id"], request.path_params["run_id"]
    action = request.query_params.get("action") or "interrupt"
    wait = query_bool(request, "wait")
    await rt.runs.cancel(thread_id, run_id, action=action)
    if not wait:
        return Response(status_code=202)
    return json_body(request, _output(rt, run_id), headers=_run_headers(thread_id, run_id, "join"))


def _run_headers(thread_id: str | None, run_id: str, then: str | None = None) -> dict[str, str]:
    """``content-location``: the run (under ``/runs`` when stateless); ``location``: its ``then`` (stream, join)."""
    url = f"/threads/{thread_id}/runs/{run_id}" if thread_id is not None else f"/runs/{run_id}"
    return {"location": f"{url}/{then}", "content-location": url} if then else {"content-location": url}


# -- bodies ------------------------------------------------------------------------


async def _output(rt: Any, run_id: str) -> AsyncIterator[bytes]:
    """The run's output once it has ended (``__error__`` for a failed run), as one JSON document."""
    try:
        output = await rt.runs.output(run_id)
    except NotFoundError:  # rolled back while we waited
        output = {"__error__": {"error": "NotFoundError", "message": f"run {run_id} was deleted (rolled back)"}}
    yield render_json(output)


def _canceller(rt: Any, thread_id: str | None, run_id: str) -> Callable[[], Awaitable[None]]:
    """Cancels the run when its client goes away (``on_disconnect="cancel"``)."""
    async def cancel() -> None:
        with contextlib.suppress(BackchannelError):  # it may have ended, or been deleted, meanwhile
            if thread_id is not None:
                await rt.runs.cancel(thread_id, run_id)
            elif (row := await rt.storage.get_run(run_id)) is not None:  # stateless: on a thread the runtime made
                await rt.runs.cancel(row.thread_id, run_id)

    return cancel


def _stream_modes(raw: list[str]) -> list[str] | None:
    """``stream_mode`` as clients send it in a query: repeated (the SDKs' lists), or a JSON list (422 if bad)."""
    if len(raw) != 1 or not raw[0].startswith("["):
        return check_stream_modes(raw) if raw else None
    try:
        modes = orjson.loads(raw[0])
    except orjson.JSONDecodeError:
        modes = None
    if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
        raise HTTPException(422, f"stream_mode must be a mode or a JSON list of modes, not {raw[0][:80]!r}")
    return check_stream_modes(modes)


_RUN = {200: "The run", 404: "Thread or assistant not found", 409: "The thread is busy (multitask_strategy=reject)",
        422: "Invalid request"}
_STREAM = {200: "Server-sent events: metadata first, then the run's parts", 404: "Thread or assistant not found",
           409: "The thread is busy", 422: "Invalid request"}
_OUTPUT = {200: "The run's final values (with __error__ or __interrupt__)", 404: "Not found", 422: "Invalid request"}
_STREAM_QUERY = {"stream_mode": Query(description="A stream mode (repeated for several), or a JSON list of them"),
                 "cancel_on_disconnect": Query("boolean", "Cancel the run if the client disconnects")}

ENDPOINTS = [
    Endpoint("POST", "/threads/{thread_id}/runs", create_run, "Create a background run", RunCreate, responses=_RUN),
    Endpoint("GET", "/threads/{thread_id}/runs", list_runs, "List a thread's runs, newest first", query={
        "limit": Query("integer"), "offset": Query("integer"), "status": Query(),
        "select": Query(description="Fields to return (repeated)")},
        responses={200: "Runs", 404: "Thread not found", 422: "Invalid query"}),
    Endpoint("POST", "/threads/{thread_id}/runs/stream", stream_run, "Create a run and stream it", RunCreate,
             responses=_STREAM, media_type="text/event-stream"),
    Endpoint("POST", "/threads/{thread_id}/runs/wait", wait_run, "Create a run and wait for its output", RunCreate,
             responses=_OUTPUT),
    Endpoint("GET", "/threads/{thread_id}/runs/{run_id}", get_run, "Get a run",
             responses={200: "The run", 404: "Not found"}),
    Endpoint("DELETE", "/threads/{thread_id}/runs/{run_id}", delete_run, "Delete a run",
             responses={204: "Deleted", 404: "Not found"}),
    Endpoint("GET", "/threads/{thread_id}/runs/{run_id}/join", join_run, "Wait for a run's output",
             query={"cancel_on_disconnect": _STREAM_QUERY["cancel_on_disconnect"]}, responses=_OUTPUT),
    Endpoint("GET", "/threads/{thread_id}/runs/{run_id}/stream", join_run_stream, "Follow a run's stream",
             query=_STREAM_QUERY, responses={200: "Server-sent events", 404: "Not found"},
             media_type="text/event-stream"),
    Endpoint("POST", "/threads/{thread_id}/runs/{run_id}/cancel", cancel_run, "Cancel a run", query={
        "wait": Query("boolean", "Wait for the run to end and return its output"),
        "action": Query(description="interrupt (keep its steps) or rollback (delete the run)")},
        responses={202: "Cancelling", 200: "The run's output (with wait)", 404: "No such active run",
                   422: "Invalid action"}),
    Endpoint("POST", "/runs", create_run, "Create a stateless background run", RunCreate, responses=_RUN),
    Endpoint("POST", "/runs/batch", create_batch, "Create stateless background runs in a batch", RunBatch,
             responses={200: "The runs, in order", 404: "Assistant not found", 422: "Invalid request (names the run)"}),
    Endpoint("POST", "/runs/cancel", cancel_runs, "Cancel a thread's runs by id, or every run of a status", RunsCancel,
             query={"action": Query(description="interrupt (keep their steps) or rollback (delete the runs)")},
             responses={204: "Cancelling", 404: "No run matches", 422: "Invalid request"}),
    Endpoint("POST", "/runs/stream", stream_run, "Create a stateless run and stream it", RunCreate,
             responses=_STREAM, media_type="text/event-stream"),
    Endpoint("POST", "/runs/wait", wait_run, "Create a stateless run and wait for its output", RunCreate,
             responses=_OUTPUT),
]
