# examples/agent.py: an agent with a tool and a middleware; invoked once, then streamed
import asyncio

from backchannel import ScriptedModel, before_model, create_agent, tool


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@before_model
async def log_calls(state, ctx):
    print(f"[{ctx.agent}] model call with {len(state['messages'])} messages")


# A script of replies, started over for each run (loop=True), so the example needs no key.
model = ScriptedModel([{"tool_calls": [{"name": "add", "args": {"a": 2, "b": 3}}]}, "2 + 3 = 5"], loop=True)
# or: model = "openai:gpt-4o-mini", "anthropic:claude-3-5-haiku-latest", "ollama:llama3.1", a LangChain chat model
agent = create_agent(model, [add], system_prompt="You are a calculator.", middleware=[log_calls])

result = agent.invoke("What is 2 + 3?")
print(result["messages"][-1].text)  # 2 + 3 = 5


async def stream() -> None:
    async for event in agent.astream("What is 2 + 3?"):
        print(event.seq, event.type, event.namespace, event.data)


asyncio.run(stream())
