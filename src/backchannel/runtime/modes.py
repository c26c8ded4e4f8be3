"""LangGraph stream modes: a run's events as the parts ``langgraph_sdk`` clients expect.

``values``, ``updates``, ``messages-tuple``, ``messages``, ``custom``,
``events``, ``debug``, ``tasks`` and ``checkpoints`` follow the LangGraph
API; ``lifecycle`` and ``tools`` carry the v2 protocol's payloads (named
subagents with their cause; tool start/finish/error), and ``async_tasks``
the status of background subagent tasks. With ``subgraphs`` a nested run's
part is named ``<mode>|<namespace segments>``; without, nested parts are
left out (as LangGraph does), except ``lifecycle`` which exists to report
them.

On the wire a subagent's segment is ``tools:<tool call id>``, the shape
LangGraph gives a tool-dispatched subgraph and the one its UI hooks
(``useStream``) take for a subagent; the agent's own name (seed 002) is its
lifecycle events' ``graph_name`` and its messages' ``lc_agent_name``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Literal, get_args

import orjson

from backchannel._clock import now_iso
from backchannel.events import Event
from backchannel.messages import AIMessage, message_to_dict
from backchannel.protocols import StreamPart
from backchannel.serde import to_jsonable

__all__ = ["STREAM_MODES", "StreamMapper", "StreamMode", "StreamPart", "interrupt_part", "wants_values",
           "wire_namespace"]

# Sorted: the OpenAPI document lists them in this order.
StreamMode = Literal["async_tasks", "checkpoints", "custom", "debug", "events", "lifecycle", "messages",
                     "messages-tuple", "tasks", "tools", "updates", "values"]
STREAM_MODES: frozenset[str] = frozenset(get_args(StreamMode))


def wants_values(modes: Sequence[str]) -> bool:
    """Whether these stream modes need full-state snapshots."""
    return bool({"values", "checkpoints", "debug"} & set(modes))


def interrupt_part(interrupt: Any) -> dict[str, Any]:
    """An interrupt as streams show it: ``{"value", "id", "response_schema"}``."""
    data = interrupt.to_dict() if hasattr(interrupt, "to_dict") else dict(interrupt)
    return {"value": to_jsonable(data["value"]), "id": data["id"], "response_schema": None}


class StreamMapper:
    """Turns events into stream parts for the requested modes.

    With ``wire``, the parts are for a reader that renders them as JSON with orjson (the server): a model's text
    token in ``messages-tuple`` comes as its JSON already (an ``orjson.Fragment``, the same bytes), the token
    spliced into what the rest of the part renders to, rendered once per message (it is the same for each token).
    """

    def __init__(self, modes: Sequence[str], *, subgraphs: bool = False,
                 metadata: dict[str, Any] | None = None, wire: bool = False) -> None:
        self.modes = frozenset(modes)
        self.subgraphs = subgraphs
        self.metadata = metadata or {}
        self.wire = wire
        self._seen: set[str] = set()
        self._partial: dict[str, dict[str, Any]] = {}
        self._message_meta: dict[str, dict[str, Any]] = {}  # of each message being streamed, for its chunks
        self._rendered: dict[str, bytes] = {}  # of each message being streamed: its tokens' JSON after the text
        self._step = 0
        self._only_tuples = self.modes == {"messages-tuple"}

    def parts(self, event: Event) -> list[StreamPart]:
        """The parts ``event`` becomes (none, one, or a few)."""
        nested = bool(event.namespace)
        if nested and not self.subgraphs and event.type != "lifecycle":
            return []
        if self._only_tuples and not nested and event.type == "message" and event.data["event"] == "delta":
            # A model's token, the most frequent event by far: as a messages-tuple part, straight.
            data = event.data
            if self.wire and "tool_call" not in data:
                return [StreamPart("messages", self._token_json(event), str(event.seq))]
            return [StreamPart("messages", [_chunk(data, event.agent), self._chunk_meta(event)], str(event.seq))]
        handler = getattr(self, f"_on_{event.type}", None)
        if handler is None:
            return []
        suffix = "".join(f"|{segment}" for segment in wire_namespace(event.namespace)) if nested else ""
        event_id = str(event.seq)
        parts = []
        for mode, data in handler(event):
            if mode in self.modes or (mode.startswith("messages/") and "messages" in self.modes):
                # messages-tuple parts are named "messages" on the wire (and namespaced, unlike messages/*)
                base = "messages" if mode == "messages-tuple" else mode
                name = mode if mode.startswith("messages/") else base + suffix
                parts.append(StreamPart(name, data, event_id))
        return parts

    # Each _on_<type> yields (mode, data) pairs; parts() keeps the requested ones.

    def _on_values(self, event: Event) -> Iterator[tuple[str, Any]]:
        values = to_jsonable({k: v for k, v in event.data.items() if k != "__interrupt__"})
        if "__interrupt__" in event.data:  # as in updates: {"value", "id", "response_schema"}
            values["__interrupt__"] = [interrupt_part(i) for i in event.data["__interrupt__"]]
        yield "values", values

    def _on_updates(self, event: Event) -> Iterator[tuple[str, Any]]:
        self._step += 1
        update = to_jsonable(event.data)
        yield "updates", update
        for node, result in update.items():
            task = {"id": f"{event.run_id}:{self._step}", "name": node}
            yield "tasks", {**task, "input": None, "triggers": [f"branch:to:{node}"], "metadata": self._meta(event)}
            yield "tasks", {**task, "error": None, "result": result, "interrupts": []}
            yield "debug", {"step": self._step, "timestamp": now_iso(), "type": "task_result",
                            "payload": {**task, "error": None, "result": result, "interrupts": []}}
        if "messages" in self.modes:
            for result in update.values():
                for message in (result or {}).get("messages", ()) if isinstance(result, dict) else ():
                    if message.get("type") != "ai":
                        yield from self._complete_message(message, event)

    def _on_checkpoint(self, event: Event) -> Iterator[tuple[str, Any]]:
        if not self.modes & {"checkpoints", "debug"}:
            return
        data = {**event.data, "values": to_jsonable(event.data["values"])}
        yield "checkpoints", data
        yield "debug", {"step": data.get("metadata", {}).get("step", self._step), "timestamp": now_iso(),
                        "type": "checkpoint", "payload": data}

    def _on_interrupt(self, event: Event) -> Iterator[tuple[str, Any]]:
        yield "updates", {"__interrupt__": [interrupt_part(i) for i in event.data["interrupts"]]}

    def _on_custom(self, event: Event) -> Iterator[tuple[str, Any]]:
        yield "custom", to_jsonable(event.data)

    def _on_lifecycle(self, event: Event) -> Iterator[tuple[str, Any]]:
        yield "lifecycle", {**to_jsonable(event.data), "namespace": list(wire_namespace(event.namespace))}
        kind = {"started": "on_chain_start", "completed": "on_chain_end"}.get(event.data["event"])
        if kind:
            yield "events", self._langchain_event(kind, event.data.get("graph_name", event.agent), event, {})

    def _on_task(self, event: Event) -> Iterator[tuple[str, Any]]:
        yield "async_tasks", to_jsonable(event.data)

    def _on_tool(self, event: Event) -> Iterator[tuple[str, Any]]:
        data = event.data
        kind = data["event"]
        if kind == "started":
            yield "tools", {"event": "tool-started", "tool_call_id": data["tool_call_id"],
                            "tool_name": data["tool_name"], "input": to_jsonable(data.get("args"))}
            yield "events", self._langchain_event("on_tool_start", data["tool_name"], event,
                                                  {"input": to_jsonable(data.get("args"))})
            return
        message = message_to_dict(data["message"])
        if kind == "error":
            yield "tools", {"event": "tool-error", "tool_call_id": data["tool_call_id"],
                            "message": data["message"].text}
        else:
            yield "tools", {"event": "tool-finished", "tool_call_id": data["tool_call_id"], "output": message}
        yield "events", self._langchain_event("on_tool_end", data["tool_name"], event, {"output": message})
        yield "messages-tuple", [message, self._meta(event, node="tools")]

    def _on_message(self, event: Event) -> Iterator[tuple[str, Any]]:
        # A model streams many deltas: only what the requested modes show is built for each.
        data = event.data
        message_id = data["message_id"]
        modes = self.modes
        if data["event"] == "start":
            if "messages" in modes:
                self._partial[message_id] = message_to_dict(AIMessage(id=message_id, name=event.agent or None))
            if "events" in modes:
                yield "events", self._langchain_event("on_chat_model_start", "model", event, {})
            if message_id not in self._seen:
                self._seen.add(message_id)
                yield "messages/metadata", {message_id: {"metadata": self._meta(event, node="model")}}
            return
        if data["event"] == "delta":
            chunk = _chunk(data, event.agent)
            if "messages-tuple" in modes:
                yield "messages-tuple", [chunk, self._chunk_meta(event)]
            if "events" in modes:
                yield "events", self._langchain_event("on_chat_model_stream", "model", event, {"chunk": chunk})
            partial = self._partial.get(message_id)
            if partial is not None:
                if "text" in data:
                    partial["content"] += data["text"]
                yield "messages/partial", [dict(partial)]
            return
        meta = self._message_meta.pop(message_id, None) or self._meta(event, node="model")
        self._rendered.pop(message_id, None)
        final = message_to_dict(data["message"])
        self._partial.pop(message_id, None)
        last = {**final, "type": "AIMessageChunk", "content": "", "tool_call_chunks": [], "tool_calls": [],
                "chunk_position": "last"}
        yield "messages-tuple", [last, meta]
        yield "messages/partial", [final]
        yield "events", self._langchain_event("on_chat_model_end", "model", event, {"output": final})

    def _complete_message(self, message: dict[str, Any], event: Event) -> Iterator[tuple[str, Any]]:
        if message["id"] not in self._seen:
            self._seen.add(message["id"])
            yield "messages/metadata", {message["id"]: {"metadata": self._meta(event, node="tools")}}
        yield "messages/complete", [message]

    def _chunk_meta(self, event: Event) -> dict[str, Any]:
        # One dict for every chunk of a message, as LangGraph's messages mode gives its chunks.
        meta = self._message_meta.get(event.data["message_id"])
        if meta is None:
            meta = self._message_meta[event.data["message_id"]] = self._meta(event, node="model")
        return meta

    def _token_json(self, event: Event) -> orjson.Fragment:
        """A text token's messages-tuple part as JSON: ``[chunk, metadata]`` rendered with the token spliced in."""
        data = event.data
        rest = self._rendered.get(data["message_id"])
        if rest is None:
            empty = [_chunk({"message_id": data["message_id"]}, event.agent), self._chunk_meta(event)]
            rendered = orjson.dumps(empty, option=orjson.OPT_NON_STR_KEYS)  # b'[{"content":"",...'
            rest = self._rendered[data["message_id"]] = rendered[len(_EMPTY_TOKEN):]
        return orjson.Fragment(_TOKEN + orjson.dumps(data.get("text", "")) + rest)

    def _meta(self, event: Event, node: str | None = None) -> dict[str, Any]:
        meta = {**self.metadata, "run_id": event.run_id, "thread_id": event.thread_id, "lc_agent_name": event.agent}
        if node is not None:
            meta["langgraph_node"] = node
            meta["langgraph_checkpoint_ns"] = "|".join(wire_namespace(event.namespace))
        return meta

    def _langchain_event(self, kind: str, name: str, event: Event, data: dict[str, Any]) -> dict[str, Any]:
        return {"event": kind, "name": name, "run_id": event.run_id, "tags": [],
                "metadata": self._meta(event), "data": data, "parent_ids": []}


