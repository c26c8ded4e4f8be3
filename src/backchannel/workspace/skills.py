"""Skills: folders of instructions the agent reads only when a task calls for them.

Each skill is a directory with a ``SKILL.md`` whose front matter names and
describes it (the Agent Skills format)::

    /skills/web-research/
    ├── SKILL.md        ---\\nname: web-research\\ndescription: How to research a topic on the web\\n---\\n...
    └── helper.py

``SkillsMiddleware(backend=..., sources=["/skills/"])`` lists the skills of
each source at the start of every run (a later source's skill replaces an
earlier one of the same name), keeps the list in the state
(``skills_metadata``) and shows the model only names, descriptions and paths;
the model reads a ``SKILL.md`` and the files beside it with ``read_file``
when it needs them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from backchannel.context import RunContext
from backchannel.messages import AIMessage
from backchannel.middleware import Middleware, ModelHandler
from backchannel.models.base import ModelRequest
from backchannel.workspace._runs import hook_runtime
from backchannel.workspace.protocol import BackendProtocol
from backchannel.workspace.state import StateBackend

__all__ = ["SKILLS_SYSTEM_PROMPT", "SkillMetadata", "SkillsMiddleware", "parse_skill"]

MAX_SKILL_NAME_LENGTH = 64
MAX_SKILL_DESCRIPTION_LENGTH = 1024
_FRONT_MATTER = re.compile(r"^---[ \t]*\n(.*?)\n---[ \t]*(?:\n|$)", re.DOTALL)
_WHOLE_FILE = 1_000_000_000

SKILLS_SYSTEM_PROMPT = (
    "## Skills System\n"
    "\n"
    "You have a library of skills: instructions and files for particular kinds of work.\n"
    "\n"
    "{skills_locations}\n"
    "\n"
    "**Available Skills:**\n"
    "\n"
    "{skills_list}\n"
    "\n"
    "**How to use a skill (progressive disclosure):** when the user's task matches a skill's "
    "description, read its SKILL.md with `read_file` (pass `limit=1000`; the default 100 lines is "
    "too few for most skill files), follow its instructions, and read or run the files beside it by "
    "their absolute paths."
)


class SkillMetadata(TypedDict):
    """What the model is told of a skill: ``path`` is its ``SKILL.md``."""

    name: str
    description: str
    path: str
    license: str | None
    compatibility: str | None
    allowed_tools: list[str]


class SkillsState(TypedDict, total=False):
    skills_metadata: list[SkillMetadata]


class SkillsMiddleware(Middleware):
    """Tell the model which skills ``sources`` (directories on ``backend``) hold, and where."""

    state_schema = SkillsState

    def __init__(self, *, backend: BackendProtocol | None = None, sources: Sequence[str],
                 system_prompt: str = SKILLS_SYSTEM_PROMPT) -> None:
        self.backend: BackendProtocol = backend if backend is not None else StateBackend()
        self.sources = [s if s.endswith("/") else s + "/" for s in sources]
        self.template = system_prompt

    def __repr__(self) -> str:
        return f"SkillsMiddleware(sources={self.sources!r})"

    async def load(self, state: Mapping[str, Any], ctx: RunContext | None) -> list[SkillMetadata]:
        """The skills of every source, the later source's winning on a name."""
        backend = self.backend.bind(hook_runtime(state, ctx))
        skills: dict[str, SkillMetadata] = {}
        for source in self.sources:
            listing = await backend.ls(source)
            for entry in listing.entries or ():
                if not entry.get("is_dir"):
                    continue
                path = entry["path"].rstrip("/") + "/SKILL.md"
                result = await backend.read(path, 0, _WHOLE_FILE)
                if result.error is not None or result.file_data is None:
                    continue
                skill = parse_skill(result.file_data["content"], path)
                if skill is not None:
                    skills[skill["name"]] = skill
        return list(skills.values())

    async def before_agent(self, state: Mapping[str, Any], ctx: RunContext) -> dict[str, Any] | None:
        """At the start of each run: the skills as they are now (recorded only when they changed)."""
        skills = await self.load(state, ctx)
        return None if skills == state.get("skills_metadata") else {"skills_metadata": skills}

    async def wrap_model_call(self, request: ModelRequest, handler: ModelHandler) -> AIMessage:
        """Every model call: the skills' names, descriptions and paths, after the rest of the system prompt."""
        skills = request.state.get("skills_metadata") or []
        section = self.template.format(skills_locations=self._locations(), skills_list=self._listing(skills))
        prompt = f"{request.system_prompt}\n\n{section}" if request.system_prompt else section
        return await handler(request.override(system_prompt=prompt))

    def _locations(self) -> str:
        last = len(self.sources) - 1
        return "\n".join(f"**Skills in** `{s}`" + (" (higher priority)" if i == last and last else "")
                         for i, s in enumerate(self.sources))

    def _listing(self, skills: Sequence[SkillMetadata]) -> str:
        if not skills:
            return f"(No skills available yet. You can create skills in {' or '.join(self.sources)})"
        lines = []
        for skill in skills:
            lines.append(f"- **{skill['name']}**: {skill['description']}")
            if skill["allowed_tools"]:
                lines.append(f"  -> Allowed tools: {', '.join(skill['allowed_tools'])}")
            lines.append(f"  -> Read `{skill['path']}` for full instructions")
        return "\n".join(lines)


def parse_skill(text: str, path: str) -> SkillMetadata | None:
    """A skill's metadata from its ``SKILL.md`` front matter (``None`` without a name and description)."""
    found = _FRONT_MATTER.match(text)
    if found is None:
        return None
    fields = _front_matter(found.group(1))
    name, description = str(fields.get("name", "")).strip(), str(fields.get("description", "")).strip()
    if not name or not description:
        return None
    tools = fields.get("allowed-tools") or fields.get("allowed_tools") or ""
    return {"name": name[:MAX_SKILL_NAME_LENGTH], "description": description[:MAX_SKILL_DESCRIPTION_LENGTH],
            "path": path, "license": fields.get("license") or None,
            "compatibility": fields.get("compatibility") or None,
            "allowed_tools": [t for t in re.split(r"[\s,]+", tools) if t] if isinstance(tools, str) else list(tools)}


def _front_matter(block: str) -> dict[str, Any]:
    """The top-level ``key: value`` pairs of a YAML front matter: plain, quoted, folded (``>``, ``|``)
    and indented continuation values, and ``- item`` lists. Nested maps are skipped."""
    fields: dict[str, Any] = {}
    key: str | None = None
    for line in block.splitlines():
        top = re.match(r"^([A-Za-z_][\w-]*)\s*:\s*(.*)$", line)
        if top:
            key, value = top.group(1), top.group(2).strip()
            fields[key] = "" if value in (">", "|", ">-", "|-") else _unquote(value)
        elif key is not None and line.strip():
            item = re.match(r"^\s+-\s+(.*)$", line)
            if item and not fields[key]:
                fields[key] = []
            if isinstance(fields[key], list):
                if item:
                    fields[key].append(_unquote(item.group(1).strip()))
            elif line.startswith((" ", "\t")) and ":" not in line.strip().split(" ", 1)[0]:
                fields[key] = f"{fields[key]} {line.strip()}".strip()
    return fields


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value
