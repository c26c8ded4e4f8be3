"""``/docs``: the API reference, rendered from the same OpenAPI document as ``/openapi.json``.

One self-contained HTML page (no scripts, nothing fetched from elsewhere): each
path and method with its summary, parameters, request body fields and
responses, so the reference cannot drift from what is served.
"""

from __future__ import annotations

import html
from collections.abc import Iterator, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

__all__ = ["docs", "render_docs"]

_STYLE = """body{font:15px/1.5 system-ui,sans-serif;max-width:64rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{margin-bottom:0}section{border-top:1px solid #ddd;padding:.6rem 0}code{font:13px ui-monospace,monospace}
.m{display:inline-block;min-width:4.2rem;font:600 12px ui-monospace,monospace;padding:2px 6px;border-radius:4px;
color:#fff;background:#555;text-align:center}.get{background:#2f7d32}.post{background:#1565c0}.put{background:#8e24aa}
.patch{background:#ef6c00}.delete{background:#c62828}table{border-collapse:collapse;margin:.3rem 0 .3rem 5rem}
td{padding:1px 10px 1px 0;vertical-align:top}td:first-child{font-family:ui-monospace,monospace}
.r{margin-left:5rem;color:#555}nav a{margin-right:.8rem}"""


async def docs(request: Request) -> Response:
    return HTMLResponse(render_docs(request.app.state.openapi()))


def render_docs(document: Mapping[str, Any]) -> str:
    """The reference page for an OpenAPI 3.1 ``document``."""
    info = document["info"]
    groups: dict[str, list[str]] = {}
    for path in document["paths"]:
        groups.setdefault(path.strip("/").split("/")[0] or "/", []).append(path)
    nav = " ".join(f'<a href="#{_e(g)}">/{_e(g)}</a>' for g in groups)
    body = "".join(f'<h2 id="{_e(g)}">/{_e(g)}</h2>' + "".join(_path(document, p) for p in paths)
                   for g, paths in groups.items())
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{_e(info["title"])} API reference</title>'
            f"<style>{_STYLE}</style></head><body><h1>{_e(info['title'])} {_e(info['version'])}</h1>"
            f"<p>{_e(info.get('description', ''))} The same document as JSON: "
            f'<a href="openapi.json">openapi.json</a>.</p><nav>{nav}</nav>{body}</body></html>')


def _path(document: Mapping[str, Any], path: str) -> str:
    return "".join(_operation(document, path, method, op) for method, op in document["paths"][path].items())


def _operation(document: Mapping[str, Any], path: str, method: str, op: Mapping[str, Any]) -> str:
    rows = [(f"{p['name']} <small>({p['in']}{', required' if p.get('required') else ''})</small>",
             _e(p.get("schema", {}).get("type", "")), _e(p.get("description", ""))) for p in op.get("parameters", ())]
    body = op.get("requestBody")
    if body is not None:
        ref = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        rows += list(_fields(document["components"]["schemas"], document["components"]["schemas"][ref]))
    table = "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td></tr>" for a, b, c in rows)
    responses = "; ".join(f"<b>{_e(code)}</b> {_e(r['description'])}" for code, r in op["responses"].items())
    return (f'<section id="{_e(op["operationId"])}"><span class="m {method}">{method.upper()}</span> '
            f"<code>{_e(path)}</code> — {_e(op['summary'])}{f'<table>{table}</table>' if table else ''}"
            f'<div class="r">{responses}</div></section>')


def _fields(schemas: Mapping[str, Any], schema: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    required = set(schema.get("required", ()))
    for name, field in schema.get("properties", {}).items():
        yield (f"{_e(name)} <small>(body{', required' if name in required else ''})</small>",
               _e(_type_of(schemas, field)), _e(field.get("description", "")))


def _type_of(schemas: Mapping[str, Any], field: Mapping[str, Any]) -> str:
    """A field's JSON type in a few words: ``string``, ``integer | null``, ``array of RunCreate``..."""
    if "$ref" in field:
        return field["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in field:
        return " | ".join(dict.fromkeys(_type_of(schemas, f) for f in field["anyOf"]))
    if "enum" in field:
        return " | ".join(repr(v) for v in field["enum"])
    if "const" in field:
        return repr(field["const"])
    if field.get("type") == "array" and "items" in field:
        return f"array of {_type_of(schemas, field['items'])}"
    return str(field.get("type", "any"))


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)
