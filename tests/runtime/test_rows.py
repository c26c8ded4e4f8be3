"""Rows: copies of a run's row and of its end."""

from dataclasses import replace

import pytest

from backchannel.runtime.rows import CheckpointRow, CheckpointWrite, RunEnd, RunRow, replaced


def test_a_replaced_row_is_the_row_with_the_changes_as_dataclasses_replace_makes_it():
    row = RunRow("r1", "t1", "a1", "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00", metadata={"k": [1]},
                 kwargs={"input": {"x": 1}}, worker_id="w", concurrency_key="key", concurrency_limit=2,
                 agent_digest="d")
    running = replaced(row, status="running", attempts=1, claim="c1")
    assert running == replace(row, status="running", attempts=1, claim="c1")
    assert (row.status, row.attempts, row.claim) == ("pending", 0, None)  # the row itself unchanged
    assert running.metadata is row.metadata and running.kwargs is row.kwargs  # shallow, as replace's
    end = RunEnd("r1", "t1", "success", "idle", "2026-01-01T00:00:01+00:00", interrupts=[], claim="c1")
    held = CheckpointWrite(CheckpointRow("t1", "c2", "c1", 2, "r1", {"messages": []}, "", {"step": 1},
                                         "2026-01-01T00:00:01+00:00"), parent_seq=1)
    assert replaced(end, checkpoint=held) == replace(end, checkpoint=held)
    assert end.checkpoint is None


def test_a_replaced_row_refuses_a_field_it_does_not_have():
    with pytest.raises(AttributeError):
        replaced(RunRow("r1", "t1", "a1", "now", "now"), stauts="running")
