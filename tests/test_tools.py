"""Tools: @tool, schemas from hints and docstrings, validation, and how tools behave inside a run."""

import asyncio
import operator
import threading
import time
from typing import Annotated, Literal, TypedDict

import pytest

from backchannel import (
    AIMessage,
    HumanMessage,
    ScriptedModel,
    Tool,
    ToolMessage,
    ToolResult,
    ToolRuntime,
    create_agent,
    tool,
)
from backchannel.agent import initial_state
from backchannel.context import RunContext
from backchannel.models.base import ChatModel, FinishDelta, TextDelta, ToolCallDelta
from backchannel.tools import ToolArgumentsError, ToolDefinitionError, ToolDefinitionWarning, parse_docstring


def call(name, args=None, id="call_1"):
    return {"name": name, "args": args or {}, "id": id}


def tool_messages(state):
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


# -- @tool -------------------------------------------------------------------------


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number,
            which may be negative.
    """
    return a + b


@tool
async def slow_echo(text: str) -> str:
    """Echo the text back."""
    await asyncio.sleep(0)
    return text


async def test_tool_on_sync_and_async_functions():
    assert isinstance(add, Tool) and isinstance(slow_echo, Tool)
    assert not add.is_async and slow_echo.is_async
    assert await add.ainvoke({"a": 2, "b": 3}) == 5
    assert await slow_echo.ainvoke({"text": "hey"}) == "hey"


async def test_sync_tools_run_off_the_event_loop_thread():
    seen = {}

    @tool
    def where() -> str:
        """Report the thread."""
        seen["thread"] = threading.get_ident()
        return "ok"

    await where.ainvoke({})
    assert seen["thread"] != threading.get_ident()


async def test_inline_sync_tools_run_on_the_event_loop_thread():
    seen = {}

    @tool(inline=True)
    def here() -> str:
        """Report the thread."""
        seen["thread"] = threading.get_ident()
        return "ok"

    assert here.inline and not add.inline
    agent = create_agent(ScriptedModel([{"tool_calls": [call("here")]}, "done"]), [here])
    state = await agent.ainvoke("go")
    assert seen["thread"] == threading.get_ident()
    assert [m.text for m in tool_messages(state)] == ["ok"]


async def test_a_slow_sync_tool_does_not_block_the_event_loop():
    @tool
    def slow(seconds: float) -> str:
        """Block the calling thread."""
        time.sleep(seconds)
        return "slept"

    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    # four parallel calls of 0.3 s: in worker threads they overlap, and the loop keeps ticking
    script = [{"tool_calls": [call("slow", {"seconds": 0.3}, f"c{i}") for i in range(4)]}, "done"]
    agent = create_agent(ScriptedModel(script), [slow])
    ticking = asyncio.create_task(ticker())
    start = time.perf_counter()
    state = await agent.ainvoke("go")
    elapsed = time.perf_counter() - start
    ticking.cancel()
    assert [m.text for m in tool_messages(state)] == ["slept"] * 4
    assert elapsed < 1.0  # 1.2 s if the calls ran one after another
    assert ticks >= 10  # about 30 if nothing else competes for the CPU; none if the loop were blocked


async def test_more_parallel_sync_calls_than_worker_threads_all_complete():
    @tool
    def double(x: int) -> int:
        """Twice x, after a short block."""
        time.sleep(0.01)
        return 2 * x

    n = 80  # each call that finds no idle worker thread starts one
    script = [{"tool_calls": [call("double", {"x": i}, f"c{i}") for i in range(n)]}, "done"]
    state = await create_agent(ScriptedModel(script), [double]).ainvoke("go")
    assert [m.text for m in tool_messages(state)] == [str(2 * i) for i in range(n)]


def test_decorator_options():
    @tool(name="renamed", description="Custom description.", return_direct=True)
    def f(x: int) -> int:
        """Ignored docstring."""
        return x

    assert f.name == "renamed"
    assert f.description == "Custom description."
    assert f.return_direct is True
    assert f.schema()["name"] == "renamed"


def test_schema_from_hints_and_google_docstring():
    schema = add.schema()
    assert schema["name"] == "add"
    assert schema["description"] == "Add two numbers."
    params = schema["parameters"]
    assert params["type"] == "object"
    assert params["required"] == ["a", "b"]
    assert params["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert params["properties"]["b"]["description"] == "The second number, which may be negative."
    assert "title" not in params and "title" not in params["properties"]["a"]


def test_schema_from_sphinx_docstring():
    @tool
    def search(query: str, limit: int = 5) -> list[str]:
        """Search the web.

        :param query: What to look for.
        :param int limit: How many results
            to return at most.
        :returns: The results.
        """
        return []

    assert search.description == "Search the web."
    props = search.parameters["properties"]
    assert props["query"]["description"] == "What to look for."
    assert props["limit"]["description"] == "How many results to return at most."


def test_google_args_with_types_in_parentheses():
    desc, params = parse_docstring("""Do it.

    Args:
        path (str): Where.
        mode (Literal["r", "w"], optional): How.

    Returns:
        Something: not a parameter.
    """)
    assert desc == "Do it."
    assert params == {"path": "Where.", "mode": "How."}


def test_schema_defaults_optional_literal_and_list_types():
    @tool
    def configure(
        name: str,
        tags: list[str],
        mode: Literal["fast", "slow"] = "fast",
        limit: int | None = None,
        verbose: bool = False,
    ) -> str:
        """Configure something."""
        return name

    params = configure.parameters
    props = params["properties"]
    assert params["required"] == ["name", "tags"]
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["mode"]["enum"] == ["fast", "slow"]
    assert props["mode"]["default"] == "fast"
    assert props["limit"]["default"] is None
    assert {"type": "integer"} in props["limit"]["anyOf"] and {"type": "null"} in props["limit"]["anyOf"]
    assert props["verbose"] == {"type": "boolean", "default": False}


def test_a_tool_without_docstring_is_warned_about_and_uses_its_name():
    with pytest.warns(ToolDefinitionWarning, match=r"tool 'ping' has no docstring.*add one.*or pass description=") as w:
        @tool
        def ping():
            return "pong"

    assert w[0].filename == __file__  # the warning points at the decorated function, not at backchannel
    assert ping.description == "ping"
    assert ping.parameters["properties"] == {}


def test_an_untyped_argument_is_warned_about_with_the_fix():
    with pytest.warns(ToolDefinitionWarning, match=r"parameter 'n' of tool 'double' has no type hint.*n: int"):
        @tool
        def double(n):
            """Double a number."""
            return n * 2


def test_args_naming_a_missing_parameter_is_refused():
    with pytest.raises(ToolDefinitionError, match=r"'qurey'.*no such parameter \(parameters: query, limit\)"):
        @tool
        def search(query: str, limit: int = 5) -> str:
            """Search.

            Args:
                qurey: What to look for.
                limit: How many.
            """
            return query


def test_a_name_models_cannot_call_is_refused():
    with pytest.raises(ToolDefinitionError, match=r"'<lambda>' is not a valid tool name.*name="):
        tool(lambda x: x)
    with pytest.raises(ToolDefinitionError, match="'two words'"):
        tool(name="two words", description="d")(lambda: 1)
    assert tool(name="ok-name_1", description="Works.")(lambda: 1).name == "ok-name_1"


def test_a_well_defined_tool_gets_no_warning(recwarn):
    @tool
    def greet(name: str, runtime: ToolRuntime, *args, **kwargs) -> str:
        """Greet someone.

        Args:
            name: Who to greet.
        """
        return name

    Tool(lambda **kw: kw, name="raw", description="Raw.", args_schema={"type": "object", "properties": {}})
    assert not [w for w in recwarn if issubclass(w.category, ToolDefinitionWarning)]


def test_runtime_parameter_is_not_in_the_schema():
    @tool
    def who(x: int, runtime: ToolRuntime) -> str:
        """Who am I."""
        return runtime.agent_name

    assert who.runtime_param == "runtime"
    assert list(who.parameters["properties"]) == ["x"]


def test_json_schema_args_schema_is_used_as_is_and_checks_required():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    t = Tool(lambda **kw: kw, name="raw", description="Raw.", args_schema=schema)
    assert t.parameters is schema
    assert t.validate({"q": "x"}) == {"q": "x"}
    with pytest.raises(ToolArgumentsError, match="missing required argument.*q"):
        t.validate({})


# -- validation ------------------------------------------------------------------------


def test_validation_fills_defaults_and_coerces():
    @tool
    def f(n: int, mode: Literal["a", "b"] = "a") -> str:
        """F."""
        return mode

    assert f.validate({"n": "3"}) == {"n": 3, "mode": "a"}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ({"a": 1}, "'b': Field required"),
        ({"a": "one", "b": 2}, "'a': Input should be a valid integer"),
        ([1, 2], "arguments must be a JSON object, got list"),
    ],
)
def test_validation_errors_say_what_is_wrong(args, expected):
    with pytest.raises(ToolArgumentsError, match=expected):
        add.validate(args)


def test_literal_validation_names_the_allowed_values():
    @tool
    def f(mode: Literal["fast", "slow"]) -> str:
        """F."""
        return mode

    with pytest.raises(ToolArgumentsError) as err:
        f.validate({"mode": "medium"})
    assert "'fast'" in str(err.value) and "'slow'" in str(err.value) and "medium" in str(err.value)


# -- tools inside a run: failures go back to the model ----------------------------------


def _agent(script, tools, **kw):
    model = ScriptedModel(script)
    model.record = True
    return create_agent(model, tools, **kw), model


async def test_bad_arguments_become_an_error_tool_message_and_the_run_continues():
    agent, model = _agent([{"tool_calls": [call("add", {"a": 1})]}, "final"], [add])
    state = await agent.ainvoke("add")
    [msg] = tool_messages(state)
    assert msg.status == "error"
    assert msg.tool_call_id == "call_1"
    assert "invalid arguments for tool 'add'" in msg.text
    assert "'b': Field required" in msg.text
    assert state["messages"][-1].text == "final"
    # the model saw the error on its next call
    assert model.requests[1].messages[-1] is msg


async def test_unknown_tool_becomes_an_error_naming_the_available_tools():
    agent, _ = _agent([{"tool_calls": [call("multiply", {"a": 1})]}, "final"], [add, slow_echo])
    state = await agent.ainvoke("go")
    [msg] = tool_messages(state)
    assert msg.status == "error"
    assert "no tool named 'multiply'" in msg.text
    assert "add" in msg.text and "slow_echo" in msg.text
    assert state["messages"][-1].text == "final"


async def test_tool_exception_becomes_an_error_and_the_run_continues():
    @tool
    def explode(x: int) -> str:
        """Always fails."""
        raise ValueError(f"cannot handle {x}")

    agent, _ = _agent([{"tool_calls": [call("explode", {"x": 7})]}, "recovered"], [explode])
    state = await agent.ainvoke("go")
    [msg] = tool_messages(state)
    assert msg.status == "error"
    assert "tool 'explode' failed: ValueError: cannot handle 7" in msg.text
    assert state["messages"][-1].text == "recovered"


async def test_a_sync_tool_raising_stop_iteration_fails_like_any_other():
    @tool
    def first(items: list[int]) -> int:
        """The first item."""
        return next(iter(items))

    agent, _ = _agent([{"tool_calls": [call("first", {"items": []})]}, "recovered"], [first])
    state = await asyncio.wait_for(agent.ainvoke("go"), 5)
    [msg] = tool_messages(state)
    assert msg.status == "error" and "StopIteration" in msg.text


class _Unusual(BaseException):
    """Not an Exception: what a library's own control-flow signal might derive from."""


