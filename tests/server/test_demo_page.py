"""The demo's web page: served only with the demo, by ``backchannel serve --demo`` and ``backchannel demo --web``,
and driven in a real headless Chromium against a real server on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import no_console_errors, wait_for
from server_helpers import ThreadServer, free_port

from backchannel import ScriptedModel
from backchannel.deep_agent import create_deep_agent
from backchannel.demo import DEFAULT_PROMPT, build_demo
from backchannel.runtime import LocalRuntime
from backchannel.server import DemoPage, create_app, served
from backchannel.subagents import SubAgent

LATENCY = 0.25  # the scripted models' time per reply: quick, yet each status lasts long enough to see


@contextlib.contextmanager
def demo_server(tmp_path: Path, agent: Any = None, *, page: DemoPage | None = None,
                api_key: str | None = None) -> Iterator[ThreadServer]:
    """A real server on loopback for ``agent`` (the offline demo by default) with the demo page."""
    runtime = LocalRuntime(f"sqlite:///{tmp_path / 'demo.db'}",
                           {"supervisor": served(agent or build_demo(latency=LATENCY))})
    app = create_app(runtime, api_key=api_key, heartbeat=0.5, grace=1.0,
                     demo_page=page or DemoPage())
    with ThreadServer(app) as live:
        yield live


# -- over HTTP --------------------------------------------------------------------------------


def test_the_api_alone_serves_no_page(server):
    assert httpx.get(f"{server.url}/").status_code == 404
    assert httpx.get(f"{server.url}/demo/demo.js").status_code == 404
    assert httpx.get(f"{server.url}/ok").json() == {"ok": True}


def test_the_demo_page_and_its_files_are_served_beside_the_api(tmp_path):
    page = DemoPage(prompt='Compare "A" <and> B')
    with demo_server(tmp_path, page=page) as live:
        index = httpx.get(f"{live.url}/")
        assert index.status_code == 200 and index.headers["content-type"] == "text/html; charset=utf-8"
        assert ">offline scripted model<" in index.text
        assert 'data-assistant="supervisor"' in index.text and 'data-offline="true"' in index.text
        assert 'data-prompt="Compare &quot;A&quot; &lt;and&gt; B"' in index.text  # escaped, never markup
        assert '<script src="/demo/demo.js"></script>' in index.text
        script = httpx.get(f"{live.url}/demo/demo.js")
        assert script.headers["content-type"].startswith("text/javascript") and "runs/stream" in script.text
        style = httpx.get(f"{live.url}/demo/demo.css")
        assert style.headers["content-type"].startswith("text/css") and ".card" in style.text
        # The API is the same as without the page, which its document does not list.
        assert "/" not in httpx.get(f"{live.url}/openapi.json").json()["paths"]
        assert httpx.get(f"{live.url}/assistants/supervisor").json()["graph_id"] == "supervisor"


def test_the_page_names_a_configured_model(tmp_path):
    page = DemoPage(model="openai:gpt-4o-mini")
    assert page.model_label == "model: openai:gpt-4o-mini"
    with demo_server(tmp_path, page=page) as live:
        index = httpx.get(f"{live.url}/").text
    assert ">model: openai:gpt-4o-mini<" in index and 'data-offline="false"' in index
    assert "offline scripted model" not in index


def test_with_an_api_key_the_page_loads_and_the_api_wants_the_key(tmp_path):
    with demo_server(tmp_path, api_key="s3cret") as live:
        for path in ("/", "/demo/demo.js", "/demo/demo.css"):
            assert httpx.get(f"{live.url}{path}").status_code == 200, path
        assert httpx.post(f"{live.url}/threads", json={}).status_code == 401
        assert httpx.post(f"{live.url}/threads", json={}, headers={"x-api-key": "s3cret"}).status_code == 200


def _wait_for_server(url: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and process.poll() is None:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                return
        time.sleep(0.05)
    process.kill()
    raise AssertionError(f"the server did not start:\n{process.communicate()[0]}")


@pytest.mark.parametrize("command", [["demo", "--web", "--no-browser", "--store"], ["serve", "--demo", "--database"]])
def test_the_commands_serve_the_page_with_the_demo_supervisor(tmp_path, command):
    port = free_port()
    args = [sys.executable, "-m", "backchannel.cli", *command, f"sqlite:///{tmp_path / 'state.db'}",
            "--port", str(port)]
    env = {k: v for k, v in os.environ.items() if k not in ("BACKCHANNEL_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY")}
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**env, "COLUMNS": "200"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_server(url, process)
        index = httpx.get(f"{url}/")
        assert index.status_code == 200 and ">offline scripted model<" in index.text
        assert httpx.get(f"{url}/assistants/supervisor").status_code == 200
    finally:
        process.send_signal(signal.SIGINT)
        output = process.communicate(timeout=30)[0]
    assert f"{url}/" in output  # the URL to open is printed
    assert "offline scripted model" in output


def test_the_page_files_are_in_the_wheel(tmp_path):
    pytest.importorskip("hatchling", reason="building the wheel needs hatchling (pip install hatchling)")
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    import zipfile

    (wheel,) = tmp_path.glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("index.html", "demo.js", "demo.css", "api.js", "timeline.html", "timeline.js", "timeline.css"):
        assert f"backchannel/server/web/{name}" in names


# -- in a real browser ------------------------------------------------------------------------

CARDS_JS = """return [...document.querySelectorAll('.card')].map((c) => ({
  task_id: c.dataset.taskId, subagent: c.dataset.subagent, status: c.dataset.status, history: c.dataset.history,
  description: c.querySelector('.desc').textContent, elapsed: c.querySelector('.elapsed').textContent}));"""


def cards(browser: Any) -> list[dict[str, str]]:
    return browser.execute_script(CARDS_JS)


def watch_cards(browser: Any, count: int, final: str, timeout: float = 30) -> dict[str, set[str]]:
    """Poll the cards until ``count`` of them are ``final``; every status seen on each, by task id."""
    seen: dict[str, set[str]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = cards(browser)
        for card in now:
            seen.setdefault(card["task_id"], set()).add(card["status"])
        if len(now) == count and all(c["status"] == final for c in now):
            return seen
        time.sleep(0.03)
    raise AssertionError(f"the cards did not all turn {final}: {cards(browser)}")


# Every status each card shows, as the page renders it: the test's own polling of the page can miss a short one
# on a loaded machine. A mutation observer's callback runs once the page's code yields, so two statuses set in one
# go (not shown live) are recorded as the last one twice.
RECORD_STATUSES_JS = """window.__statuses = [];
new MutationObserver((records) => { for (const r of records) window.__statuses.push([r.target.dataset.taskId,
  r.target.dataset.status]); }).observe(document.body, {subtree: true, attributes: true,
  attributeFilter: ["data-status"]});"""


def statuses_shown(browser: Any) -> dict[str, list[str]]:
    """The statuses each card showed since ``RECORD_STATUSES_JS`` ran, in turn, by task id."""
    shown: dict[str, list[str]] = {}
    for task_id, status in browser.execute_script("return window.__statuses"):
        if shown.get(task_id, [None])[-1] != status:
            shown.setdefault(task_id, []).append(status)
    return shown


def chat_texts(browser: Any, selector: str) -> list[str]:
    return browser.execute_script(
        f"return [...document.querySelectorAll({selector!r})].map((e) => e.textContent);")


def _said(browser: Any, text: str) -> bool:
    """Whether an AI message on the page contains ``text``."""
    return any(text in t for t in chat_texts(browser, ".msg.ai .text"))


def open_page(browser: Any, url: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get_log("browser")  # drop what earlier tests logged
    browser.get(url)
    wait_for(browser, lambda: browser.find_element(By.ID, "prompt").is_displayed(), what="the page did not load")


def test_the_seed_001_demo_in_a_browser(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with demo_server(tmp_path) as live:
        open_page(browser, f"{live.url}/")
        assert browser.find_element(By.ID, "model").text == "offline scripted model"
        assert browser.find_element(By.ID, "suggestion").text.endswith(DEFAULT_PROMPT)
        assert cards(browser) == []

        browser.execute_script(RECORD_STATUSES_JS)
        browser.find_element(By.ID, "prompt").send_keys(DEFAULT_PROMPT)
        browser.find_element(By.ID, "send").click()
        wait_for(browser, lambda: len(cards(browser)) == 3, what="three cards should appear")
        watch_cards(browser, 3, "complete")

        final = cards(browser)
        assert sorted(c["subagent"] for c in final) == ["analyst", "researcher", "researcher"]
        assert {c["task_id"]: c["history"] for c in final} == {c["task_id"]: "pending running complete" for c in final}
        shown = statuses_shown(browser)
        assert sorted(shown) == sorted(c["task_id"] for c in final), shown
        assert all(statuses[-2:] == ["running", "complete"] for statuses in shown.values()), shown  # live, in turn
        described = " ".join(c["description"] for c in final)
        assert "LeBron James" in described and "Michael Jordan" in described and "criteria" in described
        for card in final:  # the time each took, from pending to complete
            assert card["elapsed"].endswith("s") and 0.2 < float(card["elapsed"][:-1]) < 30, card

        # The supervisor comments on each result as it arrives, then gives its synthesis.
        wait_for(browser, lambda: "the verdict is Michael Jordan" in (chat_texts(browser, ".msg.ai .text") or [""])[-1],
                 what="the supervisor's synthesis should arrive")
        wait_for(browser, lambda: browser.find_element(By.ID, "send").is_enabled(), what="the turn should end")
        assert chat_texts(browser, ".msg.user .text") == [DEFAULT_PROMPT]
        notices = chat_texts(browser, ".notice")
        assert len(notices) == 3 and all("reported back" in n for n in notices), notices
        replies = [text for text in chat_texts(browser, ".msg.ai .text") if text]  # the first one only calls tools
        # a comment per researcher's result (two arriving together may share a reply)
        assert sum(r.count("is back:") for r in replies) == 2 and replies[0].startswith("I've put two researchers")
        assert len(chat_texts(browser, ".dispatch li")) == 3  # the three start_async_task calls
        assert browser.find_element(By.ID, "task-count").text == "all 3 reported back"  # the stream said so
        assert not browser.find_element(By.ID, "activity").is_displayed()

        # A card shows its task's result on click: the subagent's answer, from its thread's state.
        lebron = next(c for c in final if "LeBron" in c["description"])
        browser.find_element(By.CSS_SELECTOR, f'.card[data-task-id="{lebron["task_id"]}"]').click()
        result = browser.find_element(By.CSS_SELECTOR, f'.card[data-task-id="{lebron["task_id"]}"] .result')
        wait_for(browser, lambda: "4 NBA titles" in result.text, what="the result should show")
        state = httpx.get(f"{live.url}/threads/{lebron['task_id']}/state").json()
        assert result.text == [m for m in state["values"]["messages"] if m["type"] == "ai"][-1]["content"]

        shot = tmp_path / "web-demo.png"
        assert browser.save_screenshot(str(shot))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        # The thread is in the address: a reload draws the conversation and the cards again from the server.
        thread_id = browser.current_url.split("#thread=")[1]
        assert httpx.get(f"{live.url}/threads/{thread_id}").json()["status"] == "idle"
        browser.refresh()
        wait_for(browser, lambda: len(cards(browser)) == 3 and all(c["status"] == "complete" for c in cards(browser)),
                 what="the cards should come back after a reload")
        wait_for(browser, lambda: _said(browser, "the verdict is Michael Jordan"),
                 what="the conversation should come back after a reload")
        assert chat_texts(browser, ".msg.user .text") == [DEFAULT_PROMPT]
        no_console_errors(browser)


def test_results_that_wake_an_idle_supervisor_show_up_too(browser, tmp_path):
    """With completion="notify" the supervisor's run ends at once; each result is a new run the page follows."""
    from selenium.webdriver.common.by import By

    with demo_server(tmp_path, build_demo(latency=LATENCY, completion="notify")) as live:
        open_page(browser, f"{live.url}/")
        browser.find_element(By.ID, "suggestion").click()  # the suggested prompt, in one click
        watch_cards(browser, 3, "complete")
        wait_for(browser, lambda: _said(browser, "the verdict is Michael Jordan"),
                 what="the synthesis of a wake-up run should arrive")
        thread_id = browser.current_url.split("#thread=")[1]
        runs = httpx.get(f"{live.url}/threads/{thread_id}/runs", params={"limit": 20}).json()
        assert len(runs) >= 2  # the question's run, then the runs the results started
        assert chat_texts(browser, ".msg.user .text") == [DEFAULT_PROMPT]
        assert len(chat_texts(browser, ".notice")) == 3
        no_console_errors(browser)


