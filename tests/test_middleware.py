"""Middleware: hook order, decorator forms, fail-fast, jump_to, state/tools/prompt extension,
wrap_* hooks, context propagation, and after_agent (seed 003)."""

import asyncio
import contextvars
import operator
import time
from typing import Annotated, TypedDict

import pytest
from subagent_helpers import stack_looker

from backchannel import (
    AIMessage,
    HumanMessage,
    MaxIterationsError,
    Middleware,
    MiddlewareError,
    ModelError,
    ScriptedModel,
    ToolMessage,
    ToolResult,
    after_agent,
    after_model,
    after_tool_call,
    before_agent,
    before_model,
    create_agent,
    tool,
    wrap_model_call,
    wrap_tool_call,
)


def call(name, args=None, id="call_1"):
    return {"name": name, "args": args or {}, "id": id}


def recording(script, **kw):
    model = ScriptedModel(script, **kw)
    model.record = True
    return model


@tool
def add(a: int, b: int) -> int:
    """Add."""
    return a + b


class Recorder(Middleware):
    """Logs every hook it sees as '<tag>.<hook>'."""

    def __init__(self, tag, log):
        self.tag = tag
        self.log = log

    @property
    def name(self):
        return self.tag

    async def before_agent(self, state, ctx):
        self.log.append(f"{self.tag}.before_agent")

    async def before_model(self, state, ctx):
        self.log.append(f"{self.tag}.before_model")

    async def wrap_model_call(self, request, handler):
        self.log.append(f"{self.tag}.wrap_model_call>")
        result = await handler(request)
        self.log.append(f"{self.tag}.wrap_model_call<")
        return result

    async def after_model(self, state, ctx):
        self.log.append(f"{self.tag}.after_model")

    async def wrap_tool_call(self, request, handler):
        self.log.append(f"{self.tag}.wrap_tool_call>")
        result = await handler(request)
        self.log.append(f"{self.tag}.wrap_tool_call<")
        return result

    async def after_tool_call(self, request, result):
        self.log.append(f"{self.tag}.after_tool_call")
        return result

    async def after_agent(self, state, ctx):
        self.log.append(f"{self.tag}.after_agent")


# -- order ---------------------------------------------------------------------------


async def test_hook_order_is_exact():
    log = []

    @tool
    def work() -> str:
        """Work."""
        log.append("tool")
        return "done"

    agent = create_agent(ScriptedModel([{"tool_calls": [call("work")]}, "final"]), [work],
                         middleware=[Recorder("A", log), Recorder("B", log)])
    state = await agent.ainvoke("go")
    assert state["messages"][-1].text == "final"
    model_turn = ["A.before_model", "B.before_model",
                  "A.wrap_model_call>", "B.wrap_model_call>", "B.wrap_model_call<", "A.wrap_model_call<",
                  "B.after_model", "A.after_model"]
    assert log == [
        "A.before_agent", "B.before_agent",
        *model_turn,
        "A.wrap_tool_call>", "B.wrap_tool_call>", "tool", "B.wrap_tool_call<", "A.wrap_tool_call<",
        "B.after_tool_call", "A.after_tool_call",
        *model_turn,
        "B.after_agent", "A.after_agent",
    ]


async def test_only_overridden_hooks_run_and_base_middleware_is_a_no_op():
    class Nothing(Middleware):
        pass

    agent = create_agent(ScriptedModel(["ok"]), middleware=[Nothing()])
    state = await agent.ainvoke("hi")
    assert state["messages"][-1].text == "ok"


# -- decorator forms -----------------------------------------------------------------------


