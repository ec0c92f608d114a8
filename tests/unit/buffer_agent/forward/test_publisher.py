"""What the forwarder publishes of itself: the possible duplicates it counts reach the log too."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from durable_producer.buffer_agent.figures.metrics import AgentMetrics
from durable_producer.buffer_agent.forward.ack_tracker import AckTracker
from durable_producer.buffer_agent.forward.health import ForwarderHealth
from durable_producer.buffer_agent.forward.publisher import ForwarderCounts, Publisher
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.wal_helpers import SMALL


def test_records_counted_as_possible_duplicates_are_logged_once_with_their_cause(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The metric starts at 0 in each run of the agent; what a run counted just before a
    kill -9 is kept by its log line only (tests of kill -9 sum these lines)."""
    metrics = AgentMetrics()
    with WriteAheadLog.open(tmp_path / "wal", SMALL) as wal:
        publisher = Publisher(wal, metrics, ForwarderHealth(stall_after_s=10))
        tracker = AckTracker(0, {})
        counts = ForwarderCounts()
        with caplog.at_level(logging.WARNING, logger="durable_producer.buffer_agent.forward"):
            publisher.publish(tracker, counts, 0)
            counts.possible["restart"] += 40
            counts.possible["reset"] += 3
            publisher.publish(tracker, counts, 0)
            publisher.publish(tracker, counts, 0)  # nothing new: no line
            counts.possible["reset"] += 2
            publisher.publish(tracker, counts, 0)
    lines = [r.getMessage() for r in caplog.records if "possible duplicates" in r.getMessage()]
    assert lines == [
        "40 record(s) counted as possible duplicates (cause restart, 40 this run)",
        "3 record(s) counted as possible duplicates (cause reset, 3 this run)",
        "2 record(s) counted as possible duplicates (cause reset, 5 this run)",
    ]
    total = metrics.registry.get_sample_value
    assert total("durable_agent_possible_duplicates_total", {"cause": "restart"}) == 40
    assert total("durable_agent_possible_duplicates_total", {"cause": "reset"}) == 5
