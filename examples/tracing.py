# examples/tracing.py: a run's spans sent to OpenTelemetry (printed here), its token usage, its thread's timeline
import asyncio

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from backchannel import LocalRuntime, ScriptedModel, create_agent, tool
from backchannel.tracing import configure_tracing

# Without code: pip install 'backchannel[otel]' and set OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_TRACES_EXPORTER).
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(formatter=lambda span: f"span: {span.name}\n")))
configure_tracing(provider)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


usage = {"input_tokens": 120, "output_tokens": 12, "total_tokens": 132}  # what a provider reports per call
model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}], "usage": usage},
                       {"content": "2 + 3 = 5", "usage": usage}])
calc = create_agent(model, [add], name="calc")


async def main() -> None:
    async with LocalRuntime("memory", agents={"calc": calc}) as rt:
        thread_id = (await rt.threads.create())["thread_id"]
        await rt.runs.wait(thread_id, "calc", input="2+3?")
        print("the run's usage:", (await rt.runs.list(thread_id))[0]["usage"])
        timeline = await rt.timeline(thread_id)  # over HTTP: GET /threads/{id}/timeline, drawn at /timeline?thread=
        for span in timeline["threads"][0]["runs"][0]["spans"]:
            print(f"{span['kind']:>6} {span['name']:<8} {span['status']:<8} {span['end'] - span['start']:.4f} s")


asyncio.run(main())