async def test_decorators_on_sync_and_async_functions():
    log = []

    @before_agent
    def ba(state, ctx):
        log.append(("before_agent", ctx.agent))

    @before_model
    async def bm(state, ctx):
        log.append(("before_model", len(state["messages"])))

    @after_model
    def am(state, ctx):
        log.append(("after_model", state["messages"][-1].text))

    @after_agent
    async def aa(state, ctx):
        log.append(("after_agent", state["messages"][-1].text))

    @wrap_model_call
    async def wm(request, handler):
        log.append(("wrap_model_call", request.system_prompt))
        return await handler(request)

    @wrap_tool_call
    async def wt(request, handler):
        log.append(("wrap_tool_call", request.call["name"]))
        return await handler(request)

    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "2"]), [add],
                         system_prompt="sys", name="deco", middleware=[ba, bm, am, aa, wm, wt])
    await agent.ainvoke("1+1")
    assert log == [
        ("before_agent", "deco"),
        ("before_model", 1), ("wrap_model_call", "sys"), ("after_model", ""),
        ("wrap_tool_call", "add"),
        ("before_model", 3), ("wrap_model_call", "sys"), ("after_model", "2"),
        ("after_agent", "2"),
    ]


async def test_decorated_middleware_is_named_after_the_function_or_the_given_name():
    @before_model
    def my_hook(state, ctx):
        return None

    @before_model(name="custom")
    def other(state, ctx):
        return None

    assert isinstance(my_hook, Middleware) and my_hook.name == "my_hook"
    assert other.name == "custom"


async def test_sync_decorated_wrap_hooks_may_return_the_handlers_awaitable():
    @wrap_model_call
    def shout(request, handler):
        return handler(request.override(system_prompt="SHOUT"))

    @wrap_tool_call
    def passthrough(request, handler):
        return handler(request)

    model = recording([{"tool_calls": [call("add", {"a": 1, "b": 2})]}, "ok"])
    agent = create_agent(model, [add], middleware=[shout, passthrough])
    state = await agent.ainvoke("hi")
    assert state["messages"][-1].text == "ok"
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["3"]
    assert model.requests[0].system_prompt == "SHOUT"


# -- state updates from hooks ----------------------------------------------------------------


async def test_hook_updates_append_and_replace_messages_by_id():
    @after_model
    def redact(state, ctx):
        last = state["messages"][-1]
        return {"messages": [AIMessage(last.text.replace("secret", "*****"), id=last.id)]}

    @before_model
    def remind(state, ctx):
        return {"messages": [HumanMessage("(be brief)")]}

    model = recording(["the secret is 42"])
    agent = create_agent(model, middleware=[remind, redact])
    state = await agent.ainvoke("tell me")
    assert [m.text for m in state["messages"]] == ["tell me", "(be brief)", "the ***** is 42"]
    assert model.requests[0].messages[-1].text == "(be brief)"


class LogState(TypedDict):
    trail: Annotated[list[str], operator.add]


async def test_middleware_state_schema_extension_with_reducer():
    class Trail(Middleware):
        state_schema = LogState

        async def before_model(self, state, ctx):
            return {"trail": [f"model#{len(state.get('trail', []))}"]}

        async def after_agent(self, state, ctx):
            return {"trail": ["end"]}

    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "2"]), [add],
                         middleware=[Trail()])
    state = await agent.ainvoke({"messages": ["go"], "trail": ["input"]})
    assert state["trail"] == ["input", "model#1", "model#2", "end"]


# -- fail-fast -----------------------------------------------------------------------------


@pytest.mark.parametrize("hook", ["before_agent", "before_model", "after_model"])
async def test_fail_fast_stops_later_handlers_and_names_middleware_and_hook(hook):
    log = []

    class Failing(Middleware):
        pass

    async def fail(self, state, ctx):
        raise KeyError("missing thing")

    setattr(Failing, hook, fail)
    # after_* run in reverse order, so the failing one must come last to run first
    mws = [Recorder("second", log), Failing()] if hook.startswith("after") else [Failing(), Recorder("second", log)]
    model = ScriptedModel(["ok"])
    agent = create_agent(model, middleware=mws)
    with pytest.raises(MiddlewareError) as err:
        await agent.ainvoke("hi")
    assert err.value.middleware == "Failing" and err.value.hook == hook
    assert isinstance(err.value.error, KeyError)
    assert "Failing" in str(err.value) and hook in str(err.value) and "missing thing" in str(err.value)
    assert f"second.{hook}" not in log
    assert "second.after_agent" not in log


