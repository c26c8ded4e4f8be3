"""The interactive chat, driven as a person would: a real terminal, a scripted model (tests/chat_script.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import subprocess
import time
from pathlib import Path

import pytest
from terminal import BACKCHANNEL, NOISY_ON_CUE, Terminal, chat_env, write_config

from backchannel.runtime import LocalRuntime


@pytest.fixture
def home(tmp_path: Path) -> Path:
    write_config(tmp_path)
    return tmp_path


@pytest.fixture
def chat(home):
    """``chat(*args)``: start ``backchannel`` (the chat) in a terminal and wait for its prompt."""
    started: list[Terminal] = []

    def start(*args: str) -> Terminal:
        terminal = Terminal([*args, "--store", f"sqlite:///{home}/state.db"], home)
        started.append(terminal)
        terminal.thread = terminal.expect(r"thread ([0-9a-f]{8}) · /help").group(1)
        terminal.screen_shows(r"(?m)^›")
        return terminal

    yield start
    for terminal in started:
        terminal.close()


def memory_file(home: Path) -> Path:
    return home / ".backchannel" / "agents" / "agent" / "agent.md"


def wait_until(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


async def stored_threads(home: Path) -> list[dict]:
    async with LocalRuntime(f"sqlite:///{home}/state.db") as rt:
        return await rt.threads.search(metadata={"graph_id": "agent"}, limit=100)


def test_a_conversation_with_a_background_task_that_reports_back_by_itself(chat):
    t = chat()  # `backchannel` with no command is the chat
    t.type("hello there")
    t.expect(r"agent › You said: hello there")
    t.type("please research tea")
    t.expect(r"→ start_async_task\(researcher: Research the history of tea\)")
    t.expect(r"agent › I started a researcher on it in the background\.")
    t.screen_shows(r"background tasks\s*\n.*researcher\s+running\s+0:0\d\s+Research the history of tea")
    t.send("what about ")  # typing while the task works: the prompt stays usable
    t.expect(r"📬 researcher finished: Tea was first drunk in China, about 2700 BC\.")
    t.expect(r"agent › The researcher reports: Tea was first drunk in China")
    t.screen_shows(r"researcher\s+success\s+0:0[1-9]")
    t.screen_shows(r"background tasks · all reported")  # the last pending task has been heard
    t.screen_shows(r"› what about")  # the half-typed line survived the notification
    t.type("coffee")
    t.expect(r"agent › You said: what about coffee")
    t.type("/tasks")
    t.expect(r"[0-9a-f]{8}\s+researcher\s+success\s+0:0\d\s+Research the history of tea")
    t.type("/quit")
    t.expect(rf"bye · thread {t.thread}")
    assert t.wait_exit() == 0


def test_handoff_preview_then_accept_seeds_the_new_thread_and_clears_after_its_first_reply(chat, home):
    memory = memory_file(home)
    t = chat("chat")
    t.type("hello there")
    t.expect(r"You said: hello there")
    t.type("please research tea")
    t.expect(r"The researcher reports")
    t.type("/handoff --preview")
    t.expect(r"handoff summary · [0-9a-f]{8}")
    t.expect(r"Tea research")
    t.expect(r"preview only: nothing changed")
    assert not memory.exists()

    t.type("/handoff")
    t.expect(r"The user asked about the history of tea\.")
    t.expect(r"TL;DR: Tea began in China\.")
    t.expect(r"accept, edit or reject\? \[a/e/r\]")
    t.type("a")
    child = t.expect(r"continuing in a new thread ([0-9a-f]{8})").group(1)
    text = memory.read_text()
    assert "### Tea research" in text and "- A researcher found that tea was first drunk in China." in text
    t.screen_shows(rf"thread {child} · /help")
    t.type("where were we?")
    t.expect(r"agent › From my notes: Tea research\.")  # the summary was in the child's first system prompt
    wait_until(lambda: "<current_thread_summary>\nNone recorded yet.\n</current_thread_summary>" in memory.read_text())
    t.type("where were we, again?")
    t.expect(r"agent › I have no notes about earlier threads\.")
    t.type("/quit")
    assert t.wait_exit() == 0

    threads = {th["thread_id"][:8]: th for th in asyncio.run(stored_threads(home))}
    assert set(threads) == {t.thread, child}
    parent, new = threads[t.thread], threads[child]
    assert new["metadata"]["parent_thread_id"] == parent["thread_id"]
    assert new["metadata"]["handoff_source_thread_id"] == parent["thread_id"]
    assert new["metadata"]["handoff_pending"] is False
    assert parent["metadata"]["last_handoff"]["child_thread_id"] == new["thread_id"]


def test_handoff_reject_changes_nothing_and_edit_saves_the_edited_summary(chat, home):
    memory = memory_file(home)
    memory.parent.mkdir(parents=True)
    memory.write_text("# Notes\nPrefer short answers.\n")
    t = chat()
    t.type("hello there")
    t.expect(r"You said: hello there")
    t.type("/handoff")
    t.expect(r"accept, edit or reject\?")
    t.type("r")
    t.expect(r"handoff rejected: nothing changed")
    assert memory.read_text() == "# Notes\nPrefer short answers.\n"
    assert len(asyncio.run(stored_threads(home))) == 1
    t.type("hello again")
    t.expect(r"You said: hello again")  # the thread goes on

    t.type("/handoff")
    t.expect(r"accept, edit or reject\?")
    t.type("e")
    t.expect(r"edit the summary \(Esc Enter to save\)")
    t.screen_shows(r"TL;DR")
    t.send("\x1b[1;5F")  # Ctrl-End: to the end of the summary
    t.send("\r- Also: try oolong.")
    t.settle()
    t.send("\x1b\r")  # Esc Enter saves
    t.expect(r"continuing in a new thread")
    text = memory.read_text()
    assert text.startswith("# Notes\nPrefer short answers.\n")
    assert "- Also: try oolong." in text and "### Tea research" in text


def test_ctrl_c_cancels_the_reply_and_a_second_one_leaves(chat):
    t = chat()
    t.type("be slow")
    t.expect(r"working…")
    t.send("\x03")
    t.expect(r"cancelling… \(Ctrl-C again to leave\)")
    t.expect(r"cancelled")
    t.type("hello again")
    t.expect(r"agent › You said: hello again")
    t.type("be slow once more")
    t.expect(r"working…")
    t.send("\x03")
    t.expect(r"Ctrl-C again to leave")
    t.send("\x03")
    t.expect(rf"bye · thread {t.thread}")
    assert t.wait_exit() == 0


def test_a_tool_waiting_for_approval_is_rejected_then_approved(chat, home):
    notes = home / "notes.txt"
    notes.write_text("keep me")
    t = chat()
    t.type("delete notes")
    t.expect(r"approval needed")
    t.expect(r'"path": "notes.txt"')
    t.expect(r"approve / edit / reject / respond\?")
    t.type("r")
    t.expect(r"reason \(optional\):")
    t.type("I still need it")
    t.expect(r"The tool said: User rejected the tool call for `?delete_file`? with reason: I still need it")
    assert notes.exists()
    t.type("delete notes")
    t.expect(r"approve / edit / reject / respond\?")
    t.type("a")
    t.expect(r"The tool said: deleted notes\.txt")
    assert not notes.exists()


def test_a_background_task_can_be_cancelled(chat):
    t = chat()
    t.type("research it at a leisurely pace")
    t.expect(r"I started a researcher on it in the background")
    t.screen_shows(r"researcher\s+running")
    t.type("/tasks")
    task = t.expect(r"([0-9a-f]{8})\s+researcher\s+running").group(1)
    t.type(f"/cancel {task}")
    t.expect(rf"task {task} \(researcher\): cancelled")
    t.screen_shows(r"researcher\s+cancelled")
    t.type("/cancel zzz")
    t.expect(rf"/cancel needs the id of one task of this thread \(known: {task}\)")
    t.settle(1.0)
    assert "📬" not in t.transcript  # a cancelled task does not report back


def test_the_tokens_of_the_thread_are_on_the_status_line_and_in_detail_with_slash_tokens(chat):
    t = chat()
    t.type("hello there")
    t.expect(r"You said: hello there")
    t.screen_shows(rf"1,234 tokens · thread {t.thread} · /help")  # each reply of chat_script reports 1,234
    t.type("hello again")
    t.expect(r"You said: hello again")
    t.screen_shows(rf"2,468 tokens · thread {t.thread} · /help")
    t.type("/tokens")
    t.expect(r"this thread: 2,468 tokens \(2,400 in, 68 out\) in 2 model calls")
    t.type("/new")
    t.expect(r"new thread [0-9a-f]{8}")
    t.type("/tokens")
    t.expect(r"this thread: no model calls")
    t.type(f"/resume {t.thread}")
    t.screen_shows(rf"2,468 tokens · thread {t.thread} · /help")  # a thread opened again shows its own


def test_slash_commands_threads_resume_model_compact_and_hints(chat):
    t = chat()
    t.type("hello there")
    t.expect(r"You said: hello there")
    t.type("/hnadoff")
    t.expect(r"unknown command /hnadoff: did you mean /handoff\? /help lists the commands")
    t.type("/help")
    t.expect(r"/handoff \[--preview \| --apply\]\s+continue in a new thread")
    t.type("/new")
    second = t.expect(r"new thread ([0-9a-f]{8})").group(1)
    t.type("second thread here")
    t.expect(r"You said: second thread here")
    t.type("/compact")
    t.expect(r"nothing to compact yet")
    t.type("/threads")
    t.expect(rf"●\s+{second}\s.*second thread here")
    t.expect(rf"{t.thread}\s.*hello there")
    t.type(f"/resume {t.thread}")
    t.expect(r"you › hello there")
    t.expect(r"agent › You said: hello there")
    t.expect(rf"now in thread {t.thread}")
    t.type("/resume ffffffff")
    t.expect(r"no thread of agent starts with 'ffffffff'")
    t.type("/model")
    t.expect(r"model: chat_script:supervisor")
    t.type("/model nope:thing")
    t.expect(r"unknown model provider 'nope'")
    for i in range(3):
        t.type(f"message {i}")
        t.expect(rf"You said: message {i}")
    t.type("/compact")
    t.expect(r"compacted 2 messages into a summary; ≈\d+ → \d+ tokens")  # 8 messages, the last 6 kept
    t.type("after compacting")
    t.expect(r"You said: after compacting")


def test_piped_input_works_without_a_terminal(home):
    result = subprocess.run([str(BACKCHANNEL), "--store", f"sqlite:///{home}/state.db"], env=chat_env(home),
                            input="hello there\n/quit\n", capture_output=True, text=True, timeout=60, cwd=home)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "You said: hello there" in result.stdout and "bye · thread" in result.stdout


@contextlib.contextmanager
def serving(home: Path, *agents: str):
    """``backchannel serve --agents ...`` on a free loopback port, with its own home; yields its URL."""
    import socket

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([str(BACKCHANNEL), "serve", "--port", str(port), "--database",
                                f"sqlite:///{home}/server.db", "--agents", *agents],
                               env=chat_env(home), cwd=home, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if httpx.get(f"{url}/ok", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "backchannel serve did not start"
            time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture
def server(home):
    """``backchannel serve`` for the chat's agent."""
    with serving(home, "chat_script:agent") as url:
        yield url


