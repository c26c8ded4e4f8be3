"""Human in the loop: pause before chosen tools run, until a person approves, edits or rejects them.

The interrupt payload and the decisions follow LangChain's
``HumanInTheLoopMiddleware``, so UIs built for it work unchanged::

    {"action_requests": [{"name", "args", "description"}],
     "review_configs": [{"action_name", "allowed_decisions", "args_schema"?}]}

Resume with ``command={"resume": {"decisions": [...]}}``, one decision per
action request, in order: ``{"type": "approve"}``, ``{"type": "edit",
"edited_action": {"name", "args"}}`` (or just ``"args"``, same action),
``{"type": "reject", "message": ...}`` or ``{"type": "respond", "message": ...}``
(the message becomes the tool's result). When a review config has an
``args_schema``, edited (and approved) args are checked against it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from backchannel.errors import InvalidRequestError
from backchannel.interrupts import interrupt
from backchannel.messages import AIMessage, ToolCall, ToolMessage
from backchannel.middleware import Middleware

__all__ = ["DECISIONS", "HumanInTheLoop", "check_resume", "decision_args", "is_review_request"]

DECISIONS = ("approve", "edit", "reject", "respond")


class HumanInTheLoop(Middleware):
    """Pause before the tools named in ``interrupt_on`` run.

    ``interrupt_on`` maps a tool name to ``True`` (every decision allowed),
    ``False`` (never pause), or ``{"allowed_decisions": [...], "description": ...}``.
    """

    def __init__(self, interrupt_on: Mapping[str, bool | Mapping[str, Any]], *,
                 description_prefix: str = "Tool execution requires approval") -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        for name, config in interrupt_on.items():
            if config is False:
                continue
            allowed = list(DECISIONS if config is True else config.get("allowed_decisions", DECISIONS))
            unknown = [d for d in allowed if d not in DECISIONS]
            if not allowed or unknown:
                raise ValueError(f"tool {name!r}: allowed_decisions must be a non-empty subset of {list(DECISIONS)}")
            description = None if config is True else config.get("description")
            self.configs[name] = {"allowed_decisions": allowed, "description": description}
        self.description_prefix = description_prefix

    async def after_model(self, state: Mapping[str, Any], ctx: Any) -> dict[str, Any] | None:
        """After the model asks for gated tools: pause for review, then apply the decisions."""
        message = state["messages"][-1]
        if not isinstance(message, AIMessage):
            return None
        gated = [c for c in message.tool_calls if c["name"] in self.configs]
        if not gated:
            return None
        request = {"action_requests": [self._action(c) for c in gated],
                   "review_configs": [{"action_name": c["name"],
                                       "allowed_decisions": self.configs[c["name"]]["allowed_decisions"]}
                                      for c in gated]}
        decisions = check_resume(request, interrupt(request))
        return self._apply(message, gated, decisions)

    def _action(self, call: ToolCall) -> dict[str, Any]:
        description = self.configs[call["name"]]["description"]
        if description is None:
            args = json.dumps(call["args"], ensure_ascii=False, default=str)
            description = f"{self.description_prefix}\n\nTool: {call['name']}\nArgs: {args}"
        return {"name": call["name"], "args": call["args"], "description": description}

    def _apply(self, message: AIMessage, gated: Sequence[ToolCall],
               decisions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        edits: dict[str, ToolCall] = {}
        answers: list[ToolMessage] = []
        for call, decision in zip(gated, decisions):
            kind = decision["type"]
            if kind == "edit":
                action = decision.get("edited_action") or {"name": call["name"]}
                edits[call["id"]] = {**call, "name": action["name"], "args": dict(decision_args(decision))}
            elif kind == "reject":
                reason = decision.get("message")
                text = (f"User rejected the tool call for `{call['name']}` with reason: {reason}" if reason else
                        f"User rejected the tool call for `{call['name']}` with id {call['id']}. The tool was not "
                        "executed. Do not retry this tool call unless the user explicitly requests it.")
                answers.append(ToolMessage(text, call["id"], call["name"], status="error"))
            elif kind == "respond":
                answers.append(ToolMessage(decision["message"], call["id"], call["name"]))
        update: list[Any] = []
        if edits:
            calls = [edits.get(c["id"], c) for c in message.tool_calls]
            update.append(replace(message, tool_calls=calls))  # same id: replaces the original
        return {"messages": [*update, *answers]} if update or answers else {}


def is_review_request(value: Any) -> bool:
    """Whether an interrupt value is a human-in-the-loop review request."""
    return isinstance(value, Mapping) and "action_requests" in value and "review_configs" in value


def decision_args(decision: Mapping[str, Any]) -> Any:
    """The args a decision carries: its ``edited_action``'s, else its own ``args`` (``None``: none).

    The one reading of a decision's args, so the args checked against a review's ``args_schema``
    are the args applied.
    """
    action = decision.get("edited_action")
    if isinstance(action, Mapping) and action:
        return action.get("args")
    return decision.get("args")


def check_resume(request: Any, response: Any) -> list[Mapping[str, Any]]:
    """The decisions in ``response`` if they answer the review ``request``, else :class:`InvalidRequestError`.

    Interrupts that are not review requests accept any resume value.
    """
    if not is_review_request(request):
        return response
    if not isinstance(response, Mapping) or not isinstance(response.get("decisions"), list):
        raise InvalidRequestError(
            "resume a human-in-the-loop review with {'decisions': [...]} (one decision per tool call), "
            f"got {response!r}")
    decisions = response["decisions"]
    actions = request["action_requests"]
    if len(decisions) != len(actions):
        raise InvalidRequestError(f"Number of human decisions ({len(decisions)}) does not match number of "
                                  f"hanging tool calls ({len(actions)}).")
    for decision, review in zip(decisions, request["review_configs"]):
        _check_decision(decision, review)
    return decisions


def _check_decision(decision: Any, review: Mapping[str, Any]) -> None:
    allowed = review["allowed_decisions"]
    kind = decision.get("type") if isinstance(decision, Mapping) else None
    if kind not in allowed:
        raise InvalidRequestError(
            f"Unexpected human decision: {decision!r}. Decision type {kind!r} is not allowed for tool "
            f"{review['action_name']!r}. Expected one of {allowed} based on the tool's configuration.")
    if kind == "edit":
        action = decision.get("edited_action")
        edited = isinstance(action, Mapping) and isinstance(action.get("name"), str) and isinstance(
            action.get("args"), Mapping)
        if not edited and not isinstance(decision.get("args"), Mapping):
            raise InvalidRequestError(f"an 'edit' decision needs 'edited_action': {{'name': str, 'args': {{...}}}} "
                                      f"(or just 'args': {{...}}), got {decision!r}")
    if kind in ("edit", "approve") and "args_schema" in review:
        args = decision_args(decision)
        if args is not None:
            _check_args(args, review["args_schema"], review["action_name"])
    if kind == "respond" and not isinstance(decision.get("message"), str):
        raise InvalidRequestError(f"a 'respond' decision needs a 'message' string, got {decision!r}")
    if kind == "reject" and decision.get("message") is not None and not isinstance(decision["message"], str):
        raise InvalidRequestError(f"a 'reject' decision's 'message' must be a string, got {decision!r}")


_JSON_TYPES: dict[str, type | tuple[type, ...]] = {"string": str, "object": Mapping, "array": list, "boolean": bool,
                                                   "integer": int, "number": (int, float)}


def _check_args(args: Any, schema: Mapping[str, Any], action: str) -> None:
    """Check decision args against a review's ``args_schema`` (the JSON Schema subset reviews use)."""
    if not isinstance(args, Mapping):
        raise InvalidRequestError(f"the args for {action!r} must be an object, got {args!r}")
    properties = schema.get("properties", {})
    if schema.get("additionalProperties") is False:
        unknown = sorted(set(args) - set(properties))
        if unknown:
            raise InvalidRequestError(f"unknown arg {unknown[0]!r} for {action!r}; allowed: {sorted(properties)}")
    for name in schema.get("required", ()):
        if name not in args:
            raise InvalidRequestError(f"the args for {action!r} need {name!r}")
    for name, value in args.items():
        rule = properties.get(name, {})
        expected = _JSON_TYPES.get(rule.get("type", ""))
        wrong_bool = isinstance(value, bool) and rule.get("type") != "boolean"
        if expected is not None and (not isinstance(value, expected) or wrong_bool):
            raise InvalidRequestError(f"arg {name!r} for {action!r} must be a {rule['type']}, got {value!r}")
        if isinstance(value, str) and len(value.strip()) < rule.get("minLength", 0):
            raise InvalidRequestError(f"arg {name!r} for {action!r} must not be empty")
