"""The ``backchannel`` command: the chat, the demo, one-shot runs, threads, and the server.

    backchannel [chat] [--model M] [--thread ID] [--config PATH] [--database URL | --url URL]
    backchannel demo [--prompt TEXT] [--model M] [--database URL] [--web [--port 8123] [--no-browser]]
    backchannel run "question" [--model M] [--thread ID] [--config PATH] [--database URL | --url URL --assistant ID]
    backchannel threads [list | show ID | tree ID | delete ID] [--database URL | --url URL]
    backchannel serve [--host H] [--port 8123] [--database URL] [--agents [ID=]module:attr ...] [--api-key KEY]

State lives in ``~/.backchannel/state.db`` (SQLite) unless ``--database`` says
otherwise (the demo keeps its own, ``~/.backchannel/demo.db``); ``--url``
works on a server's threads instead. The chat and ``run`` read
``~/.backchannel/config.toml``. A model (``M``) is ``provider:name``,
``module:attribute`` or ``offline``; it comes from ``--model``, else
``BACKCHANNEL_MODEL``, else the configuration, else ``OPENAI_API_KEY`` or
``ANTHROPIC_API_KEY`` being set, else the offline model. Every command takes
``--verbose`` to show the library's log lines (or ``BACKCHANNEL_LOG=info``).
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from backchannel import __version__
from backchannel._display import STREAM_MODES, StreamView, TaskBoard, show_logs, show_stream
from backchannel.config import resolve_model
from backchannel.errors import BackchannelError
from backchannel.messages import text_of
from backchannel.usage import describe_usage

if TYPE_CHECKING:
    from backchannel.runtime.retention import StoreTTLConfig, ThreadTTLConfig

__all__ = ["main", "resolve_model"]

COMMANDS = ("chat", "demo", "run", "threads", "serve")


async def _show_run(rt: Any, thread_id: str | None, assistant: str, prompt: str, console: Console, *,
                    metadata: dict[str, Any] | None = None, where: str = "") -> bool:
    """Run ``assistant`` on ``prompt`` and show it as it happens, with the panel of its background tasks;
    returns whether the run succeeded.

    Without ``thread_id`` it runs on a new thread (with ``metadata``). The thread's id (and ``where`` it
    lives, as command-line options) ends the output, so the user can continue or look at its tree.
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
        console.print(f"[red]the run failed: {escape(view.error.get('error', 'Error'))}: "
                      f"{escape(str(view.error.get('message', view.error)))}[/]", soft_wrap=True)
    elif view.interrupts:
        console.print(f"[magenta]the run waits for a decision: answer it in the chat (backchannel chat --thread "
                      f"{thread_id[:8]}{where})[/]", soft_wrap=True)
    console.print(f"[dim]thread {thread_id} (its tree: backchannel threads tree {thread_id[:8]}{where})[/]",
                  soft_wrap=True)
    return view.error is None


async def run_demo(prompt: str, model: Any, label: str | None, database: str, console: Console) -> bool:
    from backchannel.demo import build_demo
    from backchannel.runtime import LocalRuntime

    agent = build_demo(model)
    shown = (f"model: {label}" if label else
             "offline scripted model (no model configured; pass --model to use a real one)")
    console.print(Panel(f"[bold]backchannel demo[/] — a supervisor with researcher and analyst subagents in the "
                        f"background\n[dim]{escape(shown)} · state: {escape(database)}[/]", border_style="blue"))
    async with LocalRuntime(database, agents={"supervisor": agent}) as rt:
        return await _show_run(rt, None, "supervisor", prompt, console, metadata={"title": "demo"},
                               where=_database_option(database))


async def run_once(prompt: str, model: str | None, thread_id: str | None, database: str | None,
                   config_file: str | None, console: Console) -> bool:
    """``run``: the chat's agent (from the configuration) answers once, and waits for its background tasks."""
    from backchannel.chat import find_thread
    from backchannel.config import build_chat_agent, load_config, load_model, model_label
    from backchannel.models.offline import OFFLINE
    from backchannel.runtime import DEFAULT_STORE, LocalRuntime

    config = load_config(config_file)
    chosen = resolve_model(model, config.model)
    agent = build_chat_agent(config, load_model(chosen or OFFLINE), completion="wait")
    database = database or config.database or DEFAULT_STORE
    console.print(f"[dim]{escape(config.agent)} · model: {escape(model_label(chosen))} · state: {escape(database)}[/]",
                  soft_wrap=True)
    async with LocalRuntime(database, agents={config.agent: agent}) as rt:
        if thread_id is not None:
            thread_id = await find_thread(rt, thread_id)
        return await _show_run(rt, thread_id, config.agent, prompt, console, where=_database_option(database))