def test_the_chat_works_the_same_with_an_assistant_on_a_server(server, home):
    t = Terminal(["chat", "--url", server], home)
    try:
        t.expect(rf"server: {server} · thread ([0-9a-f]{{8}})")
        t.screen_shows(r"(?m)^›")
        t.type("hello there")
        t.expect(r"agent › You said: hello there")
        t.type("please research tea")
        t.expect(r"I started a researcher on it in the background")
        t.screen_shows(r"researcher\s+running")
        t.expect(r"📬 researcher finished: Tea was first drunk in China")  # the server woke the assistant
        t.expect(r"agent › The researcher reports: Tea was first drunk in China")
        t.screen_shows(r"researcher\s+success")
        t.type("/handoff")
        t.expect(r"accept, edit or reject\?")
        t.type("a")
        t.expect(r"continuing in a new thread")
        t.type("where were we?")
        t.expect(r"agent › From my notes: Tea research\.")
        wait_until(lambda: "None recorded yet." in memory_file(home).read_text())  # the server's memory file
        t.type("/quit")
        assert t.wait_exit() == 0
    finally:
        t.close()


# -- the first hour (issue 19) ---------------------------------------------------------------------------


def test_a_failing_slash_command_or_turn_keeps_the_chat_open(chat):
    t = chat()
    t.type("/model openai:gpt-4o-mini")  # no OPENAI_API_KEY in this environment
    t.expect(r"OPENAI_API_KEY is not set")
    t.type("please break")
    t.expect(r"the run failed: ModelServerError: scripted 503: the provider is down")
    t.type("hello there")
    t.expect(r"agent › You said: hello there")  # still the chat, on the model it had
    t.type("/model")
    t.expect(r"model: chat_script:supervisor")
    t.type("/quit")
    assert t.wait_exit() == 0


