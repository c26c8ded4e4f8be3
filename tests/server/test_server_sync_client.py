"""The official sync client (``langgraph_sdk.get_sync_client``) over every route family."""

from __future__ import annotations

import time

import pytest
from langgraph_sdk.errors import ConflictError, NotFoundError
from langgraph_sdk.schema import Command
from server_helpers import user


def test_threads_runs_state_store_and_assistants(sync_client):
    c = sync_client
    assert {a["graph_id"] for a in c.assistants.search(limit=50)} >= {"calc", "echo", "mailer"}
    assert c.assistants.get("calc")["graph_id"] == "calc"

    thread = c.threads.create(metadata={"sync": "yes"})
    tid = thread["thread_id"]
    assert c.threads.get(tid)["metadata"] == {"sync": "yes"}
    assert c.threads.update(tid, metadata={"more": 1})["metadata"] == {"sync": "yes", "more": 1}
    assert c.threads.count(metadata={"sync": "yes"}) == 1

    assert c.runs.wait(tid, "calc", input=user("2 + 3?"))["messages"][-1]["content"] == "the answer is 5"
    parts = list(c.runs.stream(tid, "calc", input=user("again"), stream_mode=["updates", "messages-tuple"]))
    assert {p.event for p in parts} == {"metadata", "updates", "messages"}
    run = c.runs.create(tid, "slow", input=user("later"))
    with pytest.raises(ConflictError):
        c.runs.create(tid, "slow", input=user("now"), multitask_strategy="reject")
    joined = list(c.runs.join_stream(tid, run["run_id"]))
    assert c.runs.join(tid, run["run_id"])["messages"][-1]["content"] == "echo: later"
    assert joined[-1].event == "values" and joined[-1].data["messages"][-1]["content"] == "echo: later"
    assert [r["status"] for r in c.runs.list(tid)] == ["success"] * 3

    cancelled = c.runs.create(tid, "glacial", input=user("stop me"))  # still going when cancelled, however loaded
    deadline = time.monotonic() + 5
    while c.runs.get(tid, cancelled["run_id"])["status"] != "running":
        assert time.monotonic() < deadline
        time.sleep(0.02)
    c.runs.cancel(tid, cancelled["run_id"], wait=True)
    assert c.runs.get(tid, cancelled["run_id"])["status"] == "interrupted"

    state = c.threads.get_state(tid)
    history = c.threads.get_history(tid, limit=50)
    assert history[0]["checkpoint"]["checkpoint_id"] == state["checkpoint"]["checkpoint_id"]
    c.threads.update_state(tid, {"messages": [{"role": "user", "content": "noted"}]})
    assert c.threads.get_state(tid)["values"]["messages"][-1]["content"] == "noted"
    copy = c.threads.copy(tid)
    assert c.threads.get_state(copy["thread_id"])["values"]["messages"][-1]["content"] == "noted"

    mail = c.threads.create()["thread_id"]
    assert c.runs.wait(mail, "mailer", input=user("hi"))["__interrupt__"]
    done = c.runs.wait(mail, "mailer", command=Command(resume={"decisions": [{"type": "reject", "message": "no"}]}))
    assert c.threads.get(mail)["status"] == "idle" and done["messages"][-1]["type"] == "ai"

    c.store.put_item(["sync", "client"], "k", {"v": 2})
    assert c.store.get_item(["sync", "client"], "k")["value"] == {"v": 2}
    assert [i["key"] for i in c.store.search_items(["sync"])["items"]] == ["k"]
    assert c.store.list_namespaces(prefix=["sync"])["namespaces"] == [["sync", "client"]]
    c.store.delete_item(["sync", "client"], "k")
    assert c.store.get_item(["sync", "client"], "k") is None

    c.threads.delete(tid)
    with pytest.raises(NotFoundError):
        c.threads.get(tid)