def _database_option(database: str) -> str:
    from backchannel.runtime import DEFAULT_STORE

    return "" if database == DEFAULT_STORE else f" --database {database}"


async def run_remote(prompt: str, url: str, assistant: str, thread_id: str | None, console: Console) -> bool:
    """Ask an assistant on a server, showing its reply, tool calls and tasks as they stream."""
    from backchannel.chat import find_thread
    from backchannel.runtime.remote import RemoteRuntime

    async with RemoteRuntime(url) as rt:
        if thread_id is not None:
            thread_id = await find_thread(rt, thread_id)
        return await _show_run(rt, thread_id, assistant, prompt, console, where=f" --url {url}")


def open_runtime(database: str, url: str | None = None) -> Any:
    """The runtime the command works on: the server at ``url``, else the embedded one on ``database``."""
    if url:
        from backchannel.runtime.remote import RemoteRuntime

        return RemoteRuntime(url)
    from backchannel.runtime import LocalRuntime

    return LocalRuntime(database)


async def run_threads(action: str, thread_id: str | None, database: str, console: Console,
                      url: str | None = None) -> int:
    from backchannel.chat import find_thread

    async with open_runtime(database, url) as rt:
        if action == "list":
            table = Table("thread", "status", "updated", "metadata")
            for t in await rt.threads.search(limit=50):
                table.add_row(t["thread_id"], t["status"], t["updated_at"][:19], str(t["metadata"])[:60])
            console.print(table)
            return 0
        if thread_id is None:
            console.print(f"[red]threads {action} needs a thread id[/]")
            return 2
        thread_id = await find_thread(rt, thread_id)
        if action == "delete":
            await rt.threads.delete(thread_id)
            console.print(f"deleted {thread_id}")
        elif action == "show":
            state = await rt.threads.get_state(thread_id)
            for m in state["values"].get("messages", []):
                console.print(Text.assemble((f"{m['type']:>6} › ", "bold"), text_of(m["content"])[:500]))
            usage = (await rt.timeline(thread_id, spans=False))["usage"]
            console.print(Text(f"tokens › {describe_usage(usage)} (its background tasks' included)", style="dim"))
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


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Help with each option's default, and without ``(default: None)`` for options that have none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False, []) or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    from backchannel.demo import DEFAULT_PROMPT, DEMO_DATABASE
    from backchannel.runtime import DEFAULT_STORE

    parser = argparse.ArgumentParser(prog="backchannel", description="Deep agents with background subagents. "
                                     "Without a command: the chat.", formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"backchannel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{" + ",".join(COMMANDS) + "}")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, formatter_class=_HelpFormatter)
        p.add_argument("--verbose", "-v", action="store_true",
                       help="show the library's log lines (also: BACKCHANNEL_LOG=info or debug)")
        return p

    def database(p: argparse.ArgumentParser, default: str | None) -> None:
        """``--database``, the same for every command; without a default, the configuration's is used."""
        where = "where state lives: sqlite:///path or postgresql://..."
        p.add_argument("--database", default=default, metavar="URL",
                       help=where if default else f"{where} (default: the configuration's, else {DEFAULT_STORE})")
        p.add_argument("--store", dest="database", help=argparse.SUPPRESS)  # the older name

    model_help = "provider:name (openai:gpt-4o-mini), module:attribute, or offline"
    chat = command("chat", "talk with your agent (what `backchannel` alone does)")
    chat.add_argument("--model", default=None, help=f"{model_help} (default: BACKCHANNEL_MODEL, the configuration's, "
                                                    "a provider whose API key is set, else offline)")
    chat.add_argument("--thread", default=None, metavar="ID", help="continue this thread (its first characters "
                                                                   "are enough)")
    chat.add_argument("--config", default=None, metavar="PATH", help="configuration file (default: "
                                                                     "~/.backchannel/config.toml)")
    database(chat, None)
    chat.add_argument("--url", default=None, help="chat with the assistant of a backchannel server instead "
                                                  "(the configuration's agent name; API key from BACKCHANNEL_API_KEY)")

    demo = command("demo", "a supervisor with researcher and analyst subagents in the background")
    demo.add_argument("--prompt", default=DEFAULT_PROMPT, help="the question for the supervisor")
    demo.add_argument("--model", default=None, help=f"{model_help} (default: BACKCHANNEL_MODEL, a provider whose "
                                                    "API key is set, else offline scripted models)")
    database(demo, DEMO_DATABASE)
    demo.add_argument("--web", action="store_true", help="serve the demo as a web page instead")
    demo.add_argument("--port", type=int, default=8123, help="the web page's port (with --web)")
    demo.add_argument("--no-browser", action="store_true", help="don't open a browser (with --web)")

    run = command("run", "answer one question with your agent (as configured for the chat), waiting for its "
                         "background tasks")
    run.add_argument("prompt", help="the question")
    run.add_argument("--model", default=None, help=f"{model_help} (default: as for the chat)")
    run.add_argument("--thread", default=None, metavar="ID", help="continue this thread (its first characters "
                                                                  "are enough)")
    run.add_argument("--config", default=None, metavar="PATH", help="configuration file (default: "
                                                                    "~/.backchannel/config.toml)")
    database(run, None)
    run.add_argument("--url", default=None, help="ask an assistant on this server instead")
    run.add_argument("--assistant", default="agent", help="the server's assistant to ask (with --url)")

    threads = command("threads", "list, show, tree or delete threads")
    threads.add_argument("action", nargs="?", default="list", choices=["list", "show", "tree", "delete"],
                         help="what to do")
    threads.add_argument("thread_id", nargs="?", metavar="ID", help="the thread (its first characters are enough)")
    database(threads, DEFAULT_STORE)
    threads.add_argument("--url", default=None, help="a backchannel or LangGraph server to work on instead")

    serve = command("serve", "serve agents over the LangGraph HTTP API")
    serve.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    serve.add_argument("--port", type=int, default=8123, help="the port to listen on")
    database(serve, DEFAULT_STORE)
    serve.add_argument("--agents", nargs="+", default=[], metavar="[ID=]MODULE:ATTR",
                       help="agents to serve, e.g. myapp.agents:supervisor (default: a deep agent on --model)")
    serve.add_argument("--model", default=None, help=f"{model_help}: the model of the default agent and of --demo "
                                                     "(default: BACKCHANNEL_MODEL, a provider whose API key is set)")
    serve.add_argument("--demo", action="store_true",
                       help="serve the demo supervisor and its web page at / (offline unless --model)")
    serve.add_argument("--api-key", default=os.environ.get("BACKCHANNEL_API_KEY"),
                       help="require this key in x-api-key (default: $BACKCHANNEL_API_KEY)")
    serve.add_argument("--no-auth", action="store_true", help="serve a non-loopback host without an API key")
    serve.add_argument("--public-url", default=None, metavar="URL",
                       help="where other servers reach this one (default: http://HOST:PORT)")
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
                            "before it is disconnected")
    serve.add_argument("--max-concurrency", type=int, default=256, metavar="N",
                       help="runs executing at once in this process; more wait in the queue (each live run "
                            "streaming a model's tokens holds about 30 KiB)")
    serve.add_argument("--checkpointer-ttl", default=None, metavar="JSON",
                       help="threads' retention, as LangGraph's checkpointer.ttl: '{\"strategy\": \"delete\" or "
                            "\"keep_latest\", \"default_ttl\": minutes, \"sweep_interval_minutes\": 5}'")
    serve.add_argument("--store-ttl", default=None, metavar="JSON",
                       help="store items' retention, as LangGraph's store.ttl: '{\"default_ttl\": minutes, "
                            "\"refresh_on_read\": true, \"sweep_interval_minutes\": 5}'")
    return parser


