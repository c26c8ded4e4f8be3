"""The official LangGraph JavaScript SDK (``@langchain/langgraph-sdk`` from npm), driven by Node: every call
it makes."""

from __future__ import annotations

import json

from js_helpers import run_node


def test_every_call_of_the_js_sdk(server):
    done = run_node("sdk_calls.mjs", server.url)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = {r["call"]: r["error"] for r in results if not r["ok"]}
    assert results and not failed, "\n\n".join(f"{call}:\n{error}" for call, error in failed.items()) + done.stderr
    assert done.returncode == 0, done.stderr
    assert len(results) >= 45