def _argparse_cli(argv):
    import argparse

    parser = argparse.ArgumentParser(prog="convert")
    parser.add_argument("--count", type=int, required=True)
    return parser.parse_args(argv).count  # exits (SystemExit 2) on a bad argument


@pytest.mark.parametrize("raised", ["argparse", "SystemExit", "KeyboardInterrupt", "BaseException"])
@pytest.mark.parametrize("kind", ["sync", "inline", "async"])
async def test_a_tool_raising_a_base_exception_becomes_an_error_like_any_other(kind, raised):
    def body() -> str:
        if raised == "argparse":
            _argparse_cli(["--count", "many"])
        exc = {"SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
               "BaseException": _Unusual("odd")}[raised]
        raise exc

    if kind == "async":
        @tool
        async def convert() -> str:
            """Convert."""
            await asyncio.sleep(0)
            return body()
    else:
        @tool(inline=kind == "inline")
        def convert() -> str:
            """Convert."""
            return body()

    @tool
    async def fine() -> str:
        """Fine."""
        await asyncio.sleep(0.05)
        return "fine"

    agent, model = _agent([{"tool_calls": [call("convert", {}, "c1"), call("fine", {}, "c2")]}, "recovered"],
                          [convert, fine])
    state = await asyncio.wait_for(agent.ainvoke("go"), 10)
    by_id = {m.tool_call_id: m for m in tool_messages(state)}
    assert by_id["c1"].status == "error" and "tool 'convert' failed" in by_id["c1"].text
    assert {"argparse": "SystemExit", "SystemExit": "SystemExit", "KeyboardInterrupt": "KeyboardInterrupt",
            "BaseException": "_Unusual"}[raised] in by_id["c1"].text
    assert by_id["c2"].status == "success" and by_id["c2"].text == "fine"  # its sibling is untouched
    assert state["messages"][-1].text == "recovered"
    assert model.requests[1].messages[-2:] == [by_id["c1"], by_id["c2"]]