def run_serve(args: argparse.Namespace, console: Console) -> int:
    from backchannel.server import import_agents, serve
    from backchannel.server.serving import is_loopback

    try:
        thread_ttl, store_ttl = _ttl_settings(args)
    except (ValueError, BackchannelError) as exc:
        console.print(f"[red]bad retention setting:[/] {escape(str(exc))}")
        return 2
    if not is_loopback(args.host) and not args.api_key and not args.no_auth:
        console.print(f"[red]refusing to serve {args.host} without an API key:[/] pass --api-key (or set "
                      "BACKCHANNEL_API_KEY), or --no-auth if the network is trusted")
        return 2
    spec = resolve_model(args.model)
    model = _usable_model(spec) if spec is not None else None  # refused now, not at every run
    agents = import_agents(args.agents)
    demo_page = None
    if args.demo:
        from backchannel.demo import build_demo
        from backchannel.server import DemoPage

        agents["supervisor"] = build_demo(model)
        demo_page = DemoPage("supervisor", spec)
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
          client_timeout=args.client_timeout, max_concurrency=args.max_concurrency, thread_ttl=thread_ttl,
          store_ttl=store_ttl)
    return 0


def _ttl_settings(args: argparse.Namespace) -> tuple[ThreadTTLConfig | None, StoreTTLConfig | None]:
    """``--checkpointer-ttl`` and ``--store-ttl`` (JSON objects, as in langgraph.json)."""
    from backchannel.runtime.retention import StoreTTLConfig, ThreadTTLConfig

    def parsed(option: str | None, name: str) -> Any:
        try:
            return json.loads(option) if option else None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{name} is not JSON: {exc}") from None

    threads, store = parsed(args.checkpointer_ttl, "--checkpointer-ttl"), parsed(args.store_ttl, "--store-ttl")
    return (ThreadTTLConfig.from_mapping(threads) if threads is not None else None,
            StoreTTLConfig.from_mapping(store) if store is not None else None)


