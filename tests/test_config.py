"""The chat's configuration file: what it accepts, the agent it builds, and clear errors for bad files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from terminal import BACKCHANNEL, chat_env, write_config

from backchannel import ScriptedModel
from backchannel.async_tasks import AsyncSubAgentMiddleware
from backchannel.config import ChatConfig, ConfigError, build_chat_agent, load_config, load_model, resolve_model
from backchannel.errors import MiddlewareError
from backchannel.handoff import HandoffMiddleware
from backchannel.hitl import HumanInTheLoop
from backchannel.memory import AgentMemoryMiddleware
from backchannel.runtime import LocalRuntime


def test_no_file_means_defaults_and_a_named_file_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert load_config() == ChatConfig()
    assert ChatConfig().summarize_after == 170_000 and ChatConfig().agent == "agent"
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "missing.toml")


def test_a_full_file_is_read(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text('agent = "helper"\nmodel = "openai:gpt-4o-mini"\ncompletion = "wait"\nsummarize_after = 5000\n'
                    'approve_tools = ["send"]\n[[subagents]]\nname = "researcher"\ndescription = "d"\n'
                    'background = true\ntimeout = 30\n')
    config = load_config(path)
    assert (config.agent, config.model, config.completion, config.summarize_after) == (
        "helper", "openai:gpt-4o-mini", "wait", 5000)
    assert config.subagents[0].name == "researcher" and config.subagents[0].timeout == 30


@pytest.mark.parametrize("text, message", [
    ('modle = "openai:gpt-4o"\n', r"unknown key 'modle' \(known keys: agent, model"),
    ('completion = "sometimes"\n', r"completion: Input should be 'notify' or 'wait' \(got 'sometimes'\)"),
    ('[[subagents]]\nname = "r"\ndescription = "d"\ntimeout = "soon"\n', r"subagents\[0\]\.timeout: "),
    ('[[subagents]]\nname = "r"\n', r"subagents\[0\]\.description: Field required"),
    ('[[subagents]]\nname = "r"\ndescription = "d"\ncolour = "red"\n', r"unknown key 'subagents\[0\]\.colour'"),
    ('agent = "my/agent"\n', r"agent: 'my/agent' must be a plain name"),
    ('model = "openai:gpt-4o\n', r"not valid TOML: .*line 1"),
])
def test_a_bad_file_is_refused_naming_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path)
    assert str(caught.value).startswith(str(path))


def test_the_command_reports_a_bad_file_and_exits_2(tmp_path):
    write_config(tmp_path, '[[subagents]]\nname = "r"\ndescription = "d"\ntimeout = -1\n')
    result = subprocess.run([str(BACKCHANNEL)], env=chat_env(tmp_path), capture_output=True, text=True,
                            timeout=60, input="")
    assert result.returncode == 2
    assert "config.toml: subagents[0].timeout: Input should be greater than 0 (got -1)" in result.stderr


def test_without_any_model_the_chat_runs_offline_and_says_how_to_configure_one(tmp_path):
    result = subprocess.run([str(BACKCHANNEL), "chat"], env={**chat_env(tmp_path), "COLUMNS": "200"},
                            capture_output=True, text=True, timeout=60, input="hi\n")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "model offline scripted model (no model configured: pass --model, or set model in" in out
    assert "agent › Hello! I am the offline scripted model" in out


def test_models_are_provider_names_or_objects_to_import(monkeypatch):
    assert load_model("anthropic:claude-3-5-haiku-latest") == "anthropic:claude-3-5-haiku-latest"
    assert isinstance(load_model("chat_script:researcher"), ScriptedModel)
    with pytest.raises(ConfigError, match="unknown provider 'opnai'"):
        load_model("opnai:gpt-4o")
    monkeypatch.delenv("BACKCHANNEL_MODEL", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert resolve_model(None, "anthropic:x") == "anthropic:x"  # the configured model beats a key's default
    assert resolve_model(None) == "openai:gpt-4o-mini"
    monkeypatch.setenv("BACKCHANNEL_MODEL", "ollama:llama3.1")
    assert resolve_model(None, "anthropic:x") == "ollama:llama3.1"
    assert resolve_model("vllm:m", "anthropic:x") == "vllm:m"


async def test_the_agent_has_its_subagents_memory_handoff_and_approvals(tmp_path):
    config = ChatConfig.model_validate({
        "agent": "helper", "approve_tools": ["delete_file"], "tools": ["chat_script:delete_file"],
        "subagents": [{"name": "researcher", "description": "d", "model": "chat_script:researcher",
                       "background": True}]})
    model = ScriptedModel(["hi"], loop=True)
    agent = build_chat_agent(config, model, home=tmp_path)
    kinds = [type(m) for m in agent.middleware]
    for kind in (AsyncSubAgentMiddleware, HandoffMiddleware, AgentMemoryMiddleware, HumanInTheLoop):
        assert kind in kinds
    memory = next(m for m in agent.middleware if isinstance(m, AgentMemoryMiddleware)).memory
    assert memory.path == tmp_path / "agents" / "helper" / "agent.md"
    assert agent.name == "helper" and "start_async_task" in {t.name for mw in agent.middleware for t in mw.tools}
    async with LocalRuntime("memory", agents={"helper": agent}) as rt:
        thread = (await rt.threads.create())["thread_id"]
        with pytest.raises(MiddlewareError, match="unknown model provider 'chat_script'"):
            # A run's context never makes the agent import code (a server's clients set it).
            await rt.runs.wait(thread, "helper", input="x", context={"model": "chat_script:researcher"})


async def test_a_run_can_choose_its_model_by_provider_name(tmp_path, monkeypatch):
    """What /model sends: the run's model calls go to the named provider (a loopback OpenAI-compatible server)."""
    monkeypatch.syspath_prepend(Path(__file__).parent / "models")
    from provider_fakes import FakeServer, openai_completion

    fake = FakeServer().start()
    try:
        fake.reply(openai_completion("from the other model"))
        monkeypatch.setenv("OPENAI_BASE_URL", f"{fake.url}/v1")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        model = ScriptedModel(["from the configured model"], loop=True)
        agent = build_chat_agent(ChatConfig(), model, home=tmp_path)
        async with LocalRuntime("memory", agents={"agent": agent}) as rt:
            thread = (await rt.threads.create())["thread_id"]
            values = await rt.runs.wait(thread, "agent", input="hi", context={"model": "openai:gpt-other"})
            assert values["messages"][-1]["content"] == "from the other model" and model.calls == 0
            assert fake.last_body["model"] == "gpt-other"
            values = await rt.runs.wait(thread, "agent", input="hi again")
            assert values["messages"][-1]["content"] == "from the configured model"
    finally:
        fake.stop()