def wire_namespace(namespace: Sequence[str]) -> tuple[str, ...]:
    """A namespace as LangGraph names tool-dispatched subgraphs: each ``<agent>:<tool call id>`` as ``tools:<id>``."""
    return tuple(f"tools:{segment.partition(':')[2] or segment}" for segment in namespace)


_TOKEN = b'[{"content":'  # a token's messages-tuple part rendered, up to its text (a chunk's first field)
_EMPTY_TOKEN = _TOKEN + b'""'


def _chunk(data: dict[str, Any], agent: str) -> dict[str, Any]:
    """A streamed piece of an AI message (a ``delta`` event's data), as LangChain's ``AIMessageChunk`` dict."""
    chunk: dict[str, Any] = {
        "content": data.get("text", ""), "additional_kwargs": {}, "response_metadata": {},
        "type": "AIMessageChunk", "name": agent or None, "id": data["message_id"], "tool_calls": [],
        "invalid_tool_calls": [], "usage_metadata": None, "tool_call_chunks": [], "chunk_position": None}
    if "tool_call" in data:
        call = data["tool_call"]
        chunk["tool_call_chunks"] = [{"name": call["name"], "args": call["args"], "id": call["id"],
                                      "index": call["index"], "type": "tool_call_chunk"}]
    return chunk