async def test_wrap_model_call_error_is_a_middleware_error_but_model_errors_pass_through():
    @wrap_model_call
    async def buggy(request, handler):
        raise ZeroDivisionError("oops")

    with pytest.raises(MiddlewareError) as err:
        await create_agent(ScriptedModel(["x"]), middleware=[buggy]).ainvoke("hi")
    assert err.value.middleware == "buggy" and err.value.hook == "wrap_model_call"

    @wrap_model_call
    async def transparent(request, handler):
        return await handler(request)

    with pytest.raises(ModelError, match="down"):
        await create_agent(ScriptedModel([ModelError("down")]), middleware=[transparent]).ainvoke("hi")


async def test_model_and_tool_errors_pass_through_stacked_wrappers_and_a_wrappers_own_error_names_it():
    from backchannel.errors import LostRunError

    def transparent(name, hook):
        async def wrap(request, handler):
            return await handler(request)

        wrap.__name__ = name
        return hook(wrap)

    model_layers = [transparent("outer", wrap_model_call), transparent("inner", wrap_model_call)]
    with pytest.raises(ModelError, match="down"):
        await create_agent(ScriptedModel([ModelError("down")]), middleware=model_layers).ainvoke("hi")

    @tool
    async def lost() -> str:
        """Its run is another process's now."""
        raise LostRunError("taken over")

    tool_layers = [transparent("outer", wrap_tool_call), transparent("inner", wrap_tool_call)]
    agent = create_agent(ScriptedModel([{"tool_calls": [call("lost")]}, "x"]), [lost], middleware=tool_layers)
    with pytest.raises(LostRunError, match="taken over"):
        await agent.ainvoke("hi")

    @wrap_tool_call
    async def buggy(request, handler):
        await handler(request)
        raise ZeroDivisionError("oops")

    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "x"]), [add],
                         middleware=[transparent("outer", wrap_tool_call), buggy])
    with pytest.raises(MiddlewareError) as err:
        await agent.ainvoke("hi")
    assert (err.value.middleware, err.value.hook) == ("buggy", "wrap_tool_call")


async def test_wrap_tool_call_error_fails_the_run():
    @wrap_tool_call
    async def guard(request, handler):
        raise PermissionError("blocked")

    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "x"]), [add],
                         middleware=[guard])
    with pytest.raises(MiddlewareError) as err:
        await agent.ainvoke("hi")
    assert (err.value.middleware, err.value.hook) == ("guard", "wrap_tool_call")


# -- jump_to --------------------------------------------------------------------------------


async def test_before_model_jump_to_end_skips_the_model():
    @before_model
    def stop(state, ctx):
        return {"messages": [AIMessage("canned answer")], "jump_to": "end"}

    model = ScriptedModel(["never used"])
    state = await create_agent(model, middleware=[stop]).ainvoke("hi")
    assert model.calls == 0
    assert state["messages"][-1].text == "canned answer"
    assert "jump_to" not in state


async def test_before_agent_jump_to_end_skips_everything():
    @before_agent
    def stop(state, ctx):
        return {"jump_to": "end"}

    model = ScriptedModel(["never used"])
    state = await create_agent(model, middleware=[stop]).ainvoke("hi")
    assert model.calls == 0
    assert [m.text for m in state["messages"]] == ["hi"]


async def test_after_model_jump_to_model_loops():
    seen = []

    @after_model
    def demand_please(state, ctx):
        text = state["messages"][-1].text
        seen.append(text)
        if "please" not in text:
            return {"messages": [HumanMessage("say please")], "jump_to": "model"}

    model = ScriptedModel(["give", "please give"])
    state = await create_agent(model, middleware=[demand_please]).ainvoke("hi")
    assert model.calls == 2
    assert seen == ["give", "please give"]
    assert [m.text for m in state["messages"]] == ["hi", "give", "say please", "please give"]


