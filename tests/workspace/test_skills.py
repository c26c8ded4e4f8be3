"""Skills: names and descriptions in the prompt; a skill's files read only when needed."""

from subagent_helpers import call, policy

from backchannel.deep_agent import create_deep_agent
from backchannel.workspace import FilesystemBackend
from backchannel.workspace.skills import parse_skill

RESEARCH = """---
name: web-research
description: >
  How to research a topic
  thoroughly on the web
license: MIT
allowed-tools: search fetch
metadata:
  author: someone
---

# Web research

1. Search three sources.
"""


def write_skill(root, source, folder, text):
    (root / source / folder).mkdir(parents=True, exist_ok=True)
    (root / source / folder / "SKILL.md").write_text(text)


def test_front_matter_is_read_for_name_description_and_tools():
    skill = parse_skill(RESEARCH, "/skills/web-research/SKILL.md")
    assert skill == {"name": "web-research", "description": "How to research a topic thoroughly on the web",
                     "path": "/skills/web-research/SKILL.md", "license": "MIT", "compatibility": None,
                     "allowed_tools": ["search", "fetch"]}
    assert parse_skill("# no front matter", "/x") is None
    assert parse_skill("---\nname: x\n---\n", "/x") is None  # no description


async def test_the_agent_sees_skill_names_and_reads_a_skill_only_when_it_needs_it(tmp_path):
    write_skill(tmp_path, "skills/base", "web-research", RESEARCH)
    write_skill(tmp_path, "skills/base", "haiku", "---\nname: haiku\ndescription: Old haiku rules\n---\nOld.\n")
    write_skill(tmp_path, "skills/project", "haiku", "---\nname: haiku\ndescription: Write a haiku\n---\n5-7-5\n")
    (tmp_path / "skills/base/not-a-skill").mkdir()
    requests = []

    def model(request):
        requests.append(request)
        if len(requests) == 1:
            return {"tool_calls": [call("read_file", {"file_path": "/skills/project/haiku/SKILL.md",
                                                      "limit": 1000}, "r")]}
        return "An old silent pond"

    agent = create_deep_agent(policy(model), backend=FilesystemBackend(tmp_path),
                              skills=["/skills/base/", "/skills/project/"], general_purpose=False)
    state = await agent.ainvoke("write me a haiku")
    prompt = requests[0].system_prompt
    assert "- **web-research**: How to research a topic thoroughly on the web" in prompt
    assert "  -> Read `/skills/base/web-research/SKILL.md` for full instructions" in prompt
    assert "- **haiku**: Write a haiku" in prompt and "Old haiku rules" not in prompt  # the later source wins
    assert "Search three sources" not in prompt  # only read on demand
    assert sorted(s["name"] for s in state["skills_metadata"]) == ["haiku", "web-research"]
    assert "5-7-5" in [m for m in state["messages"] if m.type == "tool"][0].text
