"""A restart loses no frame where the leader took a batch of ours past ones it never took.

A broker takes *any* sequence from a producer it does not know: a re-created topic knows none,
and a broker forgets an idle producer (``producer.id.expiration.ms``). A batch the forwarder
had in flight can then land past earlier ones refused in between (UNKNOWN_TOPIC_OR_PARTITION
while the topic was gone). After a restart the forwarder numbered the frames from where its
volume said and, refused OUT_OF_ORDER, asked the leader what it held (DescribeProducers): the
last sequence, that of the batch that landed, acknowledged every earlier frame. Frames
acknowledged to their clients, never in Kafka. The volume now keeps the id of the topic each
partition's numbering was taken for, and a gap the forwarder saw before it stopped; a restart
that finds another id, or a gap, takes a new epoch instead of asking.

Apache Kafka: the previous run's frames go through the forwarder; the batch that landed past
the refused ones is written by this test with the forwarder's producer id, epoch and sequence
(the window in which a real one lands is a few milliseconds; a probe's 36 re-creations under
load never hit it, and a kill -9 inside the gap's window cannot be aimed at).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AdminClient

from durable_producer.buffer_agent.forward.dead_letter import DeadLetterStore
from durable_producer.buffer_agent.forward.forwarder import Forwarder
from durable_producer.buffer_agent.forward.identity import Anchor, IdentityFile, load_identity
from durable_producer.buffer_agent.wal import WriteAheadLog
from support.batch_builder import SampleRecord, build_batch
from support.broker import KafkaBroker, ProxiedBroker, consume_all, create_topic
from support.kafka_fixtures import TopicFactory
from support.producer_state import EXPIRATION_MS, knows_producer, produce_as
from support.raw_fetch import stored_batches
from support.waiting import wait_for
from support.wal_helpers import forwarding_wal

pytestmark = pytest.mark.integration

RECORDS = 10
"""Records in each stored batch (one frame)."""


@pytest.fixture
def wal(tmp_path: Path) -> Iterator[WriteAheadLog]:
    with forwarding_wal(tmp_path / "wal") as log:
        yield log


def _append(wal: WriteAheadLog, topic: str, frames: range) -> set[bytes]:
    values = set()
    for frame in frames:
        batch = [SampleRecord(None, b"f%02d-r%d" % (frame, n), 1000 + n) for n in range(RECORDS)]
        wal.append(topic, 0, build_batch(batch), RECORDS)
        values |= {record.value for record in batch if record.value is not None}
    return values


def _drain(wal: WriteAheadLog, bootstrap: str, data: Path) -> tuple[int, int]:
    """(records forwarded, possible duplicates) of one run until the WAL is delivered."""
    forwarder = Forwarder(
        wal,
        {"bootstrap.servers": bootstrap},
        dead_letters=DeadLetterStore(data / "dead-letter"),
        state_dir=data / "state",
    )
    summary = forwarder.drain(timeout_s=60)
    assert summary.complete, summary
    return summary.forwarded_records, summary.possible_duplicates


def _topic_id(bootstrap: str, topic: str) -> str:
    """The topic's id as the agent writes it (hex), from librdkafka's DescribeTopics."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    found = admin.describe_topics(TopicCollection([topic]))[topic].result(timeout=30)
    topic_id = found.topic_id
    high, low = topic_id.get_most_significant_bits(), topic_id.get_least_significant_bits()
    return uuid.UUID(int=(high % 2**64) << 64 | low % 2**64).hex


def _create_again(bootstrap: str, topic: str) -> None:
    old = _topic_id(bootstrap, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 30, what="the deletion")
    create_topic(bootstrap, topic, 1)
    assert _topic_id(bootstrap, topic) not in ("", old), "a new topic id"


def land(address: str, topic: str, producer_id: int, epoch: int, sequence: int) -> None:
    """One batch of ``RECORDS`` records, as the forwarder's producer would send it."""
    batch = build_batch([SampleRecord(None, b"landed-%d" % n, 2000 + n) for n in range(RECORDS)])
    produce_as(address, topic, batch, producer_id, epoch, sequence)
    landed = [b for b in stored_batches(address, topic, 0) if b.header.producer_id == producer_id]
    assert landed and landed[-1].header.base_sequence == sequence, "the broker took it"


