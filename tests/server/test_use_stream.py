"""A LangGraph UI in a real browser: a page built with the SDK's React ``useStream`` hook (bundled with esbuild from
npm at test time), served from another origin than the server, in headless Chromium."""

from __future__ import annotations

import functools
import http.server
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from browser_agents import BROWSER_AGENTS, TYPED
from js_helpers import JS, node_modules
from server_helpers import ThreadServer

from backchannel.demo import DEFAULT_PROMPT
from backchannel.runtime import LocalRuntime
from backchannel.server import create_app, served

PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>useStream</title></head>
<body><div id="root"></div><script type="module" src="page.js"></script></body></html>"""


@pytest.fixture(scope="module")
def page_origin(tmp_path_factory) -> Iterator[str]:
    """The page, bundled by esbuild from tests/js, served by a static server on its own port (its own origin)."""
    modules = node_modules()
    root = tmp_path_factory.mktemp("page")
    (root / "index.html").write_text(PAGE)
    built = subprocess.run([str(modules / ".bin" / "esbuild"), "use_stream_page.jsx", "--bundle", "--format=esm",
                            f"--outfile={root / 'page.js'}", "--jsx=automatic", "--log-level=warning",
                            "--define:process.env.NODE_ENV=\"production\""], cwd=JS, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    handler = functools.partial(_Quiet, directory=str(root))
    static = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=static.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{static.server_address[1]}"
    static.shutdown()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def api(tmp_path_factory) -> Iterator[str]:
    """The backchannel server, keyless with its default browser policy (this machine's pages may call it)."""
    db = tmp_path_factory.mktemp("api") / "state.db"
    runtime = LocalRuntime(f"sqlite:///{db}", {name: served(agent) for name, agent in BROWSER_AGENTS.items()})
    with ThreadServer(create_app(runtime, heartbeat=0.5)) as live:
        yield live.url


def wait_for(browser: Any, condition: Any, what: str, timeout: float = 30) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda d: condition(), message=what)
    except Exception:
        raise AssertionError(f"{what}; page errors: {browser.execute_script('return window.__errors')}; "
                             f"messages: {texts(browser)}") from None


def texts(browser: Any, kind: str = "") -> list[str]:
    return browser.execute_script(
        f"return [...document.querySelectorAll('#messages .msg{'.' + kind if kind else ''}')].map(e => e.textContent)")


def open_page(browser: Any, page_origin: str, api: str, assistant: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{page_origin}/index.html?api={api}&assistant={assistant}")
    wait_for(browser, lambda: browser.find_elements(By.ID, "send"), "the page should render")


def send(browser: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    browser.find_element(By.ID, "prompt").send_keys(text)
    browser.find_element(By.ID, "send").click()


def test_a_message_streams_in_from_another_origin(browser, page_origin, api):
    open_page(browser, page_origin, api, "typist")
    assert page_origin.rsplit(":", 1)[1] != api.rsplit(":", 1)[1]  # two origins: every call is cross-origin
    send(browser, "type something")
    wait_for(browser, lambda: texts(browser, "ai") == [TYPED], "the reply should arrive whole")
    assert texts(browser, "human") == ["type something"]
    seen = browser.execute_script("return window.__aiTexts")
    partial = {t for t in seen if t and t != TYPED and TYPED.startswith(t.strip())}
    assert len(partial) >= 3, f"the reply should have streamed in word by word, the page showed {seen[:5]}"
    assert browser.execute_script("return window.__errors") == []


def test_approving_a_tool_call(browser, page_origin, api):
    from selenium.webdriver.common.by import By

    open_page(browser, page_origin, api, "mailer")
    send(browser, "hello Ada")
    approve = wait_for(browser, lambda: browser.find_elements(By.ID, "approve"), "the page should ask to approve")
    approve[0].click()
    wait_for(browser, lambda: "done: sent to ada@example.com: hello Ada" in texts(browser, "ai"),
             "the approved email should be sent and the run finish")
    assert texts(browser, "human") == ["hello Ada"]  # the conversation is kept across the resume
    assert not browser.find_elements(By.ID, "approve")
    assert browser.execute_script("return window.__errors") == []


def test_a_subagent_runs_beside_the_conversation(browser, page_origin, api):
    open_page(browser, page_origin, api, "delegator")
    send(browser, "look it up")

    def subagents() -> list[dict[str, str]]:
        return browser.execute_script("return [...document.querySelectorAll('#subagents .subagent')].map(e => "
                                      "({status: e.dataset.status, type: e.dataset.type, text: e.textContent}))")

    wait_for(browser, lambda: any(s["status"] == "running" and s["text"] for s in subagents()),
             "the subagent should show as running, with its messages")
    # While it runs, its messages stay its own: the main conversation is not replaced by the subagent's.
    assert texts(browser, "human") == ["look it up"] and not any("helper working" in t for t in texts(browser))
    running = subagents()[0]
    assert running["type"] == "helper"
    wait_for(browser, lambda: any("the helper said: helper working on look it up" in t for t in texts(browser, "ai")),
             "the supervisor's answer should arrive")
    wait_for(browser, lambda: subagents() and subagents()[0]["status"] == "complete", "the subagent should complete")
    assert texts(browser, "human") == ["look it up"]
    assert browser.execute_script("return window.__errors") == []


def test_a_background_result_arrives_live_without_a_reload(browser, page_origin, api):
    open_page(browser, page_origin, api, "supervisor")
    send(browser, DEFAULT_PROMPT)
    wait_for(browser, lambda: browser.execute_script(
        "return document.getElementById('thread').dataset.loading") == "false" and texts(browser, "ai"),
        "the supervisor's first run should end after dispatching its tasks")
    url = browser.current_url
    wait_for(browser, lambda: any("the verdict is Michael Jordan" in t for t in texts(browser, "ai")),
             "the synthesis of the wake-up runs should arrive on the page by itself", timeout=60)
    assert browser.current_url == url  # no reload
    assert any("Completed" in t for t in texts(browser, "human"))  # the task notifications, as the thread has them
    assert browser.execute_script("return window.__errors") == []