async def test_invalid_tool_calls_on_the_ai_message_become_errors():
    bad = AIMessage("", invalid_tool_calls=[{"name": "add", "args": '{"a": 1,', "id": "call_bad",
                                             "error": "Expecting value", "type": "invalid_tool_call"}])
    agent, model = _agent([bad, "fixed"], [add])
    state = await agent.ainvoke("go")
    [msg] = tool_messages(state)
    assert msg.status == "error"
    assert msg.tool_call_id == "call_bad"
    assert "could not be read" in msg.text and "Expecting value" in msg.text
    assert '{"a": 1,' in msg.text  # the model sees what it sent
    assert state["messages"][-1].text == "fixed"
    assert model.calls == 2


class BrokenArgsModel(ChatModel):
    """Streams a tool call whose JSON arguments are cut off, then answers."""

    name = "broken"

    def __init__(self):
        self.calls = 0

    async def stream(self, request):
        self.calls += 1
        if self.calls == 1:
            yield ToolCallDelta(0, "call_x", "add", '{"a": 1, ')
            yield ToolCallDelta(0, None, None, '"b": ')
            yield FinishDelta(finish_reason="tool_calls")
        else:
            yield TextDelta("done")
            yield FinishDelta(finish_reason="stop")


@pytest.mark.parametrize("streaming", [False, True])
async def test_malformed_streamed_arguments_become_an_error(streaming):
    agent = create_agent(BrokenArgsModel(), [add])
    if streaming:
        stream = agent.astream("go")
        events = [e async for e in stream]
        state = stream.result
        errors = [e for e in events if e.type == "tool" and e.data["event"] == "error"]
        assert [e.data["tool_call_id"] for e in errors] == ["call_x"]
    else:
        state = await agent.ainvoke("go")
    [msg] = tool_messages(state)
    assert msg.status == "error"
    assert "not valid JSON" in msg.text
    assert '{"a": 1, "b": ' in msg.text
    assert state["messages"][-1].text == "done"


