"""The timeline of a thread: ``GET /threads/{id}/timeline`` and the ``/timeline`` page that draws it, in a real
headless Chromium against a real server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from browser_helpers import no_console_errors, wait_for
from server_helpers import ThreadServer
from subagent_helpers import notes
from tracing_agents import supervisor

from backchannel.demo import DEFAULT_PROMPT, build_demo
from backchannel.errors import NotFoundError
from backchannel.runtime import LocalRuntime
from backchannel.runtime.remote import RemoteRuntime
from backchannel.server import DemoPage, create_app, served


@contextlib.contextmanager
def traced_server(tmp_path: Path, api_key: str | None = None) -> Iterator[ThreadServer]:
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'state.db'}", {"supervisor": served(supervisor())})
    with ThreadServer(create_app(runtime, api_key=api_key, heartbeat=0.5, grace=1.0)) as live:
        yield live


async def worked_thread(url: str, api_key: str | None = None) -> str:
    """A thread where the supervisor ran its sync subagent, two background ones and a failing tool, and took
    both notifications in."""
    async with RemoteRuntime(url, api_key=api_key) as rt:
        thread = await rt.threads.create()
        tid = thread["thread_id"]
        await rt.runs.wait(tid, "supervisor", input="go")
        deadline = time.monotonic() + 20
        while True:
            messages = (await rt.threads.get_state(tid))["values"]["messages"]
            busy = any(r["status"] in ("pending", "running") for r in await rt.runs.list(tid, limit=20))
            if len(notes(messages)) == 2 and messages[-1]["type"] == "ai" and not busy:
                return tid
            assert time.monotonic() < deadline, messages
            await asyncio.sleep(0.1)


async def test_the_timeline_over_http(tmp_path):
    with traced_server(tmp_path, api_key="s3cret") as live:
        tid = await worked_thread(live.url, api_key="s3cret")
        async with RemoteRuntime(live.url, api_key="s3cret") as rt:
            timeline = await rt.timeline(tid)
            try:
                await rt.timeline("no-such-thread")
                raise AssertionError("a missing thread has no timeline")
            except NotFoundError:
                pass
        assert httpx.get(f"{live.url}/threads/{tid}/timeline").status_code == 401  # the data wants the key
        for path, kind in (("/timeline", "text/html"), ("/timeline/timeline.js", "text/javascript"),
                           ("/timeline/timeline.css", "text/css")):
            page = httpx.get(f"{live.url}{path}")  # the page's files do not
            assert page.status_code == 200 and page.headers["content-type"].startswith(kind), path
        assert "/threads/{thread_id}/timeline" in httpx.get(f"{live.url}/openapi.json",
                                                           headers={"x-api-key": "s3cret"}).json()["paths"]
    assert [lane["name"] for lane in timeline["threads"]][0] == "supervisor"
    assert sorted(lane["name"] for lane in timeline["threads"][1:]) == ["analyst", "writer"]
    assert timeline["usage"]["subagents"].keys() == {"researcher", "analyst", "writer"}


TIMELINE_JS = """return {
  lanes: [...document.querySelectorAll('.row.lane')].map((r) => r.dataset.threadId),
  rows: [...document.querySelectorAll('.row:not(.lane)')].map((r) => ({
    kind: r.dataset.kind, name: r.dataset.name, status: r.dataset.status, thread: r.dataset.thread,
    error: r.classList.contains('error'), label: r.querySelector('.label').textContent,
    left: r.querySelector('.bar').getBoundingClientRect().left,
    width: r.querySelector('.bar').getBoundingClientRect().width})),
  arrows: [...document.querySelectorAll('#arrows path[data-kind]')].map((p) => p.dataset.kind),
  stats: [...document.querySelectorAll('.stat')].map((s) => s.textContent)};"""


def rows_of(page: dict[str, Any], **match: Any) -> list[dict[str, Any]]:
    return [r for r in page["rows"] if all(r[k] == v for k, v in match.items())]


async def test_the_timeline_page_in_a_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with traced_server(tmp_path) as live:
        tid = await worked_thread(live.url)
        timeline = httpx.get(f"{live.url}/threads/{tid}/timeline").json()
        browser.get_log("browser")
        browser.get(f"{live.url}/timeline?thread={tid}")
        wait_for(browser, lambda: browser.find_element(By.ID, "chart").is_displayed(), what="the chart")
        page = browser.execute_script(TIMELINE_JS)
        no_console_errors(browser)
        shot = Path(os.environ.get("TIMELINE_SCREENSHOT", tmp_path / "timeline.png"))
        assert browser.save_screenshot(str(shot))

    lanes = timeline["threads"]
    assert page["lanes"] == [lane["thread_id"] for lane in lanes]  # the supervisor's, then one per task
    spans = [s for lane in lanes for run in lane["runs"] for s in run["spans"]]
    assert len(page["rows"]) == len(spans)  # every recorded span has its row
    supervisor_rows = rows_of(page, thread=tid)
    assert [r["label"] for r in rows_of(page, thread=tid, kind="run")][0] == "supervisor run"
    (failed,) = rows_of(page, name="flaky")
    assert failed["error"] and "flaky failed on 7" in failed["label"]
    (researcher,) = rows_of(page, kind="subagent")
    assert researcher["name"] == "researcher" and researcher in supervisor_rows
    assert len(rows_of(page, kind="notification")) == 2
    for lane in lanes[1:]:
        assert rows_of(page, thread=lane["thread_id"], kind="run"), lane["name"]
    # Bars sit on one time axis: a call starts no earlier than its run, and the first run starts first.
    first_run = rows_of(page, thread=tid, kind="run")[0]
    assert all(r["left"] >= first_run["left"] - 1 for r in page["rows"])
    # A dashed line from each start_async_task call to its task; an arrow back from each task's run.
    assert sorted(page["arrows"]) == ["note", "note", "spawn", "spawn"]
    total = timeline["usage"]["total_tokens"]
    assert any(stat.startswith(f"{total:,}") and "tokens" in stat for stat in page["stats"]), page["stats"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


async def test_each_card_of_the_web_demo_links_to_its_task_on_the_timeline(browser, tmp_path):
    from selenium.webdriver.common.by import By

    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'demo.db'}", {"supervisor": served(build_demo(latency=0.1))})
    with ThreadServer(create_app(runtime, heartbeat=0.5, grace=1.0, demo_page=DemoPage())) as live:
        browser.get(f"{live.url}/")
        wait_for(browser, lambda: browser.find_element(By.ID, "prompt").is_displayed(), what="the demo page")
        browser.find_element(By.ID, "prompt").send_keys(DEFAULT_PROMPT)
        browser.find_element(By.ID, "send").click()
        wait_for(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".card.complete")) == 3, timeout=40,
                 what="three finished cards")
        thread_id = browser.execute_script("return location.hash.split('thread=')[1];")
        links = {card.get_attribute("data-task-id"): card.find_element(By.CSS_SELECTOR, "a.timeline")
                 for card in browser.find_elements(By.CSS_SELECTOR, ".card")}
        for task_id, link in links.items():
            assert link.get_attribute("href") == f"{live.url}/timeline?thread={thread_id}&focus={task_id}"
            assert link.get_attribute("target") == "_blank"
        task_id = next(iter(links))
        browser.get(links[task_id].get_attribute("href"))
        wait_for(browser, lambda: len(browser.find_elements(By.CSS_SELECTOR, ".row.lane")) == 4,
                 what="the supervisor's lane and one per task")
        focused = browser.find_elements(By.CSS_SELECTOR, ".row.lane.focus")
        assert [lane.get_attribute("data-thread-id") for lane in focused] == [task_id]
        no_console_errors(browser)