def test_ctrl_c_while_a_handoff_is_summarised_cancels_it_and_keeps_the_chat(chat, home):
    t = chat()
    t.type("take your time with the summary")
    t.expect(r"agent › You said: take your time")
    t.type("/handoff")
    t.expect(r"summarising this thread for a handoff")
    t.settle(0.5)
    t.send("\x03")
    t.expect(r"handoff cancelled: nothing changed")
    t.type("hello again")
    t.expect(r"agent › You said: hello again")  # a reply, not a handoff summary
    t.type("/quit")
    assert t.wait_exit() == 0
    [thread] = asyncio.run(stored_threads(home))
    assert thread["status"] == "idle" and not thread["interrupts"]
    assert not memory_file(home).exists()


def test_a_handoff_while_a_task_runs_warns_and_the_result_follows_into_the_new_thread(chat):
    t = chat()
    t.type("please research tea at length")
    t.expect(r"I started a researcher on it in the background")
    t.type("/handoff")
    t.expect(r"1 background task is still running \(researcher [0-9a-f]{8}\): its result will follow you into "
             r"the new thread")
    t.expect(r"accept, edit or reject\?")
    t.type("a")
    child = t.expect(r"continuing in a new thread ([0-9a-f]{8})").group(1)
    t.screen_shows(r"researcher\s+running")  # the task is on the new thread's panel
    t.expect(r"📬 researcher finished: Tea was first drunk in China", timeout=30)
    t.expect(r"agent › The researcher reports: Tea was first drunk in China")
    t.screen_shows(rf"thread {child} · /help")  # still in the new thread
    t.type("/quit")
    assert t.wait_exit() == 0


