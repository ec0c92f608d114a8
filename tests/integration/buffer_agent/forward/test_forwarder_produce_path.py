"""The forwarder's produce loop against Apache Kafka when produce() raises mid-frame.

The loop runs in C (``starmap``) and learns from a counter which record a synchronous error
was about; these tests pin that bookkeeping: a full client queue resumes at the right
record (nothing skipped, nothing sent twice) and a record refused by the client is
attributed to its own frame and index, whichever position it has in the frame.
"""

from __future__ import annotations

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
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

RECORDS_PER_FRAME = 40
MESSAGE_MAX_BYTES = 5_000


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(
        tmp_path / "wal", segment_bytes=1024 * 1024, max_frame_bytes=512 * 1024
    ) as log:
        yield log


def _record(frame: int, index: int, oversized: bool = False) -> SampleRecord:
    return SampleRecord(
        key=b"%d/%d" % (frame, index),
        value=b"O" * (2 * MESSAGE_MAX_BYTES)
        if oversized
        else b"frame %d record %d" % (frame, index),
        timestamp_ms=1_000_000 + frame * 1_000 + index,
        headers=(("index", b"%d" % index),) if index % 3 == 0 else (),
    )


def _forward(
    wal: WriteAheadLog, bootstrap: str, tmp_path: Path, config: ForwarderConfig
) -> Forwarder:
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": bootstrap, "message.max.bytes": MESSAGE_MAX_BYTES},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=config,
    )
    summary = forwarder.drain(timeout_s=60)
    assert summary.complete, summary
    return forwarder


def test_a_full_client_queue_resumes_at_the_record_it_stopped_at(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    """A queue of 7 records makes produce() raise BufferError inside almost every frame."""
    topic = new_topic(2)
    frames = 12
    for frame in range(frames):
        records = [_record(frame, index) for index in range(RECORDS_PER_FRAME)]
        wal.append(topic, frame % 2, build_batch(records), len(records))
    config = ForwarderConfig(checkpoint_interval_s=0.2, max_in_flight_records=7)

    forwarder = _forward(wal, kafka_broker.bootstrap, tmp_path, config)

    consumed = consume_all(kafka_broker.bootstrap, topic, expected=frames * RECORDS_PER_FRAME)
    for partition in (0, 1):
        keys = [record.key for record in consumed if record.partition == partition]
        assert keys == [
            b"%d/%d" % (frame, index)
            for frame in range(partition, frames, 2)
            for index in range(RECORDS_PER_FRAME)
        ], "every record exactly once, in WAL order"
    for record in consumed:
        index = int(record.key.split(b"/")[1])
        assert record.headers == ((("index", b"%d" % index),) if index % 3 == 0 else ())
    assert wal.checkpoint_offset == frames
    assert forwarder.stats().forwarded_records == frames * RECORDS_PER_FRAME
    assert forwarder.stats().dead_letters == 0


def test_records_refused_by_the_client_are_dead_lettered_at_their_own_index(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    """Oversized records first, last and back to back in a frame, with a tight queue too."""
    topic = new_topic(1)
    oversized = {(0, 0), (0, 1), (1, RECORDS_PER_FRAME - 1), (2, 17), (2, 18), (2, 30)}
    for frame in range(3):
        records = [
            _record(frame, index, oversized=(frame, index) in oversized)
            for index in range(RECORDS_PER_FRAME)
        ]
        wal.append(topic, 0, build_batch(records), len(records))
    config = ForwarderConfig(checkpoint_interval_s=0.2, max_in_flight_records=11)

    forwarder = _forward(wal, kafka_broker.bootstrap, tmp_path, config)

    letters = list_dead_letters(tmp_path / "dead-letter")
    assert sorted((letter.wal_offset, letter.record_index) for letter in letters) == sorted(
        oversized
    )
    for letter in letters:
        assert letter.error_code == "MSG_SIZE_TOO_LARGE"
        assert letter.key == b"%d/%d" % (letter.wal_offset, letter.record_index)
    consumed = consume_all(kafka_broker.bootstrap, topic, expected=3 * RECORDS_PER_FRAME - 6)
    assert [record.key for record in consumed] == [
        b"%d/%d" % (frame, index)
        for frame in range(3)
        for index in range(RECORDS_PER_FRAME)
        if (frame, index) not in oversized
    ]
    assert wal.checkpoint_offset == 3
    assert forwarder.stats().dead_letters == len(oversized)
    assert forwarder.stats().forwarded_records == 3 * RECORDS_PER_FRAME - len(oversized)
