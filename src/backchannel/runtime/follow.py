"""Following runs: one run's stream parts, or every run of a thread as it comes.

A thread's follower (LangGraph's ``GET /threads/{id}/stream``) sees the run
under way when it joins, then each later run from its first event: runs a
client starts, queued ones, and the wake-up runs the runtime starts when a
background task reports back to an idle thread. Each run's parts come in its
own stream modes, opened by ``metadata`` ``{run_id, attempt}`` and closed by
``metadata`` ``{"status": "run_done", "run_id"}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Literal

from backchannel.protocols import StreamPart
from backchannel.runtime.modes import StreamMapper, wants_values
from backchannel.runtime.rows import RunRow
from backchannel.runtime.storage import RunStorage
from backchannel.runtime.streams import RunStream, Streams
from backchannel.runtime.wire import render_error, render_run

__all__ = ["THREAD_STREAM_MODES", "Follower", "ThreadStreamMode"]

ThreadStreamMode = Literal["run_modes", "lifecycle"]
THREAD_STREAM_MODES: tuple[ThreadStreamMode, ...] = ("run_modes", "lifecycle")


class Follower:
    """Turns the streams this process keeps into stream parts for the clients that follow them."""

    def __init__(self, storage: RunStorage, streams: Streams) -> None:
        self.storage = storage
        self.streams = streams

    async def run(self, run: Mapping[str, Any], modes: Sequence[str] | None, after: int, *,
                  with_metadata: bool = True) -> AsyncIterator[StreamPart]:
        """The parts of a run's stream (``run`` as :func:`render_run` gives it), after event ``after``."""
        stream = self.streams.get(run["run_id"])
        if stream is None:
            return
        kwargs = run["kwargs"]
        modes = modes or kwargs.get("stream_mode") or ["values"]
        events = stream.follow(after, values=wants_values(modes))
        if with_metadata:
            yield StreamPart("metadata", {"run_id": run["run_id"], "attempt": 1})
        mapper = StreamMapper(modes, subgraphs=bool(kwargs.get("stream_subgraphs")),
                              metadata={k: v for k, v in run["metadata"].items() if k != "assistant_id"})
        async for event in events:
            for part in mapper.parts(event):
                yield part
        if stream.status == "error" and stream.error:  # LangGraph sends no error event for a timeout
            yield StreamPart("error", render_error(stream.error))

    async def thread(self, thread_id: str, modes: Sequence[ThreadStreamMode]) -> AsyncIterator[StreamPart]:
        """Every run of the thread from now on, one after the other, until the caller stops."""
        arrived: asyncio.Queue[RunRow] = asyncio.Queue()

        def on_new_run(row: RunRow, stream: RunStream) -> None:
            stream.expect_follower(values=wants_values(row.kwargs.get("stream_mode") or ()))
            arrived.put_nowait(row)

        stop = self.streams.watch_thread(thread_id, on_new_run)  # first: a run made meanwhile is not missed
        try:
            for row in await self.storage.active_runs(thread_id):  # under way and queued: from now on
                stream = self.streams.get(row.run_id)
                if stream is not None:
                    stream.expect_follower(values=wants_values(row.kwargs.get("stream_mode") or ()))
                    arrived.put_nowait(row)
            seen: set[str] = set()
            while True:
                row = await arrived.get()
                if row.run_id in seen:
                    continue
                seen.add(row.run_id)
                async for part in self.run(render_run(row), None, 0):
                    if "run_modes" in modes or part.event == "metadata":
                        yield part
                yield StreamPart("metadata", {"status": "run_done", "run_id": row.run_id})
        finally:
            stop()
