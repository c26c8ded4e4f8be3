"""The README's examples do what it says."""

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_first_example_runs_and_prints_the_answer():
    result = subprocess.run([sys.executable, "-c", python_blocks()[0]], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "2 + 3 = 5" in result.stdout
    assert "model call with" in result.stdout  # the middleware ran


def test_the_commands_at_the_top_install_run_and_test():
    lines = README.read_text().splitlines()
    commands = [line for line in lines[:6] if line.startswith("python3 -m venv")]
    assert commands[0].endswith("# run the demo") and "backchannel demo" in commands[0]
    assert commands[1].endswith("# run the tests") and "pytest" in commands[1]