async def test_after_model_jump_to_end_skips_the_tool_calls():
    ran = []

    @tool
    def dangerous() -> str:
        """Danger."""
        ran.append(1)
        return "x"

    @after_model
    def veto(state, ctx):
        return {"jump_to": "end"}

    model = ScriptedModel([{"tool_calls": [call("dangerous")]}])
    await create_agent(model, [dangerous], middleware=[veto]).ainvoke("hi")
    assert ran == [] and model.calls == 1


@pytest.mark.parametrize(("hook", "target"), [("before_model", "model"), ("after_model", "tools"),
                                              ("before_agent", "model"), ("after_agent", "end")])
async def test_invalid_jump_target_is_a_middleware_error(hook, target):
    class Jumper(Middleware):
        pass

    async def jump(self, state, ctx):
        return {"jump_to": target}

    setattr(Jumper, hook, jump)
    with pytest.raises(MiddlewareError) as err:
        await create_agent(ScriptedModel(["ok", "ok"]), middleware=[Jumper()]).ainvoke("hi")
    assert err.value.hook == hook and err.value.middleware == "Jumper"
    assert repr(target) in str(err.value) and "allowed" in str(err.value)


# -- tools and system prompt from middleware ---------------------------------------------------


async def test_middleware_tools_and_system_prompt_reach_the_model():
    @tool
    def lookup(key: str) -> str:
        """Look up a key."""
        return f"<{key}>"

    class Memory(Middleware):
        tools = (lookup,)
        system_prompt = "You can look things up."

    model = recording([{"tool_calls": [call("lookup", {"key": "k"})]}, "done"])
    agent = create_agent(model, [add], system_prompt="You are helpful.", middleware=[Memory()])
    state = await agent.ainvoke("hi")
    assert model.requests[0].system_prompt == "You are helpful.\n\nYou can look things up."
    assert [t.name for t in model.requests[0].tools] == ["add", "lookup"]
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["<k>"]


async def test_middleware_system_prompt_without_agent_prompt():
    class Rules(Middleware):
        system_prompt = "Rule one."

    model = recording(["ok"])
    await create_agent(model, middleware=[Rules()]).ainvoke("hi")
    assert model.requests[0].system_prompt == "Rule one."


async def test_two_tools_with_the_same_name_is_an_error():
    @tool(name="add")
    def other_add(a: int) -> int:
        """Other."""
        return a

    class Dup(Middleware):
        tools = (other_add,)

    with pytest.raises(ValueError, match="two tools named 'add'"):
        await create_agent(ScriptedModel(["x"]), [add], middleware=[Dup()]).ainvoke("hi")


# -- wrap_model_call / wrap_tool_call -------------------------------------------------------------


async def test_wrap_model_call_modifies_the_request():
    @wrap_model_call
    async def add_date(request, handler):
        return await handler(request.override(system_prompt=f"{request.system_prompt} Today is Monday."))

    model = recording(["ok"])
    await create_agent(model, system_prompt="Base.", middleware=[add_date]).ainvoke("hi")
    assert model.requests[0].system_prompt == "Base. Today is Monday."


async def test_wrap_model_call_retries_after_a_model_error():
    attempts = []

    class Retry(Middleware):
        async def wrap_model_call(self, request, handler):
            for attempt in range(3):
                try:
                    attempts.append(attempt)
                    return await handler(request.override(system_prompt=f"attempt {attempt}"))
                except ModelError:
                    continue
            raise RuntimeError("gave up")

    model = recording([ModelError("flaky"), ModelError("flaky again"), "third time lucky"])
    state = await create_agent(model, middleware=[Retry()]).ainvoke("hi")
    assert state["messages"][-1].text == "third time lucky"
    assert attempts == [0, 1, 2]
    assert [r.system_prompt for r in model.requests] == ["attempt 0", "attempt 1", "attempt 2"]


