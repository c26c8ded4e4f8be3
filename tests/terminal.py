"""A real terminal for the CLI tests: the program runs in a pseudo-terminal (pexpect), and what it draws
is rendered on an emulated screen (pyte), so tests read what a person would see."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pexpect
import pyte

TESTS = Path(__file__).resolve().parent
BACKCHANNEL = Path(sys.executable).with_name("backchannel")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][A-Z0-9]|\x1b[=>78cDEHM]")

CONFIG = """\
model = "chat_script:supervisor"
tools = ["chat_script:delete_file"]
approve_tools = ["delete_file"]

[[subagents]]
name = "researcher"
description = "Researches one subject"
model = "chat_script:researcher"
background = true
"""

# A chat whose background subagent logs and warns while the person is at the prompt.
NOISY = """\
model = "chat_script:supervisor"

[[subagents]]
name = "noisy"
description = "Makes noise"
model = "chat_script:noisy"
tools = ["chat_script:noisy_tool"]
background = true
"""
NOISY_ON_CUE = NOISY.replace("noisy_tool", "noisy_tool_on_cue")  # it makes its noise once ~/cue exists


def chat_env(home: Path) -> dict[str, str]:
    """The environment of a chat run: its own home, the scripted models importable, no real model keys."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("BACKCHANNEL_MODEL", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "PYTEST_CURRENT_TEST")}
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)  # the caller's tree too
    env.update(HOME=str(home), PYTHONPATH=path, TERM="xterm-256color", LANG="C.UTF-8", LC_ALL="C.UTF-8")
    return env


def write_config(home: Path, text: str = CONFIG) -> Path:
    path = home / ".backchannel" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


class Terminal:
    """A program in a 120x40 terminal; ``expect`` waits for text it printed, ``screen_shows`` for what is on screen."""

    def __init__(self, args: list[str], home: Path, cols: int = 120, rows: int = 40) -> None:
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.Stream(self.screen)
        self.child = pexpect.spawn(str(BACKCHANNEL), args, env=chat_env(home), dimensions=(rows, cols),
                                   encoding="utf-8", codec_errors="replace", cwd=str(home))
        # A real terminal answers queries such as the cursor position; prompt_toolkit asks.
        self.screen.write_process_input = self.child.send
        self.raw = ""
        self.seen = 0  # how far in the transcript the last expect matched
        self.ended = False

    def _pump(self, timeout: float) -> None:
        if self.ended:
            time.sleep(timeout)
            return
        try:
            data = self.child.read_nonblocking(65536, timeout)
        except pexpect.TIMEOUT:
            return
        except pexpect.EOF:
            self.ended = True
            return
        self.raw += data
        self.stream.feed(data)

    @property
    def transcript(self) -> str:
        """Everything the program printed, without terminal control sequences."""
        return _ANSI.sub("", self.raw).replace("\r", "")

    def display(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def expect(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """Wait until ``pattern`` (a regex) appears in what was printed after the previous match."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.compile(pattern).search(self.transcript, self.seen)
            if found:
                self.seen = found.end()
                return found
            if time.monotonic() > deadline or self.ended:
                raise AssertionError(f"{pattern!r} did not appear within {timeout}s; the screen shows:\n"
                                     f"{self.display()}\n--- printed since the last match:\n"
                                     f"{self.transcript[self.seen:][-3000:]}")
            self._pump(0.05)

    def screen_shows(self, pattern: str, timeout: float = 20) -> re.Match[str]:
        """Wait until the screen, as it is drawn now, matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            self._pump(0.05)
            found = re.search(pattern, self.display())
            if found:
                return found
            if time.monotonic() > deadline:
                raise AssertionError(f"the screen never matched {pattern!r}; it shows:\n{self.display()}")

    def type(self, text: str) -> None:
        """Type a line and press Enter."""
        self.child.send(text)
        self.settle(0.05)
        self.child.send("\r")

    def send(self, keys: str) -> None:
        self.child.send(keys)

    def settle(self, seconds: float = 0.2) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self._pump(0.02)

    def wait_exit(self, timeout: float = 20) -> int:
        deadline = time.monotonic() + timeout
        while not self.ended and time.monotonic() < deadline:
            self._pump(0.05)
        self.child.close()
        return self.child.exitstatus if self.child.exitstatus is not None else -(self.child.signalstatus or 0)

    def close(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)
