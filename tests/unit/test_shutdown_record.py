"""The agent's shutdown record: rendered and read back; anything else is no record."""

from __future__ import annotations

import pytest

from durable_producer.shutdown_record import ShutdownRecord, parse, render


@pytest.mark.parametrize("record", [
    ShutdownRecord(True, 0, 0, 0), ShutdownRecord(False, 12, 0, 0),
    ShutdownRecord(True, 0, 3, 0), ShutdownRecord(True, 0, 0, 1),
])
def test_a_record_reads_back_as_written(record: ShutdownRecord) -> None:
    assert parse(render(record)) == record
    assert parse(render(record) + "\n") == record


def test_only_a_drained_volume_without_dead_letters_is_empty() -> None:
    assert ShutdownRecord(True, 0, 0, 0).volume_empty
    assert not ShutdownRecord(False, 0, 0, 0).volume_empty  # the drain did not finish
    assert not ShutdownRecord(True, 1, 0, 0).volume_empty
    assert not ShutdownRecord(True, 0, 1, 0).volume_empty  # a pending dead letter
    # What could be read of a quarantined segment was replayed; the rest is lost either way
    # (a drain of such a volume succeeds too: test_drain_lost_tail.py).
    assert ShutdownRecord(True, 0, 0, 1).volume_empty


@pytest.mark.parametrize("message", [
    None, "", "Error: something else", "[]", '{"event": "other"}',
    '{"event": "durable-agent stopped", "drained": "yes", "backlogRecords": 0,'
    ' "deadLetters": 0, "quarantinedSegments": 0}',
    '{"event": "durable-agent stopped", "drained": true, "backlogRecords": -1,'
    ' "deadLetters": 0, "quarantinedSegments": 0}',
    '{"event": "durable-agent stopped", "drained": true, "backlogRecords": false,'
    ' "deadLetters": 0, "quarantinedSegments": 0}',
    '{"event": "durable-agent stopped", "drained": true, "backlogRecords": 0}',
    render(ShutdownRecord(True, 0, 0, 0))[:-5],  # truncated
])
def test_anything_but_a_whole_record_is_no_record(message: object) -> None:
    assert parse(message) is None
