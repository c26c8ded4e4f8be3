"""Worker threads for sync tools: a cheaper hand-off than ``asyncio.to_thread``.

A call is one queue put on the way there and one ``call_soon_threadsafe`` on
the way back: no ``concurrent.futures`` future to chain to an asyncio one, which
roughly halves what ``to_thread`` adds to a trivial call. A call that finds no
idle thread starts a new one, so a tool that hangs (a network call that never
answers) holds only its own thread and never starves the others, up to
:data:`MAX_THREADS`. Threads stay for the next calls and end after
:data:`IDLE_SECONDS` without one; they are daemons, so a tool stuck forever
does not keep the interpreter alive. Python cannot stop a thread: a call whose
caller was cancelled runs on until the function returns, and its result is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["IDLE_SECONDS", "MAX_THREADS", "run_in_thread"]

MAX_THREADS = 512  # past this many busy threads, calls wait their turn
IDLE_SECONDS = 60.0

_Job = tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], contextvars.Context, Callable[..., Any], dict[str, Any]]

_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_idle = threading.Semaphore(0)  # one token per thread waiting for a job
_threads: set[threading.Thread] = set()
_lock = threading.Lock()
_started = 0


def run_in_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """``fn(**kwargs)`` in a worker thread, in a copy of the caller's context variables."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    _jobs.put((loop, future, contextvars.copy_context(), fn, kwargs))
    if not _idle.acquire(blocking=False):
        _add_thread()
    return future


def _add_thread() -> None:
    global _started
    with _lock:
        if len(_threads) < MAX_THREADS:
            _started += 1
            thread = threading.Thread(target=_work, name=f"backchannel-tool-{_started}", daemon=True)
            _threads.add(thread)
            thread.start()


def _work() -> None:
    while True:
        try:
            loop, future, context, fn, kwargs = _jobs.get(timeout=IDLE_SECONDS)
        except queue.Empty:
            # Take back this thread's idle token and end; if every token is spoken for, a job is on its way.
            if _idle.acquire(blocking=False):
                with _lock:
                    _threads.discard(threading.current_thread())
                return
            continue
        try:
            result = context.run(fn, **kwargs)
        except StopIteration as exc:  # an asyncio future refuses it
            _settle(loop, future, None, RuntimeError(f"the function raised {exc!r}"))
        except BaseException as exc:  # handed to the awaiting task, as to_thread does
            _settle(loop, future, None, exc)
        else:
            _settle(loop, future, result, None)
        del loop, future, context, fn, kwargs  # don't keep the last job alive while idle
        _idle.release()


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], result: Any,
            exc: BaseException | None) -> None:
    try:
        loop.call_soon_threadsafe(_resolve, future, result, exc)
    except RuntimeError:  # the loop has closed: nobody is waiting any more
        pass


def _resolve(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.cancelled():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
