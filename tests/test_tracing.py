"""Tracing: the OpenTelemetry spans of a supervisor's work (GenAI semantic conventions), and what each run records."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from subagent_helpers import notes, quiet, wait_until
from tracing_agents import SUPERVISOR_RUN_USAGE, answering, counts, supervisor, sync_only_supervisor

from backchannel import ScriptedModel, create_agent, tool
from backchannel.runtime import LocalRuntime
from backchannel.tracing import configure_tracing


def spans_provider(exporter):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@pytest.fixture
def spans():
    """Spans of the runs started in the test, as OpenTelemetry's SDK records them (in memory)."""
    exporter = InMemorySpanExporter()
    configure_tracing(spans_provider(exporter))
    yield exporter
    configure_tracing()


def tree(finished):
    """Each span by its span id, and the children of each."""
    by_id = {s.context.span_id: s for s in finished}
    children = {}
    for s in finished:
        children.setdefault(s.parent.span_id if s.parent else None, []).append(s)
    return by_id, children


async def test_the_span_tree_of_a_supervisor_is_what_happened(spans):
    async with LocalRuntime("memory", agents={"supervisor": supervisor()}) as rt:
        thread = await rt.threads.create()
        tid = thread["thread_id"]
        await rt.runs.wait(tid, "supervisor", input="go")

        async def both_noted():
            messages = (await rt.threads.get_state(tid))["values"]["messages"]
            return len(notes(messages)) == 2 and messages[-1]["type"] == "ai"

        await wait_until(both_noted, timeout=10)
        await quiet(rt, tid)
        tasks = (await rt.threads.get_state(tid))["values"]["async_tasks"]
    task_thread = {t["subagent"]: t["task_id"] for t in tasks.values()}
    finished = spans.get_finished_spans()
    by_id, children = tree(finished)

    def named(name, within=None):
        return [s for s in finished
                if s.name == name and (within is None or s.parent.span_id == within.context.span_id)]

    # The first run: one root span, its model calls and its four tool calls side by side.
    roots = [s for s in named("invoke_agent supervisor") if s.parent is None]
    first = min(roots, key=lambda s: s.start_time)
    assert first.kind == SpanKind.INTERNAL
    assert first.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert first.attributes["gen_ai.agent.name"] == "supervisor"
    assert first.attributes["gen_ai.conversation.id"] == tid
    assert first.status.status_code == StatusCode.UNSET
    kids = sorted(s.name for s in children[first.context.span_id])
    assert kids == ["chat scripted", "chat scripted", "execute_tool flaky", "execute_tool start_async_task",
                    "execute_tool start_async_task", "execute_tool task"]
    chat = named("chat scripted", first)[0]
    assert chat.kind == SpanKind.CLIENT
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "scripted"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 10 and chat.attributes["gen_ai.usage.output_tokens"] == 5
    assert "gen_ai.input.messages" not in chat.attributes  # contents only when asked for
    assert first.attributes["gen_ai.usage.input_tokens"] == 10 + 10 + 3  # its calls and the sync subagent's

    # The failing tool: an error span, the model's run goes on.
    (failed,) = named("execute_tool flaky", first)
    assert failed.attributes["gen_ai.tool.name"] == "flaky"
    assert failed.attributes["gen_ai.tool.call.id"] == "call_flaky"
    assert failed.attributes["gen_ai.operation.name"] == "execute_tool"
    assert failed.status.status_code == StatusCode.ERROR
    assert "flaky failed on 7" in failed.status.description
    assert "error.type" in failed.attributes

    # The sync subagent: its run under the task call, its model call under its run.
    (task_call,) = named("execute_tool task", first)
    assert task_call.status.status_code == StatusCode.UNSET
    (researcher,) = named("invoke_agent researcher", task_call)
    assert researcher.attributes["gen_ai.agent.name"] == "researcher"
    assert [s.name for s in children[researcher.context.span_id]] == ["chat scripted"]

    # The background subagents: each run under the start_async_task call that started it, on its own thread.
    background = {}
    for start_call in named("execute_tool start_async_task", first):
        (run,) = children[start_call.context.span_id]
        background[run.attributes["gen_ai.agent.name"]] = run
        assert run.name == f"invoke_agent {run.attributes['gen_ai.agent.name']}"
        assert run.context.trace_id == first.context.trace_id
        assert [s.name for s in children[run.context.span_id]] == ["chat scripted"]
    assert sorted(background) == ["analyst", "writer"]
    for name, run in background.items():
        assert run.attributes["gen_ai.conversation.id"] == task_thread[name]

    # Each notification, taken in by a supervisor run, links to the run of the task that sent it.
    taken = [s for s in finished if s.name.startswith("task_notification")]
    assert sorted(s.name for s in taken) == ["task_notification analyst", "task_notification writer"]
    for note in taken:
        sender = background[note.attributes["gen_ai.agent.name"]]
        assert [link.context.span_id for link in note.links] == [sender.context.span_id]
        assert note.attributes["backchannel.task.id"] == task_thread[note.attributes["gen_ai.agent.name"]]
        taker = by_id[note.parent.span_id]
        assert taker.name == "invoke_agent supervisor"
        assert taker.parent is None and taker is not first  # a wake-up run: a trace of its own


