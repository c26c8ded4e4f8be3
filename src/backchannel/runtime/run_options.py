"""A run's LangGraph options, checked and turned into what this runtime runs.

LangGraph clients send a run's ``input``, a ``command`` (``resume``, ``update``,
``goto`` in any of the shapes LangGraph accepts) and ``config.recursion_limit``.
These functions accept what LangGraph accepts, refuse with
:class:`~backchannel.errors.InvalidRequestError` what it would fail on later (so a
bad request is a 422, never a failed run), and return the one shape the run uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from backchannel.errors import InvalidRequestError
from backchannel.messages import messages_from_input
from backchannel.runtime.modes import STREAM_MODES

__all__ = ["GOTO_NODES", "MAX_DELAY", "breakpoint_nodes", "check_delay", "check_input", "check_state_update",
           "check_stream_modes", "event_position", "iteration_limit", "normalize_command"]

GOTO_NODES = ("model", "tools", "end", "__end__")  # the steps a command may send the run to
MAX_DELAY = 10 * 366 * 24 * 3600  # after_seconds: ten years at most


def check_input(input: Any, command: Mapping[str, Any] | None) -> Any:
    """The input to store: a state (object), or messages (a list or a string); ``None`` beside a command.

    UIs send ``input: {}`` with a command (LangGraph ignores the input then); an input
    with something in it beside a command would be lost, so it is refused.
    """
    if input is not None and not isinstance(input, (Mapping, list, str)):
        raise InvalidRequestError(f"input must be an object (the state), a list of messages or a string, "
                                  f"not {type(input).__name__} {input!r:.80}")
    if command is not None:
        if _has_content(input):
            raise InvalidRequestError("give either input or command, not both: a command's run ignores its input "
                                      "(put state changes in command.update)")
        return None
    _check_messages(input.get("messages") if isinstance(input, Mapping) else input, "input")
    return input


def check_state_update(values: Any) -> Any:
    """Values written into a thread's state (``threads.update_state``): an object, or messages."""
    if not isinstance(values, (Mapping, list, str)):
        raise InvalidRequestError(f"values must be an object (state keys), a list of messages or a string, "
                                  f"not {type(values).__name__}")
    _check_messages(values.get("messages") if isinstance(values, Mapping) else values, "values")
    return values


def normalize_command(command: Any) -> dict[str, Any] | None:
    """LangGraph's ``Command`` as a run applies it: ``{"update": {...}, "resume": ..., "goto": node}``.

    Accepts ``goto`` as a node, a ``{"node", "input"}`` Send, or a list of them (empty: none; a
    Send's input becomes part of the update), and ``update`` as an object or a list of
    ``[key, value]`` pairs. A ``resume`` of ``null`` is no resume (as in LangGraph).
    """
    if command is None:
        return None
    if not isinstance(command, Mapping):
        raise InvalidRequestError(f"command must be an object with resume, update and/or goto, not {command!r:.80}")
    normalized: dict[str, Any] = {}
    update = _update(command.get("update"))
    node, sent = _goto(command.get("goto"))
    if sent:
        update = _merged(update or {}, *sent)
    if update:
        _check_messages(update.get("messages"), "command.update")
        normalized["update"] = update
    if command.get("resume") is not None:
        normalized["resume"] = command["resume"]
    if node is not None:
        normalized["goto"] = node
    if not normalized:
        raise InvalidRequestError("command must give resume, update or goto")
    return normalized


def check_stream_modes(modes: Sequence[str]) -> list[str]:
    """``modes`` if each is a stream mode this runtime has."""
    unknown = [m for m in modes if m not in STREAM_MODES]
    if unknown:
        raise InvalidRequestError(f"unknown stream_mode {unknown[0]!r:.80}; use one of {sorted(STREAM_MODES)}")
    return list(modes)


def check_delay(after_seconds: float | None) -> None:
    """A run's ``after_seconds``: from now to :data:`MAX_DELAY`."""
    if after_seconds is not None and not 0 <= after_seconds <= MAX_DELAY:
        raise InvalidRequestError(f"after_seconds must be from 0 to {MAX_DELAY} (ten years), not {after_seconds!r}")


