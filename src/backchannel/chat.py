"""The interactive chat: ``backchannel`` (or ``backchannel chat``).

A prompt with history and completion of slash commands; replies and tool
calls stream in as they are written; a panel at the bottom shows the
thread's background tasks (pending, running, then success, error or waiting,
with elapsed time). When a task reports back while you are at the prompt, the
notification and the assistant's answer to it appear above the prompt.
Ctrl-C cancels the reply in progress (a second one leaves); Ctrl-D or
``/quit`` leaves. Threads, tasks and unfinished runs are kept: they resume
next time.

The chat talks to the runtime only through its client surface (``threads``,
``runs``, ``store``), so an embedded runtime and a server work the same.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markdown import Markdown
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from backchannel._display import (
    STREAM_MODES,
    StreamView,
    TaskBoard,
    message_renderables,
    print_once,
    show_stream,
    to_ansi,
)
from backchannel.errors import BackchannelError, InvalidRequestError, NotFoundError
from backchannel.hitl import is_review_request
from backchannel.messages import new_id
from backchannel.usage import describe_usage

__all__ = ["COMMANDS", "Chat", "find_thread", "run_chat"]

COMMANDS: dict[str, str] = {
    "/help": "this list",
    "/new": "start a new thread",
    "/threads": "this assistant's threads",
    "/resume": "<id>  switch to a thread (the first characters of its id are enough)",
    "/tasks": "the background tasks of this thread",
    "/tokens": "the tokens this thread used, its background tasks' included",
    "/cancel": "<task id>  cancel a background task",
    "/handoff": "[--preview | --apply]  continue in a new thread, seeded with a summary you approve",
    "/compact": "summarise the older messages now",
    "/model": "[provider:name]  show or switch the model for the next replies",
    "/quit": "leave (background tasks resume next time)",
}
_ALIASES = {"/exit": "/quit", "/q": "/quit", "/?": "/help", "/usage": "/tokens", "/cost": "/tokens"}
_HISTORY_SHOWN = 6
_POLL_SECONDS = 0.5
_SEARCH_PAGE = 500


class Chat:
    """One interactive session on one runtime and assistant; ``thread_id`` is the thread being talked in."""

    def __init__(self, runtime: Any, assistant_id: str, *, console: Console, model: str, store: str = "",
                 thread_id: str | None = None, history_file: Path | None = None, local: bool = True,
                 model_label: str | None = None) -> None:
        self.rt = runtime
        self.assistant = assistant_id
        self.console = console
        self.model = model
        self.model_label = model_label or model  # what the banner says (the offline model says so)
        self.store = store
        self.local = local
        self.thread_id = thread_id or ""
        self.history_file = history_file
        self.board = TaskBoard()
        self.shown: set[str] = set()
        self.model_override: str | None = None
        self.working: str | None = None  # what a run we did not start is doing, for the toolbar
        self._busy = False
        self._exit = False
        self._sigints = 0
        self._last_run: tuple[str, str] | None = None  # (run id, status) of the thread's newest run, as last seen
        self.usage: dict[str, Any] | None = None  # the thread's tokens as of its newest run's end, for the toolbar
        self._prompt: Any = None
        self._questions: Any = None
        self._ctrl_c: list[Callable[[], object]] = []  # who Ctrl-C goes to, innermost last

    # -- the session -------------------------------------------------------------------------

    async def run(self) -> int:
        """Talk until the person leaves; returns the exit code."""
        self._setup_prompt()
        if self.thread_id:
            await self._open(self.thread_id)
        else:
            await self._new_thread()
        self._banner()
        await self._offer_waiting_handoff()
        watcher = asyncio.create_task(self._watch())
        try:
            while not self._exit:
                line = await self._read()
                if line is None:
                    break
                try:
                    await self._handle_line(line)
                except Exception as exc:  # whatever a command or a turn raises, the chat stays open
                    self.console.print(f"[red]{escape(_one_line(exc))}[/]", soft_wrap=True)
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        self._goodbye()
        return 0

    def _setup_prompt(self) -> None:
        if not sys.stdin.isatty():
            return  # piped input: plain lines, no toolbar
        from prompt_toolkit import PromptSession
        from prompt_toolkit.auto_suggest import AutoSuggestFromHistory
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.styles import Style

        if self.history_file is not None:
            self.history_file.parent.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(self.history_file)) if self.history_file else InMemoryHistory()
        style = Style.from_dict({"bottom-toolbar": "noreverse"})
        self._prompt = PromptSession(history=history, auto_suggest=AutoSuggestFromHistory(),
                                     completer=_command_completer(), style=style)
        self._questions = PromptSession(style=style)

    async def _read(self) -> str | None:
        """The next line typed at the prompt (``None``: the person is leaving)."""
        if self._prompt is None:
            line = await asyncio.to_thread(sys.stdin.readline)
            return None if line == "" else line.rstrip("\n")
        from prompt_toolkit.formatted_text import ANSI
        from prompt_toolkit.patch_stdout import patch_stdout

        with patch_stdout(raw=True):
            try:
                text = await self._prompt.prompt_async(ANSI("\x1b[1m› \x1b[0m"), bottom_toolbar=self._toolbar,
                                                       refresh_interval=_POLL_SECONDS)
            except KeyboardInterrupt:
                self._sigints += 1
                if self._sigints >= 2:
                    return None
                self.console.print("[dim](Ctrl-C again, Ctrl-D or /quit to leave)[/]")
                return ""
            except EOFError:
                return None
        self._sigints = 0
        return text

    def _toolbar(self) -> Any:
        from prompt_toolkit.formatted_text import ANSI

        parts: list[Any] = []
        panel = self.board.panel()
        if panel is not None:
            parts.append(panel)
        if self.working:
            parts.append(Text(f" ⋯ {self.working}", style="italic cyan"))
        model = self.model_override or self.model
        tokens = f"{self.usage['total_tokens']:,} tokens · " if self.usage and self.usage["total_tokens"] else ""
        parts.append(Text(f" {self.assistant} · {model} · {tokens}thread {self.thread_id[:8]} · /help", style="dim"))
        return ANSI(to_ansi(Group(*parts), self.console.width))

    async def _ask(self, message: str, *, default: str = "", multiline: bool = False) -> str | None:
        """A question for the person (``None`` if they press Ctrl-C or Ctrl-D)."""
        if self._questions is None:
            self.console.print(message, end="")
            line = await asyncio.to_thread(sys.stdin.readline)
            return None if line == "" else line.rstrip("\n")
        from prompt_toolkit.patch_stdout import patch_stdout

        with patch_stdout(raw=True):  # what arrives meanwhile (results, warnings) prints above the question
            try:
                return await self._questions.prompt_async(message, default=default, multiline=multiline)
            except (KeyboardInterrupt, EOFError):
                return None

    async def _choose(self, question: str, choices: Mapping[str, str]) -> str | None:
        """One of ``choices`` (by its first letter or in full), asked until the answer is one of them."""
        while True:
            answer = await self._ask(question)
            if answer is None:
                return None
            answer = answer.strip().lower()
            for key, value in choices.items():
                if answer in (key, value) or (answer and value.startswith(answer)):
                    return value
            self.console.print(f"[yellow]answer one of: {', '.join(choices.values())}[/]")

    def _banner(self) -> None:
        where = f"state: {self.store}" if self.local else f"server: {self.store}"
        self.console.print(Panel(
            f"[bold]backchannel[/] · assistant [bold]{escape(self.assistant)}[/] · model {escape(self.model_label)}\n"
            f"[dim]{escape(where)} · thread {self.thread_id[:8]} · /help for commands · Ctrl-C cancels a reply, "
            "Ctrl-D leaves[/]", border_style="blue", expand=False))

    def _goodbye(self) -> None:
        running = self.board.active()
        note = (f" · {len(running)} background task{'s' * (len(running) != 1)} will carry on when you come back"
                if running and self.local else "")
        self.console.print(f"[dim]bye · thread {self.thread_id[:8]} (backchannel chat --thread {self.thread_id})"
                           f"{note}[/]")

    # -- input -------------------------------------------------------------------------------

    async def _handle_line(self, line: str) -> None:
        """Handle a line typed; a Ctrl-C meanwhile that nothing inside takes (a reply takes its own: this is
        between a reply's end and the next prompt, say) counts toward leaving, as at the prompt."""
        handling = asyncio.ensure_future(self._handle(line))
        restore = self._on_ctrl_c(lambda: self._ctrl_c_between(handling))
        try:
            await handling
        except asyncio.CancelledError:
            if not self._exit:
                raise
        finally:
            restore()

    def _ctrl_c_between(self, handling: asyncio.Future[None]) -> None:
        self._sigints += 1
        if self._sigints >= 2:
            self._exit = True
            handling.cancel()
        else:
            self.console.print("[dim](Ctrl-C again, Ctrl-D or /quit to leave)[/]")

    async def _handle(self, line: str) -> None:
        text = line.strip()
        if text.startswith("/"):
            await self._command(text)
            return
        thread = await self.rt.threads.get(self.thread_id)
        if await self._answer_pending(thread) or not text:
            return
        message_id = new_id()
        self.shown.add(message_id)
        if not thread["metadata"].get("title"):
            await self.rt.threads.update(self.thread_id, metadata={"title": text[:60]})
        await self._stream(input={"messages": [{"role": "user", "content": text, "id": message_id}]})

    async def _stream(self, **run: Any) -> None:
        """Start a run on the thread and show it; Ctrl-C cancels it; answer what it asks when it pauses."""
        view = StreamView(self.console, self.board, self.assistant, self.shown)
        if self.model_override:
            run["context"] = {"model": self.model_override}
        parts = self.rt.runs.stream(self.thread_id, self.assistant, stream_mode=STREAM_MODES, stream_subgraphs=True,
                                    multitask_strategy="enqueue", **run)
        following = asyncio.ensure_future(show_stream(self.console, parts, view))
        self._busy, self._sigints = True, 0
        restore = self._on_ctrl_c(lambda: self._interrupt(view, following))
        try:
            await following
        except asyncio.CancelledError:
            if not self._exit:
                raise
        finally:
            restore()
            self._busy = False
        if self._exit:
            return
        if view.error:
            self.console.print(f"[red]the run failed: {escape(view.error.get('error', ''))}: "
                               f"{escape(view.error.get('message', ''))}[/]")
        elif self._sigints:
            self.console.print("[yellow]cancelled[/]")
        await self._catch_up(force=True)
        if view.interrupts and not self._sigints:
            resume = await self._decide(view.interrupts)
            if resume is not None:
                await self._stream(command={"resume": resume})

    def _interrupt(self, view: StreamView, following: asyncio.Future[Any]) -> None:
        self._sigints += 1
        if self._sigints == 1:
            self.console.print("[yellow]cancelling… (Ctrl-C again to leave)[/]")
            asyncio.ensure_future(self._cancel_run(view.run_id))
        else:
            self._exit = True
            following.cancel()

    async def _cancel_run(self, run_id: str | None) -> None:
        if run_id is None:
            return
        try:
            await self.rt.runs.cancel(self.thread_id, run_id)
        except NotFoundError:
            pass  # it ended meanwhile

    def _on_ctrl_c(self, handler: Callable[[], object]) -> Callable[[], None]:
        """Send Ctrl-C to ``handler`` (while a run streams, a command works); returns what puts the previous
        receiver back. Receivers nest: the innermost one gets it."""
        loop = asyncio.get_running_loop()
        if not self._ctrl_c:
            try:
                loop.add_signal_handler(signal.SIGINT, lambda: self._ctrl_c[-1]())
            except (NotImplementedError, RuntimeError):  # no signals here (another thread, or Windows)
                return lambda: None
        self._ctrl_c.append(handler)

        def restore() -> None:
            self._ctrl_c.remove(handler)
            if not self._ctrl_c:
                loop.remove_signal_handler(signal.SIGINT)

        return restore

    async def _until_ctrl_c(self, work: Awaitable[Any]) -> tuple[bool, Any]:
        """``(True, result)`` of ``work``, or ``(False, None)`` if the person pressed Ctrl-C (``work`` is
        cancelled, and cleans up after itself)."""
        task = asyncio.ensure_future(work)
        restore = self._on_ctrl_c(task.cancel)
        try:
            return True, await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and not (current is not None and current.cancelling()):
                return False, None
            raise
        finally:
            restore()

    # -- decisions for paused runs ---------------------------------------------------------------

    async def _answer_pending(self, thread: Mapping[str, Any]) -> bool:
        """If the thread waits for a decision (a run paused while we were away), ask for it now."""
        if thread["status"] != "interrupted" or not thread["interrupts"]:
            return False
        pending = [i for items in thread["interrupts"].values() for i in items]
        if any(_is_handoff(i["value"]) for i in pending):
            return False  # a handoff shown earlier and left: the next message moves the thread on
        resume = await self._decide(pending)
        if resume is not None:
            await self._stream(command={"resume": resume})
        return True

    async def _decide(self, interrupts: Sequence[Mapping[str, Any]]) -> Any:
        """What to resume the run with: one answer per interrupt (``None``: the person backed out)."""
        answers: dict[str, Any] = {}
        for item in interrupts:
            value = item["value"]
            answer = await (self._review(value) if is_review_request(value) else self._reply_to(value))
            if answer is None:
                self.console.print("[dim]left waiting; press Enter at the prompt to decide later[/]")
                return None
            answers[item["id"]] = answer
        return next(iter(answers.values())) if len(answers) == 1 else answers

    async def _review(self, request: Mapping[str, Any]) -> dict[str, Any] | None:
        decisions = []
        for action, config in zip(request["action_requests"], request["review_configs"]):
            args = json.dumps(action.get("args"), indent=2, ensure_ascii=False, default=str)
            self.console.print(Panel(f"[bold]{escape(action['name'])}[/]\n{escape(args)}",
                                     title="approval needed", title_align="left", border_style="magenta"))
            allowed = {d: d for d in config["allowed_decisions"]}
            choice = await self._choose(f"{' / '.join(allowed)}? ", allowed)
            if choice is None:
                return None
            if choice == "edit":
                edited = await self._edit_json(action.get("args") or {})
                if edited is None:
                    return None
                decisions.append({"type": "edit", "edited_action": {"name": action["name"], "args": edited}})
            elif choice in ("reject", "respond"):
                message = await self._ask("reason (optional): " if choice == "reject" else "your answer: ")
                if message is None:
                    return None
                decisions.append({"type": choice, **({"message": message} if message else {})})
            else:
                decisions.append({"type": "approve"})
        return {"decisions": decisions}

    async def _edit_json(self, args: Any) -> Any:
        text = json.dumps(args, indent=2, ensure_ascii=False, default=str)
        while True:
            edited = await self._ask("args (Esc Enter to save): ", default=text, multiline=True)
            if edited is None:
                return None
            try:
                return json.loads(edited)
            except ValueError as exc:
                self.console.print(f"[red]not valid JSON: {escape(str(exc))}[/]")
                text = edited

    async def _reply_to(self, value: Any) -> Any:
        from backchannel.notifier import describe_question

        self.console.print(Panel(escape(describe_question([value])), title="the assistant asks", title_align="left",
                                 border_style="magenta"))
        answer = await self._ask("answer: ")
        if answer is None:
            return None
        try:
            parsed = json.loads(answer)
        except ValueError:
            return answer
        return parsed if isinstance(parsed, (dict, list)) else answer

    # -- background activity ------------------------------------------------------------------

    async def _watch(self) -> None:
        """Keep the task panel live and show what runs we did not start (task results) said."""
        while True:
            await asyncio.sleep(_POLL_SECONDS)
            try:
                await self.board.refresh(self.rt)
                if not self._busy:
                    await self._catch_up()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a hiccup of the runtime must not end the session
                self.working = f"cannot reach the runtime: {type(exc).__name__}"

    async def _catch_up(self, *, force: bool = False) -> None:
        """Print the thread's messages not shown yet, once its newest run has ended."""
        runs = await self.rt.runs.list(self.thread_id, limit=1)
        latest = (runs[0]["run_id"], runs[0]["status"]) if runs else None
        if latest is not None and latest[1] in ("pending", "running"):
            self.working = "the assistant is answering a task result…" if not self._busy else None
            return
        self.working = None
        if latest == self._last_run and not force:
            return
        self._last_run = latest
        self.usage = await self._usage()
        thread = await self.rt.threads.get(self.thread_id)
        values = thread.get("values") or {}
        for message in values.get("messages") or ():
            print_once(self.console, message, self.assistant, self.shown)
        self.board.load(values.get("async_tasks") or {})
        self.board.todos = values.get("todos") or []
        if thread["status"] == "interrupted" and thread["interrupts"] and not force:
            pending = [i["value"] for items in thread["interrupts"].values() for i in items]
            if not any(_is_handoff(v) for v in pending):
                self.console.print("[magenta]⏸ the assistant is waiting for your decision: press Enter[/]")

    # -- threads ------------------------------------------------------------------------------

    async def _new_thread(self) -> None:
        thread = await self.rt.threads.create(graph_id=self.assistant, metadata={"source": "chat"})
        self._switch(thread["thread_id"])

    def _switch(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.board.clear()
        self.shown.clear()
        self._last_run = None
        self.usage = None

    async def _open(self, thread_id: str) -> None:
        """Switch to an existing thread and show its last messages."""
        thread = await self.rt.threads.get(thread_id)
        self._switch(thread_id)
        values = thread.get("values") or {}
        messages = values.get("messages") or []
        self.shown.update(m.get("id") for m in messages)
        if len(messages) > _HISTORY_SHOWN:
            self.console.print(f"[dim]… {len(messages) - _HISTORY_SHOWN} earlier messages[/]")
        for message in messages[-_HISTORY_SHOWN:]:
            for renderable in message_renderables(message, self.assistant):
                self.console.print(renderable)
        self.board.load(values.get("async_tasks") or {})
        self.board.todos = values.get("todos") or []
        runs = await self.rt.runs.list(thread_id, limit=1)
        self._last_run = (runs[0]["run_id"], runs[0]["status"]) if runs else None
        self.usage = await self._usage()

    async def _threads(self) -> list[dict[str, Any]]:
        return await self.rt.threads.search(metadata={"graph_id": self.assistant}, limit=100,
                                            sort_by="updated_at", sort_order="desc")

    # -- slash commands -------------------------------------------------------------------------

    async def _command(self, text: str) -> None:
        name, _, arg = text.partition(" ")
        name = _ALIASES.get(name.lower(), name.lower())
        arg = arg.strip()
        handler = getattr(self, f"_cmd_{name[1:]}", None) if name in COMMANDS else None
        if handler is None:
            close = difflib.get_close_matches(name, [*COMMANDS, *_ALIASES], n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            self.console.print(f"[yellow]unknown command {escape(name)}: {hint}/help lists the commands[/]")
            return
        finished, _ = await self._until_ctrl_c(handler(arg))
        if not finished:
            self.console.print("[yellow]cancelled[/]")

    async def _cmd_help(self, arg: str) -> None:
        table = Table(box=None, show_header=False, padding=(0, 2))
        for name, what in COMMANDS.items():
            usage, _, rest = what.partition("  ")
            table.add_row(Text(f"{name} {usage if rest else ''}".strip(), style="bold"), rest or what)
        self.console.print(table)
        self.console.print("[dim]Ctrl-C cancels the reply in progress; Ctrl-D leaves. Background tasks show at "
                           "the bottom; their results arrive by themselves.[/]")

    async def _cmd_quit(self, arg: str) -> None:
        self._exit = True

    async def _cmd_new(self, arg: str) -> None:
        await self._new_thread()
        self.console.print(f"[dim]new thread {self.thread_id[:8]}[/]")

    async def _cmd_threads(self, arg: str) -> None:
        table = Table("", "thread", "updated", "status", "title", box=None, header_style="dim")
        for t in await self._threads():
            meta = t["metadata"]
            title = meta.get("title") or ""
            if meta.get("handoff_source_thread_id"):
                title = f"{title}  [dim](handoff from {meta['handoff_source_thread_id'][:8]})[/]"
            table.add_row("●" if t["thread_id"] == self.thread_id else "", t["thread_id"][:8],
                          t["updated_at"][:19].replace("T", " "), t["status"], title)
        self.console.print(table)

    async def _cmd_resume(self, arg: str) -> None:
        if not arg:
            self.console.print("[yellow]/resume needs a thread id (see /threads)[/]")
            return
        try:
            thread_id = await find_thread(self.rt, arg, metadata={"graph_id": self.assistant})
        except NotFoundError:
            self.console.print(f"[yellow]no thread of {escape(self.assistant)} starts with {escape(arg)!r}; "
                               "see /threads[/]")
            return
        await self._open(thread_id)
        self.console.print(f"[dim]now in thread {thread_id[:8]}[/]")
        await self._offer_waiting_handoff()

    async def _cmd_tasks(self, arg: str) -> None:
        await self.board.refresh(self.rt)
        if not self.board.rows:
            self.console.print("[dim]no background tasks in this thread[/]")
            return
        self.console.print(self.board.table())

    async def _cmd_tokens(self, arg: str) -> None:
        self.usage = await self._usage()
        self.console.print(f"[dim]this thread: {describe_usage(self.usage)}[/]")

    async def _usage(self) -> dict[str, Any] | None:
        """The thread's token usage, its background tasks' included (``None`` for a thread not created yet)."""
        try:
            usage: dict[str, Any] = (await self.rt.timeline(self.thread_id, spans=False))["usage"]
        except NotFoundError:
            return None
        return usage

    async def _cmd_cancel(self, arg: str) -> None:
        matches = self.board.find(arg) if arg else []
        if len(matches) != 1:
            known = ", ".join(r.task_id[:8] for r in self.board.rows.values() if r.task_id) or "none"
            self.console.print(f"[yellow]/cancel needs the id of one task of this thread (known: {known})[/]")
            return
        row = matches[0]
        task_id = row.task_id or arg  # find() matched the row by its task id
        if row.run_id is None or row.status not in ("pending", "running"):
            self.console.print(f"[dim]task {task_id[:8]} already ended: {row.status}[/]")
            return
        try:
            await self.rt.runs.cancel(task_id, row.run_id, wait=True)
        except NotFoundError:
            pass  # it finished meanwhile
        await self.board.refresh(self.rt)
        self.console.print(f"[dim]task {task_id[:8]} ({row.subagent}): {row.status}[/]")

    async def _cmd_model(self, arg: str) -> None:
        if not arg:
            self.console.print(f"model: {escape(self.model_override or self.model)}")
            return
        from backchannel.models import init_model

        init_model(arg)  # a bad name fails here, not at the next message
        self.model_override = arg
        note = "" if self.local else " (if the server's assistant allows choosing)"
        self.console.print(f"[dim]model for the next replies: {escape(arg)}{note}[/]")

    async def _cmd_compact(self, arg: str) -> None:
        from backchannel.summarization import count_tokens_approximately

        before = ((await self.rt.threads.get(self.thread_id)).get("values") or {}).get("messages") or []
        with self.console.status("summarising older messages…"):
            values = await self.rt.runs.wait(self.thread_id, self.assistant, input={"compact": True})
        after = values.get("messages") or []
        self.shown.update(m.get("id") for m in after)
        if len(after) >= len(before):
            self.console.print("[dim]nothing to compact yet[/]")
            return
        self.console.print(f"[dim]compacted {len(before) - len(after) + 1} messages into a summary; "
                           f"≈{count_tokens_approximately(before):,} → {count_tokens_approximately(after):,} "
                           "tokens[/]")

    async def _cmd_handoff(self, arg: str) -> None:
        from backchannel.handoff import HandoffResult, propose_handoff

        if arg not in ("", "--preview", "--apply"):
            self.console.print("[yellow]usage: /handoff [--preview | --apply][/]")
            return
        if arg != "--preview":
            self._warn_running_tasks()
        with self.console.status("summarising this thread for a handoff… (Ctrl-C cancels)"):
            finished, outcome = await self._until_ctrl_c(
                propose_handoff(self.rt, self.thread_id, self.assistant, apply=arg == "--apply"))
        if not finished:
            self.console.print("[yellow]handoff cancelled: nothing changed[/]")
        elif isinstance(outcome, HandoffResult):
            await self._handed_off(outcome)
        else:
            await self._decide_handoff(outcome, preview=arg == "--preview")

    def _warn_running_tasks(self) -> None:
        running = [r for r in self.board.active() if r.task_id]
        if running:
            which = ", ".join(f"{r.subagent} {r.task_id[:8]}" for r in running if r.task_id)
            one = len(running) == 1
            self.console.print(f"[yellow]{len(running)} background task{'' if one else 's'} "
                               f"{'is' if one else 'are'} still running ({escape(which)}): "
                               f"{'its result' if one else 'their results'} will follow you into the new thread[/]")

    async def _decide_handoff(self, proposal: Any, *, preview: bool = False) -> None:
        """Show a proposed summary and ask what to do with it (with ``preview``, only show it)."""
        from backchannel.handoff import decide_handoff

        self.console.print(Panel(Markdown(proposal.summary_md), title=f"handoff summary · {proposal.handoff_id[:8]}",
                                 title_align="left", border_style="green"))
        if proposal.omitted:
            self.console.print(f"[dim]left out (beyond 6 bullets): {escape('; '.join(proposal.omitted))}[/]",
                               soft_wrap=True)
        if preview:
            await decide_handoff(self.rt, self.thread_id, self.assistant, {"type": "reject", "message": "preview"})
            self.console.print("[dim]preview only: nothing changed (/handoff to hand off)[/]")
            return
        decision = await self._handoff_decision(proposal.summary_md)
        result = await decide_handoff(self.rt, self.thread_id, self.assistant, decision)
        if result.status == "accepted":
            await self._handed_off(result)
        else:
            self.console.print("[dim]handoff rejected: nothing changed[/]")

    async def _offer_waiting_handoff(self) -> None:
        """A handoff proposed on this thread and never answered (the chat was closed meanwhile): ask now."""
        from backchannel.handoff import pending_handoff

        proposal = await pending_handoff(self.rt, self.thread_id)
        if proposal is not None:
            self.console.print("[magenta]a handoff summary proposed earlier waits for your decision:[/]")
            await self._decide_handoff(proposal)

    async def _handoff_decision(self, summary_md: str) -> dict[str, Any]:
        choice = await self._choose("accept, edit or reject? [a/e/r] ", {"a": "accept", "e": "edit", "r": "reject"})
        if choice == "accept":
            return {"type": "approve"}
        if choice == "edit":
            edited = await self._ask("edit the summary (Esc Enter to save):\n", default=summary_md, multiline=True)
            if edited is not None and edited.strip():
                return {"type": "edit", "args": {"summary_md": edited}}
        return {"type": "reject"}

    async def _handed_off(self, result: Any) -> None:
        parent = self.thread_id
        self._switch(result.child_thread_id)
        await self._catch_up(force=True)  # the tasks carried over show on the new thread's panel
        self.console.print(f"[green]→ continuing in a new thread {result.child_thread_id[:8]}[/] [dim](from "
                           f"{parent[:8]}; the summary is in the agent's memory until the first reply)[/]")


def _one_line(exc: BaseException) -> str:
    """An error as the chat reports it: backchannel's own by their message, others with their type."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, (BackchannelError, ValueError)) else f"{type(exc).__name__}: {text}"


async def find_thread(runtime: Any, prefix: str, *, metadata: Mapping[str, Any] | None = None) -> str:
    """The id of the thread whose id is ``prefix``, or starts with it: the 8 characters the CLI shows are enough.

    ``metadata`` narrows the search (e.g. one assistant's threads). Raises
    :class:`~backchannel.errors.NotFoundError` when no thread matches, and
    :class:`~backchannel.errors.InvalidRequestError` when several do.
    """
    prefix = prefix.strip()
    try:
        thread = await runtime.threads.get(prefix)
        if all(thread["metadata"].get(k) == v for k, v in (metadata or {}).items()):
            return str(thread["thread_id"])
    except (NotFoundError, InvalidRequestError):
        pass  # not a whole id (or not this one's): look for it as the start of one
    matches: list[str] = []
    offset = 0
    while prefix:
        page = await runtime.threads.search(metadata=metadata, limit=_SEARCH_PAGE, offset=offset)
        matches += [t["thread_id"] for t in page if t["thread_id"].startswith(prefix)]
        if len(page) < _SEARCH_PAGE:
            break
        offset += _SEARCH_PAGE
    if not matches:
        raise NotFoundError(f"no thread's id starts with {prefix!r}")
    if len(matches) > 1:
        raise InvalidRequestError(f"{len(matches)} threads' ids start with {prefix!r} "
                                  f"({', '.join(m[:13] for m in matches[:4])}…): give more of the id")
    return matches[0]


def _is_handoff(value: Any) -> bool:
    from backchannel.handoff import HANDOFF_ACTION

    return is_review_request(value) and any(a.get("name") == HANDOFF_ACTION for a in value["action_requests"])


def _command_completer() -> Any:
    """A prompt_toolkit completer for slash commands at the start of the line."""
    from prompt_toolkit.completion import Completer, Completion

    class CommandCompleter(Completer):
        def get_completions(self, document: Any, complete_event: Any) -> Any:
            text = document.text_before_cursor
            if text.startswith("/") and " " not in text:
                for name, what in COMMANDS.items():
                    if name.startswith(text):
                        yield Completion(name, start_position=-len(text), display_meta=what.split("  ")[-1])

    return CommandCompleter()


async def run_chat(*, model: str | None, config_file: str | None, database: str | None, thread_id: str | None,
                   console: Console, url: str | None = None) -> int:
    """``backchannel chat``: the configured agent on the embedded runtime, or with ``url`` the assistant of
    that name on a server (a :class:`~backchannel.runtime.remote.RemoteRuntime`).

    ``model`` is the ``--model`` flag; without it, ``BACKCHANNEL_MODEL``, the
    configuration's ``model``, a provider whose API key is set, else the offline model.
    ``thread_id`` may be the first characters of the thread's id.
    """
    from backchannel.config import build_chat_agent, load_config, load_model, model_label, resolve_model
    from backchannel.models.offline import OFFLINE

    config = load_config(config_file)
    history = Path.home() / ".backchannel" / "history"
    if url is not None:
        from backchannel.runtime.remote import RemoteRuntime

        async with RemoteRuntime(url) as rt:
            await rt.assistants.get(config.agent)  # a clear error if the server has no such assistant
            if thread_id is not None:
                thread_id = await find_thread(rt, thread_id)
            chat = Chat(rt, config.agent, console=console, model=model or "the server's", store=url,
                        thread_id=thread_id, history_file=history, local=False)
            if model:
                await chat._cmd_model(model)
            return await chat.run()
    from backchannel.runtime import DEFAULT_STORE, LocalRuntime

    chosen = resolve_model(model, config.model)
    agent = build_chat_agent(config, load_model(chosen or OFFLINE))
    store = database or config.database or DEFAULT_STORE
    async with LocalRuntime(store, agents={config.agent: agent}) as rt:
        if thread_id is not None:  # a clear error for an unknown id, before the screen is set up
            thread_id = await find_thread(rt, thread_id)
        chat = Chat(rt, config.agent, console=console, model=chosen or OFFLINE, store=store, thread_id=thread_id,
                    history_file=history, model_label=model_label(chosen))
        return await chat.run()
