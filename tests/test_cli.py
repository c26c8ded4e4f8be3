"""The one-shot commands: the demo, and threads, as a person runs them."""

from __future__ import annotations

import subprocess

from terminal import BACKCHANNEL, chat_env


def test_the_demo_shows_the_tasks_their_reports_and_the_verdict(tmp_path):
    result = subprocess.run([str(BACKCHANNEL), "demo", "--store", f"sqlite:///{tmp_path}/demo.db"],
                            env=chat_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "offline scripted model" in out
    assert "→ start_async_task(researcher: Research LeBron James" in out
    assert out.count("📬 researcher finished:") == 2 and "📬 analyst finished:" in out
    assert "the verdict is Michael Jordan" in out
    assert "background tasks" in out and out.count("success") >= 3
    thread = out.rsplit("thread ", 1)[1].split()[0]
    tree = subprocess.run([str(BACKCHANNEL), "threads", "tree", thread, "--store", f"sqlite:///{tmp_path}/demo.db"],
                          env=chat_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert tree.returncode == 0 and tree.stdout.count("researcher") == 2 and "analyst" in tree.stdout


def test_an_unknown_thread_is_a_clear_error(tmp_path):
    result = subprocess.run([str(BACKCHANNEL), "threads", "show", "nope", "--store", f"sqlite:///{tmp_path}/x.db"],
                            env=chat_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "error: NotFoundError: Thread with ID nope not found" in result.stderr
