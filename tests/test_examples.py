"""Every example in examples/ runs as it is, prints what it says, and is what the README shows."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from terminal import BACKCHANNEL, chat_env

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
README = (ROOT / "README.md").read_text()

# What each example must print (it is run from the examples directory, with its own HOME).
EXPECTED = {
    "agent.py": ["[agent] model call with 1 messages", "2 + 3 = 5", "lifecycle () {'event': 'completed'"],
    "runtime.py": ["['2+3?', '2 + 3 = 5', 'and 4+4?', '4 + 4 = 8']", "checkpoints"],
    "human_in_the_loop.py": ["'name': 'send_email'", "The email is sent."],
    "subagents.py": ["researcher {'type': 'toolCall'", "search finished",
                     "The researcher reports: Tea was first drunk in China, about 2700 BC."],
    "server.py": ["updates {'model':", "Hello! I am the offline scripted model"],
    "handoff.py": ["### Which came first, tea or coffee", "<current_thread_summary>",
                   "From my notes: Which came first"],
    "workspace.py": ["tea: oolong", "'content': 'take notes'"],
    "tracing.py": ["span: chat scripted", "span: execute_tool add", "span: invoke_agent calc",
                   "the run's usage: {'input_tokens': 240, 'output_tokens': 24, 'total_tokens': 264, 'model_calls': 2}",
                   "  tool add      success"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_example(name: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**chat_env(home), "PORT": str(free_port())}
    env.pop("PYTHONPATH")  # only what the example imports itself
    return subprocess.run([sys.executable, name], cwd=EXAMPLES, env=env, capture_output=True, text=True, timeout=120)


def test_every_example_is_checked_here():
    assert sorted(EXPECTED) == sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "mytools.py")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_runs_and_prints_what_it_says(name, tmp_path):
    result = run_example(name, tmp_path)
    assert result.returncode == 0, result.stderr
    for expected in EXPECTED[name]:
        assert expected in result.stdout, f"{name} did not print {expected!r}:\n{result.stdout[-3000:]}"


def test_the_examples_run_one_after_another_in_one_home(tmp_path):
    for name in sorted(EXPECTED):  # nothing one leaves behind (state, a scripted model's replies) breaks the next
        assert run_example(name, tmp_path).returncode == 0, name


def test_the_readme_shows_each_example_as_it_is():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README has no Python examples"
    shown = set()
    for block in blocks:
        header = re.match(r"# examples/(\w+\.py)", block)
        assert header, f"a README example that is not a file of examples/:\n{block[:200]}"
        assert block == (EXAMPLES / header.group(1)).read_text(), f"README and examples/{header.group(1)} differ"
        shown.add(header.group(1))
    assert shown == set(EXPECTED)
    [toml] = re.findall(r"```toml\n(.*?)```", README, re.S)
    assert toml == (EXAMPLES / "config.toml").read_text()


def test_the_chat_configuration_example_works_with_its_tools(tmp_path):
    result = subprocess.run([str(BACKCHANNEL), "run", "--config", "config.toml", "please research the history of tea",
                             "--database", f"sqlite:///{tmp_path}/state.db"],
                            cwd=EXAMPLES, env={**chat_env(tmp_path), "COLUMNS": "200"}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "model: offline scripted model" in out and "no model configured" not in out
    assert "agent › The researcher reports: Tea was first drunk in China, about 2700 BC." in out  # mytools.search