def test_short_thread_ids_work_for_chat_thread(chat):
    first = chat()
    first.type("hello there")
    first.expect(r"You said: hello there")
    first.type("/quit")
    assert first.wait_exit() == 0
    again = chat("chat", "--thread", first.thread)  # the 8 characters the chat shows
    assert "you › hello there" in again.transcript and "agent › You said: hello there" in again.transcript
    again.screen_shows(rf"thread {first.thread} · /help")


def test_the_preview_says_what_was_cut_beyond_six_bullets(chat):
    t = chat()
    t.type("many points to remember")
    t.expect(r"You said: many points")
    t.type("/handoff --preview")
    t.expect(r"Point number 6\.")
    t.expect(r"left out \(beyond 6 bullets\): Point number 7\.; Point number 8\.")
    t.expect(r"preview only: nothing changed")


def test_warnings_print_above_the_prompt_and_verbose_shows_the_librarys_log_lines(chat, home):
    write_config(home, NOISY_ON_CUE)
    t = chat("--verbose")
    t.type("make some noise")
    t.expect(r"I started a researcher on it in the background")
    t.type("/handoff")
    t.expect(r"handoff [0-9a-f-]{36} proposed for thread [0-9a-f-]{36}: model=scripted tokens_used=\d+")
    t.expect(r"accept, edit or reject\? \[a/e/r\]")
    (home / "cue").touch()  # the noise arrives while the chat asks its question
    t.expect(r"a Python warning from the noisy tool")
    t.settle(1.0)
    screen = t.display()
    asked = [line for line in screen.splitlines() if "accept, edit or reject?" in line]
    assert asked == ["accept, edit or reject? [a/e/r]"], screen  # printed above the question, not into it
    assert re.search(r"(?m)^WARNING py\.warnings .*: UserWarning: a Python warning from the noisy tool$", screen)
    assert re.search(r"(?m)^WARNING backchannel\.chat_script  a log line from the noisy tool$", screen)
    t.type("r")
    t.expect(r"handoff rejected: nothing changed")
    t.expect(r"agent › The researcher reports: Made some noise\.")  # answered here once the handoff is rejected
    assert "📬 noisy finished: Made some noise." in t.transcript


