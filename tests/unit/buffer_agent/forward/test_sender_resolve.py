"""What the sender decides after a restart when a partition's leader holds nothing of its
producer (DescribeProducers lists no entry for it).

A leader that does not know a producer takes any sequence from it. Where the partition's next
frame is numbered 0, nothing of this identity was ever acknowledged there: the frames go out
as they are. Where it is numbered above 0, the leader took earlier frames and has forgotten
the producer since (``producer.id.expiration.ms``, or its batches' log deleted): it would
store the frames the previous run sent a second time, so the partition moves to a new epoch
and those frames are handed over as possible duplicates. The stand-in answers
DescribeProducers; the same scenario against Apache Kafka is in
tests/integration/buffer_agent/forward/test_producer_forgotten.py.
"""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.forward.partition_queue import (
    OFFSET,
    SEQUENCE,
    PartitionQueue,
    Pending,
)
from durable_producer.buffer_agent.kafka.cluster_client import ProducerOnPartition
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import sender_for

BATCH = build_batch([SampleRecord(None, b"v", 1000)])
KEY = ("t", 0)


class DescribingLeader:
    """Node 1 leads ``KEY`` and describes what ``held`` says it holds of the producer."""

    def __init__(self, held: ProducerOnPartition | int | None) -> None:
        self.leaders = {KEY: 1}
        self.topic_ids: dict[str, str] = {}
        self.held = held

    async def describe_producers(
        self, node_id: int, topic: str, partitions: list[int], producer_id: int
    ) -> dict[int, ProducerOnPartition | int | None]:
        return {partition: self.held for partition in partitions}


def _resolved(
    held: ProducerOnPartition | int | None, first_sequence: int
) -> tuple[PartitionQueue, list[list[Pending]]]:
    """A restarted partition (producer 7, epoch 0) with two frames the previous run sent,
    numbered from ``first_sequence``, resolved against a leader holding ``held``."""
    queue = PartitionQueue(KEY, 7, 0, first_sequence)
    for offset in (10, 11):
        queue.add(offset, BATCH, 1, 0, 0, True)  # sent by the previous run: fate unknown
    queue.resolve, queue.resolve_code = True, 0
    handed: list[list[Pending]] = []

    async def scenario() -> None:
        sender = sender_for(
            DescribingLeader(held),
            {KEY: queue},
            on_new_identity=lambda _, unknown: handed.append(unknown),
        )
        await sender._resolve(queue)
        sender.close()

    asyncio.run(scenario())
    return queue, handed


def test_a_leader_that_forgot_the_producer_moves_the_partition_to_a_new_epoch() -> None:
    queue, handed = _resolved(None, first_sequence=40)
    assert not queue.resolve
    assert (queue.producer_id, queue.epoch) == (7, 1)
    assert [frame[SEQUENCE] for frame in queue.frames] == [0, 1]
    assert [[frame[OFFSET] for frame in unknown] for unknown in handed] == [[10, 11]]


def test_frames_numbered_from_0_go_out_as_they_are_to_a_leader_that_never_had_them() -> None:
    queue, handed = _resolved(None, first_sequence=0)
    assert not queue.resolve
    assert (queue.producer_id, queue.epoch) == (7, 0)
    assert [frame[SEQUENCE] for frame in queue.frames] == [0, 1]
    assert handed == []


@pytest.mark.parametrize("last_sequence", [39, 40])
def test_a_leader_that_knows_the_producer_acknowledges_what_it_holds(last_sequence: int) -> None:
    queue, handed = _resolved(ProducerOnPartition(0, last_sequence), first_sequence=40)
    assert not queue.resolve
    assert (queue.producer_id, queue.epoch) == (7, 0)
    assert [frame[OFFSET] for frame in queue.frames] == [10, 11][last_sequence - 39 :]
    assert handed == []


def test_a_leader_that_may_not_describe_producers_moves_the_partition_to_a_new_epoch() -> None:
    """DescribeProducers needs READ on the topic; a producer's principal often has only WRITE
    and DESCRIBE. Sent again with their numbers, the frames would be stored twice, uncounted,
    by a leader that forgot the producer: a new epoch, the frames handed over as possible
    duplicates."""
    queue, handed = _resolved(int(ErrorCode.topic_authorization_failed), first_sequence=40)
    assert not queue.resolve
    assert (queue.producer_id, queue.epoch) == (7, 1)
    assert [frame[SEQUENCE] for frame in queue.frames] == [0, 1]
    assert [[frame[OFFSET] for frame in unknown] for unknown in handed] == [[10, 11]]
