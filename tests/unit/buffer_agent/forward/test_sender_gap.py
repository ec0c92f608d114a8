"""A leader that takes a batch past an earlier one it refused.

A broker appends an idempotent producer's batches in sequence, so a batch taken means every
earlier batch of the producer on that partition is taken. Not when the broker does not know
the producer: it takes any sequence. That happens when the topic is deleted and created again
under the forwarder (an earlier batch refused UNKNOWN_TOPIC_OR_PARTITION in the gap, the next
one, already in flight, lands in the new topic), or when the producer expired on a partition
idle for ``producer.id.expiration.ms``. The forwarder then acknowledged the refused batch with
the later one: records acknowledged to their clients, never in Kafka. Apache Kafka cannot be
made to answer this on demand (a probe's 36 topic re-creations under load never did), so the
stand-in here gives the answers; what is tested is what the sender and the queue make of them.
"""

from __future__ import annotations

import asyncio

from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.forward.partition_queue import (
    OFFSET,
    SEQUENCE,
    PartitionQueue,
    Pending,
    Settled,
)
from durable_producer.buffer_agent.forward.sender import Sender
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import sender_for

KEY = ("t", 0)
BATCH = build_batch([SampleRecord(None, b"v", 1000)])
UNKNOWN_TOPIC = int(ErrorCode.unknown_topic_or_partition)
TIMED_OUT = int(ErrorCode.request_timed_out)


class Leader:
    leaders = {KEY: 1}


def answered(first_code: int) -> tuple[PartitionQueue, list[int], list[list[Pending]]]:
    """Three one-record batches in flight (offsets 10, 11, 12, sequences 5-7, epoch 0); the
    first is answered ``first_code``, the two others taken. (the queue after the sender's
    upkeep, the offsets acknowledged, the frames handed over under a new epoch)."""
    queue = PartitionQueue(KEY, 7, 0, 5)
    queue.confirmed = True
    queue.isolate = True
    for offset in (10, 11, 12):
        queue.add(offset, BATCH, 1, 0, 0, False)
    acknowledged: list[int] = []
    handed: list[list[Pending]] = []

    def acked(_: PartitionQueue, taken: Settled) -> None:
        acknowledged.extend(frame[OFFSET] for frame in taken[0])

    async def scenario() -> None:
        sender: Sender = sender_for(
            Leader(), {KEY: queue}, on_new_identity=lambda _, unknown: handed.append(unknown)
        )
        sender._on_acked = acked
        now = asyncio.get_running_loop().time()
        sent = [queue.next_batch(now, 10**6) for _ in range(3)]
        for batch, code in zip(sent, (first_code, 0, 0), strict=True):
            assert batch is not None
            sender._answered(queue, batch, code, None, now)
        sender.maintain(now)
        await asyncio.sleep(0.01)
        sender.close()

    asyncio.run(scenario())
    return queue, acknowledged, handed


def test_a_batch_taken_past_a_refused_one_does_not_acknowledge_it() -> None:
    queue, acknowledged, handed = answered(UNKNOWN_TOPIC)
    assert sorted(acknowledged) == [11, 12], "the refused batch was never in Kafka"
    head = queue.first_unacknowledged()
    assert head is not None and head[OFFSET] == 10
    assert (queue.epoch, head[SEQUENCE]) == (1, 0), "sent again under a new epoch, from 0"
    assert handed == [[]], "nothing of it can be in Kafka: no possible duplicate"
    assert not queue.gap and queue.next_batch(10**9, 10**6) is not None


def test_a_batch_taken_after_one_that_timed_out_acknowledges_both() -> None:
    """REQUEST_TIMED_OUT comes after the append (not replicated in time): the later batch
    taken says the earlier one is in Kafka too, as before."""
    queue, acknowledged, handed = answered(TIMED_OUT)
    assert sorted(acknowledged) == [10, 11, 12]
    assert queue.idle and queue.epoch == 0 and handed == []
