"""Headless Chromium (Debian's, driven by chromedriver through Selenium) for the browser tests."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--no-first-run", "--window-size=1400,1100")


def chromium_and_driver() -> tuple[str, str]:
    """Paths of Chromium and chromedriver; skips the test without them (fails it in CI, which installs them)."""
    binary = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    driver = shutil.which("chromedriver")
    if binary and driver:
        return binary, driver
    problem = ("Chromium and chromedriver are not installed: apt-get install -y chromium chromium-driver "
               "(.ci/run installs them)")
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI must test the web demo in Chromium, but {problem}")
    pytest.skip(problem)


def start_chromium(profile: Path) -> Any:
    """Headless Chromium on a fresh ``profile``, its console kept for the test to read."""
    binary, driver = chromium_and_driver()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    chrome = webdriver.Chrome(service=Service(driver), options=options)
    chrome.set_page_load_timeout(30)
    return chrome


def wait_for(browser: Any, condition: Any, timeout: float = 20, what: str = "") -> Any:
    """``condition()``'s first truthy value, polled every 50 ms (a timeout fails with ``what``)."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.05).until(lambda d: condition(), message=what)


def no_console_errors(browser: Any) -> None:
    """Fails if the page logged an error to the console."""
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