def test_a_failing_subagent_turns_its_card_to_error(browser, tmp_path):
    from selenium.webdriver.common.by import By

    flaky = SubAgent("flaky", "Fails on purpose", background=True,
                     model=ScriptedModel([RuntimeError("the provider is down")], latency=LATENCY))
    supervisor = create_deep_agent(ScriptedModel([
        {"tool_calls": [{"name": "start_async_task", "args": {"subagent_type": "flaky", "description": "Try it"}}]},
        "Started the flaky one.", "The flaky task failed; I'll answer without it."]),
        subagents=[flaky], general_purpose=False, completion="wait", name="supervisor")
    with demo_server(tmp_path, supervisor) as live:
        open_page(browser, f"{live.url}/")
        browser.find_element(By.ID, "prompt").send_keys("go")
        browser.find_element(By.ID, "send").click()
        watch_cards(browser, 1, "error")
        (card,) = cards(browser)
        assert card["subagent"] == "flaky" and card["history"] == "pending running error"
        wait_for(browser, lambda: any("answer without it" in t for t in chat_texts(browser, ".msg.ai .text")),
                 what="the supervisor should answer after the failure")
        assert browser.find_elements(By.CSS_SELECTOR, ".notice.error")  # the notification, shown as a failure
        browser.find_element(By.CSS_SELECTOR, ".card").click()
        result = browser.find_element(By.CSS_SELECTOR, ".card .result")
        wait_for(browser, lambda: result.text == "The task failed before it finished.", what="the failure")
        assert "provider is down" not in browser.page_source  # internals stay on the server


