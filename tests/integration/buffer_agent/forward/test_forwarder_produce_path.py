"""The forwarder's batch path against Apache Kafka: the read-ahead budget, merging of small
client batches within a topic's ``max.message.bytes``, a merged batch Kafka refuses, and the
freed heap given back after a burst.

A stored client batch goes out as it is; consecutive small uncompressed ones of a partition
are merged into one batch (``kafka/_batch_merge.c``). These tests pin what that must never
change: every record once, in order, with its key, value, headers and timestamp.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward import forwarder as forwarder_module
from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.process_tuning import TRIM_AFTER_PEAK_BYTES
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.raw_fetch import stored_batches
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

RECORDS_PER_FRAME = 40


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(
        tmp_path / "wal", segment_bytes=1024 * 1024, max_frame_bytes=512 * 1024
    ) as log:
        yield log


def _record(frame: int, index: int) -> SampleRecord:
    return SampleRecord(
        key=b"%d/%d" % (frame, index),
        value=b"frame %d record %d " % (frame, index) + b"v" * 60,
        timestamp_ms=1_000_000 + frame * 1_000 + index,
        headers=(("index", b"%d" % index),) if index % 3 == 0 else (),
    )


def _forward(
    wal: WriteAheadLog, bootstrap: str, tmp_path: Path, config: ForwarderConfig
) -> Forwarder:
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=config,
    )
    summary = forwarder.drain(timeout_s=60)
    assert summary.complete, summary
    return forwarder


def _expected(frames: int, per_frame: int) -> list[SampleRecord]:
    return [_record(frame, index) for frame in range(frames) for index in range(per_frame)]


def _assert_exact(consumed: list, expected: list[SampleRecord]) -> None:
    assert [r.key for r in consumed] == [r.key for r in expected], "every record once, in order"
    for got, want in zip(consumed, expected, strict=True):
        assert (got.value, got.timestamp_ms, got.headers) == (
            want.value,
            want.timestamp_ms,
            want.headers,
        )


def test_a_small_read_ahead_budget_delivers_everything_in_order(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = new_topic(1)
    frames = 60
    for frame in range(frames):
        records = [_record(frame, index) for index in range(RECORDS_PER_FRAME)]
        wal.append(topic, 0, build_batch(records), len(records))
    config = ForwarderConfig(checkpoint_interval_s=0.2, max_in_flight_bytes=10_000)

    forwarder = _forward(wal, kafka_broker.bootstrap, tmp_path, config)

    _assert_exact(consume_all(kafka_broker.bootstrap, topic), _expected(frames, RECORDS_PER_FRAME))
    assert wal.checkpoint_offset == frames
    assert forwarder.stats().forwarded_records == frames * RECORDS_PER_FRAME


def test_one_record_batches_are_merged_within_the_topic_limit(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    """A linger.ms=0 client stores one record a batch: they reach Kafka as few, larger
    batches, none above the topic's max.message.bytes."""
    limit = 20_000
    topic = new_topic(1, config={"max.message.bytes": str(limit)})
    frames = 2_000
    for frame in range(frames):
        wal.append(topic, 0, build_batch([_record(frame, 0)]), 1)
    config = ForwarderConfig(checkpoint_interval_s=0.2)

    forwarder = _forward(wal, kafka_broker.bootstrap, tmp_path, config)

    _assert_exact(consume_all(kafka_broker.bootstrap, topic), _expected(frames, 1))
    batches = stored_batches(kafka_broker.bootstrap, topic, 0)
    assert len(batches) < frames / 10, f"{len(batches)} batches for {frames} records"
    assert max(batch.header.size for batch in batches) <= limit
    assert forwarder.stats().dead_letters == 0
    assert list_dead_letters(tmp_path / "dead-letter") == []


def test_freed_memory_is_given_back_once_a_burst_is_delivered(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A catch-up reads up to the read-ahead window of stored batches; once all of it is
    acknowledged and the forwarder is idle, the heap they were freed into goes back to the
    kernel (once: later idle moments without a new burst release nothing)."""
    released: list[int] = []
    monkeypatch.setattr(forwarder_module, "release_free_memory", lambda: released.append(1) or True)
    topic = new_topic(1)
    value = b"v" * 100_000
    frames = TRIM_AFTER_PEAK_BYTES // (4 * len(value)) + 4  # > the threshold, 4 records a frame
    for frame in range(frames):
        records = [
            SampleRecord(key=b"%d/%d" % (frame, i), value=value, timestamp_ms=1_000 + frame)
            for i in range(4)
        ]
        wal.append(topic, 0, build_batch(records), len(records))
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": kafka_broker.bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=ForwarderConfig(checkpoint_interval_s=0.2),
    ).start()
    try:
        wait_for(lambda: forwarder.stats().forwarded_records == frames * 4, timeout=60)
        wait_for(lambda: released, timeout=10, what="freed memory released after the burst")
        wal.append(topic, 0, build_batch([_record(0, 0)]), 1)  # a small one: no new burst
        wait_for(lambda: forwarder.stats().forwarded_records == frames * 4 + 1, timeout=30)
    finally:
        forwarder.stop()
    assert released == [1]
