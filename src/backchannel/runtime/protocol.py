"""The v2 streaming protocol's events (``langchain_protocol``): a run's events as a thread's subscribers see them.

LangGraph's thread-centric stream (``client.threads.stream(...)`` in
``langgraph_sdk`` 0.4, ``RemoteGraph.stream_events(version="v3")``, the JS
SDK's ``client.threads.stream``) carries, per run of the thread, protocol
events on channels: ``lifecycle`` (the root's ``running`` then ``completed``,
``failed`` or ``interrupted``; each subagent's ``started`` and end, with the
tool call that caused it), ``input`` (``input.requested``: an interrupt
waiting for an answer), ``values``, ``updates``, ``messages`` (a model reply
as ``message-start``, content blocks, ``message-finish``), ``tools``
(``tool-started``/``tool-finished``/``tool-error``), ``tasks``,
``checkpoints`` and ``custom``. :class:`RunProtocol` turns one run's events
into them; :class:`ProtocolFilter` is a subscriber's choice of channels and
namespaces. Namespaces are the wire's (``tools:<tool call id>`` per subagent,
:func:`~backchannel.runtime.modes.wire_namespace`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backchannel.events import Event
from backchannel.messages import message_to_dict
from backchannel.runtime.modes import wire_namespace
from backchannel.runtime.rows import RunStatus
from backchannel.serde import to_jsonable

__all__ = ["CHANNELS", "ProtocolEvent", "ProtocolFilter", "RunProtocol", "check_channels"]

CHANNELS = frozenset({"values", "updates", "messages", "tools", "lifecycle", "input", "tasks", "checkpoints",
                      "custom"})


@dataclass(slots=True)
class ProtocolEvent:
    """One protocol event before it is numbered: its ``method``, ``namespace``, ``data`` and producing ``node``."""

    method: str
    namespace: list[str]
    data: Any
    node: str | None = None

    @property
    def channel(self) -> str:
        """The channel a subscriber names to receive it (``input`` for ``input.requested``)."""
        return "input" if self.method == "input.requested" else self.method


def check_channels(channels: Any) -> list[str]:
    """``channels`` checked: a non-empty list of the protocol's channels (or ``custom:<name>``);
    :class:`ValueError` naming what is not one."""
    if not isinstance(channels, list) or not channels:
        raise ValueError("channels must be a non-empty array")
    bad = [c for c in channels if not isinstance(c, str) or (c not in CHANNELS and not _custom_name(c))]
    if bad:
        raise ValueError(f"channels contains unsupported entries: {', '.join(map(repr, bad[:5]))}; allowed: "
                         f"{', '.join(sorted(CHANNELS))}, or custom:<name>")
    return list(channels)


def _custom_name(channel: str) -> str:
    return channel[len("custom:"):] if channel.startswith("custom:") else ""


@dataclass(frozen=True, slots=True)
class ProtocolFilter:
    """What one subscription receives: events of its ``channels`` whose namespace starts with one of
    ``namespaces`` (all namespaces when none are given), at most ``depth`` levels below it."""

    channels: frozenset[str]
    namespaces: tuple[tuple[str, ...], ...] | None = None
    depth: int | None = None

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> ProtocolFilter:
        """A filter from a subscribe request's ``channels``, ``namespaces`` and ``depth`` (``ValueError`` if bad)."""
        channels = check_channels(params.get("channels"))
        raw_ns = params.get("namespaces")
        namespaces = None
        if raw_ns is not None:
            if not isinstance(raw_ns, list) or not all(
                    isinstance(ns, list) and all(isinstance(s, str) for s in ns) for ns in raw_ns):
                raise ValueError("namespaces must be an array of arrays of strings")
            namespaces = tuple(tuple(ns) for ns in raw_ns) or None
        depth = params.get("depth")
        if depth is not None and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
            raise ValueError(f"depth must be a non-negative integer, not {depth!r}")
        return cls(frozenset(channels), namespaces, depth)

    def matches(self, channel: str, namespace: Sequence[str], custom_name: str | None = None) -> bool:
        """Whether an event of ``channel`` at ``namespace`` (a ``custom`` one named ``custom_name``) is wanted."""
        if channel not in self.channels and not (custom_name and f"custom:{custom_name}" in self.channels):
            return False
        if self.namespaces is None:
            return True
        return any(_prefix_match(namespace, prefix) and (self.depth is None or len(namespace) - len(prefix)
                                                           <= self.depth) for prefix in self.namespaces)


