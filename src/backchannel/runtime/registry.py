"""The agents a runtime serves: one assistant per graph id, found by graph id or by assistant id.

Where programs share a database, a name is not enough to tell their agents apart
(two programs may each have a ``researcher``): each registered agent also has a
digest of its graph id and its shape (its name, its tools, its middleware and the
agents those run on the runtime; not its prompt or model, which may change between
restarts). Runs store it, and a runtime takes over only the runs of agents it serves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from backchannel._ids import assistant_id_for
from backchannel.agent import Agent
from backchannel.protocols import HostRuntime
from backchannel.runtime.rows import RunRow, ThreadRow
from backchannel.state import Reducer

__all__ = ["Registry"]


class Registry:
    """The registered agents by graph id; each works on ``host`` (its ``runtime``) from its registration
    until :meth:`release` (the runtime closes)."""

    def __init__(self, host: HostRuntime) -> None:
        self.host = host
        self.graphs: dict[str, Agent] = {}
        self._graph_ids: dict[str, str] = {}  # assistant id -> graph id
        self._digests: dict[str, str] = {}  # graph id -> digest

    def register_all(self, agents: Mapping[str, Agent]) -> None:
        """Register agents under the names given, then the agents their middleware run on the runtime."""
        for graph_id, agent in agents.items():
            self.register(graph_id, agent, subagents=False)
        for agent in list(self.graphs.values()):  # after the given names, so none is taken by a subagent
            self._register_subagents(agent)

    def register(self, graph_id: str, agent: Agent, *, subagents: bool = True) -> None:
        """Make ``agent`` (and the background subagents it runs here) available as the assistant ``graph_id``."""
        if graph_id in self.graphs and self.graphs[graph_id] is not agent:
            raise ValueError(f"an agent is already registered as {graph_id!r}")
        self.graphs[graph_id] = agent
        self._graph_ids[assistant_id_for(graph_id)] = graph_id
        self._digests[graph_id] = _digest(graph_id, agent)
        agent.runtime = self.host  # the runtime it joined last keeps its threads
        if subagents:
            self._register_subagents(agent)

    def release(self) -> None:
        """The runtime closes: its agents keep no threads through it any more."""
        for agent in self.graphs.values():
            if agent.runtime is self.host:
                agent.runtime = None

    def digest_of(self, graph_id: str) -> str:
        """The digest of the agent registered as ``graph_id`` (what its runs store, beside its assistant id)."""
        return self._digests[graph_id]

    def served(self) -> dict[str, str]:
        """Every agent registered here: assistant id -> digest."""
        return {assistant_id_for(graph_id): digest for graph_id, digest in self._digests.items()}

    def _register_subagents(self, agent: Agent) -> None:
        # The agents its middleware runs on this runtime (background subagents) are registered now,
        # not at their first task, so a task run taken over after a restart finds its agent.
        for mw in agent.middleware:
            for sub in mw.runtime_agents():
                self.graph_id_for_agent(sub)

    def own_graph_of(self, assistant_id: str) -> str | None:
        """The graph registered here whose own assistant ``assistant_id`` is (or whose id it is), if any."""
        return assistant_id if assistant_id in self.graphs else self._graph_ids.get(assistant_id)

    def agent_of_run(self, row: RunRow) -> Agent | None:
        """The agent a run is for (its assistant's graph, as it was when the run was made), if registered here."""
        graph_id = row.metadata.get("graph_id") or self.own_graph_of(row.assistant_id)
        return self.graphs.get(graph_id) if graph_id is not None else None

    def graph_id_for_agent(self, agent: Agent) -> str:
        """The graph id ``agent`` is registered under; registered now (as its name, or a variant) if new."""
        for graph_id, registered in self.graphs.items():
            if registered is agent:
                return graph_id
        graph_id, n = agent.graph_name, 1
        while graph_id in self.graphs:  # the name is another agent's: take a stable variant of it
            n += 1
            graph_id = f"{agent.graph_name}-{n}"
        self.register(graph_id, agent)
        return graph_id

    def reducers_for(self, thread: ThreadRow) -> dict[str, Reducer]:
        """The state reducers of the agent that last ran on ``thread`` (none if it is not registered here)."""
        agent = self.graphs.get(thread.metadata.get("graph_id", ""))
        return agent.state_reducers() if agent is not None else {}


def _digest(graph_id: str, agent: Agent) -> str:
    """What tells ``agent`` from another agent of the same name: a digest of its graph id and its shape."""
    shape = [graph_id, agent.graph_name, sorted(map(_tool_name, agent.tools)),
             [(type(mw).__module__, type(mw).__qualname__, sorted(map(_tool_name, mw.tools)),
               sorted(sub.graph_name for sub in mw.runtime_agents())) for mw in agent.middleware]]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:16]


def _tool_name(tool: Any) -> str:
    return str(getattr(tool, "name", None) or getattr(tool, "__name__", None) or type(tool).__name__)