async def test_wrap_model_call_can_replace_the_reply():
    @wrap_model_call
    async def censor(request, handler):
        reply = await handler(request)
        return AIMessage(reply.text.upper())

    state = await create_agent(ScriptedModel(["quiet"]), middleware=[censor]).ainvoke("hi")
    assert state["messages"][-1].text == "QUIET"


async def test_wrap_tool_call_short_circuits():
    ran = []

    @tool
    def expensive(x: int) -> str:
        """Expensive."""
        ran.append(x)
        return "computed"

    @wrap_tool_call
    async def cache(request, handler):
        return ToolMessage("cached", request.call["id"], request.call["name"])

    state = await create_agent(ScriptedModel([{"tool_calls": [call("expensive", {"x": 1})]}, "ok"]),
                               [expensive], middleware=[cache]).ainvoke("hi")
    assert ran == []
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["cached"]


async def test_wrap_tool_call_modifies_args_and_result():
    @wrap_tool_call
    async def double_then_tag(request, handler):
        args = {k: v * 2 for k, v in request.call["args"].items()}
        result = await handler(request.override(call={**request.call, "args": args}))
        result.content = f"[{result.content}]"
        return result

    state = await create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 2})]}, "ok"]),
                               [add], middleware=[double_then_tag]).ainvoke("hi")
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["[6]"]


async def test_wrap_tool_call_sees_unknown_tools_and_may_return_a_tool_result():
    seen = []

    @wrap_tool_call
    async def fallback(request, handler):
        seen.append((request.call["name"], request.tool))
        if request.tool is None:
            return ToolResult("no such tool, try 'add'", update={"fallbacks": 1})
        return await handler(request)

    state = await create_agent(ScriptedModel([{"tool_calls": [call("ad", {"a": 1})]}, "ok"]), [add],
                               middleware=[fallback]).ainvoke("hi")
    assert seen == [("ad", None)]
    assert state["fallbacks"] == 1
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["no such tool, try 'add'"]


# -- after_tool_call -------------------------------------------------------------------------------


async def test_after_tool_call_sees_each_result_last_registered_first_and_may_replace_it():
    seen = []

    class Tag(Middleware):
        def __init__(self, tag):
            self.tag = tag

        async def after_tool_call(self, request, result):
            seen.append((self.tag, request.call["name"], request.call["id"], result.content))
            return ToolMessage(f"{self.tag}({result.content})", result.tool_call_id, result.name)

    model = recording([{"tool_calls": [call("add", {"a": 1, "b": 2})]}, "ok"])
    state = await create_agent(model, [add], middleware=[Tag("outer"), Tag("inner")]).ainvoke("hi")
    assert seen == [("inner", "add", "call_1", "3"), ("outer", "add", "call_1", "inner(3)")]
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["outer(inner(3))"]
    assert model.requests[1].messages[-1].text == "outer(inner(3))"  # what the model was told


async def test_after_tool_call_may_return_a_tool_result_with_a_state_update():
    @after_tool_call
    async def count(request, result):
        return ToolResult(result.content, update={"counted": request.call["name"]})

    state = await create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "ok"]), [add],
                               middleware=[count]).ainvoke("hi")
    assert state["counted"] == "add"
    tool_messages = [m for m in state["messages"] if m.type == "tool"]
    assert [(m.text, m.tool_call_id, m.status) for m in tool_messages] == [("2", "call_1", "success")]