async def test_a_run_started_inside_a_span_of_the_caller_nests_under_it(spans):
    provider = spans_provider(spans)
    configure_tracing(provider)
    agent = create_agent(answering("hi"), name="helper")
    with provider.get_tracer("app").start_as_current_span("handle request") as outer:
        await agent.ainvoke("hello")
    (run,) = [s for s in spans.get_finished_spans() if s.name == "invoke_agent helper"]
    assert run.parent.span_id == outer.get_span_context().span_id
    assert "gen_ai.conversation.id" not in run.attributes  # no thread: no conversation


async def test_a_failing_model_call_is_an_error_span_and_so_is_the_run(spans):
    from backchannel.errors import ModelError

    agent = create_agent(ScriptedModel([ModelError("the provider is down")]), name="fragile")
    with pytest.raises(ModelError):
        await agent.ainvoke("hello")
    by_name = {s.name: s for s in spans.get_finished_spans()}
    chat, run = by_name["chat scripted"], by_name["invoke_agent fragile"]
    for span in (chat, run):
        assert span.status.status_code == StatusCode.ERROR
        assert span.attributes["error.type"] == "ModelError"
        assert "the provider is down" in span.status.description
    assert [e.name for e in chat.events] == ["exception"]
    assert chat.parent.span_id == run.context.span_id


async def test_what_a_tool_does_with_opentelemetry_lands_on_and_under_its_span(spans):
    provider = spans_provider(spans)
    configure_tracing(provider)

    @tool
    async def lookup(key: str) -> str:
        """Look a key up.

        Args:
            key: The key.
        """
        trace.get_current_span().set_attribute("app.cache_hit", False)  # the tool annotates its own span
        with provider.get_tracer("app").start_as_current_span("GET /items"):  # as an instrumented HTTP client would
            await asyncio.sleep(0.01)
        return key.upper()

    agent = create_agent(ScriptedModel([{"tool_calls": [{"name": "lookup", "args": {"key": "a"}, "id": "c1"}]}, "A"],
                                       latency=0.05), [lookup], name="finder")
    await agent.ainvoke("find a")
    finished = spans.get_finished_spans()
    by_name = {s.name: s for s in finished}
    run, call_span, fetch = by_name["invoke_agent finder"], by_name["execute_tool lookup"], by_name["GET /items"]
    assert fetch.parent.span_id == call_span.context.span_id and fetch.context.trace_id == run.context.trace_id
    assert call_span.parent.span_id == run.context.span_id
    assert call_span.attributes["app.cache_hit"] is False
    assert call_span.attributes["gen_ai.tool.name"] == "lookup"  # and what backchannel sets, beside it
    # Each span lasts as long as its work did, within its run's.
    chats = sorted((s for s in finished if s.name == "chat scripted"), key=lambda s: s.start_time)
    assert [s.end_time - s.start_time >= 50_000_000 for s in chats] == [True, True]
    assert chats[0].end_time <= call_span.start_time <= fetch.start_time
    assert fetch.end_time <= call_span.end_time <= chats[1].start_time
    assert fetch.end_time - fetch.start_time >= 10_000_000
    assert run.start_time <= chats[0].start_time and chats[1].end_time <= run.end_time