def _restarted_past_a_landed_batch(
    wal: WriteAheadLog, bootstrap: str, data: Path, topic: str, backlog: set[bytes]
) -> tuple[set[bytes], Anchor]:
    """The backlog's last frame lands in Kafka alone (``land``), then the forwarder runs
    again until the WAL is delivered; (the values in the topic, the partition's anchor
    after). Every record of ``backlog`` must be in Kafka, none counted a duplicate."""
    record, _ = load_identity(data / "state")
    assert record is not None
    anchor = record.partitions[(topic, 0)]
    land(bootstrap, topic, anchor.producer_id, anchor.epoch, anchor.sequence + 4 * RECORDS)
    forwarded, possible = _drain(wal, bootstrap, data)
    assert forwarded == 5 * RECORDS
    consumed = {record.value for record in consume_all(bootstrap, topic, timeout=30)}
    missing = sorted(backlog - consumed)
    assert not missing, f"{len(missing)} acknowledged records not in Kafka: {missing[:3]}"
    assert possible == 0, "none of the backlog had been sent"
    record, _ = load_identity(data / "state")
    assert record is not None
    return consumed, record.partitions[(topic, 0)]


def _stopped_with_a_gap(
    wal: WriteAheadLog, bootstrap: str, data: Path, topic: str, why: str
) -> tuple[set[bytes], Anchor]:
    """Five frames delivered, five more stored, and the partition's gap (a new epoch due, for
    ``why``) kept on the volume as a run stopped before the new epoch leaves it: (the values
    of the five stored, the partition's anchor)."""
    _append(wal, topic, range(5))
    assert _drain(wal, bootstrap, data) == (5 * RECORDS, 0)
    second = _append(wal, topic, range(5, 10))
    record, _ = load_identity(data / "state")
    assert record is not None
    anchor = record.partitions[(topic, 0)]
    gapped = {(topic, 0): replace(anchor, gap=True, gap_why=why)}
    file = IdentityFile(data / "state")
    assert file.write(replace(record, partitions=gapped), sync=True)
    file.close()
    return second, anchor


def test_frames_for_a_topic_created_again_are_all_delivered_after_a_restart(
    kafka_broker: KafkaBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    bootstrap = kafka_broker.bootstrap
    data = tmp_path / "data"
    topic = new_topic(1)
    first = _append(wal, topic, range(5))
    assert _drain(wal, bootstrap, data) == (5 * RECORDS, 0)
    second = _append(wal, topic, range(5, 10))  # the backlog when the topic goes

    record, _ = load_identity(data / "state")
    assert record is not None
    anchor = record.partitions[(topic, 0)]
    assert (anchor.offset, anchor.sequence) == (5, 5 * RECORDS)
    _create_again(bootstrap, topic)
    # the last frame of the backlog, in flight, landed in the new topic; the others did not
    consumed, after = _restarted_past_a_landed_batch(wal, bootstrap, data, topic, second)
    assert not first & consumed, "the first frames went to the topic deleted"
    assert after.topic_id == _topic_id(bootstrap, topic)


def test_a_gap_kept_on_the_volume_takes_a_new_epoch_after_a_restart(
    forgetful_broker: ProxiedBroker, new_topic: TopicFactory, wal: WriteAheadLog, tmp_path: Path
) -> None:
    """The forwarder saw the leader take a batch past refused ones (it had forgotten the
    producer) and kept that on the volume; it was killed before the new epoch."""
    bootstrap = forgetful_broker.bootstrap
    data = tmp_path / "data"
    topic = new_topic(1, bootstrap=bootstrap)
    second, anchor = _stopped_with_a_gap(wal, bootstrap, data, topic, "")

    wait_for(
        lambda: not knows_producer(bootstrap, topic, anchor.producer_id),
        timeout=EXPIRATION_MS / 1000 * 5,
        what="the broker to forget the forwarder's producer",
    )
    _, after = _restarted_past_a_landed_batch(wal, bootstrap, data, topic, second)
    assert not after.gap and after.epoch == anchor.epoch + 1


def test_the_reason_for_a_new_epoch_kept_on_the_volume_is_given_after_a_restart(
    kafka_broker: KafkaBroker,
    new_topic: TopicFactory,
    wal: WriteAheadLog,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A new epoch due because a dead-lettered batch may be in Kafka, the agent stopped
    before it: the next run said its leader had forgotten the producer."""
    bootstrap = kafka_broker.bootstrap
    data = tmp_path / "data"
    topic = new_topic(1)
    why = "a dead-lettered batch may be in Kafka: the frames after it must not take its numbers"
    second, anchor = _stopped_with_a_gap(wal, bootstrap, data, topic, why)

    with caplog.at_level("WARNING", logger="durable_producer.buffer_agent.forward.sender"):
        assert _drain(wal, bootstrap, data) == (5 * RECORDS, 0)
    (line,) = [r.getMessage() for r in caplog.records if "goes on with epoch" in r.getMessage()]
    assert line == f"{topic}/0: {why}; producer {anchor.producer_id} goes on with epoch" + (
        f" {anchor.epoch + 1} from sequence 0"
    )
    consumed = {record.value for record in consume_all(bootstrap, topic, timeout=30)}
    assert second <= consumed
