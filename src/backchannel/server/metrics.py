"""``/metrics``: the server in Prometheus' text format.

From the database (all processes sharing it): runs by status and the queue
(runs waiting to start). From this process: runs it executed to their end by
status, their latency histogram, the event streams open now, and the task
notifications it delivered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from starlette.requests import Request
from starlette.responses import Response

from backchannel.runtime.metrics import LATENCY_BUCKETS, RunMetrics
from backchannel.runtime.rows import RunStatus
from backchannel.server.routing import runtime_of

__all__ = ["CONTENT_TYPE", "metrics", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_STATUSES: tuple[RunStatus, ...] = ("pending", "running", "success", "error", "timeout", "interrupted")


async def metrics(request: Request) -> Response:
    rt = runtime_of(request)
    await rt.open()
    text = render_metrics(await rt.storage.count_runs_by_status(), rt.metrics, request.app.state.open_streams.count)
    return Response(text, media_type=CONTENT_TYPE)


def render_metrics(runs: Mapping[RunStatus, int], ran: RunMetrics, open_streams: int) -> str:
    """The exposition: every family with its HELP and TYPE lines, each status present (zero or not)."""
    return "".join(f"{line}\n" for line in _lines(runs, ran, open_streams))


Sample = tuple[str, str, float]  # name suffix ("", "_bucket", ...), labels ('{status="x"}' or ""), value


def _lines(runs: Mapping[RunStatus, int], ran: RunMetrics, open_streams: int) -> Iterator[str]:
    yield from _family("backchannel_runs", "gauge", "Runs in the database, by status.",
                       [("", f'{{status="{s}"}}', runs.get(s, 0)) for s in _STATUSES])
    yield from _family("backchannel_run_queue_depth", "gauge", "Runs in the database waiting to start.",
                       [("", "", runs.get("pending", 0))])
    yield from _family("backchannel_runs_ended_total", "counter", "Runs this process executed to their end, by status.",
                       [("", f'{{status="{s}"}}', ran.ended.get(s, 0)) for s in _STATUSES[2:]])
    yield from _family("backchannel_run_duration_seconds", "histogram",
                       "How long the runs this process executed took, from start to end.", _histogram(ran))
    yield from _family("backchannel_active_streams", "gauge", "Event streams (server-sent events) open now.",
                       [("", "", open_streams)])
    yield from _family("backchannel_task_notifications_delivered_total", "counter",
                       "Task notifications this process delivered to their threads.", [("", "", ran.notifications)])


def _family(name: str, kind: str, help: str, samples: list[Sample]) -> Iterator[str]:
    yield f"# HELP {name} {help}"
    yield f"# TYPE {name} {kind}"
    for suffix, labels, value in samples:
        yield f"{name}{suffix}{labels} {value}"


def _histogram(ran: RunMetrics) -> list[Sample]:
    samples: list[Sample] = []
    cumulative = 0
    for bound, count in zip((*LATENCY_BUCKETS, None), ran.latency_counts):
        cumulative += count
        samples.append(("_bucket", f'{{le="{"+Inf" if bound is None else bound}"}}', cumulative))
    return [*samples, ("_sum", "", ran.latency_sum), ("_count", "", cumulative)]
