# examples/human_in_the_loop.py: a tool that waits for a person's approval
import asyncio

from backchannel import HumanInTheLoop, LocalRuntime, ScriptedModel, create_agent, tool


@tool
def send_email(to: str, subject: str) -> str:
    """Send an email.

    Args:
        to: The recipient's address.
        subject: The subject line.
    """
    return f"sent {subject!r} to {to}"


model = ScriptedModel([{"tool_calls": [{"name": "send_email", "args": {"to": "ada@example.com", "subject": "Hi"}}]},
                       "The email is sent."], loop=True)  # or "openai:gpt-4o-mini", ...
agent = create_agent(model, [send_email], middleware=[HumanInTheLoop({"send_email": True})], name="mailer")


async def main() -> None:
    async with LocalRuntime("memory", agents={"mailer": agent}) as rt:
        thread_id = (await rt.threads.create())["thread_id"]
        paused = await rt.runs.wait(thread_id, "mailer", input="email Ada")  # thread status: interrupted
        print(paused["__interrupt__"][0]["value"]["action_requests"])  # [{"name", "args", "description"}]
        done = await rt.runs.wait(thread_id, "mailer", command={"resume": {"decisions": [{"type": "approve"}]}})
        # or {"type": "edit", "edited_action": {"name": ..., "args": {...}}}, {"type": "reject", "message": "why"}
        print(done["messages"][-1]["content"])  # The email is sent.


asyncio.run(main())
