"""The forwarder goes on forwarding when a checkpoint deletes the segment its reader is on.

Seen once in the full-volume kill -9 test: the forwarder had read and delivered everything,
an append started a new segment in between, and the checkpoint at exactly that segment's base
offset deleted the segment the reader was still positioned on. The reader then returned
nothing for ever: the agent forwarded nothing more, the volume stayed full and produce
requests were refused until the agent was restarted.

Here the append happens in the ``before_checkpoint`` hook (it runs on the forwarding thread
right before the checkpoint), which puts the forwarder into that state every time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_producer.buffer_agent.forward.config import ForwarderConfig
from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, consume_all
from support.kafka_fixtures import TopicFactory
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

SEGMENT_BYTES = 16 * 1024
CONFIG = ForwarderConfig(checkpoint_interval_s=0.1, hint_interval_s=0.1)


def frame(value: int) -> bytes:
    """One record of about 4.6 KB: three fill a segment, a fourth starts a new one."""
    return build_batch([SampleRecord(b"%d" % value, b"%d:" % value * 2250, value)])


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(
        tmp_path / "wal", segment_bytes=SEGMENT_BYTES, max_frame_bytes=SEGMENT_BYTES
    ) as log:
        yield log


def test_forwarding_goes_on_after_a_checkpoint_deletes_the_segment_being_read(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    topic = new_topic(1)
    for value in range(3):
        wal.append(topic, 0, frame(value), 1)
    [only] = wal.segment_views()
    assert only.visible_end + len(frame(3)) > SEGMENT_BYTES, "a fourth frame starts a segment"
    rotated_at: list[int] = []

    def append_a_new_segment() -> None:
        """Before the first checkpoint that covers everything read: an append that starts a
        new segment, whose base offset the checkpoint then reaches."""
        if not rotated_at and forwarder.stats().watermark == wal.next_offset:
            rotated_at.append(wal.append(topic, 0, frame(3), 1))

    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": kafka_broker.bootstrap},
        dead_letters=DeadLetterStore(tmp_path / "dead-letter"),
        state_dir=tmp_path / "state",
        config=CONFIG,
        before_checkpoint=append_a_new_segment,
    ).start()
    try:
        wait_for(lambda: wal.checkpoint_offset >= 3, 30, 0.02, what="the first checkpoint")
        assert rotated_at == [3]
        assert [view.base_offset for view in wal.segment_views()] == [3], (
            "the checkpoint deleted the segment the reader was on"
        )
        wal.append(topic, 0, frame(4), 1)
        wait_for(lambda: forwarder.stats().watermark == 5, 20, 0.05, what="frames 3 and 4")
    finally:
        forwarder.stop()
    assert forwarder.failure is None
    values = [int(record.key) for record in consume_all(kafka_broker.bootstrap, topic)]
    assert values == [0, 1, 2, 3, 4]