async def test_a_long_runs_spans_reach_the_exporter_as_its_calls_end(spans):
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Wait to be released."""
        await release.wait()
        return "done"

    @tool
    async def quick() -> str:
        """Answer at once."""
        return "ok"

    agent = create_agent(ScriptedModel([{"tool_calls": [{"name": "quick", "args": {}, "id": "c1"}]},
                                        {"tool_calls": [{"name": "slow", "args": {}, "id": "c2"}]}, "end"]),
                         [quick, slow], name="long")
    running = asyncio.create_task(agent.ainvoke("go"))
    try:
        # While the run waits in its second tool call, what ended before it is exported already.
        ended = {"execute_tool quick", "chat scripted"}
        await wait_until(lambda: ended <= {s.name for s in spans.get_finished_spans()}, timeout=10,
                         what="the finished calls' spans")
        assert not running.done()
        assert "invoke_agent long" not in {s.name for s in spans.get_finished_spans()}
    finally:
        release.set()
        await running
    assert "execute_tool slow" in {s.name for s in spans.get_finished_spans()}


async def test_message_contents_are_on_the_spans_only_when_asked_for(spans, monkeypatch):
    @tool
    def add(a: int, b: int) -> int:
        """Add.

        Args:
            a: A number.
            b: Another.
        """
        return a + b

    def make():
        return create_agent(ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}, "id": "c1"}]},
                                           "5"]), [add], system_prompt="Be exact.", name="calc")

    await make().ainvoke("2+3?")
    assert not any(key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.system_instructions",
                                   "gen_ai.tool.call.arguments", "gen_ai.tool.call.result"))
                   for s in spans.get_finished_spans() for key in s.attributes)
    spans.clear()

    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    configure_tracing(spans_provider(spans))  # settings are read when tracing is configured
    await make().ainvoke("2+3?")
    chats = [s for s in spans.get_finished_spans() if s.name == "chat scripted"]
    first, second = sorted(chats, key=lambda s: s.start_time)
    assert json.loads(first.attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Be exact."}]
    assert json.loads(first.attributes["gen_ai.input.messages"]) == [
        {"role": "user", "parts": [{"type": "text", "content": "2+3?"}]}]
    assert json.loads(first.attributes["gen_ai.output.messages"]) == [
        {"role": "assistant", "finish_reason": "tool_call",
         "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}]}]
    assert json.loads(second.attributes["gen_ai.input.messages"])[-1] == {
        "role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": "5"}]}
    (call_span,) = [s for s in spans.get_finished_spans() if s.name == "execute_tool add"]
    assert json.loads(call_span.attributes["gen_ai.tool.call.arguments"]) == {"a": 2, "b": 3}
    assert call_span.attributes["gen_ai.tool.call.result"] == "5"


RUN_AN_AGENT = """
import asyncio, json, sys
from backchannel import ScriptedModel, create_agent
from backchannel.runtime import LocalRuntime

async def main():
    agent = create_agent(ScriptedModel(["hi"], loop=True), name="greeter")
    await agent.ainvoke("hello")
    async with LocalRuntime("memory", agents={"greeter": agent}) as rt:
        await rt.runs.wait(None, "greeter", input="hello")
    print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))

asyncio.run(main())
"""


def run_python(code, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done


def test_without_opentelemetry_set_up_nothing_of_it_is_even_imported():
    done = run_python(RUN_AN_AGENT)
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_otel_environment_variables_set_opentelemetry_up():
    done = run_python(RUN_AN_AGENT, OTEL_TRACES_EXPORTER="console", OTEL_SERVICE_NAME="greetings")
    exported = [json.loads(block) for block in re.findall(r"^\{.*?^\}", done.stdout, re.S | re.M)]
    assert sorted(s["name"] for s in exported) == ["chat scripted", "chat scripted", "invoke_agent greeter",
                                                   "invoke_agent greeter"]
    assert {s["resource"]["attributes"]["service.name"] for s in exported} == {"greetings"}
    assert run_python(RUN_AN_AGENT, OTEL_TRACES_EXPORTER="console", OTEL_SDK_DISABLED="true").stdout.count("{") == 0


CRASH_MID_RUN = """
import asyncio
from backchannel import ScriptedModel, create_agent, tool

@tool
async def quick() -> str:
    \"\"\"Answer at once.\"\"\"
    return "ok"

@tool
async def hang() -> str:
    \"\"\"Never answer.\"\"\"
    await asyncio.sleep(3600)

async def main():
    agent = create_agent(ScriptedModel([{"tool_calls": [{"name": "quick", "args": {}, "id": "c1"}]},
                                        {"tool_calls": [{"name": "hang", "args": {}, "id": "c2"}]}, "end"]),
                         [quick, hang], name="doomed")
    asyncio.create_task(agent.ainvoke("go"))
    await asyncio.sleep(0.5)
    raise RuntimeError("the program fails while the run goes on")