# -- return_direct -----------------------------------------------------------------------


async def test_return_direct_ends_the_run_with_the_tool_result():
    @tool(return_direct=True)
    def lookup(key: str) -> str:
        """Look up a value."""
        return f"value-of-{key}"

    agent, model = _agent([{"tool_calls": [call("lookup", {"key": "k"})]}], [lookup])
    state = await agent.ainvoke("go")
    assert model.calls == 1  # no model call after the tool
    last = state["messages"][-1]
    assert isinstance(last, ToolMessage) and last.text == "value-of-k"


async def test_tool_result_return_direct_flag():
    @tool
    def decide() -> ToolResult:
        """Decide."""
        return ToolResult("decided", return_direct=True)

    agent, model = _agent([{"tool_calls": [call("decide")]}], [decide])
    state = await agent.ainvoke("go")
    assert model.calls == 1
    assert state["messages"][-1].text == "decided"


async def test_failed_return_direct_tool_does_not_end_the_run():
    @tool(return_direct=True)
    def fragile(x: int) -> str:
        """Fragile."""
        return "x"

    agent, model = _agent([{"tool_calls": [call("fragile", {})]}, "answered anyway"], [fragile])
    state = await agent.ainvoke("go")
    assert model.calls == 2
    assert state["messages"][-1].text == "answered anyway"


# -- ToolResult(update=...) ----------------------------------------------------------------


class NotesState(TypedDict):
    notes: Annotated[list[str], operator.add]


async def test_tool_result_update_uses_the_state_schema_reducer():
    @tool
    def note(text: str) -> ToolResult:
        """Take a note."""
        return ToolResult(f"noted {text}", update={"notes": [text]})

    script = [
        {"tool_calls": [call("note", {"text": "a"}, "c1"), call("note", {"text": "b"}, "c2")]},
        {"tool_calls": [call("note", {"text": "c"}, "c3")]},
        "done",
    ]
    agent, _ = _agent(script, [note], state_schema=NotesState)
    state = await agent.ainvoke({"messages": ["go"], "notes": ["start"]})
    assert state["notes"] == ["start", "a", "b", "c"]
    assert [m.text for m in tool_messages(state)] == ["noted a", "noted b", "noted c"]


async def test_tool_result_update_with_messages_appends_after_the_tool_message():
    @tool
    def remind() -> ToolResult:
        """Remind."""
        return ToolResult({"ok": True}, update={"messages": [HumanMessage("reminder: be nice")]})

    agent, model = _agent([{"tool_calls": [call("remind")]}, "done"], [remind])
    state = await agent.ainvoke("go")
    kinds = [(m.type, m.text) for m in state["messages"]]
    assert kinds[2:] == [("tool", '{"ok": true}'), ("human", "reminder: be nice"), ("ai", "done")]
    assert model.requests[1].messages[-1].text == "reminder: be nice"


