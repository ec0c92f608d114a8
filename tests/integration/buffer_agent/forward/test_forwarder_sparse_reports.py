"""Sparse delivery reports (one per frame) fall back to careful mode when the broker refuses a
record, then come back.

The topic has a small ``max.message.bytes``: Kafka answers a Produce request whose record
batch is over it with MESSAGE_TOO_LARGE (the client's own limit is far higher, so the
refusal is the broker's), and the refusal reaches the forwarder asynchronously, in a
delivery report. That is the
path sparse mode cannot see record by record: the forwarder must notice (the gap-less
guarantee turns it into a fatal producer error), re-send carefully, dead-letter exactly
the bad record and lose nothing else.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore, list_dead_letters
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

BROKER_LIMIT = 20_000  # the topic's max.message.bytes
RECORDS_PER_FRAME = 20
BAD_FRAME, BAD_INDEX = 3, 9  # a record in the middle of the fourth frame
# Refused records go to the dead-letter area at once (no retry window) in these tests.
CONFIG = ForwarderConfig(
    checkpoint_interval_s=0.2, hint_interval_s=0.1, reset_backoff_s=0.2, dead_letter_after_s=0
)


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(
        tmp_path / "wal", segment_bytes=1024 * 1024, max_frame_bytes=512 * 1024
    ) as log:
        yield log


def _frame(frame: int) -> list[SampleRecord]:
    return [
        SampleRecord(
            key=b"%d/%d" % (frame, index),
            value=b"B" * (2 * BROKER_LIMIT)
            if (frame, index) == (BAD_FRAME, BAD_INDEX)
            else b"frame %d record %d" % (frame, index),
            timestamp_ms=1_000_000 + frame * 1_000 + index,
            headers=(("index", b"%d" % index),) if index % 4 == 0 else (),
        )
        for index in range(RECORDS_PER_FRAME)
    ]


def _append(wal: WriteAheadLog, topic: str, frames: range) -> dict[bytes, SampleRecord]:
    good = {}
    for frame in frames:
        records = _frame(frame)
        wal.append(topic, frame % 2, build_batch(records), len(records))
        good |= {
            record.key: record
            for index, record in enumerate(records)
            if (frame, index) != (BAD_FRAME, BAD_INDEX)
        }
    return good


def test_a_record_the_broker_refuses_mid_frame_is_dead_lettered_and_sparse_mode_resumes(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = new_topic(2, config={"max.message.bytes": str(BROKER_LIMIT)})
    expected = _append(wal, topic, range(8))
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": kafka_broker.bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=CONFIG,
    ).start()
    try:
        wait_for(lambda: forwarder.stats().watermark == 8, 60, what="first frames settled")
        wait_for(lambda: not forwarder.stats().careful, 30, what="back to sparse mode")
        after_fallback = forwarder.stats()
        # Frames appended now are forwarded with one report per frame again.
        expected |= _append(wal, topic, range(8, 12))
        summary = forwarder.drain(timeout_s=60)
    finally:
        forwarder.stop()
    stats = forwarder.stats()

    assert summary.complete and wal.checkpoint_offset == 12
    letters = list_dead_letters(tmp_path / "dead-letter")
    assert [(letter.wal_offset, letter.record_index) for letter in letters] == [
        (BAD_FRAME, BAD_INDEX)
    ], "exactly the bad record, not its batch-mates"
    assert letters[0].error_code == "MSG_SIZE_TOO_LARGE" and letters[0].reason
    assert letters[0].value == b"B" * (2 * BROKER_LIMIT)

    consumed = consume_all(kafka_broker.bootstrap, topic, timeout=30)
    copies = Counter(record.key for record in consumed)
    assert set(copies) == set(expected), "every good record arrived, nothing else"
    for record in consumed:
        want = expected[record.key]
        assert (record.value, record.timestamp_ms, record.headers) == (
            want.value,
            want.timestamp_ms,
            want.headers,
        )
        assert record.partition == int(record.key.split(b"/")[0]) % 2
    duplicates = sum(count - 1 for count in copies.values())
    counted = (stats.replayed_duplicates, stats.possible_duplicates)
    assert counted[0] <= duplicates <= sum(counted), f"every duplicate was counted: {counted}"
    for partition in (0, 1):
        first_seen = list(
            dict.fromkeys(r.timestamp_ms for r in consumed if r.partition == partition)
        )
        assert first_seen == sorted(first_seen), f"partition {partition} out of order"

    assert stats.producer_resets >= 1
    assert stats.dead_letters == 1
    # Deliveries count again when a reset re-sends a frame that was already delivered.
    assert stats.forwarded_records >= len(expected)
    assert stats.sparse_records + stats.careful_records == stats.forwarded_records
    assert after_fallback.careful_records > 0, "the frames in flight were re-sent carefully"
    assert stats.careful_records == after_fallback.careful_records, "then sparse again"
    assert stats.sparse_records - after_fallback.sparse_records == 4 * RECORDS_PER_FRAME
    assert not stats.careful


def test_a_frame_whose_reporting_record_is_refused_with_nothing_after_it_is_resent_carefully(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    """The last record of a frame carries the frame's report; produce() refusing it leaves
    the other records without one. With no later record on the partition to vouch for them,
    the forwarder re-sends the frame carefully: nothing lost, the refused record
    dead-lettered once, any duplicate counted."""
    topic = new_topic(1)
    records = [
        SampleRecord(b"k%d" % index, b"v" * (3_000 if index == 4 else 10), 7_000 + index)
        for index in range(5)
    ]
    wal.append(topic, 0, build_batch(records), len(records))
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": kafka_broker.bootstrap, "message.max.bytes": 1_000},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=CONFIG,
    )

    summary = forwarder.drain(timeout_s=60)

    assert summary.complete and wal.checkpoint_offset == 1
    assert forwarder.stats().producer_resets == 1
    letters = list_dead_letters(tmp_path / "dead-letter")
    assert [(letter.wal_offset, letter.record_index) for letter in letters] == [(0, 4)]
    consumed = consume_all(kafka_broker.bootstrap, topic, timeout=20)
    copies = Counter(record.key for record in consumed)
    assert set(copies) == {b"k0", b"k1", b"k2", b"k3"}
    duplicates = sum(copies.values()) - 4
    counted = (summary.replayed_duplicates, summary.possible_duplicates)
    assert counted[0] <= duplicates <= sum(counted), f"every duplicate was counted: {counted}"