asyncio.run(main())
"""


def test_a_program_that_fails_mid_run_still_exports_the_spans_of_what_ended():
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run([sys.executable, "-c", CRASH_MID_RUN], env={**clean, "OTEL_TRACES_EXPORTER": "console"},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "the program fails" in done.stderr
    exported = [json.loads(block) for block in re.findall(r"^\{.*?^\}", done.stdout, re.S | re.M)]
    by_name = {s["name"]: s for s in exported}
    assert sorted(by_name) == ["chat scripted", "execute_tool hang", "execute_tool quick", "invoke_agent doomed"]
    assert by_name["execute_tool hang"]["attributes"]["backchannel.status"] == "cancelled"
    assert by_name["invoke_agent doomed"]["attributes"]["backchannel.status"] == "cancelled"


FORKED = """
import asyncio, os, sys
from opentelemetry import trace
from backchannel import ScriptedModel, create_agent

agent = create_agent(ScriptedModel(["hi"], loop=True), name="forked")
asyncio.run(agent.ainvoke("hello"))  # the parent's spans: its span-making thread runs
trace.get_tracer_provider().force_flush()
sys.stdout.flush()
child = os.fork()
if child == 0:  # as a pre-forking server's worker would
    agent.name = "child"
    asyncio.run(asyncio.wait_for(agent.ainvoke("hello"), 5))
    trace.get_tracer_provider().force_flush()
    sys.stdout.flush()
    os._exit(0)
os.waitpid(child, 0)
"""


def test_a_forked_process_exports_its_own_runs_spans():
    done = run_python(FORKED, OTEL_TRACES_EXPORTER="console")
    exported = [json.loads(block) for block in re.findall(r"^\{.*?^\}", done.stdout, re.S | re.M)]
    assert sorted(s["name"] for s in exported) == ["chat scripted", "chat scripted", "invoke_agent child",
                                                   "invoke_agent forked"]


async def test_a_run_picked_up_by_another_runtime_continues_the_trace_it_was_queued_in(spans, tmp_path):
    provider = spans_provider(spans)
    configure_tracing(provider)
    agent = create_agent(answering("hi"), name="greeter")
    database = f"sqlite:///{tmp_path / 'state.db'}"
    with provider.get_tracer("app").start_as_current_span("queue the work") as queued:
        async with LocalRuntime(database, agents={"greeter": agent}) as first:
            run = await first.runs.create(None, "greeter", input="hello", after_seconds=1.5,
                                          on_completion="keep")
    assert run["kwargs"]["config"]["configurable"]["traceparent"].split("-")[2] == (
        f"{queued.get_span_context().span_id:016x}")
    # Another runtime (as another process would) opens the database and runs it, with no span around it.
    async with LocalRuntime(database, agents={"greeter": agent}) as second:
        assert (await second.runs.get(run["thread_id"], run["run_id"]))["status"] == "pending"
        await second.runs.join(run["thread_id"], run["run_id"])
    (span,) = [s for s in spans.get_finished_spans() if s.name == "invoke_agent greeter"]
    assert span.context.trace_id == queued.get_span_context().trace_id
    assert span.parent.span_id == queued.get_span_context().span_id


async def test_the_final_event_of_a_run_carries_its_token_usage_subagents_included():
    events = [e async for e in sync_only_supervisor().astream("go")]
    final = events[-1]
    assert final.type == "lifecycle" and final.data["event"] == "completed" and final.namespace == ()
    assert final.data["usage"] == SUPERVISOR_RUN_USAGE
    (researcher,) = [e for e in events if e.type == "lifecycle" and e.data["event"] == "completed" and e.namespace]
    assert researcher.data["usage"] == counts(3, 2, 1)


async def test_the_streamed_lifecycle_of_a_runtime_run_ends_with_its_usage():
    async with LocalRuntime("memory", agents={"supervisor": sync_only_supervisor()}) as rt:
        parts = [p async for p in rt.runs.stream(None, "supervisor", input="go", stream_mode=["lifecycle"])]
    lifecycle = [p.data for p in parts if p.event == "lifecycle"]
    assert lifecycle[-1]["event"] == "completed" and lifecycle[-1]["namespace"] == []
    assert lifecycle[-1]["usage"] == SUPERVISOR_RUN_USAGE