def test_the_workspace_keys_build_the_agents_files_plan_memory_skills_and_mcp_servers(tmp_path):
    from backchannel.mcp import MCPMiddleware
    from backchannel.workspace import (
        FilesystemMiddleware,
        LocalShellBackend,
        MemoryMiddleware,
        SkillsMiddleware,
        TodoListMiddleware,
    )

    path = tmp_path / "config.toml"
    path.write_text(f'workspace = "{tmp_path}"\nshell = true\nmemory = ["/AGENTS.md"]\nskills = ["/skills/"]\n'
                    'todos = true\n[[mcp_servers]]\nname = "files"\ncommand = "python"\nargs = ["server.py"]\n'
                    '[[mcp_servers]]\nname = "search"\nurl = "http://127.0.0.1:9/mcp"\n')
    config = load_config(path)
    agent = build_chat_agent(config, ScriptedModel(["hi"]), home=tmp_path)
    by_kind = {type(m): m for m in agent.middleware}
    assert isinstance(by_kind[FilesystemMiddleware].backend, LocalShellBackend)
    assert by_kind[FilesystemMiddleware].backend.cwd == tmp_path.resolve()
    assert by_kind[MemoryMiddleware].sources == ["/AGENTS.md"]
    assert by_kind[SkillsMiddleware].sources == ["/skills/"]
    assert TodoListMiddleware in by_kind
    assert by_kind[HumanInTheLoop].configs.keys() == {"execute"}  # commands wait for approval
    assert by_kind[MCPMiddleware].client.connections == {
        "files": {"transport": "stdio", "command": "python", "args": ["server.py"], "env": None, "cwd": None},
        "search": {"transport": "streamable_http", "url": "http://127.0.0.1:9/mcp", "headers": None}}


@pytest.mark.parametrize("text, message", [
    ("shell = true\n", r"shell: needs workspace"),
    ('workspace = "/no/such/dir"\n', r"workspace: '/no/such/dir' is not a directory"),
    ('[[mcp_servers]]\nname = "x"\ncommand = "c"\nport = 1\n', r"unknown key 'mcp_servers\[0\]\.port'"),
    ('[[mcp_servers]]\nname = "x"\n', r"mcp_servers\[0\]: Value error, give either command"),
])
def test_bad_workspace_keys_are_refused(tmp_path, text, message):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        build_chat_agent(load_config(path), ScriptedModel([]), home=tmp_path)