def test_handoff_on_an_assistant_without_handoff_says_so_and_runs_nothing(home):
    write_config(home, 'agent = "plain"\n')
    with serving(home, "plain=chat_script:plain") as url:
        t = Terminal(["chat", "--url", url], home)
        try:
            t.screen_shows(r"(?m)^›")
            t.type("hello there")
            t.expect(r"plain › You said: hello there")
            t.type("/handoff")
            t.expect(r"assistant 'plain' has no HandoffMiddleware")
            t.settle(1.0)
            assert t.transcript.count("You said:") == 1  # no model turn
            t.type("/quit")
            assert t.wait_exit() == 0
        finally:
            t.close()


def readme_transcript() -> list[str]:
    """The README's chat transcript as logical lines (a wrapped line joined to its start)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("```\n$ backchannel\n", 1)[1].split("```", 1)[0]
    lines: list[str] = []
    for line in block.splitlines():
        if lines and re.match(r"^ {3,}\S", line) and not line.lstrip().startswith("→"):
            lines[-1] += " " + line.strip()  # a wrapped reply
        elif lines and lines[-1].startswith("→ continuing") and not line.startswith(("›", "agent")):
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return lines


def test_the_readme_transcript_is_what_a_new_user_gets(tmp_path):
    """From an empty home (no configuration, no key), type what the README's transcript types, and see what it
    shows: replies, tool calls, task results and the handoff, in order (ids and the spinner aside)."""
    t = Terminal([], tmp_path)
    try:
        t.expect(r"model offline scripted model \(no model configured: pass --model, or set model in")
        t.screen_shows(r"(?m)^›")
        for line in readme_transcript():
            if line.startswith("› ") and line[2:].strip():
                t.type(line[2:].strip())
            elif line.startswith("accept, edit or reject? [a/e/r] "):
                t.expect(r"accept, edit or reject\? \[a/e/r\]")
                t.type(line.rsplit(" ", 1)[1])
            elif line.startswith(("agent ›", "  →", "📬", "→ continuing")):
                pattern = r"\s+".join(re.escape(w) for w in line.split())
                t.expect(re.sub(r"(?<![0-9a-z])[0-9a-f]{8}(?![0-9a-z])", "[0-9a-f]{8}", pattern), timeout=30)
            elif line.startswith("│  • "):
                t.expect(r"\s+".join(re.escape(w) for w in line.strip("│ ").split()))
        t.type("/quit")
        assert t.wait_exit() == 0
    finally:
        t.close()


def test_a_handoff_left_waiting_is_offered_when_the_thread_is_opened_again(chat, home):
    first = chat()
    first.type("hello there")
    first.expect(r"You said: hello there")
    first.type("/quit")
    assert first.wait_exit() == 0

    async def propose_and_leave() -> str:  # as when the chat was closed while a summary waited for its decision
        from backchannel.config import build_chat_agent, load_config, load_model
        from backchannel.handoff import propose_handoff

        config = load_config(home / ".backchannel" / "config.toml")  # the chat's own agent, as the chat builds it
        agent = build_chat_agent(config, load_model(config.model), home=home / ".backchannel")
        async with LocalRuntime(f"sqlite:///{home}/state.db", agents={"agent": agent}) as rt:
            [thread] = await rt.threads.search(metadata={"graph_id": "agent"})
            await propose_handoff(rt, thread["thread_id"], "agent")
            return thread["thread_id"]

    thread_id = asyncio.run(propose_and_leave())
    again = Terminal(["--thread", thread_id[:8], "--database", f"sqlite:///{home}/state.db"], home)
    try:
        again.expect(r"a handoff summary proposed earlier waits for your decision")
        again.expect(r"TL;DR: Tea began in China\.")
        again.expect(r"accept, edit or reject\? \[a/e/r\]")
        again.type("a")
        again.expect(r"continuing in a new thread [0-9a-f]{8}")
        again.type("where were we?")
        again.expect(r"agent › From my notes: Tea research\.")
    finally:
        again.close()
