"""A batch dead-lettered although a copy of it may be in Kafka.

A batch the leader appended, whose answer never came (a timeout, a lost connection) or said
it was not replicated in time (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND), is sent
again with the same numbers. If Kafka then refuses it for good with an error it checks before
its duplicate check (an ACL revoked, ``max.message.bytes`` lowered), it is dead-lettered. The
queue used to give its sequence to the next batch: the leader, which holds the first copy
under that sequence, answered DUPLICATE_SEQUENCE_NUMBER, and the next batch was acknowledged
although it was never stored (a review's finding). Now the batches after it go under a new
epoch (``gap``). Apache Kafka cannot be made to append a batch and lose its answer on demand;
the stand-in broker here keeps an idempotent producer's state as Kafka's
``ProducerStateManager`` does (appends in sequence, the last five batches recognised as
copies, a new epoch from sequence 0), and the test drives the sender's and queue's decisions.
"""

from __future__ import annotations

import asyncio

import pytest
from kio.schema.errors import ErrorCode

from durable_producer.buffer_agent.forward.partition_queue import (
    OFFSET,
    SEQUENCE,
    UNKNOWN,
    Batch,
    PartitionQueue,
    Pending,
    Settled,
)
from durable_producer.buffer_agent.forward.sender import Sender
from durable_producer.buffer_agent.kafka.record_batch import parse_batch_header
from support.batch_builder import SampleRecord, build_batch
from support.sender_stand_ins import OneLeader, sender_for

KEY = ("t", 0)
BATCH = build_batch([SampleRecord(None, b"v", 1000)])
DENIED = int(ErrorCode.topic_authorization_failed)
TIMED_OUT = int(ErrorCode.request_timed_out)
NOT_REPLICATED = int(ErrorCode.not_enough_replicas_after_append)
DUPLICATE = int(ErrorCode.duplicate_sequence_number)
OUT_OF_ORDER = int(ErrorCode.out_of_order_sequence_number)
DEAD_LETTER_AFTER_S = 120.0


class IdempotentLog:
    """One partition's log and one producer's state, as a Kafka leader keeps them."""

    def __init__(self) -> None:
        self.stored: list[int] = []
        """WAL offsets of the frames appended."""
        self.epoch = -1
        self.last_sequence = -1
        self.recent: list[tuple[int, int]] = []

    def produce(self, batch: Batch) -> int:
        header = parse_batch_header(b"".join(bytes(part) for part in batch.parts))
        first, epoch = header.base_sequence, header.producer_epoch
        last = first + header.record_count - 1
        if epoch == self.epoch and (first, last) in self.recent:
            return DUPLICATE
        if epoch > self.epoch:
            if first != 0 and self.epoch >= 0:
                return OUT_OF_ORDER
            self.epoch, self.last_sequence, self.recent = epoch, first - 1, []
        if epoch < self.epoch or first != self.last_sequence + 1:
            return OUT_OF_ORDER
        self.stored += [frame[OFFSET] for frame in batch.frames]
        self.last_sequence = last
        self.recent = [*self.recent, (first, last)][-5:]
        return 0


def dead_letter_a_frame_kafka_may_hold(first_answer: int | None) -> tuple[list[int], list[int]]:
    """Frames 0-2; frame 1 is appended but its answer is ``first_answer`` (None: lost), its
    retries refused for good until it is dead-lettered, then frame 2 goes. (the offsets
    acknowledged, the offsets the leader stores)."""
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.isolate = True  # one frame a batch
    for offset in range(3):
        queue.add(offset, BATCH, 1, 0, 0, False)
    log = IdempotentLog()
    acknowledged: list[int] = []

    def acked(_: PartitionQueue, taken: Settled) -> None:
        acknowledged.extend(frame[OFFSET] for frame in taken[0])

    def handed(_: PartitionQueue, unknown: list[Pending]) -> None:
        return None

    async def scenario() -> None:
        sender: Sender = sender_for(OneLeader(), {KEY: queue}, on_new_identity=handed)
        sender._on_acked = acked
        now = asyncio.get_running_loop().time()

        def send() -> Batch:
            batch = queue.next_batch(now, 10**6)
            assert batch is not None, "a batch is due"
            return batch

        first = send()
        sender._answered(queue, first, log.produce(first), None, now)
        second = send()
        log.produce(second)  # appended by the leader
        if first_answer is None:
            sender._transport_failed([(queue, second)], TimeoutError("timed out"), sent=True)
            queue.refreshed()  # the metadata refresh that followed ended
        else:
            sender._answered(queue, second, first_answer, None, now)
        assert second.frames[0][UNKNOWN], "a copy of it may be in Kafka"
        now += 10.0
        retry = send()  # the ACL was revoked meanwhile: refused before the duplicate check
        sender._answered(queue, retry, DENIED, None, now)
        now += DEAD_LETTER_AFTER_S + 1
        assert sender.refused_for_good(queue, now, DEAD_LETTER_AFTER_S)
        (dropped,) = queue.drop_heads(1, DENIED, now)  # as Forwarder._letter_for_heads does
        assert dropped[OFFSET] == 1
        sender.maintain(now)  # the ACL back; a new epoch for what follows, if asked
        await asyncio.sleep(0.01)
        third = send()
        sender._answered(queue, third, log.produce(third), None, now)
        sender.close()

    asyncio.run(scenario())
    return acknowledged, log.stored


