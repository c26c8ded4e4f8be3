"""Traces across servers: exported over OTLP/HTTP by ``backchannel serve`` processes set up only by ``OTEL_*``
variables (a supervisor on one server and its background researcher on another land in one trace, linked back),
and continued from a caller's W3C trace context headers."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from server_helpers import ProcessServer
from test_remote_subagents import until_reported

from backchannel.runtime.remote import RemoteRuntime


class Receiver:
    """An OTLP/HTTP trace receiver on loopback: each span it gets, decoded, with its service's name."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, object]] = []
        self.content_types: set[str] = set()
        lock, spans, content_types = threading.Lock(), self.spans, self.content_types

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                with lock:
                    content_types.add(self.headers["content-type"])
                    for resource in request.resource_spans:
                        service = next(a.value.string_value for a in resource.resource.attributes
                                       if a.key == "service.name")
                        spans.extend((service, s) for scope in resource.scope_spans for s in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200 if self.path == "/v1/traces" else 404)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def named(self, name: str) -> list[tuple[str, object]]:
        return [(service, s) for service, s in list(self.spans) if s.name == name]


@pytest.fixture
def receiver():
    live = Receiver()
    yield live
    live.server.shutdown()


def otel_env(receiver: Receiver, service: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": service, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def attributes(span) -> dict[str, object]:
    return {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}


async def test_a_remote_subagent_lands_in_its_supervisors_trace(tmp_path, receiver):
    with ProcessServer(["remote_agents:researcher"], f"sqlite:///{tmp_path}/researcher.db",
                       env={"RESEARCHER_LATENCY": "0.5", **otel_env(receiver, "research-server")},
                       log=tmp_path / "researcher.log") as researcher_server, \
         ProcessServer(["remote_agents:supervisor"], f"sqlite:///{tmp_path}/supervisor.db",
                       env={"RESEARCHER_URL": researcher_server.url, **otel_env(receiver, "supervisor-server")},
                       log=tmp_path / "supervisor.log") as server:
        async with RemoteRuntime(server.url, api_key=None) as rt:
            thread = await rt.threads.create()
            await rt.runs.wait(thread["thread_id"], "supervisor", input="LeBron James")
            await until_reported(rt, thread["thread_id"])
        deadline = time.monotonic() + 20
        while not receiver.named("task_notification researcher") or len(receiver.named("invoke_agent supervisor")) < 2:
            assert time.monotonic() < deadline, [s.name for _, s in receiver.spans]
            await asyncio.sleep(0.1)

    assert receiver.content_types == {"application/x-protobuf"}
    ((start_service, start),) = receiver.named("execute_tool start_async_task")
    ((remote_service, remote),) = receiver.named("invoke_agent researcher")
    first = next(s for _, s in receiver.named("invoke_agent supervisor") if s.span_id == start.parent_span_id)
    assert (start_service, remote_service) == ("supervisor-server", "research-server")
    # The researcher's run, on the other server, is a child of the tool call that started it: one trace.
    assert remote.trace_id == start.trace_id == first.trace_id
    assert remote.parent_span_id == start.span_id
    assert attributes(remote)["gen_ai.agent.name"] == "researcher"
    assert attributes(start)["gen_ai.tool.name"] == "start_async_task"
    (remote_chat,) = [s for _, s in receiver.named("chat scripted") if s.parent_span_id == remote.span_id]
    assert attributes(remote_chat)["gen_ai.operation.name"] == "chat"
    assert attributes(remote_chat)["gen_ai.conversation.id"] == attributes(remote)["gen_ai.conversation.id"]
    # Its notification, taken in by the supervisor's next run (a trace of its own), links back to it.
    ((note_service, note),) = receiver.named("task_notification researcher")
    assert note_service == "supervisor-server"
    assert [(link.trace_id, link.span_id) for link in note.links] == [(remote.trace_id, remote.span_id)]
    woken = next(s for _, s in receiver.named("invoke_agent supervisor") if s.span_id == note.parent_span_id)
    assert woken.parent_span_id == b"" and woken.trace_id != first.trace_id


async def test_a_callers_trace_context_headers_make_the_run_part_of_its_trace(server):
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from backchannel.tracing import configure_tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    configure_tracing(provider)  # the server runs in a thread of this process
    trace_id, caller = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    try:
        async with httpx.AsyncClient(base_url=server.url) as http:
            thread = (await http.post("/threads", json={})).json()
            response = await http.post(f"/threads/{thread['thread_id']}/runs/wait", json={
                "assistant_id": "echo", "input": {"messages": [{"role": "user", "content": "hi"}]}},
                headers={"traceparent": f"00-{trace_id}-{caller}-01", "tracestate": "vendor=1"})
            assert response.status_code == 200
            (run,) = (await http.get(f"/threads/{thread['thread_id']}/runs")).json()
    finally:
        configure_tracing()
    assert run["kwargs"]["config"]["configurable"]["traceparent"] == f"00-{trace_id}-{caller}-01"
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent echo"]
    assert span.context.trace_id == int(trace_id, 16)
    assert span.parent.span_id == int(caller, 16) and span.parent.is_remote