async def test_after_tool_call_sees_error_results_and_each_call_of_a_batch():
    seen = []

    @after_tool_call
    def note(request, result):  # a sync function works as well
        seen.append((request.call["id"], result.status, result.text[:30]))
        return result

    @tool
    def broken() -> str:
        """Fails."""
        raise RuntimeError("disk on fire")

    reply = {"tool_calls": [call("add", {"a": 1, "b": 1}, id="c1"), call("broken", id="c2"),
                            call("nope", id="c3")]}
    await create_agent(ScriptedModel([reply, "ok"]), [add, broken], middleware=[note]).ainvoke("hi")
    assert sorted(seen) == [("c1", "success", "2"), ("c2", "error", "Error: tool 'broken' failed: R"),
                            ("c3", "error", "Error: there is no tool named ")]


async def test_after_tool_call_error_names_the_middleware_and_stops_the_later_hooks():
    ran, log = [], []

    @tool
    def work() -> str:
        """Work."""
        ran.append("work")
        return "done"

    class Broken(Middleware):
        async def after_tool_call(self, request, result):
            raise KeyError("lost the result")

    agent = create_agent(ScriptedModel([{"tool_calls": [call("work")]}, "x"]), [work],
                         middleware=[Recorder("first", log), Broken()])
    with pytest.raises(MiddlewareError) as err:
        await agent.ainvoke("hi")
    assert (err.value.middleware, err.value.hook) == ("Broken", "after_tool_call")
    assert isinstance(err.value.error, KeyError) and "lost the result" in str(err.value)
    assert ran == ["work"]
    assert "first.after_tool_call" not in log  # it would have run after Broken's


async def test_after_tool_call_must_return_a_result():
    @after_tool_call
    async def forgetful(request, result):
        result.content = "changed"  # but returns nothing

    agent = create_agent(ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}, "x"]), [add],
                         middleware=[forgetful])
    with pytest.raises(MiddlewareError) as err:
        await agent.ainvoke("hi")
    assert (err.value.middleware, err.value.hook) == ("forgetful", "after_tool_call")
    assert isinstance(err.value.error, TypeError) and "NoneType" in str(err.value)


async def test_after_tool_call_holds_no_frame_while_the_tool_runs():
    """A tool call awaited by a thousand live subagents: each frame held under it is held a thousand times."""
    look, stack = stack_looker("seen")

    class Tagged(Middleware):
        async def after_tool_call(self, request, result):
            return ToolMessage(f"tagged {result.content}", result.tool_call_id, result.name)

    state = await create_agent(ScriptedModel([{"tool_calls": [call("look")]}, "ok"]), [look],
                               middleware=[Tagged()]).ainvoke("hi")
    assert [m.text for m in state["messages"] if m.type == "tool"] == ["tagged seen"]
    assert "Agent._tool_call" in stack and not [name for name in stack if name.endswith("after_tool_call")]


# -- context propagation ---------------------------------------------------------------------------

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="unset")


async def test_contextvar_set_in_before_agent_reaches_hooks_tools_and_nested_agents():
    seen = {}

    @before_agent
    def set_id(state, ctx):
        request_id.set("req-42")

    @before_model
    def bm(state, ctx):
        seen.setdefault("before_model", request_id.get())

    @wrap_model_call
    async def wm(request, handler):
        seen.setdefault("wrap_model_call", request_id.get())
        return await handler(request)

    @after_model
    async def am(state, ctx):
        seen.setdefault("after_model", request_id.get())

    @wrap_tool_call
    async def wt(request, handler):
        seen.setdefault("wrap_tool_call", request_id.get())
        return await handler(request)

    @after_agent
    def aa(state, ctx):
        seen["after_agent"] = request_id.get()

    @tool
    def sync_tool() -> str:
        """Sync."""
        seen["sync_tool"] = request_id.get()
        return "s"

    @tool
    async def async_tool() -> str:
        """Async."""
        seen["async_tool"] = request_id.get()
        return "a"

    @tool
    def inner_tool() -> str:
        """Inner."""
        seen["nested_tool"] = request_id.get()
        return "i"

    @before_model
    def nested_hook(state, ctx):
        seen["nested_hook"] = request_id.get()

    nested = create_agent(ScriptedModel([{"tool_calls": [call("inner_tool")]}, "nested done"]), [inner_tool],
                          middleware=[nested_hook], name="nested")

    @tool
    async def delegate() -> str:
        """Delegate."""
        return (await nested.ainvoke("sub"))["messages"][-1].text

    # first a lone tool call (runs in the run's own task), then a parallel batch
    script = [{"tool_calls": [call("async_tool", {}, "c0")]},
              {"tool_calls": [call("sync_tool", {}, "c1"), call("async_tool", {}, "c2"), call("delegate", {}, "c3")]},
              "done"]
    agent = create_agent(ScriptedModel(script), [sync_tool, async_tool, delegate],
                         middleware=[set_id, bm, wm, am, wt, aa])
    state = await agent.ainvoke("go")
    assert state["messages"][-1].text == "done"
    assert seen == {k: "req-42" for k in ["before_model", "wrap_model_call", "after_model", "wrap_tool_call",
                                          "after_agent", "sync_tool", "async_tool", "nested_tool", "nested_hook"]}
    assert request_id.get() == "unset"  # nothing leaked into the caller


