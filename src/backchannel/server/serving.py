"""Running the server: ``serve(...)`` behind ``backchannel serve``, and finding the agents to serve."""

from __future__ import annotations

import contextlib
import gc
import ipaddress
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from backchannel._imports import import_object
from backchannel.agent import Agent
from backchannel.server.connections import DEFAULT_CLIENT_TIMEOUT

if TYPE_CHECKING:
    from backchannel.runtime.retention import StoreTTLConfig, ThreadTTLConfig
    from backchannel.server.demo_page import DemoPage

__all__ = ["DEFAULT_PORT", "GC_YOUNG_THRESHOLD", "collect_for_serving", "import_agents", "is_loopback", "serve",
           "served"]

DEFAULT_PORT = 8123  # where langgraph_sdk clients look when given no URL
# The cyclic garbage collector's youngest generation is walked whole (with what it holds alive) each time this
# many objects more were made than freed; Python's default, 700, had a server with 1,000 live streams collect
# ~30 times a second, each walk over every stream's tasks, coroutines and futures in flight (~15 % of its CPU).
GC_YOUNG_THRESHOLD = 50_000


def import_agents(specs: Sequence[str]) -> dict[str, Agent]:
    """Agents named by ``[graph_id=]module:attribute`` specs (the attribute: an agent, or a dict of them).

    Without ``graph_id=``, an agent is served under its name, else the attribute's.
    """
    found: dict[str, Agent] = {}
    for spec in specs:
        graph_id, _, target = spec.rpartition("=")
        attribute = target.partition(":")[2]
        if not target.partition(":")[0] or not attribute:
            raise ValueError(f"--agents {spec!r}: expected [graph_id=]module:attribute, e.g. myapp.agents:supervisor")
        try:
            value = import_object(target)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"--agents {spec!r}: cannot load {target}: {exc}") from exc
        if isinstance(value, Mapping):
            found.update(_checked(spec, str(k), v) for k, v in value.items())
        else:
            found.update([_checked(spec, graph_id or value.name or attribute.rsplit(".", 1)[-1], value)])
    return found


def _checked(spec: str, graph_id: str, value: Any) -> tuple[str, Agent]:
    if not isinstance(value, Agent):
        raise ValueError(f"--agents {spec!r}: {graph_id!r} is a {type(value).__name__}, not an agent "
                         "(build one with create_agent or create_deep_agent)")
    return graph_id, value


def served(agent: Agent) -> Agent:
    """``agent`` as a server runs it: able to report back to a supervisor on another server.

    A run started as a background task of a remote supervisor carries its parent
    context in its input; the completion notifier (a no-op without one) sends the
    result back. It is added unless the agent has one.
    """
    from backchannel.notifier import CompletionNotifier

    if any(isinstance(mw, CompletionNotifier) for mw in agent.middleware):
        return agent
    return agent.copy(middleware=[*agent.middleware, CompletionNotifier()])


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(agents: Mapping[str, Agent], *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
          database: str | None = None, api_key: str | None = None, public_url: str | None = None,
          grace: float = 10.0, lease: float = 30.0, log_level: str = "info", demo_page: DemoPage | None = None,
          cors_origins: Sequence[str] | None = None, allowed_hosts: Sequence[str] | None = None,
          client_timeout: float = DEFAULT_CLIENT_TIMEOUT, max_concurrency: int = 256,
          on_ready: Callable[[], None] | None = None, thread_ttl: ThreadTTLConfig | None = None,
          store_ttl: StoreTTLConfig | None = None) -> None:
    """Serve ``agents`` over HTTP until SIGINT or SIGTERM (then: no new runs, ``grace`` seconds for running ones).

    ``database`` is the runtime's store URL (SQLite by default). ``public_url`` is
    where other servers reach this one (default ``http://host:port``); background
    tasks on other servers report back there. ``demo_page`` serves the demo's web
    page at ``/``; ``on_ready`` is called (from another thread) once the server accepts connections.
    With a Postgres ``database``, servers sharing it take a server's runs over once it has
    missed its heartbeats for ``lease`` seconds. ``cors_origins`` and ``allowed_hosts`` say which web
    pages may call it and under which names (see :func:`~backchannel.server.browsers.default_policy`).
    A client gets ``client_timeout`` seconds to send a request's headers or body, and to read what the
    server writes, before it is disconnected (:mod:`backchannel.server.connections`). At most
    ``max_concurrency`` runs execute at once in this process; the others wait in the queue.
    ``thread_ttl`` and ``store_ttl`` are the retention defaults (LangGraph's ``checkpointer.ttl``
    and ``store.ttl``). The process's garbage collector is set for a server (:func:`collect_for_serving`).
    """
    import uvicorn

    from backchannel.runtime import DEFAULT_STORE, LocalRuntime
    from backchannel.server.app import create_app
    from backchannel.server.browsers import default_policy
    from backchannel.server.connections import server_config

    url = public_url or f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
    runtime = LocalRuntime(database or DEFAULT_STORE, {graph_id: served(a) for graph_id, a in agents.items()},
                           public_url=url, lease=lease, heartbeat_interval=min(5.0, lease / 5),
                           max_concurrency=max_concurrency, thread_ttl=thread_ttl, store_ttl=store_ttl)
    runtime.storage.serve_alone(url)  # a second server on one SQLite file is refused, naming this one
    names = [host, urllib.parse.urlsplit(url).hostname or host]
    browsers = default_policy(api_key=api_key, cors_origins=cors_origins, allowed_hosts=allowed_hosts,
                              served_names=names)
    app = create_app(runtime, api_key=api_key, grace=grace, demo_page=demo_page, browsers=browsers,
                     client_timeout=client_timeout)
    _raise_descriptor_limit()
    server = uvicorn.Server(server_config(app, client_timeout=client_timeout, host=host, port=port,
                                          log_level=log_level, access_log=False,
                                          timeout_graceful_shutdown=int(grace) or None))
    collect_for_serving()
    if on_ready is not None:
        threading.Thread(target=_call_when_started, args=(server, on_ready), daemon=True).start()
    server.run()
    if not server.started:
        sys.exit(3)  # as uvicorn.run does when the server cannot start (e.g. the port is taken)


def collect_for_serving() -> None:
    """Set the garbage collector for a long-lived server holding many requests in flight: what is loaded
    so far (modules, agents, the app) is never looked at again (``gc.freeze``), and the youngest
    generation is collected every :data:`GC_YOUNG_THRESHOLD` objects rather than every 700."""
    gc.freeze()
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG_THRESHOLD), middle, old)


def _raise_descriptor_limit() -> None:
    """Let the server hold as many connections as the system allows this process (the soft limit is often 1,024)."""
    try:
        import resource
    except ImportError:  # Windows
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 65536, hard))


def _call_when_started(server: Any, callback: Callable[[], None]) -> None:
    """Calls ``callback`` once ``server`` listens (never, if it fails to start)."""
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    callback()