def _names(option: str | None) -> list[str] | None:
    """A comma-separated option as a list (``None`` when not given)."""
    return [n.strip() for n in option.split(",") if n.strip()] if option else None


def _usable_model(spec: str) -> Any:
    """The model ``spec`` names, made once to check it can be used (known provider, its API key set, importable):
    a :class:`~backchannel.config.ConfigError` saying what is wrong otherwise."""
    from backchannel.config import ConfigError, load_model
    from backchannel.models import init_model

    model = load_model(spec)
    try:
        return init_model(model)
    except (ValueError, TypeError, ImportError, BackchannelError) as exc:
        raise ConfigError(f"cannot use model {spec!r}: {exc}") from None


def run_demo_web(prompt: str, model: Any, label: str | None, database: str, port: int, open_browser: bool,
                 console: Console) -> int:
    """The demo as a web page on this machine: a chat with the supervisor and live subagent cards."""
    from backchannel.demo import build_demo
    from backchannel.server import DemoPage, serve

    page = DemoPage("supervisor", label, prompt)
    url = f"http://127.0.0.1:{port}/"
    console.print(Panel(f"[bold]backchannel demo[/] — open [bold]{url}[/] in a browser (Ctrl+C stops it)\n"
                        f"[dim]{escape(page.model_label)} · state: {escape(database)}[/]", border_style="blue"))

    def open_page() -> None:
        import webbrowser

        webbrowser.open(url)

    serve({"supervisor": build_demo(model)}, port=port, database=database, demo_page=page, log_level="warning",
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
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:
        return _unknown_command(argv[0])
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, "chat")  # `backchannel` alone, or with the chat's options, is the chat
    args = _parser().parse_args(argv)
    console = Console()
    show_logs(console, verbose=args.verbose)
    try:
        missing = _server_extra_missing() if args.command == "serve" or getattr(args, "web", False) else None
        if missing:
            console.print(f"[red]{escape(missing)}[/]")
            return 2
        return _run(args, console)
    except KeyboardInterrupt:
        console.print("[dim]stopped; unfinished runs resume next time[/]")
        return 130
    except Exception as exc:  # a readable line on stderr rather than a traceback
        from backchannel.config import ConfigError

        readable = isinstance(exc, (ConfigError, BackchannelError))
        problem = str(exc) if readable else f"{type(exc).__name__}: {exc}"
        Console(stderr=True).print(f"[red]error:[/] {escape(problem)}", soft_wrap=True)
        return 2 if isinstance(exc, ConfigError) else 1


def _run(args: argparse.Namespace, console: Console) -> int:
    """The command ``args`` names; returns the exit code (1: the run failed)."""
    if args.command == "chat":
        from backchannel.chat import run_chat

        return asyncio.run(run_chat(model=args.model, config_file=args.config, database=args.database,
                                    thread_id=args.thread, console=console, url=args.url))
    if args.command == "demo":
        label = resolve_model(args.model)
        model = _usable_model(label) if label else None
        if args.web:
            return run_demo_web(args.prompt, model, label, args.database, args.port, not args.no_browser, console)
        return 0 if asyncio.run(run_demo(args.prompt, model, label, args.database, console)) else 1
    if args.command == "run":
        if args.url:
            succeeded = asyncio.run(run_remote(args.prompt, args.url, args.assistant, args.thread, console))
        else:
            succeeded = asyncio.run(run_once(args.prompt, args.model, args.thread, args.database, args.config,
                                             console))
        return 0 if succeeded else 1
    if args.command == "serve":
        return run_serve(args, console)
    return asyncio.run(run_threads(args.action, args.thread_id, args.database, console, args.url))


def _unknown_command(name: str) -> int:
    close = difflib.get_close_matches(name, COMMANDS, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    print(f"backchannel: unknown command {name!r}{hint}; the commands are {', '.join(COMMANDS)}; "
          "backchannel --help says more", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
