"""``/docs`` (the API reference page from the OpenAPI document) and ``/metrics`` (Prometheus)."""

from __future__ import annotations

import asyncio
import html

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_agents import AGENTS
from server_helpers import ThreadServer, user

from backchannel.runtime import LocalRuntime
from backchannel.server import create_app


async def test_docs_render_every_operation_of_the_openapi_document(server):
    async with httpx.AsyncClient(base_url=server.url) as http:
        page = await http.get("/docs")
        document = (await http.get("/openapi.json")).json()
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "<script" not in text and "src=" not in text  # nothing fetched from elsewhere: works offline
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            anchor = f'id="{operation["operationId"]}"'
            assert anchor in text, (method, path)
            section = text[text.index(anchor):].split("</section>")[0]
            assert method.upper() in section and html.escape(path) in section
            assert html.escape(operation["summary"], quote=True) in section
    runs = text[text.index('id="post_threads_thread_id_runs"'):].split("</section>")[0]
    for field in ("assistant_id", "multitask_strategy", "stream_mode", "command"):  # the body's fields
        assert f"<td>{field} " in runs, field
    assert "409" in runs and "422" in runs


def metric_families(text: str) -> dict[str, dict[tuple, float]]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def test_metrics_count_runs_queue_latency_streams_and_notifications(tmp_path):
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'db'}", {name: AGENTS[name] for name in ("echo", "slow", "looper")})
    with ThreadServer(create_app(runtime, heartbeat=0.2)) as live:
        async with httpx.AsyncClient(base_url=live.url, timeout=30) as http:
            async def scrape() -> dict[str, dict[tuple, float]]:
                answer = await http.get("/metrics")
                assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
                return metric_families(answer.text)

            empty = await scrape()
            assert empty["backchannel_runs"][(("status", "success"),)] == 0
            assert empty["backchannel_run_duration_seconds_count"][()] == 0
            tid = (await http.post("/threads", json={})).json()["thread_id"]
            for text in ("a", "b"):
                await http.post(f"/threads/{tid}/runs/wait", json={"assistant_id": "echo", "input": user(text)})
            await http.post("/runs/wait", json={"assistant_id": "looper", "input": user("x"),
                                                "config": {"recursion_limit": 1}})
            later = (await http.post("/threads", json={})).json()["thread_id"]
            await http.post(f"/threads/{later}/runs", json={"assistant_id": "echo", "input": user("later"),
                                                            "after_seconds": 600})
            note = {"role": "user", "content": "[task_id=t1][subagent=r] Completed. Result: done",
                    "additional_kwargs": {"task_notification": {"task_id": "t1", "subagent": "r",
                                                                "status": "success", "run_id": "r1"}}}
            await http.post(f"/threads/{tid}/runs", json={"assistant_id": "echo", "input": {"messages": [note]}})
            async with http.stream("POST", f"/threads/{tid}/runs/stream", json={
                    "assistant_id": "slow", "input": user("streaming")}) as streaming:
                lines = streaming.aiter_lines()
                await anext(lines)
                during = await scrape()
                async for _ in lines:
                    pass
            await asyncio.sleep(0.3)
            after = await scrape()
    assert during["backchannel_active_streams"][()] == 1 and after["backchannel_active_streams"][()] == 0
    runs = after["backchannel_runs"]
    assert runs[(("status", "pending"),)] == 1 and after["backchannel_run_queue_depth"][()] == 1
    assert runs[(("status", "success"),)] >= 4
    ended = after["backchannel_runs_ended_total"]
    assert ended[(("status", "error"),)] == 1  # the looper's, over its recursion limit
    assert runs[(("status", "error"),)] == 0  # a stateless run: it went with its thread
    assert ended[(("status", "success"),)] >= 4
    count = after["backchannel_run_duration_seconds_count"][()]
    buckets = after["backchannel_run_duration_seconds_bucket"]
    assert buckets[(("le", "+Inf"),)] == count == sum(ended.values())
    assert buckets[(("le", "0.25"),)] <= buckets[(("le", "1.0"),)] <= count  # cumulative
    assert after["backchannel_run_duration_seconds_sum"][()] > 0.4  # the slow run took 0.4 s at least
    assert after["backchannel_task_notifications_delivered_total"][()] == 1


@pytest.mark.parametrize("path", ["/metrics", "/docs"])
async def test_docs_and_metrics_need_the_api_key_when_there_is_one(path):
    runtime = LocalRuntime("memory", {"echo": AGENTS["echo"]})
    with ThreadServer(create_app(runtime, api_key="k")) as live:
        async with httpx.AsyncClient(base_url=live.url) as http:
            assert (await http.get(path)).status_code == 401
            assert (await http.get(path, headers={"x-api-key": "k"})).status_code == 200