def event_position(last_event_id: str | None) -> int:
    """The ``seq`` after which a resumed stream goes on: a ``Last-Event-ID`` this runtime sent (0: none;
    ``-1`` and ``-`` ask for every event, as useStream and LangGraph's server say it)."""
    if last_event_id is None or last_event_id in ("", "-", "-1"):
        return 0
    if len(last_event_id) > 20 or not last_event_id.isdigit():
        raise InvalidRequestError(f"Last-Event-ID {last_event_id[:40]!r} is not an event id this server sent "
                                  "(a number)")
    return int(last_event_id)


def breakpoint_nodes(value: Any, option: str, tools: Sequence[str]) -> list[str] | None:
    """``interrupt_before``/``interrupt_after``: ``"*"``, or steps (``model``, ``tools``) and tool names."""
    if value is None:
        return None
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise InvalidRequestError(f"{option} must be '*' or a list of step and tool names, not {value!r:.80}")
    known = {"*", "model", "tools", *tools}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InvalidRequestError(f"{option}: no step or tool named {unknown[0]!r:.80}; use '*', 'model', 'tools' "
                                  f"or one of the agent's tools {sorted(tools)}")
    return list(names)


def iteration_limit(config: Mapping[str, Any] | None) -> int | None:
    """The model calls a run may make under ``config["recursion_limit"]`` (``None``: the agent's own limit).

    LangGraph counts steps, and an agent's model and tools steps alternate, so a
    limit of ``n`` steps allows ``(n + 1) // 2`` model calls.
    """
    limit = (config or {}).get("recursion_limit")
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidRequestError(f"config.recursion_limit must be a positive integer, not {limit!r:.80}")
    return (limit + 1) // 2


def _has_content(input: Any) -> bool:
    if isinstance(input, Mapping):
        return any(v not in (None, "", [], {}) for v in input.values())
    return input not in (None, "", [])


def _check_messages(messages: Any, where: str) -> None:
    if messages is None:
        return
    try:
        messages_from_input(messages)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise InvalidRequestError(f"{where} messages: {exc}") from None


def _update(update: Any) -> dict[str, Any] | None:
    """``update`` as an object (a list of ``[key, value]`` pairs folds into one, lists of a key joined)."""
    if update is None or isinstance(update, Mapping):
        return dict(update) if update else None
    if isinstance(update, list) and all(isinstance(p, list | tuple) and len(p) == 2 and isinstance(p[0], str)
                                        for p in update):
        return _merged({}, *({key: value} for key, value in update))
    raise InvalidRequestError(f"command.update must be an object or a list of [key, value] pairs, "
                              f"not {update!r:.80}")


def _goto(goto: Any) -> tuple[str | None, list[dict[str, Any]]]:
    """The node a command goes to, and the inputs its Sends carry."""
    targets = goto if isinstance(goto, list) else [] if goto in (None, "") else [goto]
    nodes, inputs = set(), []
    for target in targets:
        if isinstance(target, Mapping) and isinstance(target.get("node"), str):
            nodes.add(target["node"])
            if target.get("input") is not None:
                if not isinstance(target["input"], Mapping):
                    raise InvalidRequestError(f"command.goto: a Send's input must be an object, "
                                              f"not {target['input']!r:.80}")
                inputs.append(dict(target["input"]))
        elif isinstance(target, str):
            nodes.add(target)
        else:
            raise InvalidRequestError(f"command.goto must name a node, a Send ({{node, input}}) or a list of them, "
                                      f"not {target!r:.80}")
    unknown = sorted(nodes - set(GOTO_NODES))
    if unknown:
        raise InvalidRequestError(f"cannot goto {unknown[0]!r}; use one of {list(GOTO_NODES[:3])}")
    nodes = {"end" if node == "__end__" else node for node in nodes}
    if len(nodes) > 1:
        raise InvalidRequestError(f"command.goto names {sorted(nodes)}: an agent goes to one step at a time")
    return (nodes.pop() if nodes else None), inputs


def _merged(update: dict[str, Any], *more: Mapping[str, Any]) -> dict[str, Any]:
    """Updates applied in order: lists under the same key are joined (messages append), other values replaced."""
    merged = dict(update)
    for extra in more:
        for key, value in extra.items():
            previous = merged.get(key)
            merged[key] = [*previous, *value] if isinstance(previous, list) and isinstance(value, list) else value
    return merged