def test_the_page_asks_for_the_api_key_a_server_wants(browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    with demo_server(tmp_path, api_key="s3cret") as live:
        open_page(browser, f"{live.url}/")
        browser.find_element(By.ID, "suggestion").click()
        alert = WebDriverWait(browser, 10).until(expected_conditions.alert_is_present())
        assert "API key" in alert.text
        alert.send_keys("s3cret")
        alert.accept()
        watch_cards(browser, 3, "complete")
        wait_for(browser, lambda: _said(browser, "the verdict is Michael Jordan"),
                 what="the run should go through with the key")


def test_a_new_conversation_leaves_the_running_one_to_the_server(browser, tmp_path):
    from selenium.webdriver.common.by import By

    with demo_server(tmp_path) as live:
        open_page(browser, f"{live.url}/")
        browser.find_element(By.ID, "suggestion").click()
        wait_for(browser, lambda: [c["status"] for c in cards(browser)] == ["running"] * 3, what="three running cards")
        first = browser.current_url.split("#thread=")[1]
        browser.find_element(By.ID, "new-chat").click()
        assert cards(browser) == [] and chat_texts(browser, ".msg, .notice") == []
        assert browser.find_element(By.ID, "welcome").is_displayed() and "#thread=" not in browser.current_url

        browser.find_element(By.ID, "suggestion").click()  # the new conversation works on its own thread
        watch_cards(browser, 3, "complete")
        second = browser.current_url.split("#thread=")[1]
        assert second != first and len(cards(browser)) == 3
        wait_for(browser, lambda: _said(browser, "the verdict is Michael Jordan"),
                 what="the new conversation's synthesis")
        # The first conversation's run was not cancelled: it finished on the server.
        deadline = time.monotonic() + 20
        while httpx.get(f"{live.url}/threads/{first}").json()["status"] != "idle" and time.monotonic() < deadline:
            time.sleep(0.1)
        (run,) = httpx.get(f"{live.url}/threads/{first}/runs").json()
        assert run["status"] == "success"
        assert len(chat_texts(browser, ".notice")) == 3 and not chat_texts(browser, ".notice.alert")
        no_console_errors(browser)