def test_a_frame_after_one_lost_in_flight_and_dead_lettered_is_stored_before_it_is_acked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level("WARNING", logger="durable_producer.buffer_agent.forward.sender"):
        acknowledged, stored = dead_letter_a_frame_kafka_may_hold(None)
    assert 2 in acknowledged
    assert set(acknowledged) <= set(stored), f"acknowledged {acknowledged}, stored {stored}"
    # The new epoch says why: not the leader's forgetting (the wording it had).
    (epoch,) = [r.getMessage() for r in caplog.records if "goes on with epoch" in r.getMessage()]
    assert "a dead-lettered batch may be in Kafka" in epoch, epoch


def test_an_answer_saying_not_replicated_in_time_counts_as_maybe_in_kafka() -> None:
    for code in (TIMED_OUT, NOT_REPLICATED):
        acknowledged, stored = dead_letter_a_frame_kafka_may_hold(code)
        assert 2 in acknowledged
        assert set(acknowledged) <= set(stored), f"{code}: acked {acknowledged}, in {stored}"


def test_a_frame_refused_before_any_copy_gives_its_numbers_to_the_next() -> None:
    # Frame 0 refused outright (never appended): dead-lettered, frame 1 takes its sequence,
    # no new epoch.
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.isolate = True
    for offset in range(2):
        queue.add(offset, BATCH, 1, 0, 0, False)
    batch = queue.next_batch(0.0, 10**6)
    assert batch is not None
    queue.failed(batch, DENIED, 0.0, not_appended=True)
    (dropped,) = queue.drop_heads(1, DENIED, 200.0)
    assert dropped[OFFSET] == 0 and not queue.gap
    follower = queue.next_batch(200.0, 10**6)
    assert (
        follower is not None
        and follower.frames[0][SEQUENCE] == 0
        and follower.frames[0][OFFSET] == 1
    )


def test_a_frame_numbered_anew_while_a_copy_may_be_in_kafka_keeps_the_mark_for_its_letter() -> None:
    # Frame 0's answer was lost (a copy may be in Kafka); the partition then moves to a new
    # epoch (a frame taken past its refusal), which numbers it anew and clears its UNKNOWN:
    # that copy is of the old epoch. Its letter must still say it may be in Kafka.
    queue = PartitionQueue(KEY, 7, 0, 0)
    queue.confirmed = True
    queue.isolate = True
    for offset in range(3):
        queue.add(offset, BATCH, 1, 0, 0, False)
    batch = queue.next_batch(0.0, 10**6)
    assert batch is not None
    queue.failed(batch, 0, 0.0, unknown=True)
    possible = queue.renumber(7, 1)
    assert [frame[OFFSET] for frame in possible] == [0]
    head = queue.frames[0]
    assert not head[UNKNOWN] and head[SEQUENCE] == 0, "no copy under the new epoch"
    assert queue.may_be_in_kafka(head), "a copy under the old one"
    assert not queue.may_be_in_kafka(queue.frames[1])
    (dropped,) = queue.drop_heads(1, DENIED, 200.0)
    assert dropped[OFFSET] == 0 and not queue.gap, "the new epoch's leader holds no copy"
    assert not queue.copied_before, "forgotten once it left the queue"
