"""The ``backchannel`` command: the chat, the demo, one-shot runs, and threads.

    backchannel [chat] [--model provider:name] [--thread ID] [--config PATH] [--store URL | --url URL]
    backchannel demo [--prompt TEXT] [--model provider:name] [--store URL] [--web [--port 8123] [--no-browser]]
    backchannel run "question" [--model provider:name] [--thread ID] [--store URL | --url URL --assistant ID]
    backchannel threads [list | show ID | tree ID | delete ID] [--store URL | --url URL]
    backchannel serve [--host H] [--port 8123] [--database URL] [--agents [ID=]module:attr ...] [--api-key KEY] [--demo]

State lives in ``~/.backchannel/state.db`` (SQLite) unless ``--store`` says
otherwise; ``--url`` works on a server's threads instead. The chat reads
``~/.backchannel/config.toml``. The model comes from ``--model``, else
``BACKCHANNEL_MODEL``, else the configuration, else ``OPENAI_API_KEY`` or
``ANTHROPIC_API_KEY`` being set.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from backchannel._display import STREAM_MODES, StreamView, TaskBoard, show_stream
from backchannel.config import resolve_model
from backchannel.messages import text_of

__all__ = ["main", "resolve_model"]

COMMANDS = ("chat", "demo", "run", "threads", "serve")


async def _show_run(rt: Any, thread_id: str | None, assistant: str, prompt: str, console: Console, *,
                    metadata: dict[str, Any] | None = None, url: str | None = None) -> None:
    """Run ``assistant`` on ``prompt`` and show it as it happens, with the panel of its background tasks.

    Without ``thread_id`` it runs on a new thread (with ``metadata``). The thread's id (and the server's
    ``url``) ends the output, so the user can continue the conversation or look at its tree.
    """
    if thread_id is None:
        thread_id = (await rt.threads.create(metadata=metadata))["thread_id"]
    console.print(Text.assemble(("you › ", "bold"), prompt))
    board = TaskBoard()
    view = StreamView(console, board, assistant, set())
    parts = rt.runs.stream(thread_id, assistant, input={"messages": [{"role": "user", "content": prompt}]},
                           stream_mode=STREAM_MODES, stream_subgraphs=True)
    await show_stream(console, parts, view)
    if board.rows:
        console.print(board.panel(recent=float("inf")))
    if view.error:
        console.print(f"[red]the run failed: {escape(str(view.error.get('message', view.error)))}[/]")
    where = f" on {url}" if url else ""
    console.print(f"[dim]thread {thread_id}{where}[/]")


async def run_demo(prompt: str, model: str | None, store: str, console: Console) -> None:
    from backchannel.demo import build_demo
    from backchannel.runtime import LocalRuntime

    agent = build_demo(model)
    label = (f"model: {model}" if model
             else "offline scripted model (no model configured; pass --model to use a real one)")
    console.print(Panel(f"[bold]backchannel demo[/] — a supervisor with researcher and analyst subagents in the "
                        f"background\n[dim]{escape(label)} · state: {escape(store)}[/]", border_style="blue"))
    async with LocalRuntime(store, agents={"supervisor": agent}) as rt:
        await _show_run(rt, None, "supervisor", prompt, console, metadata={"title": "demo"})


async def run_once(prompt: str, model: str, thread_id: str | None, store: str, console: Console) -> None:
    from backchannel.deep_agent import create_deep_agent
    from backchannel.runtime import LocalRuntime

    agent = create_deep_agent(model, name="assistant")
    async with LocalRuntime(store, agents={"assistant": agent}) as rt:
        await _show_run(rt, thread_id, "assistant", prompt, console)


async def run_remote(prompt: str, url: str, assistant: str, thread_id: str | None, console: Console) -> None:
    """Ask an assistant on a server, showing its reply, tool calls and tasks as they stream."""
    from backchannel.runtime.remote import RemoteRuntime

    async with RemoteRuntime(url) as rt:
        await _show_run(rt, thread_id, assistant, prompt, console, url=url)


def open_runtime(store: str, url: str | None = None) -> Any:
    """The runtime the command works on: the server at ``url``, else the embedded one on ``store``."""
    if url:
        from backchannel.runtime.remote import RemoteRuntime

        return RemoteRuntime(url)
    from backchannel.runtime import LocalRuntime

    return LocalRuntime(store)


async def run_threads(action: str, thread_id: str | None, store: str, console: Console,
                      url: str | None = None) -> int:
    async with open_runtime(store, url) as rt:
        if action == "list":
            table = Table("thread", "status", "updated", "metadata")
            for t in await rt.threads.search(limit=50):
                table.add_row(t["thread_id"], t["status"], t["updated_at"][:19], str(t["metadata"])[:60])
            console.print(table)
            return 0
        if thread_id is None:
            console.print(f"[red]threads {action} needs a thread id[/]")
            return 2
        if action == "delete":
            await rt.threads.delete(thread_id)
            console.print(f"deleted {thread_id}")
        elif action == "show":
            state = await rt.threads.get_state(thread_id)
            for m in state["values"].get("messages", []):
                console.print(Text.assemble((f"{m['type']:>6} › ", "bold"), text_of(m["content"])[:500]))
        elif action == "tree":
            await _print_tree(rt, thread_id, console, depth=0)
    return 0


async def _print_tree(rt: Any, thread_id: str, console: Console, depth: int) -> None:
    thread = await rt.threads.get(thread_id)
    label = thread["metadata"].get("subagent") or thread["metadata"].get("title") or ""
    console.print(escape(f"{'  ' * depth}{'└ ' if depth else ''}{thread_id} [{thread['status']}] {label}"))
    for child in await rt.threads.search(metadata={"parent_thread_id": thread_id}, limit=1000, sort_order="asc",
                                        sort_by="created_at"):
        await _print_tree(rt, child["thread_id"], console, depth + 1)


def _parser() -> argparse.ArgumentParser:
    from backchannel.runtime import DEFAULT_STORE

    parser = argparse.ArgumentParser(prog="backchannel", description="Deep agents with background subagents.")
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="talk with your agent (what `backchannel` alone does)")
    chat.add_argument("--thread", default=None, help="continue this thread")
    chat.add_argument("--config", default=None, help="configuration file (default ~/.backchannel/config.toml)")
    chat.add_argument("--store", default=None, help=f"where state lives (default: the configuration's, else "
                                                    f"{DEFAULT_STORE})")
    chat.add_argument("--url", default=None, help="chat with the assistant of a backchannel server instead "
                                                  "(the configuration's agent name; API key from BACKCHANNEL_API_KEY)")
    demo = sub.add_parser("demo", help="supervisor + researcher and analyst subagents in the background")
    demo.add_argument("--prompt", default=None)
    demo.add_argument("--web", action="store_true", help="serve the demo as a web page instead")
    demo.add_argument("--port", type=int, default=8123, help="the web page's port (with --web)")
    demo.add_argument("--no-browser", action="store_true", help="don't open a browser (with --web)")
    run = sub.add_parser("run", help="answer one question with a deep agent")
    run.add_argument("prompt")
    run.add_argument("--thread", default=None, help="continue this thread")
    run.add_argument("--url", default=None, help="ask an assistant on this server instead")
    run.add_argument("--assistant", default="agent", help="the server's assistant to ask (with --url)")
    threads = sub.add_parser("threads", help="list, show, tree or delete threads")
    threads.add_argument("action", nargs="?", default="list", choices=["list", "show", "tree", "delete"])
    threads.add_argument("thread_id", nargs="?")
    threads.add_argument("--url", default=None, help="a backchannel or LangGraph server to work on instead")
    serve = sub.add_parser("serve", help="serve agents over the LangGraph HTTP API")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8123)
    serve.add_argument("--database", default=DEFAULT_STORE, help=f"where state lives (default {DEFAULT_STORE})")
    serve.add_argument("--agents", nargs="+", default=[], metavar="[ID=]MODULE:ATTR",
                       help="agents to serve, e.g. myapp.agents:supervisor (default: a deep agent on --model)")
    serve.add_argument("--demo", action="store_true",
                       help="serve the demo supervisor and its web page at / (offline unless --model)")
    serve.add_argument("--api-key", default=os.environ.get("BACKCHANNEL_API_KEY"),
                       help="require this key in x-api-key (default: $BACKCHANNEL_API_KEY)")
    serve.add_argument("--no-auth", action="store_true", help="serve a non-loopback host without an API key")
    serve.add_argument("--public-url", default=None, help="where other servers reach this one")
    serve.add_argument("--grace", type=float, default=10.0, help="seconds running runs get to finish on stop")
    serve.add_argument("--lease", type=float, default=30.0,
                       help="with Postgres: seconds without a heartbeat before other servers take this one's runs")
    serve.add_argument("--cors-origins", default=None, metavar="ORIGIN,...",
                       help="web pages that may call the server ('*': any; default without an API key: this "
                            "machine's pages and LangGraph Studio; with one: any)")
    serve.add_argument("--allowed-hosts", default=None, metavar="NAME,...",
                       help="host names the server answers to besides loopback and IP addresses ('*': any)")
    serve.add_argument("--client-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="seconds a client may take to send a request, or leave what the server writes unread, "
                            "before it is disconnected (default 10)")
    for p in (demo, run, threads):
        p.add_argument("--store", default=DEFAULT_STORE, help=f"where state lives (default {DEFAULT_STORE})")
    for p in (chat, demo, run, serve):
        p.add_argument("--model", default=None, help="provider:model, e.g. openai:gpt-4o-mini")
    return parser


def run_serve(args: argparse.Namespace, console: Console) -> int:
    from backchannel.server import import_agents, serve
    from backchannel.server.serving import is_loopback

    if not is_loopback(args.host) and not args.api_key and not args.no_auth:
        console.print(f"[red]refusing to serve {args.host} without an API key:[/] pass --api-key (or set "
                      "BACKCHANNEL_API_KEY), or --no-auth if the network is trusted")
        return 2
    model = resolve_model(args.model)
    agents = import_agents(args.agents)
    demo_page = None
    if args.demo:
        from backchannel.demo import build_demo
        from backchannel.server import DemoPage

        agents["supervisor"] = build_demo(model)
        demo_page = DemoPage("supervisor", model)
    if not agents:
        if model is None:
            console.print("[red]nothing to serve:[/] pass --agents module:attr, --demo, or a --model for a "
                          "default deep agent")
            return 2
        from backchannel.deep_agent import create_deep_agent

        agents["agent"] = create_deep_agent(model, name="agent")
    console.print(f"[bold]backchannel serve[/] on http://{args.host}:{args.port} · assistants: "
                  f"{', '.join(agents)} · state: {escape(args.database)}"
                  f"{' · API key required' if args.api_key else ''}")
    if demo_page is not None:
        console.print(f"demo page: [bold]http://{args.host}:{args.port}/[/] ({escape(demo_page.model_label)})")
    serve(agents, host=args.host, port=args.port, database=args.database, api_key=args.api_key,
          public_url=args.public_url, grace=args.grace, lease=args.lease, demo_page=demo_page,
          cors_origins=_names(args.cors_origins), allowed_hosts=_names(args.allowed_hosts),
          client_timeout=args.client_timeout)
    return 0


def _names(option: str | None) -> list[str] | None:
    """A comma-separated option as a list (``None`` when not given)."""
    return [n.strip() for n in option.split(",") if n.strip()] if option else None


def run_demo_web(prompt: str, model: str | None, store: str, port: int, open_browser: bool,
                 console: Console) -> int:
    """The demo as a web page on this machine: a chat with the supervisor and live subagent cards."""
    from backchannel.demo import build_demo
    from backchannel.server import DemoPage, serve

    page = DemoPage("supervisor", model, prompt)
    url = f"http://127.0.0.1:{port}/"
    console.print(Panel(f"[bold]backchannel demo[/] — open [bold]{url}[/] in a browser (Ctrl+C stops it)\n"
                        f"[dim]{escape(page.model_label)} · state: {escape(store)}[/]", border_style="blue"))

    def open_page() -> None:
        import webbrowser

        webbrowser.open(url)

    serve({"supervisor": build_demo(model)}, port=port, database=store, demo_page=page, log_level="warning",
          on_ready=open_page if open_browser and _has_browser() else None)
    return 0


def _has_browser() -> bool:
    """Whether a graphical browser can open here (not on a headless box, where ``webbrowser`` picks a text one)."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _server_extra_missing() -> str | None:
    """What to install when the ``server`` extra is missing, else ``None``."""
    import importlib.util

    if all(importlib.util.find_spec(name) for name in ("starlette", "uvicorn")):
        return None
    return "the server needs the server extra: pip install \"backchannel[server]\""


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help")):
        argv.insert(0, "chat")  # `backchannel` alone, or with the chat's options, is the chat
    args = _parser().parse_args(argv)
    console = Console()
    try:
        missing = _server_extra_missing() if args.command == "serve" or getattr(args, "web", False) else None
        if missing:
            console.print(f"[red]{escape(missing)}[/]")
            return 2
        if args.command == "chat":
            from backchannel.chat import run_chat

            return asyncio.run(run_chat(model=args.model, config_file=args.config, store=args.store,
                                        thread_id=args.thread, console=console, url=args.url))
        if args.command == "demo":
            from backchannel.demo import DEFAULT_PROMPT

            prompt, model = args.prompt or DEFAULT_PROMPT, resolve_model(args.model)
            if args.web:
                return run_demo_web(prompt, model, args.store, args.port, not args.no_browser, console)
            asyncio.run(run_demo(prompt, model, args.store, console))
        elif args.command == "run" and args.url:
            asyncio.run(run_remote(args.prompt, args.url, args.assistant, args.thread, console))
        elif args.command == "run":
            model = resolve_model(args.model)
            if model is None:
                console.print("[red]no model configured:[/] pass --model openai:gpt-4o-mini (with OPENAI_API_KEY "
                              "set), or set BACKCHANNEL_MODEL")
                return 2
            asyncio.run(run_once(args.prompt, model, args.thread, args.store, console))
        elif args.command == "serve":
            return run_serve(args, console)
        else:
            return asyncio.run(run_threads(args.action, args.thread_id, args.store, console, args.url))
    except KeyboardInterrupt:
        console.print("[dim]stopped; unfinished runs resume next time[/]")
        return 130
    except Exception as exc:  # a readable line on stderr rather than a traceback
        from backchannel.config import ConfigError

        problem = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        Console(stderr=True).print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
        return 2 if isinstance(exc, ConfigError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
