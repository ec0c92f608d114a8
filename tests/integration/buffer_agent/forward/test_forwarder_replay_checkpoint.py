"""A replayed backlog is checkpointed as soon as Kafka has it, not one interval later.

An agent killed again and again before its first checkpoint would otherwise send the same
backlog at every restart (the chaos test saw five times the traffic in duplicates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.forward.progress import LEGACY_HINT_FILES
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

LONG_INTERVAL = ForwarderConfig(checkpoint_interval_s=120.0, hint_interval_s=0.1)


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(tmp_path / "wal", max_bytes=16 * 1024 * 1024) as log:
        yield log


def _forwarder(wal: WriteAheadLog, bootstrap: str, tmp_path: Path) -> Forwarder:
    return Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=LONG_INTERVAL,
    )


def _wait_for_checkpoint(wal: WriteAheadLog, offset: int, timeout: float) -> float:
    """Seconds until the WAL checkpoint reaches ``offset``."""
    started = time.monotonic()
    wait_for(lambda: wal.checkpoint_offset >= offset, timeout, 0.02, what=f"checkpoint at {offset}")
    return time.monotonic() - started


def test_replayed_frames_are_checkpointed_once_delivered(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = new_topic(1)
    for frame in range(5):
        wal.append(topic, 0, build_batch([SampleRecord(b"k", b"v%d" % frame, frame)]), 1)
    # A previous run sent all five frames and died before checkpointing any of them.
    (tmp_path / "state").mkdir()
    hint = tmp_path / "state" / LEGACY_HINT_FILES[0]  # as an agent before the two-slot hint left it
    hint.write_text(json.dumps({"sent_high": 5, "delivered_high": 5}))
    forwarder = _forwarder(wal, kafka_broker.bootstrap, tmp_path).start()
    try:
        waited = _wait_for_checkpoint(wal, 5, timeout=30)
        wal.append(topic, 0, build_batch([SampleRecord(b"k", b"new", 9)]), 1)
        time.sleep(1.0)
        checkpoint_while_running = wal.checkpoint_offset
        stats = forwarder.stats()
    finally:
        forwarder.stop()

    assert waited < LONG_INTERVAL.checkpoint_interval_s / 4
    # A hint alone (no delivery marks) does not prove delivery: possible, not certain.
    assert (stats.replayed_duplicates, stats.possible_duplicates) == (0, 5)
    assert stats.watermark == 6, "the new frame was delivered"
    assert checkpoint_while_running == 5, "frames beyond the replay wait for the interval"
    assert wal.checkpoint_offset == 6, "stop checkpoints everything delivered"
    values = [record.value for record in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [b"v0", b"v1", b"v2", b"v3", b"v4", b"new"]