async def test_contextvar_does_not_leak_between_runs():
    values = []

    @before_agent
    def set_once(state, ctx):
        values.append(request_id.get())
        request_id.set(f"run-{len(values)}")

    agent = create_agent(ScriptedModel(["a", "b"]), middleware=[set_once])
    await agent.ainvoke("1")
    await agent.ainvoke("2")
    assert values == ["unset", "unset"]


# -- after_agent (seed 003) -------------------------------------------------------------------------


class AfterAgentProbe(Middleware):
    def __init__(self, log=None, name="probe"):
        self.calls = []
        self.log = log if log is not None else []
        self._name = name

    @property
    def name(self):
        return self._name

    async def after_agent(self, state, ctx):
        self.calls.append(list(state["messages"]))
        self.log.append(self._name)


class TestAfterAgent:
    async def test_final_answer(self):
        probe = AfterAgentProbe()
        state = await create_agent(ScriptedModel(["final answer"]), [add], middleware=[probe]).ainvoke("hi")
        assert len(probe.calls) == 1
        assert probe.calls[0][-1].text == "final answer"
        assert [m.id for m in probe.calls[0]] == [m.id for m in state["messages"]]

    async def test_return_directly(self):
        @tool(return_direct=True)
        def finish(x: str) -> str:
            """Finish."""
            return f"finished {x}"

        probe = AfterAgentProbe()
        model = ScriptedModel([{"tool_calls": [call("finish", {"x": "now"})]}])
        await create_agent(model, [finish], middleware=[probe]).ainvoke("hi")
        assert len(probe.calls) == 1
        last = probe.calls[0][-1]
        assert isinstance(last, ToolMessage) and last.text == "finished now"
        assert model.calls == 1

    async def test_not_called_on_model_error(self):
        probe = AfterAgentProbe()
        agent = create_agent(ScriptedModel([ModelError("rate limited")]), middleware=[probe])
        with pytest.raises(ModelError, match="rate limited"):
            await agent.ainvoke("hi")
        assert probe.calls == []

    async def test_not_called_on_max_iterations(self):
        probe = AfterAgentProbe()
        model = ScriptedModel([{"tool_calls": [call("add", {"a": 1, "b": 1})]}], loop=True)
        agent = create_agent(model, [add], middleware=[probe], max_iterations=2)
        with pytest.raises(MaxIterationsError):
            await agent.ainvoke("hi")
        assert probe.calls == []
        assert model.calls == 2

    async def test_error_stops_run(self):
        class Persist(Middleware):
            async def after_agent(self, state, ctx):
                raise OSError("disk full")

        agent = create_agent(ScriptedModel(["answer"]), middleware=[Persist()])
        events = []
        with pytest.raises(MiddlewareError) as err:
            async for e in agent.astream("hi"):
                events.append(e)
        assert (err.value.middleware, err.value.hook) == ("Persist", "after_agent")
        assert isinstance(err.value.error, OSError)
        lifecycle = [e.data for e in events if e.type == "lifecycle"]
        assert [d["event"] for d in lifecycle] == ["started", "failed"]
        assert lifecycle[-1]["error"]["middleware"] == "Persist"
        assert lifecycle[-1]["error"]["hook"] == "after_agent"
        assert "disk full" in lifecycle[-1]["error"]["message"]

    async def test_context_propagation(self):
        seen = {}

        @before_agent
        def start(state, ctx):
            request_id.set("from-before-agent")

        @after_agent
        def outer(state, ctx):  # registered first, so its after_agent runs last
            seen["outer"] = request_id.get()

        @after_agent
        def inner(state, ctx):
            seen["inner"] = request_id.get()
            request_id.set("from-inner-after-agent")

        await create_agent(ScriptedModel(["ok"]), middleware=[start, outer, inner]).ainvoke("hi")
        assert seen == {"inner": "from-before-agent", "outer": "from-inner-after-agent"}

    async def test_no_tools_path(self):
        probe = AfterAgentProbe()
        model = recording(["just text"])
        state = await create_agent(model, middleware=[probe]).ainvoke("hi")
        assert tuple(model.requests[0].tools) == ()
        assert len(probe.calls) == 1 and probe.calls[0][-1].text == "just text"
        assert state["messages"][-1].text == "just text"

    async def test_fail_fast(self):
        log = []

        class Boom(Middleware):
            async def after_agent(self, state, ctx):
                log.append("Boom")
                raise RuntimeError("boom")

        first = AfterAgentProbe(log, "first")
        # after_agent runs in reverse registration order: Boom (last registered) runs first
        agent = create_agent(ScriptedModel(["ok"]), middleware=[first, Boom()])
        with pytest.raises(MiddlewareError) as err:
            await agent.ainvoke("hi")
        assert err.value.middleware == "Boom"
        assert log == ["Boom"]
        assert first.calls == []

    async def test_not_called_on_cancel(self):
        probe = AfterAgentProbe()
        agent = create_agent(ScriptedModel(["slow"], latency=5), middleware=[probe])
        task = asyncio.create_task(agent.ainvoke("hi"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert probe.calls == []

    async def test_jump_to_model_loops_back(self):
        class KeepGoing(Middleware):
            def __init__(self):
                self.seen = []

            async def after_agent(self, state, ctx):
                self.seen.append(state["messages"][-1].text)
                if len(self.seen) == 1:
                    return {"messages": [HumanMessage("one more thing")], "jump_to": "model"}

        mw = KeepGoing()
        model = recording(["first answer", "second answer"])
        state = await create_agent(model, middleware=[mw]).ainvoke("hi")
        assert model.calls == 2
        assert mw.seen == ["first answer", "second answer"]
        assert model.requests[1].messages[-1].text == "one more thing"
        assert [m.text for m in state["messages"]] == ["hi", "first answer", "one more thing", "second answer"]

    async def test_after_before_model_jump_to_end(self):
        @before_model
        def skip(state, ctx):
            return {"jump_to": "end"}

        probe = AfterAgentProbe()
        await create_agent(ScriptedModel([]), middleware=[skip, probe]).ainvoke("hi")
        assert len(probe.calls) == 1


async def test_hooks_do_not_block_each_other_across_runs():
    """Two runs of one agent proceed concurrently (hooks hold no shared lock)."""

    @before_model
    async def slow(state, ctx):
        await asyncio.sleep(0.3)

    agent = create_agent(ScriptedModel(["a"], loop=True), middleware=[slow])
    t0 = time.perf_counter()
    await asyncio.gather(agent.ainvoke("1"), agent.ainvoke("2"))
    assert time.perf_counter() - t0 < 0.45  # one after the other would take 0.6 s
