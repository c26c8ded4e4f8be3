"""The OpenAPI document, built from the endpoints the server declares (so it cannot drift)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from backchannel.server.routing import Endpoint

__all__ = ["openapi_document"]

_PARAM = re.compile(r"{(\w+)}")
_ERROR = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}


def openapi_document(endpoints: Sequence[Endpoint], *, version: str) -> dict[str, Any]:
    """An OpenAPI 3.1 document describing ``endpoints``: paths, parameters, bodies, responses."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Error": _ERROR}
    for endpoint in endpoints:
        operation: dict[str, Any] = {"summary": endpoint.summary, "operationId": _operation_id(endpoint),
                                     "parameters": _parameters(endpoint), "responses": _responses(endpoint)}
        if endpoint.body is not None:
            schema = endpoint.body.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[endpoint.body.__name__] = schema
            operation["requestBody"] = {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{endpoint.body.__name__}"}}}}
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation
    return {"openapi": "3.1.0", "info": {"title": "backchannel", "version": version,
                                         "description": "The LangGraph API over a backchannel runtime."},
            "paths": paths, "components": {"schemas": schemas, "securitySchemes": {
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}}}


def _operation_id(endpoint: Endpoint) -> str:
    words = re.sub(r"[{}]", "", endpoint.path).strip("/").replace("/", "_")
    return f"{endpoint.method.lower()}_{words or 'root'}"


def _parameters(endpoint: Endpoint) -> list[dict[str, Any]]:
    found = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
             for name in _PARAM.findall(endpoint.path)]
    for name, query in endpoint.query.items():
        found.append({"name": name, "in": "query", "required": query.required, "description": query.description,
                      "schema": {"type": query.type}})
    return found


def _responses(endpoint: Endpoint) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    for status, description in endpoint.responses.items():
        if status in (202, 204):
            responses[str(status)] = {"description": description}
        elif status < 300:
            responses[str(status)] = {"description": description,
                                      "content": {endpoint.media_type if status == 200 else "application/json": {}}}
        else:
            responses[str(status)] = {"description": description, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/Error"}}}}
    return responses