def _prefix_match(namespace: Sequence[str], prefix: Sequence[str]) -> bool:
    """Whether ``namespace`` starts with ``prefix``; a prefix segment without ``:`` matches any ``<it>:<id>``."""
    if len(prefix) > len(namespace):
        return False
    for segment, candidate in zip(prefix, namespace):
        if candidate != segment and (":" in segment or candidate.partition(":")[0] != segment):
            return False
    return True


@dataclass(slots=True)
class _Agent:
    """A namespace of the run (the root, or a subagent) as ``agent.getTree`` shows it."""

    status: str
    graph_name: str


@dataclass(slots=True)
class _Message:
    """A model reply being streamed: its content blocks by index, and what each holds so far."""

    text_index: int | None = None
    text: str = ""
    tools: dict[int, dict[str, Any]] = field(default_factory=dict)  # the call's index -> its block
    next_index: int = 0


class RunProtocol:
    """One run's events as protocol events, in order: :meth:`started`, :meth:`events` for each, :meth:`ended`."""

    def __init__(self, run_id: str, graph_name: str) -> None:
        self.run_id = run_id
        self.graph_name = graph_name
        self.agents: dict[tuple[str, ...], _Agent] = {(): _Agent("running", graph_name)}
        self.asked: set[str] = set()  # interrupts announced on the input channel
        self._messages: dict[str, _Message] = {}

    @property
    def interrupted(self) -> bool:
        return self.agents[()].status == "interrupted"

    def started(self) -> list[ProtocolEvent]:
        return [ProtocolEvent("lifecycle", [], {"event": "running", "graph_name": self.graph_name})]

    def ended(self, status: RunStatus | None, error: Mapping[str, Any] | None) -> list[ProtocolEvent]:
        """The run's end: every subagent still open ``completed``, then the root's own end (once)."""
        out = [self._lifecycle(ns, "completed", agent.graph_name)
               for ns, agent in sorted(self.agents.items(), key=lambda item: -len(item[0]))
               if ns and agent.status in ("started", "running")]
        if self.interrupted:
            return out
        if status == "success":
            out.append(self._lifecycle((), "completed", self.graph_name))
        elif status == "interrupted":  # cancelled: LangGraph says so the same way
            out.append(self._lifecycle((), "interrupted", self.graph_name))
        else:
            message = (error or {}).get("message") or f"the run ended {status or 'without a status'}"
            out.append(self._lifecycle((), "failed", self.graph_name, error=str(message)))
        return out

    def tree(self) -> dict[str, Any]:
        """The run's agents as ``agent.getTree`` returns them: the root and its subagents, nested."""
        return self._node(())

    def _node(self, ns: tuple[str, ...]) -> dict[str, Any]:
        agent = self.agents[ns]
        node: dict[str, Any] = {"namespace": list(ns), "status": agent.status, "graph_name": agent.graph_name}
        children = sorted(c for c in self.agents if len(c) == len(ns) + 1 and c[:len(ns)] == ns)
        if children:
            node["children"] = [self._node(c) for c in children]
        return node

    def _lifecycle(self, ns: tuple[str, ...], status: str, graph_name: str, **extra: Any) -> ProtocolEvent:
        self.agents[ns] = _Agent(status, graph_name)
        return ProtocolEvent("lifecycle", list(ns), {"event": status, "graph_name": graph_name, **extra})

    # -- the run's events

    def events(self, event: Event) -> Iterator[ProtocolEvent]:
        """The protocol events ``event`` becomes (none, one, or a few)."""
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is not None:
            yield from handler(event, wire_namespace(event.namespace))

    def _on_values(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        values = event.data
        if "__interrupt__" in values:
            yield from self._asked(ns, values["__interrupt__"])
            values = {k: v for k, v in values.items() if k != "__interrupt__"}
        if values:
            yield ProtocolEvent("values", list(ns), _state(values))

    def _on_interrupt(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        yield from self._asked(ns, event.data["interrupts"])

    def _asked(self, ns: tuple[str, ...], interrupts: Sequence[Any]) -> Iterator[ProtocolEvent]:
        new = False
        for interrupt in interrupts:
            item = interrupt.to_dict() if hasattr(interrupt, "to_dict") else dict(interrupt)
            if item["id"] in self.asked:
                continue
            self.asked.add(item["id"])
            new = True
            value = to_jsonable(item["value"])
            # The protocol names the value ``payload``; langgraph_sdk 0.4 reads ``value``.
            yield ProtocolEvent("input.requested", list(ns), {"interrupt_id": item["id"], "payload": value,
                                                              "value": value})
        if new and self.agents[()].status != "interrupted":
            yield self._lifecycle((), "interrupted", self.graph_name)

    def _on_updates(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        for node, update in event.data.items():
            data = _state({node: update})
            yield ProtocolEvent("updates", list(ns), data, node)
            task_id = f"{event.run_id}:{event.seq}:{node}"
            yield ProtocolEvent("tasks", list(ns), {"id": task_id, "name": node, "error": None,
                                                    "result": data[node], "interrupts": []})

    def _on_checkpoint(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        data = event.data
        parent = (data.get("parent_config") or {}).get("configurable", {}).get("checkpoint_id")
        checkpoint = {"id": data["config"]["configurable"]["checkpoint_id"],
                      "step": data.get("metadata", {}).get("step", 0),
                      "source": data.get("metadata", {}).get("source", "loop")}
        if parent:
            checkpoint["parent_id"] = parent
        yield ProtocolEvent("checkpoints", list(ns), checkpoint)

    def _on_custom(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        yield ProtocolEvent("custom", list(ns), to_jsonable(event.data))

    def _on_lifecycle(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        if not ns:
            return  # the root's lifecycle is the run's: started() and ended()
        data = event.data
        status = data["event"]
        graph_name = data.get("graph_name") or event.agent
        extra: dict[str, Any] = {}
        if data.get("cause"):
            extra["cause"] = data["cause"]
        if status == "started":
            extra["trigger_call_id"] = ns[-1].partition(":")[2]
        if data.get("error"):
            extra["error"] = str(data["error"].get("message") if isinstance(data["error"], dict) else data["error"])
        yield self._lifecycle(ns, status, graph_name, **extra)
        if status in ("completed", "failed", "interrupted"):
            # The subagent's task, seen from its parent: the SDK's subgraph handle ends with it.
            yield ProtocolEvent("tasks", list(ns[:-1]), {
                "id": ns[-1].partition(":")[2], "name": graph_name, "result": {},
                "error": extra.get("error") if status == "failed" else None, "interrupts": []})

    def _on_tool(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        data = event.data
        call_id = data["tool_call_id"]
        if data["event"] == "started":
            yield ProtocolEvent("tools", list(ns), {"event": "tool-started", "tool_call_id": call_id,
                                                    "tool_name": data["tool_name"],
                                                    "input": to_jsonable(data.get("args"))}, "tools")
        elif data["event"] == "error":
            yield ProtocolEvent("tools", list(ns), {"event": "tool-error", "tool_call_id": call_id,
                                                    "message": data["message"].text}, "tools")
        else:
            yield ProtocolEvent("tools", list(ns), {"event": "tool-finished", "tool_call_id": call_id,
                                                    "output": _message(message_to_dict(data["message"]))}, "tools")

    def _on_message(self, event: Event, ns: tuple[str, ...]) -> Iterator[ProtocolEvent]:
        data = event.data
        message_id = data["message_id"]
        if data["event"] == "start":
            self._messages[message_id] = _Message()
            metadata = {"langgraph_node": "model", "run_id": self.run_id, "lc_agent_name": event.agent}
            if event.thread_id:
                metadata["thread_id"] = event.thread_id
            yield self._part(ns, {"event": "message-start", "role": "ai", "id": message_id, "metadata": metadata})
            return
        partial = self._messages.get(message_id)
        if partial is None:
            return  # its start came before this subscriber joined
        if data["event"] == "delta":
            yield from self._delta(ns, message_id, partial, data)
            return
        del self._messages[message_id]
        yield from self._finish(ns, message_id, partial, data)

    def _delta(self, ns: tuple[str, ...], message_id: str, partial: _Message,
               data: Mapping[str, Any]) -> Iterator[ProtocolEvent]:
        if "text" in data:
            if partial.text_index is None:
                partial.text_index = partial.next_index
                partial.next_index += 1
                yield self._part(ns, {"event": "content-block-start", "index": partial.text_index,
                                      "content": {"type": "text", "text": ""}}, message_id)
            partial.text += data["text"]
            yield self._part(ns, {"event": "content-block-delta", "index": partial.text_index,
                                  "delta": {"type": "text-delta", "text": data["text"]}}, message_id)
            return
        call = data["tool_call"]
        block = partial.tools.get(call["index"])
        if block is None:
            block = partial.tools[call["index"]] = {"index": partial.next_index, "id": call.get("id"),
                                                    "name": call.get("name"), "args": ""}
            partial.next_index += 1
            yield self._part(ns, {"event": "content-block-start", "index": block["index"], "content": {
                "type": "tool_call_chunk", "id": block["id"], "name": block["name"], "args": ""}}, message_id)
        if call.get("args"):
            block["args"] += call["args"]
            yield self._part(ns, {"event": "content-block-delta", "index": block["index"],
                                  "delta": {"type": "tool-call-delta", "args": call["args"]}}, message_id)

    def _finish(self, ns: tuple[str, ...], message_id: str, partial: _Message,
                data: Mapping[str, Any]) -> Iterator[ProtocolEvent]:
        message = data["message"]
        text = message.text
        if text and partial.text_index is None:  # not streamed: the whole reply at once
            partial.text_index = partial.next_index
            partial.next_index += 1
            yield self._part(ns, {"event": "content-block-start", "index": partial.text_index,
                                  "content": {"type": "text", "text": ""}}, message_id)
        if partial.text_index is not None:
            yield self._part(ns, {"event": "content-block-finish", "index": partial.text_index,
                                  "content": {"type": "text", "text": text}}, message_id)
        streamed = {block["id"]: block["index"] for block in partial.tools.values()}
        for call in message.tool_calls:
            index = streamed.get(call["id"])
            if index is None:
                index = partial.next_index
                partial.next_index += 1
            yield self._part(ns, {"event": "content-block-finish", "index": index, "content": {
                "type": "tool_call", "id": call["id"], "name": call["name"], "args": to_jsonable(call["args"])}},
                message_id)
        finish: dict[str, Any] = {"event": "message-finish"}
        usage = data.get("usage")
        if usage:
            finish["usage"] = {k: usage[k] for k in ("input_tokens", "output_tokens", "total_tokens") if k in usage}
        yield self._part(ns, finish, message_id)

    @staticmethod
    def _part(ns: tuple[str, ...], data: dict[str, Any], message_id: str | None = None) -> ProtocolEvent:
        if message_id is not None:
            data["id"] = message_id  # the SDKs route a message's parts to its stream by id
        return ProtocolEvent("messages", list(ns), data, "model")


# -- state as the protocol shows it: messages in the protocol's message shape ------------------------------


def _state(values: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in to_jsonable(dict(values)).items():
        if key == "messages" and isinstance(value, list):
            out[key] = [_message(m) if isinstance(m, dict) and "type" in m else m for m in value]
        elif isinstance(value, dict):
            out[key] = _state(value)
        else:
            out[key] = value
    return out


def _message(message: dict[str, Any]) -> dict[str, Any]:
    """A message dict in the protocol's shape: ``type``, ``content``, ``id`` and what its type adds."""
    out: dict[str, Any] = {"type": message["type"], "content": message.get("content", "")}
    for key in ("id", "name"):
        if isinstance(message.get(key), str):
            out[key] = message[key]
    if message.get("response_metadata"):
        out["response_metadata"] = message["response_metadata"]
    if message["type"] == "tool":
        for key in ("tool_call_id", "status", "artifact"):
            if key in message:
                out[key] = message[key]
    elif message["type"] == "ai" and message.get("tool_calls"):
        out["tool_calls"] = [{"type": "tool_call", "name": c["name"], "args": c.get("args", {}), "id": c.get("id")}
                             for c in message["tool_calls"]]
    return out
