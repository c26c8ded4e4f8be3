"""The one-shot commands as a person runs them: the demo, run, threads, and what the command line says."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from terminal import BACKCHANNEL, NOISY, chat_env, write_config

from backchannel import __version__


def cli(home: Path, *args: str, input: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BACKCHANNEL), *args], env={**chat_env(home), "COLUMNS": "200", **(env or {})},
                          capture_output=True, text=True, timeout=timeout, input=input, cwd=home)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_the_demo_shows_the_tasks_their_reports_and_the_verdict(tmp_path):
    database = f"sqlite:///{tmp_path}/demo.db"
    result = cli(tmp_path, "demo", "--database", database)
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert "offline scripted model" in out
    assert "→ start_async_task(researcher: Research LeBron James" in out
    assert out.count("📬 researcher finished:") == 2 and "📬 analyst finished:" in out
    assert "the verdict is Michael Jordan" in out
    assert "background tasks" in out and out.count("success") >= 3
    thread = re.search(r"thread ([0-9a-f-]{36})", out).group(1)
    tree = cli(tmp_path, "threads", "tree", thread[:8], "--database", database)  # the short id is enough
    assert tree.returncode == 0, tree.stderr
    assert tree.stdout.count("researcher") == 2 and "analyst" in tree.stdout
    shown = cli(tmp_path, "threads", "show", thread[:8], "--database", database)
    assert shown.returncode == 0 and "the verdict is Michael Jordan" in flat(shown.stdout)
    # The demo's scripted models report no tokens, but every call counts: the supervisor's and its tasks'.
    assert re.search(r"tokens › 0 tokens \(0 in, 0 out\) in \d+ model calls; researcher 0, analyst 0 \(its "
                     r"background tasks' included\)", flat(shown.stdout)), shown.stdout


def test_the_demo_keeps_its_own_state_and_the_chat_works_offline_right_after(tmp_path):
    demo = cli(tmp_path, "demo")
    assert demo.returncode == 0, demo.stderr
    state = tmp_path / ".backchannel"
    assert (state / "demo.db").exists() and not (state / "state.db").exists()
    thread = re.search(r"thread ([0-9a-f-]{36})", flat(demo.stdout)).group(1)
    assert f"backchannel threads tree {thread[:8]} --database sqlite:///~/.backchannel/demo.db" in flat(demo.stdout)
    chat = cli(tmp_path, input="hello there\n/quit\n")  # plain `backchannel`: no config, no key
    assert chat.returncode == 0, chat.stderr
    out = flat(chat.stdout)
    assert "offline scripted model" in out and "agent › " in out and "bye · thread" in out
    listed = cli(tmp_path, "threads")
    assert thread[:8] not in listed.stdout  # the chat's threads do not include the demo's


def test_run_works_offline_and_brings_back_its_background_results(tmp_path):
    result = cli(tmp_path, "run", "please research the history of tea")
    assert result.returncode == 0, result.stderr
    out = flat(result.stdout)
    assert "offline scripted model" in out
    assert "→ start_async_task(researcher: Research the history of tea)" in out
    assert "📬 researcher finished:" in out and "tea" in out.split("📬 researcher finished:")[1].lower()


def test_version_and_a_mistyped_command(tmp_path):
    version = cli(tmp_path, "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"backchannel {__version__}"
    typo = cli(tmp_path, "demoo")
    assert typo.returncode == 2
    assert "unknown command 'demoo'" in typo.stderr and "did you mean 'demo'?" in typo.stderr
    assert "chat, demo, run, threads, serve" in typo.stderr


@pytest.mark.parametrize("command", ["chat", "demo", "run", "threads", "serve"])
def test_every_flag_says_what_it_does_and_its_default(tmp_path, command):
    result = cli(tmp_path, command, "--help")
    assert result.returncode == 0, result.stderr
    options = re.split(r"\n(?=  -)", result.stdout.split("options:", 1)[1])
    for option in filter(str.strip, options):
        flag, _, described = option.strip().partition("  ")
        assert described.strip(), f"{command} {flag} has no help text"
    # One name for the database (--store-ttl is the store's retention, LangGraph's store.ttl).
    assert "--database" in result.stdout and not re.search(r"--store(?![-\w])", result.stdout)
    assert "--verbose" in result.stdout
    text = flat(result.stdout)
    if command == "demo":
        assert "(default: Who is the greater basketball player" in text
    if command == "serve":
        for default in ("--host HOST", "(default: 127.0.0.1)", "(default: 8123)", "(default: 10.0)"):
            assert default in text


def test_run_reads_the_config_and_model_takes_what_the_config_takes(tmp_path):
    write_config(tmp_path)
    configured = cli(tmp_path, "run", "hello there")
    assert configured.returncode == 0, configured.stderr
    assert "agent › You said: hello there" in configured.stdout
    (tmp_path / ".backchannel" / "config.toml").unlink()
    flagged = cli(tmp_path, "run", "hello there", "--model", "chat_script:supervisor")
    assert flagged.returncode == 0, flagged.stderr
    assert "You said: hello there" in flagged.stdout


def test_a_failed_run_or_demo_exits_non_zero(tmp_path):
    run = cli(tmp_path, "run", "hi", "--model", "chat_script:broken")
    assert run.returncode == 1
    assert "the run failed: ModelServerError: scripted 503: the provider is down" in flat(run.stdout + run.stderr)
    demo = cli(tmp_path, "demo", "--model", "chat_script:broken", "--database", f"sqlite:///{tmp_path}/d.db")
    assert demo.returncode == 1 and "the run failed" in flat(demo.stdout + demo.stderr)


def test_serve_refuses_a_model_it_cannot_use_at_start_up(tmp_path):
    database = f"sqlite:///{tmp_path}/x.db"
    unknown = cli(tmp_path, "serve", "--model", "foo:bar", "--database", database, timeout=60)
    assert unknown.returncode == 2 and "unknown provider 'foo'" in flat(unknown.stderr)
    keyless = cli(tmp_path, "serve", "--model", "openai:gpt-4o-mini", "--database", database, timeout=60)
    assert keyless.returncode == 2 and "OPENAI_API_KEY is not set" in flat(keyless.stderr)


def test_an_unknown_thread_is_a_clear_error(tmp_path):
    result = cli(tmp_path, "threads", "show", "nope", "--database", f"sqlite:///{tmp_path}/x.db")
    assert result.returncode == 1 and "error: no thread's id starts with 'nope'" in flat(result.stderr)


def test_warnings_always_show_and_verbose_or_backchannel_log_show_info_lines(tmp_path):
    write_config(tmp_path, NOISY)
    quiet = cli(tmp_path, "run", "make some noise", "--database", f"sqlite:///{tmp_path}/a.db")
    assert quiet.returncode == 0, quiet.stderr
    assert "a log line from the noisy tool" in quiet.stdout and "a Python warning from the noisy tool" in quiet.stdout
    assert "the noisy tool starts" not in quiet.stdout + quiet.stderr
    verbose = cli(tmp_path, "run", "make some noise", "--verbose", "--database", f"sqlite:///{tmp_path}/b.db")
    logged = cli(tmp_path, "run", "make some noise", "--database", f"sqlite:///{tmp_path}/c.db",
                 env={"BACKCHANNEL_LOG": "info"})
    for result in (verbose, logged):
        assert result.returncode == 0, result.stderr
        assert re.search(r"INFO\s+backchannel\.chat_script\s+the noisy tool starts", result.stdout)