async def test_non_string_tool_output_is_json():
    @tool
    def data() -> dict:
        """Data."""
        return {"a": [1, 2]}

    agent, _ = _agent([{"tool_calls": [call("data")]}, "done"], [data])
    state = await agent.ainvoke("go")
    assert tool_messages(state)[0].text == '{"a": [1, 2]}'


def _circular() -> list:
    loop: list = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize("value", ["circular list", "object in content blocks", "circular dict", "circular block"])
@pytest.mark.parametrize("where", ["memory", "sqlite"])
async def test_a_tool_result_that_cannot_be_serialised_is_an_error_the_model_sees(value, where, tmp_path):
    from backchannel.runtime import LocalRuntime

    make = {"circular list": _circular,
            "object in content blocks": lambda: [{"type": "text", "text": "a chart:"},
                                                 {"type": "image", "data": object()}],
            "circular dict": lambda: (lambda d: (d.__setitem__("self", d), d)[1])({}),
            "circular block": lambda: [{"type": "text", "text": "x", "extras": _circular()}]}[value]

    @tool
    def produce() -> object:
        """Produce a value."""
        return make()

    agent, model = _agent([{"tool_calls": [call("produce", {}, "c1")]}, "recovered"], [produce])
    url = "memory" if where == "memory" else f"sqlite:///{tmp_path}/t.db"
    async with LocalRuntime(url, agents={"agent": agent}) as rt:
        state = await agent.ainvoke("go", thread_id="t1")
        [msg] = tool_messages(state)
        assert msg.status == "error" and "tool 'produce'" in msg.text and "serialis" in msg.text
        assert state["messages"][-1].text == "recovered"
        assert model.requests[1].messages[-1].tool_call_id == "c1"
        assert model.requests[1].messages[-1].status == "error"
        [run] = await rt.runs.list("t1")
        assert run["status"] == "success"
        stored = (await rt.threads.get_state("t1"))["values"]["messages"]
        assert [m["status"] for m in stored if m["type"] == "tool"] == ["error"]


# -- ToolRuntime -------------------------------------------------------------------------


async def test_tool_runtime_is_injected():
    seen = {}

    @tool
    async def inspect_run(x: int, runtime: ToolRuntime) -> str:
        """Inspect the run."""
        seen.update(thread_id=runtime.thread_id, agent=runtime.agent_name, call_id=runtime.tool_call_id,
                    first=runtime.state["messages"][0].text, context=runtime.context, x=x)
        runtime.emit({"progress": 0.5})
        return "ok"

    model = ScriptedModel([{"tool_calls": [call("inspect_run", {"x": 1}, "call_rt")]}, "done"])
    agent = create_agent(model, [inspect_run], name="inspector")
    stream = agent.astream("hello", context={"user": "u1"})
    events = [e async for e in stream]
    assert seen == {"thread_id": None, "agent": "inspector", "call_id": "call_rt", "first": "hello",
                    "context": {"user": "u1"}, "x": 1}
    [custom] = [e for e in events if e.type == "custom"]
    assert custom.data == {"progress": 0.5}
    assert custom.agent == "inspector"
    # the custom event comes between the tool's start and finish
    order = [(e.type, e.data.get("event") if isinstance(e.data, dict) else None) for e in events]
    assert order.index(("tool", "started")) < order.index(("custom", None)) < order.index(("tool", "finished"))


async def test_tool_runtime_sees_the_thread_id_of_the_run():
    seen = {}

    @tool
    def where(runtime: ToolRuntime) -> str:
        """Where."""
        seen["thread_id"] = runtime.thread_id
        seen["run_id"] = runtime.run_id
        return "ok"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("where")]}, "done"]), [where])
    ctx = RunContext("agent", "run-1", thread_id="thread-1")
    result = await agent.run(initial_state("go"), ctx)
    assert result.status == "success"
    assert seen == {"thread_id": "thread-1", "run_id": "run-1"}


async def test_a_json_schema_tool_with_a_runtime_leaves_the_models_arguments_as_they_were():
    seen = {}

    def lookup(runtime: ToolRuntime, **arguments):
        seen.update(arguments)
        return "found"

    given = {"key": "k"}
    schema_tool = Tool(lookup, name="lookup", description="Look a key up.",
                       args_schema={"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]})
    assert await schema_tool.ainvoke(given, ToolRuntime(None, None, "a", "c", {})) == "found"
    assert given == {"key": "k"} and seen == {"key": "k"}  # the runtime went to the function, not into the args
