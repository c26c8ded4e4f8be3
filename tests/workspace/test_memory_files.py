"""Memory files: in the system prompt of every model call, editable with the file tools."""

from subagent_helpers import call, policy

from backchannel import AgentMemoryMiddleware
from backchannel.deep_agent import create_deep_agent
from backchannel.runtime import LocalRuntime
from backchannel.workspace import CompositeBackend, FilesystemBackend, StateBackend, StoreBackend


def memory_section(request):
    prompt = request.system_prompt or ""
    return prompt[prompt.find("<agent_memory>"):prompt.find("</agent_memory>")]


async def test_memory_is_loaded_and_an_edit_shows_at_the_next_model_call(tmp_path):
    (tmp_path / "AGENTS.md").write_text("# Preferences\n- The user likes tea.\n<!-- an authoring note -->\n")
    seen = []

    def model(request):
        seen.append(memory_section(request))
        if len(seen) == 1:
            return {"tool_calls": [call("edit_file", {"file_path": "/AGENTS.md", "old_string": "likes tea",
                                                      "new_string": "likes oolong tea"}, "remember")]}
        return "noted"

    agent = create_deep_agent(policy(model), backend=FilesystemBackend(tmp_path), memory=["/AGENTS.md", "/none.md"],
                              general_purpose=False)
    await agent.ainvoke("I prefer oolong")
    assert "/AGENTS.md\n\n# Preferences\n- The user likes tea." in seen[0]
    assert "authoring note" not in seen[0] and "/none.md" not in seen[0]
    assert "The user likes oolong tea." in seen[1]
    assert (tmp_path / "AGENTS.md").read_text().startswith("# Preferences\n- The user likes oolong tea.")


async def test_memory_in_the_store_is_shared_by_threads_and_works_beside_the_chats_agent_md(tmp_path):
    agent_md = tmp_path / "agent.md"
    agent_md.write_text("From agent.md: be brief.")
    prompts = []

    def model(request):
        prompts.append(request.system_prompt)
        if "write it down" in request.messages[-1].text:
            return {"tool_calls": [call("write_file", {"file_path": "/memories/AGENTS.md",
                                                       "content": "The user's name is Ada."}, "w")]}
        return "ok"

    backend = CompositeBackend(StateBackend(), {"/memories/": StoreBackend()})
    agent = create_deep_agent(policy(model), backend=backend, memory=["/memories/AGENTS.md"],
                              middleware=[AgentMemoryMiddleware(agent_md)], general_purpose=False)
    async with LocalRuntime("memory", agents={"assistant": agent}) as rt:
        await agent.ainvoke("write it down", thread_id=(await rt.threads.create())["thread_id"])
        await agent.ainvoke("hello again", thread_id=(await rt.threads.create())["thread_id"])
    assert "(No memory loaded)" in prompts[0]
    last = prompts[-1]
    assert "/memories/AGENTS.md\n\nThe user's name is Ada." in last  # another thread sees it
    assert last.startswith("<agent_memory>\nFrom agent.md: be brief.")  # the chat's memory file still first
